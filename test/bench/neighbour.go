package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

var (
	neighbourRate     = flag.Int("neighbour-rate", 500, "the application's commits per second in the good-neighbour runs, one outbox row each")
	neighbourConns    = flag.Int("neighbour-connections", 8, "the application's connections in the good-neighbour runs")
	neighbourDuration = flag.Duration("neighbour-duration", 8*time.Second, "length of each good-neighbour run")
	neighbourBacklog  = flag.Int("neighbour-backlog", 200_000, "pending rows in the outbox when each good-neighbour run starts")
	// neighbourCaps are the --max-rate of the extra capped runs: the
	// application's p99 against the cap, for choosing one.
	neighbourCaps = rates{1000, 3000}
	// neighbourGuards are the --max-commit-latency of the guarded runs, as
	// multiples of the application's commit p99 alone in the same round.
	neighbourGuards = rates{1}
)

func init() {
	flag.Var(&neighbourCaps, "neighbour-caps", "--max-rate of the extra capped good-neighbour runs, events/s, comma-separated (empty for none)")
	flag.Var(&neighbourGuards, "neighbour-guards", "--max-commit-latency of the guarded good-neighbour runs, as multiples of the round's commit p99 with no drain, comma-separated (empty for none)")
}

// rates is a flag of positive numbers, comma-separated: rates in events/s,
// or multiples.
type rates []float64

func (r *rates) String() string {
	var s []string
	for _, c := range *r {
		s = append(s, strconv.FormatFloat(c, 'f', -1, 64))
	}
	return strings.Join(s, ",")
}

func (r *rates) Set(list string) error {
	*r = nil
	for _, field := range strings.Split(list, ",") {
		if field = strings.TrimSpace(field); field == "" {
			continue
		}
		c, err := strconv.ParseFloat(field, 64)
		if err != nil || c <= 0 {
			return fmt.Errorf("%q is not a positive number", field)
		}
		*r = append(*r, c)
	}
	return nil
}

// neighbourRun is what one good-neighbour run measured: the application's
// commit latencies, and the drain beside it.
type neighbourRun struct {
	commits  []time.Duration // sorted
	drained  int
	wall     time.Duration
	wal      walUse
	ranEmpty bool // the backlog was drained before the run ended
}

// drainRate is the events per second the drain published during the run.
func (r neighbourRun) drainRate() float64 { return float64(r.drained) / r.wall.Seconds() }

// neighbours accumulates the runs of one way of draining.
type neighbours struct {
	what  string
	start func() drain // nil: no drain
	runs  []neighbourRun
}

func (n *neighbours) median(f func(neighbourRun) float64) float64 {
	var xs []float64
	for _, r := range n.runs {
		xs = append(xs, f(r))
	}
	return median(xs)
}

func (n *neighbours) p99() float64 {
	return n.median(func(r neighbourRun) float64 { return ms(quantile(r.commits, 0.99)) })
}

func (n *neighbours) rate() float64 {
	return n.median(neighbourRun.drainRate)
}

// goodNeighbour measures the harm a drain does to the application that
// shares its database: the application commits single-row outbox events at
// a fixed rate over several connections while a backlog is drained beside
// it: by nothing, by the naive drainer, and by Spillway uncapped, capped at
// the naive drainer's rate and at each -neighbour-caps, paced by its commit
// guard, keeping published rows, with synchronous_commit on, and into a
// queue the broker keeps in memory; and by the raw publisher alone. The last
// two tell the database's part of the harm from the broker's, which shares
// the database's disk and cores here.
func (b *bench) goodNeighbour(ctx context.Context) []string {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	appConfig, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	appConfig.MaxConns, appConfig.MinConns = int32(*neighbourConns), int32(*neighbourConns)
	appConfig.ConnConfig.RuntimeParams["application_name"] = "bench-application"
	app, err := pgxpool.NewWithConfig(ctx, appConfig)
	if err != nil {
		log.Fatal(err)
	}
	defer app.Close()

	spillway := func(tweak func(*drainer.Config)) func() drain {
		return func() drain {
			f := b.newFleet(ctx, spec, 1, tweak)
			return drain{published: func() int { return int(f.published()) }, stop: f.run(ctx), fromBacklog: true}
		}
	}
	none := &neighbours{what: "no drainer"}
	naive := &neighbours{what: "naive drainer", start: func() drain {
		n := b.startNaive(ctx, spec)
		return drain{published: func() int { return int(n.published.Load()) }, stop: n.stop, fromBacklog: true}
	}}
	spill := &neighbours{what: "spillway, 1 drainer, defaults (uncapped)", start: spillway(nil)}
	// The capped run comes after the naive drainer's in each round, and is
	// capped at the rate that run drained at.
	capped := &neighbours{what: "spillway, capped at the naive drainer's rate", start: spillway(func(c *drainer.Config) {
		c.MaxRate = naive.runs[len(naive.runs)-1].drainRate()
	})}
	// The broker's share of the harm on a machine where it shares the
	// database's disk and cores: the raw publisher, flat out, beside the
	// application, with no database work of its own.
	broker := &neighbours{what: "raw publisher alone (no database work)", start: func() drain {
		var confirmed atomic.Int64
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			b.publishRaw(ctx, true, math.MaxInt, stop, &confirmed)
		}()
		return drain{published: func() int { return int(confirmed.Load()) }, stop: func() { close(stop); <-done }}
	}}
	// The database's part: Spillway at the uncapped run's rate (it comes
	// after it in each round) into a queue the broker keeps in memory, so
	// that the broker's disk writes are out of the way and the database's
	// are those of the uncapped run.
	offDisk := &neighbours{what: "spillway at the uncapped rate, broker off disk", start: spillway(func(c *drainer.Config) {
		c.Broker.Exchange, c.MaxRate = b.memory.Exchange, spill.runs[len(spill.runs)-1].drainRate()
	})}
	keeping := &neighbours{what: "spillway, published rows kept (uncapped)", start: spillway(keepPublished)}
	synchronous := &neighbours{what: "spillway, synchronous_commit on", start: spillway(func(c *drainer.Config) { c.SynchronousCommit = true })}
	all := []*neighbours{none, naive, spill, capped, broker, offDisk, keeping, synchronous}
	for _, rate := range neighbourCaps {
		all = append(all, &neighbours{what: fmt.Sprintf("spillway, capped at %.0f events/s", rate),
			start: spillway(func(c *drainer.Config) { c.MaxRate = rate })})
	}
	// The guarded runs come after the run with no drain in each round, and
	// their ceilings are multiples of that run's p99.
	for _, m := range neighbourGuards {
		all = append(all, &neighbours{what: fmt.Sprintf("spillway, maxCommitLatency %.3g × p99 alone", m), start: spillway(func(c *drainer.Config) {
			c.MaxCommitLatency = time.Duration(m * float64(quantile(none.runs[len(none.runs)-1].commits, 0.99)))
		})})
	}
	var beside []string
	for _, n := range all {
		beside = append(beside, n.what)
	}
	for round := range *rounds {
		log.Printf("good neighbour, round %d of %d: the application at %d commits/s beside %s",
			round+1, *rounds, *neighbourRate, strings.Join(beside, "; "))
		for _, n := range all {
			n.runs = append(n.runs, b.neighbourRun(ctx, app, spec, n.start))
		}
	}

	fmt.Printf("\ngood neighbour: the application commits %d single-row outbox events/s over %d connections for %s, beside a backlog of %d rows; medians of %d rounds\n",
		*neighbourRate, *neighbourConns, *neighbourDuration, *neighbourBacklog, *rounds)
	for _, n := range all {
		n.report(none)
	}
	base := none.p99()
	return []string{
		target("commit p99 beside spillway ≤ 2 × without", fmt.Sprintf("%.2f", spill.p99()/base), spill.p99() <= 2*base),
		target("commit p99 beside spillway keeping published rows ≤ 2 × without", fmt.Sprintf("%.2f", keeping.p99()/base), keeping.p99() <= 2*base),
		target("commit p99, spillway capped ≤ beside naive", fmt.Sprintf("%.2f", capped.p99()/naive.p99()), capped.p99() <= naive.p99()),
	}
}

// report prints the application's commit latency beside one way of
// draining, the drain's rate, the WAL written and synced meanwhile, and
// each round's p99.
func (n *neighbours) report(none *neighbours) {
	p50 := n.median(func(r neighbourRun) float64 { return ms(quantile(r.commits, 0.5)) })
	line := fmt.Sprintf("%-46s commit p50 %6.2f ms  p99 %6.2f ms (%.2fx)", n.what, p50, n.p99(), n.p99()/none.p99())
	if n != none {
		line += fmt.Sprintf("  drained %6.0f events/s", n.rate())
	}
	// All the WAL of the run, the application's and the drain's: what the
	// application's commits wait to flush.
	wal := n.median(func(r neighbourRun) float64 { return r.wal.bytes / 1024 / r.wall.Seconds() })
	fpi := n.median(func(r neighbourRun) float64 { return r.wal.fpi / r.wall.Seconds() })
	syncs := n.median(func(r neighbourRun) float64 { return r.wal.syncs / r.wall.Seconds() })
	line += fmt.Sprintf("  WAL %6.0f kB/s, %4.0f full pages/s, %4.0f syncs/s", wal, fpi, syncs)
	var empty, p99s []string
	for i, r := range n.runs {
		if r.ranEmpty {
			empty = append(empty, fmt.Sprint(i+1))
		}
		p99s = append(p99s, fmt.Sprintf("%.2f", ms(quantile(r.commits, 0.99))))
	}
	if len(p99s) > 1 {
		// A p99 of a few thousand commits moves from round to round as much
		// as a drain moves it: the rounds show how far.
		line += "  p99 rounds " + strings.Join(p99s, ", ")
	}
	if len(empty) > 0 {
		line += "  (backlog ran out in round " + strings.Join(empty, ", ") + ")"
	}
	fmt.Println(line)
}

// drain is a drainer running beside the application.
type drain struct {
	published func() int
	stop      func()
	// fromBacklog is whether what it publishes comes from the seeded
	// backlog, which it can then run out of; the raw publisher's does not.
	fromBacklog bool
}

// neighbourRun seeds the backlog, starts the drain (nil: none), runs the
// application for the run's length and returns what it measured.
func (b *bench) neighbourRun(ctx context.Context, app *pgxpool.Pool, spec outbox.TableSpec, start func() drain) neighbourRun {
	b.seed(ctx, spec, *neighbourBacklog, 0)
	b.exec(ctx, "CHECKPOINT") // every run starts owing no checkpoint
	quiesce("good-neighbour run")
	d := drain{published: func() int { return 0 }, stop: func() {}}
	if start != nil {
		d = start()
	}
	body := b.payload()
	total := int(float64(*neighbourRate) * neighbourDuration.Seconds())
	latencies := make([][]time.Duration, *neighbourConns)
	watch, begin := startWatch(b.pool), time.Now()
	var wg sync.WaitGroup
	for c := range *neighbourConns {
		wg.Go(func() {
			for i := c; i < total; i += *neighbourConns {
				time.Sleep(time.Until(begin.Add(time.Duration(i) * time.Second / time.Duration(*neighbourRate))))
				sent := time.Now()
				if _, err := app.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES ('app.event', $1)", body); err != nil {
					log.Fatal(err)
				}
				latencies[c] = append(latencies[c], time.Since(sent))
			}
		})
	}
	wg.Wait()
	r, drained := watch.stop(0), d.published()
	d.stop()
	wal := watch.walSince()
	b.purge()
	run := neighbourRun{commits: slices.Concat(latencies...), drained: drained, wall: r.cpu.wall, wal: wal,
		ranEmpty: d.fromBacklog && drained >= *neighbourBacklog}
	slices.Sort(run.commits)
	return run
}
