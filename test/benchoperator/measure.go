package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// sizeResult is what one size of the fleet measured.
type sizeResult struct {
	fleets int
	// toDeployment is the time from creating the last fleet to its
	// Deployment; changed, from each timed spec change to its Deployment's.
	toDeployment  time.Duration
	changed       []time.Duration
	idle, trickle windowResult
	rssMiB        float64
	// withPods is set where the drainers ran: toReady is from creating the
	// last fleet to every drainer Ready; rows are the rows written pending,
	// queued the messages that reached the queue, pending the rows left.
	withPods              bool
	toReady               time.Duration
	rows, queued, pending int
}

// windowResult is one measured window.
type windowResult struct {
	seconds float64
	// cpu is the operator's CPU seconds per second.
	cpu float64
	// requests is the operator's API requests per second, by verb.
	requests map[string]float64
	// served is the API server's requests per second by verb and resource,
	// where the operator is its one client beside the bench's watch
	// streams; nil where the cluster's own components run.
	served map[string]float64
	// statusWrites and events per fleet-minute.
	statusWrites, events float64
	// stale is every sample of now − the fleet's last read, over all fleets.
	stale []time.Duration
	// sessions is the most probe sessions seen on any one database.
	sessions int
	// reads is the probe's reads; pgCPUPerRead, its Postgres backends'
	// CPU per read.
	reads        float64
	pgCPUPerRead time.Duration
	trickled     int
}

// measure grows the fleets to n, and measures them idle and under a trickle.
func (b *bench) measure(ctx context.Context, op *operator, w *watcher, n int) sizeResult {
	r := sizeResult{fleets: n}
	start := time.Now()
	tables := b.tables
	b.addTables(ctx, n)
	log.Printf("%d outbox tables migrated in %s", b.tables-tables, time.Since(start).Round(time.Second))
	for i := b.fleets; i < n-1; i++ {
		b.createFleet(ctx, i)
	}
	_, ns, name := fleetKey(n - 1)
	last := types.NamespacedName{Namespace: ns, Name: name}
	created := time.Now()
	b.createFleet(ctx, n-1)
	at, ok := w.waitFor(time.Minute, func() bool { _, ok := w.deployed[last]; return ok })
	if !ok {
		fatalf("fleet %s has no Deployment a minute after it was created", last)
	}
	r.toDeployment = at.Sub(created)
	b.fleets = n
	if b.drainers != nil {
		r.withPods = true
		log.Printf("%d fleets created; waiting for every drainer to be Ready", n)
		at, ok := w.waitFor(10*time.Minute, func() bool { return len(w.ready) >= n })
		if !ok {
			fatalf("not every fleet's drainer was Ready within 10 minutes")
		}
		r.toReady = at.Sub(created)
	}
	keys := make([]types.NamespacedName, n)
	for i := range keys {
		_, ns, name := fleetKey(i)
		keys[i] = types.NamespacedName{Namespace: ns, Name: name}
	}
	log.Printf("%d fleets created; waiting for every status to be read", n)
	if _, ok := w.waitFor(10*time.Minute, func() bool { return len(w.probed) >= n }); !ok {
		fatalf("not every fleet's status was read within 10 minutes")
	}
	// A full interval more, so that the window starts in the steady state.
	time.Sleep(*statusInterval)
	log.Printf("measuring %d fleets idle for %s", n, *window)
	r.idle = b.window(ctx, op, w, keys, false)
	log.Printf("measuring %d fleets under a trickle for %s", n, *window)
	r.trickle = b.window(ctx, op, w, keys, true)
	r.rssMiB = rssMiB(op.pid())
	log.Printf("timing %d spec changes", *changes)
	for k := range *changes {
		key := keys[(k*n)/(*changes)]
		size := 501 + k + n // unlike any earlier change's
		patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"batchSize":%d}}`, size))
		changed := time.Now()
		if err := b.k8s.Patch(ctx, &v1alpha1.OutboxDrainer{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}, patch); err != nil {
			fatal(err)
		}
		at, ok := w.waitFor(time.Minute, func() bool { return w.hasArg(key, "--batch-size="+strconv.Itoa(size)) })
		if !ok {
			fatalf("the Deployment of %s did not take batchSize %d within a minute", key, size)
		}
		r.changed = append(r.changed, at.Sub(changed))
	}
	return r
}

// window measures the operator over one window, with a trickle of events
// into a tenth of the outboxes when trickling.
func (b *bench) window(ctx context.Context, op *operator, w *watcher, keys []types.NamespacedName, trickling bool) windowResult {
	r := windowResult{}
	cpu0, metrics0, served0 := processCPU(op.pid()), scrape(op), b.served(ctx)
	writes0, events0 := w.counts()
	backends0 := b.probeBackends(ctx)
	trickled := make(chan int, 1)
	windowCtx, cancel := context.WithTimeout(ctx, *window)
	defer cancel()
	if trickling {
		go func() { trickled <- b.trickle(windowCtx, len(keys)) }()
	} else {
		trickled <- 0
	}
	start := time.Now()
	// A scrape of a thousand fleets' metrics costs the operator too, so
	// sample as often as a Prometheus would, not more.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
sampling:
	for {
		select {
		case <-windowCtx.Done():
			break sampling
		case now := <-tick.C:
			ages, _ := scrape(op).staleness(now, keys)
			r.stale = append(r.stale, ages...)
			r.sessions = max(r.sessions, b.sessionsPerDatabase(ctx))
		}
	}
	r.trickled = <-trickled
	r.seconds = time.Since(start).Seconds()
	minutes := r.seconds / 60 * float64(len(keys))
	r.cpu = (processCPU(op.pid()) - cpu0) / r.seconds
	metrics1 := scrape(op)
	r.requests = map[string]float64{}
	for verb, v := range metrics1.requests {
		r.requests[verb] = (v - metrics0.requests[verb]) / r.seconds
	}
	r.reads = metrics1.reads - metrics0.reads
	if served1 := b.served(ctx); served1 != nil {
		r.served = map[string]float64{}
		for request, v := range served1 {
			if v > served0[request] {
				r.served[request] = (v - served0[request]) / r.seconds
			}
		}
	}
	writes1, events1 := w.counts()
	r.statusWrites, r.events = float64(writes1-writes0)/minutes, float64(events1-events0)/minutes
	if r.reads > 0 {
		r.pgCPUPerRead = time.Duration(float64(time.Second) * backendCPU(backends0, b.probeBackends(ctx)) / r.reads)
	}
	slices.Sort(r.stale)
	if trickling && b.drainers == nil {
		b.publishTrickle(ctx, len(keys))
	}
	return r
}

// scraped is one scrape of the operator's metrics.
type scraped struct {
	// requests are its API client's requests by verb
	// (rest_client_requests_total's method).
	requests map[string]float64
	// reads counts the probe's reads of every outbox.
	reads  float64
	leader bool
	// lastRead is when each fleet's outbox was last read: a read that finds
	// it as it was writes no status, so the status's own time says when it
	// last changed, not how fresh it is.
	lastRead map[types.NamespacedName]time.Time
}

// scrape reads the operator's metrics.
func scrape(op *operator) scraped {
	out := scraped{requests: map[string]float64{}, lastRead: map[types.NamespacedName]time.Time{}}
	resp, err := http.Get("http://" + op.metricsAddr + "/metrics")
	if err != nil {
		log.Printf("scrape %s: %v", op.name, err)
		return out
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		log.Printf("scrape %s: %v", op.name, err)
		return out
	}
	for _, m := range families["rest_client_requests_total"].GetMetric() {
		out.requests[label(m, "method")] += m.GetCounter().GetValue()
	}
	for _, m := range families["leader_election_master_status"].GetMetric() {
		out.leader = out.leader || m.GetGauge().GetValue() == 1
	}
	for _, m := range families["spillway_outbox_probe_duration_seconds"].GetMetric() {
		out.reads += float64(m.GetHistogram().GetSampleCount())
	}
	for _, m := range families["spillway_outbox_last_read_timestamp_seconds"].GetMetric() {
		key := types.NamespacedName{Namespace: label(m, "namespace"), Name: label(m, "name")}
		out.lastRead[key] = time.Unix(0, int64(m.GetGauge().GetValue()*1e9))
	}
	return out
}

// served is the API server's apiserver_request_total by verb and resource
// ("PUT outboxdrainers/status"), while only the operator uses it: nil where
// the cluster's own components run.
func (b *bench) served(ctx context.Context) map[string]float64 {
	if b.drainers != nil {
		return nil
	}
	raw, err := b.api.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		log.Printf("the API server's metrics: %v", err)
		return nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		log.Printf("the API server's metrics: %v", err)
		return nil
	}
	out := map[string]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		resource := label(m, "resource")
		if sub := label(m, "subresource"); sub != "" {
			resource += "/" + sub
		}
		out[label(m, "verb")+" "+resource] += m.GetCounter().GetValue()
	}
	return out
}

// label is the value of a metric's label, or "".
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// staleness is now − the last read of each fleet, and the number of fleets
// not read yet.
func (s scraped) staleness(now time.Time, fleets []types.NamespacedName) (ages []time.Duration, unread int) {
	for _, key := range fleets {
		t, ok := s.lastRead[key]
		if !ok {
			unread++
			continue
		}
		ages = append(ages, now.Sub(t))
	}
	return ages, unread
}

// processCPU is a process's user and system CPU seconds.
func processCPU(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, which is in parentheses.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// rssMiB is a process's resident set.
func rssMiB(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// probeBackends are the Postgres backends of the operator's probe, by pid,
// with their CPU seconds so far.
func (b *bench) probeBackends(ctx context.Context) map[int]float64 {
	rows, err := b.admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = 'spillway-operator'")
	if err != nil {
		fatal(err)
	}
	defer rows.Close()
	out := map[int]float64{}
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			fatal(err)
		}
		out[pid] = processCPU(pid)
	}
	return out
}

// backendCPU is the CPU seconds the backends spent between two samples; a
// backend that came or went in between counts from zero or up to its last
// sample.
func backendCPU(before, after map[int]float64) float64 {
	var sum float64
	for pid, cpu := range after {
		sum += cpu - before[pid]
	}
	return sum
}

// sessionsPerDatabase is the most sessions the probe holds on one database.
func (b *bench) sessionsPerDatabase(ctx context.Context) int {
	var n int
	err := b.admin.QueryRow(ctx, `SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM pg_stat_activity
		WHERE application_name = 'spillway-operator' GROUP BY datname) s`).Scan(&n)
	if err != nil {
		fatal(err)
	}
	return n
}
