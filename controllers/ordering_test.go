package controllers_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

var _ = Describe("An OutboxDrainer with per-key ordering", func() {
	It("passes spec.ordering to the drainers' flags, and shows the blocked keys in the status and the wide columns", func(ctx SpecContext) {
		ns := namespace(ctx)
		table := outboxTable(ctx)
		runSQL(ctx, "ALTER TABLE "+table+" ADD COLUMN aggregate_id text")
		// Blocked: order-7 by a row in backoff, order-3 by a poisoned one
		// (maxAttempts is 3). Not blocked: order-9, whose failed row was
		// parked, order-1, whose rows never failed, and a published failure.
		runSQL(ctx, `INSERT INTO `+table+` (event_type, payload, aggregate_id, enqueued_at, attempts, available_at, parked_at, published_at) VALUES
			('order.created', '{}', 'order-7', now() - interval '10 minutes', 1, now() + interval '1 hour', NULL, NULL),
			('order.paid',    '{}', 'order-7', now() - interval '9 minutes', 0, '9999-12-31', NULL, NULL),
			('order.created', '{}', 'order-3', now() - interval '1 hour', 3, 'infinity', NULL, NULL),
			('order.created', '{}', 'order-9', now() - interval '2 hours', 3, 'infinity', now(), NULL),
			('order.created', '{}', 'order-1', now(), 0, now(), NULL, NULL),
			('order.created', '{}', 'order-5', now() - interval '3 hours', 2, now(), NULL, now())`)
		connectionSecrets(ctx, ns)
		od := outboxDrainer(ns, table)
		od.Spec.Ordering = &v1alpha1.Ordering{KeyColumn: "aggregate_id"}
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Expect(get(ctx, od.DeepCopy()).Spec.Ordering.OnFailure).To(Equal("block"), "the schema's default")

		Expect(deploymentOf(ctx, od).Spec.Template.Spec.Containers[0].Args).To(ContainElements(
			"--ordering-key-column=aggregate_id", "--ordering-on-failure=block"))

		Eventually(func() *v1alpha1.BlockedKeys { return get(ctx, od.DeepCopy()).Status.BlockedKeys }).Should(And(
			HaveField("Count", int64(2)), HaveField("OldestKey", "order-3"),
			HaveField("OldestEnqueuedAt", HaveField("Time", BeTemporally("~", time.Now().Add(-time.Hour), 10*time.Second)))))
		out := kubectl("get", "outboxdrainers", "-n", ns, "-o", "wide")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2), out)
		header := strings.Fields(lines[0])
		Expect(header[len(header)-2:]).To(Equal([]string{"BLOCKED", "SINK"}), out)
		fields := strings.Fields(lines[1])
		Expect(fields[len(fields)-2:]).To(Equal([]string{"2", "RabbitMQ"}), out)

		// The poisoned row is parked: order-3 goes on, and the status follows.
		runSQL(ctx, "UPDATE "+table+" SET parked_at = now() WHERE aggregate_id = 'order-3'")
		Eventually(func() *v1alpha1.BlockedKeys { return get(ctx, od.DeepCopy()).Status.BlockedKeys }).
			WithTimeout(statusInterval + 5*time.Second).Should(And(HaveField("Count", int64(1)), HaveField("OldestKey", "order-7")))

		// Under skip no key is blocked, and the status says nothing of it.
		patched := get(ctx, od.DeepCopy())
		patched.Spec.Ordering.OnFailure = "skip"
		Expect(k8s.Update(ctx, patched)).To(Succeed())
		Eventually(func() []string { return deploymentOf(ctx, od).Spec.Template.Spec.Containers[0].Args }).Should(ContainElement("--ordering-on-failure=skip"))
		Eventually(func() *v1alpha1.BlockedKeys { return get(ctx, od.DeepCopy()).Status.BlockedKeys }).
			WithTimeout(statusInterval + 5*time.Second).Should(BeNil())
		Expect(get(ctx, od.DeepCopy()).Status.ObservedGeneration).To(BeNumerically(">=", patched.Generation))
	})
})
