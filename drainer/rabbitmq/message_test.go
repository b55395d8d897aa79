package rabbitmq

import (
	"github.com/spillway-io/spillway/drainer/sink"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/outbox"
)

var _ = Describe("Building a message from a row", func() {
	key := "order.created"
	limits := messageLimits{maxPayloadBytes: 1024, frameMax: 131072}
	full := messageShape{contentType: "application/json", properties: FullProperties}
	row := func() outbox.Row {
		return outbox.Row{ID: "42", Payload: []byte(`{"n":1}`), Size: 7, RoutingKey: &key,
			Headers:    []byte(`{"tenant":"acme","version":3,"ratio":0.5,"tags":["a"],"trace":{"id":"t1"}}`),
			EnqueuedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	}

	It("is persistent and carries the row id, routing key, headers, content type, enqueue time, the event type as its type and spillway as its app_id", func() {
		rk, msg, fault := buildMessage(row(), sink.Trace{}, full, limits)
		Expect(fault).To(BeNil())
		Expect(rk).To(Equal("order.created"))
		Expect(msg.DeliveryMode).To(Equal(amqp.Persistent))
		Expect(msg.MessageId).To(Equal("42"))
		Expect(msg.ContentType).To(Equal("application/json"))
		Expect(msg.Timestamp).To(Equal(row().EnqueuedAt))
		Expect(msg.Type).To(Equal("order.created"))
		Expect(msg.AppId).To(Equal("spillway"))
		Expect(msg.Body).To(Equal([]byte(`{"n":1}`)))
		Expect(msg.Headers).To(Equal(amqp.Table{
			"tenant": "acme", "version": int64(3), "ratio": 0.5, "tags": []any{"a"}, "trace": amqp.Table{"id": "t1"},
		}))
	})

	It("with compact properties, carries no timestamp, type or app_id, and a uuid row's properties fit RabbitMQ's 64 bytes", func() {
		r := row()
		r.ID, r.Headers = "0b6f1c9e-5d0a-4c4e-9a57-3f2d8e1b7c60", nil
		_, msg, fault := buildMessage(r, sink.Trace{}, messageShape{contentType: "application/json", properties: CompactProperties}, limits)
		Expect(fault).To(BeNil())
		Expect(msg.MessageId).To(Equal(r.ID))
		Expect(msg.DeliveryMode).To(Equal(amqp.Persistent))
		Expect(msg.ContentType).To(Equal("application/json"))
		Expect(msg.Timestamp.IsZero()).To(BeTrue())
		Expect(msg.Type).To(BeEmpty())
		Expect(msg.AppId).To(BeEmpty())
		Expect(encodedProperties(msg)).To(BeNumerically("<=", 64))

		_, msg, _ = buildMessage(r, sink.Trace{}, full, limits)
		Expect(encodedProperties(msg)).To(BeNumerically(">", 64), "what compact is for")
	})

	It("rejects headers that are not a JSON object as the row's fault", func() {
		r := row()
		r.Headers = []byte(`[1,2]`)
		_, _, fault := buildMessage(r, sink.Trace{}, full, limits)
		Expect(fault).NotTo(BeNil())
		Expect(fault.Reason).To(Equal(reasonBadHeaders))
		Expect(fault.Detail).To(ContainSubstring("must be a JSON object"))
	})

	It("rejects a payload the claim left out for its size, saying the size and the limit", func() {
		r := row()
		r.Payload, r.Size = nil, 5000
		_, _, fault := buildMessage(r, sink.Trace{}, full, limits)
		Expect(fault.Reason).To(Equal(sink.ReasonOversized))
		Expect(fault.Detail).To(Equal("payload is 5000 bytes, over the 1024-byte limit (maxPayloadBytes)"))
	})

	It("rejects a NULL routing key", func() {
		r := row()
		r.RoutingKey = nil
		_, _, fault := buildMessage(r, sink.Trace{}, full, limits)
		Expect(fault.Reason).To(Equal(reasonNoRoutingKey))
	})

	DescribeTable("rejects, as the row's fault, what would make amqp091 or the broker close the connection",
		func(mutate func(*outbox.Row), reason, detail string) {
			r := row()
			mutate(&r)
			_, _, fault := buildMessage(r, sink.Trace{}, full, limits)
			Expect(fault).NotTo(BeNil())
			Expect(fault.Reason).To(Equal(reason))
			Expect(fault.Detail).To(ContainSubstring(detail))
		},
		Entry("a routing key over 255 bytes", func(r *outbox.Row) { k := strings.Repeat("a", 256); r.RoutingKey = &k },
			reasonTooLong, "routing key is 256 bytes, over the AMQP limit of 255"),
		Entry("an id over 255 bytes, the message_id", func(r *outbox.Row) { r.ID = strings.Repeat("7", 300) },
			reasonTooLong, "id is 300 bytes as text, over the AMQP limit of 255 for message_id"),
		Entry("a header key over 255 bytes", func(r *outbox.Row) { r.Headers = []byte(`{"` + strings.Repeat("k", 256) + `": 1}`) },
			reasonBadHeaders, "is 256 bytes, over the AMQP limit of 255"),
		Entry("a nested header key over 255 bytes", func(r *outbox.Row) { r.Headers = []byte(`{"trace": {"` + strings.Repeat("k", 300) + `": 1}}`) },
			reasonBadHeaders, "trace: key"),
		Entry("headers larger than the broker's frame", func(r *outbox.Row) { r.Headers = []byte(`{"big": "` + strings.Repeat("x", 140_000) + `"}`) },
			reasonBadHeaders, "over the broker's frame size of 131072"),
	)

	It("accepts a routing key of exactly 255 bytes", func() {
		r := row()
		k := strings.Repeat("a", 255)
		r.RoutingKey = &k
		_, _, fault := buildMessage(r, sink.Trace{}, full, limits)
		Expect(fault).To(BeNil())
	})

	It("publishes a row without headers with none", func() {
		r := row()
		r.Headers = nil
		_, msg, fault := buildMessage(r, sink.Trace{}, full, limits)
		Expect(fault).To(BeNil())
		Expect(msg.Headers).To(BeNil())
	})

})

// encodedProperties is the size of msg's properties as AMQP 0-9-1 encodes
// them in a header frame, for the properties a drainer sets without headers:
// two bytes of flags, each short string with its length byte, the delivery
// mode's byte and the timestamp's eight.
func encodedProperties(msg amqp.Publishing) int {
	n := 2 + 1 // flags, delivery mode
	for _, s := range []string{msg.ContentType, msg.MessageId, msg.Type, msg.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if !msg.Timestamp.IsZero() {
		n += 8
	}
	return n
}
