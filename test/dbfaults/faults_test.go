package dbfaults

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/faultwatch"
	"github.com/spillway-io/spillway/test/pgha"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("A primary with a synchronous streaming replica, reached by a multi-host URL", Serial, func() {
	It("loses no event through a switchover, and settles on the new primary the claims taken on the old", func(ctx SpecContext) {
		f, _, w := drainingFleet(ctx, "switchover", pgha.URL("postgres"))

		at := serverNow(ctx)
		w.Fault("switchover: the primary stopped cleanly, the replica promoted")
		w.Timeline.Mark("primary now on %s, the old one its replica", ha("switchover"))
		Eventually(func() int { return f.settledAcross(ctx, at) }, time.Minute, 200*time.Millisecond).Should(BeNumerically(">", 0))
		w.Timeline.Mark("%d rows claimed on the old primary were marked on the new one, fenced on their claim", f.settledAcross(ctx, at))
		f.finish(ctx, w, "1. switchover (synchronous replication)")
	})

	It("loses no event when the primary is killed with kill -9 and the replica promoted", func(ctx SpecContext) {
		f, d, w := drainingFleet(ctx, "crash", pgha.URL("postgres"))

		w.Fault("kill -9 of the primary, the replica promoted")
		w.Timeline.Mark("primary now on %s", ha("crash"))
		// Synchronous commits wait for a replica: the application's do,
		// the drainer's (asynchronous) do not.
		ha("rejoin")
		w.Timeline.Mark("the crashed node rebuilt as the new primary's replica")
		d.waitDraining(backlogRows / 2)
		lost, _ := testenv.Metric(d.addr, "spillway_drainer_lease_lost_rows_total")
		w.Timeline.Mark("%g rows whose claim the crash lost were left alone by their settle, fenced on it, to be published again", lost)
		f.finish(ctx, w, "2. primary killed (kill -9), replica promoted")
	})

	It("leaves a demoted primary that still answers, read-only, for the new one: no loop, no mark, no attempt", func(ctx SpecContext) {
		f, d, w := drainingFleet(ctx, "demoted", pgha.URL("postgres"))
		// The operator's read, with a session left on the primary to be
		// demoted.
		reader := outbox.NewReader(5 * time.Second)
		DeferCleanup(reader.Close)
		backlog := func() int64 {
			h, err := reader.ReadHealth(ctx, pgha.URL("postgres"), outbox.HealthRead{Spec: f.spec, MaxAttempts: 10, CountLimit: 1_000_000})
			Expect(err).NotTo(HaveOccurred())
			return h.Status.Backlog
		}
		frozen := backlog()

		w.Fault("the primary demoted, read-only and reachable; the replica promoted")
		w.Timeline.Mark("primary now on %s", ha("demote"))
		published := func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_published_rows_total") }
		before, err := published()
		Expect(err).NotTo(HaveOccurred())
		Eventually(published, 30*time.Second, 50*time.Millisecond).Should(BeNumerically(">", before+1000), "draining from the new primary")
		w.Timeline.Mark("draining from the new primary while the old one answers read-only")
		Expect(backlog()).To(BeNumerically("<", frozen-1000), "the operator's read left its session on the demoted primary, whose rows stand still")
		w.Timeline.Mark("the operator's read moved to the new primary too")
		errors, _ := testenv.Metric(d.addr, `spillway_drainer_statement_errors_total{sqlstate="connection",statement="claim"}`)
		Expect(errors).To(BeNumerically("<", 20), "a read-only answer is tried again at a poll's pace, not in a loop")
		ha("rejoin")
		w.Timeline.Mark("the demoted node rebuilt as the new primary's replica")
		f.finish(ctx, w, "3. primary demoted, left reachable read-only")
	})
})

var _ = Describe("PgBouncer in transaction mode", Serial, func() {
	It("drains the whole backlog through the pooler, woken, capped and ordered through a direct session", func(ctx SpecContext) {
		// The drainers' own sessions go to the primary as another user,
		// so that what reaches Postgres through the pooler can be told
		// apart. What the pooler costs in rate is make bench's (its pooler
		// section): a timed spec would judge the machine's noise.
		pooled := []string{"--database-pool-mode", "transaction", "--database-direct-url", pgha.URL("root"), "--max-rate", "1000000", "--wake-coalesce", "8ms"}
		f := newFleet(ctx, true)
		installNotify(ctx, f)
		start := time.Now()
		a := f.drain("pooled-a", pgha.Pooled("test_tx"), pooled...)
		b := f.drain("pooled-b", pgha.Pooled("test_tx"), pooled...)
		for _, d := range []drainer{a, b} {
			Eventually(func() (float64, error) {
				return testenv.Metric(d.addr, "spillway_drainer_rate_share_events_per_second")
			}, 30*time.Second).
				Should(Equal(500000.0), "two drainers counted each other on their direct sessions")
			Eventually(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_listening") }, 30*time.Second).Should(Equal(1.0))
		}
		w := f.watch(a, pgha.Pooled("test_tx"))
		w.Fault("draining through PgBouncer in transaction mode")
		Expect(sessionState(ctx, "postgres")).To(BeEmpty(), "no LISTEN and no advisory lock through the pooler")
		Expect(sessionState(ctx, "root")).To(ContainElement(HavePrefix("LISTEN")), "the LISTEN on the direct session")
		backlogDrained(ctx, f, start)
		f.finish(ctx, w, "4. drained through PgBouncer, transaction mode")
		Expect(ordered(ctx, f)).To(Succeed())
	})

	It("polls through the pooler without a direct URL, with no session state, and drains every row", func(ctx SpecContext) {
		f := newFleet(ctx, false)
		d := f.drain("polling", pgha.Pooled("test_tx"), "--database-pool-mode", "transaction", "--poll-interval", "200ms")
		w := f.watch(d, pgha.Pooled("test_tx"))
		w.Fault("no direct URL: polling every 200ms")
		Eventually(d.session.Err, 10*time.Second).Should(gbytes.Say("Not listening for notifications: polling every --poll-interval"))
		d.waitDraining(2000)
		Expect(sessionState(ctx, "postgres")).To(BeEmpty(), "no LISTEN and no advisory lock anywhere")
		f.finish(ctx, w, "PgBouncer transaction mode, polling")
	})

	It("loses no event while the pooler is paused and resumed, reconnects its servers and restarts", func(ctx SpecContext) {
		f, d, w := drainingFleet(ctx, "paused", pgha.Pooled("test_tx"), "--database-pool-mode", "transaction")

		w.Fault("PAUSE")
		ha("pgbouncer", "pause")
		time.Sleep(5 * time.Second)
		ha("pgbouncer", "resume")
		w.Timeline.Mark("RESUME")
		progress(d)
		w.Fault("RECONNECT")
		ha("pgbouncer", "reconnect")
		progress(d)
		w.Fault("restart")
		ha("pgbouncer", "restart")
		w.Timeline.Mark("PgBouncer back")
		f.finish(ctx, w, "5. PgBouncer PAUSE/RESUME, RECONNECT, restart")
	})

	It("loses no event when the pooler kills every server connection", func(ctx SpecContext) {
		f, _, w := drainingFleet(ctx, "killed", pgha.Pooled("test_tx"), "--database-pool-mode", "transaction")

		w.Fault("KILL test_tx: every client and server connection dropped")
		ha("pgbouncer", "kill", "test_tx")
		time.Sleep(2 * time.Second)
		ha("pgbouncer", "resume", "test_tx")
		w.Timeline.Mark("RESUME")
		f.finish(ctx, w, "6. PgBouncer KILL of every server connection")
	})
})

// drainingFleet starts a fleet, one drainer through url, and the watch of
// it, once the drainer is draining: the fault lands mid-drain.
func drainingFleet(ctx context.Context, name, url string, extra ...string) (*fleet, drainer, *faultwatch.Watch) {
	f := newFleet(ctx, false)
	d := f.drain(name, url, extra...)
	d.waitDraining(2000)
	return f, d, f.watch(d, url)
}

// installNotify adds the notify trigger to the fleet's table.
func installNotify(ctx context.Context, f *fleet) {
	s := suite.Start(spillway, "migrate", "--database-url", pgha.URL("postgres"), "--table", f.spec.Name,
		"--ordering-key-column", f.spec.Ordering.KeyColumn, "--notify")
	Eventually(s, 30*time.Second).Should(gexec.Exit(0))
}

// backlogDrained waits until every row written before start is published.
func backlogDrained(ctx context.Context, f *fleet, start time.Time) {
	Eventually(func() int {
		return suite.DB{Pool: pool}.Count(ctx, f.spec.Name, "published_at IS NULL AND enqueued_at < $1", start)
	}, 3*time.Minute, 20*time.Millisecond).Should(BeZero())
}

// sessionState lists what user's sessions on the primary hold that would
// not survive a transaction pooler.
func sessionState(ctx context.Context, user string) []string {
	held, err := pgha.SessionState(ctx, pool, user)
	Expect(err).NotTo(HaveOccurred())
	return held
}

// progress waits until the drainer publishes again.
func progress(d drainer) {
	before, err := testenv.Metric(d.addr, "spillway_drainer_published_rows_total")
	Expect(err).NotTo(HaveOccurred())
	Eventually(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_published_rows_total") }, time.Minute, 50*time.Millisecond).
		Should(BeNumerically(">", before+500))
}

// ordered checks that each key's seeded rows were published in seq order:
// the ordered claim lets a key's next row go only once its head is settled,
// so the marks of one key come one after the other.
func ordered(ctx context.Context, f *fleet) error {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM `+f.spec.Name+` a JOIN `+f.spec.Name+` b
		ON a.aggregate_id = b.aggregate_id AND (a.payload->>'seq')::int < (b.payload->>'seq')::int
		WHERE a.payload ? 'seq' AND b.payload ? 'seq' AND a.published_at >= b.published_at`).Scan(&n)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d pairs of seeded rows of one key were published out of their order", n)
	}
	return nil
}
