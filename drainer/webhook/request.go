package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// Failure reasons, used as metric labels: one per status class, and the
// rows that cannot be sent. Each one counts an attempt.
const (
	reasonBadHeaders = "bad_headers"
	reasonTransient  = "http_transient" // 408, 425, 429, 5xx
	reasonGone       = "http_410"
	reasonRedirect   = "http_3xx"
	reasonClient     = "http_4xx"
	reasonOther      = "http_other"
)

// maxSnippet is how much of a refusing response's body last_error quotes,
// before Scrub cuts it further; maxResponseBytes is how much of any body is
// read, so the connection can be used again, and no more.
const (
	maxSnippet       = 200
	maxResponseBytes = 64 << 10
)

// request is a row as a webhook request, and what Publish sends.
type request struct {
	id   string
	body []byte
	// header is the row's headers, prefixed, and the content type; the
	// signature is added as the request is sent.
	header http.Header
	// event says a batch element is a structured CloudEvent, not an
	// envelope.
	event bool
}

func (r *request) Size() int64 { return int64(len(r.body)) }

// requestOf turns a claimed row into its request, with tc as its trace
// context headers, or says why the row cannot be sent.
func requestOf(row outbox.Row, tc sink.Trace, prefix, contentType string, maxPayloadBytes int64) (*request, *sink.RowFault) {
	if fault := sink.Oversized(row, maxPayloadBytes); fault != nil {
		return nil, fault
	}
	header, err := rowHeaders(row.Headers, prefix)
	if err != nil {
		return nil, &sink.RowFault{Reason: reasonBadHeaders, Detail: "headers: " + err.Error()}
	}
	header["Content-Type"] = []string{contentType}
	if tc.Parent != "" {
		header.Set(sink.HeaderTraceParent, tc.Parent)
		if tc.State != "" {
			header.Set(sink.HeaderTraceState, tc.State)
		}
	}
	return &request{id: row.ID, body: row.Payload, header: header}, nil
}

// ownHeaders are the request's own headers, which no row header may replace
// (with an empty prefix).
var ownHeaders = map[string]bool{
	"Content-Type": true, "Content-Length": true, "Content-Encoding": true, "Transfer-Encoding": true,
	"Host": true, "Connection": true, "User-Agent": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	"Traceparent": true, "Tracestate": true,
}

// rowHeaders converts a row's headers, a JSON object, into HTTP headers named
// prefix + key. A value is a string, a number or a boolean, and each name and
// value must be one HTTP allows; the error names the first that is not. The
// trace context keys are left to the request's trace context.
func rowHeaders(raw []byte, prefix string) (http.Header, error) {
	header := http.Header{}
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return header, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("must be a JSON object: %s", secret.Truncate(string(raw), 80))
	}
	for key, v := range obj {
		if sink.IsTraceHeader(key) {
			continue
		}
		name := prefix + key
		if !httpguts.ValidHeaderFieldName(name) {
			return nil, fmt.Errorf("%q is not a valid HTTP header name (RFC 9110 token characters only)", secret.Truncate(name, 80))
		}
		if ownHeaders[http.CanonicalHeaderKey(name)] {
			return nil, fmt.Errorf("%q would replace the request's own header; set a header prefix", name)
		}
		var value string
		switch v := v.(type) {
		case string:
			value = v
		case json.Number:
			value = v.String()
		case bool:
			value = strconv.FormatBool(v)
		default:
			return nil, fmt.Errorf("%s: a value must be a string, a number or a boolean, not %T", name, v)
		}
		if !httpguts.ValidHeaderFieldValue(value) {
			return nil, fmt.Errorf("%s: the value holds a character HTTP does not allow in a header (a control character or a line break)", name)
		}
		header.Set(name, value)
	}
	return header, nil
}

// signer signs requests with one secret as Standard Webhooks does: v1, the
// HMAC-SHA256 of "id.timestamp.body" in base64. It keeps its HMAC between
// requests, where the library's Sign builds one and copies the body into a
// formatted string each time: 4.9 % of the bench process's CPU (drainer
// and receiver) at a row per request, against 1.9 % for this. It is the
// publishing goroutine's alone.
type signer struct{ mac hash.Hash }

// newSigner reads a secret as the library does: whsec_, then base64.
func newSigner(secret string) (*signer, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, errors.New("not a Standard Webhooks secret")
	}
	return &signer{mac: hmac.New(sha256.New, key)}, nil
}

// signature is the v1 signature of a request.
func (s *signer) signature(id, timestamp string, body []byte) string {
	s.mac.Reset()
	_, _ = io.WriteString(s.mac, id)
	_, _ = io.WriteString(s.mac, ".")
	_, _ = io.WriteString(s.mac, timestamp)
	_, _ = io.WriteString(s.mac, ".")
	_, _ = s.mac.Write(body)
	var sum [sha256.Size]byte
	return "v1," + base64.StdEncoding.EncodeToString(s.mac.Sum(sum[:0]))
}

// sign adds the Standard Webhooks headers to h: the row's id, the time of
// sending, and a v1 signature by each secret, separated by spaces.
func sign(h http.Header, id string, at time.Time, body []byte, signers []*signer) {
	timestamp := strconv.FormatInt(at.Unix(), 10)
	signature := signers[0].signature(id, timestamp, body)
	for _, s := range signers[1:] {
		signature += " " + s.signature(id, timestamp, body)
	}
	// The names are canonical already: set without canonicalizing them.
	h["Webhook-Id"] = []string{id}
	h["Webhook-Timestamp"] = []string{timestamp}
	h["Webhook-Signature"] = []string{signature}
}

// outcomeOf classifies a response by its status; snippet is the start of
// its body, and scrub removes what is secret from a text.
func outcomeOf(status int, h http.Header, snippet []byte, gonePoisons bool, now time.Time, scrub func(string) string) sink.Outcome {
	if status >= 200 && status < 300 {
		return sink.Outcome{Kind: sink.Confirmed}
	}
	detail := fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	o := sink.Outcome{Kind: sink.Refused}
	switch {
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests, status >= 500 && status < 600:
		o.Reason = reasonTransient
		if o.RetryAfter = retryAfter(h.Get("Retry-After"), now); o.RetryAfter > 0 {
			detail += fmt.Sprintf(", Retry-After %s", o.RetryAfter)
		}
	case status == http.StatusGone:
		o.Reason, o.Poison = reasonGone, gonePoisons
	case status >= 300 && status < 400:
		o.Reason = reasonRedirect
		detail += " (redirects are not followed)"
		if loc := h.Get("Location"); loc != "" {
			detail += " to " + loc
		}
	case status >= 400 && status < 500:
		o.Reason = reasonClient
	default:
		o.Reason = reasonOther
	}
	if len(bytes.TrimSpace(snippet)) > 0 {
		detail += ": " + string(snippet)
	}
	o.Detail = scrub(detail)
	return o
}

// retryAfter reads a Retry-After header, delay-seconds or an HTTP date, as
// a wait from now; 0 when there is none, or it is not one of those.
func retryAfter(v string, now time.Time) time.Duration {
	if v = strings.TrimSpace(v); v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int64(365*24*time.Hour/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now).Round(time.Second)
	}
	return 0
}

// requestTo is a request like template, posting body under ctx. The
// template's URL is shared, not parsed again for each request: a client
// that follows no redirect only reads it.
func requestTo(ctx context.Context, template *http.Request, body []byte) *http.Request {
	req := template.WithContext(ctx)
	req.ContentLength = int64(len(body))
	req.Body, req.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
	if len(body) > 0 {
		// Sent again whole if a reused connection turns out closed.
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.Body, _ = req.GetBody()
	}
	return req
}

// readResponse reads resp's body up to maxResponseBytes, so that the
// connection can be used again, and returns the first maxSnippet bytes of a
// refusal's: every response is read, and only a refusal's start is kept.
func readResponse(resp *http.Response) []byte {
	var snippet []byte
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet, _ = io.ReadAll(io.LimitReader(resp.Body, maxSnippet))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes-int64(len(snippet))))
	return snippet
}
