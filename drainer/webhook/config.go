// Package webhook is the drainer's webhook sink: each row is an HTTP POST to
// one endpoint, signed as Standard Webhooks sign (webhook-id is the row's
// id). A 2xx is Confirmed; 408, 425, 429 and 5xx are Refused as transient,
// with the response's Retry-After; any other status is Refused, and a 410
// Gone can poison the row at once; a request that got no response (refused,
// reset, a TLS failure, the timeout) is Lost. It is the one package that
// speaks HTTP to a receiver.
package webhook

import (
	"fmt"
	"net/url"
	"time"

	"golang.org/x/net/http/httpguts"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/secret"
)

// Config says where and how rows are posted.
type Config struct {
	// URLSource is the endpoint's URL, which may carry credentials: inline
	// for local use, or a mounted Secret's file, read at every connect.
	secret.URLSource
	// SigningSecretFile holds the Standard Webhooks signing secrets
	// (whsec_ and base64), one per line: two while one replaces the other,
	// and every request then carries a signature by each.
	SigningSecretFile string
	// HeaderPrefix goes before the name of each of the row's headers, so
	// they cannot pass for the request's own.
	HeaderPrefix string
	// AllowHTTP lets the URL be http://; by default only https is.
	AllowHTTP bool
	// Timeout bounds each request, from its start to the end of its
	// response.
	Timeout time.Duration
	// GonePoisons poisons a row at once when the receiver answers 410 Gone;
	// otherwise a 410 counts an attempt as any other 4xx does.
	GonePoisons bool
	// ContentType overrides the one derived from the payload column's type.
	ContentType string
	// BatchRows, when over 0, posts up to that many rows in one request, as
	// a JSON array of envelopes (see envelope) instead of one payload per
	// request.
	BatchRows int
	// Format is the drainer's message format: plain, or CloudEvents.
	Format sink.Format
}

// DefaultConfig is the webhook sink's defaults.
func DefaultConfig() Config {
	return Config{HeaderPrefix: "X-Outbox-", Timeout: 10 * time.Second}
}

// Validate checks every rule of the webhook's settings, at path; each error
// names the field, the value and the rule. A URL in a file is checked when
// it is read, at every connect.
func (c Config) Validate(path *field.Path) field.ErrorList {
	errs := c.URLSource.Validate(path, "the webhook's URL")
	if c.URL != "" {
		if err := c.checkURL(c.URL); err != nil {
			errs = append(errs, field.Invalid(path.Child("url"), secret.RedactURL(c.URL), err.Error()))
		}
	}
	if c.SigningSecretFile == "" {
		errs = append(errs, field.Required(path.Child("signingSecretFile"),
			"the file holding the Standard Webhooks signing secret (whsec_...), or two, one per line, while rotating"))
	}
	if c.HeaderPrefix != "" && !httpguts.ValidHeaderFieldName(c.HeaderPrefix) {
		errs = append(errs, field.Invalid(path.Child("headerPrefix"), c.HeaderPrefix, "must be made of the characters of an HTTP header name (RFC 9110 token)"))
	}
	if c.BatchRows < 0 || c.BatchRows > maxBatchRows {
		errs = append(errs, field.Invalid(path.Child("batchRows"), c.BatchRows, fmt.Sprintf("must be between 0 (one row per request) and %d", maxBatchRows)))
	}
	if c.Timeout <= 0 {
		errs = append(errs, field.Invalid(path.Child("timeout"), c.Timeout.String(), "must be greater than 0"))
	}
	return errs
}

// checkURL says why raw cannot be the endpoint, never quoting its secrets.
func (c Config) checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("must be an http(s) URL: %v", secret.RedactError(err, raw))
	}
	switch {
	case u.Host == "":
		return fmt.Errorf("must be an absolute URL with a host")
	case u.Scheme == "https":
	case u.Scheme == "http" && c.AllowHTTP:
	case u.Scheme == "http":
		return fmt.Errorf("must be https: set allowHTTP (--webhook-allow-http) to post in the clear")
	default:
		return fmt.Errorf("must be an https URL, not %s", u.Scheme)
	}
	return nil
}

// where is the endpoint for a log line: its scheme, host and path, without
// credentials or query, which may hold a token.
func where(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}
