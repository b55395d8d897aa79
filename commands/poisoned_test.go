package commands

import (
	"bytes"
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("spillway poisoned's flags", func() {
	DescribeTable("refuse, before connecting, naming the flag or the field and the rule,",
		func(args []string, want string) {
			err := runPoisoned(context.Background(), append(args, "--database-url", "postgres://nobody@127.0.0.1:1/none"), &bytes.Buffer{})
			Expect(err).To(MatchError(ContainSubstring(want)))
		},
		Entry("no verb", []string{}, "usage: spillway poisoned list|replay|park"),
		Entry("an unknown verb", []string{"delete"}, "usage: spillway poisoned list|replay|park"),
		Entry("a time that is not RFC 3339", []string{"replay", "--enqueued-since", "yesterday"}, "want an RFC 3339 time"),
		Entry("a zero limit", []string{"park", "--limit", "0"}, "selector.limit: Invalid value: 0: must be from 1 to 1000000"),
		Entry("a dry run of a listing", []string{"list", "--dry-run"}, "flag provided but not defined: -dry-run"),
		Entry("a stray argument", []string{"replay", "everything"}, `unexpected argument "everything": every selector is a flag`),
		Entry("no maxAttempts", []string{"list", "--max-attempts", "0"}, "maxAttempts: Invalid value: 0: must be greater than 0"),
		Entry("parking parked rows", []string{"park", "--parked"}, "selector.parked: Invalid value: true"),
	)
})

var _ = Describe("spillway poisoned", Label(tier.DB), func() {
	// A canonical outbox of 10 rows, of which 3 were poisoned by a too-long
	// routing key three hours ago, and 2 by a return an hour ago.
	const triageMaxAttempts = 5
	var (
		db                suite.DB
		spec              outbox.TableSpec
		tooLong, returned []string
	)
	BeforeEach(func(ctx SpecContext) {
		db = suite.DB{Pool: pool}
		spec = db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, 10)
		tooLong = db.Poison(ctx, spec.Name, "id IN (SELECT id FROM "+spec.Name+" ORDER BY id LIMIT 3)",
			"routing key is 300 bytes, over the AMQP limit of 255: aaaa", "3 hours", triageMaxAttempts)
		returned = db.Poison(ctx, spec.Name, "attempts = 0 AND id IN (SELECT id FROM "+spec.Name+" WHERE attempts = 0 ORDER BY id LIMIT 2)",
			`broker returned the message: 312 NO_ROUTE (exchange "orders", routing key "order.lost")`, "1 hour", triageMaxAttempts)
	})
	It("runs as spillway poisoned list, replay and park, with a dry run, and never prints a password", func(ctx SpecContext) {
		db.Exec(ctx, "UPDATE "+spec.Name+" SET last_error = 'auth failed for postgres://postgres:sekrit@db/test' WHERE id = $1", returned[1])
		run := func(args ...string) string {
			var out bytes.Buffer
			base := []string{"--database-url", testenv.DatabaseURL(), "--table", spec.Name, fmt.Sprintf("--max-attempts=%d", triageMaxAttempts)}
			Expect(runPoisoned(ctx, append(args[:1:1], append(base, args[1:]...)...), &out)).To(Succeed(), out.String())
			return out.String()
		}
		listing := run("list")
		for _, id := range append(append([]string{}, tooLong...), returned...) {
			Expect(listing).To(ContainSubstring(id))
		}
		Expect(listing).To(ContainSubstring("5 rows of " + spec.Name))
		Expect(listing).NotTo(ContainSubstring("sekrit"))
		Expect(listing).To(ContainSubstring("postgres://postgres:xxxxx@db/test"))

		before := db.Snapshot(ctx, spec.Name, "true")
		dry := run("replay", "--dry-run", "--last-error", "routing key%")
		Expect(dry).To(ContainSubstring("dry run: " + spec.Name + " would replay 3 rows; nothing changed"))
		Expect(db.Snapshot(ctx, spec.Name, "true")).To(Equal(before))

		Expect(run("park", "--id", returned[0]+","+returned[1])).To(ContainSubstring("parked 2 of 2 matched rows of " + spec.Name))
		Expect(run("list", "--parked")).To(ContainSubstring("2 rows of " + spec.Name))
		Expect(run("replay", "--last-error", "routing key%", "--limit", "2")).To(ContainSubstring("replayed 2 of 2 matched rows"))
		Expect(db.Count(ctx, spec.Name, "id::text = ANY($1) AND attempts = 0", tooLong)).To(Equal(2))
	})
})
