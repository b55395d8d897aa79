package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// Dialer opens webhook connections: an HTTP client with a keep-alive pool
// of one connection per request in flight, HTTP/2 where the server offers it.
type Dialer struct {
	// Observe, when set, is told of every request: the status class of
	// its response (2xx … 5xx), or none, and how long it took.
	Observe func(class string, took time.Duration)

	cfg             Config
	depth           int
	maxPayloadBytes int64
	payloadType     string
	contentType     string
}

// NewDialer returns a dialer for cfg; depth is the pipeline depth, the
// requests in flight at most.
func NewDialer(cfg Config, depth int, maxPayloadBytes int64, payloadType string) *Dialer {
	contentType := cfg.ContentType
	if contentType == "" {
		contentType = sink.ContentType(payloadType)
	}
	return &Dialer{cfg: cfg, depth: depth, maxPayloadBytes: maxPayloadBytes, payloadType: payloadType, contentType: contentType}
}

// Where is the endpoint without its credentials or query.
func (d *Dialer) Where() string {
	raw, err := d.cfg.Read()
	if err != nil {
		return "webhook (URL in " + d.cfg.File + ")"
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "webhook (unparseable URL)"
	}
	return "webhook " + where(u)
}

// Span names a publish span after the HTTP client conventions: the method,
// and the endpoint's host and port, never its credentials or path.
func (d *Dialer) Span() sink.SpanShape {
	shape := sink.SpanShape{
		Name: http.MethodPost, Kind: trace.SpanKindClient,
		Attributes: []attribute.KeyValue{semconv.HTTPRequestMethodPost},
		MessageID:  semconv.MessagingMessageIDKey,
	}
	if raw, err := d.cfg.Read(); err == nil {
		if u, err := url.Parse(raw); err == nil {
			shape.Attributes = append(shape.Attributes, semconv.ServerAddress(u.Hostname()), semconv.URLScheme(u.Scheme))
			if port, err := strconv.Atoi(u.Port()); err == nil {
				shape.Attributes = append(shape.Attributes, semconv.ServerPort(port))
			}
		}
	}
	return shape
}

// Watch calls changed when the URL's or the signing secrets' file changes.
func (d *Dialer) Watch(ctx context.Context, log *slog.Logger, changed func()) error {
	errs := make(chan error, 2)
	for _, file := range []secret.URLSource{d.cfg.URLSource, {File: d.cfg.SigningSecretFile}} {
		go func() { errs <- file.Watch(ctx, log, changed) }()
	}
	return errors.Join(<-errs, <-errs)
}

// Dial reads the URL and the secrets afresh and checks that the endpoint
// takes connections (and, over https, completes a TLS handshake), so that
// while it is away claiming pauses rather than releasing every row it
// claims.
func (d *Dialer) Dial(hardStop context.Context, changed func()) (sink.Sink, error) {
	raw, err := d.cfg.Read()
	if err != nil {
		return nil, err
	}
	if err := d.cfg.checkURL(raw); err != nil {
		// Not quoted: its query may hold a token.
		return nil, fmt.Errorf("the webhook URL %w", err)
	}
	// Every request is a copy of post: the URL is parsed once.
	post, err := http.NewRequest(http.MethodPost, raw, nil)
	if err != nil {
		return nil, fmt.Errorf("the webhook URL: %w", secret.RedactError(err, raw))
	}
	u := post.URL
	signers, err := readSigners(d.cfg.SigningSecretFile)
	if err != nil {
		return nil, err
	}
	var tlsConfig *tls.Config
	if u.Scheme == "https" {
		// Without a CA file, the system's roots verify the endpoint.
		tlsConfig = &tls.Config{ServerName: u.Hostname()}
		if d.cfg.TLS.Enabled() {
			if tlsConfig, err = d.cfg.TLS.Config(u.Hostname()); err != nil {
				return nil, err
			}
		}
	}
	if err := probe(hardStop, u, tlsConfig, d.cfg.Timeout); err != nil {
		return nil, fmt.Errorf("webhook %s: %w", where(u), secret.RedactError(err, raw))
	}
	ctx, cancel := context.WithCancel(hardStop)
	transport := &http.Transport{
		// No proxy: the endpoint is dialled directly, as Dial's probe does.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: d.cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        d.depth,
		MaxIdleConnsPerHost: d.depth,
		IdleConnTimeout:     90 * time.Second,
		// Only a refusal's first bytes are kept, and they are shown as
		// they came.
		DisableCompression: true,
	}
	client := &http.Client{
		Transport: transport,
		// A redirect is the receiver's answer, not a new address to post
		// the row to.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &conn{
		dialer: d, url: raw, endpoint: where(u), signers: signers,
		post:   post,
		client: client, transport: transport, ctx: ctx, cancel: cancel, changed: changed,
		sends: make(chan sending),
	}, nil
}

// readSigners reads the signing secrets, one per line.
func readSigners(file string) ([]*signer, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read the webhook signing secret file: %w", err)
	}
	var signers []*signer
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		s, err := newSigner(line)
		if err != nil {
			return nil, fmt.Errorf("webhook signing secret file %s, line %d: must be a Standard Webhooks secret, whsec_ and base64 (not shown)", file, i+1)
		}
		signers = append(signers, s)
	}
	if len(signers) == 0 {
		return nil, fmt.Errorf("webhook signing secret file %s holds no secret", file)
	}
	return signers, nil
}

// probe opens one connection to the endpoint, and over https completes a
// TLS handshake, then closes it.
func probe(ctx context.Context, u *url.URL, tlsConfig *tls.Config, timeout time.Duration) error {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	dialer := &net.Dialer{Timeout: timeout}
	addr := net.JoinHostPort(u.Hostname(), port)
	if tlsConfig == nil {
		c, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	c, err := (&tls.Dialer{NetDialer: dialer, Config: tlsConfig}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// conn is one open webhook client. It stays healthy until a request cannot
// reach the endpoint (a connection refused, a failed TLS handshake): the
// endpoint is away, and the claim loop dials again, which waits for it.
type conn struct {
	dialer   *Dialer
	url      string
	endpoint string
	signers  []*signer
	// post is the request every request copies (see requestTo).
	post      *http.Request
	client    *http.Client
	transport *http.Transport
	// ctx ends with the hard stop or Close, and every request with it.
	ctx     context.Context
	cancel  context.CancelFunc
	changed func()
	failed  atomic.Bool
	once    sync.Once
	// held are the rows a batch request will carry, and their deliveries:
	// the publishing goroutine's alone.
	held      []*request
	heldRides []*delivery
	// sends hands requests to the senders, of which there are senders
	// (see hand); the publishing goroutine's alone.
	sends   chan sending
	senders int
}

func (c *conn) Prepare(row outbox.Row, tc sink.Trace) (sink.Message, *sink.RowFault) {
	d := c.dialer
	switch {
	case d.cfg.BatchRows > 0 && d.cfg.Format.CloudEvents():
		return batchedEventOf(row, tc, d.cfg.Format, d.contentType, d.maxPayloadBytes)
	case d.cfg.BatchRows > 0:
		return envelopeOf(row, tc, d.payloadType, d.maxPayloadBytes)
	}
	r, fault := requestOf(row, tc, d.cfg.HeaderPrefix, d.contentType, d.maxPayloadBytes)
	if fault == nil && d.cfg.Format.CloudEvents() {
		fault = asCloudEvent(r, row, tc, d.cfg.Format, d.contentType)
	}
	return r, fault
}

// Publish sends m in a request of its own, or holds it for a batch request,
// sent when full or at Flush; the delivery resolves with the request's
// response, or without one.
func (c *conn) Publish(_ context.Context, m sink.Message) (sink.Delivery, error) {
	if c.failed.Load() {
		return nil, fmt.Errorf("%w: %s", sink.ErrDown, c.endpoint)
	}
	d := &delivery{done: make(chan struct{})}
	if c.dialer.cfg.BatchRows == 0 {
		c.start(m.(*request), []*delivery{d})
		return d, nil
	}
	c.held, c.heldRides = append(c.held, m.(*request)), append(c.heldRides, d)
	if len(c.held) == c.dialer.cfg.BatchRows {
		c.sendHeld()
	}
	return d, nil
}

// Flush sends the rows held for a batch request.
func (c *conn) Flush() {
	if len(c.held) > 0 {
		c.sendHeld()
	}
}

// sendHeld sends the held rows in one batch request.
func (c *conn) sendHeld() {
	rows, rides := c.held, c.heldRides
	c.held, c.heldRides = nil, nil
	c.start(batchOf(rows), rides)
}

// start sends r and resolves rides, the deliveries of the rows it
// carries, with its outcome.
func (c *conn) start(r *request, rides []*delivery) {
	ctx, cancel := context.WithTimeout(c.ctx, c.dialer.cfg.Timeout)
	req := requestTo(ctx, c.post, r.body)
	req.Header = r.header
	req.Header["User-Agent"] = []string{"spillway"}
	sign(req.Header, r.id, time.Now(), r.body, c.signers)
	for _, d := range rides {
		d.cancel = cancel
	}
	c.hand(sending{req: req, cancel: cancel, rides: rides})
}

// sending is a request for a sender to send, and the deliveries its
// outcome resolves.
type sending struct {
	req    *http.Request
	cancel context.CancelFunc
	rides  []*delivery
}

// hand gives s to an idle sender, or to a new one while there are fewer
// than the requests that can be in flight. Senders outlive their requests:
// a goroutine per request grew a new stack for each through the HTTP
// client, a twentieth of the drainer's CPU at a row per request.
func (c *conn) hand(s sending) {
	select {
	case c.sends <- s:
		return
	default:
	}
	if c.senders < max(c.dialer.depth, 1) {
		c.senders++
		go c.sender(s)
		return
	}
	select {
	case c.sends <- s:
	case <-c.ctx.Done():
		s.cancel()
		for _, d := range s.rides {
			d.resolve(sink.Outcome{Kind: sink.Lost, Detail: "the webhook connection was closed"})
		}
	}
}

// sender sends s, then what it is handed next, until the connection closes.
func (c *conn) sender(s sending) {
	for {
		o := batchOutcome(c.send(s.req), len(s.rides))
		s.cancel()
		for _, d := range s.rides {
			d.resolve(o)
		}
		select {
		case s = <-c.sends:
		case <-c.ctx.Done():
			return
		}
	}
}

// batchOutcome is the outcome of each of the rows a request carried. A
// refusal of a batch of rows that is not the endpoint's transient state
// says one of them is at fault, but not which: counting an attempt against
// every row would poison the rows sent beside a bad one. The batch is lost
// instead, so the engine sends each of its rows alone next (its strikes),
// and the bad row's own refusal counts its attempts.
func batchOutcome(o sink.Outcome, rows int) sink.Outcome {
	if rows == 1 || o.Kind != sink.Refused || o.Reason == reasonTransient {
		return o
	}
	return sink.Outcome{Kind: sink.Lost, Detail: fmt.Sprintf("a request of %d rows refused as a whole, its rows sent alone next: %s", rows, o.Detail)}
}

// send runs one request and classifies its response.
func (c *conn) send(req *http.Request) sink.Outcome {
	start := time.Now()
	resp, err := c.client.Do(req)
	c.observe(resp, start)
	if err != nil {
		if unreachable(err) {
			c.fail()
		}
		return sink.Outcome{Kind: sink.Lost, Detail: c.scrub(err.Error())}
	}
	defer func() { _ = resp.Body.Close() }()
	snippet := readResponse(resp)
	return outcomeOf(resp.StatusCode, resp.Header, snippet, c.dialer.cfg.GonePoisons, time.Now(), c.scrub)
}

// observe tells the dialer's Observe of a request sent at start and its
// response, nil when none came.
func (c *conn) observe(resp *http.Response, start time.Time) {
	if c.dialer.Observe == nil {
		return
	}
	class := "none"
	if resp != nil {
		class = statusClass(resp.StatusCode)
	}
	c.dialer.Observe(class, time.Since(start))
}

// statusClasses are the status classes' labels, so that no response
// formats its own.
var statusClasses = [...]string{"0xx", "1xx", "2xx", "3xx", "4xx", "5xx", "6xx", "7xx", "8xx", "9xx"}

// statusClass labels a status code by its class: 204 is "2xx".
func statusClass(code int) string {
	if code < 0 || code >= 1000 {
		return strconv.Itoa(code/100) + "xx"
	}
	return statusClasses[code/100]
}

// unreachable is a request error that says the endpoint cannot be reached
// at all, not that this request failed: no connection, or no TLS session.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var certErr *tls.CertificateVerificationError
	var recordErr tls.RecordHeaderError
	return errors.As(err, &certErr) || errors.As(err, &recordErr)
}

func (c *conn) fail() {
	c.once.Do(func() {
		c.failed.Store(true)
		c.changed()
	})
}

// scrub removes the URL's secrets from a text to show.
func (c *conn) scrub(text string) string { return secret.Scrub(text, c.url) }

func (c *conn) Healthy() bool { return !c.failed.Load() }
func (c *conn) Blocked() bool { return false }
func (c *conn) Stale() bool   { return false }

// Close cuts the requests in flight and the idle connections.
func (c *conn) Close() {
	c.cancel()
	c.transport.CloseIdleConnections()
}

// delivery is one row's request on its way (a batch request's rows share
// one).
type delivery struct {
	done    chan struct{}
	cancel  context.CancelFunc
	outcome sink.Outcome
}

func (d *delivery) resolve(o sink.Outcome) {
	d.outcome = o
	close(d.done)
}

func (d *delivery) Done() <-chan struct{} { return d.done }
func (d *delivery) Outcome() sink.Outcome { return d.outcome }

// GiveUp cuts the request; a batch request's, for all its rows, whose
// deadlines passed together.
func (d *delivery) GiveUp(bool) {
	if d.cancel != nil {
		d.cancel()
	}
}
