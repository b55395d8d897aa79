package drainer

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	amqp "github.com/rabbitmq/amqp091-go"
)

var _ = Describe("Building a message from a row", func() {
	key := "order.created"
	row := func() Row {
		return Row{ID: "42", Payload: []byte(`{"n":1}`), Size: 7, RoutingKey: &key,
			Headers:    []byte(`{"tenant":"acme","version":3,"ratio":0.5,"tags":["a"],"trace":{"id":"t1"}}`),
			EnqueuedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	}

	It("is persistent and carries the row id, routing key, headers, content type and enqueue time", func() {
		rk, msg, fault := buildMessage(row(), contentTypeJSON, 1024)
		Expect(fault).To(BeNil())
		Expect(rk).To(Equal("order.created"))
		Expect(msg.DeliveryMode).To(Equal(amqp.Persistent))
		Expect(msg.MessageId).To(Equal("42"))
		Expect(msg.ContentType).To(Equal("application/json"))
		Expect(msg.Timestamp).To(Equal(row().EnqueuedAt))
		Expect(msg.Body).To(Equal([]byte(`{"n":1}`)))
		Expect(msg.Headers).To(Equal(amqp.Table{
			"tenant": "acme", "version": int64(3), "ratio": 0.5, "tags": []any{"a"}, "trace": amqp.Table{"id": "t1"},
		}))
	})

	It("rejects headers that are not a JSON object as the row's fault", func() {
		r := row()
		r.Headers = []byte(`[1,2]`)
		_, _, fault := buildMessage(r, contentTypeJSON, 1024)
		Expect(fault).NotTo(BeNil())
		Expect(fault.reason).To(Equal(reasonBadHeaders))
		Expect(fault.detail).To(ContainSubstring("must be a JSON object"))
	})

	It("rejects a payload the claim left out for its size, saying the size and the limit", func() {
		r := row()
		r.Payload, r.Size = nil, 5000
		_, _, fault := buildMessage(r, contentTypeJSON, 1024)
		Expect(fault.reason).To(Equal(reasonOversized))
		Expect(fault.detail).To(Equal("payload is 5000 bytes, over the 1024-byte limit (maxPayloadBytes)"))
	})

	It("rejects a NULL routing key", func() {
		r := row()
		r.RoutingKey = nil
		_, _, fault := buildMessage(r, contentTypeJSON, 1024)
		Expect(fault.reason).To(Equal(reasonNoRoutingKey))
	})

	It("publishes a row without headers with none", func() {
		r := row()
		r.Headers = nil
		_, msg, fault := buildMessage(r, contentTypeJSON, 1024)
		Expect(fault).To(BeNil())
		Expect(msg.Headers).To(BeNil())
	})

	It("derives the content type from the payload column's type", func() {
		Expect(contentTypeFor("jsonb")).To(Equal("application/json"))
		Expect(contentTypeFor("bytea")).To(Equal("application/octet-stream"))
		Expect(contentTypeFor("text")).To(HavePrefix("text/plain"))
	})

	It("keeps last_error short", func() {
		Expect(len(truncate(strings.Repeat("x", 5000), maxLastErrorLength))).To(BeNumerically("<=", maxLastErrorLength+3))
	})
})
