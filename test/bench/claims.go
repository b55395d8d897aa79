package main

import (
	"context"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
)

// The claims section: the claim statement's latency as the pending set
// grows and ages.

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

// storeWithoutBroker opens the drainer's store with the drainer's own
// session settings (asynchronous commit, as in production) and the default
// claim parameters, for running the drainer's SQL on its own.
func storeWithoutBroker(ctx context.Context, spec outbox.TableSpec, id string) (*outbox.Store, outbox.ClaimParams, func()) {
	cfg := drainer.DefaultConfig()
	cfg.DrainerID, cfg.BatchSize = id, *batchSize
	pool, err := outbox.ConnectPool(ctx, secret.URLSource{URL: testenv.DatabaseURL()}, outbox.PoolOptions{DrainerID: id, SynchronousCommit: cfg.SynchronousCommit})
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
