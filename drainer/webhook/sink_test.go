package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/certs"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("The webhook sink, against a receiver on a real port", func() {
	var receiver *testenv.Receiver

	BeforeEach(func() {
		var err error
		receiver, err = testenv.StartReceiver(testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(receiver.Stop)
	})

	dialFor := func(ctx context.Context, timeout time.Duration, secrets ...string) (sink.Sink, error) {
		file, err := testenv.WriteSecrets(GinkgoT().TempDir(), secrets...)
		Expect(err).NotTo(HaveOccurred())
		c := DefaultConfig()
		c.URL, c.AllowHTTP, c.SigningSecretFile, c.Timeout = receiver.URL(), true, file, timeout
		d := NewDialer(c, 8, 1<<20, "jsonb")
		Expect(d.Where()).To(Equal("webhook http://" + receiver.URL()[len("http://spillway:receiver-password@"):len(receiver.URL())-len("?token=receiver-token")]))
		return d.Dial(ctx, func() {})
	}
	dial := func(ctx context.Context, secrets ...string) (sink.Sink, error) {
		return dialFor(ctx, 500*time.Millisecond, secrets...)
	}
	post := func(s sink.Sink, id string) sink.Outcome {
		m, fault := s.Prepare(outbox.Row{ID: id, Payload: []byte(`{"n":1}`), Headers: []byte(`{"tenant":"acme"}`)}, sink.Trace{})
		Expect(fault).To(BeNil())
		d, err := s.Publish(context.Background(), m)
		Expect(err).NotTo(HaveOccurred())
		Eventually(d.Done(), 5*time.Second).Should(BeClosed())
		return d.Outcome()
	}

	It("signs each request so that the Standard Webhooks library verifies it, by either secret while they rotate", func(ctx SpecContext) {
		var got http.Header
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, n int) bool {
			got = r.Header.Clone()
			w.WriteHeader(http.StatusOK)
			return true
		}
		s, err := dial(ctx, receiver.Secret, testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		Expect(post(s, "row-1")).To(Equal(sink.Outcome{Kind: sink.Confirmed}))
		Expect(got.Get("X-Outbox-Tenant")).To(Equal("acme"))
		Expect(got.Get("Content-Type")).To(Equal("application/json"))
		Expect(got.Get("Webhook-Id")).To(Equal("row-1"))
		Expect(got.Get("Webhook-Signature")).To(MatchRegexp(`^v1,\S+ v1,\S+$`), "one signature per secret")

		s2, err := dial(ctx, testenv.NewSecret(), receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s2.Close)
		Expect(post(s2, "row-2").Kind).To(Equal(sink.Confirmed), "the new secret first")

		s3, err := dial(ctx, testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s3.Close)
		o := post(s3, "row-3")
		Expect(o.Kind).To(Equal(sink.Refused), "signed by a secret the receiver does not know")
		Expect(o.Detail).To(HavePrefix("HTTP 401 Unauthorized: unable to verify payload"))
		_, unverified, _ := receiver.Requests()
		Expect(unverified).To(Equal(1))
	})

	It("refuses to dial an endpoint that takes no connection, and loses the requests in flight when it goes away, never showing its credentials", func(ctx SpecContext) {
		s, err := dial(ctx, receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		Expect(post(s, "row-1").Kind).To(Equal(sink.Confirmed))
		receiver.Stop()
		// The first request may go out on the kept-alive connection the
		// receiver closed (EOF, a request that failed); the next finds no
		// receiver to connect to.
		o := post(s, "row-2")
		if s.Healthy() {
			Expect(o.Kind).To(Equal(sink.Lost))
			o = post(s, "row-2")
		}
		Expect(o.Kind).To(Equal(sink.Lost))
		Expect(o.Detail).To(ContainSubstring("connection refused"))
		Expect(o.Detail).NotTo(ContainSubstring("receiver-password"))
		Expect(s.Healthy()).To(BeFalse(), "the endpoint is away: the claim loop dials again")
		_, err = s.Publish(ctx, &request{id: "row-3"})
		Expect(err).To(MatchError(sink.ErrDown))

		_, err = dial(ctx, receiver.Secret)
		Expect(err).To(MatchError(ContainSubstring("connection refused")))
		Expect(err.Error()).NotTo(ContainSubstring("receiver-password"))
		Expect(err.Error()).NotTo(ContainSubstring("receiver-token"))
		Expect(receiver.Restart()).To(Succeed())
		s, err = dial(ctx, receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		Expect(post(s, "row-2").Kind).To(Equal(sink.Confirmed))
	})

	It("loses a request the receiver does not answer within the timeout, and stays healthy", func(ctx SpecContext) {
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, n int) bool {
			time.Sleep(time.Second)
			w.WriteHeader(http.StatusOK)
			return true
		}
		s, err := dial(ctx, receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		o := post(s, "slow")
		Expect(o.Kind).To(Equal(sink.Lost))
		Expect(o.Detail).To(ContainSubstring("deadline exceeded"))
		Expect(s.Healthy()).To(BeTrue(), "one slow request says nothing of the endpoint")
	})

	It("sends at most a pipeline's depth of requests at once, and gives a request still waiting for a sender back as lost when it closes", func(ctx SpecContext) {
		release := make(chan struct{})
		var inFlight, most atomic.Int32
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, n int) bool {
			now := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			<-release
			w.WriteHeader(http.StatusNoContent)
			return true
		}
		s, err := dialFor(ctx, time.Minute, receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		publish := func(n int) []sink.Delivery {
			deliveries := make([]sink.Delivery, n)
			for i := range deliveries {
				m, fault := s.Prepare(outbox.Row{ID: fmt.Sprintf("row-%d", i), Payload: []byte(`{"n":1}`)}, sink.Trace{})
				Expect(fault).To(BeNil())
				deliveries[i], err = s.Publish(ctx, m)
				Expect(err).NotTo(HaveOccurred())
			}
			return deliveries
		}
		// The dialer's depth is 8: the ninth request waits for a sender,
		// and with it the publishing goroutine.
		published := make(chan []sink.Delivery, 1)
		go func() {
			defer GinkgoRecover()
			published <- publish(12)
		}()
		Eventually(inFlight.Load).Should(Equal(int32(8)))
		Consistently(published, 200*time.Millisecond).ShouldNot(Receive(), "the publisher waits for a sender")
		close(release)
		var deliveries []sink.Delivery
		Eventually(published, 5*time.Second).Should(Receive(&deliveries))
		for _, d := range deliveries {
			Eventually(d.Done(), 5*time.Second).Should(BeClosed())
			Expect(d.Outcome().Kind).To(Equal(sink.Confirmed))
		}
		Expect(most.Load()).To(Equal(int32(8)), "never more than the depth at once")

		// Closed while a request waits for a sender: it is lost, never sent.
		hold := make(chan struct{})
		var arrived atomic.Int32
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, n int) bool {
			arrived.Add(1)
			<-hold
			return false
		}
		DeferCleanup(func() { close(hold) })
		go func() {
			defer GinkgoRecover()
			published <- publish(9)
		}()
		Eventually(arrived.Load).Should(Equal(int32(8)))
		s.Close()
		Eventually(published, 5*time.Second).Should(Receive(&deliveries))
		for _, d := range deliveries {
			Eventually(d.Done(), 5*time.Second).Should(BeClosed())
			Expect(d.Outcome().Kind).To(Equal(sink.Lost))
		}
		Expect(deliveries[8].Outcome().Detail).To(Equal("the webhook connection was closed"))
		Consistently(arrived.Load, 200*time.Millisecond).Should(Equal(int32(8)), "the ninth was never sent")
	})

	It("reads a signing secret file that holds no valid secret as an error that shows none", func(ctx SpecContext) {
		_, err := dial(ctx, "whsec_!!!not-base64-hunter2")
		Expect(err).To(MatchError(ContainSubstring("line 1: must be a Standard Webhooks secret")))
		Expect(err.Error()).NotTo(ContainSubstring("hunter2"))
	})
})

var _ = Describe("The webhook sink in batches", func() {
	It("posts up to batchRows rows in one signed request, a JSON array of envelopes, and resolves each row with it", func(ctx SpecContext) {
		receiver, err := testenv.StartReceiver(testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(receiver.Stop)
		var mu sync.Mutex
		var bodies [][]envelope
		var contentTypes []string
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, n int) bool {
			mu.Lock()
			contentTypes = append(contentTypes, r.Header.Get("Content-Type"))
			mu.Unlock()
			w.WriteHeader(http.StatusOK)
			return true
		}
		receiver.Inspect = func(body []byte) {
			var envelopes []envelope
			_ = json.Unmarshal(body, &envelopes) // checked below, as the envelopes
			mu.Lock()
			bodies = append(bodies, envelopes)
			mu.Unlock()
		}
		file, err := testenv.WriteSecrets(GinkgoT().TempDir(), receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		c := DefaultConfig()
		c.URL, c.AllowHTTP, c.SigningSecretFile, c.BatchRows = receiver.URL(), true, file, 3
		s, err := NewDialer(c, 8, 1<<20, "jsonb").Dial(ctx, func() {})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		key := "order.created"
		var deliveries []sink.Delivery
		for i := range 5 {
			m, fault := s.Prepare(outbox.Row{ID: fmt.Sprintf("row-%d", i), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)), RoutingKey: &key,
				Headers: []byte(`{"tenant":"acme"}`), EnqueuedAt: time.Date(2026, 12, 7, 3, 0, i, 0, time.UTC)}, sink.Trace{})
			Expect(fault).To(BeNil())
			d, err := s.Publish(ctx, m)
			Expect(err).NotTo(HaveOccurred())
			deliveries = append(deliveries, d)
		}
		Eventually(deliveries[0].Done()).Should(BeClosed(), "the first three went when the batch was full")
		Consistently(deliveries[3].Done(), 200*time.Millisecond).ShouldNot(BeClosed(), "the last two wait for Flush")
		s.Flush()
		for _, d := range deliveries {
			Eventually(d.Done()).Should(BeClosed())
			Expect(d.Outcome()).To(Equal(sink.Outcome{Kind: sink.Confirmed}))
		}
		lost, duplicates := receiver.Account([]string{"row-0", "row-1", "row-2", "row-3", "row-4"})
		Expect(lost).To(BeEmpty())
		Expect(duplicates).To(BeZero())
		mu.Lock()
		defer mu.Unlock()
		Expect(contentTypes).To(Equal([]string{"application/json", "application/json"}))
		Expect(bodies).To(HaveLen(2))
		Expect(bodies[0]).To(HaveLen(3))
		Expect(bodies[0][1]).To(Equal(envelope{ID: "row-1", RoutingKey: &key, EnqueuedAt: time.Date(2026, 12, 7, 3, 0, 1, 0, time.UTC),
			Headers: json.RawMessage(`{"tenant":"acme"}`), Payload: json.RawMessage(`{"n":1}`), PayloadEncoding: "json"}))
		Expect(bodies[1]).To(HaveLen(2))
	})
})

var _ = Describe("The webhook sink over TLS", func() {
	It("verifies the endpoint by the CA file, presents the client certificate, and speaks HTTP/2 where the server offers it", func(ctx SpecContext) {
		dir := GinkgoT().TempDir()
		ca := certs.Issue("", nil)
		server, client := certs.Issue("localhost", &ca), certs.Issue("drainer", &ca)
		certs.WritePEM(ca, filepath.Join(dir, "ca.crt"), "")
		certs.WritePEM(client, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		clientCAs := x509.NewCertPool()
		clientCAs.AddCert(ca.Leaf)
		var mu sync.Mutex
		var protos, peers []string
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			protos, peers = append(protos, r.Proto), append(peers, r.TLS.PeerCertificates[0].Subject.CommonName)
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		}))
		srv.EnableHTTP2 = true
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
		srv.StartTLS()
		DeferCleanup(srv.Close)

		secrets, err := testenv.WriteSecrets(dir, testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		c := DefaultConfig()
		c.URL = strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/hook"
		c.SigningSecretFile = secrets
		c.TLS = secret.TLSFiles{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
		s, err := NewDialer(c, 8, 1<<20, "jsonb").Dial(ctx, func() {})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		for i := range 3 {
			m, fault := s.Prepare(outbox.Row{ID: fmt.Sprintf("row-%d", i), Payload: []byte(`{}`)}, sink.Trace{})
			Expect(fault).To(BeNil())
			d, err := s.Publish(ctx, m)
			Expect(err).NotTo(HaveOccurred())
			Eventually(d.Done()).Should(BeClosed())
			Expect(d.Outcome()).To(Equal(sink.Outcome{Kind: sink.Confirmed}))
		}
		mu.Lock()
		Expect(protos).To(Equal([]string{"HTTP/2.0", "HTTP/2.0", "HTTP/2.0"}))
		Expect(peers).To(Equal([]string{"drainer", "drainer", "drainer"}))
		mu.Unlock()

		By("an endpoint whose certificate the CA did not sign is refused at dial, so claiming waits")
		c.TLS = secret.TLSFiles{}
		_, err = NewDialer(c, 8, 1<<20, "jsonb").Dial(ctx, func() {})
		Expect(err).To(MatchError(ContainSubstring("certificate signed by unknown authority")))
	})
})
