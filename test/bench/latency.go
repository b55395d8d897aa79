package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// latency measures commit to publish at a steady application rate, with
// notifications (coalesced, as by default, and not) and with polling only,
// in interleaved rounds: one 10 s run of each is at the mercy of what falls
// in it, and single runs put Postgres's CPU with notifications at 0.72–1.91 ×
// polling's from one full run to the next. (Much of that spread was the
// claim's plan, made on the run's new, empty table: it read the table whole
// until an autovacuum happened to replan it; see ConnectPool.)
func (b *bench) latency(ctx context.Context) []string {
	coalesce := *wakeCoalesce
	var notified, eager, polled latencyRuns
	for round := range *rounds {
		log.Printf("commit-to-publish latency at %d events/s, round %d of %d: notified, coalescing %s and not, and polling only",
			*latencyRate, round+1, *rounds, coalesce)
		notified = append(notified, b.commitLatency(ctx, true, coalesce))
		eager = append(eager, b.commitLatency(ctx, true, 0))
		polled = append(polled, b.commitLatency(ctx, false, coalesce))
	}
	fmt.Println()
	notified.report(fmt.Sprintf("commit→published latency, LISTEN/NOTIFY, coalescing %s", coalesce))
	eager.report("commit→published latency, LISTEN/NOTIFY, claiming at each wake-up")
	polled.report(fmt.Sprintf("commit→published latency, polling every %s", drainer.DefaultConfig().PollInterval))
	coalescing, each := notified.databaseCPU()/polled.databaseCPU(), eager.databaseCPU()/polled.databaseCPU()
	fmt.Printf("Postgres CPU against polling's, over the rounds: coalescing %.2f (rounds %s), claiming at each wake-up %.2f (rounds %s)\n",
		coalescing, notified.against(polled), each, eager.against(polled))
	for _, s := range []struct {
		what string
		runs latencyRuns
	}{{"coalescing", notified}, {"claiming at each wake-up", eager}, {"polling", polled}} {
		fmt.Printf("  %-26s %s (of a core, over the rounds)\n", s.what+":", s.runs.sessions())
	}

	p50, p99 := notified.p50(), notified.p99()
	return []string{
		target("LISTEN/NOTIFY p50 ≤ 10 ms", fmt.Sprintf("%.2f ms", ms(p50)), p50 <= 10*time.Millisecond),
		target("LISTEN/NOTIFY p99 ≤ 50 ms", fmt.Sprintf("%.2f ms", ms(p99)), p99 <= 50*time.Millisecond),
		target("Postgres CPU, notify ≤ 1.5 × polling", fmt.Sprintf("%.2f", coalescing), coalescing <= 1.5),
	}
}

var (
	latencyRate     = flag.Int("latency-rate", 1000, "events per second inserted in the latency runs, one per transaction")
	latencyDuration = flag.Duration("latency-duration", 10*time.Second, "length of each latency run")
	wakeCoalesce    = flag.Duration("wake-coalesce", drainer.DefaultConfig().WakeCoalesce, "the drainer's --wake-coalesce in the notified latency run")
)

// latencyRun is one commit-to-publish latency measurement.
type latencyRun struct {
	p50, p99 time.Duration
	// p50 and p99 of the two legs: insert to claim, and claim to settle
	// (publish, confirm, and the settle's start).
	toClaim, toSettle [2]time.Duration
	// confirm is p50 and p99 of publish to confirm within the second leg,
	// from the drainer's histogram, so a slow tail can be placed in it or
	// in the settle. The histogram is observed when the claim loop takes
	// the confirm, so it holds any wait of the drainer's own as well.
	confirm [2]time.Duration
	// notifications the commits sent, counted by the bench's own listener
	notifications int64
	rate          float64 // achieved insert rate
	// walBytes is the WAL written from the first insert to the last row's
	// settle, the inserts' own included; pages is the table's size then.
	walBytes float64
	pages    int64
	cpu      cpuUse // while inserting, the bench's producers count as "drainer"
	sessions sessionShares
	events   int
}

// commitLatency inserts rows one transaction each, at a steady rate as an
// application would, while one drainer with the default settings drains
// them, with or without the notify trigger. A row's latency runs from the
// moment its insert's commit returned to the producer to its published_at:
// the start of the settle that follows the broker's confirm, on the same
// host's clock. It bounds commit-to-confirm from above.
// coalesce is the drainer's --wake-coalesce.
func (b *bench) commitLatency(ctx context.Context, notify bool, coalesce time.Duration) latencyRun {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	if notify {
		if _, err := outbox.InstallNotifyTrigger(ctx, b.pool, spec); err != nil {
			log.Fatal(err)
		}
	}
	// Both runs start from a checkpoint, so neither inherits one owed to
	// the WAL that earlier runs wrote.
	b.exec(ctx, "CHECKPOINT")
	quiesce("latency run")
	f := b.newFleet(ctx, spec, 1, func(c *drainer.Config) { c.WakeCoalesce = coalesce })
	stop := f.run(ctx)
	defer stop()
	time.Sleep(500 * time.Millisecond) // the drainer is up and idle
	var notifications atomic.Int64
	if notify {
		defer countNotifications(ctx, spec, &notifications)()
	}

	// Several producers, as several application sessions: one alone waits
	// on its own commit's WAL flush and could not keep the rate.
	const producers = 4
	total := int(float64(*latencyRate) * latencyDuration.Seconds())
	body := b.payload()
	committed := make([]map[string]time.Time, producers)
	start, watch := time.Now(), startWatch(b.pool)
	var wg sync.WaitGroup
	for p := range producers {
		committed[p] = map[string]time.Time{}
		wg.Go(func() {
			for i := p; i < total; i += producers {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(*latencyRate))))
				var id string
				if err := b.pool.QueryRow(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES ('bench.event', $1) RETURNING id::text", body).Scan(&id); err != nil {
					log.Fatal(err)
				}
				committed[p][id] = time.Now()
			}
		})
	}
	wg.Wait()
	run := latencyRun{events: total, rate: float64(total) / time.Since(start).Seconds(), cpu: watch.stop(total).cpu, notifications: notifications.Load(),
		sessions: watch.databaseShares()}
	deadline := time.Now().Add(30 * time.Second)
	for int(f.published()) < total {
		if time.Now().After(deadline) {
			log.Fatalf("latency run: %v of %d published after 30 s", f.published(), total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	run.walBytes = readWAL(b.pool).bytes - watch.wal.bytes
	if err := b.pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass) / 8192", spec.Name).Scan(&run.pages); err != nil {
		log.Fatal(err)
	}
	// Where the time goes, on the database's clock: from the insert's
	// transaction start to the claim, and from the claim to the settle.
	var parts []float64
	if err := b.pool.QueryRow(ctx, `SELECT ARRAY[
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - enqueued_at)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - enqueued_at)),
		percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - claimed_at)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM published_at - claimed_at))] FROM `+spec.Name).Scan(&parts); err != nil {
		log.Fatal(err)
	}
	seconds := func(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
	run.toClaim = [2]time.Duration{seconds(parts[0]), seconds(parts[1])}
	run.toSettle = [2]time.Duration{seconds(parts[2]), seconds(parts[3])}
	var confirms dto.Metric
	if err := f.metrics[0].ConfirmLatency.Write(&confirms); err != nil {
		log.Fatal(err)
	}
	run.confirm = [2]time.Duration{bucketQuantile(confirms.GetHistogram(), 0.5), bucketQuantile(confirms.GetHistogram(), 0.99)}
	rows, err := b.pool.Query(ctx, "SELECT id::text, published_at FROM "+spec.Name)
	if err != nil {
		log.Fatal(err)
	}
	var latencies []time.Duration
	for rows.Next() {
		var id string
		var publishedAt time.Time
		if err := rows.Scan(&id, &publishedAt); err != nil {
			log.Fatal(err)
		}
		for _, c := range committed {
			if at, ok := c[id]; ok {
				latencies = append(latencies, publishedAt.Sub(at))
			}
		}
	}
	if rows.Err() != nil || len(latencies) != total {
		log.Fatalf("latency run: %d latencies of %d rows: %v", len(latencies), total, rows.Err())
	}
	slices.Sort(latencies)
	run.p50, run.p99 = quantile(latencies, 0.5), quantile(latencies, 0.99)
	b.purge()
	return run
}

func (r latencyRun) String() string {
	return fmt.Sprintf("p50 %7.2f ms  p99 %7.2f ms  (%d events at %.0f/s, %d notified; p50/p99 insert→claim %.1f/%.1f ms, claim→settle %.1f/%.1f ms, of which publish→confirm %.1f/%.1f)  %s (%s)  WAL/1k events %.0f kB, table %d pages",
		ms(r.p50), ms(r.p99), r.events, r.rate, r.notifications, ms(r.toClaim[0]), ms(r.toClaim[1]), ms(r.toSettle[0]), ms(r.toSettle[1]),
		ms(r.confirm[0]), ms(r.confirm[1]), r.cpu, r.sessions.String(r.cpu.wall),
		r.walBytes/float64(r.events)*1000/1024, r.pages)
}

// bucketQuantile estimates the q quantile of a histogram as Prometheus's
// histogram_quantile does: linearly within the bucket that holds it.
func bucketQuantile(h *dto.Histogram, q float64) time.Duration {
	if h.GetSampleCount() == 0 {
		return 0
	}
	rank := q * float64(h.GetSampleCount())
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		count, upper := float64(b.GetCumulativeCount()), b.GetUpperBound()
		if count >= rank && count > below {
			return time.Duration((lower + (upper-lower)*(rank-below)/(count-below)) * float64(time.Second))
		}
		lower, below = upper, count
	}
	return time.Duration(lower * float64(time.Second)) // past the last bound
}

// countNotifications listens on spec's channel, as a drainer does, and
// counts into n what the commits notify until the returned func is called.
func countNotifications(ctx context.Context, spec outbox.TableSpec, n *atomic.Int64) (stop func()) {
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	if _, err := conn.Exec(ctx, spec.Listen().SQL); err != nil {
		log.Fatal(err)
	}
	listenCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(listenCtx); err != nil {
				return
			}
			n.Add(1)
		}
	}()
	return func() {
		cancel()
		<-done
		_ = conn.Close(context.WithoutCancel(ctx))
	}
}

// latencyRuns are one scenario's runs, a round each.
type latencyRuns []latencyRun

// p50 and p99 are the medians of the rounds' p50 and p99.
func (rs latencyRuns) p50() time.Duration {
	return rs.medianOf(func(r latencyRun) time.Duration { return r.p50 })
}

func (rs latencyRuns) p99() time.Duration {
	return rs.medianOf(func(r latencyRun) time.Duration { return r.p99 })
}

func (rs latencyRuns) medianOf(f func(latencyRun) time.Duration) time.Duration {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = float64(f(r))
	}
	return time.Duration(median(xs))
}

// databaseCPU is the CPU seconds Postgres spent over every round.
func (rs latencyRuns) databaseCPU() float64 {
	var s float64
	for _, r := range rs {
		s += r.cpu.seconds[groupDatabase]
	}
	return s
}

// sessions is the database's CPU over every round, split by session, as a
// part of one core.
func (rs latencyRuns) sessions() string {
	var sum sessionShares
	var wall time.Duration
	for _, r := range rs {
		sum = sum.add(r.sessions)
		wall += r.cpu.wall
	}
	return sum.String(wall)
}

// against is each round's Postgres CPU as a ratio to that of base's round.
func (rs latencyRuns) against(base latencyRuns) string {
	each := make([]string, len(rs))
	for i := range rs {
		each[i] = fmt.Sprintf("%.2f", rs[i].cpu.seconds[groupDatabase]/base[i].cpu.seconds[groupDatabase])
	}
	return strings.Join(each, ", ")
}

// report prints the medians of the rounds' p50 and p99, then every round.
func (rs latencyRuns) report(what string) {
	fmt.Printf("%-70s p50 %7.2f ms  p99 %7.2f ms  (medians of %d rounds)\n", what, ms(rs.p50()), ms(rs.p99()), len(rs))
	for i, r := range rs {
		fmt.Printf("%70s %s\n", fmt.Sprintf("round %d:", i+1), r)
	}
}
