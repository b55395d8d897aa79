package drainer

import (
	"context"
	"io"
	"log/slog"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

// secretDir is a Secret volume as the kubelet lays it out: the file is a
// symlink through ..data, which points at a timestamped directory, and an
// update swaps ..data atomically.
type secretDir struct{ dir string }

func newSecretDir(url string) *secretDir {
	s := &secretDir{dir: GinkgoT().TempDir()}
	s.write(url)
	Expect(os.Symlink(filepath.Join("..data", "url"), filepath.Join(s.dir, "url"))).To(Succeed())
	return s
}

func (s *secretDir) file() string { return filepath.Join(s.dir, "url") }

// write puts url into a new timestamped directory and swaps ..data to it.
func (s *secretDir) write(url string) {
	ts, err := os.MkdirTemp(s.dir, "..2026_")
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(ts, "url"), []byte(url+"\n"), 0o400)).To(Succeed())
	tmp := filepath.Join(s.dir, "..data_tmp")
	Expect(os.Symlink(filepath.Base(ts), tmp)).To(Succeed())
	Expect(os.Rename(tmp, filepath.Join(s.dir, "..data"))).To(Succeed())
}

// rabbitmqctl runs one rabbitmqctl command and returns its output.
func rabbitmqctl(args ...string) string {
	out, err := osexec.Command("rabbitmqctl", args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "rabbitmqctl %v: %s", args, out)
	return string(out)
}

var _ = Describe("Rotated connection Secrets", Label(tier.DB, tier.Broker), func() {
	It("follows a changed database URL file and broker URL file without a restart, losing nothing", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		ch := amqpChannel()

		role := testenv.UniqueName("spillway_rotated")
		db.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		db.Exec(ctx, "GRANT SELECT, UPDATE ON "+spec.Name+" TO "+role)
		DeferCleanup(func(ctx SpecContext) {
			db.Exec(ctx, "REVOKE ALL ON "+spec.Name+" FROM "+role)
			db.Exec(ctx, "DROP ROLE IF EXISTS "+role)
		})
		users := []string{testenv.UniqueName("spillway_first"), testenv.UniqueName("spillway_second")}
		for _, u := range users {
			rabbitmqctl("add_user", u, "pw-"+u)
			DeferCleanup(func() { rabbitmqctl("delete_user", u) })
			rabbitmqctl("set_permissions", u, ".*", ".*", ".*")
		}
		brokerURL := func(user string) string { return "amqp://" + user + ":pw-" + user + "@127.0.0.1:5672/" }

		database, broker := newSecretDir(testenv.DatabaseURL()), newSecretDir(brokerURL(users[0]))
		id := testenv.UniqueName("rotating")
		cfg := testConfig(id, spec, topo.Exchange)
		cfg.Database, cfg.Broker.URLSource = secret.URLSource{File: database.file()}, secret.URLSource{File: broker.file()}
		dbPool, err := outbox.ConnectPool(ctx, cfg.Database, outbox.PoolOptions{DrainerID: id})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(dbPool.Close)
		store, err := outbox.OpenStore(ctx, dbPool, spec)
		Expect(err).NotTo(HaveOccurred())
		d, err := New(cfg, store, NewMetrics(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
		Expect(err).NotTo(HaveOccurred())
		(&running{Drainer: d}).start()

		db.Seed(ctx, spec.Name, 500)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		// Who the drainer's sessions are, its LISTEN session aside: that one
		// only wakes it, and polling covers for it.
		sessionUsers := func() []string {
			return strings.Fields(strings.Join(queryStrings(ctx,
				"SELECT usename FROM pg_stat_activity WHERE application_name = $1 AND query NOT LIKE 'LISTEN%'", "spillway-drainer/"+id), " "))
		}
		brokerUsers := func() string {
			return rabbitmqctl("list_connections", "user", "client_properties", "--silent")
		}
		Expect(sessionUsers()).To(ContainElement("postgres"))
		Eventually(brokerUsers, 10*time.Second).Should(MatchRegexp(users[0] + `\s.*spillway-drainer/` + id))

		database.write("postgres://" + role + "@127.0.0.1:5432/test?sslmode=disable")
		broker.write(brokerURL(users[1]))
		db.Seed(ctx, spec.Name, 500)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Eventually(sessionUsers, 10*time.Second, 100*time.Millisecond).Should(And(Not(BeEmpty()), HaveEach(role)),
			"the old database sessions are gone, the new ones are the rotated role's")
		Eventually(brokerUsers, 10*time.Second, 500*time.Millisecond).Should(And(
			MatchRegexp(users[1]+`\s.*spillway-drainer/`+id), Not(MatchRegexp(users[0]+`\s.*spillway-drainer/`+id))))
		Expect(testenv.QueueDepth(ch, topo.Queue)).To(BeNumerically(">=", 1000), "every row published, none lost")
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero(), "a rotation counts no attempt")
	})
})

// queryStrings returns the first column of a query's rows.
func queryStrings(ctx context.Context, sql string, args ...any) []string {
	rows, err := pool.Query(ctx, sql, args...)
	Expect(err).NotTo(HaveOccurred())
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		Expect(rows.Scan(&s)).To(Succeed())
		out = append(out, s)
	}
	return out
}
