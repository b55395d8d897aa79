package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/spillway-io/spillway/test/pgha"
)

// The vacuum section: whether autovacuum keeps up with a drain at full
// speed while the application writes beside it.

var (
	soak        = flag.Duration("soak", 10*time.Minute, "how long the vacuum section drains at full speed beside the application's writes")
	soakBacklog = flag.Int("soak-backlog", 100_000, "the backlog the vacuum section's application keeps in front of the drainer")
)

// tableShape is what vacuum has to keep in check: the outbox's dead tuples,
// and the space its heap and its indexes take (per live row, while the
// table keeps its published rows). The claim index holds pending rows only,
// so its size is compared whole.
type tableShape struct {
	live, dead  float64
	heap, claim float64 // bytes
	otherIndex  float64 // bytes
}

// shape reads a table's shape, counting tuples with pgstattuple when exact
// (a scan of the whole table), from the statistics otherwise.
func (b *bench) shape(ctx context.Context, table string, exact bool) tableShape {
	count := `SELECT coalesce(n_live_tup, 0)::float8, coalesce(n_dead_tup, 0)::float8 FROM pg_stat_user_tables WHERE relid = $1::regclass`
	if exact {
		count = `SELECT tuple_count::float8, dead_tuple_count::float8 FROM pgstattuple($1::regclass)`
	}
	var s tableShape
	if err := b.pool.QueryRow(ctx, count, table).Scan(&s.live, &s.dead); err != nil {
		log.Fatalf("count the tuples of %s: %v", table, err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass)::float8, pg_indexes_size($1::regclass)::float8,
		coalesce((SELECT pg_relation_size(indexrelid)::float8 FROM pg_index WHERE indrelid = $1::regclass AND indexrelid::regclass::text LIKE '%_spillway_claim_idx'), 0)`,
		table).Scan(&s.heap, &s.otherIndex, &s.claim); err != nil {
		log.Fatalf("read the sizes of %s: %v", table, err)
	}
	s.otherIndex -= s.claim
	return s
}

// perRow is a size per live row, in bytes.
func (s tableShape) perRow(size float64) float64 { return size / max(s.live, 1) }

// bytesPerRow shows perRow, or "-" for a table with no live row.
func (s tableShape) bytesPerRow(size float64) string {
	if s.live == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", s.perRow(size))
}

// vacuum runs the soak (soakVacuum) on the primary of hack/postgres-ha.sh,
// with an asynchronous replica: a cluster at Postgres's defaults, where
// autovacuum runs. The system cluster's test configuration turns it off.
func (b *bench) vacuum(ctx context.Context) []string {
	soak, down := b.onPrimary(ctx, "vacuum", pgha.MissingServers())
	if soak == nil {
		return nil
	}
	defer down()
	var on string
	if err := soak.pool.QueryRow(ctx, "SHOW autovacuum").Scan(&on); err != nil || on != "on" {
		fmt.Printf("\nvacuum: skipped: autovacuum is %q on the primary (%v)\n", on, err)
		return nil
	}
	return soak.soakVacuum(ctx)
}

// onPrimary starts hack/postgres-ha.sh's primary, with an asynchronous
// replica, and returns the bench on it; down stops both. With a missing
// piece (pgha's Missing or MissingServers) it says why the section is
// skipped, and returns nil.
func (b *bench) onPrimary(ctx context.Context, section, missing string) (ha *bench, down func()) {
	if missing != "" {
		fmt.Printf("\n%s: skipped: %s\n", section, missing)
		return nil, nil
	}
	log.Printf("%s: starting the primary and its replica (hack/postgres-ha.sh up async)", section)
	if _, err := pgha.Script("up", "async"); err != nil {
		log.Fatal(err)
	}
	url := pgha.URL("postgres")
	pool, err := pgha.Pool(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	on := *b
	on.pool, on.dbURL = pool, url
	return &on, func() {
		pool.Close()
		if out, err := pgha.Script("down"); err != nil {
			log.Printf("%s: %v: %s", section, err, out)
		}
	}
}

// soakVacuum seeds a backlog and vacuums it (the baseline), then runs one
// drainer at the defaults for the soak while the application keeps the
// backlog topped up in transactions of up to 500 rows, so the drainer never
// waits for work. Every minute it prints the table's shape; at the end the
// application stops, the drainer drains the backlog, and once autovacuum has
// been through the table the shape is compared with the baseline and with
// minute 2's. At the defaults published rows are kept, so the heap, the
// primary key and the published index grow by design: they are compared
// per live row, which bloat would raise; the claim index, which holds the
// backlog only, whole.
func (b *bench) soakVacuum(ctx context.Context) []string {
	if _, err := b.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple"); err != nil {
		fmt.Printf("\nvacuum: skipped, pgstattuple is not available: %v\n", err)
		return nil
	}
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	b.insertEvents(ctx, spec.Name, *soakBacklog)
	b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
	baseline := b.shape(ctx, spec.Name, true)
	quiesce("vacuum soak")
	log.Printf("vacuum: draining at full speed for %s beside the application's writes", *soak)

	f := b.newFleet(ctx, spec, 1, nil)
	stop := f.run(ctx)
	inserted := *soakBacklog
	writing, wrote := make(chan struct{}), sync.WaitGroup{}
	wrote.Go(func() {
		for {
			select {
			case <-writing:
				return
			default:
			}
			if n := min(*soakBacklog-(inserted-int(f.published())), 500); n > 0 {
				b.insertEvents(ctx, spec.Name, n)
				inserted += n
			} else {
				time.Sleep(2 * time.Millisecond)
			}
		}
	})
	fmt.Printf("\nvacuum: %s of one drainer at the defaults, the application keeping %d rows in front of it; the outbox every minute\n", *soak, *soakBacklog)
	fmt.Printf("  %8s %10s %10s %12s %9s %16s %17s %12s\n", "minute", "published", "events/s", "dead tuples", "heap MiB", "claim index MiB", "other indexes MiB", "autovacuums")
	start, last := time.Now(), 0.0
	var settled tableShape // at minute 2 (or 1), under way: what the end is held to
	settledAt := 0
	for minute := 1; time.Since(start) < *soak; minute++ {
		time.Sleep(time.Until(start.Add(time.Duration(minute) * time.Minute)))
		published, s := f.published(), b.shape(ctx, spec.Name, false)
		if minute <= 2 {
			settled, settledAt = s, minute
		}
		fmt.Printf("  %8d %10.0f %10.0f %12.0f %9.1f %16.2f %17.1f %12d\n", minute, published, (published-last)/60, s.dead, s.heap/mib, s.claim/mib, s.otherIndex/mib,
			b.autovacuums(ctx, spec.Name))
		last = published
	}
	close(writing)
	wrote.Wait()
	for int(f.published()) < inserted {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	ended, runs := time.Now(), b.autovacuums(ctx, spec.Name)
	log.Printf("vacuum: drained %d events; waiting for autovacuum", inserted)
	// Autovacuum comes back only once the dead tuples pass its threshold,
	// which the drain's last minute may not reach: it is waited for a while,
	// and the end is judged against that threshold, as autovacuum judges it.
	for b.autovacuums(ctx, spec.Name) == runs && time.Since(ended) < 2*time.Minute {
		time.Sleep(time.Second)
	}
	end := b.shape(ctx, spec.Name, true)
	fmt.Printf("  %-36s %10s %12s %10s %16s %18s %11s %20s\n", "", "live rows", "dead tuples", "heap MiB", "claim index MiB", "other indexes MiB", "heap B/row", "other indexes B/row")
	for _, row := range []struct {
		what string
		s    tableShape
	}{{fmt.Sprintf("baseline: %d rows pending, vacuumed", *soakBacklog), baseline}, {fmt.Sprintf("minute %d, under way", settledAt), settled}, {fmt.Sprintf("after %d events, autovacuumed", inserted), end}} {
		fmt.Printf("  %-36s %10.0f %12.0f %10.1f %16.2f %18.1f %11s %20s\n", row.what, row.s.live, row.s.dead, row.s.heap/mib, row.s.claim/mib,
			row.s.otherIndex/mib, row.s.bytesPerRow(row.s.heap), row.s.bytesPerRow(row.s.otherIndex))
	}
	fmt.Printf("  autovacuum ran %d times; the last %.0f s after the drain\n", b.autovacuums(ctx, spec.Name), time.Since(ended).Seconds())
	// A B-tree gives no page back to the file system: vacuum keeping up
	// shows as sizes that stop growing, so the end is held to minute 2,
	// when every size has taken its working shape. A vacuum falling behind
	// grows them with every event. A table that keeps its published rows
	// grows with every event too, so its heap and other indexes are held to
	// minute 2's per live row; one that keeps none (the default) holds the
	// backlog alone, and its sizes are held to minute 2's whole.
	heap, claim, other, per := end.heap/settled.heap, end.claim/settled.claim, end.otherIndex/settled.otherIndex, ""
	if end.live > baseline.live {
		heap, other, per = end.perRow(end.heap)/settled.perRow(settled.heap), end.perRow(end.otherIndex)/settled.perRow(settled.otherIndex), "/row"
	}
	var threshold float64
	// The table's own settings first, as autovacuum reads them.
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(o.threshold, current_setting('autovacuum_vacuum_threshold'))::float8
			+ coalesce(o.scale, current_setting('autovacuum_vacuum_scale_factor'))::float8 * $1
		FROM (SELECT (SELECT split_part(x, '=', 2) FROM unnest(c.reloptions) x WHERE x LIKE 'autovacuum_vacuum_threshold=%') AS threshold,
			(SELECT split_part(x, '=', 2) FROM unnest(c.reloptions) x WHERE x LIKE 'autovacuum_vacuum_scale_factor=%') AS scale
			FROM pg_class c WHERE c.oid = $2::regclass) o`,
		end.live, spec.Name).Scan(&threshold); err != nil {
		log.Fatalf("read autovacuum's threshold: %v", err)
	}
	kept := end.dead <= threshold && heap <= 1.5 && claim <= 1.5 && other <= 1.5
	return []string{target("vacuum keeps up: dead tuples under autovacuum's threshold, sizes ≤ 1.5 × minute 2's",
		fmt.Sprintf("dead %.0f (threshold %.0f); of minute 2: heap%s %.2f, claim index %.2f, other indexes%s %.2f", end.dead, threshold, per, heap, claim, per, other), kept)}
}

const mib = 1 << 20

// autovacuums is how many times autovacuum has vacuumed the table.
func (b *bench) autovacuums(ctx context.Context, table string) int64 {
	var n int64
	if err := b.pool.QueryRow(ctx, "SELECT coalesce((SELECT autovacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)", table).Scan(&n); err != nil {
		log.Fatalf("read the autovacuums of %s: %v", table, err)
	}
	return n
}
