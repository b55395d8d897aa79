package controllers_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("An OutboxDrainer with a webhook sink", func() {
	It("runs drainers that post to the webhook, says which Secret is missing, and shows its sink in the wide columns", func(ctx SpecContext) {
		ns := namespace(ctx)
		table := outboxTable(ctx)
		secret(ctx, ns, "orders-db", testenv.DatabaseURL())
		secret(ctx, ns, "partner", "https://user:hunter2@hooks.partner.example/orders")
		od := outboxDrainer(ns, table)
		od.Spec.Broker = v1alpha1.BrokerSpec{}
		od.Spec.Sink = &v1alpha1.SinkSpec{Webhook: &v1alpha1.WebhookSpec{
			URLSecretRef:     v1alpha1.SecretKeyRef{Name: "partner", Key: "url"},
			SigningSecretRef: v1alpha1.SecretKeyRef{Name: "partner-signing", Key: "secret"},
		}}
		Expect(k8s.Create(ctx, od)).To(Succeed())
		Expect(deploymentOf(ctx, od).Spec.Template.Spec.Containers[0].Args).To(ContainElements(
			"--sink=webhook", "--webhook-url-file=/var/run/secrets/spillway/webhook/url", "--webhook-timeout=10s", "--webhook-header-prefix=X-Outbox-"))
		Eventually(condition(ctx, od, v1alpha1.ConditionReady)).Should(And(Not(BeNil()), HaveField("Reason", "SecretNotFound"),
			HaveField("Message", ContainSubstring(`Secret "partner-signing" (webhook signing secret) was not found`))))
		Expect(condition(ctx, od, v1alpha1.ConditionReady)().Message).NotTo(ContainSubstring("hunter2"))
		Eventually(func() string { return get(ctx, od.DeepCopy()).Status.Sink }).Should(Equal(v1alpha1.SinkWebhook))

		out := kubectl("get", "outboxdrainers", "-n", ns, "-o", "wide")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(2), out)
		Expect(strings.Fields(lines[0])).To(HaveExactElements("NAME", "READY", "REPLICAS", "BACKLOG", "POISONED", "OLDEST", "AGE", "DESIRED", "BLOCKED", "SINK"), out)
		Expect(lines[1]).To(HavePrefix("orders"), out)
		Expect(lines[1]).To(HaveSuffix("Webhook"), out)
	})
})
