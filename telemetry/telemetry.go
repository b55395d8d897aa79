// Package telemetry turns on OpenTelemetry tracing as the standard OTEL_*
// environment variables say, for the drainer and the operator alike.
// Tracing is on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless OTEL_SDK_DISABLED is true or
// OTEL_TRACES_EXPORTER is none. The exporter and the SDK read the rest of
// the variables themselves: the protocol, headers, timeout, sampler
// (OTEL_TRACES_SAMPLER, default parentbased_always_on) and resource
// attributes (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Enabled says whether the environment turns tracing on.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Start returns a tracer provider exporting spans through OTLP, named
// service unless OTEL_SERVICE_NAME says otherwise, with attrs as further
// resource attributes, and its shutdown, which flushes the spans still
// buffered. It also makes it, and the W3C trace context propagator, the
// global ones. With tracing off, it returns nil and a no-op shutdown.
func Start(ctx context.Context, service string, attrs ...attribute.KeyValue) (trace.TracerProvider, func(context.Context) error, error) {
	if !Enabled() {
		return nil, func(context.Context) error { return nil }, nil
	}
	exporter, err := newExporter(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Later detectors win: the environment's names over the defaults here.
	res, err := resource.New(ctx,
		resource.WithAttributes(append([]attribute.KeyValue{semconv.ServiceName(service)}, attrs...)...),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp, tp.Shutdown, nil
}

// newExporter is the OTLP exporter of the protocol the environment names:
// http/protobuf by default, as the specification has it, or grpc.
func newExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch protocol {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: must be http/protobuf or grpc", protocol)
	}
}
