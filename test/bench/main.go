// Command bench measures, in one run against the local Postgres and
// RabbitMQ, the broker's publishing ceiling, the drainer's throughput against
// it, and the claim statement's latency as the pending set grows. It prints
// the figures and their ratios; it asserts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

var (
	events        = flag.Int("events", 100_000, "events per throughput run")
	payloadBytes  = flag.Int("payload-bytes", 200, "payload size")
	batchSize     = flag.Int("batch-size", drainer.DefaultConfig().BatchSize, "drainer batch size")
	depth         = flag.Int("pipeline-depth", drainer.DefaultConfig().PipelineDepth, "confirms in flight, for the ceiling and the drainer")
	bigPending    = flag.Int("claim-rows", 1_000_000, "pending rows of the large claim-latency runs")
	staleRows     = flag.Int("stale-rows", 100_000, "rows in backoff, and as many poisoned, in front of the live rows of the aged claim-latency run")
	claims        = flag.Int("claims", 50, "claims timed per claim-latency run (each marks its batch published)")
	rounds        = flag.Int("rounds", 3, "interleaved rounds of each section's scenarios")
	tunedBatch    = flag.Int("tuned-batch-size", 1000, "batch size of the tuned run the defaults are compared with")
	tunedDepth    = flag.Int("tuned-pipeline-depth", 256, "pipeline depth of the tuned run (its lease is raised to the lease rule's)")
	ceilingWindow = flag.Int("ceiling-window", 256, "confirms in flight of the raw publisher")
	sectionList   = flag.String("sections", "throughput,neighbour,latency,claims,ordering,spent,design,logical,anatomy,vacuum,pooler,webhook,tracing", "which measurements to run, comma-separated")
	cpuProfile    = flag.String("cpuprofile", "", "write a CPU profile to this file of the first 1-drainer run: the throughput section's, or the webhook section's a row per request")
	memProfile    = flag.String("memprofile", "", "write an allocation profile of the same run to this file")
)

// benchLock is the advisory lock a benchmark run holds.
const benchLock = 0x5b111_be7c

type bench struct {
	pool *pgxpool.Pool
	// dbURL is pool's database, for the drainers.
	dbURL string
	conn  *amqp.Connection
	ch    *amqp.Channel
	topo  testenv.Topology
	// memory is a topology the broker keeps off its disk, for telling the
	// broker's part of a figure from the database's.
	memory testenv.Topology
}

func main() {
	flag.Parse()
	if *memProfile != "" {
		runtime.MemProfileRate = 0 // sampled during the profiled run only
	}
	sections := map[string]bool{}
	for _, s := range strings.Split(*sectionList, ",") {
		sections[strings.TrimSpace(s)] = true
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("bench: ")
	ctx := context.Background()
	services, err := testenv.Connect(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer services.Close()
	b := &bench{pool: services.DB, dbURL: testenv.DatabaseURL(), conn: services.Broker}
	if b.ch, err = b.conn.Channel(); err != nil {
		log.Fatal(err)
	}
	if b.topo, err = testenv.DeclareTopology(b.ch, "#", nil); err != nil {
		log.Fatal(err)
	}
	defer b.topo.Delete(b.ch)
	if b.memory, err = testenv.DeclareMemoryTopology(b.ch); err != nil {
		log.Fatal(err)
	}
	defer b.memory.Delete(b.ch)
	// One run at a time: another's tables are not leftovers, and its load
	// would be in this run's figures.
	lock, err := b.pool.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release()
	var alone bool
	if err := lock.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", benchLock).Scan(&alone); err != nil {
		log.Fatal(err)
	}
	if !alone {
		log.Printf("waiting for another benchmark run to end")
		if _, err := lock.Exec(ctx, "SELECT pg_advisory_lock($1)", benchLock); err != nil {
			log.Fatal(err)
		}
	}
	b.dropLeftovers(ctx)

	// The drainers run in this process with spillway drain's collection
	// target; the raw publisher and the naive drainer share it. Not its
	// memory limit, which is sized for a drainer alone: this process also
	// holds the application's and the consumers' side of every run.
	gcPercent := drainer.TuneGCPercent()
	fmt.Printf("Spillway benchmark: %d events of %d bytes, persistent, to a durable bound queue; batch %d, pipeline depth %d; GOGC %d\n\n",
		*events, *payloadBytes, *batchSize, *depth, gcPercent)

	// Latency before the claim runs, whose million-row tables leave
	// checkpoints and vacuums behind.
	order := []struct {
		name string
		run  func(context.Context) []string
	}{{"throughput", b.throughput}, {"neighbour", b.goodNeighbour}, {"latency", b.latency}, {"claims", b.claims}, {"ordering", b.ordering},
		{"spent", b.spent}, {"design", b.designs}, {"logical", b.logical}, {"anatomy", b.anatomy}, {"vacuum", b.vacuum}, {"pooler", b.pooler}, {"webhook", b.webhooks}, {"tracing", b.tracing}}
	var targets, stolen []string
	for _, s := range order {
		if !sections[s.name] {
			continue
		}
		steal := readSteal()
		targets = append(targets, s.run(ctx)...)
		stolen = append(stolen, fmt.Sprintf("%s %.0f %%", s.name, 100*steal.share()))
	}
	fmt.Printf("\nCPU time the hypervisor gave other guests (steal), by section: %s\n\n", strings.Join(stolen, ", "))
	for _, t := range targets {
		fmt.Println(t)
	}
}

// target formats one target's line: its figure and whether it was met.
func target(what, figure string, ok bool) string {
	verdict := "met"
	if !ok {
		verdict = "NOT MET"
	}
	return fmt.Sprintf("target %-40s %-10s %s", what+":", figure, verdict)
}

// profiled says profileStart has run: only the first drain it precedes is
// profiled.
var profiled bool

// profileStart starts the CPU profiler when -cpuprofile is set, and
// allocation sampling when -memprofile is, for the first drain it precedes.
func profileStart() {
	if profiled {
		return
	}
	profiled = true
	if *memProfile != "" {
		runtime.MemProfileRate = 64 << 10
	}
	if *cpuProfile == "" {
		return
	}
	out, err := os.Create(*cpuProfile)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		log.Fatal(err)
	}
}

// profileStop stops the profilers that run and writes their profiles.
func profileStop() {
	pprof.StopCPUProfile()
	if *memProfile == "" || runtime.MemProfileRate == 0 {
		return
	}
	runtime.GC() // the profile shows allocations up to the last GC
	out, err := os.Create(*memProfile)
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	if err := pprof.Lookup("allocs").WriteTo(out, 0); err != nil {
		log.Fatal(err)
	}
	runtime.MemProfileRate = 0
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// quantile is the q quantile of sorted, a non-empty sample sorted
// ascending: the sample at rank ⌊q·n⌋.
func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) payload() []byte {
	body := `{"n":0,"pad":"` + strings.Repeat("x", max(*payloadBytes-15, 0)) + `"}`
	return []byte(body)
}

func (b *bench) purge() {
	for _, queue := range []string{b.topo.Queue, b.memory.Queue} {
		if _, err := b.ch.QueuePurge(queue, false); err != nil {
			log.Fatal(err)
		}
	}
}

func (b *bench) exec(ctx context.Context, sql string, args ...any) {
	if _, err := b.pool.Exec(ctx, sql, args...); err != nil {
		log.Fatalf("%s: %v", sql, err)
	}
}

// dropLeftovers drops the tables of an earlier run that was interrupted
// before it could drop them itself.
func (b *bench) dropLeftovers(ctx context.Context) {
	rows, err := b.pool.Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'bench\\_outbox\\_%'")
	if err != nil {
		log.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range tables {
		b.exec(ctx, "DROP TABLE IF EXISTS public."+t)
	}
}

func (b *bench) outbox(ctx context.Context) outbox.TableSpec {
	spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("bench_outbox")}
	if _, err := outbox.Migrate(ctx, b.pool, spec); err != nil {
		log.Fatal(err)
	}
	return spec
}

// seed empties the outbox and fills it with pending rows of the configured
// payload size, plus `stale` poisoned and `stale` backing-off rows enqueued
// before them, as an ageing table would hold: a row in backoff is due in an
// hour, a poisoned row never, as the drainer's failure settle leaves them.
func (b *bench) seed(ctx context.Context, spec outbox.TableSpec, pending, stale int) {
	b.exec(ctx, "TRUNCATE "+spec.Name)
	if stale > 0 {
		pad := strings.Repeat("x", max(*payloadBytes-25, 0))
		b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, attempts, available_at)
			SELECT 'bench.event', jsonb_build_object('n', g, 'pad', $2::text), now() - interval '1 day',
			       CASE WHEN g % 2 = 0 THEN 10 ELSE 3 END,
			       CASE WHEN g % 2 = 0 THEN 'infinity'::timestamptz ELSE now() + interval '1 hour' END
			FROM generate_series(1, $1) g`, 2*stale, pad)
	}
	b.insertEvents(ctx, spec.Name, pending)
	b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
}

// insertEvents inserts n pending rows of the configured payload size into
// table by one statement, as the application's transactions would.
func (b *bench) insertEvents(ctx context.Context, table string, n int) {
	if _, err := insertEventsOn(ctx, b.pool, table, n); err != nil {
		log.Fatal(err)
	}
}

// insertEventsOn is insertEvents on a pool of the caller's, whose session
// then pays for it.
func insertEventsOn(ctx context.Context, db *pgxpool.Pool, table string, n int) (pgconn.CommandTag, error) {
	return db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload)
		SELECT 'bench.event', jsonb_build_object('n', g, 'pad', $2::text) FROM generate_series(1, $1) g`, n, strings.Repeat("x", max(*payloadBytes-25, 0)))
}

// storeOption changes a drainer's store once it is open.
type storeOption func(context.Context, *outbox.Store) error

// drain runs n drainer processes' worth of drainers, each with its own pool,
// until every row is published.
func (b *bench) drain(ctx context.Context, spec outbox.TableSpec, n int, tweak func(*drainer.Config), opts ...storeOption) run {
	quiesce("drain")
	log.Printf("draining with %d drainer(s)", n)
	defer log.Printf("drained")
	fleet := b.newFleet(ctx, spec, n, tweak, opts...)
	watch := startWatch(b.pool)
	stop := fleet.run(ctx)
	for int(fleet.published()) < *events {
		time.Sleep(5 * time.Millisecond)
	}
	r := watch.stop(*events)
	r.sessions = watch.databaseShares()
	stop()
	r.wal = watch.walSince()
	b.purge()
	return r
}

// drainNaive runs the naive drainer until events rows are published.
func (b *bench) drainNaive(ctx context.Context, spec outbox.TableSpec, events int) run {
	quiesce("naive drain")
	log.Printf("draining with the naive drainer")
	defer log.Printf("drained")
	watch := startWatch(b.pool)
	n := b.startNaive(ctx, spec)
	for int(n.published.Load()) < events {
		time.Sleep(5 * time.Millisecond)
	}
	r := watch.stop(events)
	n.stop()
	r.wal = watch.walSince()
	b.purge()
	return r
}

// fleet is n in-process drainers, each with its own pool and metrics.
type fleet struct {
	drainers []*drainer.Drainer
	metrics  []*drainer.Metrics
	closers  []func()
}

func (b *bench) newFleet(ctx context.Context, spec outbox.TableSpec, n int, tweak func(*drainer.Config), opts ...storeOption) *fleet {
	f := &fleet{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range n {
		cfg := drainer.DefaultConfig()
		cfg.DrainerID = fmt.Sprintf("bench-%d", i)
		cfg.Database.URL, cfg.Broker.URL, cfg.Broker.Exchange = b.dbURL, testenv.BrokerURL(), b.topo.Exchange
		cfg.Table, cfg.BatchSize, cfg.PipelineDepth = spec, *batchSize, *depth
		cfg.LeaseTTL = max(cfg.LeaseTTL, drainer.MinLeaseTTL(*depth))
		if tweak != nil {
			tweak(&cfg)
		}
		// Open's retries, while the database is unavailable, are shown:
		// a bench that waits must say so.
		store, closeStore, err := drainer.Open(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		if err != nil {
			log.Fatal(err)
		}
		for _, opt := range opts {
			if err := opt(ctx, store); err != nil {
				log.Fatal(err)
			}
		}
		m := drainer.NewMetrics(prometheus.NewRegistry())
		d, err := drainer.New(cfg, store, m, quiet)
		if err != nil {
			log.Fatal(err)
		}
		f.drainers, f.metrics, f.closers = append(f.drainers, d), append(f.metrics, m), append(f.closers, closeStore)
	}
	return f
}

// run starts the drainers; the returned func stops them and closes their pools.
func (f *fleet) run(ctx context.Context) (stop func()) {
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, d := range f.drainers {
		wg.Go(func() {
			if err := d.Run(runCtx); err != nil {
				log.Fatal(err)
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
		for _, c := range f.closers {
			c()
		}
	}
}

// published is the fleet's count of rows marked published.
func (f *fleet) published() float64 {
	var n float64
	for _, m := range f.metrics {
		n += testutil.ToFloat64(m.Published)
	}
	return n
}

func init() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./test/bench [flags]")
		flag.PrintDefaults()
	}
}
