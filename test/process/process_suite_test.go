// Package process runs the spillway binary as a user does, against the local
// Postgres and RabbitMQ. The faults that take a shared service down live in
// test/faults, which runs on its own.
package process

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestProcess(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Process Suite: the spillway binary", Label(tier.Process))
}

var (
	spillway string
	pool     *pgxpool.Pool
	amqpConn *amqp.Connection
)

var _ = BeforeSuite(func(ctx SpecContext) {
	spillway = suite.BuildSpillway()
	services, err := testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(services.Close)
	pool, amqpConn = services.DB, services.Broker
})

func start(args ...string) *gexec.Session { return suite.Start(spillway, args...) }

func count(ctx context.Context, table, where string) int {
	return suite.DB{Pool: pool}.Count(ctx, table, where)
}

// topology declares an exchange and a bound queue for the current test.
func topology() (*amqp.Channel, testenv.Topology) {
	ch, err := amqpConn.Channel()
	Expect(err).NotTo(HaveOccurred())
	topo, err := testenv.DeclareTopology(ch, "#", nil)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		topo.Delete(ch)
		_ = ch.Close()
	})
	return ch, topo
}

// drain starts a drain process on table, publishing to exchange.
func drain(table, exchange, id string, extra ...string) *gexec.Session {
	args := []string{"drain", "--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(),
		"--table", table, "--exchange", exchange, "--drainer-id", id, "--poll-interval", "100ms"}
	return start(append(args, extra...)...)
}

// peakRSS is a process's peak resident set size, VmHWM in /proc/<pid>/status.
func peakRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		if v, ok := strings.CutPrefix(scanner.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			Expect(err).NotTo(HaveOccurred())
			return kb << 10
		}
	}
	Fail("no VmHWM in /proc/<pid>/status")
	return 0
}

// rabbitmqctl runs one rabbitmqctl command.
func rabbitmqctl(args ...string) {
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "rabbitmqctl %v: %s", args, out)
}

var _ = Describe("spillway", func() {
	It("migrates an outbox, and a second migrate reports it up to date", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		s := start("migrate", "--database-url", testenv.DatabaseURL(), "--table", table)
		Eventually(s, 30*time.Second).Should(gexec.Exit(0))
		Expect(s.Out).To(gbytes.Say(table + " is up to date"))
	})

	It("drains an outbox with two drain processes, which exit 0 on SIGTERM and leave no claim behind", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		ch, topo := topology()
		suite.DB{Pool: pool}.Seed(ctx, table, 5000)

		var drainers []*gexec.Session
		for _, id := range []string{"e2e-a", "e2e-b"} {
			drainers = append(drainers, drain(table, topo.Exchange, id, "--metrics-addr", ""))
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

	It("on SIGTERM mid-drain, exits 0 within the shutdown timeout and leaves no claimed rows", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		_, topo := topology()
		suite.DB{Pool: pool}.Seed(ctx, table, 100_000)
		d := drain(table, topo.Exchange, "e2e-term", "--metrics-addr", "", "--shutdown-timeout", "5s")
		// Published rows are deleted (the default): 2,000 of them are gone.
		Eventually(func() int { return count(ctx, table, "published_at IS NULL") }, 60*time.Second, 20*time.Millisecond).
			Should(BeNumerically("<=", 98_000))

		Expect(d.Command.Process.Signal(syscall.SIGTERM)).To(Succeed())
		signalled := time.Now()
		Eventually(d, 5*time.Second, 10*time.Millisecond).Should(gexec.Exit(0))
		GinkgoWriter.Printf("exited %s after SIGTERM\n", time.Since(signalled))
		Expect(count(ctx, table, "published_at IS NULL")).To(BeNumerically(">", 0), "stopped mid-drain")
		Expect(count(ctx, table, "published_at IS NULL AND claimed_by IS NOT NULL")).To(BeZero(), "no claim left behind")
		Expect(count(ctx, table, "attempts > 0")).To(BeZero())
	})

	It("re-claims the rows of a drainer killed with SIGKILL once their lease expires, losing none", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		ch, topo := topology()
		suite.DB{Pool: pool}.Seed(ctx, table, 20_000)
		// The shortest lease the rule allows for a depth of 8: 2.4 s. The
		// published rows are kept, with the attempts the spec checks.
		lease := []string{"--lease-ttl", "3s", "--pipeline-depth", "8", "--metrics-addr", "", "--retention-published", "24h"}
		victim := drain(table, topo.Exchange, "e2e-victim", lease...)
		Eventually(func() int { return count(ctx, table, "published_at IS NOT NULL") }, 60*time.Second, 10*time.Millisecond).
			Should(BeNumerically(">=", 1000))
		// Freeze the victim at a moment it holds claims (between a settle
		// and the next claim it may hold none), then kill it.
		var orphaned int
		Eventually(func() int {
			Expect(victim.Command.Process.Signal(syscall.SIGSTOP)).To(Succeed())
			if orphaned = count(ctx, table, "published_at IS NULL AND claimed_by = 'e2e-victim'"); orphaned == 0 {
				Expect(victim.Command.Process.Signal(syscall.SIGCONT)).To(Succeed())
			}
			return orphaned
		}, 10*time.Second, 5*time.Millisecond).Should(BeNumerically(">", 0), "the killed drainer left claims behind")
		Expect(victim.Command.Process.Signal(syscall.SIGKILL)).To(Succeed())
		Eventually(victim, 5*time.Second).Should(gexec.Exit())

		drain(table, topo.Exchange, "e2e-heir", lease...)
		Eventually(func() int { return count(ctx, table, "published_at IS NULL") }, 120*time.Second, 100*time.Millisecond).Should(BeZero())
		Expect(count(ctx, table, "attempts > 0")).To(BeZero())
		missing, duplicates := suite.Undelivered(ch, topo.Queue, suite.DB{Pool: pool}.IDs(ctx, table, "true"), 60*time.Second)
		Expect(missing).To(BeEmpty(), "rows never delivered")
		GinkgoWriter.Printf("orphaned claims: %d, duplicates delivered: %d\n", orphaned, duplicates)
	})

	It("drains 300 rows of 4 MB with the drainer's peak RSS under 192 MiB, and publishes a row larger than the claim budget alone", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		ch, topo := topology()
		// md5 text compresses well in Postgres; in the drainer each payload
		// is its full 4 MiB.
		_, err := pool.Exec(ctx, "INSERT INTO "+table+` (event_type, payload)
			SELECT 'order.created', jsonb_build_object('pad', repeat(md5(g::text), 131072)) FROM generate_series(1, 300) g`)
		Expect(err).NotTo(HaveOccurred())
		var large string
		Expect(pool.QueryRow(ctx, "INSERT INTO "+table+` (event_type, payload)
			VALUES ('order.created', jsonb_build_object('pad', repeat(md5('large'), 393216))) RETURNING id::text`).Scan(&large)).To(Succeed())
		want := suite.DB{Pool: pool}.IDs(ctx, table, "true")
		// A consumer keeps the 1.2 GB out of the broker's memory. The broker
		// writes it all to disk: on a machine shared with the other suites
		// that takes minutes.
		const patience = 10 * time.Minute
		delivered := make(chan []string, 1)
		go func() {
			defer GinkgoRecover()
			missing, duplicates := suite.Undelivered(ch, topo.Queue, want, patience)
			GinkgoWriter.Printf("duplicates: %d\n", duplicates)
			delivered <- missing
		}()
		// Kept, for the claim of the large row the spec reads after.
		d := drain(table, topo.Exchange, "e2e-large", "--metrics-addr", "", "--retention-published", "24h")
		Eventually(func() int { return count(ctx, table, "published_at IS NULL") }, patience, 100*time.Millisecond).Should(BeZero())
		peak := peakRSS(d.Command.Process.Pid)
		GinkgoWriter.Printf("drainer peak RSS: %d MiB\n", peak>>20)
		Expect(peak).To(BeNumerically("<", 192<<20), "peak RSS of the drainer process")
		Eventually(delivered, patience).Should(Receive(BeEmpty()), "rows never delivered")
		Expect(count(ctx, table, fmt.Sprintf("claimed_at = (SELECT claimed_at FROM %s WHERE id = '%s')", table, large))).To(Equal(1),
			"the 12 MiB row, over the claim's byte budget, was claimed alone")
	})

	It("serves /healthz, /readyz and /metrics on one port", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		_, topo := topology()
		suite.DB{Pool: pool}.Seed(ctx, table, 100)
		addr := suite.FreeAddr()
		drain(table, topo.Exchange, "e2e-probes", "--metrics-addr", addr)
		Eventually(func() int { return testenv.Probe(addr, "/healthz") }, 10*time.Second).Should(Equal(200))
		Eventually(func() int { return testenv.Probe(addr, "/readyz") }, 10*time.Second).Should(Equal(200))
		Eventually(func() (float64, error) { return testenv.Metric(addr, "spillway_drainer_published_rows_total") }, 30*time.Second).
			Should(Equal(100.0))
	})

	It("reads a rotated broker password from its file when the broker connection restarts", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		ch, topo := topology()
		user := testenv.UniqueName("spillway_rotation")
		rabbitmqctl("add_user", user, "first-password")
		DeferCleanup(func() { rabbitmqctl("delete_user", user) })
		rabbitmqctl("set_permissions", user, ".*", ".*", ".*")
		file := filepath.Join(GinkgoT().TempDir(), "broker-url")
		writeURL := func(password string) {
			Expect(os.WriteFile(file, []byte("amqp://"+user+":"+password+"@127.0.0.1:5672/\n"), 0o600)).To(Succeed())
		}
		writeURL("first-password")
		d := start("drain", "--database-url", testenv.DatabaseURL(), "--broker-url-file", file, "--table", table,
			"--exchange", topo.Exchange, "--drainer-id", "e2e-rotation", "--poll-interval", "100ms", "--metrics-addr", "")
		suite.DB{Pool: pool}.Seed(ctx, table, 100)
		Eventually(func() int { return count(ctx, table, "published_at IS NULL") }, 30*time.Second).Should(BeZero())

		rabbitmqctl("change_password", user, "second-password")
		writeURL("second-password")
		rabbitmqctl("close_all_user_connections", user, "password rotated")
		suite.DB{Pool: pool}.Seed(ctx, table, 100)
		Eventually(func() int { return count(ctx, table, "published_at IS NULL") }, 60*time.Second).Should(BeZero())
		Expect(testenv.QueueDepth(ch, topo.Queue)).To(BeNumerically(">=", 200))
		// The log reaches the buffer through a pipe, after the rows it
		// explains may already be published.
		Eventually(d.Err, 10*time.Second).Should(gbytes.Say("Broker closed the connection"))
		Eventually(d.Err, 10*time.Second).Should(gbytes.Say("Connected to broker"), "reconnected with the password the old one no longer matches")
	})

	It("exits non-zero naming the field, the value and the rule for a bad flag", func() {
		s := start("drain", "--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(), "--batch-size", "0")
		Eventually(s, 10*time.Second).Should(gexec.Exit(1))
		Expect(s.Err).To(gbytes.Say("batchSize: Invalid value: 0: must be greater than 0"))
	})

	It("refuses a zero retention window, which would delete the pending set", func() {
		s := start("drain", "--database-url", testenv.DatabaseURL(), "--broker-url", testenv.BrokerURL(), "--drainer-id", "x",
			"--retention-unpublished-max-age", "0s")
		Eventually(s, 10*time.Second).Should(gexec.Exit(1))
		Expect(s.Err).To(gbytes.Say(`retention.unpublishedMaxAge: Invalid value: "0s": must be greater than 0`))
	})

	It("never prints a password from its connection URLs, through database and broker connection failures", func(ctx SpecContext) {
		table := suite.Migrate(spillway, pool, "e2e_outbox")
		const sentinel = "Sentinel-7f3a9c"
		goodDatabase := "postgres://postgres:" + sentinel + "@127.0.0.1:5432/test?sslmode=disable"
		refusingBroker := start("drain", "--database-url", goodDatabase,
			"--broker-url", "amqp://guest:"+sentinel+"@127.0.0.1:1/", "--table", table, "--exchange", "amq.topic",
			"--drainer-id", "e2e-secret-broker", "--metrics-addr", "")
		wrongPassword := start("drain", "--database-url", goodDatabase,
			"--broker-url", "amqp://guest:"+sentinel+"@127.0.0.1:5672/", "--table", table, "--exchange", "amq.topic",
			"--drainer-id", "e2e-secret-auth", "--metrics-addr", "")
		refusingDatabase := start("drain", "--database-url", "postgres://postgres:"+sentinel+"@127.0.0.1:1/test",
			"--broker-url", "amqp://guest:"+sentinel+"@127.0.0.1:5672/", "--table", table, "--exchange", "amq.topic",
			"--drainer-id", "e2e-secret-db", "--metrics-addr", "")
		Eventually(refusingBroker.Err, 10*time.Second).Should(gbytes.Say("Broker unavailable"))
		Eventually(wrongPassword.Err, 10*time.Second).Should(gbytes.Say("Broker unavailable"))
		Eventually(refusingDatabase.Err, 10*time.Second).Should(gbytes.Say("Database unavailable at start"))
		for _, s := range []*gexec.Session{refusingBroker, wrongPassword, refusingDatabase} {
			Expect(s.Command.Process.Signal(syscall.SIGTERM)).To(Succeed())
			Eventually(s, 10*time.Second).Should(gexec.Exit(0))
			Expect(bytes.Contains(s.Out.Contents(), []byte(sentinel))).To(BeFalse())
			Expect(bytes.Contains(s.Err.Contents(), []byte(sentinel))).To(BeFalse())
		}
	})
})
