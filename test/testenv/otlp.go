package testenv

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Collector is an OTLP/HTTP trace receiver on a real TCP port, as an
// OpenTelemetry collector's would be: it decodes each export's protobuf
// and keeps its spans.
type Collector struct {
	mu    sync.Mutex
	spans []Span
	bad   []string
	srv   *http.Server
	addr  string
}

// Span is one received span, its ids in hex as in a traceparent.
type Span struct {
	Name                 string
	Kind                 tracepb.Span_SpanKind
	TraceID, SpanID      string
	ParentSpanID         string
	Attributes           map[string]string
	Links                []string // the linked spans' ids
	StatusCode           tracepb.Status_StatusCode
	StatusMessage        string
	Resource             map[string]string
	InstrumentationScope string
}

// StartCollector listens on a free loopback port.
func StartCollector() (*Collector, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &Collector{addr: l.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", c.export)
	c.srv = &http.Server{Handler: mux}
	go func() { _ = c.srv.Serve(l) }()
	return c, nil
}

// Addr is the collector's host:port.
func (c *Collector) Addr() string { return c.addr }

// Endpoint is the collector's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
func (c *Collector) Endpoint() string { return "http://" + c.addr }

// Stop closes the collector.
func (c *Collector) Stop() { _ = c.srv.Close() }

// Spans are the spans received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// Errors are the exports the collector could not decode.
func (c *Collector) Errors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.bad...)
}

func (c *Collector) export(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			c.refuse(w, err)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		c.refuse(w, err)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		c.refuse(w, err)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		resource := attributes(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				span := Span{
					Name: s.Name, Kind: s.Kind,
					TraceID: hex.EncodeToString(s.TraceId), SpanID: hex.EncodeToString(s.SpanId), ParentSpanID: hex.EncodeToString(s.ParentSpanId),
					Attributes: attributes(s.Attributes), StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(),
					Resource: resource, InstrumentationScope: ss.GetScope().GetName(),
				}
				for _, l := range s.Links {
					span.Links = append(span.Links, hex.EncodeToString(l.SpanId))
				}
				c.spans = append(c.spans, span)
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (c *Collector) refuse(w http.ResponseWriter, err error) {
	c.mu.Lock()
	c.bad = append(c.bad, err.Error())
	c.mu.Unlock()
	http.Error(w, err.Error(), http.StatusBadRequest)
}

// attributes renders OTLP attributes as text, whatever their type.
func attributes(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch {
		case v.GetStringValue() != "":
			m[kv.Key] = v.GetStringValue()
		default:
			switch x := v.GetValue().(type) {
			case *commonpb.AnyValue_IntValue:
				m[kv.Key] = fmt.Sprint(x.IntValue)
			case *commonpb.AnyValue_BoolValue:
				m[kv.Key] = fmt.Sprint(x.BoolValue)
			case *commonpb.AnyValue_DoubleValue:
				m[kv.Key] = fmt.Sprint(x.DoubleValue)
			default:
				m[kv.Key] = v.String()
			}
		}
	}
	return m
}
