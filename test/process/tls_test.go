package process

import (
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"

	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("A Postgres that accepts only TLS", func() {
	It("is drained with the certificate flags of the TLS sample, verifying the server, and a server of another CA is refused", func(ctx SpecContext) {
		if _, err := exec.LookPath("pg_createcluster"); err != nil {
			if os.Getenv("CI") == "true" {
				Fail("PostgreSQL's pg_createcluster is not installed: this spec runs a TLS-only cluster of its own (hack/postgres-tls.sh)")
			}
			Skip("pg_createcluster is not installed: this spec runs a TLS-only cluster of its own (hack/postgres-tls.sh)")
		}
		script := exec.Command("hack/postgres-tls.sh", "start")
		script.Dir = testenv.RepoRoot()
		out, err := script.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "hack/postgres-tls.sh start: %s", out)
		DeferCleanup(func() {
			stop := exec.Command("hack/postgres-tls.sh", "stop")
			stop.Dir = testenv.RepoRoot()
			out, err := stop.CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "hack/postgres-tls.sh stop: %s", out)
		})
		dir := os.Getenv("SPILLWAY_PG_TLS_DIR")
		if dir == "" {
			dir = "/tmp/spillway-postgres-tls"
		}
		file := func(name string) string { return filepath.Join(dir, name) }
		// No sslmode: the files make every connection verify-full.
		const url = "postgres://postgres@localhost:5442/test"
		certFlags := []string{"--database-ca-file", file("ca.crt"), "--database-cert-file", file("client.crt"), "--database-key-file", file("client.key")}

		By("a server whose certificate another CA signed is refused, naming why")
		table := "public." + testenv.UniqueName("tls_outbox")
		refused := start("migrate", "--database-url", url, "--table", table, "--database-ca-file", file("wrong-ca.crt"))
		Eventually(refused, 30*time.Second).Should(gexec.Exit())
		Expect(refused.ExitCode()).NotTo(BeZero())
		Expect(string(refused.Err.Contents())).To(ContainSubstring("certificate signed by unknown authority"))

		By("migrate, then drain, over TLS with the client certificate")
		migrated := start(append([]string{"migrate", "--database-url", url, "--table", table}, certFlags...)...)
		Eventually(migrated, 30*time.Second).Should(gexec.Exit(0))
		db, err := pgxpool.New(ctx, url+"?sslmode=verify-full&sslrootcert="+file("ca.crt"))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(db.Close)
		DeferCleanup(func(ctx SpecContext) { _, _ = db.Exec(ctx, "DROP TABLE IF EXISTS "+table) })
		suite.DB{Pool: db}.Seed(ctx, table, 1000)
		want := suite.DB{Pool: db}.IDs(ctx, table, "true")
		ch, topo := topology()
		drainer := "tls-" + testenv.UniqueName("d")
		start(append([]string{"drain", "--database-url", url, "--broker-url", testenv.BrokerURL(), "--table", table,
			"--exchange", topo.Exchange, "--drainer-id", drainer, "--metrics-addr", ""}, certFlags...)...)
		Eventually(func() int { return suite.DB{Pool: db}.Count(ctx, table, "published_at IS NULL") }, time.Minute).Should(BeZero())
		missing, _ := suite.Undelivered(ch, topo.Queue, want, time.Minute)
		Expect(missing).To(BeEmpty())

		var sessions int
		Expect(db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid)
			WHERE application_name = $1 AND ssl AND client_dn LIKE '%CN=guest'`, "spillway-drainer/"+drainer).Scan(&sessions)).To(Succeed())
		Expect(sessions).To(BeNumerically(">", 0), "the drainer's sessions are TLS, with its client certificate")
	})
})
