// Package faults takes the shared services down under running drainer
// processes: it stops RabbitMQ, raises its memory alarm, restarts Postgres
// and kills Postgres sessions. It runs on its own, after the other suites (make test), and puts
// every service back even when a spec fails.
package faults

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestFaults(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Faults Suite", Label(tier.Faults))
}

var (
	spillway string
	pool     *pgxpool.Pool
)

var _ = BeforeSuite(func(ctx SpecContext) {
	// A descriptor this process inherited, such as a lock that a flock
	// without -o holds for the run, would pass on to the Postgres that a spec
	// restarts and stay held for as long as that server runs.
	for fd := 3; fd < 256; fd++ {
		syscall.CloseOnExec(fd)
	}
	spillway = suite.BuildSpillway()
	services, err := testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	services.Broker.Close() // each spec dials its own: a broker restart closes connections
	pool = services.DB
	DeferCleanup(pool.Close)
})

// midDrainRows is enough rows that a fault injected after the first 2,000
// are published still lands mid-drain: a drainer publishes several thousand
// a second here, and rabbitmqctl or pg_ctlcluster take a second or more.
const midDrainRows = 100_000

// fleet is one test's outbox, exchange and queue, with rows to drain.
type fleet struct {
	table string
	topo  testenv.Topology
}

func newFleet(ctx context.Context, rows int) fleet {
	f := fleet{table: suite.Migrate(spillway, pool, "fault_outbox")}
	withChannel(func(ch *amqp.Channel) {
		var err error
		f.topo, err = testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
	})
	DeferCleanup(func() { withChannel(f.topo.Delete) })
	suite.DB{Pool: pool}.Seed(ctx, f.table, rows)
	return f
}

// withChannel runs f on a channel of a fresh connection.
func withChannel(f func(ch *amqp.Channel)) {
	conn, err := amqp.Dial(testenv.BrokerURL())
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	ch, err := conn.Channel()
	Expect(err).NotTo(HaveOccurred())
	f(ch)
}

// drain starts a drainer process serving its metrics and probes on addr.
func (f fleet) drain(id, addr string, extra ...string) *gexec.Session {
	// Published rows are kept: the specs check that no fault counted an
	// attempt against any row, the published ones included.
	args := []string{"drain", "--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(),
		"--table", f.table, "--exchange", f.topo.Exchange, "--drainer-id", id, "--metrics-addr", addr, "--retention-published", "24h"}
	return suite.Start(spillway, append(args, extra...)...)
}

func (f fleet) count(ctx context.Context, where string) int {
	return suite.DB{Pool: pool}.Count(ctx, f.table, where)
}

// waitPublished waits until at least n rows are published: mid-drain.
func (f fleet) waitPublished(ctx context.Context, n int) {
	Eventually(func() int { return f.count(ctx, "published_at IS NOT NULL") }, 60*time.Second, 10*time.Millisecond).
		Should(BeNumerically(">=", n))
}

// expectDelivered waits for the drain to finish and checks that every row
// reached the queue, with no attempt counted against any row.
func (f fleet) expectDelivered(ctx context.Context) {
	Eventually(func() int { return f.count(ctx, "published_at IS NULL") }, 3*time.Minute, 100*time.Millisecond).Should(BeZero())
	Expect(f.count(ctx, "attempts > 0")).To(BeZero(), "the fault bumped attempts")
	withChannel(func(ch *amqp.Channel) {
		missing, duplicates := suite.Undelivered(ch, f.topo.Queue, suite.DB{Pool: pool}.IDs(ctx, f.table, "true"), 2*time.Minute)
		Expect(missing).To(BeEmpty(), "rows lost")
		GinkgoWriter.Printf("every row delivered; %d duplicates\n", duplicates)
	})
}

// postgresCluster starts, stops or restarts the local Postgres cluster.
func postgresCluster(action string) {
	versions, err := os.ReadDir("/etc/postgresql")
	Expect(err).NotTo(HaveOccurred())
	Expect(versions).NotTo(BeEmpty())
	out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", versions[0].Name(), "main", action).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "pg_ctlcluster %s: %s", action, out)
}

func rabbitmqctl(args ...string) string {
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "rabbitmqctl %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

var _ = Describe("Faults", Serial, func() {
	It("finishes the drain after RabbitMQ is stopped for 20 s, losing no row and counting no attempt", func(ctx SpecContext) {
		f := newFleet(ctx, midDrainRows)
		addr := suite.FreeAddr()
		f.drain("fault-outage", addr)
		f.waitPublished(ctx, 2000)

		rabbitmqctl("stop_app")
		stopped := time.Now()
		DeferCleanup(func() { rabbitmqctl("start_app") }) // start_app on a running app is a no-op
		Eventually(func() int { return testenv.Probe(addr, "/readyz") }, 10*time.Second).Should(Equal(503))
		Eventually(func() int { return f.count(ctx, "claimed_by IS NOT NULL AND published_at IS NULL") }, 30*time.Second).
			Should(BeZero(), "claims released while the broker is down")
		Expect(f.count(ctx, "published_at IS NULL")).To(BeNumerically(">", 0), "stopped mid-drain")
		time.Sleep(time.Until(stopped.Add(20 * time.Second)))
		rabbitmqctl("start_app")

		f.expectDelivered(ctx)
		Expect(testenv.Probe(addr, "/readyz")).To(Equal(200))
	})

	It("takes no claim while the broker blocks publishing under a memory alarm, then finishes the drain", func(ctx SpecContext) {
		f := newFleet(ctx, midDrainRows)
		addr := suite.FreeAddr()
		// Depth 16 allows a 6 s lease, so a stalled confirm is released after 2 s.
		f.drain("fault-blocked", addr, "--pipeline-depth", "16", "--lease-ttl", "6s")
		f.waitPublished(ctx, 2000)

		watermark := rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
		rabbitmqctl("set_vm_memory_high_watermark", "0.0000001")
		DeferCleanup(func() { rabbitmqctl("set_vm_memory_high_watermark", watermark) })
		Eventually(func() int { return testenv.Probe(addr, "/readyz") }, 30*time.Second, 10*time.Millisecond).Should(Equal(503))
		Eventually(func() int { return f.count(ctx, "claimed_by IS NOT NULL AND published_at IS NULL") }, 30*time.Second).
			Should(BeZero(), "claims in flight released after their confirm deadline")
		claimed, err := testenv.Metric(addr, "spillway_drainer_claimed_rows_total")
		Expect(err).NotTo(HaveOccurred())
		Consistently(func() (float64, error) { return testenv.Metric(addr, "spillway_drainer_claimed_rows_total") }, 5*time.Second, 100*time.Millisecond).
			Should(Equal(claimed), "no claims while blocked")
		Expect(f.count(ctx, "attempts > 0")).To(BeZero())

		rabbitmqctl("set_vm_memory_high_watermark", watermark)
		f.expectDelivered(ctx)
	})

	It("exits within the shutdown timeout plus a second on SIGTERM under a memory alarm, and releases its claims", func(ctx SpecContext) {
		f := newFleet(ctx, 0)
		// Payloads of 64 KiB keep the socket busy when the alarm blocks it.
		_, err := pool.Exec(ctx, "INSERT INTO "+f.table+` (event_type, payload)
			SELECT 'order.created', jsonb_build_object('pad', repeat(md5(g::text), 2048)) FROM generate_series(1, 20000) g`)
		Expect(err).NotTo(HaveOccurred())
		addr := suite.FreeAddr()
		s := f.drain("fault-shutdown", addr, "--shutdown-timeout", "5s")
		f.waitPublished(ctx, 1000)

		watermark := rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
		rabbitmqctl("set_vm_memory_high_watermark", "0.0000001")
		DeferCleanup(func() { rabbitmqctl("set_vm_memory_high_watermark", watermark) })
		Eventually(func() int { return testenv.Probe(addr, "/readyz") }, 30*time.Second, 10*time.Millisecond).Should(Equal(503))

		Expect(s.Command.Process.Signal(syscall.SIGTERM)).To(Succeed())
		signalled := time.Now()
		Eventually(s, 6*time.Second, 10*time.Millisecond).Should(gexec.Exit(0), "exited within --shutdown-timeout 5s plus a second")
		GinkgoWriter.Printf("exited %s after SIGTERM\n", time.Since(signalled))
		Expect(f.count(ctx, "claimed_by IS NOT NULL AND published_at IS NULL")).To(BeZero(), "claims released")
		Expect(f.count(ctx, "attempts > 0")).To(BeZero())
	})

	It("finishes the drain after Postgres restarts mid-drain, losing no row and counting no attempt", func(ctx SpecContext) {
		f := newFleet(ctx, midDrainRows)
		addr := suite.FreeAddr()
		f.drain("fault-restart", addr)
		f.waitPublished(ctx, 2000)

		DeferCleanup(func() {
			if exec.Command("pg_isready", "-h", "127.0.0.1", "-q").Run() != nil {
				postgresCluster("start")
			}
		})
		postgresCluster("restart")
		Eventually(func() error { return pool.Ping(ctx) }, 60*time.Second, 100*time.Millisecond).Should(Succeed())
		Expect(f.count(ctx, "published_at IS NULL")).To(BeNumerically(">", 0), "restarted mid-drain")

		f.expectDelivered(ctx)
		Eventually(func() int { return testenv.Probe(addr, "/readyz") }, 30*time.Second).Should(Equal(200))
	})

	It("recovers from its Postgres sessions being terminated mid-drain, losing no row", func(ctx SpecContext) {
		f := newFleet(ctx, midDrainRows)
		f.drain("fault-terminated", "")
		f.waitPublished(ctx, 2000)

		var killed int
		for range 5 {
			var n int
			Expect(pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`,
				"spillway-drainer/fault-terminated").Scan(&n)).To(Succeed())
			killed += n
			time.Sleep(200 * time.Millisecond)
		}
		Expect(killed).To(BeNumerically(">=", 5), "sessions were terminated")
		Expect(f.count(ctx, "published_at IS NULL")).To(BeNumerically(">", 0), "terminated mid-drain")

		f.expectDelivered(ctx)
	})
})
