package drainer

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("Fast wake-up", Label(tier.DB, tier.Broker), func() {
	It("publishes an inserted row well under a second with the notify trigger, while the poll is 10 s", func(ctx SpecContext) {
		notified, polled := db.CanonicalOutbox(ctx), db.CanonicalOutbox(ctx)
		_, err := outbox.InstallNotifyTrigger(ctx, pool, notified)
		Expect(err).NotTo(HaveOccurred())
		topo := topology("#", nil)
		var drainers []*running
		for _, spec := range []outbox.TableSpec{notified, polled} {
			cfg := testConfig(testenv.UniqueName("drainer"), spec, topo.Exchange)
			cfg.PollInterval = 10 * time.Second
			drainers = append(drainers, startDrainer(ctx, cfg))
		}
		for _, d := range drainers {
			// Listening, and past their first claim, which waits for the
			// LISTEN: both now sit in the 10 s poll, and only a
			// notification can wake them.
			Eventually(func() float64 { return testutil.ToFloat64(d.metrics.Listening) }, drainTimeout).Should(Equal(1.0))
			Eventually(func() uint64 { return histogramCount(d.reg, "spillway_drainer_claim_duration_seconds") }, drainTimeout).Should(BeNumerically(">=", 1))
		}

		start := time.Now()
		db.Seed(ctx, notified.Name, 1)
		Eventually(func() int { return db.Count(ctx, notified.Name, "published_at IS NOT NULL") }, time.Second, 5*time.Millisecond).Should(Equal(1))
		GinkgoWriter.Printf("insert to published: %s\n", time.Since(start))

		db.Seed(ctx, polled.Name, 1)
		Consistently(func() int { return db.Count(ctx, polled.Name, "published_at IS NOT NULL") }, time.Second).Should(BeZero(),
			"without the trigger the row waits for the poll: the fast path above was the notification")
	})

	// notifiedDrainer starts a drainer on a table with the notify trigger and
	// a 10 s poll, and waits until only a notification can wake it.
	notifiedDrainer := func(ctx SpecContext, coalesce time.Duration) (outbox.TableSpec, *running) {
		spec := db.CanonicalOutbox(ctx)
		_, err := outbox.InstallNotifyTrigger(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		cfg := testConfig(testenv.UniqueName("drainer"), spec, topology("#", nil).Exchange)
		cfg.PollInterval, cfg.WakeCoalesce = 10*time.Second, coalesce
		d := startDrainer(ctx, cfg)
		Eventually(func() float64 { return testutil.ToFloat64(d.metrics.Listening) }, drainTimeout).Should(Equal(1.0))
		Eventually(func() uint64 { return histogramCount(d.reg, "spillway_drainer_claim_duration_seconds") }, drainTimeout).Should(BeNumerically(">=", 1))
		return spec, d
	}

	It("claims a notification after a quiet spell at once, however long the coalescing window", func(ctx SpecContext) {
		const coalesce = 2 * time.Second
		spec, _ := notifiedDrainer(ctx, coalesce)
		time.Sleep(coalesce) // the quiet spell: the last claim is a window ago
		db.Seed(ctx, spec.Name, 1)
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, coalesce/2, 5*time.Millisecond).Should(Equal(1),
			"a wake-up after a quiet spell does not wait out the coalescing window")
	})

	It("shares claims among a stream of commits, one claim per coalescing window at most", func(ctx SpecContext) {
		const coalesce, every, commits = 250 * time.Millisecond, 10 * time.Millisecond, 250
		spec, d := notifiedDrainer(ctx, coalesce)
		before := histogramCount(d.reg, "spillway_drainer_claim_duration_seconds")
		start := time.Now()
		for i := range commits {
			time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
			db.Seed(ctx, spec.Name, 1) // one transaction, one notification
		}
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(commits))
		stream := time.Since(start)
		claims := histogramCount(d.reg, "spillway_drainer_claim_duration_seconds") - before
		GinkgoWriter.Printf("%d commits over %s drained in %d claims\n", commits, stream.Round(time.Millisecond), claims)
		// Each window's claim may be followed by one more for the commits
		// that skipped notifying while another transaction notified.
		Expect(claims).To(BeNumerically("<=", 2*uint64(stream/coalesce)+2),
			"a claim per notification would be about %d claims", commits)
	})

	It("hushes the notifications while a stream of commits keeps it claiming, and lets go when the stream stops or it does", func(ctx SpecContext) {
		const coalesce, every, commits = 100 * time.Millisecond, 10 * time.Millisecond, 200
		spec, d := notifiedDrainer(ctx, coalesce)
		// A listener of the test's own counts what the commits notify.
		listener, err := pgx.Connect(ctx, testenv.DatabaseURL())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = listener.Close(context.Background()) })
		_, err = listener.Exec(ctx, spec.Listen().SQL)
		Expect(err).NotTo(HaveOccurred())
		var notified atomic.Int64
		listenCtx, stopListening := context.WithCancel(context.Background())
		listening := make(chan struct{})
		go func() {
			defer close(listening)
			for listenCtx.Err() == nil {
				if _, err := listener.WaitForNotification(listenCtx); err == nil {
					notified.Add(1)
				}
			}
		}()
		DeferCleanup(func() { stopListening(); <-listening })

		// The drainer's hush, as Postgres sees it: its shared hold on the
		// trigger's lock.
		hushes := func() int {
			return db.Count(ctx, "pg_locks", `locktype = 'advisory' AND mode = 'ShareLock' AND granted
				AND classid::bigint = hashtext('spillway.notify')::bigint & 4294967295 AND objid::bigint = hashtext($1)::bigint & 4294967295`, spec.NotifyChannel())
		}

		start := time.Now()
		var duringStream int64
		counted := -1 // the first commit counted: the stream is under way, and hushed
		committed := make([]time.Time, commits)
		// unhushed counts the counted commits after which the drainer held
		// no hush: on a busy machine a hush's try can meet a notifying
		// commit and fail, and then commits notify until the next window.
		unhushed := 0
		for i := range commits {
			if counted < 0 && i >= commits/4 && hushes() == 1 {
				counted, duringStream = i, notified.Load()
			}
			time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
			db.Seed(ctx, spec.Name, 1)
			committed[i] = time.Now()
			if counted >= 0 && hushes() == 0 {
				unhushed++
			}
		}
		Expect(counted).To(BeNumerically(">=", 0), "the drainer hushed the stream")
		duringStream = notified.Load() - duringStream
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout).Should(Equal(commits))
		// A gap in the commits as long as a window, the test itself
		// stalled, is the stream stopping: a claim finds nothing, the
		// drainer lets go, and the next commit notifies before it hushes
		// again.
		stops := 0
		for i := counted + 1; i < commits; i++ {
			if committed[i].Sub(committed[i-1]) >= coalesce {
				stops++
			}
		}
		GinkgoWriter.Printf("%d of the last %d commits of the stream notified; %d came while no hush was held; the stream stopped %d times\n",
			duringStream, commits-counted, unhushed, stops)
		Expect(duringStream).To(BeNumerically("<", commits/20+2*stops+unhushed),
			"a drainer claiming every window on its own hushes the commits' notifications")

		By("after the stream, the drainer lets go, commits notify again and a lone one is claimed at once")
		Eventually(hushes, drainTimeout).Should(BeZero())
		before := notified.Load()
		db.Seed(ctx, spec.Name, 1)
		Eventually(notified.Load, time.Second, 5*time.Millisecond).Should(BeNumerically(">", before))
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, time.Second, 5*time.Millisecond).Should(Equal(commits + 1))

		By("a drainer that stops while hushed leaves no hush behind")
		streaming, streamed := make(chan struct{}), make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(streamed)
			for {
				select {
				case <-streaming:
					return
				case <-time.After(every):
					db.Seed(ctx, spec.Name, 1)
				}
			}
		}()
		Eventually(hushes, drainTimeout).Should(Equal(1), "the drainer hushes the new stream")
		d.stop()
		Eventually(d.exited, 30*time.Second).Should(BeClosed())
		close(streaming)
		<-streamed
		Expect(hushes()).To(BeZero())
		before = notified.Load()
		db.Seed(ctx, spec.Name, 1)
		Eventually(notified.Load, time.Second, 5*time.Millisecond).Should(BeNumerically(">", before))
	})
})

var _ = Describe("Retention", Label(tier.DB, tier.Broker), func() {
	It("deletes only what its windows allow", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		// A live lease is a claim whose due time is still ahead: the lease's end.
		db.Exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload, enqueued_at, published_at, claimed_at, claimed_by, attempts) VALUES
			('old.published',   '{}', now() - interval '3 hours', now() - interval '2 hours', NULL, NULL, 0),
			('young.published', '{}', now() - interval '3 hours', now() - interval '30 minutes', NULL, NULL, 0),
			('old.poisoned',    '{}', now() - interval '5 days', NULL, NULL, NULL, 10),
			('old.leased',      '{}', now() - interval '5 days', NULL, now(), 'drainer-z', 0),
			('young.poisoned',  '{}', now() - interval '1 hour', NULL, NULL, NULL, 10)`)
		db.Exec(ctx, "UPDATE "+spec.Name+" SET available_at = now() + interval '30 seconds' WHERE event_type = 'old.leased'")
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		published, unpublished := time.Hour, 24*time.Hour
		cfg.Retention = Retention{Published: &published, UnpublishedMaxAge: &unpublished, Interval: 50 * time.Millisecond, BatchSize: 1}
		d := startDrainer(ctx, cfg)

		Eventually(func() int { return db.Count(ctx, spec.Name, "true") }, drainTimeout).Should(Equal(3))
		Consistently(func() []string { return eventTypes(ctx, spec.Name) }, 300*time.Millisecond).
			Should(ConsistOf("young.published", "old.leased", "young.poisoned"),
				"a published row inside its window, a row under a live lease, a pending row inside unpublishedMaxAge")
		Expect(testutil.ToFloat64(d.metrics.Pruned.WithLabelValues("published"))).To(Equal(1.0))
		Expect(testutil.ToFloat64(d.metrics.Pruned.WithLabelValues("unpublished"))).To(Equal(1.0))
	})

	It("refuses an unpublishedMaxAge on a table without an enqueued-at column", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("bare_outbox")
		db.Exec(ctx, `CREATE TABLE `+name+` (id bigserial PRIMARY KEY, payload jsonb NOT NULL, event_type text,
			published_at timestamptz, claimed_at timestamptz, claimed_by text, attempts int NOT NULL DEFAULT 0)`)
		db.DropAfterTest(name)
		_, err := outbox.Migrate(ctx, pool, outbox.TableSpec{Name: name})
		Expect(err).NotTo(HaveOccurred())
		cfg := testConfig("drainer-a", outbox.TableSpec{Name: name}, "amq.topic")
		day := 24 * time.Hour
		cfg.Retention.UnpublishedMaxAge = &day
		store, err := outbox.OpenStore(ctx, pool, cfg.Table)
		Expect(err).NotTo(HaveOccurred())
		_, err = New(cfg, store, NewMetrics(prometheus.NewRegistry()), slog.New(slog.DiscardHandler))
		Expect(err).To(MatchError(ContainSubstring(`retention.unpublishedMaxAge: Invalid value: "24h0m0s": needs an enqueuedAt column`)))
	})
})

// eventTypes lists the event_type of every row of table.
func eventTypes(ctx context.Context, table string) []string {
	rows, err := pool.Query(ctx, "SELECT event_type FROM "+table)
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for rows.Next() {
		var s string
		Expect(rows.Scan(&s)).To(Succeed())
		out = append(out, s)
	}
	return out
}

var _ = Describe("Database URL from a file", Label(tier.DB, tier.Broker), func() {
	It("reads the file again for every new connection, so a rotated secret needs no restart", func(ctx SpecContext) {
		role := testenv.UniqueName("spillway_rotated")
		db.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		DeferCleanup(func(ctx SpecContext) { db.Exec(ctx, "DROP ROLE IF EXISTS "+role) })
		file := filepath.Join(GinkgoT().TempDir(), "database-url")
		Expect(os.WriteFile(file, []byte(testenv.DatabaseURL()+"\n"), 0o600)).To(Succeed())
		id := testenv.UniqueName("drainer")
		rotating, err := outbox.ConnectPool(ctx, secret.URLSource{File: file}, outbox.PoolOptions{DrainerID: id})
		Expect(err).NotTo(HaveOccurred())
		defer rotating.Close()
		currentUser := func() string {
			var u string
			_ = rotating.QueryRow(ctx, "SELECT current_user").Scan(&u)
			return u
		}
		Expect(currentUser()).To(Equal("postgres"))

		rotated := "postgres://" + role + "@127.0.0.1:5432/test?sslmode=disable"
		Expect(os.WriteFile(file, []byte(rotated), 0o600)).To(Succeed())
		db.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", "spillway-drainer/"+id)
		Eventually(currentUser, 10*time.Second, 50*time.Millisecond).Should(Equal(role))
	})
})

var _ = Describe("The drainer's database sessions", Label(tier.DB, tier.Broker), func() {
	It("name the drainer, pin generic plans, scan no table whole, never JIT-compile, commit asynchronously unless asked, and have the server probe an idle drainer", func(ctx SpecContext) {
		settings := func(synchronousCommit bool) []string {
			id := testenv.UniqueName("drainer")
			p, err := outbox.ConnectPool(ctx, secret.URLSource{URL: testenv.DatabaseURL()}, outbox.PoolOptions{DrainerID: id, SynchronousCommit: synchronousCommit})
			Expect(err).NotTo(HaveOccurred())
			defer p.Close()
			var name, plans, seqscan, jit, commit, keepalives string
			Expect(p.QueryRow(ctx, "SELECT current_setting('application_name'), current_setting('plan_cache_mode'), current_setting('enable_seqscan'), current_setting('jit'), current_setting('synchronous_commit'), "+
				"concat_ws(' ', current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'))").
				Scan(&name, &plans, &seqscan, &jit, &commit, &keepalives)).To(Succeed())
			Expect(name).To(Equal("spillway-drainer/" + id))
			// Idle 15 s, then a probe every 5 s, 3 unanswered: the test
			// server is reached over TCP, where they apply.
			Expect(keepalives).To(Equal("15 5 3"))
			return []string{plans, seqscan, jit, commit}
		}
		Expect(settings(false)).To(Equal([]string{"force_generic_plan", "off", "off", "off"}))
		Expect(settings(true)).To(Equal([]string{"force_generic_plan", "off", "off", "on"}))
	})
})

var _ = Describe("Graceful shutdown", Label(tier.DB, tier.Broker), func() {
	It("stops claiming, settles what was confirmed, releases the rest and returns within the shutdown timeout", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 20_000)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.ShutdownTimeout = 5 * time.Second
		d := newDrainer(ctx, cfg).start()
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NOT NULL") }, drainTimeout, 10*time.Millisecond).
			Should(BeNumerically(">=", 1000))

		stopped := time.Now()
		d.stop()
		Eventually(d.done, cfg.ShutdownTimeout).Should(Receive(BeNil()))
		GinkgoWriter.Printf("stopped in %s\n", time.Since(stopped))
		Expect(db.Count(ctx, spec.Name, "claimed_by IS NOT NULL AND published_at IS NULL")).To(BeZero(), "no claim left behind")
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero())
		published := db.Count(ctx, spec.Name, "published_at IS NOT NULL")
		Expect(published).To(BeNumerically("<", 20_000), "stopped mid-drain")
		Expect(testenv.QueueDepth(amqpChannel(), topo.Queue)).To(BeNumerically(">=", published), "every row marked published was confirmed")
	})
})

var _ = Describe("Liveness", Label(tier.DB, tier.Broker), func() {
	healthz := func(srv *httptest.Server) func() (int, string) {
		return func() (int, string) {
			resp, err := http.Get(srv.URL + "/healthz")
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
	}

	It("answers /healthz ok while the claim loop drains and idles for many leases, with polls longer than the lease", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		db.Seed(ctx, spec.Name, 2000)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		// The shortest lease depth 4 allows, and an idle wait three times it.
		cfg.PipelineDepth, cfg.LeaseTTL, cfg.PollInterval = 4, 1200*time.Millisecond, 3600*time.Millisecond
		d := startDrainer(ctx, cfg)
		srv := httptest.NewServer(d.Handler(d.reg))
		DeferCleanup(srv.Close)
		// Healthy while it drains, however long that takes on a busy
		// machine, then while it idles through three polls, each longer
		// than the lease.
		deadline := time.Now().Add(drainTimeout)
		for db.Count(ctx, spec.Name, "published_at IS NULL") > 0 {
			code, body := healthz(srv)()
			Expect(code).To(Equal(200), body)
			Expect(time.Now()).To(BeTemporally("<", deadline), "drained")
			time.Sleep(20 * time.Millisecond)
		}
		Consistently(func() int { code, _ := healthz(srv)(); return code }, 3*cfg.PollInterval, 20*time.Millisecond).Should(Equal(200))
	})

	It("fails /healthz once the claim loop has made no progress for longer than a lease, and says so", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		cfg := testConfig("drainer-a", spec, "amq.topic")
		cfg.PipelineDepth, cfg.LeaseTTL = 1, 300*time.Millisecond
		// Built and never run: its claim loop makes no progress at all.
		d := newDrainer(ctx, cfg)
		srv := httptest.NewServer(d.Handler(d.reg))
		DeferCleanup(srv.Close)
		code, _ := healthz(srv)()
		Expect(code).To(Equal(200), "alive for a lease after it was built")
		Eventually(func() int { code, _ := healthz(srv)(); return code }, 2*time.Second, 20*time.Millisecond).Should(Equal(503))
		_, body := healthz(srv)()
		Expect(body).To(ContainSubstring("claim loop has made no progress for"))
	})
})

var _ = Describe("Readiness", Label(tier.DB, tier.Broker), func() {
	get := func(srv *httptest.Server, path string) func() (int, string) {
		return func() (int, string) {
			resp, err := http.Get(srv.URL + path)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
	}
	code := func(probe func() (int, string)) func() int {
		return func() int { c, _ := probe(); return c }
	}

	It("is lost while the database refuses every claim, as for a renamed table, says why, and is back within a poll of the cure with every row published once", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		ledger := startLedger(topo.Queue)
		db.Seed(ctx, spec.Name, 300)
		cfg := testConfig("drainer-a", spec, topo.Exchange)
		cfg.PollInterval = time.Second
		d := startDrainer(ctx, cfg)
		srv := httptest.NewServer(d.Handler(d.reg))
		DeferCleanup(srv.Close)
		readyz, healthz := get(srv, "/readyz"), get(srv, "/healthz")
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Eventually(code(readyz), drainTimeout).Should(Equal(200))

		_, name := spec.QualifiedName()
		db.Exec(ctx, "ALTER TABLE "+spec.Name+" RENAME TO "+name+"_away")
		renamed := time.Now()
		db.Exec(ctx, `INSERT INTO `+spec.Name+`_away (event_type, payload) SELECT 'order.created', '{}' FROM generate_series(1, 200)`)
		Eventually(code(readyz), 10*time.Second, 20*time.Millisecond).Should(Equal(503))
		GinkgoWriter.Printf("unready %s after the rename\n", time.Since(renamed).Round(time.Millisecond))
		_, body := readyz()
		Expect(body).To(ContainSubstring(`claims on %s fail: ERROR: relation "%s" does not exist (SQLSTATE 42P01)`, spec.Name, spec.Name))
		Expect(body).NotTo(ContainSubstring("postgres://"))
		Expect(testutil.ToFloat64(d.metrics.StatementFailing.WithLabelValues(statementClaim, "42P01"))).To(Equal(1.0))
		Expect(code(healthz)()).To(Equal(200), "alive: a restart would not bring the table back")
		Consistently(code(readyz), 2*cfg.PollInterval, 50*time.Millisecond).Should(Equal(503))
		failures := testutil.ToFloat64(d.metrics.StatementErrors.WithLabelValues(statementClaim, "42P01"))
		Expect(failures).To(BeNumerically(">=", 4))
		Expect(strings.Count(string(d.logs.Contents()), `"msg":"Claim failed"`)).To(Equal(1), "the first failure is logged, not every try")
		Expect(strings.Count(string(d.logs.Contents()), `"msg":"The database keeps refusing claims`)).To(Equal(1))

		db.Exec(ctx, "ALTER TABLE "+spec.Name+"_away RENAME TO "+name)
		back := time.Now()
		Eventually(code(readyz), 2*cfg.PollInterval, 10*time.Millisecond).Should(Equal(200))
		GinkgoWriter.Printf("ready %s after the table's return (poll interval %s)\n", time.Since(back).Round(time.Millisecond), cfg.PollInterval)
		Expect(testutil.CollectAndCount(d.metrics.StatementFailing)).To(BeZero())
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		all := db.IDs(ctx, spec.Name, "true")
		Expect(all).To(HaveLen(500))
		Eventually(ledger.Missing).WithArguments(all).Should(BeZero())
		lost, duplicates := ledger.Account(all)
		Expect(lost).To(BeEmpty())
		Expect(duplicates).To(BeZero())
	})

	It("is lost while the database refuses every settle, and is back once one succeeds, with no row lost", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		ledger := startLedger(topo.Queue)
		_, name := spec.QualifiedName()
		refuse := testenv.UniqueName("refuse")
		// The application's own guard, refusing to mark rows published.
		db.Exec(ctx, `CREATE FUNCTION `+refuse+`() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'outbox rows are read-only today' USING ERRCODE = 'P0001'; END $$`)
		DeferCleanup(func(ctx SpecContext) { db.Exec(ctx, "DROP FUNCTION IF EXISTS "+refuse+"() CASCADE") })
		db.Exec(ctx, `CREATE TRIGGER `+name+`_refuse BEFORE UPDATE ON `+spec.Name+`
			FOR EACH ROW WHEN (NEW.published_at IS NOT NULL) EXECUTE FUNCTION `+refuse+`()`)
		db.Seed(ctx, spec.Name, 100)
		d := startDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		srv := httptest.NewServer(d.Handler(d.reg))
		DeferCleanup(srv.Close)
		readyz := get(srv, "/readyz")

		Eventually(func() string { _, body := readyz(); return body }, 10*time.Second, 20*time.Millisecond).Should(
			ContainSubstring("settles on %s fail: ERROR: outbox rows are read-only today (SQLSTATE P0001)", spec.Name))
		Expect(code(readyz)()).To(Equal(503))
		Expect(testutil.ToFloat64(d.metrics.StatementFailing.WithLabelValues(statementSettle, "P0001"))).To(Equal(1.0))

		db.Exec(ctx, "DROP TRIGGER "+name+"_refuse ON "+spec.Name)
		Eventually(code(readyz), drainTimeout, 20*time.Millisecond).Should(Equal(200))
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		all := db.IDs(ctx, spec.Name, "true")
		Eventually(ledger.Missing).WithArguments(all).Should(BeZero())
		lost, duplicates := ledger.Account(all)
		Expect(lost).To(BeEmpty())
		GinkgoWriter.Printf("%d duplicates of 100: rows whose mark was refused were published again once their lease ended\n", duplicates)
	})

	It("is ready once the broker is connected and the database answers, and not after the broker connection closes", func(ctx SpecContext) {
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		d := newDrainer(ctx, testConfig("drainer-a", spec, topo.Exchange))
		Expect(d.Ready(ctx)).To(MatchError("broker not connected"))
		d.start()
		Eventually(func() error { return d.Ready(ctx) }, drainTimeout).Should(Succeed())
		d.current.Load().Close()
		Expect(d.Ready(ctx)).To(MatchError("broker not connected"))
		Eventually(func() error { return d.Ready(ctx) }, drainTimeout).Should(Succeed(), "reconnected")
	})
})
