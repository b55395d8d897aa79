package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spillway-io/spillway/outbox"
)

// The anatomy section: what each part of a claim and a settle costs the
// database, on one backend's own CPU clock, with nothing else running: a
// bare read of the rows, then the row lock, the lease, today's claim and the
// claims table, each followed by a deleting settle, against the insert of
// the same rows. It takes apart the design section's drains.

// anatomyStep is one way of draining: a claim and its settle, each run on
// the one session of pool until the outbox is empty; rows is what the claim
// took.
type anatomyStep struct {
	what string
	// plan is the session's plan_cache_mode ("" for the default).
	plan  string
	drain func(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, spec outbox.TableSpec) (claim, settle func() int)
}

// rawClaim is a claim of up to a batch of due rows in due order that
// returns what the drainer receives: sql is its statement, with %s for the
// table and %d for the batch; the settle deletes the rows by id.
func rawClaim(sql string) func(context.Context, *pgxpool.Pool, *outbox.Store, outbox.TableSpec) (func() int, func() int) {
	return func(ctx context.Context, pool *pgxpool.Pool, _ *outbox.Store, spec outbox.TableSpec) (func() int, func() int) {
		var ids []string
		claim := func() int {
			rows, err := pool.Query(ctx, fmt.Sprintf(sql, spec.Name, *batchSize))
			if err != nil {
				log.Fatalf("anatomy claim: %v", err)
			}
			ids = ids[:0]
			for rows.Next() {
				values, err := rows.Values()
				if err != nil {
					log.Fatalf("anatomy claim: %v", err)
				}
				ids = append(ids, values[0].(string))
			}
			if rows.Err() != nil {
				log.Fatalf("anatomy claim: %v", rows.Err())
			}
			return len(ids)
		}
		settle := func() int {
			if _, err := pool.Exec(ctx, "DELETE FROM "+spec.Name+" WHERE id = ANY($1::uuid[])", ids); err != nil {
				log.Fatalf("anatomy settle: %v", err)
			}
			return len(ids)
		}
		return claim, settle
	}
}

// storeClaim is the drainer's own claim and deleting settle, with the
// store changed by prepare first.
func storeClaim(prepare func(context.Context, *outbox.Store) error) func(context.Context, *pgxpool.Pool, *outbox.Store, outbox.TableSpec) (func() int, func() int) {
	return func(ctx context.Context, _ *pgxpool.Pool, store *outbox.Store, _ outbox.TableSpec) (func() int, func() int) {
		if prepare != nil {
			if err := prepare(ctx, store); err != nil {
				log.Fatal(err)
			}
		}
		params := outbox.ClaimParams{DrainerID: "anatomy", BatchSize: *batchSize, MaxAttempts: 10, LeaseMillis: 80_000,
			MaxPayloadBytes: 1 << 20, MaxClaimBytes: 16 << 20}
		var claimed outbox.Claimed
		claim := func() int {
			var err error
			if claimed, err = store.Claim(ctx, params); err != nil {
				log.Fatalf("anatomy claim: %v", err)
			}
			return len(claimed.Rows)
		}
		settle := func() int {
			done, err := store.Settle(ctx, "anatomy", outbox.Settlement{Published: claimed.Leases(), DeletePublished: true},
				outbox.FailurePolicy{InitialMillis: 1000, MaxMillis: 60_000, MaxAttempts: 10})
			if err != nil || int(done.Published) != len(claimed.Rows) {
				log.Fatalf("anatomy settle: %d of %d rows, %v", done.Published, len(claimed.Rows), err)
			}
			return int(done.Published)
		}
		return claim, settle
	}
}

const dueRows = `FROM %[1]s WHERE published_at IS NULL AND available_at <= now() AND attempts < 10 ORDER BY available_at LIMIT %[2]d`

var anatomySteps = []anatomyStep{
	{what: "read the rows in due order, no lock, no lease", drain: rawClaim(
		`SELECT id::text, tableoid, ctid, payload, event_type, headers, enqueued_at ` + dueRows)},
	{what: "the same, locked (FOR UPDATE SKIP LOCKED)", drain: rawClaim(
		`SELECT id::text, tableoid, ctid, payload, event_type, headers, enqueued_at ` + dueRows + ` FOR UPDATE SKIP LOCKED`)},
	{what: "a plain claim: locked, the heap-only lease", drain: rawClaim(
		`UPDATE %[1]s o SET claimed_at = now(), claimed_by = 'anatomy' FROM (SELECT ctid ` + dueRows + ` FOR UPDATE SKIP LOCKED) s
		WHERE o.ctid = s.ctid RETURNING id::text, tableoid, o.ctid, payload, event_type, headers, enqueued_at`)},
	{what: "today's claim and settle", drain: storeClaim(nil)},
	{what: "today's, generic plans", plan: "force_generic_plan", drain: storeClaim(nil)},
	{what: "a lease in a claims table", drain: storeClaim(func(ctx context.Context, s *outbox.Store) error { return s.KeepLeasesInClaimsTable(ctx) })},
}

// anatomy measures each step on a fresh outbox of -events rows, in
// interleaved rounds, and prints medians.
func (b *bench) anatomy(ctx context.Context) []string {
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		fmt.Printf("\nanatomy: skipped, no /proc/<pid>/schedstat to read a backend's CPU from: %v\n", err)
		return nil
	}
	var inserts []float64
	claims, settles := make([][]float64, len(anatomySteps)), make([][]float64, len(anatomySteps))
	for round := range *rounds {
		log.Printf("anatomy, round %d of %d", round+1, *rounds)
		for i, step := range anatomySteps {
			insert, claim, settle := b.anatomyRun(ctx, step)
			inserts, claims[i], settles[i] = append(inserts, insert), append(claims[i], claim), append(settles[i], settle)
		}
	}
	fmt.Printf("\nanatomy: one backend's CPU per row, claims of %d rows each followed by a deleting settle, %d rows of %d bytes, "+
		"nothing else running; medians of %d rounds\n", *batchSize, *events, *payloadBytes, *rounds)
	fmt.Printf("  %-48s %8s %8s %8s\n", "", "claim", "settle", "total")
	fmt.Printf("  %-48s %8s %8s %8.2f\n", "the insert of the same rows (reference)", "", "", median(inserts))
	for i, step := range anatomySteps {
		c, s := median(claims[i]), median(settles[i])
		fmt.Printf("  %-48s %8.2f %8.2f %8.2f\n", step.what, c, s, c+s)
	}
	return nil
}

// anatomyRun inserts -events rows into a fresh outbox by one statement and
// drains them by step, all on one session, and returns the µs of that
// backend's CPU per row the insert, the claims and the settles took.
func (b *bench) anatomyRun(ctx context.Context, step anatomyStep) (insert, claim, settle float64) {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE IF EXISTS "+spec.Name+", "+spec.Name+"_claims")
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 1
	if step.plan != "" {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = step.plan
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		log.Fatal(err)
	}
	quiesce("anatomy")
	start := backendCPU(pid)
	if _, err := insertEventsOn(ctx, pool, spec.Name, *events); err != nil {
		log.Fatal(err)
	}
	insert = perRowµs(backendCPU(pid)-start, *events)
	b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
	store, err := outbox.OpenStore(ctx, pool, spec)
	if err != nil {
		log.Fatal(err)
	}
	claimOnce, settleOnce := step.drain(ctx, pool, store, spec)
	var claimed, claimNs, settleNs int64
	for {
		at := backendCPU(pid)
		n := claimOnce()
		mid := backendCPU(pid)
		claimNs += mid - at
		if n == 0 {
			break
		}
		settleOnce()
		settleNs += backendCPU(pid) - mid
		claimed += int64(n)
	}
	if claimed != int64(*events) {
		log.Fatalf("anatomy: %s drained %d of %d rows", step.what, claimed, *events)
	}
	return insert, perRowµs(claimNs, *events), perRowµs(settleNs, *events)
}

func perRowµs(ns int64, rows int) float64 { return float64(ns) / 1e3 / float64(rows) }

// backendCPU is the CPU time a local process has run, in nanoseconds.
func backendCPU(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat")
	if err != nil {
		log.Fatalf("read the CPU of backend %d: %v", pid, err)
	}
	ns, err := strconv.ParseInt(strings.Fields(string(raw))[0], 10, 64)
	if err != nil {
		log.Fatalf("read the CPU of backend %d: %v", pid, err)
	}
	return ns
}
