package secret

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TLSFiles are a connection's certificates, as files of a mounted Secret:
// the CA that signs the server's certificate and, optionally, a client
// certificate and its key. They are read at every connect, like the URL,
// so a rotated Secret takes effect at the next reconnect.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
}

// Enabled reports whether any file is set: the connection then verifies
// the server against CAFile, and presents the client certificate if set.
func (f TLSFiles) Enabled() bool { return f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" }

// Validate requires a CA with a client certificate, and the certificate
// and its key together; flag is the flags' prefix, as in --broker-ca-file.
func (f TLSFiles) Validate(path *field.Path, flag string) field.ErrorList {
	var errs field.ErrorList
	if (f.CertFile == "") != (f.KeyFile == "") {
		errs = append(errs, field.Invalid(path.Child("keyFile"), f.KeyFile,
			fmt.Sprintf("set --%s-cert-file and --%s-key-file together", flag, flag)))
	}
	if f.Enabled() && f.CAFile == "" {
		errs = append(errs, field.Required(path.Child("caFile"),
			fmt.Sprintf("--%s-ca-file: the CA that signs the server's certificate, which is always verified", flag)))
	}
	return errs
}

// Config reads the files into a client configuration that verifies the
// server's certificate against the CA and its name against serverName,
// which must not be empty: a certificate for another host is refused.
// An error names the file, never its content.
func (f TLSFiles) Config(serverName string) (*tls.Config, error) {
	if serverName == "" {
		return nil, errors.New("TLS needs the server's name to verify its certificate")
	}
	ca, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", f.CAFile)
	}
	cfg := &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
