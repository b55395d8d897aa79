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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
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
	sectionList   = flag.String("sections", "throughput,neighbour,latency,claims,ordering,spent", "which measurements to run, comma-separated")
	cpuProfile    = flag.String("cpuprofile", "", "write a CPU profile of the first 1-process drainer run to this file")
	memProfile    = flag.String("memprofile", "", "write an allocation profile of the first 1-process drainer run to this file")
)

// benchLock is the advisory lock a benchmark run holds.
const benchLock = 0x5b111_be7c

type bench struct {
	pool *pgxpool.Pool
	conn *amqp.Connection
	ch   *amqp.Channel
	topo testenv.Topology
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
	b := &bench{pool: services.DB, conn: services.Broker}
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
		{"spent", b.spent}}
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

// throughput compares the drainer with the broker's ceiling and with the
// naive drainer, in interleaved rounds, with each process's CPU and the WAL
// per event.
func (b *bench) throughput(ctx context.Context) []string {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	naiveEvents := max(*events/5, 1000) // the naive drainer is slow: fewer events, the same rate
	drain := func(s *scenario, drainers int, tweak func(*drainer.Config)) {
		b.seed(ctx, spec, *events, 0)
		s.add(b.drain(ctx, spec, drainers, tweak))
	}
	tuned := func(c *drainer.Config) {
		c.BatchSize, c.PipelineDepth = *tunedBatch, *tunedDepth
		c.LeaseTTL = max(c.LeaseTTL, drainer.MinLeaseTTL(c.PipelineDepth))
	}
	// The broker, Postgres and the drainers share two cores here, and each
	// run leaves background work (queue index clean-up, WAL writing) behind:
	// rounds interleave the scenarios and their medians are compared.
	compactProperties := func(c *drainer.Config) { c.Broker.MessageProperties = rabbitmq.CompactProperties }
	var ceiling, properties, one, compact, deleting, two, best, naive, serial, synchronous scenario
	for round := range *rounds {
		log.Printf("round %d of %d: ceiling, ceiling with the drainer's properties, 1 drainer, 1 with compact properties, 1 deleting published rows, 2 drainers, tuned, naive",
			round+1, *rounds)
		ceiling.add(b.ceiling(ctx, false))
		properties.add(b.ceiling(ctx, true))
		if round == 0 {
			profileStart()
		}
		drain(&one, 1, nil)
		profileStop()
		drain(&compact, 1, compactProperties)
		drain(&deleting, 1, deletePublished)
		drain(&two, 2, nil)
		drain(&best, 1, tuned)
		b.seed(ctx, spec, naiveEvents, 0)
		naive.add(b.drainNaive(ctx, spec, naiveEvents))
	}
	drain(&serial, 1, func(c *drainer.Config) { c.SerialBatches = true })
	drain(&synchronous, 1, func(c *drainer.Config) { c.SynchronousCommit = true })

	c, o, t := ceiling.rate(), one.rate(), two.rate()
	d := drainer.DefaultConfig()
	fmt.Printf("\nthroughput: %d events of %d bytes; defaults batch %d, depth %d; tuned batch %d, depth %d; naive batch %d, one confirm at a time\n",
		*events, *payloadBytes, d.BatchSize, d.PipelineDepth, *tunedBatch, *tunedDepth, naiveBatch)
	ceiling.report(fmt.Sprintf("raw publisher, window %d (the ceiling)", *ceilingWindow), "")
	properties.report("raw publisher, the drainer's message properties", fmt.Sprintf("%.2f of ceiling", properties.rate()/c))
	one.report("spillway, 1 drainer, defaults", fmt.Sprintf("%.2f of ceiling", o/c))
	compact.report("spillway, 1 drainer, compact properties", fmt.Sprintf("%.2f of ceiling", compact.rate()/c))
	deleting.report("spillway, 1 drainer, published rows deleted", fmt.Sprintf("%.2f of ceiling", deleting.rate()/c))
	two.report("spillway, 2 drainers, defaults", fmt.Sprintf("%.2f of 1 drainer", t/o))
	best.report("spillway, 1 drainer, tuned", fmt.Sprintf("defaults %.2f of it", o/best.rate()))
	naive.report("naive drainer", fmt.Sprintf("spillway %.1fx", o/naive.rate()))
	serial.report("spillway, 1 drainer, claims not overlapped", fmt.Sprintf("overlap gains %.2fx", o/serial.rate()))
	synchronous.report("spillway, 1 drainer, synchronous_commit on", fmt.Sprintf("async commit gains %.2fx", o/synchronous.rate()))

	raw, us, lean, deleted := ceiling.perEvent(), one.perEvent(), compact.perEvent(), deleting.perEvent()
	// The same messages from the raw publisher tell the broker's cost of
	// Spillway's messages (their properties) from that of how it sends them.
	same := properties.perEvent()
	return []string{
		target("drainer ÷ ceiling ≥ 0.7", fmt.Sprintf("%.2f", o/c), o/c >= 0.7),
		target("drainer, compact properties ÷ ceiling ≥ 0.7", fmt.Sprintf("%.2f", compact.rate()/c), compact.rate()/c >= 0.7),
		target("2 drainers ≥ 1 drainer", fmt.Sprintf("%.2f", t/o), t >= o),
		target("defaults ≥ 0.95 × tuned", fmt.Sprintf("%.2f", o/best.rate()), o >= 0.95*best.rate()),
		target("spillway ÷ naive ≥ 5", fmt.Sprintf("%.1f", o/naive.rate()), o >= 5*naive.rate()),
		target("drainer CPU ≤ 1.5 × raw publisher's", fmt.Sprintf("%.2f", us[groupDrainer]/raw[groupDrainer]), us[groupDrainer] <= 1.5*raw[groupDrainer]),
		target("drainer CPU, compact ≤ 1.5 × raw publisher's", fmt.Sprintf("%.2f", lean[groupDrainer]/raw[groupDrainer]), lean[groupDrainer] <= 1.5*raw[groupDrainer]),
		target("RabbitMQ CPU ≤ raw publisher's", fmt.Sprintf("%.2f", us[groupBroker]/raw[groupBroker]), us[groupBroker] <= raw[groupBroker]),
		target("RabbitMQ CPU, compact ≤ raw publisher's", fmt.Sprintf("%.2f", lean[groupBroker]/raw[groupBroker]), lean[groupBroker] <= raw[groupBroker]),
		target("RabbitMQ CPU ≤ raw publisher's, same properties", fmt.Sprintf("%.2f", us[groupBroker]/same[groupBroker]), us[groupBroker] <= same[groupBroker]),
		target("Postgres CPU ≤ 15 µs/event", fmt.Sprintf("%.1f µs", us[groupDatabase]), us[groupDatabase] <= 15),
		target("Postgres CPU, published rows deleted ≤ 15 µs/event", fmt.Sprintf("%.1f µs", deleted[groupDatabase]), deleted[groupDatabase] <= 15),
	}
}

// deletePublished keeps no published row (retention.published 0s): the
// settle deletes what it would mark.
func deletePublished(c *drainer.Config) { c.Retention.Published = new(time.Duration) }

// scenario accumulates one scenario's runs.
type scenario struct {
	rates  []float64
	cpu    cpuUse
	wal    walUse
	events int
}

// run is one run's figures.
type run struct {
	rate   float64
	cpu    cpuUse
	wal    walUse
	events int
}

func (s *scenario) add(r run) {
	s.rates, s.cpu, s.wal, s.events = append(s.rates, r.rate), s.cpu.add(r.cpu), s.wal.add(r.wal), s.events+r.events
}

func (s *scenario) rate() float64 { return median(s.rates) }

// perEvent is each process group's CPU µs per event.
func (s *scenario) perEvent() []float64 {
	out := make([]float64, len(cpuGroups))
	for i := range out {
		out[i] = 1e6 * s.cpu.seconds[i] / float64(s.events)
	}
	return out
}

// report prints a scenario's median rate, the CPU per event of each process,
// the WAL per 1,000 events and, with several rounds, every round's rate.
func (s *scenario) report(what, ratio string) {
	rounds := ""
	if len(s.rates) > 1 {
		var each []string
		for _, v := range s.rates {
			each = append(each, fmt.Sprintf("%.0f", v))
		}
		rounds = "  rounds " + strings.Join(each, ", ")
	}
	var cpu []string
	for i, g := range cpuGroups {
		cpu = append(cpu, fmt.Sprintf("%s %3.0f", g.name, s.perEvent()[i]))
	}
	fmt.Printf("%-50s %6.0f events/s  %-18s µs/event: %s  %s%s\n", what, s.rate(), ratio, strings.Join(cpu, ", "), s.wal.per1000(s.events), rounds)
}

// claims times the claim statement as the pending set grows and ages.
func (b *bench) claims(ctx context.Context) []string {
	// The small table holds enough for every claim timed.
	smallPending := max(10_000, (*claims+claimWarmUp)**batchSize)
	log.Printf("claim latency: seeding %d rows, %d rows, and %d rows behind %d in backoff and %d poisoned",
		smallPending, *bigPending, *bigPending, *staleRows, *staleRows)
	fmt.Println()
	latency := b.claimLatencies(ctx, []claimSetup{{smallPending, 0}, {*bigPending, 0}, {*bigPending, *staleRows}})
	small, large, aged := latency[0], latency[1], latency[2]
	fmt.Printf("%-70s p50 %6.2f ms  p95 %6.2f ms\n", fmt.Sprintf("claim latency, %d pending", smallPending), ms(small[0]), ms(small[1]))
	fmt.Printf("%-70s p50 %6.2f ms  p95 %6.2f ms  %.2fx of the small table\n", fmt.Sprintf("claim latency, %d pending", *bigPending), ms(large[0]), ms(large[1]), ms(large[0])/ms(small[0]))
	fmt.Printf("%-70s p50 %6.2f ms  p95 %6.2f ms  %.2fx of clean\n", fmt.Sprintf("claim latency, %d pending behind %d in backoff + %d poisoned", *bigPending, *staleRows, *staleRows),
		ms(aged[0]), ms(aged[1]), ms(aged[0])/ms(large[0]))

	return []string{
		target("claim at 1M within 1.5× of the small table", fmt.Sprintf("%.2f", ms(large[0])/ms(small[0])), ms(large[0]) <= 1.5*ms(small[0])),
		target("claim behind backoff+poisoned within 1.5× of clean", fmt.Sprintf("%.2f", ms(aged[0])/ms(large[0])), ms(aged[0]) <= 1.5*ms(large[0])),
	}
}

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

// profileStart starts the CPU profiler when -cpuprofile is set, and
// allocation sampling when -memprofile is.
func profileStart() {
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

// ceiling publishes as a plain publisher does, minus the database: a
// window of deferred confirms, waiting for the oldest when it is full. With
// properties, each message carries what a drainer's does (a uuid
// message_id, type, app_id, the row's timestamp), which tells whether the
// broker's cost per message is in them.
func (b *bench) ceiling(ctx context.Context, properties bool) run {
	quiesce("ceiling")
	log.Printf("publishing the ceiling (drainer's properties: %t)", properties)
	defer log.Printf("published")
	watch := startWatch(b.pool)
	b.publishRaw(ctx, properties, *events, nil, new(atomic.Int64))
	r := watch.stop(*events)
	r.wal = watch.walSince()
	b.purge()
	return r
}

// publishRaw publishes n messages as the ceiling does, or fewer if stop
// closes first, and counts those the broker confirmed.
func (b *bench) publishRaw(ctx context.Context, properties bool, n int, stop <-chan struct{}, confirmed *atomic.Int64) {
	ch, err := b.conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		log.Fatal(err)
	}
	body := b.payload()
	enqueued := time.Now()
	window := make([]*amqp.DeferredConfirmation, 0, *ceilingWindow)
	confirm := func(dc *amqp.DeferredConfirmation) {
		if !dc.Wait() {
			log.Fatal("raw publisher: broker nacked")
		}
		confirmed.Add(1)
	}
publishing:
	for i := range n {
		select {
		case <-stop:
			break publishing
		default:
		}
		if len(window) == *ceilingWindow {
			confirm(window[0])
			window = window[1:]
		}
		msg := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: fmt.Sprint(i), ContentType: "application/json", Timestamp: time.Now(), Body: body}
		if properties {
			msg.MessageId = fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
			msg.Type, msg.AppId, msg.Timestamp = "bench.event", "spillway", enqueued
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.topo.Exchange, "bench.event", false, false, msg)
		if err != nil {
			log.Fatal(err)
		}
		window = append(window, dc)
	}
	for _, dc := range window {
		confirm(dc)
	}
}

// storeWithoutBroker opens the drainer's store with the drainer's own
// session settings (asynchronous commit, as in production) and the default
// claim parameters, for running the drainer's SQL on its own.
func storeWithoutBroker(ctx context.Context, spec outbox.TableSpec, id string) (*outbox.Store, outbox.ClaimParams, func()) {
	cfg := drainer.DefaultConfig()
	cfg.DrainerID, cfg.BatchSize = id, *batchSize
	pool, err := outbox.ConnectPool(ctx, secret.URLSource{URL: testenv.DatabaseURL()}, id, cfg.SynchronousCommit)
	if err != nil {
		log.Fatal(err)
	}
	store, err := outbox.OpenStore(ctx, pool, spec)
	if err != nil {
		log.Fatal(err)
	}
	return store, cfg.ClaimParams(), pool.Close
}

// claimAndMark claims a batch and marks it published, as a drainer whose
// every publish was acked does. It returns the rows claimed and how long the
// claim statement took.
func claimAndMark(ctx context.Context, store *outbox.Store, params outbox.ClaimParams) (int, time.Duration) {
	start := time.Now()
	c, err := store.Claim(ctx, params)
	took := time.Since(start)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := store.Settle(ctx, params.DrainerID, outbox.Settlement{Published: c.Leases()}, outbox.FailurePolicy{}); err != nil {
		log.Fatal(err)
	}
	return len(c.Rows), took
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
	pad := strings.Repeat("x", max(*payloadBytes-25, 0))
	if stale > 0 {
		b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, attempts, available_at)
			SELECT 'bench.event', jsonb_build_object('n', g, 'pad', $2::text), now() - interval '1 day',
			       CASE WHEN g % 2 = 0 THEN 10 ELSE 3 END,
			       CASE WHEN g % 2 = 0 THEN 'infinity'::timestamptz ELSE now() + interval '1 hour' END
			FROM generate_series(1, $1) g`, 2*stale, pad)
	}
	b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload)
		SELECT 'bench.event', jsonb_build_object('n', g, 'pad', $2::text) FROM generate_series(1, $1) g`, pending, pad)
	b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
}

// drain runs n drainer processes' worth of drainers, each with its own pool,
// until every row is published.
func (b *bench) drain(ctx context.Context, spec outbox.TableSpec, n int, tweak func(*drainer.Config)) run {
	quiesce("drain")
	log.Printf("draining with %d drainer(s)", n)
	defer log.Printf("drained")
	fleet := b.newFleet(ctx, spec, n, tweak)
	watch := startWatch(b.pool)
	stop := fleet.run(ctx)
	for int(fleet.published()) < *events {
		time.Sleep(5 * time.Millisecond)
	}
	r := watch.stop(*events)
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

func (b *bench) newFleet(ctx context.Context, spec outbox.TableSpec, n int, tweak func(*drainer.Config)) *fleet {
	f := &fleet{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range n {
		cfg := drainer.DefaultConfig()
		cfg.DrainerID = fmt.Sprintf("bench-%d", i)
		cfg.Database.URL, cfg.Broker.URL, cfg.Broker.Exchange = testenv.DatabaseURL(), testenv.BrokerURL(), b.topo.Exchange
		cfg.Table, cfg.BatchSize, cfg.PipelineDepth = spec, *batchSize, *depth
		cfg.LeaseTTL = max(cfg.LeaseTTL, drainer.MinLeaseTTL(*depth))
		if tweak != nil {
			tweak(&cfg)
		}
		pool, err := outbox.ConnectPool(ctx, cfg.Database, cfg.DrainerID, cfg.SynchronousCommit)
		if err != nil {
			log.Fatal(err)
		}
		store, err := outbox.OpenStore(ctx, pool, spec)
		if err != nil {
			log.Fatal(err)
		}
		m := drainer.NewMetrics(prometheus.NewRegistry())
		d, err := drainer.New(cfg, store, m, quiet)
		if err != nil {
			log.Fatal(err)
		}
		f.drainers, f.metrics, f.closers = append(f.drainers, d), append(f.metrics, m), append(f.closers, pool.Close)
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

// claimWarmUp is how many claims warm the plan cache, not counted.
const claimWarmUp = 10

// claimSetup is one claim-latency scenario: `pending` rows behind `stale`
// poisoned and as many backing-off rows.
type claimSetup struct{ pending, stale int }

// claimLatencies times the claim statement in each setup, one claim per
// setup in turn so that background work (autovacuum, checkpoints) falls on
// all of them alike. Each claim is marked published, as a drainer does, so
// later claims walk past the history earlier ones leave. It returns each
// setup's p50 and p95.
func (b *bench) claimLatencies(ctx context.Context, setups []claimSetup) [][2]time.Duration {
	type table struct {
		store  *outbox.Store
		params outbox.ClaimParams
		took   []time.Duration
	}
	var tables []*table
	for i, setup := range setups {
		spec := b.outbox(ctx)
		defer b.exec(ctx, "DROP TABLE "+spec.Name)
		b.seed(ctx, spec, setup.pending, setup.stale)
		store, params, closeStore := storeWithoutBroker(ctx, spec, fmt.Sprintf("bench-claim-%d", i))
		defer closeStore()
		tables = append(tables, &table{store: store, params: params})
	}
	for i := range *claims + claimWarmUp {
		for _, t := range tables {
			n, took := claimAndMark(ctx, t.store, t.params)
			if n != *batchSize {
				log.Fatalf("claim latency: claimed %d rows, want %d", n, *batchSize)
			}
			if i >= claimWarmUp {
				t.took = append(t.took, took)
			}
		}
	}
	var out [][2]time.Duration
	for _, t := range tables {
		slices.Sort(t.took)
		out = append(out, [2]time.Duration{quantile(t.took, 0.5), quantile(t.took, 0.95)})
	}
	return out
}

func init() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./test/bench [flags]")
		flag.PrintDefaults()
	}
}
