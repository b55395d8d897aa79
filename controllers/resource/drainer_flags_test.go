package resource

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("The drainer's view of the spec", func() {
	It("maps every logical column of the drainer's contract, in its order", func() {
		var names []string
		for _, m := range columnMapping(v1alpha1.Columns{}) {
			names = append(names, m[0])
		}
		Expect(names).To(Equal(outbox.ColumnFlagNames()))
	})

	It("is the table spec a drainer would build from the same flags", func() {
		db := v1alpha1.DatabaseSpec{
			Table:      "public.athena_outbox",
			Columns:    v1alpha1.Columns{ID: "event_id", EnqueuedAt: "created_at", LastError: "error"},
			RoutingKey: v1alpha1.RoutingKey{Column: "kind"},
		}
		spec, err := TableSpec(db, &v1alpha1.Ordering{KeyColumn: "aggregate_id", OnFailure: "skip"})
		Expect(err).NotTo(HaveOccurred())
		Expect(spec).To(Equal(outbox.TableSpec{
			Name:       "public.athena_outbox",
			Columns:    outbox.Columns{ID: "event_id", EnqueuedAt: "created_at", LastError: "error"},
			RoutingKey: outbox.RoutingKey{Column: "kind"},
			Ordering:   outbox.Ordering{KeyColumn: "aggregate_id", OnFailure: "skip"},
		}))
		Expect(spec.Validate(field.NewPath("spec", "database"))).To(BeEmpty())
	})
})
