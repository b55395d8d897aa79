package drainer

import (
	"bytes"
	"encoding/json"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Failure reasons, used as metric labels. Each one counts an attempt.
const (
	reasonNack         = "nack"
	reasonReturned     = "returned"
	reasonOversized    = "oversized"
	reasonBadHeaders   = "bad_headers"
	reasonNoRoutingKey = "no_routing_key"
	maxLastErrorLength = 1000
	contentTypeJSON    = "application/json"
	contentTypeBinary  = "application/octet-stream"
	contentTypePlain   = "text/plain; charset=utf-8"
)

// rowFault is why a row cannot be published. It is the row's own fault, so
// it counts an attempt, and enough of them poison the row.
type rowFault struct {
	reason string // metric label
	detail string // stored in last_error
}

func (f *rowFault) Error() string { return f.detail }

// contentTypeFor derives a message's content type from the payload column.
func contentTypeFor(payloadType string) string {
	switch payloadType {
	case "jsonb", "json":
		return contentTypeJSON
	case "text":
		return contentTypePlain
	default:
		return contentTypeBinary
	}
}

// buildMessage turns a claimed row into its routing key and message, or says
// why the row cannot be published.
func buildMessage(row Row, contentType string, maxPayloadBytes int64) (string, amqp.Publishing, *rowFault) {
	if row.Payload == nil {
		return "", amqp.Publishing{}, &rowFault{reasonOversized,
			fmt.Sprintf("payload is %d bytes, over the %d-byte limit (maxPayloadBytes)", row.Size, maxPayloadBytes)}
	}
	if row.RoutingKey == nil {
		return "", amqp.Publishing{}, &rowFault{reasonNoRoutingKey, "routing key is NULL"}
	}
	headers, err := amqpHeaders(row.Headers)
	if err != nil {
		return "", amqp.Publishing{}, &rowFault{reasonBadHeaders, "headers: " + err.Error()}
	}
	return *row.RoutingKey, amqp.Publishing{
		Headers:      headers,
		ContentType:  contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    row.ID,
		Timestamp:    row.EnqueuedAt,
		Body:         row.Payload,
	}, nil
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
		return nil, fmt.Errorf("must be a JSON object, got %s", truncate(string(raw), 80))
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
