package secret

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/certs"
)

var _ = Describe("TLS files", func() {
	var (
		dir    string
		ca     tls.Certificate
		server *httptest.Server
		// clientSeen is the client certificate's name the server was shown.
		clientSeen string
	)
	BeforeEach(func() {
		dir = GinkgoT().TempDir()
		ca = certs.Issue("", nil)
		certs.WritePEM(ca, filepath.Join(dir, "ca.crt"), "")
		certs.WritePEM(certs.Issue("drainer", &ca), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		roots := x509.NewCertPool()
		roots.AddCert(ca.Leaf)
		clientSeen = ""
		server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(r.TLS.PeerCertificates) > 0 {
				clientSeen = r.TLS.PeerCertificates[0].Subject.CommonName
			}
		}))
		server.TLS = &tls.Config{Certificates: []tls.Certificate{certs.Issue("localhost", &ca)}, ClientCAs: roots, ClientAuth: tls.VerifyClientCertIfGiven}
		server.StartTLS()
		DeferCleanup(server.Close)
	})

	get := func(cfg *tls.Config) error {
		c := http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		_, port, _ := net.SplitHostPort(server.Listener.Addr().String())
		resp, err := c.Get("https://localhost:" + port)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	It("verifies the server against the CA, presents the client certificate, and refuses a certificate for another name", func() {
		files := TLSFiles{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
		cfg, err := files.Config("localhost")
		Expect(err).NotTo(HaveOccurred())
		Expect(get(cfg)).To(Succeed())
		Expect(clientSeen).To(Equal("drainer"))

		cfg, err = files.Config("db.example.com")
		Expect(err).NotTo(HaveOccurred())
		Expect(get(cfg)).To(MatchError(ContainSubstring("certificate is valid for localhost, not db.example.com")))

		_, err = files.Config("")
		Expect(err).To(MatchError(ContainSubstring("needs the server's name")))
	})

	It("refuses a server whose certificate another CA signed", func() {
		certs.WritePEM(certs.Issue("", nil), filepath.Join(dir, "other-ca.crt"), "")
		cfg, err := TLSFiles{CAFile: filepath.Join(dir, "other-ca.crt")}.Config("localhost")
		Expect(err).NotTo(HaveOccurred())
		Expect(get(cfg)).To(MatchError(ContainSubstring("certificate signed by unknown authority")))
	})

	It("names the file it cannot use, never its content", func() {
		_, err := TLSFiles{CAFile: filepath.Join(dir, "missing.crt")}.Config("localhost")
		Expect(err).To(MatchError(ContainSubstring("missing.crt")))
		Expect(os.WriteFile(filepath.Join(dir, "junk.crt"), []byte("not a certificate"), 0o600)).To(Succeed())
		_, err = TLSFiles{CAFile: filepath.Join(dir, "junk.crt")}.Config("localhost")
		Expect(err).To(MatchError("CA file " + filepath.Join(dir, "junk.crt") + " holds no PEM certificate"))
		_, err = TLSFiles{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "ca.crt")}.Config("localhost")
		Expect(err).To(MatchError(ContainSubstring("load client certificate")))
	})
})

var _ = Describe("Lists of URLs", func() {
	It("splits a comma-separated list, trimming spaces and dropping empty entries", func() {
		Expect(Endpoints(" amqp://a/, amqp://b/ ,,")).To(Equal([]string{"amqp://a/", "amqp://b/"}))
		Expect(Endpoints("")).To(BeEmpty())
	})
	It("keeps a multi-host Postgres URL, and a password with a comma, whole", func() {
		multi := "postgres://app:s3cret@h1:5433,h2:5434/test?target_session_attrs=read-write"
		Expect(Endpoints(multi)).To(Equal([]string{multi}))
		Expect(RedactURL(multi)).To(Equal("postgres://app:xxxxx@h1:5433,h2:5434/test?target_session_attrs=read-write"))
		Expect(RedactError(errors.New("s3cret refused at h2:5434"), multi)).To(MatchError("xxxxx refused at h2:5434"))
		Expect(Scrub("login s3cret refused", multi)).To(Equal("login xxxxx refused"))
		Expect(Endpoints("amqp://u:pa,ss@a:5682/")).To(HaveLen(1))
		Expect(RedactURL("amqp://u:pa,ss@a:5682/")).To(Equal("amqp://u:xxxxx@a:5682/"))
	})
	It("shows each URL of a list without its password", func() {
		Expect(RedactURL("amqp://u:p1@a:5682/,amqps://u:p2@b:5693/vh")).To(Equal("amqp://u:xxxxx@a:5682/,amqps://u:xxxxx@b:5693/vh"))
		Expect(RedactError(errors.New("refused p1 and p2"), "amqp://u:p1@a/,amqp://u:p2@b/")).To(MatchError("refused xxxxx and xxxxx"))
		Expect(Scrub("login p2 refused", "amqp://u:p1@a/,amqp://u:p2@b/")).To(Equal("login xxxxx refused"))
	})
})
