// Package secret holds the connection URLs that carry passwords: where each
// comes from (a value, or a mounted Secret's file, read again at every
// connect and watched for rotation), and how to show a URL, an error or a
// stored last error without what is secret in it.
package secret

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

var dsnPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// RedactURL returns a connection string fit for a log line: a URL's password,
// or a key/value DSN's password=, is replaced by "xxxxx". A comma-separated
// list of URLs is shown URL by URL.
func RedactURL(raw string) string {
	if urls := Endpoints(raw); len(urls) > 1 && strings.Contains(raw, "://") {
		shown := make([]string, len(urls))
		for i, one := range urls {
			u, err := url.Parse(one)
			if err != nil || u.Scheme == "" || u.Host == "" {
				return unparseable
			}
			shown[i] = u.Redacted()
		}
		return strings.Join(shown, ",")
	}
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && u.Host != "" {
		return u.Redacted()
	}
	if dsnPassword.MatchString(raw) {
		return dsnPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	if _, err := url.Parse(raw); err != nil {
		// Unparseable: there is no telling where the password is.
		return unparseable
	}
	return raw
}

const unparseable = "(unparseable connection string)"

// URLSource is a connection URL given inline, for local use, or as the path
// of a mounted secret file. The file is read at every connect, so a rotated
// password takes effect at the next reconnect, with no restart.
type URLSource struct {
	URL  string
	File string
	// TLS is the certificates the connection verifies the server with, and
	// presents, if any.
	TLS TLSFiles
}

// Endpoints splits a list of URLs, comma-separated as the Java and .NET
// AMQP clients take an address list, into its URLs. A piece without a
// scheme continues the URL before it: the next host of a multi-host
// Postgres URL (postgres://u@h1:5433,h2:5434/db), or the rest of a password
// with a comma in it.
func Endpoints(raw string) []string {
	var urls []string
	for _, u := range strings.Split(raw, ",") {
		switch u = strings.TrimSpace(u); {
		case u == "":
		case len(urls) > 0 && !strings.Contains(u, "://"):
			urls[len(urls)-1] += "," + u
		default:
			urls = append(urls, u)
		}
	}
	return urls
}

// Read returns the URL. An error names the file, never its content.
func (s URLSource) Read() (string, error) {
	if s.File == "" {
		return s.URL, nil
	}
	b, err := os.ReadFile(s.File)
	if err != nil {
		return "", fmt.Errorf("read URL file: %w", err)
	}
	url := strings.TrimSpace(string(b))
	if url == "" {
		return "", fmt.Errorf("URL file %s is empty", s.File)
	}
	return url, nil
}

// Validate requires exactly one of the URL and the file, and checks the
// TLS files; path names the connection as its flags do (database, broker).
func (s URLSource) Validate(path *field.Path, what string) field.ErrorList {
	errs := s.TLS.Validate(path.Child("tls"), path.String())
	switch {
	case s.URL == "" && s.File == "":
		errs = append(errs, field.Required(path.Child("url"), what+": set the URL or the path of a file holding it"))
	case s.URL != "" && s.File != "":
		errs = append(errs, field.Invalid(path.Child("urlFile"), s.File, "set the URL or the file, not both"))
	}
	return errs
}

// RedactError removes a URL's password (each URL's, of a list) from an
// error that quotes the URL, as net/url's parse errors do.
func RedactError(err error, rawURL string) error {
	text := err.Error()
	for _, one := range append([]string{rawURL}, Endpoints(rawURL)...) {
		u, perr := url.Parse(one)
		if perr != nil {
			return errors.New("invalid URL (not shown: it may contain a password)")
		}
		if pw, ok := u.User.Password(); ok && pw != "" {
			text = strings.ReplaceAll(text, pw, "xxxxx")
		}
	}
	if text == err.Error() {
		return err // keep its chain
	}
	return errors.New(text)
}

// MaxShown is how much of an error Scrub keeps: enough to tell causes
// apart, short enough for a status field.
const MaxShown = 256

var (
	// urlUserinfo is a URL's user:password@, anywhere in a text.
	urlUserinfo = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@]*):[^\s@/]*@`)
	// secretValue is a key=value or key: value whose key says it is a secret.
	secretValue = regexp.MustCompile(`(?i)\b((?:api[_-]?key|token|secret|passw(?:or)?d|pwd)\s*[=:]\s*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+)`)
	bearer      = regexp.MustCompile(`(?i)\b(bearer\s+)\S+`)
	whitespace  = regexp.MustCompile(`[\s\p{Cc}]+`)
)

// Scrub makes an error's text fit to show: the drainer writes it from what
// a broker said, and another writer of an adopted table could put anything
// there. Each known secret (a URL's password, or the value itself) is
// removed, then whatever looks like a password, a token or a URL's
// credentials, and only then is it cut, so that no cut leaves half a secret
// behind. Control characters and runs of blanks become one space.
func Scrub(text string, secrets ...string) string {
	text = strings.ToValidUTF8(text, "?")
	for _, s := range withEndpoints(secrets) {
		if len(s) >= 4 {
			text = strings.ReplaceAll(text, s, "xxxxx")
		}
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && pw != "" {
				text = strings.ReplaceAll(text, pw, "xxxxx")
			}
		}
	}
	text = urlUserinfo.ReplaceAllString(text, "${1}:xxxxx@")
	text = secretValue.ReplaceAllString(text, "${1}xxxxx")
	text = bearer.ReplaceAllString(text, "${1}xxxxx")
	text = strings.TrimSpace(whitespace.ReplaceAllString(text, " "))
	return Truncate(text, MaxShown)
}

// withEndpoints adds each URL of a list among secrets to them.
func withEndpoints(secrets []string) []string {
	all := append([]string(nil), secrets...)
	for _, s := range secrets {
		if urls := Endpoints(s); len(urls) > 1 {
			all = append(all, urls...)
		}
	}
	return all
}

// Truncate cuts s to at most n bytes and marks the cut, never inside a
// character: half of one is not valid UTF-8, which a status field or a text
// column refuses.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
