package outbox_test

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

// triageMaxAttempts is the poison threshold of the triage specs.
const triageMaxAttempts = 5

// triageLease is the lease the triage specs claim under.
const triageLease = 30 * time.Second

// resolved is the live table of spec, as the triage resolves it.
func resolved(ctx context.Context, spec outbox.TableSpec) *outbox.Table {
	cols, err := outbox.Catalog(ctx, pool, spec)
	Expect(err).NotTo(HaveOccurred())
	t, err := outbox.ResolveTable(spec, cols)
	Expect(err).NotTo(HaveOccurred())
	return t
}

// listedIDs lists the rows sel picks, and returns their ids in order.
func listedIDs(ctx context.Context, t *outbox.Table, sel outbox.PoisonedSelector) []string {
	rows, err := outbox.ListPoisoned(ctx, pool, t, outbox.PoisonedRequest{MaxAttempts: triageMaxAttempts, Lease: triageLease, Selector: sel})
	Expect(err).NotTo(HaveOccurred())
	out := []string{}
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// change runs a replay or park of the triage's threshold.
func change(ctx context.Context, t *outbox.Table, action outbox.PoisonedAction, sel outbox.PoisonedSelector, dryRun bool) outbox.PoisonedChange {
	done, err := outbox.ChangePoisoned(ctx, pool, t, outbox.PoisonedRequest{
		Action: action, Selector: sel, MaxAttempts: triageMaxAttempts, Lease: triageLease, DryRun: dryRun, BatchSize: 2, StatementTimeout: 5 * time.Second,
	}, nil)
	Expect(err).NotTo(HaveOccurred())
	return done
}

func selector(limit int) outbox.PoisonedSelector { return outbox.PoisonedSelector{Limit: limit} }

var _ = Describe("Triage of poisoned rows", Label(tier.DB), func() {
	// A canonical outbox holding, oldest first: 3 rows poisoned by a
	// too-long routing key three hours ago, 2 poisoned by a return an hour
	// ago, 2 pending rows in backoff whose last attempt failed the same
	// way, 2 fresh rows, and a published row that was poisoned once.
	var (
		spec              outbox.TableSpec
		table             *outbox.Table
		tooLong, returned []string
		backoff, fresh    []string
		published         string
	)
	BeforeEach(func(ctx SpecContext) {
		spec = db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 10)
		tooLong = db.Poison(ctx, spec.Name, "id IN (SELECT id FROM "+spec.Name+" ORDER BY id LIMIT 3)",
			"routing key is 300 bytes, over the AMQP limit of 255: aaaa", "3 hours", triageMaxAttempts)
		for i, id := range tooLong { // a minute apart, for the range
			db.Exec(ctx, "UPDATE "+spec.Name+" SET enqueued_at = now() - interval '3 hours' + $1 * interval '1 minute' WHERE id = $2", i, id)
		}
		returned = db.Poison(ctx, spec.Name, "attempts = 0 AND id IN (SELECT id FROM "+spec.Name+" WHERE attempts = 0 ORDER BY id LIMIT 2)",
			`broker returned the message: 312 NO_ROUTE (exchange "orders", routing key "order.lost")`, "1 hour", triageMaxAttempts)
		backoff = db.IDs(ctx, spec.Name, "attempts = 0 AND id IN (SELECT id FROM "+spec.Name+" WHERE attempts = 0 ORDER BY id LIMIT 2)")
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = 2, available_at = now() + interval '1 minute', last_error = 'routing key is 300 bytes' WHERE id::text = ANY($1)", backoff)
		published = db.IDs(ctx, spec.Name, "attempts = 0 AND id IN (SELECT id FROM "+spec.Name+" WHERE attempts = 0 ORDER BY id LIMIT 1)")[0]
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, last_error = 'returned', published_at = now() WHERE id = $2", triageMaxAttempts, published)
		fresh = db.IDs(ctx, spec.Name, "attempts = 0 AND published_at IS NULL")
		Expect(fresh).To(HaveLen(2))
		table = resolved(ctx, spec)
	})

	It("picks poisoned rows by id, by last_error pattern, by an enqueued_at range and up to a limit, oldest first, never a healthy or published row", func(ctx SpecContext) {
		Expect(listedIDs(ctx, table, selector(100))).To(ConsistOf(append(append([]string{}, tooLong...), returned...)))
		Expect(listedIDs(ctx, table, outbox.PoisonedSelector{IDs: []string{returned[0], backoff[0], fresh[0], published}, Limit: 100})).
			To(Equal([]string{returned[0]}), "ids narrow the poisoned rows; they never reach a row in backoff, a fresh or a published one")
		Expect(listedIDs(ctx, table, outbox.PoisonedSelector{LastErrorPattern: "routing key is % bytes%", Limit: 100})).To(ConsistOf(tooLong),
			"the rows in backoff that failed the same way are not poisoned")
		Expect(listedIDs(ctx, table, outbox.PoisonedSelector{LastErrorPattern: `%"order.lost")`, Limit: 100})).To(ConsistOf(returned))
		Expect(listedIDs(ctx, table, outbox.PoisonedSelector{LastErrorPattern: "Routing key%", Limit: 100})).To(BeEmpty(), "LIKE is case-sensitive")

		var since, before time.Time
		Expect(pool.QueryRow(ctx, "SELECT enqueued_at FROM "+spec.Name+" WHERE id::text = $1", tooLong[1]).Scan(&since)).To(Succeed())
		Expect(pool.QueryRow(ctx, "SELECT enqueued_at FROM "+spec.Name+" WHERE id::text = $1", returned[0]).Scan(&before)).To(Succeed())
		inRange := listedIDs(ctx, table, outbox.PoisonedSelector{EnqueuedSince: &since, EnqueuedBefore: &before, Limit: 100})
		Expect(inRange).To(HaveLen(2), "since is inclusive, before exclusive: %v", inRange)
		Expect(tooLong).To(ContainElements(inRange))

		oldest := listedIDs(ctx, table, selector(4))
		Expect(oldest).To(HaveLen(4))
		Expect(oldest[:3]).To(ConsistOf(tooLong), "oldest first")
		Expect(listedIDs(ctx, table, outbox.PoisonedSelector{LastErrorPattern: "nothing like this", Limit: 100})).To(BeEmpty())
	})

	It("replays what it picks in bounded batches: attempts, last error and lease reset, due again since enqueued, and nothing else touched", func(ctx SpecContext) {
		before := db.Snapshot(ctx, spec.Name, "NOT (id::text = ANY($1))", tooLong)
		done := change(ctx, table, outbox.ActionReplay, outbox.PoisonedSelector{LastErrorPattern: "routing key is %", Limit: 100}, false)
		Expect(done.Matched).To(Equal(int64(3)))
		Expect(done.Changed).To(Equal(int64(3)), "in two batches of at most 2")
		Expect(done.IDs).To(ConsistOf(tooLong))
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1) AND attempts = 0 AND last_error IS NULL AND claimed_by IS NULL AND claimed_at IS NULL"+
			" AND available_at = enqueued_at", tooLong)).To(Equal(3))
		Expect(db.Snapshot(ctx, spec.Name, "NOT (id::text = ANY($1))", tooLong)).To(Equal(before), "no other row changed")

		status, err := outbox.ReadOutboxStatus(ctx, pool, table, triageMaxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Poisoned).To(Equal(int64(2)))
		Expect(status.Backlog).To(Equal(int64(7)), "the replayed rows are backlog again")

		again := change(ctx, table, outbox.ActionReplay, outbox.PoisonedSelector{LastErrorPattern: "routing key is %", Limit: 100}, false)
		Expect(again).To(Equal(outbox.PoisonedChange{Counted: true}), "a replayed row is no longer poisoned, so a second run changes nothing")
	})

	It("stops at the limit, oldest first", func(ctx SpecContext) {
		done := change(ctx, table, outbox.ActionReplay, selector(3), false)
		Expect(done.Matched).To(Equal(int64(3)))
		Expect(done.Changed).To(Equal(int64(3)))
		Expect(done.IDs).To(ConsistOf(tooLong))
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1) AND attempts = $2", returned, triageMaxAttempts)).To(Equal(2))
	})

	It("leaves alone a row under a live lease and a row another transaction holds, and takes a row whose lease expired", func(ctx SpecContext) {
		// A drainer running with a higher maxAttempts holds one row, another
		// held one whose lease has expired, and the application locks a third.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET claimed_by = 'drainer-a', claimed_at = now(), available_at = now() + interval '30 seconds' WHERE id = $1", tooLong[0])
		db.Exec(ctx, "UPDATE "+spec.Name+" SET claimed_by = 'drainer-b', claimed_at = now() - interval '1 minute', available_at = now() - interval '30 seconds' WHERE id = $1", tooLong[1])
		tx, err := pool.Begin(ctx)
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SELECT 1 FROM "+spec.Name+" WHERE id = $1 FOR UPDATE", returned[0])
		Expect(err).NotTo(HaveOccurred())

		done := change(ctx, table, outbox.ActionReplay, selector(100), false)
		Expect(done.Matched).To(Equal(int64(4)), "the leased row is not poisoned as far as a replay goes")
		Expect(done.Changed).To(Equal(int64(3)), "the locked row was skipped, not waited for")
		Expect(done.IDs).To(ConsistOf(tooLong[1], tooLong[2], returned[1]))
		Expect(db.Count(ctx, spec.Name, "id = $1 AND claimed_by = 'drainer-a' AND attempts = $2 AND available_at > now()", tooLong[0], triageMaxAttempts)).
			To(Equal(1), "the live lease is untouched")
		Expect(db.Count(ctx, spec.Name, "id = $1 AND claimed_by IS NULL AND attempts = 0", tooLong[1])).To(Equal(1),
			"the expired lease is cleared, so its holder's late settle is fenced out")

		Expect(tx.Rollback(ctx)).To(Succeed())
		Expect(change(ctx, table, outbox.ActionReplay, selector(100), false).IDs).To(Equal([]string{returned[0]}), "taken once it is free")
	})

	It("counts and lists in a dry run, and changes nothing", func(ctx SpecContext) {
		before := db.Snapshot(ctx, spec.Name, "true")
		for _, action := range []outbox.PoisonedAction{outbox.ActionReplay, outbox.ActionPark} {
			done := change(ctx, table, action, selector(100), true)
			Expect(done.Matched).To(Equal(int64(5)), string(action))
			Expect(done.Changed).To(BeZero())
			Expect(done.IDs).To(ConsistOf(append(append([]string{}, tooLong...), returned...)))
		}
		Expect(db.Snapshot(ctx, spec.Name, "true")).To(Equal(before))
		Expect(change(ctx, table, outbox.ActionReplay, outbox.PoisonedSelector{LastErrorPattern: "no such error", Limit: 100}, true)).To(Equal(outbox.PoisonedChange{Counted: true}))
	})

	It("parks rows out of the poisoned count and the backlog, never to be claimed or pruned, until they are replayed", func(ctx SpecContext) {
		done := change(ctx, table, outbox.ActionPark, outbox.PoisonedSelector{IDs: returned, Limit: 100}, false)
		Expect(done.Changed).To(Equal(int64(2)))
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1) AND parked_at IS NOT NULL AND available_at = 'infinity' AND attempts = $2 AND last_error LIKE 'broker returned%'",
			returned, triageMaxAttempts)).To(Equal(2), "attempts and last error are kept for whoever looks at them later")
		status, err := outbox.ReadOutboxStatus(ctx, pool, table, triageMaxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Poisoned).To(Equal(int64(3)))
		Expect(status.Backlog).To(Equal(int64(4)))
		Expect(status.Parked).To(Equal(int64(2)))
		Expect(status.ParkedKnown).To(BeTrue())
		Expect(listedIDs(ctx, table, selector(100))).To(ConsistOf(tooLong), "a parked row is not poisoned any more")
		Expect(listedIDs(ctx, table, outbox.PoisonedSelector{Parked: true, Limit: 100})).To(ConsistOf(returned))
		Expect(change(ctx, table, outbox.ActionPark, outbox.PoisonedSelector{IDs: returned, Limit: 100}, false).Changed).To(BeZero(), "parked already")

		// Made due by hand, with its attempts reset, a parked row is still
		// not claimed, and the shelving of spent rows sends it back out of
		// reach.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET available_at = now() - interval '1 second', attempts = 0 WHERE id = $1", returned[0])
		db.Exec(ctx, "UPDATE "+spec.Name+" SET available_at = now() - interval '1 second' WHERE id::text = ANY($1)", fresh)
		store, err := outbox.OpenStore(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		claim, err := store.Claim(ctx, outbox.ClaimParams{DrainerID: "drainer-a", BatchSize: 10, MaxAttempts: triageMaxAttempts, LeaseMillis: 30_000,
			MaxPayloadBytes: 1 << 20, MaxClaimBytes: 8 << 20})
		Expect(err).NotTo(HaveOccurred())
		var claimed []string
		for _, r := range claim.Rows {
			claimed = append(claimed, r.ID)
		}
		Expect(claimed).To(ConsistOf(fresh))
		shelved, err := store.ShelveSpent(ctx, triageMaxAttempts, time.Minute, 100)
		Expect(err).NotTo(HaveOccurred())
		Expect(shelved).To(Equal(int64(1)))
		Expect(db.Count(ctx, spec.Name, "id = $1 AND available_at = 'infinity' AND claimed_by IS NULL AND parked_at IS NOT NULL", returned[0])).To(Equal(1))

		// Retention of pending rows older than two hours drops the too-long
		// ones, and keeps the parked ones, though they are older.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET enqueued_at = now() - interval '1 day' WHERE id::text = ANY($1)", returned)
		prune := table.PruneUnpublished(2*time.Hour, time.Minute, 100)
		Expect(db.Exec(ctx, prune.SQL, prune.Args...)).To(Equal(int64(3)))
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1)", returned)).To(Equal(2))

		replayed := change(ctx, table, outbox.ActionReplay, outbox.PoisonedSelector{Parked: true, Limit: 100}, false)
		Expect(replayed.IDs).To(ConsistOf(returned))
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1) AND parked_at IS NULL AND attempts = 0 AND available_at <= now()", returned)).To(Equal(2))
	})

	It("lists the most common last errors of the poisoned rows in the status, with counts and their oldest enqueue time, scrubbed and cut", func(ctx SpecContext) {
		// Three more poisoned rows whose errors quote credentials: once
		// scrubbed, two of them read the same, and outnumber the returns.
		extra := db.IDs(ctx, "(SELECT gen_random_uuid() AS id FROM generate_series(1, 4)) g", "true")
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (id, event_type, payload) SELECT id::uuid, 'a', '{}' FROM unnest($1::text[]) id", extra)
		db.Exec(ctx, "UPDATE "+spec.Name+` SET attempts = $1, available_at = 'infinity', last_error = 'connect amqp://app:s3cret@mq:5672/ failed: password=s3cret'
			WHERE id::text = $2`, triageMaxAttempts, extra[0])
		db.Exec(ctx, "UPDATE "+spec.Name+` SET attempts = $1, available_at = 'infinity', last_error = 'connect amqp://app:0ther@mq:5672/ failed: password=0ther'
			WHERE id::text = ANY($2)`, triageMaxAttempts, extra[1:3])
		huge := "token=" + strings.Repeat("t", 1<<20) + " and more"
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, available_at = 'infinity', last_error = $2 WHERE id::text = $3", triageMaxAttempts, huge, extra[3])

		status, err := outbox.ReadBoundedOutboxStatus(ctx, pool, table, triageMaxAttempts, 1000, "amqp://app:hunter2@mq:5672/")
		Expect(err).NotTo(HaveOccurred())
		Expect(status.Poisoned).To(Equal(int64(9)))
		Expect(status.PoisonedBy).To(HaveLen(3))
		Expect(status.PoisonedBy[0].LastError).To(Equal("routing key is 300 bytes, over the AMQP limit of 255: aaaa"))
		Expect(status.PoisonedBy[0].Count).To(Equal(int64(3)))
		Expect(status.PoisonedBy[1].LastError).To(Equal("connect amqp://app:xxxxx@mq:5672/ failed: password=xxxxx"))
		Expect(status.PoisonedBy[1].Count).To(Equal(int64(3)), "two errors that differed only in the password")
		Expect(status.PoisonedBy[2].Count).To(Equal(int64(2)))
		var oldest time.Time
		Expect(pool.QueryRow(ctx, "SELECT min(enqueued_at) FROM "+spec.Name+" WHERE id::text = ANY($1)", tooLong).Scan(&oldest)).To(Succeed())
		Expect(status.PoisonedBy[0].OldestEnqueuedAt).To(HaveValue(BeTemporally("==", oldest)))
		for _, c := range status.PoisonedBy {
			Expect(c.LastError).NotTo(ContainSubstring("s3cret"))
			Expect(c.LastError).NotTo(ContainSubstring("0ther"))
		}

		// The huge one alone: cut, its token gone.
		db.Exec(ctx, "UPDATE "+spec.Name+" SET published_at = now() WHERE id::text <> $1", extra[3])
		status, err = outbox.ReadBoundedOutboxStatus(ctx, pool, table, triageMaxAttempts, 1000)
		Expect(err).NotTo(HaveOccurred())
		Expect(status.PoisonedBy).To(HaveLen(1))
		Expect(status.PoisonedBy[0].LastError).To(HavePrefix("token=xxxxx"))
		Expect(len(status.PoisonedBy[0].LastError)).To(BeNumerically("<=", secret.MaxShown+len("…")))
	})

	DescribeTable("refuses a selector it cannot answer, naming the field, the value and the rule",
		func(ctx SpecContext, action outbox.PoisonedAction, sel outbox.PoisonedSelector, want ...string) {
			before := db.Snapshot(ctx, spec.Name, "true")
			_, err := outbox.ChangePoisoned(ctx, pool, table, outbox.PoisonedRequest{Action: action, Selector: sel, MaxAttempts: triageMaxAttempts, Lease: triageLease}, field.NewPath("spec"))
			Expect(err).To(HaveOccurred())
			Expect(err).To(BeAssignableToTypeOf(&outbox.InvalidSelectorError{}))
			for _, w := range want {
				Expect(err.Error()).To(ContainSubstring(w))
			}
			Expect(db.Snapshot(ctx, spec.Name, "true")).To(Equal(before))
		},
		Entry("an id that is no UUID", outbox.ActionReplay, outbox.PoisonedSelector{IDs: []string{"42"}, Limit: 10},
			`spec.selector.ids[0]: Invalid value: "42": must be a UUID, as the id column is uuid`),
		Entry("no limit", outbox.ActionReplay, outbox.PoisonedSelector{}, "spec.selector.limit: Invalid value: 0: must be from 1 to 1000000"),
		Entry("a pattern ending in an escape", outbox.ActionPark, outbox.PoisonedSelector{LastErrorPattern: `50\`, Limit: 10},
			`spec.selector.lastErrorPattern: Invalid value: "50\\": must not end in an unfinished escape`),
		Entry("a pattern with a NUL", outbox.ActionReplay, outbox.PoisonedSelector{LastErrorPattern: "a\x00b", Limit: 10},
			"spec.selector.lastErrorPattern", "must be valid UTF-8 without a NUL character"),
		Entry("a huge pattern", outbox.ActionReplay, outbox.PoisonedSelector{LastErrorPattern: strings.Repeat("%", 5000), Limit: 10},
			"spec.selector.lastErrorPattern: Too long: may not be more than 1024 bytes"),
		Entry("an empty range", outbox.ActionReplay, outbox.PoisonedSelector{EnqueuedSince: ptr.To(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)),
			EnqueuedBefore: ptr.To(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), Limit: 10},
			`spec.selector.enqueuedBefore: Invalid value: "2026-01-01T00:00:00Z": must be later than enqueuedSince 2026-02-01T00:00:00Z`),
		Entry("parking parked rows", outbox.ActionPark, outbox.PoisonedSelector{Parked: true, Limit: 10}, "spec.selector.parked: Invalid value: true"),
		Entry("an unknown action", outbox.PoisonedAction("delete"), selector(10), `spec.action: Unsupported value: "delete"`),
	)
})

var _ = Describe("Triage of an adopted table", Label(tier.DB), func() {
	It("works through the column mapping, without last_error, enqueued_at or parked_at: poisonedBy stays empty and what needs them is refused", func(ctx SpecContext) {
		name := "public." + testenv.UniqueName("legacy_outbox")
		db.Exec(ctx, "CREATE TABLE "+name+` (event_id bigserial PRIMARY KEY, body jsonb NOT NULL, event_type text, sent_at timestamptz,
			claimed_at timestamptz, claimed_by text, tries integer NOT NULL DEFAULT 0, due timestamptz NOT NULL DEFAULT now())`)
		db.DropAfterTest(name)
		db.Exec(ctx, "INSERT INTO "+name+" (body, event_type, tries, due) SELECT '{}', 'a', 9, 'infinity' FROM generate_series(1, 3)")
		db.Exec(ctx, "INSERT INTO "+name+" (body, event_type) VALUES ('{}', 'a')")
		spec := outbox.TableSpec{Name: name, Columns: outbox.Columns{ID: "event_id", Payload: "body", PublishedAt: "sent_at", Attempts: "tries", AvailableAt: "due"}}
		t := resolved(ctx, spec)

		status, err := outbox.ReadOutboxStatus(ctx, pool, t, triageMaxAttempts)
		Expect(err).NotTo(HaveOccurred())
		Expect(status).To(Equal(outbox.OutboxStatus{Backlog: 1, Poisoned: 3}), "no causes, no parked count, no age")

		poisoned := db.IDs(ctx, "(SELECT event_id AS id FROM "+name+" WHERE tries = 9 ORDER BY event_id) s", "true")
		Expect(listedIDs(ctx, t, selector(10))).To(Equal(poisoned), "oldest first is id order without enqueuedAt")
		done := change(ctx, t, outbox.ActionReplay, outbox.PoisonedSelector{IDs: poisoned[:1], Limit: 10}, false)
		Expect(done.IDs).To(Equal(poisoned[:1]))
		Expect(db.Count(ctx, name, "event_id = $1 AND tries = 0 AND due <= now()", poisoned[0])).To(Equal(1))

		since := time.Now().Add(-time.Hour)
		for _, c := range []struct {
			action outbox.PoisonedAction
			sel    outbox.PoisonedSelector
			want   string
		}{
			{outbox.ActionReplay, outbox.PoisonedSelector{IDs: []string{"x1"}, Limit: 10}, `selector.ids[0]: Invalid value: "x1": must be a whole number in range, as the id column is bigint`},
			{outbox.ActionReplay, outbox.PoisonedSelector{LastErrorPattern: "x%", Limit: 10}, "has no lastError column to match (map one with columns.lastError)"},
			{outbox.ActionReplay, outbox.PoisonedSelector{EnqueuedSince: &since, Limit: 10}, "selector.enqueuedSince: Invalid value"},
			{outbox.ActionPark, selector(10), "database.columns.parkedAt: Not found: \"parked_at in " + name + ": where a parked row is marked; run spillway migrate, which adds it\""},
		} {
			_, err := outbox.ChangePoisoned(ctx, pool, t, outbox.PoisonedRequest{Action: c.action, Selector: c.sel, MaxAttempts: triageMaxAttempts, Lease: triageLease}, nil)
			Expect(err).To(MatchError(ContainSubstring(c.want)))
		}

		_, err = outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		t = resolved(ctx, spec)
		Expect(change(ctx, t, outbox.ActionPark, selector(10), false).Changed).To(Equal(int64(2)), "parkable once migrate added parked_at")
	})

	It("changes only the picked rows of a partitioned outbox, though rows of two partitions share a ctid", func(ctx SpecContext) {
		boundary := time.Now().Add(-24 * time.Hour)
		spec, partitions := db.PartitionedOutbox(ctx, boundary)
		_, err := outbox.Migrate(ctx, pool, spec)
		Expect(err).NotTo(HaveOccurred())
		db.Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload, enqueued_at) VALUES ('a', '{}', now() - interval '2 days'), ('a', '{}', now())")
		db.Exec(ctx, "UPDATE "+spec.Name+" SET attempts = $1, available_at = 'infinity', last_error = 'returned'", triageMaxAttempts)
		var oldCtid, newCtid string
		Expect(pool.QueryRow(ctx, "SELECT ctid::text FROM "+partitions[0]).Scan(&oldCtid)).To(Succeed())
		Expect(pool.QueryRow(ctx, "SELECT ctid::text FROM "+partitions[1]).Scan(&newCtid)).To(Succeed())
		Expect(oldCtid).To(Equal(newCtid), "the spec needs the same ctid in both partitions")
		old := db.IDs(ctx, partitions[0], "true")
		t := resolved(ctx, spec)

		Expect(change(ctx, t, outbox.ActionReplay, outbox.PoisonedSelector{IDs: old, Limit: 10}, false).IDs).To(Equal(old))
		Expect(db.Count(ctx, partitions[1], "attempts = $1 AND available_at = 'infinity'", triageMaxAttempts)).To(Equal(1), "the other partition's row is untouched")
		Expect(change(ctx, t, outbox.ActionPark, selector(10), false).Changed).To(Equal(int64(1)))
		Expect(db.Count(ctx, partitions[1], "parked_at IS NOT NULL")).To(Equal(1))
		Expect(db.Count(ctx, partitions[0], "parked_at IS NULL AND attempts = 0")).To(Equal(1))
	})
})
