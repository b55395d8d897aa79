// Package suite holds helpers for Ginkgo suites that assert as they go:
// building and running the spillway binary, migrating and seeding a table,
// counting rows and consuming deliveries.
package suite

import (
	"context"
	"os"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

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

// Seed inserts n rows with routing key order.created.
func Seed(ctx context.Context, db *pgxpool.Pool, table string, n int) {
	_, err := db.Exec(ctx, "INSERT INTO "+table+" (event_type, payload) SELECT 'order.created', jsonb_build_object('n', g) FROM generate_series(1, $1) g", n)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
}

// Count is the number of rows of table matching where.
func Count(ctx context.Context, db *pgxpool.Pool, table, where string, args ...any) int {
	var n int
	gomega.Expect(db.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+where, args...).Scan(&n)).To(gomega.Succeed())
	return n
}

// IDs lists the ids of every row of table.
func IDs(ctx context.Context, db *pgxpool.Pool, table string) []string {
	rows, err := db.Query(ctx, "SELECT id::text FROM "+table)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return ids
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
