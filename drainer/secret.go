package drainer

import (
	"net/url"
	"regexp"
)

var dsnPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// RedactURL returns a connection string fit for a log line: a URL's password,
// or a key/value DSN's password=, is replaced by "xxxxx".
func RedactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && u.Host != "" {
		return u.Redacted()
	}
	if dsnPassword.MatchString(raw) {
		return dsnPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	if _, err := url.Parse(raw); err != nil {
		// Unparseable: there is no telling where the password is.
		return "(unparseable connection string)"
	}
	return raw
}
