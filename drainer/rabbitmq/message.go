package rabbitmq

import (
	"bytes"
	"encoding/json"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// Failure reasons, used as metric labels. Each one counts an attempt.
const (
	reasonReturned     = "returned"
	reasonBadHeaders   = "bad_headers"
	reasonNoRoutingKey = "no_routing_key"
	reasonTooLong      = "too_long"
	// appID is a full message's app_id, so consumers can tell who sent it.
	appID = "spillway"
	// maxShortString is AMQP's limit on a short string: routing keys,
	// header keys and message properties. amqp091 closes the connection
	// rather than send a longer one.
	maxShortString = 255
)

// messageLimits are the broker's limits a row is checked against before it
// is published: a message over them would close the connection, with every
// confirm in flight, and come back at the head of the next claim.
type messageLimits struct {
	// maxPayloadBytes is --max-payload-bytes. RabbitMQ does not tell a
	// client its max_message_size, so this is the limit set here.
	maxPayloadBytes int64
	// frameMax is the connection's negotiated frame size: the headers and
	// properties travel in one frame, which must fit.
	frameMax int
}

// MessageProperties is which AMQP properties a message carries beside its
// message_id, delivery mode, content type and headers.
type MessageProperties string

const (
	// FullProperties adds the row's enqueue time as the timestamp, the
	// routing key as the type (so consumers can route and audit without
	// parsing the body) and spillway as the app_id.
	FullProperties MessageProperties = "full"
	// CompactProperties adds nothing. With a uuid id and no headers the
	// properties then take 57 bytes, where full ones take over 64: RabbitMQ
	// keeps a binary of at most 64 bytes on its process heap and a larger
	// one off it, by reference, and in make bench it spent 7–20 % less
	// CPU on each message.
	CompactProperties MessageProperties = "compact"
)

// messageShape is what a drainer puts on every message besides the row.
type messageShape struct {
	contentType string
	properties  MessageProperties
	format      sink.Format
}

// cloudEventsPrefix names a CloudEvents attribute as an AMQP header. The
// CloudEvents AMQP binding's application properties are prefixed
// cloudEvents_ (its earlier cloudEvents: is still read by its SDKs): a name
// that is also an identifier, which JMS and Spring AMQP map to message
// properties and RabbitMQ's headers exchange binds on without quoting.
const cloudEventsPrefix = "cloudEvents_"

// asCloudEvent makes msg a CloudEvent of the row: its attributes as
// headers, or, structured, the whole event as the body.
func asCloudEvent(msg *amqp.Publishing, row outbox.Row, tc sink.Trace, format sink.Format) *sink.RowFault {
	if format.Mode == sink.CloudEventsStructured {
		body, fault := format.AsStructured(row, msg.ContentType, msg.Body, tc)
		if fault != nil {
			return fault
		}
		msg.Body, msg.ContentType = body, sink.StructuredContentType
		return nil
	}
	attrs, fault := format.Event(row, msg.ContentType)
	if fault != nil {
		return fault
	}
	if msg.Headers == nil {
		msg.Headers = amqp.Table{}
	}
	for _, a := range attrs {
		// The binding maps datacontenttype to the content type property.
		if a[0] != "datacontenttype" {
			msg.Headers[cloudEventsPrefix+a[0]] = a[1]
		}
	}
	return nil
}

// buildMessage turns a claimed row into its routing key and message, with
// tc as its trace context headers, or says why the row cannot be published.
func buildMessage(row outbox.Row, tc sink.Trace, shape messageShape, limits messageLimits) (string, amqp.Publishing, *sink.RowFault) {
	if fault := sink.Oversized(row, limits.maxPayloadBytes); fault != nil {
		return "", amqp.Publishing{}, fault
	}
	if row.RoutingKey == nil {
		return "", amqp.Publishing{}, &sink.RowFault{Reason: reasonNoRoutingKey, Detail: "routing key is NULL"}
	}
	key := *row.RoutingKey
	if len(key) > maxShortString {
		return "", amqp.Publishing{}, &sink.RowFault{Reason: reasonTooLong, Detail: fmt.Sprintf("routing key is %d bytes, over the AMQP limit of %d: %s", len(key), maxShortString, secret.Truncate(key, 80))}
	}
	if len(row.ID) > maxShortString {
		return "", amqp.Publishing{}, &sink.RowFault{Reason: reasonTooLong, Detail: fmt.Sprintf("id is %d bytes as text, over the AMQP limit of %d for message_id", len(row.ID), maxShortString)}
	}
	headers, err := amqpHeaders(row.Headers)
	if err != nil {
		return "", amqp.Publishing{}, &sink.RowFault{Reason: reasonBadHeaders, Detail: "headers: " + err.Error()}
	}
	headers = withTrace(headers, tc)
	msg := amqp.Publishing{
		Headers:      headers,
		ContentType:  shape.contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    row.ID,
		Body:         row.Payload,
	}
	if shape.properties != CompactProperties {
		msg.Timestamp, msg.Type, msg.AppId = row.EnqueuedAt, key, appID
	}
	if shape.format.CloudEvents() {
		if fault := asCloudEvent(&msg, row, tc, shape.format); fault != nil {
			return "", amqp.Publishing{}, fault
		}
	}
	// The properties travel in one header frame: its size is the headers'
	// encoded size, at most four short strings and a few fixed fields.
	if size := tableSize(msg.Headers) + 4*(1+maxShortString) + 64; limits.frameMax > 0 && size > limits.frameMax {
		return "", amqp.Publishing{}, &sink.RowFault{Reason: reasonBadHeaders, Detail: fmt.Sprintf("headers take %d bytes encoded, over the broker's frame size of %d", tableSize(msg.Headers), limits.frameMax)}
	}
	return key, msg, nil
}

// withTrace puts tc in headers as the W3C trace context headers, in place of
// whatever the row's headers held under their names.
func withTrace(headers amqp.Table, tc sink.Trace) amqp.Table {
	if headers == nil && tc.Parent == "" {
		return nil
	}
	delete(headers, sink.HeaderTraceParent)
	delete(headers, sink.HeaderTraceState)
	if tc.Parent == "" {
		return headers
	}
	if headers == nil {
		headers = amqp.Table{}
	}
	headers[sink.HeaderTraceParent] = tc.Parent
	if tc.State != "" {
		headers[sink.HeaderTraceState] = tc.State
	}
	return headers
}

// tableSize is the AMQP field-table encoding size of headers (what amqp091
// writes for each type amqpValue produces).
func tableSize(t amqp.Table) int {
	n := 4
	for k, v := range t {
		n += 1 + len(k) + fieldSize(v)
	}
	return n
}

func fieldSize(v any) int {
	switch v := v.(type) {
	case string:
		return 1 + 4 + len(v)
	case amqp.Table:
		return 1 + tableSize(v)
	case []any:
		n := 1 + 4
		for _, e := range v {
			n += fieldSize(e)
		}
		return n
	case bool:
		return 2
	case nil:
		return 1
	default: // int64, float64
		return 9
	}
}

// amqpHeaders converts a JSON object into AMQP headers. Integers stay
// integers; an object nests as a table.
func amqpHeaders(raw []byte) (amqp.Table, error) {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be a JSON object, got %s", secret.Truncate(string(raw), 80))
	}
	table, err := amqpValue(obj)
	if err != nil {
		return nil, err
	}
	headers := table.(amqp.Table)
	if err := headers.Validate(); err != nil {
		return nil, err
	}
	return headers, nil
}

func amqpValue(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		t := make(amqp.Table, len(v))
		for k, e := range v {
			if len(k) > maxShortString {
				return nil, fmt.Errorf("key %s is %d bytes, over the AMQP limit of %d", secret.Truncate(k, 40), len(k), maxShortString)
			}
			c, err := amqpValue(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			t[k] = c
		}
		return t, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := amqpValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i, nil
		}
		f, err := v.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s out of range", v)
		}
		return f, nil
	default: // string, bool, nil
		return v, nil
	}
}
