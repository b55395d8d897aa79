package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"
)

// The vacuum section: whether autovacuum keeps up with a drain at full
// speed while the application writes beside it.

var (
	soak        = flag.Duration("soak", 10*time.Minute, "how long the vacuum section drains at full speed beside the application's writes")
	soakBacklog = flag.Int("soak-backlog", 100_000, "the backlog the vacuum section's application keeps in front of the drainer")
)

// tableShape is what vacuum has to keep in check: the outbox's dead tuples
// (pgstattuple's count) and the sizes of its heap and of its indexes.
type tableShape struct {
	dead        float64
	heap, index float64 // MiB
}

func (b *bench) shape(ctx context.Context, table string) tableShape {
	var s tableShape
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT dead_tuple_count FROM pgstattuple($1::regclass))::float8,
		pg_relation_size($1::regclass) / 1048576.0, pg_indexes_size($1::regclass) / 1048576.0`, table).Scan(&s.dead, &s.heap, &s.index); err != nil {
		log.Fatalf("read the shape of %s: %v", table, err)
	}
	return s
}

// vacuum seeds a backlog and vacuums it (the baseline), then runs one
// drainer at the defaults for the soak while the application keeps the
// backlog topped up in transactions of up to 500 rows, so the drainer never
// waits for work. Every minute it prints the table's shape; at the end the
// application stops, the drainer empties the outbox, and once autovacuum has
// been through the table the shape is compared with the baseline.
func (b *bench) vacuum(ctx context.Context) []string {
	if _, err := b.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple"); err != nil {
		fmt.Printf("\nvacuum: skipped, pgstattuple is not available: %v\n", err)
		return nil
	}
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	pad := strings.Repeat("x", max(*payloadBytes-25, 0))
	insert := `INSERT INTO ` + spec.Name + ` (event_type, payload)
		SELECT 'bench.event', jsonb_build_object('n', g, 'pad', $2::text) FROM generate_series(1, $1) g`
	b.exec(ctx, insert, *soakBacklog, pad)
	b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
	baseline := b.shape(ctx, spec.Name)
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
				b.exec(ctx, insert, n, pad)
				inserted += n
			} else {
				time.Sleep(2 * time.Millisecond)
			}
		}
	})
	fmt.Printf("\nvacuum: %s of one drainer at the defaults, the application keeping %d rows in front of it; the outbox every minute\n", *soak, *soakBacklog)
	fmt.Printf("  %8s %10s %10s %12s %9s %10s %12s\n", "minute", "published", "events/s", "dead tuples", "heap MiB", "index MiB", "autovacuums")
	start, last := time.Now(), 0.0
	for minute := 1; time.Since(start) < *soak; minute++ {
		time.Sleep(time.Until(start.Add(time.Duration(minute) * time.Minute)))
		published, s := f.published(), b.shape(ctx, spec.Name)
		fmt.Printf("  %8d %10.0f %10.0f %12.0f %9.1f %10.1f %12d\n", minute, published, (published-last)/60, s.dead, s.heap, s.index, b.autovacuums(ctx, spec.Name))
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
	for b.autovacuums(ctx, spec.Name) == runs && time.Since(ended) < 5*time.Minute {
		time.Sleep(time.Second)
	}
	end := b.shape(ctx, spec.Name)
	fmt.Printf("  %-34s %12s %9s %10s\n", "", "dead tuples", "heap MiB", "index MiB")
	fmt.Printf("  %-34s %12.0f %9.1f %10.1f\n", fmt.Sprintf("baseline: %d rows pending, vacuumed", *soakBacklog), baseline.dead, baseline.heap, baseline.index)
	fmt.Printf("  %-34s %12.0f %9.1f %10.1f  (autovacuum ran %d times; %.0f s after the drain)\n", fmt.Sprintf("after %d events, autovacuumed", inserted),
		end.dead, end.heap, end.index, b.autovacuums(ctx, spec.Name), time.Since(ended).Seconds())
	kept := end.dead <= baseline.dead+float64(*soakBacklog)/100 && end.index <= 1.5*baseline.index && end.heap <= 1.5*baseline.heap
	return []string{target("vacuum keeps up: dead tuples and sizes back to baseline",
		fmt.Sprintf("dead %.0f, heap %.1f×, indexes %.1f× of baseline", end.dead, end.heap/baseline.heap, end.index/baseline.index), kept)}
}

// autovacuums is how many times autovacuum has vacuumed the table.
func (b *bench) autovacuums(ctx context.Context, table string) int64 {
	var n int64
	if err := b.pool.QueryRow(ctx, "SELECT coalesce((SELECT autovacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)", table).Scan(&n); err != nil {
		log.Fatalf("read the autovacuums of %s: %v", table, err)
	}
	return n
}
