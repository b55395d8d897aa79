package v1alpha1_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// replayManifest is an OutboxReplay as a user writes it, with only the
// required fields; edit changes its spec before it is applied.
func replayManifest(edit func(spec map[string]any)) *unstructured.Unstructured {
	spec := map[string]any{"drainerRef": map[string]any{"name": "orders"}, "action": "replay"}
	if edit != nil {
		edit(spec)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "spillway.io/v1alpha1",
		"kind":       "OutboxReplay",
		"metadata":   map[string]any{"name": testenv.UniqueObjectName("replay"), "namespace": "default"},
		"spec":       spec,
	}}
}

var _ = Describe("The OutboxReplay schema", func() {
	It("defaults a minimal replay to a real run over the drainer's default selector limit", func(ctx SpecContext) {
		u := replayManifest(nil)
		Expect(k8s.Create(ctx, u)).To(Succeed())
		var r v1alpha1.OutboxReplay
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(u), &r)).To(Succeed())
		Expect(r.Spec.DryRun).To(BeFalse())
		Expect(int(r.Spec.Selector.Limit)).To(Equal(outbox.DefaultSelectorLimit))
		Expect(r.Spec.Selector.IDs).To(BeEmpty())
	})

	DescribeTable("accepts",
		func(ctx SpecContext, edit func(map[string]any)) {
			Expect(k8s.Create(ctx, replayManifest(edit))).To(Succeed())
		},
		Entry("a park by pattern as a dry run", all(set("action", "park"), set("selector.lastErrorPattern", "routing key is %"), set("dryRun", true))),
		Entry("a range", all(set("selector.enqueuedSince", "2026-01-01T00:00:00Z"), set("selector.enqueuedBefore", "2026-01-02T00:00:00Z"))),
		Entry("ids and a limit", all(set("selector.ids", []any{"0b4c5c1e-8a51-4d7e-9f53-6f1f6f1a7e01", "42"}), set("selector.limit", int64(1_000_000)))),
		Entry("a replay of parked rows", set("selector.parked", true)),
	)

	DescribeTable("rejects, naming the field and the rule,",
		func(ctx SpecContext, edit func(map[string]any), message string) {
			err := k8s.Create(ctx, replayManifest(edit))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("an unknown action", set("action", "delete"), `spec.action: Unsupported value: "delete": supported values: "replay", "park"`),
		Entry("no action", unset("action"), "spec.action: Required value"),
		Entry("no drainer", unset("drainerRef"), "spec.drainerRef: Required value"),
		Entry("an empty range", all(set("selector.enqueuedSince", "2026-01-02T00:00:00Z"), set("selector.enqueuedBefore", "2026-01-01T00:00:00Z")),
			"spec.selector.enqueuedBefore: Invalid value: enqueuedBefore 2026-01-01T00:00:00Z must be later than enqueuedSince 2026-01-02T00:00:00Z"),
		Entry("a time that is not one", set("selector.enqueuedSince", "yesterday"), "spec.selector.enqueuedSince"),
		Entry("limit 0", set("selector.limit", int64(0)), "spec.selector.limit: Invalid value: 0: spec.selector.limit in body should be greater than or equal to 1"),
		Entry("a limit over a million", set("selector.limit", int64(1_000_001)), "spec.selector.limit"),
		Entry("an empty id", set("selector.ids", []any{""}), "spec.selector.ids[0]"),
		Entry("an id too long for a message_id", set("selector.ids", []any{strings.Repeat("1", 256)}), "spec.selector.ids[0]: Too long"),
		Entry("an id twice", set("selector.ids", []any{"42", "42"}), `spec.selector.ids[1]: Duplicate value: "42"`),
		Entry("a huge pattern", set("selector.lastErrorPattern", strings.Repeat("%", 1025)), "spec.selector.lastErrorPattern: Too long"),
		Entry("parking parked rows", all(set("action", "park"), set("selector.parked", true)),
			"spec.selector.parked: Invalid value: parked: true picks parked rows, which park cannot take"),
	)

	It("keeps the spec immutable, so the resource stays the record of what was asked", func(ctx SpecContext) {
		u := replayManifest(set("selector.lastErrorPattern", "routing key%"))
		Expect(k8s.Create(ctx, u)).To(Succeed())
		Expect(unstructured.SetNestedField(u.Object, "%", "spec", "selector", "lastErrorPattern")).To(Succeed())
		err := k8s.Update(ctx, u)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("spec is immutable: an OutboxReplay records one change; create another"))

		var r v1alpha1.OutboxReplay
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(u), &r)).To(Succeed())
		r.Labels = map[string]string{"ticket": "ops-1234"}
		Expect(k8s.Update(ctx, &r)).To(Succeed(), "metadata may still change")
	})
})
