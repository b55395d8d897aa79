package probe

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics are the outboxes' health as the operator reads it, labelled by
// the OutboxDrainer's namespace and name, for alerts and autoscalers: the
// status is not scrapeable.
type Metrics struct {
	Backlog          *prometheus.GaugeVec
	Poisoned         *prometheus.GaugeVec
	BlockedKeys      *prometheus.GaugeVec
	OldestBlocked    *prometheus.GaugeVec
	OldestPendingAge *prometheus.GaugeVec
	CountCapped      *prometheus.GaugeVec
	LastRead         *prometheus.GaugeVec
	ProbeDuration    *prometheus.HistogramVec
	ProbeErrors      *prometheus.CounterVec
	// ReleasedClaims counts the rows whose claims the operator gave back
	// for a dead drainer.
	ReleasedClaims *prometheus.CounterVec
	// Ready is the fleet's Ready condition, and DesiredReplicas its size,
	// which the reconciler reports.
	Ready           *prometheus.GaugeVec
	DesiredReplicas *prometheus.GaugeVec
}

var (
	defaultMetrics     *Metrics
	defaultMetricsOnce sync.Once
)

// DefaultMetrics are the outbox metrics in controller-runtime's registry,
// which the manager serves; registered once per process.
func DefaultMetrics() *Metrics {
	defaultMetricsOnce.Do(func() { defaultMetrics = NewMetrics(metrics.Registry) })
	return defaultMetrics
}

// NewMetrics registers the outbox metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	fleet := []string{"namespace", "name"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "spillway", Subsystem: "outbox", Name: name, Help: help}, fleet)
	}
	m := &Metrics{
		Backlog:  gauge("backlog", "Pending rows that are not poisoned, as last read; absent while the read fails."),
		Poisoned: gauge("poisoned", "Pending rows at maxAttempts, never retried until replayed; absent while the read fails."),
		BlockedKeys: gauge("blocked_keys",
			"Ordering keys whose later rows wait for a failed row (spec.ordering with onFailure block); absent without, or while the read fails."),
		OldestBlocked: gauge("oldest_blocked_key_age_seconds",
			"Age of the oldest blocked key's failed row, by its enqueued_at; absent without blocked keys or enqueuedAt, or while the read fails."),
		OldestPendingAge: gauge("oldest_pending_age_seconds",
			"Age of the backlog's oldest row by the database's clock; absent while the read fails or the table has no enqueuedAt column."),
		CountCapped: gauge("count_capped",
			"1 when the last read stopped counting at --probe-count-limit: backlog, poisoned and age are then lower bounds."),
		LastRead: gauge("last_read_timestamp_seconds", "When the outbox was last read successfully, as a Unix time."),
		ProbeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "spillway", Subsystem: "outbox", Name: "probe_duration_seconds",
			Help:    "Duration of a read of the outbox, Secrets and connection included.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, fleet),
		ProbeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "spillway", Subsystem: "outbox", Name: "probe_errors_total",
			Help: "Reads of the outbox that failed, by the DatabaseReachable condition's reason.",
		}, append(fleet, "reason")),
	}
	m.ReleasedClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "spillway", Subsystem: "outbox", Name: "released_claims_total",
		Help: "Rows whose claims the operator released because their drainer was dead, by why: PodGone, PodFailed, NodeUnreachable.",
	}, append(fleet, "reason"))
	m.Ready = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "spillway", Subsystem: "outboxdrainer", Name: "ready",
		Help: "1 while the OutboxDrainer's Ready condition is True: every desired drainer ready and the outbox read."}, fleet)
	m.DesiredReplicas = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "spillway", Subsystem: "outboxdrainer", Name: "desired_replicas",
		Help: "Drainers the fleet should run: spec.replicas, or autoscaling's count; 0 while paused."}, fleet)
	reg.MustRegister(m.Backlog, m.Poisoned, m.BlockedKeys, m.OldestBlocked, m.OldestPendingAge, m.CountCapped, m.LastRead, m.ProbeDuration, m.ProbeErrors,
		m.ReleasedClaims, m.Ready, m.DesiredReplicas)
	return m
}

// record publishes one read. A failed read removes the numbers, so that
// nothing reads an old backlog as current.
func (m *Metrics) record(key types.NamespacedName, r *Result, elapsed time.Duration) {
	labels := prometheus.Labels{"namespace": key.Namespace, "name": key.Name}
	m.ProbeDuration.With(labels).Observe(elapsed.Seconds())
	o := r.Outbox
	if o == nil {
		m.ProbeErrors.WithLabelValues(key.Namespace, key.Name, r.Reason).Inc()
		m.Backlog.Delete(labels)
		m.Poisoned.Delete(labels)
		m.BlockedKeys.Delete(labels)
		m.OldestBlocked.Delete(labels)
		m.OldestPendingAge.Delete(labels)
		m.CountCapped.Delete(labels)
		return
	}
	m.Backlog.With(labels).Set(float64(o.Backlog))
	m.Poisoned.With(labels).Set(float64(o.Poisoned))
	m.BlockedKeys.Delete(labels)
	m.OldestBlocked.Delete(labels)
	if b := o.Blocked; b != nil {
		m.BlockedKeys.With(labels).Set(float64(b.Count))
		if b.OldestEnqueuedAt != nil {
			m.OldestBlocked.With(labels).Set(r.Time.Sub(*b.OldestEnqueuedAt).Seconds())
		}
	}
	if o.AgeKnown {
		m.OldestPendingAge.With(labels).Set(o.OldestPendingAge.Seconds())
	} else {
		m.OldestPendingAge.Delete(labels)
	}
	capped := 0.0
	if o.Capped {
		capped = 1
	}
	m.CountCapped.With(labels).Set(capped)
	m.LastRead.With(labels).Set(float64(r.Time.UnixNano()) / 1e9)
}

// forget removes every series of a deleted fleet.
func (m *Metrics) forget(key types.NamespacedName) {
	labels := prometheus.Labels{"namespace": key.Namespace, "name": key.Name}
	for _, g := range []*prometheus.GaugeVec{m.Backlog, m.Poisoned, m.BlockedKeys, m.OldestBlocked, m.OldestPendingAge, m.CountCapped, m.LastRead, m.Ready, m.DesiredReplicas} {
		g.Delete(labels)
	}
	m.ProbeDuration.DeletePartialMatch(labels)
	m.ProbeErrors.DeletePartialMatch(labels)
	m.ReleasedClaims.DeletePartialMatch(labels)
}
