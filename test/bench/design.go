package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
)

// The design section: what relaying an event costs the application's
// database, set beside what writing it cost the application, for the
// earlier design and today's, on the same rows, in one run.

var designDrainers = flag.Int("design-drainers", 1, "drainers of the design section's drains")

// design is one way of draining: a name and what it changes in the
// drainer's defaults.
type design struct {
	what  string
	tweak func(*drainer.Config)
	store storeOption
	// defaults is the design a user gets: the one the targets judge.
	defaults bool
}

// designs are the ways of draining the section compares: the earlier design
// (the lease written into the due time, so each claim moves the row's claim
// index entry, and published rows marked, the default then), today's with
// published rows kept by a retention window, today's at the defaults, and a
// lease in a claims table.
var designs = []design{
	{what: "before: lease in the due time, marks published", tweak: func(c *drainer.Config) { c.LeaseInDueTime = true; keepPublished(c) }},
	{what: "today: heap-only claim, marks published (168h kept)", tweak: keepPublished},
	{what: "today: heap-only claim, deletes (default)", defaults: true},
	{what: "lease in a claims table, deletes", store: func(ctx context.Context, s *outbox.Store) error { return s.KeepLeasesInClaimsTable(ctx) }},
}

// designCost is what one stretch (the insert, or a drain) cost the
// database, per event.
type designCost struct {
	// sessions is the CPU of the sessions that did the work (the
	// application's for the insert, the drainers' for a drain); rest, that
	// of the database's own processes meanwhile (autovacuum, the WAL
	// writer, the checkpointer).
	sessions, rest   float64 // µs
	wal, fullPages   float64 // bytes
	heapPages, index float64 // distinct pages changed, per 1,000 events
	dead             float64 // dead tuples left at the end, per event
	rate             float64 // a drain's events/s
	records          string  // the WAL by record type
}

// designs measures the insert and each design on the same rows, in
// interleaved rounds (CPU and throughput are medians, the rest comes from
// the last round), with the broker's ceiling measured in every round.
func (b *bench) designs(ctx context.Context) []string {
	if !b.readsWAL(ctx, "design") {
		return nil
	}
	var ceiling scenario
	inserts := make([]designCost, 0, *rounds)
	drains := make([][]designCost, len(designs))
	for round := range *rounds {
		log.Printf("design, round %d of %d: ceiling, then each design on a fresh outbox", round+1, *rounds)
		ceiling.add(b.ceiling(ctx, false))
		for i, d := range designs {
			insert, drain := b.designRun(ctx, d)
			inserts, drains[i] = append(inserts, insert), append(drains[i], drain)
		}
	}
	fmt.Printf("\ndesign: what relaying an event costs the database, against the application's insert of it: %d events of %d bytes inserted by one statement, "+
		"then drained by %d drainer(s) at the defaults (batch %d, depth %d); medians of %d rounds for CPU and throughput\n",
		*events, *payloadBytes, *designDrainers, *batchSize, *depth, *rounds)
	printCostHeader()
	insert := medianCost(inserts)
	insert.print("the application's insert (reference)", 0)
	today := designCost{}
	for i, d := range designs {
		cost := medianCost(drains[i])
		cost.print(d.what, ceiling.rate())
		if d.defaults {
			today = cost
		}
	}
	records := []walRecords{{"the application's insert", insert.records}}
	for i, d := range designs {
		records = append(records, walRecords{d.what, drains[i][len(drains[i])-1].records})
	}
	printRecords(records)
	return []string{
		target("Postgres CPU of a drain at the defaults ≤ the insert's", fmt.Sprintf("%.1f µs against %.1f µs", today.total(), insert.total()), today.total() <= insert.total()),
		target("WAL per event of a drain at the defaults ≤ the insert's", fmt.Sprintf("%.0f B against %.0f B", today.wal, insert.wal), today.wal <= insert.wal),
		target("1 drainer at the defaults ≥ 0.9 × ceiling", fmt.Sprintf("%.2f", today.rate/ceiling.rate()), today.rate >= 0.9*ceiling.rate()),
	}
}

// readsWAL creates the extensions a design cost is read with, or says why
// the section is skipped without them.
func (b *bench) readsWAL(ctx context.Context, section string) bool {
	for _, ext := range []string{"pg_walinspect", "pgstattuple"} {
		if _, err := b.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS "+ext); err != nil {
			fmt.Printf("\n%s: skipped, %s is not available: %v\n", section, ext, err)
			return false
		}
	}
	return true
}

// printCostHeader prints the heading of a table of designCost lines.
func printCostHeader() {
	fmt.Printf("  %-52s %21s %9s %8s %18s %7s %8s\n", "", "Postgres CPU µs/event", "WAL", "full", "pages changed/1k", "dead", "÷")
	fmt.Printf("  %-52s %7s %6s %6s %9s %8s %9s %8s %7s %8s\n", "", "session", "rest", "total", "B/event", "pages B", "heap", "index", "/event", "ceiling")
}

// walRecords is one stretch's WAL by record type, as walCost reads it.
type walRecords struct{ what, records string }

// printRecords prints each stretch's WAL by record type.
func printRecords(stretches []walRecords) {
	fmt.Println("  WAL by record type, records/event × bytes:")
	for _, s := range stretches {
		fmt.Printf("    %-50s %s\n", s.what, s.records)
	}
}

func (c designCost) total() float64 { return c.sessions + c.rest }

// print prints the cost's line, with its rate as a share of ceiling (0:
// none, for the insert).
func (c designCost) print(what string, ceiling float64) {
	share := "-"
	if ceiling > 0 {
		share = fmt.Sprintf("%.2f", c.rate/ceiling)
	}
	fmt.Printf("  %-52s %7.1f %6.1f %6.1f %9.0f %8.0f %9.1f %8.1f %7.2f %8s\n",
		what, c.sessions, c.rest, c.total(), c.wal, c.fullPages, c.heapPages, c.index, c.dead, share)
}

// medianCost takes the CPU and throughput of runs as medians, the rest as
// the last run has it.
func medianCost(runs []designCost) designCost {
	pick := func(f func(designCost) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	out := runs[len(runs)-1]
	out.sessions, out.rest = pick(func(r designCost) float64 { return r.sessions }), pick(func(r designCost) float64 { return r.rest })
	out.rate = pick(func(r designCost) float64 { return r.rate })
	return out
}

// designRun fills a fresh outbox by one INSERT statement, as the
// application's transactions would, then drains it with design d, and
// returns what each cost. The table is checkpointed before the insert and
// not between the insert and the drain, so neither pays for full-page
// images of the other's pages.
func (b *bench) designRun(ctx context.Context, d design) (insert, drain designCost) {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	insert = b.insertStretch(ctx, spec.Name)
	return insert, b.drainStretch(ctx, spec, d)
}

// insertStretch checkpoints, then fills table by one INSERT statement, and
// returns what that cost.
func (b *bench) insertStretch(ctx context.Context, table string) designCost {
	b.exec(ctx, "CHECKPOINT")
	quiesce("design insert")
	start, watch := b.lsn(ctx), startWatch(b.pool)
	b.insertEvents(ctx, table, *events)
	shares, use := watch.databaseShares(), watch.stop(*events).cpu
	insert := b.walCost(ctx, start, b.lsn(ctx))
	insert.sessions, insert.rest = perEventµs(shares.clients), perEventµs(max(use.seconds[groupDatabase]-shares.clients, 0))
	insert.dead = b.deadTuples(ctx, table)
	return insert
}

// drainStretch drains the filled outbox spec with design d, and returns
// what that cost.
func (b *bench) drainStretch(ctx context.Context, spec outbox.TableSpec, d design) designCost {
	b.exec(ctx, "ANALYZE "+spec.Name)
	drainStart := b.lsn(ctx)
	var opts []storeOption
	if d.store != nil {
		opts = append(opts, d.store)
		defer b.exec(ctx, "DROP TABLE IF EXISTS "+spec.Name+"_claims")
	}
	r := b.drain(ctx, spec, *designDrainers, d.tweak, opts...)
	drain := b.walCost(ctx, drainStart, b.lsn(ctx))
	drain.sessions, drain.rest = perEventµs(r.sessions.drainers), perEventµs(max(r.cpu.seconds[groupDatabase]-r.sessions.drainers, 0))
	drain.dead, drain.rate = b.deadTuples(ctx, spec.Name), r.rate
	return drain
}

func perEventµs(seconds float64) float64 { return 1e6 * seconds / float64(*events) }

// deadTuples is the table's dead tuples per event, counted by pgstattuple:
// what vacuum has left to do.
func (b *bench) deadTuples(ctx context.Context, table string) float64 {
	var dead float64
	if err := b.pool.QueryRow(ctx, "SELECT dead_tuple_count::float8 FROM pgstattuple($1::regclass)", table).Scan(&dead); err != nil {
		log.Fatalf("count the dead tuples of %s: %v", table, err)
	}
	return dead / float64(*events)
}

// lsn is the WAL insert position.
func (b *bench) lsn(ctx context.Context) string {
	var lsn string
	if err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		log.Fatalf("read the WAL position: %v", err)
	}
	return lsn
}

// walCost reads the WAL between two positions per event: its bytes and
// full-page images, the heap and index pages its records changed (each
// written out at least once, by the checkpointer or the background writer),
// and its bytes by record type, the kinds of at least 1 % of them.
func (b *bench) walCost(ctx context.Context, from, to string) designCost {
	if from == to {
		// Nothing written; pg_walinspect refuses a start past the flushed
		// WAL, which an insert position just past a page header is.
		return designCost{records: "none"}
	}
	// pg_walinspect reads flushed WAL only; the WAL writer flushes an
	// asynchronous commit's within a few hundred milliseconds.
	for flushed := false; !flushed; time.Sleep(50 * time.Millisecond) {
		if err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn", to).Scan(&flushed); err != nil {
			log.Fatalf("read the flushed WAL position: %v", err)
		}
	}
	n := float64(*events)
	var c designCost
	var parts []string
	rows, err := b.pool.Query(ctx, `SELECT "resource_manager/record_type", count::float8, record_size::float8, fpi_size::float8, combined_size_percentage
		FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0 ORDER BY combined_size DESC`, from, to)
	if err != nil {
		log.Fatalf("read the WAL's records: %v", err)
	}
	var kind string
	var count, bytes, fpi, share float64
	if _, err := pgx.ForEachRow(rows, []any{&kind, &count, &bytes, &fpi, &share}, func() error {
		c.wal += (bytes + fpi) / n
		c.fullPages += fpi / n
		if share >= 1 {
			parts = append(parts, fmt.Sprintf("%s %.2f×%.0f B", kind, count/n, bytes/count))
		}
		return nil
	}); err != nil {
		log.Fatalf("read the WAL's records: %v", err)
	}
	c.records = strings.Join(parts, ", ")
	// A block reference names the relation by its file node; only the main
	// fork's are counted (the free space map's and the visibility map's
	// are a few pages).
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE c.relkind = 'r')::float8, count(*) FILTER (WHERE c.relkind = 'i')::float8
		FROM (
			SELECT DISTINCT m[1]::oid AS node, m[2]::bigint AS blk
			FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) r,
				regexp_matches(r.block_ref, 'rel \d+/\d+/(\d+) fork main blk (\d+)', 'g') m
		) p JOIN pg_class c ON c.relfilenode = p.node`, from, to).Scan(&c.heapPages, &c.index); err != nil {
		log.Fatalf("count the pages the WAL changed: %v", err)
	}
	c.heapPages, c.index = 1000*c.heapPages/n, 1000*c.index/n
	return c
}
