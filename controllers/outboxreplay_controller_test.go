package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/test/testenv"
)

// outboxReplay is a replay of the fleet orders' rows.
func outboxReplay(ns string, action v1alpha1.ReplayAction, sel v1alpha1.RowSelector) *v1alpha1.OutboxReplay {
	if sel.Limit == 0 {
		sel.Limit = 1000
	}
	return &v1alpha1.OutboxReplay{
		ObjectMeta: metav1.ObjectMeta{Name: testenv.UniqueObjectName(string(action)), Namespace: ns},
		Spec:       v1alpha1.OutboxReplaySpec{DrainerRef: v1alpha1.DrainerReference{Name: "orders"}, Action: action, Selector: sel},
	}
}

// replayCondition returns one of the replay's current conditions.
func replayCondition(ctx context.Context, r *v1alpha1.OutboxReplay, t v1alpha1.ConditionType) func() *metav1.Condition {
	return func() *metav1.Condition {
		for _, c := range get(ctx, r.DeepCopy()).Status.Conditions {
			if c.Type == string(t) {
				return &c
			}
		}
		return nil
	}
}

// replayEvents returns the events recorded about the replay, as
// "Type Reason: note (related Kind/name)".
func replayEvents(ctx context.Context, r *v1alpha1.OutboxReplay) func() []string {
	return func() []string {
		var list eventsv1.EventList
		Expect(k8s.List(ctx, &list, client.InNamespace(r.Namespace))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Name == r.Name && e.Regarding.Kind == "OutboxReplay" {
				related := "none"
				if e.Related != nil {
					related = e.Related.Kind + "/" + e.Related.Name
				}
				out = append(out, fmt.Sprintf("%s %s: %s (related %s)", e.Type, e.Reason, e.Note, related))
			}
		}
		return out
	}
}

// tableIDs returns the ids of table's rows matching where, in order.
func tableIDs(ctx context.Context, table, where string) []string {
	rows, err := db.Query(ctx, "SELECT id::text FROM "+table+" WHERE "+where+" ORDER BY id")
	Expect(err).NotTo(HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	Expect(err).NotTo(HaveOccurred())
	return out
}

// rowsOf is every row of table as JSON, in id order.
func rowsOf(ctx context.Context, table string) []string {
	rows, err := db.Query(ctx, "SELECT row_to_json(o)::text FROM "+table+" o ORDER BY id")
	Expect(err).NotTo(HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	Expect(err).NotTo(HaveOccurred())
	return out
}

// rowCount counts table's rows matching where.
func rowCount(ctx context.Context, table, where string) int {
	var n int
	Expect(db.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n)).To(Succeed())
	return n
}

var _ = Describe("OutboxReplay controller", func() {
	var (
		ns, table          string
		od                 *v1alpha1.OutboxDrainer
		tooLong, returned  []string
		healthy, published []string
	)
	// 5 rows poisoned at the fleet's maxAttempts 3 by a too-long routing
	// key, 2 by a return, 2 healthy pending rows and a published one.
	BeforeEach(func(ctx SpecContext) {
		ns = namespace(ctx)
		table = outboxTable(ctx)
		od = outboxDrainer(ns, table)
		runSQL(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, attempts, available_at, last_error, published_at)
			SELECT 'order.created', '{}'::jsonb, now() - interval '1 hour', 3, 'infinity'::timestamptz,
				'routing key is 300 bytes, over the AMQP limit of 255: ' || repeat('k', 80), NULL::timestamptz FROM generate_series(1, 5)
			UNION ALL SELECT 'order.lost', '{}', now() - interval '2 hours', 3, 'infinity', 'broker returned the message: 312 NO_ROUTE', NULL
				FROM generate_series(1, 2)
			UNION ALL SELECT 'order.created', '{}', now(), 0, now(), NULL, NULL FROM generate_series(1, 2)
			UNION ALL SELECT 'order.created', '{}', now() - interval '1 day', 3, now(), 'returned once', now()`)
		tooLong = tableIDs(ctx, table, "last_error LIKE 'routing key%'")
		returned = tableIDs(ctx, table, "last_error LIKE 'broker returned%'")
		healthy = tableIDs(ctx, table, "attempts = 0")
		published = tableIDs(ctx, table, "published_at IS NOT NULL")
	})

	It("replays the rows it selects, once, and records what matched and changed, with conditions, events and kubectl's columns", func(ctx SpecContext) {
		connectionSecrets(ctx, ns)
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Eventually(func() []v1alpha1.PoisonCause { return get(ctx, od.DeepCopy()).Status.PoisonedBy }).Should(HaveLen(2))
		s := get(ctx, od.DeepCopy()).Status
		Expect(s.PoisonedBy[0]).To(And(HaveField("LastError", HavePrefix("routing key is 300 bytes")), HaveField("Count", int64(5)),
			HaveField("OldestEnqueuedAt.Time", BeTemporally("~", time.Now().Add(-time.Hour), time.Minute))))
		Expect(s.PoisonedBy[1]).To(And(HaveField("LastError", "broker returned the message: 312 NO_ROUTE"), HaveField("Count", int64(2))))
		Expect(s.Parked).To(Equal(ptr.To(int64(0))))

		replay := outboxReplay(ns, v1alpha1.ReplayActionReplay, v1alpha1.RowSelector{LastErrorPattern: "routing key is % bytes%"})
		Expect(k8s.Create(ctx, replay)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayComplete)).Should(And(Not(BeNil()),
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "RowsReplayed"),
			HaveField("Message", "Replayed 5 of 5 matched rows of "+table), HaveField("ObservedGeneration", replay.Generation)))
		replay = get(ctx, replay)
		st := replay.Status
		Expect(st.ObservedGeneration).To(Equal(replay.Generation))
		Expect(st.Matched).To(Equal(ptr.To(int64(5))))
		Expect(st.Changed).To(Equal(ptr.To(int64(5))))
		Expect(st.RowIDs).To(ConsistOf(tooLong))
		Expect(st.Table).To(Equal(table))
		Expect(st.MaxAttempts).To(Equal(int32(3)))
		Expect(st.StartTime).NotTo(BeNil())
		Expect(st.CompletionTime.Time).To(BeTemporally(">=", st.StartTime.Time))
		Expect(replayCondition(ctx, replay, v1alpha1.ReplayFailed)()).To(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("ObservedGeneration", replay.Generation)))
		Expect(rowCount(ctx, table, "attempts = 0 AND last_error IS NULL AND available_at <= now()")).To(Equal(7), "the 5 replayed and the 2 healthy")
		Expect(rowCount(ctx, table, "last_error LIKE 'broker returned%' AND attempts = 3 AND available_at = 'infinity'")).To(Equal(2))
		Eventually(replayEvents(ctx, replay)).Should(ConsistOf("Normal RowsReplayed: Replayed 5 of 5 matched rows of " + table + " (related OutboxDrainer/orders)"))

		By("the OutboxDrainer's poisoned count following at once, not a status interval later")
		Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Poisoned }).Should(Equal(ptr.To(int64(2))))

		By("kubectl get outboxreplays showing the drainer, the action, the dry run, matched, changed, complete and age")
		out := kubectl("get", "outboxreplays", "-n", ns)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2), out)
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "DRAINER", "ACTION", "DRYRUN", "MATCHED", "CHANGED", "COMPLETE", "AGE"}))
		Expect(lines[1]).To(MatchRegexp(`^` + replay.Name + `\s+orders\s+replay\s+false\s+5\s+5\s+True\s+\d+s$`))
		Expect(kubectl("get", "orp", "-n", ns)).To(ContainSubstring(replay.Name), "the short name")

		By("never running again: the same rows poisoned again stay poisoned, through a re-reconcile and a restarted operator's")
		runSQL(ctx, "UPDATE "+table+" SET attempts = 3, available_at = 'infinity', last_error = 'routing key is 300 bytes again' WHERE id::text = ANY($1)", tooLong)
		before := get(ctx, replay.DeepCopy())
		restarted := &controllers.OutboxReplayReconciler{Client: k8s, APIReader: k8s, Recorder: replays.Recorder, Timeout: probeTimeout}
		for _, r := range []*controllers.OutboxReplayReconciler{replays, restarted} {
			_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(replay)})
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(rowCount(ctx, table, "attempts = 3 AND available_at = 'infinity'")).To(Equal(7))
		Expect(get(ctx, replay.DeepCopy()).ResourceVersion).To(Equal(before.ResourceVersion), "the record is left as it was")
		Expect(replayEvents(ctx, replay)()).To(HaveLen(1))
	})

	It("counts and records in a dry run what would change, and changes nothing", func(ctx SpecContext) {
		connectionSecrets(ctx, ns)
		Expect(k8s.Create(ctx, od)).To(Succeed())
		before := rowsOf(ctx, table)
		replay := outboxReplay(ns, v1alpha1.ReplayActionPark, v1alpha1.RowSelector{})
		replay.Spec.DryRun = true
		Expect(k8s.Create(ctx, replay)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayComplete)).Should(And(Not(BeNil()),
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "DryRun"),
			HaveField("Message", "Dry run: 7 rows of "+table+" match and would be parked; nothing changed")))
		st := get(ctx, replay).Status
		Expect(st.Matched).To(Equal(ptr.To(int64(7))))
		Expect(st.Changed).To(Equal(ptr.To(int64(0))))
		Expect(st.RowIDs).To(ConsistOf(append(append([]string{}, tooLong...), returned...)))
		Expect(st.RowIDs).NotTo(ContainElements(healthy))
		Expect(st.RowIDs).NotTo(ContainElements(published))
		Expect(rowsOf(ctx, table)).To(Equal(before), "nothing changed")
		Eventually(replayEvents(ctx, replay)).Should(ContainElement(HavePrefix("Normal DryRun: Dry run: 7 rows")))
	})

	It("parks rows out of the poisoned count, and replays them from the park", func(ctx SpecContext) {
		connectionSecrets(ctx, ns)
		Expect(k8s.Create(ctx, od)).To(Succeed())
		park := outboxReplay(ns, v1alpha1.ReplayActionPark, v1alpha1.RowSelector{IDs: returned})
		Expect(k8s.Create(ctx, park)).To(Succeed())
		Eventually(replayCondition(ctx, park, v1alpha1.ReplayComplete)).Should(And(Not(BeNil()), HaveField("Reason", "RowsParked"),
			HaveField("Message", "Parked 2 of 2 matched rows of "+table)))
		Expect(rowCount(ctx, table, "parked_at IS NOT NULL")).To(Equal(2))
		Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Parked }).Should(Equal(ptr.To(int64(2))))
		s := get(ctx, od.DeepCopy()).Status
		Expect(s.Poisoned).To(Equal(ptr.To(int64(5))))
		Expect(s.Backlog).To(Equal(ptr.To(int64(2))), "parked rows are no backlog either")

		unpark := outboxReplay(ns, v1alpha1.ReplayActionReplay, v1alpha1.RowSelector{Parked: true})
		Expect(k8s.Create(ctx, unpark)).To(Succeed())
		Eventually(replayCondition(ctx, unpark, v1alpha1.ReplayComplete)).Should(And(Not(BeNil()), HaveField("Reason", "RowsReplayed"),
			HaveField("Message", "Replayed 2 of 2 matched rows of "+table)))
		Expect(get(ctx, unpark).Status.RowIDs).To(ConsistOf(returned))
		Expect(rowCount(ctx, table, "parked_at IS NULL AND attempts = 0 AND last_error IS NULL")).To(Equal(4))
	})

	It("waits for a missing OutboxDrainer, saying so, and runs as soon as it is created", func(ctx SpecContext) {
		connectionSecrets(ctx, ns)
		replay := outboxReplay(ns, v1alpha1.ReplayActionReplay, v1alpha1.RowSelector{IDs: returned[:1]})
		Expect(k8s.Create(ctx, replay)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayComplete)).Should(And(Not(BeNil()),
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "OutboxDrainerNotFound"),
			HaveField("Message", fmt.Sprintf("OutboxDrainer %q was not found in namespace %q", "orders", ns))))
		Expect(replayCondition(ctx, replay, v1alpha1.ReplayFailed)()).To(HaveField("Status", metav1.ConditionFalse), "it is retried")
		Eventually(replayEvents(ctx, replay)).Should(ContainElement(fmt.Sprintf(
			"Warning OutboxDrainerNotFound: OutboxDrainer %q was not found in namespace %q (related none)", "orders", ns)))

		// Its creation is watched, so the replay need not wait out its backoff.
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayComplete)).Should(HaveField("Reason", "RowsReplayed"))
		Expect(get(ctx, replay).Status.RowIDs).To(Equal(returned[:1]))
	})

	It("retries an unreachable database with a backoff, says so in its conditions without the password, and runs once it is reachable", func(ctx SpecContext) {
		const password = "s3cr3t-pw"
		secret(ctx, ns, "orders-db", "postgres://spillway:"+password+"@127.0.0.1:1/test?connect_timeout=2")
		secret(ctx, ns, "rabbit", testenv.BrokerURL())
		Expect(k8s.Create(ctx, od)).To(Succeed())
		replay := outboxReplay(ns, v1alpha1.ReplayActionReplay, v1alpha1.RowSelector{})
		Expect(k8s.Create(ctx, replay)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayComplete)).Should(And(Not(BeNil()),
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ConnectionFailed"),
			HaveField("Message", ContainSubstring("postgres://spillway:xxxxx@127.0.0.1:1/test"))))
		Eventually(replayEvents(ctx, replay)).Should(ContainElement(HavePrefix("Warning ConnectionFailed: ")))
		for _, c := range get(ctx, replay.DeepCopy()).Status.Conditions {
			Expect(c.Message).NotTo(ContainSubstring(password))
		}
		Expect(replayEvents(ctx, replay)()).To(HaveEach(Not(ContainSubstring(password))))
		Expect(rowCount(ctx, table, "attempts = 3 AND available_at = 'infinity' AND published_at IS NULL")).To(Equal(7))

		dbSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orders-db", Namespace: ns}}
		dbSecret = get(ctx, dbSecret)
		dbSecret.Data = map[string][]byte{"url": []byte(testenv.DatabaseURL())}
		Expect(k8s.Update(ctx, dbSecret)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayComplete)).WithTimeout(30 * time.Second).
			Should(HaveField("Message", "Replayed 7 of 7 matched rows of "+table))
	})

	It("fails for good on a selector the table cannot answer, naming the field, the value and the rule", func(ctx SpecContext) {
		connectionSecrets(ctx, ns)
		Expect(k8s.Create(ctx, od)).To(Succeed())
		replay := outboxReplay(ns, v1alpha1.ReplayActionReplay, v1alpha1.RowSelector{IDs: []string{"42"}})
		Expect(k8s.Create(ctx, replay)).To(Succeed())
		Eventually(replayCondition(ctx, replay, v1alpha1.ReplayFailed)).Should(And(Not(BeNil()),
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "InvalidSelector"),
			HaveField("Message", ContainSubstring(`spec.selector.ids[0]: Invalid value: "42": must be a UUID, as the id column is uuid`))))
		Expect(replayCondition(ctx, replay, v1alpha1.ReplayComplete)()).To(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", "InvalidSelector")))
		Eventually(replayEvents(ctx, replay)).Should(ContainElement(HavePrefix(`Warning InvalidSelector: spec.selector.ids[0]: Invalid value: "42"`)))
		Expect(get(ctx, replay.DeepCopy()).Status.Matched).To(BeNil())
		Expect(rowCount(ctx, table, "attempts = 3 AND available_at = 'infinity' AND published_at IS NULL")).To(Equal(7))
	})
})
