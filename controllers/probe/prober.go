// Package probe reads each fleet's outbox off the reconcile path. The
// Prober is a manager runnable: it reads each registered fleet's outbox on
// its own schedule, with bounded concurrency, and feeds every result back to
// the reconciler as an event; each read also releases the claims of the
// fleet's dead drainers. Change carries out an OutboxReplay's change. This
// is the one place where the operator touches an outbox, and it does so
// through the table layer's outbox.Reader: no SQL of its own.
package probe

import (
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/status"
	"github.com/spillway-io/spillway/outbox"
)

// Target is what to read for one fleet; a change of it is read at once.
type Target struct {
	Key types.NamespacedName
	// UID names the fleet in the events the Prober records.
	UID        types.UID
	Generation int64
	Database   v1alpha1.DatabaseSpec
	// Ordering is the fleet's per-key ordering, whose blocked keys the read
	// counts; nil without.
	Ordering *v1alpha1.Ordering
	// Sink is the Secret key of the URL the fleet publishes to, and
	// SinkKind the kind of sink (v1alpha1.SinkRabbitMQ, SinkWebhook).
	Sink     v1alpha1.SecretKeyRef
	SinkKind string
	// Signing is a webhook's signing secrets, which its drainers read; nil
	// for a broker.
	Signing *v1alpha1.SecretKeyRef
	// SinkTLS is the sink's certificates, whose Secret the drainers
	// mount; nil without TLS.
	SinkTLS *v1alpha1.TLS
	// MaxAttempts is the fleet's poison threshold.
	MaxAttempts int
	Interval    time.Duration
	// LeaseTTL is the fleet's lease: a claim is held at most that long.
	LeaseTTL time.Duration
	// Dead are the fleet's drainers that are dead while their claims may
	// still be held, sorted by ID. Every read releases their claims, so
	// that the rows are published again at once rather than when their
	// lease expires.
	Dead []DeadDrainer
}

// DeadDrainer is a drainer of the fleet that will settle nothing more.
type DeadDrainer struct {
	// ID is the drainer's ID: its pod's name.
	ID string
	// Reason is a short CamelCase cause, the metric's label; Message says
	// it in words.
	Reason, Message string
}

func (t Target) same(o Target) bool {
	return t.Key == o.Key && t.UID == o.UID && t.Generation == o.Generation && t.Sink == o.Sink && t.SinkKind == o.SinkKind && equality.Semantic.DeepEqual(t.Signing, o.Signing) && t.MaxAttempts == o.MaxAttempts &&
		t.Interval == o.Interval && t.Database.URLSecretRef == o.Database.URLSecretRef && t.Database.Table == o.Database.Table &&
		t.Database.Columns == o.Database.Columns && t.Database.RoutingKey == o.Database.RoutingKey &&
		t.LeaseTTL == o.LeaseTTL && slices.Equal(t.Dead, o.Dead) && equality.Semantic.DeepEqual(t.Ordering, o.Ordering) &&
		equality.Semantic.DeepEqual(t.Database.TLS, o.Database.TLS) && equality.Semantic.DeepEqual(t.SinkTLS, o.SinkTLS) &&
		equality.Semantic.DeepEqual(t.Database.Pooler, o.Database.Pooler)
}

// Result is one read of a fleet's Secrets and outbox.
type Result struct {
	status.Probe
	// Generation is the fleet's generation the read was made for.
	Generation int64
	// Time is when the read finished.
	Time time.Time
}

// Options tune the Prober; zero values take the defaults.
type Options struct {
	// Concurrency is how many outboxes are read at once (default 8). Fleets
	// whose last read failed share a quarter of it, at least one, on top, so
	// that databases that do not answer never hold up those that do.
	Concurrency int
	// Timeout bounds one read, connection included, and each statement on
	// the server (default 10s).
	Timeout time.Duration
	// CountLimit is how many pending rows a read counts at most (default
	// 1,000,000); beyond it the numbers are lower bounds.
	CountLimit int
	// MaxBackoff caps the wait before a failing outbox is read again
	// (default 5m); never less than the fleet's status interval.
	MaxBackoff time.Duration
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.CountLimit <= 0 {
		o.CountLimit = 1_000_000
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 5 * time.Minute
	}
	return o
}

// entry is one registered fleet.
type entry struct {
	target   Target
	result   *Result
	failures int
	// url is the database URL of the last read, whose pool it keeps open.
	url string
	// readyReplicas is the fleet's ready drainers, as last reported.
	readyReplicas int32
}

// Prober reads the outboxes of the fleets the reconciler registers.
type Prober struct {
	// secrets reads Secrets straight from the API server: the manager
	// caches only their metadata, which versions reads (see secretMemo).
	secrets  client.Reader
	versions client.Reader
	memo     secretMemo
	// recorder records the releases of dead drainers' claims on their fleet.
	recorder events.EventRecorder
	opts     Options
	metrics  *Metrics

	queue  workqueue.TypedDelayingInterface[types.NamespacedName]
	events chan event.TypedGenericEvent[client.Object]
	reader *outbox.Reader
	// healthy and failing are the two lanes' semaphores.
	healthy, failing chan struct{}

	mu      sync.Mutex
	entries map[types.NamespacedName]*entry
}

// New returns a Prober; add it to the manager, and watch its Source.
func New(secrets client.Reader, recorder events.EventRecorder, metrics *Metrics, opts Options) *Prober {
	opts = opts.withDefaults()
	return &Prober{
		secrets:  secrets,
		recorder: recorder,
		opts:     opts,
		metrics:  metrics,
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[types.NamespacedName]{
			Name: "outbox-probe",
		}),
		events:  make(chan event.TypedGenericEvent[client.Object], 1024),
		reader:  outbox.NewReader(opts.Timeout),
		healthy: make(chan struct{}, opts.Concurrency),
		failing: make(chan struct{}, max(1, opts.Concurrency/4)),
		entries: map[types.NamespacedName]*entry{},
	}
}

// Source is where the Prober's results come from: one event per read, for
// the fleet it read.
func (p *Prober) Source() source.Source {
	return source.Channel(p.events, &handler.EnqueueRequestForObject{})
}

// Want registers a fleet, or updates what to read for it, and returns its
// latest result, nil before the first. A new or changed target is read at
// once; an unchanged one keeps its schedule.
func (p *Prober) Want(t Target) *Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[t.Key]
	if !ok {
		e = &entry{}
		p.entries[t.Key] = e
	}
	if !ok || !e.target.same(t) {
		e.target = t
		p.queue.Add(t.Key)
	}
	return e.result
}

// Refresh reads a registered fleet's outbox at once: a Secret it uses
// changed.
func (p *Prober) Refresh(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.entries[key]; ok {
		p.queue.Add(key)
	}
}

// Forget drops a deleted fleet, its metrics and, when no other fleet uses
// it, its connection pool.
func (p *Prober) Forget(key types.NamespacedName) {
	p.mu.Lock()
	_, ok := p.entries[key]
	delete(p.entries, key)
	p.mu.Unlock()
	if ok {
		p.metrics.forget(key)
		p.sweep()
	}
}

// ReportFleet publishes a fleet's Ready condition and its desired size
// beside its outbox's numbers, so one scrape has them all. A change in how
// many of its drainers are ready is read at once: a drainer turns unready
// when the database refuses it, and ready again once it stops, and the
// read tells the fleet's status why, or that it is over, without waiting
// out the interval or a failing read's backoff.
func (p *Prober) ReportFleet(key types.NamespacedName, ready bool, desired, readyReplicas int32) {
	v := 0.0
	if ready {
		v = 1
	}
	p.metrics.Ready.WithLabelValues(key.Namespace, key.Name).Set(v)
	p.metrics.DesiredReplicas.WithLabelValues(key.Namespace, key.Name).Set(float64(desired))
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.entries[key]; ok && e.readyReplicas != readyReplicas {
		e.readyReplicas = readyReplicas
		p.queue.Add(key)
	}
}

// NeedLeaderElection is true: only the leader reads outboxes.
func (p *Prober) NeedLeaderElection() bool { return true }

// Start reads outboxes until ctx ends.
func (p *Prober) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("outbox-probe")
	ctx = ctrl.LoggerInto(ctx, log)
	defer p.reader.Close()
	go func() {
		<-ctx.Done()
		p.queue.ShutDown()
	}()
	go func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				p.sweep()
			}
		}
	}()
	var reads sync.WaitGroup
	defer reads.Wait()
	for {
		key, shutdown := p.queue.Get()
		if shutdown {
			return nil
		}
		// One goroutine per fleet at most: the queue hands a key out again
		// only after Done.
		reads.Go(func() {
			defer p.queue.Done(key)
			p.read(ctx, key)
		})
	}
}

// read reads one fleet's outbox in its lane, records the result, schedules
// the next read and tells the reconciler.
func (p *Prober) read(ctx context.Context, key types.NamespacedName) {
	p.mu.Lock()
	e, ok := p.entries[key]
	if !ok {
		p.mu.Unlock()
		return
	}
	t, lane := e.target, p.healthy
	if e.failures > 0 {
		lane = p.failing
	}
	p.mu.Unlock()

	select {
	case lane <- struct{}{}:
	case <-ctx.Done():
		return
	}
	start := time.Now()
	probe, url, err := p.readOutbox(ctx, t)
	<-lane
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		// The API server did not answer: no news about the outbox.
		ctrl.LoggerFrom(ctx).Error(err, "Failed to read the Secrets of an OutboxDrainer", "outboxdrainer", key)
		p.queue.AddAfter(key, p.backoff(t.Interval, 1))
		return
	}
	elapsed := time.Since(start)
	result := &Result{Probe: probe, Generation: t.Generation, Time: time.Now()}

	p.mu.Lock()
	e, ok = p.entries[key]
	if !ok || e.target.Generation != t.Generation {
		// Forgotten, or changed meanwhile: the change queued a new read.
		p.mu.Unlock()
		return
	}
	e.result, e.url = result, url
	if probe.Outbox != nil {
		e.failures = 0
	} else {
		e.failures++
	}
	next := p.backoff(t.Interval, e.failures)
	p.mu.Unlock()

	p.metrics.record(key, result, elapsed)
	p.queue.AddAfter(key, next)
	select {
	// The event names the fleet; the reconciler reads the result with Want.
	case p.events <- event.TypedGenericEvent[client.Object]{Object: &v1alpha1.OutboxDrainer{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
	}}:
	case <-ctx.Done():
	}
}

// backoff is the wait before the next read: the status interval while reads
// succeed, doubling with each failure up to MaxBackoff. A Secret or spec
// change is read at once, whatever the wait.
func (p *Prober) backoff(interval time.Duration, failures int) time.Duration {
	wait := interval
	for i := 1; i < failures && wait < p.opts.MaxBackoff; i++ {
		wait *= 2
	}
	return max(interval, min(wait, p.opts.MaxBackoff))
}

// sweep closes the pools of database URLs that no fleet reads any more.
func (p *Prober) sweep() {
	p.mu.Lock()
	used := map[string]bool{}
	for _, e := range p.entries {
		used[e.url] = true
	}
	p.mu.Unlock()
	p.reader.CloseUnused(used)
}
