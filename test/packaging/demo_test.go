package packaging

import (
	"os/exec"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"

	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("make demo-drain", Label(tier.Process), func() {
	It("drains its seeded outbox to zero with two drainers, which exit 0 on SIGTERM, and exits 0, leaving nothing behind", func(ctx SpecContext) {
		demo, err := gexec.Build("github.com/spillway-io/spillway/test/demo")
		Expect(err).NotTo(HaveOccurred())
		s, err := gexec.Start(exec.Command(demo, "-spillway", spillway, "-events", "3000", "-progress", "200ms"), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { s.Kill().Wait(10 * time.Second) })
		Eventually(s, 2*time.Minute).Should(gexec.Exit(0))

		out := string(s.Out.Contents())
		Expect(out).To(MatchRegexp(`(?m)^migrate: created trigger `), "migrate --notify installed the trigger")
		Expect(out).To(MatchRegexp(`(?m)^\s*[0-9.]+s\s+backlog\s+0\s`))
		Expect(out).To(ContainSubstring("SIGTERM: demo-1 exited 0, demo-2 exited 0"))
		queued := regexp.MustCompile(`the queue holds (\d+) messages`).FindStringSubmatch(out)
		Expect(queued).To(HaveLen(2), out)
		Expect(strconv.Atoi(queued[1])).To(BeNumerically(">=", 3000), "at least once: every event reached the queue")

		table := regexp.MustCompile(`(?m)^migrate: created table (\S+)$`).FindStringSubmatch(out)
		Expect(table).To(HaveLen(2), out)
		db, err := pgxpool.New(ctx, testenv.DatabaseURL())
		Expect(err).NotTo(HaveOccurred())
		defer db.Close()
		var exists bool
		Expect(db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table[1]).Scan(&exists)).To(Succeed())
		Expect(exists).To(BeFalse(), "the demo drops its table")
	})
})
