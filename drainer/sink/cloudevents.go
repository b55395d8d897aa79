package sink

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spillway-io/spillway/outbox"
)

// Format is how a message presents its row: as it is (the zero Format), or
// as a CloudEvent, its attributes beside the payload (binary mode) or the
// payload inside a JSON event (structured mode).
type Format struct {
	Mode FormatMode
	// Source is every event's source attribute.
	Source string
}

// FormatMode is one of the message formats.
type FormatMode string

const (
	// Plain is the row as it is: no CloudEvents attributes.
	Plain FormatMode = "plain"
	// CloudEventsBinary adds the CloudEvents attributes as headers, the
	// payload staying the body.
	CloudEventsBinary FormatMode = "cloudevents"
	// CloudEventsStructured sends each row as an application/cloudevents+json
	// event, its payload as the event's data.
	CloudEventsStructured FormatMode = "cloudevents-structured"
)

// FormatModes are the modes --message-format takes.
var FormatModes = []FormatMode{Plain, CloudEventsBinary, CloudEventsStructured}

// StructuredContentType is the content type of a structured event, and of a
// batch of them.
const (
	StructuredContentType = "application/cloudevents+json; charset=UTF-8"
	BatchContentType      = "application/cloudevents-batch+json; charset=UTF-8"
)

// Failure reasons of a row that cannot be a CloudEvent: it would have no
// type (its routing key is NULL), or its payload is not what its content
// type says, which a structured event's data must be.
const (
	ReasonNoEventType = "no_event_type"
	ReasonBadPayload  = "bad_payload"
)

// CloudEvents reports whether rows go as CloudEvents.
func (f Format) CloudEvents() bool {
	return f.Mode == CloudEventsBinary || f.Mode == CloudEventsStructured
}

// Event is a row's CloudEvents context attributes, by name, in the order
// the specification lists them: specversion, id, source, type,
// datacontenttype, time. The type is the row's routing key; the time, its
// enqueue time.
func (f Format) Event(row outbox.Row, contentType string) ([][2]string, *RowFault) {
	if row.RoutingKey == nil {
		return nil, &RowFault{Reason: ReasonNoEventType, Detail: "a CloudEvent needs a type, and the row's routing key, its type, is NULL"}
	}
	return [][2]string{
		{"specversion", "1.0"},
		{"id", row.ID},
		{"source", f.Source},
		{"type", *row.RoutingKey},
		{"datacontenttype", contentType},
		{"time", row.EnqueuedAt.UTC().Format(time.RFC3339Nano)},
	}, nil
}

// AsStructured is the row, whose payload as sent is payload, as a
// structured-mode event (see Structured).
func (f Format) AsStructured(row outbox.Row, contentType string, payload []byte, tc Trace) ([]byte, *RowFault) {
	attrs, fault := f.Event(row, contentType)
	if fault != nil {
		return nil, fault
	}
	body, err := Structured(attrs, payload, tc)
	if err != nil {
		return nil, &RowFault{Reason: ReasonBadPayload, Detail: "cloudevents: " + err.Error()}
	}
	return body, nil
}

// Structured is a row as a structured-mode event: its attributes, and its
// payload as data, JSON embedded as it is, text as a string, anything else
// as data_base64. tc, when set, goes in as the distributed tracing
// extension's attributes.
func Structured(attrs [][2]string, payload []byte, tc Trace) ([]byte, error) {
	event := make(map[string]any, len(attrs)+3)
	for _, a := range attrs {
		event[a[0]] = a[1]
	}
	contentType := event["datacontenttype"].(string)
	switch {
	case strings.HasPrefix(contentType, "application/json") || strings.HasSuffix(strings.SplitN(contentType, ";", 2)[0], "+json"):
		if !json.Valid(payload) {
			return nil, fmt.Errorf("the payload is not the JSON its content type %s says", contentType)
		}
		event["data"] = json.RawMessage(payload)
	case strings.HasPrefix(contentType, "text/"):
		event["data"] = string(payload)
	default:
		event["data_base64"] = base64.StdEncoding.EncodeToString(payload)
	}
	if tc.Parent != "" {
		event[HeaderTraceParent] = tc.Parent
		if tc.State != "" {
			event[HeaderTraceState] = tc.State
		}
	}
	return json.Marshal(event)
}
