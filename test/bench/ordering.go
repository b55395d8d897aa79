package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/spillway-io/spillway/outbox"
)

// orderingKeys is how many ordering keys the ordering section spreads its
// events over.
const orderingKeys = 10_000

// ordering compares draining with per-key ordering on and off: the same
// events, their keys drawn at random from 10,000, drained from an ordered
// table (its order and key lease indexes built) and from a plain one, with
// 1 and 2 drainers, in interleaved rounds.
func (b *bench) ordering(ctx context.Context) []string {
	plain := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+plain.Name)
	b.exec(ctx, "ALTER TABLE "+plain.Name+" ADD COLUMN aggregate_id text")
	ordered := b.orderedOutbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+ordered.Name)
	drain := func(s *scenario, spec outbox.TableSpec, drainers int) {
		b.seedKeyed(ctx, spec.Name)
		s.add(b.drain(ctx, spec, drainers, nil))
	}
	var off1, on1, off2, on2 scenario
	for round := range *rounds {
		log.Printf("ordering round %d of %d: unordered and ordered over %d keys, 1 and 2 drainers", round+1, *rounds, orderingKeys)
		drain(&off1, plain, 1)
		drain(&on1, ordered, 1)
		drain(&off2, plain, 2)
		drain(&on2, ordered, 2)
	}
	r1, r2 := on1.rate()/off1.rate(), on2.rate()/off2.rate()
	fmt.Printf("\nordering: %d events over %d keys at random, defaults\n", *events, orderingKeys)
	off1.report("spillway, 1 drainer, unordered", "")
	on1.report("spillway, 1 drainer, ordered per key", fmt.Sprintf("%.2f of unordered", r1))
	off2.report("spillway, 2 drainers, unordered", "")
	on2.report("spillway, 2 drainers, ordered per key", fmt.Sprintf("%.2f of unordered", r2))
	return []string{
		target("ordered ÷ unordered ≥ 0.7, 1 drainer", fmt.Sprintf("%.2f", r1), r1 >= 0.7),
		target("ordered ÷ unordered ≥ 0.7, 2 drainers", fmt.Sprintf("%.2f", r2), r2 >= 0.7),
	}
}

// orderedOutbox is a new outbox ordered on its aggregate_id column.
func (b *bench) orderedOutbox(ctx context.Context) outbox.TableSpec {
	spec := b.outbox(ctx)
	b.exec(ctx, "ALTER TABLE "+spec.Name+" ADD COLUMN aggregate_id text")
	spec.Ordering = outbox.Ordering{KeyColumn: "aggregate_id"}
	if _, err := outbox.Migrate(ctx, b.pool, spec); err != nil {
		log.Fatal(err)
	}
	return spec
}

// seedKeyed empties table and fills it with the run's events, their
// aggregate_id keys drawn at random from orderingKeys.
func (b *bench) seedKeyed(ctx context.Context, table string) {
	b.exec(ctx, "TRUNCATE "+table)
	// Each event enqueued a microsecond after the one before, as commits of
	// their own would be, and due when enqueued.
	b.exec(ctx, `INSERT INTO `+table+` (event_type, payload, aggregate_id, enqueued_at, available_at)
		SELECT 'bench.event', jsonb_build_object('n', g, 'key', k, 'pad', $2::text), k, at, at
		FROM (SELECT g, 'k' || floor(random() * $3)::int AS k, now() - interval '1 hour' + g * interval '1 microsecond' AS at
			FROM generate_series(1, $1::int) g) s`, *events, strings.Repeat("x", max(*payloadBytes-45, 0)), orderingKeys)
	b.exec(ctx, "VACUUM ANALYZE "+table)
}
