package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// Dialer opens webhook connections: an HTTP client with a keep-alive pool
// of one connection per request in flight, HTTP/2 where the server offers it.
type Dialer struct {
	cfg             Config
	depth           int
	maxPayloadBytes int64
	contentType     string
	log             *slog.Logger
}

// NewDialer returns a dialer for cfg; depth is the pipeline depth, the
// requests in flight at most.
func NewDialer(cfg Config, depth int, maxPayloadBytes int64, payloadType string, log *slog.Logger) *Dialer {
	contentType := cfg.ContentType
	if contentType == "" {
		contentType = sink.ContentType(payloadType)
	}
	return &Dialer{cfg: cfg, depth: depth, maxPayloadBytes: maxPayloadBytes, contentType: contentType, log: log}
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
		return nil, fmt.Errorf("webhook URL %s %w", secret.RedactURL(raw), err)
	}
	u, _ := url.Parse(raw)
	signers, err := readSigners(d.cfg.SigningSecretFile)
	if err != nil {
		return nil, err
	}
	var tlsConfig *tls.Config
	if u.Scheme == "https" {
		if tlsConfig, err = d.cfg.TLS.Config(u.Hostname()); err != nil {
			return nil, err
		}
		if tlsConfig == nil {
			tlsConfig = &tls.Config{ServerName: u.Hostname()}
		}
	}
	if err := probe(hardStop, u, tlsConfig, d.cfg.Timeout); err != nil {
		return nil, fmt.Errorf("webhook %s: %w", where(u), secret.RedactError(err, raw))
	}
	ctx, cancel := context.WithCancel(hardStop)
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: d.cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        d.depth,
		MaxIdleConnsPerHost: d.depth,
		IdleConnTimeout:     90 * time.Second,
	}
	client := &http.Client{
		Transport: transport,
		// A redirect is the receiver's answer, not a new address to post
		// the row to.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &conn{
		dialer: d, url: raw, endpoint: where(u), signers: signers,
		client: client, transport: transport, ctx: ctx, cancel: cancel, changed: changed,
	}, nil
}

// readSigners reads the signing secrets, one per line.
func readSigners(file string) ([]*standardwebhooks.Webhook, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read the webhook signing secret file: %w", err)
	}
	var signers []*standardwebhooks.Webhook
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		s, err := standardwebhooks.NewWebhook(line)
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
	dialer    *Dialer
	url       string
	endpoint  string
	signers   []*standardwebhooks.Webhook
	client    *http.Client
	transport *http.Transport
	// ctx ends with the hard stop or Close, and every request with it.
	ctx     context.Context
	cancel  context.CancelFunc
	changed func()
	failed  atomic.Bool
	once    sync.Once
}

func (c *conn) Prepare(row outbox.Row) (sink.Message, *sink.RowFault) {
	return requestOf(row, c.dialer.cfg.HeaderPrefix, c.dialer.contentType, c.dialer.maxPayloadBytes)
}

// Publish sends m in a request of its own; the delivery resolves with its
// response, or without one.
func (c *conn) Publish(_ context.Context, m sink.Message) (sink.Delivery, error) {
	if c.failed.Load() {
		return nil, fmt.Errorf("%w: %s", sink.ErrDown, c.endpoint)
	}
	r := m.(*request)
	ctx, cancel := context.WithTimeout(c.ctx, c.dialer.cfg.Timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(r.body))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: %s", sink.ErrDown, secret.RedactError(err, c.url))
	}
	req.Header = r.header
	req.Header.Set("User-Agent", "spillway")
	if err := sign(req.Header, r.id, time.Now(), r.body, c.signers); err != nil {
		cancel()
		return nil, err
	}
	d := &delivery{done: make(chan struct{}), cancel: cancel}
	go c.send(req, d)
	return d, nil
}

// send runs one request and resolves its delivery.
func (c *conn) send(req *http.Request, d *delivery) {
	defer close(d.done)
	defer d.cancel()
	resp, err := c.client.Do(req)
	if err != nil {
		if unreachable(err) {
			c.fail()
		}
		d.outcome = sink.Outcome{Kind: sink.Lost, Detail: c.scrub(err.Error())}
		return
	}
	defer func() { _ = resp.Body.Close() }()
	snippet := readSnippet(resp.Body)
	d.outcome = outcomeOf(resp.StatusCode, resp.Header, snippet, c.dialer.cfg.GonePoisons, time.Now(), c.scrub)
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

func (c *conn) Flush()        {}
func (c *conn) Healthy() bool { return !c.failed.Load() }
func (c *conn) Blocked() bool { return false }
func (c *conn) Stale() bool   { return false }

// Close cuts the requests in flight and the idle connections.
func (c *conn) Close() {
	c.cancel()
	c.transport.CloseIdleConnections()
}

// delivery is one request on its way.
type delivery struct {
	done    chan struct{}
	cancel  context.CancelFunc
	outcome sink.Outcome
}

func (d *delivery) Done() <-chan struct{} { return d.done }
func (d *delivery) Outcome() sink.Outcome { return d.outcome }
func (d *delivery) GiveUp(timedOut bool)  { d.cancel() }
