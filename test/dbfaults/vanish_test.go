package dbfaults

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/netsplit"
	"github.com/spillway-io/spillway/test/pgha"
)

var _ = Describe("A drainer's host and its database's, parted by a link that goes dead without a word", Serial, func() {
	It("has the server end the vanished drainer's sessions, and its hush with them, and the drainer end its LISTEN on the vanished server, within a minute", func(ctx SpecContext) {
		if missing := netsplit.Missing(); missing != "" {
			if pgha.InCI() {
				Fail(missing)
			}
			Skip(missing)
		}
		server, err := netsplit.Start(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(server.Stop)
		local, err := server.Local(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(local.Close)
		spec := outbox.TableSpec{Name: "public.outbox"}
		_, err = outbox.Migrate(ctx, local, spec)
		Expect(err).NotTo(HaveOccurred())
		_, err = outbox.InstallNotifyTrigger(ctx, local, spec)
		Expect(err).NotTo(HaveOccurred())

		// The drainer's own sessions, as a drainer opens them.
		drainerPool, opts, closeAll, err := outbox.ConnectDrainer(ctx, secret.URLSource{URL: server.URL}, outbox.Pooling{}, "vanishing", false)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(closeAll)
		store, err := outbox.OpenStore(ctx, drainerPool, spec, opts...)
		Expect(err).NotTo(HaveOccurred())
		hush := store.NotifyHush(spec)
		Expect(hush.Hush(ctx)).To(Succeed())
		Expect(hush.Held()).To(BeTrue())
		DeferCleanup(hush.Close)
		listening, lost := make(chan struct{}), make(chan error, 1)
		listenCtx, stopListening := context.WithCancel(context.Background())
		DeferCleanup(stopListening)
		go func() { lost <- store.Listen(listenCtx, spec, func() { close(listening) }, func() {}) }()
		Eventually(listening, 10*time.Second).Should(BeClosed())
		Expect(drainerSessions(ctx, local)).To(BeNumerically(">=", 2), "the hush's session and the LISTEN session")
		Expect(advisoryLocks(ctx, local)).To(Equal(1), "the hush")
		Expect(wakesListener(ctx, local, spec, 2*time.Second)).To(BeFalse(), "while the drainer hushes them, commits notify no one")

		Expect(server.Cut(ctx)).To(Succeed())
		cut := time.Now()
		var listenErr error
		Eventually(lost, time.Minute).Should(Receive(&listenErr), "the drainer's LISTEN session on the vanished server")
		Expect(listenErr).To(HaveOccurred())
		clientNoticed := time.Since(cut)
		Eventually(func(ctx SpecContext) int { return drainerSessions(ctx, local) }).WithContext(ctx).
			WithTimeout(time.Minute).WithPolling(time.Second).Should(BeZero(), "the vanished drainer's sessions on the server")
		serverNoticed := time.Since(cut)
		Eventually(func(ctx SpecContext) int { return advisoryLocks(ctx, local) }).WithContext(ctx).
			WithTimeout(10*time.Second).Should(BeZero(), "the vanished drainer's hush")
		Expect(wakesListener(ctx, local, spec, 10*time.Second)).To(BeTrue(), "with the hush gone, a commit wakes the rest of the fleet")
		GinkgoWriter.Printf("link cut: the drainer ended its LISTEN session after %s, the server the drainer's sessions after %s\n",
			clientNoticed.Round(time.Second), serverNoticed.Round(time.Second))
	}, SpecTimeout(4*time.Minute))
})

// drainerSessions counts the sessions the server still keeps for a drainer.
func drainerSessions(ctx context.Context, db *pgxpool.Pool) int {
	var n int
	Expect(db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'spillway-drainer/%'").Scan(&n)).To(Succeed())
	return n
}

// advisoryLocks counts the advisory locks held on the server, where only
// the drainer's hush takes any.
func advisoryLocks(ctx context.Context, db *pgxpool.Pool) int {
	var n int
	Expect(db.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").Scan(&n)).To(Succeed())
	return n
}

// wakesListener inserts a row into spec's table and reports whether a
// session listening on its channel was notified within wait: an absence
// has nothing to wait for but the time, a notification ends the wait as it
// comes.
func wakesListener(ctx context.Context, db *pgxpool.Pool, spec outbox.TableSpec, wait time.Duration) bool {
	conn, err := db.Acquire(ctx)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Release()
	_, err = conn.Exec(ctx, spec.Listen().SQL)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN *") }()
	_, err = db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload) VALUES ('vanish', '{}')")
	Expect(err).NotTo(HaveOccurred())
	waiting, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	_, err = conn.Conn().WaitForNotification(waiting)
	return err == nil
}
