package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/telemetry"
)

// The tracing section: one drainer draining rows written inside traces, with
// tracing off, on at 100 % and at 1 %, beside today's drain of rows without
// a trace context, in interleaved rounds.

// spanSink is an OTLP/HTTP endpoint that reads each export and answers 200
// without decoding it, as a collector's receiver would take it off the
// wire. It runs in this process, so its CPU counts in the drainer's group.
type spanSink struct {
	srv   *http.Server
	url   string
	bytes atomic.Int64
}

func startSpanSink() *spanSink {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	s := &spanSink{url: "http://" + l.Addr().String()}
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		n, _ := io.Copy(io.Discard, req.Body)
		s.bytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go func() { _ = s.srv.Serve(l) }()
	return s
}

// traced starts a tracer provider exporting to sink through the standard
// variables, with sampler; its stop flushes it.
func traced(ctx context.Context, sink *spanSink, sampler, ratio string) (trace.TracerProvider, func()) {
	for k, v := range map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": ratio} {
		if err := os.Setenv(k, v); err != nil {
			log.Fatal(err)
		}
	}
	tp, shutdown, err := telemetry.Start(ctx, "spillway-bench")
	if err != nil {
		log.Fatal(err)
	}
	return tp, func() {
		if err := shutdown(context.Background()); err != nil {
			log.Printf("flushing spans: %v", err)
		}
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"} {
			_ = os.Unsetenv(k)
		}
	}
}

// tracing compares the drains.
func (b *bench) tracing(ctx context.Context) []string {
	sink := startSpanSink()
	defer func() { _ = sink.srv.Close() }()
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	// Each row in a trace of its own, sampled by its writer.
	withTraces := func() {
		b.seed(ctx, spec, *events, 0)
		b.exec(ctx, `UPDATE `+spec.Name+` SET traceparent = '00-' || md5(id::text) || '-' || substr(md5(id::text || 'span'), 1, 16) || '-01'`)
		b.exec(ctx, "VACUUM ANALYZE "+spec.Name)
	}
	drain := func(tp trace.TracerProvider) run {
		return b.drain(ctx, spec, 1, func(c *drainer.Config) { c.Tracing = tp })
	}
	var today, off, all, some scenario
	var spanBytes [2]int64
	for round := range *rounds {
		log.Printf("tracing, round %d of %d: rows without a trace; traced rows, tracing off, on at 100 %% and at 1 %%", round+1, *rounds)
		b.seed(ctx, spec, *events, 0)
		today.add(drain(nil))
		withTraces()
		off.add(drain(nil))
		for i, s := range []struct {
			scenario *scenario
			ratio    string
		}{{&all, "1"}, {&some, "0.01"}} {
			withTraces()
			// traceidratio, not parent-based: every row's own trace is sampled.
			tp, stop := traced(ctx, sink, "traceidratio", s.ratio)
			before := sink.bytes.Load()
			s.scenario.add(drain(tp))
			stop()
			spanBytes[i] += sink.bytes.Load() - before
		}
	}
	fmt.Printf("\ntracing: %d events of %d bytes, one drainer, to RabbitMQ; traced rows each hold a traceparent; spans exported over OTLP/HTTP "+
		"to an endpoint in this process that reads and discards them (%.0f and %.0f bytes of spans per event at 100 %% and 1 %%)\n",
		*events, *payloadBytes, float64(spanBytes[0])/float64(all.events), float64(spanBytes[1])/float64(some.events))
	today.report("rows without a trace context (today)", "")
	off.report("traced rows, tracing off", fmt.Sprintf("%.2f of today", off.rate()/today.rate()))
	all.report("traced rows, tracing on, 100 % sampled", fmt.Sprintf("%.2f of today", all.rate()/today.rate()))
	some.report("traced rows, tracing on, 1 % sampled", fmt.Sprintf("%.2f of today", some.rate()/today.rate()))
	return []string{target("tracing off ÷ today ≥ 0.95", fmt.Sprintf("%.2f", off.rate()/today.rate()), off.rate() >= 0.95*today.rate())}
}
