package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/secret"
)

// Dialer opens a drainer's connections to the broker.
type Dialer struct {
	cfg       Config
	drainerID string
	depth     int
	shape     messageShape
	limits    messageLimits
	log       *slog.Logger
	// next is the broker URL that the next dial tries first. A drainer
	// starts at one chosen by its ID, so that a fleet spreads over a
	// cluster's nodes; after that, at the one after the URL it last
	// connected to, since a dial again means that connection failed.
	next int
	// at is the endpoint of the last connection, for Where.
	at atomic.Pointer[string]
}

// NewDialer is the dialer of cfg's broker, for the drainer drainerID
// publishing at most depth messages at once, none larger than
// maxPayloadBytes, from a payload column of payloadType.
func NewDialer(cfg Config, drainerID string, depth int, maxPayloadBytes int64, payloadType string, log *slog.Logger) *Dialer {
	contentType := cfg.ContentType
	if contentType == "" {
		contentType = sink.ContentType(payloadType)
	}
	id := fnv.New32a()
	_, _ = id.Write([]byte(drainerID))
	return &Dialer{cfg: cfg, drainerID: drainerID, depth: depth, log: log, next: int(id.Sum32() % 1024),
		shape:  messageShape{contentType: contentType, properties: cfg.MessageProperties, format: cfg.Format},
		limits: messageLimits{maxPayloadBytes: maxPayloadBytes}}
}

// Dial connects to the first of the broker's URLs that answers, trying each
// once, and enables confirms and checks (or declares) the exchange. It reads
// the URLs afresh, so a rotated Secret takes effect here. When none
// answers, the error says why each did not; the claim loop dials again
// after a backoff.
func (d *Dialer) Dial(hardStop context.Context, changed func()) (sink.Sink, error) {
	raw, err := d.cfg.Read()
	if err != nil {
		return nil, err
	}
	urls := secret.Endpoints(raw)
	if len(urls) == 0 {
		return nil, errors.New("the broker URL is empty")
	}
	var failures []string
	for i := range urls {
		k := (d.next + i) % len(urls)
		b, err := dial(hardStop, d.cfg, urls[k], d.drainerID, d.depth, d.shape, d.limits, d.log, changed)
		if err == nil {
			d.next = k + 1
			at := endpoint(urls[k])
			d.at.Store(&at)
			return b, nil
		}
		if len(urls) == 1 {
			return nil, err
		}
		d.log.Warn("Broker URL did not answer; trying the next", "endpoint", endpoint(urls[k]), "error", err)
		failures = append(failures, err.Error())
	}
	// One line, for /readyz and the log.
	return nil, fmt.Errorf("none of the %d broker URLs answered: %s", len(urls), strings.Join(failures, "; "))
}

// endpoint is a URL's host and port, for a log line.
func endpoint(url string) string {
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return "(invalid URL)"
	}
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
}

// Watch follows the broker URL's file.
func (d *Dialer) Watch(ctx context.Context, log *slog.Logger, changed func()) error {
	return d.cfg.Watch(ctx, log, changed)
}

// Where is the exchange rows are published to, and the endpoint of the
// last connection.
func (d *Dialer) Where() string {
	if at := d.at.Load(); at != nil {
		return d.cfg.Where() + " at " + *at
	}
	return d.cfg.Where()
}

// Span names a publish span after the messaging conventions: the
// operation and the exchange, "(default)" for the default exchange.
func (d *Dialer) Span() sink.SpanShape {
	destination := d.cfg.Exchange
	if destination == "" {
		destination = "(default)"
	}
	return sink.SpanShape{
		Name: "publish " + destination,
		Kind: trace.SpanKindProducer,
		Attributes: []attribute.KeyValue{
			semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(d.cfg.Exchange),
		},
		MessageID:  semconv.MessagingMessageIDKey,
		RoutingKey: semconv.MessagingRabbitMQDestinationRoutingKeyKey,
	}
}

// connectionConfig is how the drainer connects to url: named after the
// drainer, and over amqps:// with the certificates of cfg.TLS, verifying
// the server's name against the URL's host.
func connectionConfig(cfg Config, url, drainerID string) (amqp.Config, error) {
	c := amqp.Config{Properties: amqp.Table{"connection_name": "spillway-drainer/" + drainerID}}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		return c, fmt.Errorf("broker URL %s: %w", secret.RedactURL(url), secret.RedactError(err, url))
	}
	if !cfg.TLS.Enabled() {
		if cfg.External {
			return c, errors.New("SASL EXTERNAL needs a client certificate: set --broker-cert-file and --broker-key-file")
		}
		return c, nil
	}
	if uri.Scheme != "amqps" {
		return c, fmt.Errorf("broker URL %s is not amqps://, but TLS certificates are set: use amqps:// so that they are used", secret.RedactURL(url))
	}
	if c.TLSClientConfig, err = cfg.TLS.Config(uri.Host); err != nil {
		return c, fmt.Errorf("broker TLS: %w", err)
	}
	if cfg.External {
		c.SASL = []amqp.Authentication{&amqp.ExternalAuth{}}
	}
	return c, nil
}
