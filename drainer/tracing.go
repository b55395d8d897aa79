package drainer

import (
	"bytes"
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// Tracing: a row's W3C trace context goes on in its message, and with a
// tracer provider each claim, settle and publish is a span.
//
// A publish span's parent is its row's trace context: the row is one event
// of the transaction that wrote it, and as a child its publish shows in that
// transaction's trace, between the write and the consumer, where a link
// would leave it in a trace of its own that most tools show apart. The span
// links to its claim's span instead, which holds the batch. The message then
// carries the publish span's context, so a consumer's span hangs below the
// publish; with tracing off, it carries the row's own. A row without a trace
// context is published as a child of its claim's span, and its message gets
// no trace context.

// tracerName is the instrumentation scope of the drainer's spans.
const tracerName = "github.com/spillway-io/spillway/drainer"

// traceParent and traceState are the trace context keys a row's headers may
// hold, read only when its headers mention a traceparent.
type headerTrace struct {
	Parent any `json:"traceparent"`
	State  any `json:"tracestate"`
}

var traceParentKey = []byte(`"` + sink.HeaderTraceParent + `"`)

// rowTrace is a row's trace context: its trace columns, else the trace keys
// of its headers. dropped names each part that was malformed and is left
// off: a traceparent takes its tracestate with it, while a bad tracestate
// leaves a good traceparent alone.
func rowTrace(row outbox.Row) (sc trace.SpanContext, dropped []string) {
	parent, state := row.TraceParent, row.TraceState
	if parent == nil && bytes.Contains(row.Headers, traceParentKey) {
		var h headerTrace
		if err := json.Unmarshal(row.Headers, &h); err != nil {
			return sc, nil // the sink fails the row for its headers
		}
		p, ok := h.Parent.(string)
		if !ok {
			return sc, []string{sink.HeaderTraceParent}
		}
		parent = &p
		if s, ok := h.State.(string); ok {
			state = &s
		} else if h.State != nil {
			dropped = append(dropped, sink.HeaderTraceState)
		}
	}
	if parent == nil {
		return sc, nil
	}
	sc = trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{sink.HeaderTraceParent: *parent}))
	if !sc.IsValid() {
		return sc, []string{sink.HeaderTraceParent}
	}
	if state != nil && *state != "" {
		ts, err := trace.ParseTraceState(*state)
		if err != nil {
			return sc, append(dropped, sink.HeaderTraceState)
		}
		sc = sc.WithTraceState(ts)
	}
	return sc, dropped
}

// traceHeaders renders sc as the headers a message carries, as the W3C
// propagator would; none for an invalid sc.
func traceHeaders(sc trace.SpanContext) sink.Trace {
	if !sc.IsValid() {
		return sink.Trace{}
	}
	return sink.Trace{
		Parent: "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String(),
		State:  sc.TraceState().String(),
	}
}

// startPublish reads row's trace context, counting what was malformed, and
// with tracing on starts its publish span under it, within the claim whose
// span is claimSpan. It returns the trace context the message carries, and
// the span (nil with tracing off), which pass ends.
func (d *Drainer) startPublish(row *outbox.Row, claimSpan trace.SpanContext) (sink.Trace, trace.Span) {
	sc, dropped := rowTrace(*row)
	for _, part := range dropped {
		d.metrics.TraceDropped.WithLabelValues(part).Inc()
		d.log.Warn("Dropped a malformed trace context; the row is published without it", "id", row.ID, "header", part,
			"value", secret.Truncate(malformed(*row, part), 80))
	}
	if d.tracer == nil {
		return traceHeaders(sc), nil
	}
	shape := d.span
	attrs := make([]attribute.KeyValue, 0, len(shape.Attributes)+2)
	attrs = append(attrs, shape.Attributes...)
	attrs = append(attrs, shape.MessageID.String(row.ID))
	if shape.RoutingKey != "" && row.RoutingKey != nil {
		attrs = append(attrs, shape.RoutingKey.String(*row.RoutingKey))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(shape.Kind), trace.WithAttributes(attrs...)}
	parent := context.Background()
	if sc.IsValid() {
		parent = trace.ContextWithRemoteSpanContext(parent, sc)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: claimSpan}))
	} else {
		parent = trace.ContextWithSpanContext(parent, claimSpan)
	}
	_, span := d.tracer.Start(parent, shape.Name, opts...)
	if !sc.IsValid() {
		return sink.Trace{}, span // a row without a trace context gets none
	}
	return traceHeaders(span.SpanContext()), span
}

// malformed is the value of the part of row's trace context that rowTrace
// dropped, for the warning.
func malformed(row outbox.Row, part string) string {
	column := row.TraceParent
	if part == sink.HeaderTraceState {
		column = row.TraceState
	}
	if column != nil {
		return *column
	}
	var h map[string]json.RawMessage
	_ = json.Unmarshal(row.Headers, &h)
	return string(h[part])
}

// endPublish ends a publish span with its row's outcome.
func endPublish(span trace.Span, o outcome) {
	switch o.kind {
	case failed:
		span.SetStatus(codes.Error, o.reason)
		span.SetAttributes(semconv.ErrorTypeKey.String(o.reason))
	case released:
		span.SetStatus(codes.Error, "released: "+o.reason)
		span.SetAttributes(semconv.ErrorTypeKey.String(o.reason))
	}
	span.End()
}

// startStatement starts the span of a claim or a settle, a statement on the
// outbox table; with tracing off, it returns ctx and nil.
func (d *Drainer) startStatement(ctx context.Context, operation string, links []trace.Link) (context.Context, trace.Span) {
	if d.tracer == nil {
		return ctx, nil
	}
	table := d.store.Table().Name()
	return d.tracer.Start(ctx, operation+" "+table, trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(semconv.DBSystemNamePostgreSQL, semconv.DBCollectionName(table), semconv.DBOperationName(operation)))
}

// endStatement ends a statement's span, with the rows it took or settled.
func endStatement(span trace.Span, rows int, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(semconv.DBResponseReturnedRows(rows))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
