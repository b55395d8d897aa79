package sink

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("A row as a structured CloudEvent", func() {
	key := "order.created"
	row := outbox.Row{ID: "row-1", RoutingKey: &key, EnqueuedAt: time.Date(2026, 12, 7, 5, 0, 0, 123456000, time.UTC)}
	format := Format{Mode: CloudEventsStructured, Source: "urn:shop:orders"}

	DescribeTable("embeds the payload as its content type allows",
		func(contentType, payload, want string) {
			body, fault := format.AsStructured(row, contentType, []byte(payload), Trace{})
			Expect(fault).To(BeNil())
			Expect(body).To(MatchJSON(`{"specversion":"1.0","id":"row-1","source":"urn:shop:orders","type":"order.created",
				"time":"2026-12-07T05:00:00.123456Z","datacontenttype":"` + contentType + `",` + want + `}`))
		},
		Entry("JSON as it is", "application/json", `{"n":1}`, `"data":{"n":1}`),
		Entry("text as a string", "text/plain; charset=utf-8", "hello", `"data":"hello"`),
		Entry("bytes as base64", "application/octet-stream", "\x00\x01", `"data_base64":"AAE="`),
	)

	It("carries the trace context as the distributed tracing extension", func() {
		body, fault := format.AsStructured(row, "application/json", []byte(`{}`), Trace{Parent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", State: "v=1"})
		Expect(fault).To(BeNil())
		Expect(string(body)).To(And(ContainSubstring(`"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"`), ContainSubstring(`"tracestate":"v=1"`)))
	})

	It("fails a row whose JSON payload is not JSON, and a row with no routing key to be its type, saying why", func() {
		_, fault := format.AsStructured(row, "application/json", []byte(`{not json`), Trace{})
		Expect(fault).To(HaveField("Reason", ReasonBadPayload))
		Expect(fault.Detail).To(ContainSubstring("not the JSON its content type application/json says"))
		_, fault = format.AsStructured(outbox.Row{ID: "row-2"}, "application/json", []byte(`{}`), Trace{})
		Expect(fault).To(HaveField("Reason", ReasonNoEventType))
		Expect(fault.Detail).To(ContainSubstring("routing key"))
	})
})
