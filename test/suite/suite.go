// Package suite holds helpers for Ginkgo suites that assert as they go:
// building and running the spillway binary, migrating and seeding a table,
// counting rows and consuming deliveries.
package suite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// BuildSpillway builds the spillway binary for a suite that runs it as a
// process; the artifacts are removed when the suite ends.
func BuildSpillway() string {
	bin, err := gexec.Build("github.com/spillway-io/spillway")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	ginkgo.DeferCleanup(gexec.CleanupBuildArtifacts)
	return bin
}

// Start runs bin with args, with none of the environment's connection
// defaults; the process is killed when the test ends.
func Start(bin string, args ...string) *gexec.Session {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "BROKER_URL=", "POD_NAME=")
	s, err := gexec.Start(cmd, ginkgo.GinkgoWriter, ginkgo.GinkgoWriter)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	ginkgo.DeferCleanup(func() { s.Kill().Wait(10 * time.Second) })
	return s
}

// Migrate runs spillway migrate on a fresh canonical table, dropped when the
// test ends, and returns its name.
func Migrate(bin string, db *pgxpool.Pool, prefix string, extra ...string) string {
	table := "public." + testenv.UniqueName(prefix)
	ginkgo.DeferCleanup(func(ctx ginkgo.SpecContext) {
		_, err := db.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	})
	s := Start(bin, append([]string{"migrate", "--database-url", testenv.DatabaseURL(), "--table", table}, extra...)...)
	gomega.Eventually(s, 30*time.Second).Should(gexec.Exit(0))
	return table
}

// Undelivered consumes queue until every id in want has arrived, or until
// timeout, and returns the ids that never did and how many duplicates came.
// At-least-once delivery allows duplicates; it does not allow a missing id.
func Undelivered(ch *amqp.Channel, queue string, want []string, timeout time.Duration) (missing []string, duplicates int) {
	gomega.Expect(ch.Qos(1000, 0, false)).To(gomega.Succeed())
	tag := testenv.UniqueName("consumer")
	deliveries, err := ch.Consume(queue, tag, true, true, false, false, nil)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	defer func() { _ = ch.Cancel(tag, false) }()
	pending := make(map[string]bool, len(want))
	for _, id := range want {
		pending[id] = true
	}
	seen := map[string]bool{}
	deadline := time.After(timeout)
	for len(pending) > 0 {
		select {
		case d := <-deliveries:
			if seen[d.MessageId] {
				duplicates++
			}
			seen[d.MessageId] = true
			delete(pending, d.MessageId)
		case <-deadline:
			for id := range pending {
				missing = append(missing, id)
			}
			return missing, duplicates
		}
	}
	return nil, duplicates
}

// FreeAddr is a loopback address with a port nothing listens on.
func FreeAddr() string {
	addr, err := testenv.UnusedAddr()
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return addr
}

// DB is a suite's connection to the test Postgres, with the fixtures of the
// specs that touch outbox tables: a table of the spec's own, dropped when it
// ends, and SQL run as the application or the clock would.
type DB struct{ Pool *pgxpool.Pool }

// CanonicalOutbox migrates a fresh canonical table for the current spec.
func (db DB) CanonicalOutbox(ctx context.Context) outbox.TableSpec {
	spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("outbox")}
	_, err := outbox.Migrate(ctx, db.Pool, spec)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	db.DropAfterTest(spec.Name)
	return spec
}

// OrderedOutbox is CanonicalOutbox ordered per key on aggregate_id, which it
// adds as an application would, and whose failures do onFailure.
func (db DB) OrderedOutbox(ctx context.Context, onFailure string) outbox.TableSpec {
	spec := db.CanonicalOutbox(ctx)
	db.Exec(ctx, "ALTER TABLE "+spec.Name+" ADD COLUMN aggregate_id text")
	spec.Ordering = outbox.Ordering{KeyColumn: "aggregate_id", OnFailure: onFailure}
	done, err := outbox.Migrate(ctx, db.Pool, spec)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(done).To(gomega.ConsistOf(gomega.HaveSuffix("_spillway_order_idx"), gomega.HaveSuffix("_spillway_key_lease_idx")))
	return spec
}

// PartitionedOutbox creates a canonical outbox partitioned by enqueued_at at
// boundary, as large outboxes are kept small, dropped when the spec ends. It
// returns the spec and the partitions' names, the older first.
func (db DB) PartitionedOutbox(ctx context.Context, boundary time.Time) (spec outbox.TableSpec, partitions []string) {
	name := "public." + testenv.UniqueName("parted_outbox")
	db.Exec(ctx, `CREATE TABLE `+name+` (
		id uuid NOT NULL DEFAULT gen_random_uuid(), event_type text NOT NULL, payload jsonb NOT NULL, headers jsonb,
		enqueued_at timestamptz NOT NULL DEFAULT now(), available_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz,
		claimed_at timestamptz, claimed_by text, attempts integer NOT NULL DEFAULT 0, last_error text,
		PRIMARY KEY (id, enqueued_at)) PARTITION BY RANGE (enqueued_at)`)
	db.DropAfterTest(name)
	at := boundary.UTC().Format(time.RFC3339Nano)
	partitions = []string{name + "_old", name + "_new"}
	db.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (MINVALUE) TO ('%s')", partitions[0], name, at))
	db.Exec(ctx, fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO (MAXVALUE)", partitions[1], name, at))
	return outbox.TableSpec{Name: name}, partitions
}

// ClaimParams are the claim knobs of the specs that call the store directly.
func ClaimParams(id string, n int) outbox.ClaimParams {
	return outbox.ClaimParams{DrainerID: id, BatchSize: n, MaxAttempts: 10, LeaseMillis: 30_000, MaxPayloadBytes: 1 << 20, MaxClaimBytes: 8 << 20}
}

// DropAfterTest drops table when the current spec ends.
func (db DB) DropAfterTest(table string) {
	ginkgo.DeferCleanup(func(ctx ginkgo.SpecContext) {
		_, err := db.Pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	})
}

// Exec runs fixture SQL and returns the rows it changed.
func (db DB) Exec(ctx context.Context, sql string, args ...any) int64 {
	tag, err := db.Pool.Exec(ctx, sql, args...)
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred(), sql)
	return tag.RowsAffected()
}

// Seed inserts n pending rows with routing key order.created, each with
// payload {"n": …} and headers {"seq": …}.
func (db DB) Seed(ctx context.Context, table string, n int) {
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, headers)
		SELECT 'order.created', jsonb_build_object('n', g), jsonb_build_object('seq', g)
		FROM generate_series(1, $1) g`, n)
}

// SeedKeys inserts perKey rows for each of keys keys named k0, k1, …, into an
// ordered table, the rows of all keys interleaved in enqueue order, each a
// microsecond after the one before, so that enqueue order is insertion
// order; seq numbers each key's rows from 1.
func (db DB) SeedKeys(ctx context.Context, table string, keys, perKey int) {
	db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload, aggregate_id, enqueued_at, available_at)
		SELECT 'order.created', jsonb_build_object('key', 'k' || mod(g, $1::int), 'seq', g / $1::int + 1), 'k' || mod(g, $1::int),
			now() - interval '1 hour' + g * interval '1 microsecond', now() - interval '1 hour' + g * interval '1 microsecond'
		FROM generate_series(0, $1::int * $2::int - 1) g`, keys, perKey)
}

// Schema describes table's columns and indexes as the catalog has them.
func (db DB) Schema(ctx context.Context, table string) []string {
	rows, err := db.Pool.Query(ctx, `
		SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull
		FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = to_regclass($1)
		ORDER BY 1`, table)
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	return out
}

// Poison makes the rows of table matching where poisoned as a failure at
// maxAttempts leaves them, with lastError, enqueued ago before now, and
// returns their ids.
func (db DB) Poison(ctx context.Context, table, where, lastError, ago string, maxAttempts int) []string {
	picked := db.IDs(ctx, table, where)
	db.Exec(ctx, "UPDATE "+table+` SET attempts = $1, available_at = 'infinity', last_error = $2,
		enqueued_at = now() - $3::interval, claimed_at = NULL, claimed_by = NULL WHERE id::text = ANY($4)`,
		maxAttempts, lastError, ago, picked)
	return picked
}

// Snapshot is every row of table matching where as JSON, in id order, to
// show that nothing changed.
func (db DB) Snapshot(ctx context.Context, table, where string, args ...any) []string {
	rows, err := db.Pool.Query(ctx, "SELECT row_to_json(o)::text FROM "+table+" o WHERE "+where+" ORDER BY id", args...)
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	return out
}

// Count is the number of rows of table matching where.
func (db DB) Count(ctx context.Context, table, where string, args ...any) int {
	var n int
	gomega.ExpectWithOffset(1, db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+where, args...).Scan(&n)).To(gomega.Succeed())
	return n
}

// IDs are the ids of table's rows matching where, as text.
func (db DB) IDs(ctx context.Context, table, where string, args ...any) []string {
	rows, err := db.Pool.Query(ctx, "SELECT id::text FROM "+table+" WHERE "+where, args...)
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	gomega.ExpectWithOffset(1, err).NotTo(gomega.HaveOccurred())
	return out
}

// Lazy is a suite's connection to the local Postgres and RabbitMQ, made at
// the first spec that runs against one of them, so that the suite's unit
// specs run with neither (make test-unit). Close it in an AfterSuite.
type Lazy struct {
	once     sync.Once
	services testenv.Services
	err      error
}

// Connect connects once, and fails the spec if it could not.
func (l *Lazy) Connect(ctx context.Context) testenv.Services {
	l.once.Do(func() { l.services, l.err = testenv.Connect(ctx) })
	gomega.ExpectWithOffset(1, l.err).NotTo(gomega.HaveOccurred())
	return l.services
}

// Close closes what Connect opened, if anything.
func (l *Lazy) Close() {
	if l.services.DB != nil || l.services.Broker != nil {
		l.services.Close()
	}
}
