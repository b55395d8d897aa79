package drainer

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the drainer's Prometheus collectors, all under spillway_drainer_.
type Metrics struct {
	Claimed        prometheus.Counter
	Published      prometheus.Counter
	Failed         *prometheus.CounterVec
	Released       *prometheus.CounterVec
	LeaseLost      prometheus.Counter
	ClaimDuration  prometheus.Histogram
	ConfirmLatency prometheus.Histogram
	BatchSize      prometheus.Histogram
	InFlight       prometheus.Gauge
	LastPublish    prometheus.Gauge
	Listening      prometheus.Gauge
	// BrokerConnected and BrokerBlocked follow the broker connection.
	BrokerConnected prometheus.Gauge
	BrokerBlocked   prometheus.Gauge
	RateShare       prometheus.Gauge
	CommitLatency   prometheus.Histogram
	CommitPace      prometheus.Gauge
	CommitPaceCuts  prometheus.Counter
	Pruned          *prometheus.CounterVec
	Shelved         prometheus.Counter
	// StatementErrors and StatementFailing watch the claims and settles
	// whose refusals make the drainer unready (see refusals).
	StatementErrors  *prometheus.CounterVec
	StatementFailing *prometheus.GaugeVec
	// WebhookResponses and WebhookDuration follow a webhook sink's
	// requests: each request's status class, and its time to a response.
	WebhookResponses *prometheus.CounterVec
	WebhookDuration  prometheus.Histogram
	// TraceDropped counts the malformed trace contexts of rows, published
	// without them.
	TraceDropped *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "spillway", Subsystem: "drainer", Name: name, Help: help}
	}
	m := &Metrics{
		Claimed:   prometheus.NewCounter(prometheus.CounterOpts(opts("claimed_rows_total", "Rows claimed from the outbox."))),
		Published: prometheus.NewCounter(prometheus.CounterOpts(opts("published_rows_total", "Rows confirmed by the broker and marked published."))),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts(opts("failed_rows_total",
			"Rows that failed and counted an attempt, by reason (returned, oversized, too_long, bad_headers, no_routing_key, connection_failures).")), []string{"reason"}),
		Released: prometheus.NewCounterVec(prometheus.CounterOpts(opts("released_rows_total",
			"Claims given back without counting an attempt, by reason (nack, confirm_lost, confirm_timeout, broker_unavailable, broker_blocked, shutdown, lease_ending).")), []string{"reason"}),
		LeaseLost: prometheus.NewCounter(prometheus.CounterOpts(opts("lease_lost_rows_total",
			"Rows a settle left alone because their lease had expired and they were claimed again."))),
		ClaimDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "spillway", Subsystem: "drainer",
			Name: "claim_duration_seconds", Help: "Time taken by one claim statement.", Buckets: latencyBuckets(13)}),
		ConfirmLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "spillway", Subsystem: "drainer",
			Name: "confirm_duration_seconds", Help: "Time from publish to broker confirm.", Buckets: latencyBuckets(15)}),
		WebhookResponses: prometheus.NewCounterVec(prometheus.CounterOpts(opts("webhook_responses_total",
			"A webhook sink's requests (a batch request counts once), by the status class of the response: 2xx, 3xx, 4xx, 5xx, or none (refused, reset, timed out).")), []string{"class"}),
		TraceDropped: prometheus.NewCounterVec(prometheus.CounterOpts(opts("trace_context_dropped_total",
			"Malformed trace contexts of rows, left off their messages, by the header dropped (traceparent, tracestate); the rows are published.")), []string{"header"}),
		WebhookDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "spillway", Subsystem: "drainer",
			Name: "webhook_request_duration_seconds", Help: "A webhook sink's requests, from sending to the response or the failure.", Buckets: latencyBuckets(15)}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "spillway", Subsystem: "drainer",
			Name: "batch_size_rows", Help: "Rows returned by one claim.", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		InFlight:    prometheus.NewGauge(prometheus.GaugeOpts(opts("in_flight_messages", "Messages published and awaiting their confirm."))),
		LastPublish: prometheus.NewGauge(prometheus.GaugeOpts(opts("last_publish_timestamp_seconds", "Unix time of the last confirmed publish."))),
		Listening: prometheus.NewGauge(prometheus.GaugeOpts(opts("listening",
			"1 while a LISTEN session on the table's notify channel is up and inserts wake the drainer at once; 0 while it relies on the poll."))),
		BrokerConnected: prometheus.NewGauge(prometheus.GaugeOpts(opts("broker_connected",
			"1 while the drainer holds an open connection to the broker (to one of its URLs); 0 while it reconnects."))),
		BrokerBlocked: prometheus.NewGauge(prometheus.GaugeOpts(opts("broker_blocked",
			"1 while the broker blocks publishing on the drainer's connection (a memory or disk alarm anywhere in its cluster): claiming is paused, so no lease expires under it."))),
		RateShare: prometheus.NewGauge(prometheus.GaugeOpts(opts("rate_share_events_per_second",
			"This drainer's share of --max-rate: the cap divided among the drainers running on the table (0 without a cap)."))),
		CommitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "spillway", Subsystem: "drainer",
			Name: "commit_duration_seconds", Help: "With --max-commit-latency: the synchronous commit of one settle every 100ms, which waits for the WAL to be flushed as an application's commit does.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		CommitPace: prometheus.NewGauge(prometheus.GaugeOpts(opts("commit_pace_events_per_second",
			"With --max-commit-latency: the events per second this drainer allows itself, halved at each timed commit slower than the ceiling (0 without the flag)."))),
		CommitPaceCuts: prometheus.NewCounter(prometheus.CounterOpts(opts("commit_pace_cuts_total",
			"With --max-commit-latency: timed commits slower than the ceiling that cut this drainer's pace, a halving each, or a hold at the slowest pace."))),
		Pruned: prometheus.NewCounterVec(prometheus.CounterOpts(opts("pruned_rows_total",
			"Rows deleted by retention, by kind (published; unpublished: past unpublishedMaxAge, never delivered).")), []string{"kind"}),
		Shelved: prometheus.NewCounter(prometheus.CounterOpts(opts("shelved_rows_total",
			"Due rows that were not live (at maxAttempts, or parked, with a finite due time) given the due time 'infinity', out of the claims' way."))),
		StatementErrors: prometheus.NewCounterVec(prometheus.CounterOpts(opts("statement_errors_total",
			"Failed claims and settles, and releases at start, by statement (claim, settle, release) and by the SQLSTATE the database answered (connection: no answer, or a read-only server's 25006).")), []string{"statement", "sqlstate"}),
		StatementFailing: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("statement_failing",
			"1 while a statement (claim, settle, release) has been refused by the database 3 times in a row, which makes the drainer unready, with the SQLSTATE of the last refusal.")), []string{"statement", "sqlstate"}),
	}
	reg.MustRegister(m.Claimed, m.Published, m.Failed, m.Released, m.LeaseLost,
		m.ClaimDuration, m.ConfirmLatency, m.BatchSize, m.InFlight, m.LastPublish, m.Listening, m.BrokerConnected, m.BrokerBlocked, m.RateShare,
		m.CommitLatency, m.CommitPace, m.CommitPaceCuts, m.Pruned, m.Shelved,
		m.StatementErrors, m.StatementFailing, m.WebhookResponses, m.WebhookDuration, m.TraceDropped)
	return m
}

// latencyBuckets are a latency histogram's buckets from 0.5 ms up to
// 0.5 ms × 2^doublings, two to each doubling: a quantile is interpolated
// within its bucket, and in buckets a doubling wide a confirm's p99 read
// 48 ms where the latencies themselves gave 41. Each bound is a short
// number, for readable le labels: the doublings exact, the bounds between
// them (× √2) to three figures.
func latencyBuckets(doublings int) []float64 {
	buckets := make([]float64, 0, 2*doublings+1)
	for d := range doublings + 1 {
		low := math.Ldexp(0.0005, d)
		buckets = append(buckets, low)
		if d < doublings {
			mid, _ := strconv.ParseFloat(strconv.FormatFloat(low*math.Sqrt2, 'g', 3, 64), 64)
			buckets = append(buckets, mid)
		}
	}
	return buckets
}
