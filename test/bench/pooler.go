package main

import (
	"context"
	"fmt"
	"log"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/pgha"
)

// The pooler section: what a drain through PgBouncer in transaction mode
// costs against one from Postgres directly.

// pooler drains the same ordered backlog, with the notify trigger, by two
// drainers from hack/postgres-ha.sh's primary directly, and through its
// PgBouncer in transaction mode (unnamed statements, the settings sent in
// each transaction, the LISTEN on a direct session), in interleaved rounds.
func (b *bench) pooler(ctx context.Context) []string {
	ha, down := b.onPrimary(ctx, "pooler", pgha.Missing())
	if ha == nil {
		return nil
	}
	defer down()
	if _, err := pgha.Script("pgbouncer", "up"); err != nil {
		log.Fatal(err)
	}
	spec := ha.orderedOutbox(ctx)
	defer ha.exec(ctx, "DROP TABLE "+spec.Name)
	if _, err := outbox.InstallNotifyTrigger(ctx, ha.pool, spec); err != nil {
		log.Fatal(err)
	}
	pooled := func(c *drainer.Config) {
		c.Database.URL = pgha.Pooled("test_tx")
		c.Pooling = outbox.Pooling{Mode: outbox.PoolModeTransaction, Direct: secret.URLSource{URL: ha.dbURL}}
	}
	var direct, through scenario
	for round := range *rounds {
		log.Printf("pooler round %d of %d: directly, then through PgBouncer in transaction mode", round+1, *rounds)
		ha.seedKeyed(ctx, spec.Name)
		direct.add(ha.drain(ctx, spec, 2, nil))
		ha.seedKeyed(ctx, spec.Name)
		through.add(ha.drain(ctx, spec, 2, pooled))
	}
	r := through.rate() / direct.rate()
	fmt.Printf("\npooler: %d events over %d keys, ordered, with the notify trigger, on hack/postgres-ha.sh's primary; 2 drainers at the defaults\n", *events, orderingKeys)
	direct.report("spillway, directly", "")
	through.report("spillway, through PgBouncer, transaction mode", fmt.Sprintf("%.2f of directly", r))
	return []string{target("through PgBouncer ÷ directly ≥ 0.8", fmt.Sprintf("%.2f", r), r >= 0.8)}
}
