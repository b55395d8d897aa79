package webhook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
)

// maxBatchRows bounds a batch request's rows.
const maxBatchRows = 1000

// envelope is one row in a batch request's body, a JSON array of them. The
// payload is embedded as it is where the payload column holds JSON, as a
// string where it holds text, and as base64 where it holds bytes;
// payloadEncoding says which.
type envelope struct {
	ID              string          `json:"id"`
	RoutingKey      *string         `json:"routingKey"`
	EnqueuedAt      time.Time       `json:"enqueuedAt"`
	Headers         json.RawMessage `json:"headers"`
	Payload         json.RawMessage `json:"payload"`
	PayloadEncoding string          `json:"payloadEncoding"`
	// TraceParent and TraceState are the row's trace context, which a
	// request of many rows cannot carry as its headers.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// Payload encodings of an envelope.
const (
	encodingJSON   = "json"
	encodingText   = "text"
	encodingBase64 = "base64"
)

// envelopeOf turns a row into its envelope's JSON, with tc as its trace
// context, or says why the row cannot be sent. payloadType is the payload
// column's type.
func envelopeOf(row outbox.Row, tc sink.Trace, payloadType string, maxPayloadBytes int64) (*request, *sink.RowFault) {
	if fault := sink.Oversized(row, maxPayloadBytes); fault != nil {
		return nil, fault
	}
	e := envelope{ID: row.ID, RoutingKey: row.RoutingKey, EnqueuedAt: row.EnqueuedAt, Headers: json.RawMessage("null"),
		TraceParent: tc.Parent, TraceState: tc.State}
	if len(row.Headers) > 0 {
		if !bytes.HasPrefix(bytes.TrimSpace(row.Headers), []byte("{")) && !bytes.Equal(row.Headers, []byte("null")) {
			return nil, &sink.RowFault{Reason: reasonBadHeaders, Detail: "headers: must be a JSON object"}
		}
		e.Headers = row.Headers
	}
	switch payloadType {
	case "jsonb", "json":
		e.Payload, e.PayloadEncoding = row.Payload, encodingJSON
	case "text":
		e.Payload, e.PayloadEncoding = quoted(string(row.Payload)), encodingText
	default:
		e.Payload, e.PayloadEncoding = quoted(base64.StdEncoding.EncodeToString(row.Payload)), encodingBase64
	}
	body, err := json.Marshal(e)
	if err != nil {
		return nil, &sink.RowFault{Reason: reasonBadHeaders, Detail: fmt.Sprintf("envelope: %v", err)}
	}
	return &request{id: row.ID, body: body}, nil
}

func quoted(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// batchOf is the request that carries rows, envelopes each: a JSON array
// of them, named by its first row's id and its size.
func batchOf(rows []*request) *request {
	var body bytes.Buffer
	body.WriteByte('[')
	for i, r := range rows {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(r.body)
	}
	body.WriteByte(']')
	header := http.Header{}
	header.Set("Content-Type", "application/json")
	if rows[0].event {
		header.Set("Content-Type", sink.BatchContentType)
	}
	header.Set("Webhook-Batch-Size", strconv.Itoa(len(rows)))
	return &request{id: "batch_" + rows[0].id + "_" + strconv.Itoa(len(rows)), body: body.Bytes(), header: header}
}
