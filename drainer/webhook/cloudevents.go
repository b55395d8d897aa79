package webhook

import (
	"golang.org/x/net/http/httpguts"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
)

// Rows as CloudEvents, as the CloudEvents HTTP binding has them: in binary
// mode the attributes are ce- headers beside the payload; in structured mode
// the body is the event, and a batch request's body is a JSON array of
// events (application/cloudevents-batch+json).

// asCloudEvent makes r, the row's request, a CloudEvent: its attributes as
// ce- headers (the Content-Type already says datacontenttype), or,
// structured, the event as its body.
func asCloudEvent(r *request, row outbox.Row, tc sink.Trace, format sink.Format, contentType string) *sink.RowFault {
	if format.Mode == sink.CloudEventsStructured {
		body, fault := format.AsStructured(row, contentType, r.body, tc)
		if fault != nil {
			return fault
		}
		r.body = body
		r.header.Set("Content-Type", sink.StructuredContentType)
		return nil
	}
	attrs, fault := format.Event(row, contentType)
	if fault != nil {
		return fault
	}
	for _, a := range attrs {
		if a[0] == "datacontenttype" {
			continue
		}
		if !httpguts.ValidHeaderFieldValue(a[1]) {
			return &sink.RowFault{Reason: reasonBadHeaders, Detail: "cloudevents: the " + a[0] + " attribute holds a character HTTP does not allow in a header"}
		}
		r.header.Set("ce-"+a[0], a[1])
	}
	return nil
}

// batchedEventOf is a row as one structured event of a batch request.
func batchedEventOf(row outbox.Row, tc sink.Trace, format sink.Format, contentType string, maxPayloadBytes int64) (*request, *sink.RowFault) {
	if fault := sink.Oversized(row, maxPayloadBytes); fault != nil {
		return nil, fault
	}
	body, fault := format.AsStructured(row, contentType, row.Payload, tc)
	if fault != nil {
		return nil, fault
	}
	return &request{id: row.ID, body: body, event: true}, nil
}
