package packaging

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
)

var _ = Describe("Who may replay poisoned rows", func() {
	aggregation := []string{"rbac.authorization.k8s.io/aggregate-to-admin", "rbac.authorization.k8s.io/aggregate-to-edit",
		"rbac.authorization.k8s.io/aggregate-to-view"}
	aggregatedTo := func(role rbacv1.ClusterRole) []string {
		var out []string
		for _, label := range aggregation {
			if role.Labels[label] == "true" {
				out = append(out, label)
			}
		}
		return out
	}

	It("is decided by ClusterRoles of their own, aggregated to admin and edit (and view to read), the same in the chart and config/rbac", func() {
		generated := manifestsFile("config/rbac/outboxreplay_roles.yaml")
		for _, values := range [][]string{nil, {"--set", "watchNamespaces={shop}"}} {
			objs := mustRender(values...)
			for _, suffix := range []string{"-outboxreplay-editor", "-outboxreplay-viewer"} {
				chart := object[rbacv1.ClusterRole](objs, "ClusterRole", "spillway"+suffix)
				config := object[rbacv1.ClusterRole](generated, "ClusterRole", "spillway"+suffix)
				Expect(normalized(chart.Rules)).To(Equal(normalized(config.Rules)), suffix)
				Expect(aggregatedTo(chart)).To(Equal(aggregatedTo(config)), suffix)
			}
		}
		editor := object[rbacv1.ClusterRole](generated, "ClusterRole", "spillway-outboxreplay-editor")
		Expect(aggregatedTo(editor)).To(ConsistOf(aggregation[0], aggregation[1]))
		Expect(editor.Rules).To(ContainElement(HaveField("Verbs", ConsistOf("create", "delete", "get", "list", "watch"))),
			"no update or patch: the spec is immutable")
		viewer := object[rbacv1.ClusterRole](generated, "ClusterRole", "spillway-outboxreplay-viewer")
		Expect(aggregatedTo(viewer)).To(ConsistOf(aggregation[2]))
	})

	It("is left to explicit bindings when aggregation is off, and absent without RBAC", func() {
		objs := mustRender("--set", "rbac.outboxReplays.aggregate=false")
		for _, name := range []string{"spillway-outboxreplay-editor", "spillway-outboxreplay-viewer"} {
			Expect(aggregatedTo(object[rbacv1.ClusterRole](objs, "ClusterRole", name))).To(BeEmpty(), name)
		}
		Expect(kinds(mustRender("--set", "rbac.create=false"))).NotTo(ContainElement(HaveSuffix("-outboxreplay-editor")))
	})
})
