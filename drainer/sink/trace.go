package sink

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context headers: a message carries its row's trace context
// under these names, as AMQP headers and as HTTP headers alike. A row's
// headers column may hold them too, under the same keys; a sink never sends
// those keys as ordinary headers, but only what the engine hands it in a
// Trace, which it has checked.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Trace is the trace context a message carries: a traceparent, and a
// tracestate beside it. Zero means none.
type Trace struct {
	Parent, State string
}

// IsTraceHeader says that a key of a row's headers is a trace context header,
// which a sink leaves to the Trace the engine hands it.
func IsTraceHeader(key string) bool {
	return key == HeaderTraceParent || key == HeaderTraceState
}

// SpanShape is how a sink's publishes appear as OpenTelemetry spans: the
// span's name, kind and fixed attributes, and the attributes that name each
// row's message id and routing key ("" for none).
type SpanShape struct {
	Name       string
	Kind       trace.SpanKind
	Attributes []attribute.KeyValue
	MessageID  attribute.Key
	RoutingKey attribute.Key
}
