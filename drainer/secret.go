package drainer

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
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

// URLSource is a connection URL given inline, for local use, or as the path
// of a mounted secret file. The file is read at every connect, so a rotated
// password takes effect at the next reconnect, with no restart.
type URLSource struct {
	URL  string
	File string
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

// validate requires exactly one of the URL and the file.
func (s URLSource) validate(path *field.Path, what string) field.ErrorList {
	switch {
	case s.URL == "" && s.File == "":
		return field.ErrorList{field.Required(path.Child("url"), what+": set the URL or the path of a file holding it")}
	case s.URL != "" && s.File != "":
		return field.ErrorList{field.Invalid(path.Child("urlFile"), s.File, "set the URL or the file, not both")}
	}
	return nil
}

// RedactError removes a URL's password from an error that quotes the URL,
// as net/url's parse errors do.
func RedactError(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil {
		return errors.New("invalid URL (not shown: it may contain a password)")
	}
	if pw, ok := u.User.Password(); ok && pw != "" && strings.Contains(err.Error(), pw) {
		return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
	}
	return err
}
