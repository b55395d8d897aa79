package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
)

var (
	spentRows   = flag.Int("spent-rows", 1_000_000, "rows at maxAttempts with a finite due time in front of the live rows of the spent run")
	spentLive   = flag.Int("spent-live", 2_000, "live rows inserted after the drainer of the spent run started")
	spentWithin = flag.Duration("spent-within", 2*time.Second, "the spent run's target: every live row published within this")
)

// spentSetup is one run of the spent section: the outbox a drainer starts
// on, and its maxAttempts.
type spentSetup struct {
	what   string
	notify bool
	// lowered seeds 100,000 more due rows at attempts 3 to 9 and drains
	// with maxAttempts 3, as after --max-attempts is lowered from 10.
	lowered bool
}

// spent measures how long rows inserted after a drainer's start wait behind
// spent rows: due, but at maxAttempts, as an adopted table, a lowered
// maxAttempts or an older release leaves them. The outbox holds a million
// of them, 100,000 rows in backoff and 500,000 published; the drainer runs
// at the defaults, polling or woken by the notify trigger.
func (b *bench) spent(ctx context.Context) []string {
	setups := []spentSetup{
		{what: "polling"},
		{what: "notify trigger", notify: true},
		{what: "maxAttempts lowered 10 → 3, polling", lowered: true},
	}
	fmt.Printf("\nlive rows behind spent rows: %d rows at attempts 10 due a day ago, 100,000 in backoff, 500,000 published; %d rows inserted once a drainer has claimed\n",
		*spentRows, *spentLive)
	var targets []string
	for _, s := range setups {
		took, shelved, claim := b.spentRun(ctx, s)
		fmt.Printf("%-50s %d live rows published in %6.3f s  the drainer's claim p50 %6.2f ms  %d spent rows shelved in %.1f s\n",
			s.what+":", *spentLive, took.Seconds(), ms(claim), *spentRows+spentLowered(s), shelved.Seconds())
		targets = append(targets, target(fmt.Sprintf("live rows behind spent, %s ≤ %s", s.what, *spentWithin), fmt.Sprintf("%.2f s", took.Seconds()), took <= *spentWithin))
	}
	return targets
}

// spentLowered is how many rows a setup puts at attempts 3 to 9.
func spentLowered(s spentSetup) int {
	if s.lowered {
		return 100_000
	}
	return 0
}

// spentRun runs one setup: it seeds the outbox, starts a drainer, inserts
// the live rows once the drainer has claimed, and returns how long they took
// to be published, how long the drainer took to shelve every spent row,
// and the claim's median over the run.
func (b *bench) spentRun(ctx context.Context, s spentSetup) (took, shelved time.Duration, claim time.Duration) {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	log.Printf("spent rows, %s: seeding", s.what)
	b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, available_at, published_at)
		SELECT 'bench.event', '{}', now() - interval '2 days', now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, 500000)`)
	b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, available_at, attempts, last_error)
		SELECT 'bench.event', '{}', now() - interval '1 day', now() - interval '1 day' + g * interval '1 ms', 10, 'returned'
		FROM generate_series(1, $1) g`, *spentRows)
	b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, available_at, attempts, last_error)
		SELECT 'bench.event', '{}', now() - interval '1 hour', now() + interval '1 hour', 3, 'nacked' FROM generate_series(1, 100000)`)
	maxAttempts := 10
	if s.lowered {
		maxAttempts = 3
		b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, available_at, attempts, last_error)
			SELECT 'bench.event', '{}', now() - interval '1 day', now() - interval '1 day' + g * interval '1 ms', 3 + g % 7, 'returned'
			FROM generate_series(1, 100000) g`)
	}
	if s.notify {
		if _, err := outbox.InstallNotifyTrigger(ctx, b.pool, spec); err != nil {
			log.Fatal(err)
		}
	}
	b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
	quiesce("spent rows")

	f := b.newFleet(ctx, spec, 1, func(c *drainer.Config) { c.MaxAttempts = maxAttempts })
	m := f.metrics[0]
	started := time.Now()
	stop := f.run(ctx)
	defer stop()
	for histogramOf(m.ClaimDuration).GetSampleCount() == 0 {
		time.Sleep(time.Millisecond)
	}
	log.Printf("spent rows, %s: the drainer has claimed; inserting %d rows", s.what, *spentLive)
	b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload) SELECT 'bench.event', '{}' FROM generate_series(1, $1)`, *spentLive)
	inserted := time.Now()
	for int(f.published()) < *spentLive {
		if time.Since(inserted) > 5*time.Minute {
			log.Fatalf("spent rows, %s: %d of %d live rows published after 5 minutes", s.what, int(f.published()), *spentLive)
		}
		time.Sleep(time.Millisecond)
	}
	took = time.Since(inserted)
	want := float64(*spentRows + spentLowered(s))
	for testutil.ToFloat64(m.Shelved) < want {
		if time.Since(started) > 10*time.Minute {
			log.Fatalf("spent rows, %s: %.0f of %.0f spent rows shelved after 10 minutes", s.what, testutil.ToFloat64(m.Shelved), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	shelved = time.Since(started)
	return took, shelved, bucketQuantile(histogramOf(m.ClaimDuration), 0.5)
}

// histogramOf reads a histogram's buckets.
func histogramOf(h prometheus.Histogram) *dto.Histogram {
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		log.Fatal(err)
	}
	return m.GetHistogram()
}
