package e2e

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/pgha"
	"github.com/spillway-io/spillway/test/testenv"
)

// harbor is the namespace of the fleet on the failing-over Postgres.
const harbor = "harbor"

// describeDatabaseFailover is the journey's fleet on a primary with a
// synchronous streaming replica (hack/postgres-ha.sh), its URL listing both
// with target_session_attrs=read-write, ordered per key, woken by the
// notify trigger and capped by maxRate. The primary is killed and the
// replica promoted; then the fleet is moved behind PgBouncer in transaction
// mode, with its own sessions on a direct URL, and drains through it. Each
// prints the OutboxDrainer's Ready condition as it changed, and accounts
// for every event by message_id.
func describeDatabaseFailover(env *journey) {
	Describe("a fleet on a failing-over Postgres, then behind PgBouncer in transaction mode", Ordered, func() {
		var (
			db     *pgxpool.Pool
			outbox testenv.Outbox
			ledger *testenv.Ledger
		)
		key := client.ObjectKey{Namespace: harbor, Name: fleetName}
		BeforeAll(func(ctx SpecContext) {
			if missing := pgha.Missing(); missing != "" {
				if pgha.InCI() {
					Fail(missing)
				}
				Skip(missing)
			}
			for _, args := range [][]string{{"up", "sync"}, {"pgbouncer", "up"}} {
				_, err := pgha.Script(args...)
				Expect(err).NotTo(HaveOccurred())
			}
			DeferCleanup(func() { _, _ = pgha.Script("down") })
			var err error
			db, err = pgha.Pool(ctx, pgha.URL("postgres"))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(db.Close)
			namespace(ctx, harbor)

			spec := outboxSpec(ctx, db)
			outbox = testenv.Outbox{DB: db, Table: spec.Name}
			ch, err := services.Broker.Channel()
			Expect(err).NotTo(HaveOccurred())
			topo, err := testenv.DeclareTopology(ch, "#", nil)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { topo.Delete(ch); _ = ch.Close() })
			ledger, err = testenv.StartLedger(services.Broker, topo.Queue)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(ledger.Stop)

			manifests, err := testenv.SampleFleet(outbox.Table, topo.Exchange, "1s", func(spec map[string]any) {
				spec["ordering"] = map[string]any{"keyColumn": "aggregate_id"}
				spec["maxRate"] = int64(100_000)
			})
			Expect(err).NotTo(HaveOccurred())
			manifests = strings.Replace(manifests, testenv.DatabaseURL(), pgha.URL("postgres"), 1)
			out, err := runWithInput(manifests, "kubectl", "apply", "--namespace", harbor, "-f", "-")
			Expect(err).NotTo(HaveOccurred(), out)
			DeferCleanup(func(ctx SpecContext) {
				mustRun("kubectl", "delete", "outboxdrainer", fleetName, "--namespace", harbor)
				Eventually(func() int { return len(pods(ctx, harbor, drainerLabels)) }, 2*time.Minute).Should(BeZero())
			})
			Eventually(func() []string { return readyPods(ctx, harbor, drainerLabels) }, 2*time.Minute, 200*time.Millisecond).Should(HaveLen(2))
		})

		// dbFault runs a fault on the fleet under a burst and a steady flow,
		// with the Ready condition on the timeline, and requires that it
		// lost nothing.
		dbFault := func(ctx context.Context, name string, inject func(context.Context, *fault)) {
			var ready *readyWatch
			f := runFault(ctx, name, outbox, ledger, func(ctx context.Context, f *fault) {
				ready = watchReady(ctx, f.timeline, key)
				inject(ctx, f)
			})
			ready.stop()
			f.notes = append(f.notes, "Ready condition: "+ready.seen())
			env.faults = append(env.faults, f)
			Expect(f.lost).To(BeEmpty(), "events lost:\n%s", f.timeline)
		}

		It("loses no event when the primary is killed with kill -9 and the replica promoted", func(ctx SpecContext) {
			dbFault(ctx, "Postgres primary killed (kill -9), replica promoted", func(ctx context.Context, f *fault) {
				f.inject("kill -9 of the primary, then the replica promoted")
				primary, err := pgha.Script("crash")
				Expect(err).NotTo(HaveOccurred())
				f.note("primary now on %s", primary)
				// The application's synchronous commits wait for a replica.
				_, err = pgha.Script("rejoin")
				Expect(err).NotTo(HaveOccurred())
				f.note("the crashed node rebuilt as the new primary's replica")
				Eventually(func() metav1.ConditionStatus { return readyOf(ctx, key).Status }, 2*time.Minute, 200*time.Millisecond).
					Should(Equal(metav1.ConditionTrue))
			})
		})

		It("drains through PgBouncer in transaction mode, with its own sessions on a direct URL and none through the pooler", func(ctx SpecContext) {
			// PgBouncer follows the primary only when told: after the
			// failover, it is pointed at the new one.
			_, err := pgha.Script("pgbouncer", "up")
			Expect(err).NotTo(HaveOccurred())
			before := readyPods(ctx, harbor, drainerLabels)
			// The pooler's URL in a Secret of its own, and the fleet moved to
			// it and to transaction mode in one change: the running drainers
			// keep the URL they were started for until they are replaced.
			secrets := secretManifest("orders-db-pgbouncer", pgha.Pooled("test_tx")) + "\n---\n" + secretManifest("orders-db-direct", pgha.URL("root"))
			out, err := runWithInput(secrets, "kubectl", "apply", "--namespace", harbor, "-f", "-")
			Expect(err).NotTo(HaveOccurred(), out)
			mustRun("kubectl", "patch", "outboxdrainer", fleetName, "--namespace", harbor, "--type=merge", "-p",
				`{"spec":{"database":{"urlSecretRef":{"name":"orders-db-pgbouncer","key":"url"},"pooler":{"mode":"Transaction","directURLSecretRef":{"name":"orders-db-direct","key":"url"}}}}}`)
			waitPodsArgs(ctx, harbor, before, ContainElements("--database-pool-mode=transaction",
				"--database-direct-url-file=/var/run/secrets/spillway/database-direct/url"))
			dbFault(ctx, "the whole drain through PgBouncer, transaction mode", func(ctx context.Context, f *fault) {
				f.inject("draining through PgBouncer's test_tx, pool_mode = transaction")
				Eventually(func() ([]string, error) { return pgha.SessionState(ctx, db, "root") }, time.Minute, 200*time.Millisecond).
					Should(ContainElements(HavePrefix("LISTEN"), HavePrefix("advisory lock")), "the drainers listen and join the roster on their direct sessions")
				Expect(pgha.SessionState(ctx, db, "postgres")).To(BeEmpty(), "no LISTEN and no advisory lock through the pooler")
				f.note("LISTEN and the roster's locks on the direct URL's sessions only")
			})
			Eventually(func() []map[string]string { _, rows := getOutboxDrainers(harbor); return rows }, time.Minute, time.Second).
				Should(ContainElement(And(HaveKeyWithValue("NAME", fleetName), HaveKeyWithValue("READY", "True"), HaveKeyWithValue("BACKLOG", "0"))))
			out, _ = getOutboxDrainers(harbor)
			AddReportEntry("kubectl get outboxdrainers, behind PgBouncer", out)
		})
	})
}

// outboxSpec migrates a fresh outbox on db ordered on aggregate_id, which
// the application's rows fill with one of 500 keys, with the notify
// trigger, dropped when the journey ends.
func outboxSpec(ctx context.Context, db *pgxpool.Pool) outbox.TableSpec {
	spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("ha_outbox")}
	_, err := outbox.Migrate(ctx, db, spec)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) {
		_, err := db.Exec(ctx, "DROP TABLE IF EXISTS "+spec.Name)
		Expect(err).NotTo(HaveOccurred())
	})
	_, err = db.Exec(ctx, "ALTER TABLE "+spec.Name+" ADD COLUMN aggregate_id text DEFAULT 'k' || floor(random() * 500)::int")
	Expect(err).NotTo(HaveOccurred())
	spec.Ordering = outbox.Ordering{KeyColumn: "aggregate_id"}
	_, err = outbox.Migrate(ctx, db, spec)
	Expect(err).NotTo(HaveOccurred())
	_, err = outbox.InstallNotifyTrigger(ctx, db, spec)
	Expect(err).NotTo(HaveOccurred())
	return spec
}

// secretManifest is a Secret holding url under the key url.
func secretManifest(name, url string) string {
	return `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"` + name + `"},"stringData":{"url":"` + url + `"}}`
}
