// Package e2e runs the spillway binary as a user does, against the local
// Postgres and RabbitMQ.
package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/testenv"
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "spillway binary")
}

var (
	spillway string
	pool     *pgxpool.Pool
	amqpConn *amqp.Connection
)

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	spillway, err = gexec.Build("github.com/spillway-io/spillway")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(gexec.CleanupBuildArtifacts)
	services, err := testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(services.Close)
	pool, amqpConn = services.DB, services.Broker
})

// start runs spillway with args; the process is killed when the test ends.
func start(args ...string) *gexec.Session {
	cmd := exec.Command(spillway, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "BROKER_URL=", "POD_NAME=")
	s, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { s.Kill().Wait(10 * time.Second) })
	return s
}

func count(ctx context.Context, table, where string) int {
	var n int
	Expect(pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n)).To(Succeed())
	return n
}

func newOutbox(ctx context.Context) string {
	table := "public." + testenv.UniqueName("e2e_outbox")
	DeferCleanup(func(ctx SpecContext) {
		_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		Expect(err).NotTo(HaveOccurred())
	})
	s := start("migrate", "--database-url", testenv.DatabaseURL(), "--table", table)
	Eventually(s, 30*time.Second).Should(gexec.Exit(0))
	Expect(s.Out).To(gbytes.Say("created table " + table))
	return table
}

var _ = Describe("spillway", Label("e2e"), func() {
	It("migrates an outbox, and a second migrate reports it up to date", func(ctx SpecContext) {
		table := newOutbox(ctx)
		s := start("migrate", "--database-url", testenv.DatabaseURL(), "--table", table)
		Eventually(s, 30*time.Second).Should(gexec.Exit(0))
		Expect(s.Out).To(gbytes.Say(table + " is up to date"))
	})

	It("drains an outbox with two drain processes, which exit 0 on SIGTERM and leave no claim behind", func(ctx SpecContext) {
		table := newOutbox(ctx)
		ch, err := amqpConn.Channel()
		Expect(err).NotTo(HaveOccurred())
		defer ch.Close()
		topo, err := testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
		defer topo.Delete(ch)
		_, err = pool.Exec(ctx, "INSERT INTO "+table+" (event_type, payload) SELECT 'order.created', jsonb_build_object('n', g) FROM generate_series(1, 5000) g")
		Expect(err).NotTo(HaveOccurred())

		var drainers []*gexec.Session
		for _, id := range []string{"e2e-a", "e2e-b"} {
			drainers = append(drainers, start("drain", "--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(),
				"--table", table, "--exchange", topo.Exchange, "--drainer-id", id, "--metrics-addr", "", "--poll-interval", "100ms"))
		}
		Eventually(func() int { return count(ctx, table, "published_at IS NULL") }, 60*time.Second, 100*time.Millisecond).Should(BeZero())
		Expect(testenv.QueueDepth(ch, topo.Queue)).To(Equal(5000))

		for _, d := range drainers {
			Expect(d.Command.Process.Signal(syscall.SIGTERM)).To(Succeed())
		}
		for _, d := range drainers {
			Eventually(d, 30*time.Second).Should(gexec.Exit(0))
		}
		Expect(count(ctx, table, "published_at IS NULL AND claimed_by IS NOT NULL")).To(BeZero())
	})

	It("exits non-zero naming the field, the value and the rule for a bad flag", func() {
		s := start("drain", "--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(), "--batch-size", "0")
		Eventually(s, 10*time.Second).Should(gexec.Exit(1))
		Expect(s.Err).To(gbytes.Say("batchSize: Invalid value: 0: must be greater than 0"))
	})

	It("never prints a password from its connection URLs, even while the broker refuses it", func(ctx SpecContext) {
		table := newOutbox(ctx)
		const sentinel = "Sentinel-7f3a9c"
		s := start("drain", "--database-url", "postgres://postgres:"+sentinel+"@127.0.0.1:5432/test?sslmode=disable",
			"--broker-url", "amqp://guest:"+sentinel+"@127.0.0.1:1/", "--table", table, "--exchange", "amq.topic",
			"--drainer-id", "e2e-secret", "--metrics-addr", "")
		Eventually(s.Err, 10*time.Second).Should(gbytes.Say("Broker unavailable"))
		Expect(s.Command.Process.Signal(syscall.SIGTERM)).To(Succeed())
		Eventually(s, 10*time.Second).Should(gexec.Exit(0))
		Expect(bytes.Contains(s.Out.Contents(), []byte(sentinel))).To(BeFalse())
		Expect(bytes.Contains(s.Err.Contents(), []byte(sentinel))).To(BeFalse())
	})
})
