package webhook

import (
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("A response's outcome", func() {
	now := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	scrub := func(s string) string { return secret.Scrub(s, "https://u:hunter2@example.com/hook") }
	outcome := func(status int, header http.Header, body string, gonePoisons bool) sink.Outcome {
		if header == nil {
			header = http.Header{}
		}
		return outcomeOf(status, header, []byte(body), gonePoisons, now, scrub)
	}

	It("is confirmed for any 2xx", func() {
		for _, status := range []int{200, 201, 202, 204, 299} {
			Expect(outcome(status, nil, "", false)).To(Equal(sink.Outcome{Kind: sink.Confirmed}), "%d", status)
		}
	})

	It("counts an attempt for 408, 425, 429 and 5xx as transient, honouring Retry-After in seconds or as a date", func() {
		for _, status := range []int{408, 425, 429, 500, 502, 503, 504, 599} {
			o := outcome(status, nil, "", false)
			Expect(o.Kind).To(Equal(sink.Refused), "%d", status)
			Expect(o.Reason).To(Equal(reasonTransient), "%d", status)
			Expect(o.RetryAfter).To(BeZero())
		}
		o := outcome(429, http.Header{"Retry-After": {"120"}}, "slow down", false)
		Expect(o.RetryAfter).To(Equal(2 * time.Minute))
		Expect(o.Detail).To(Equal("HTTP 429 Too Many Requests, Retry-After 2m0s: slow down"))
		o = outcome(503, http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, "", false)
		Expect(o.RetryAfter).To(Equal(90 * time.Second))
		Expect(outcome(503, http.Header{"Retry-After": {"soon"}}, "", false).RetryAfter).To(BeZero(), "not a delay: the policy's backoff")
	})

	It("fails any other 4xx and a 3xx, never following the redirect, with the status and a scrubbed snippet of the body", func() {
		o := outcome(400, nil, "bad request: password=hunter2 and the key https://u:hunter2@example.com/hook", false)
		Expect(o.Kind).To(Equal(sink.Refused))
		Expect(o.Reason).To(Equal(reasonClient))
		Expect(o.Detail).To(HavePrefix("HTTP 400 Bad Request: bad request: password=xxxxx"))
		Expect(o.Detail).NotTo(ContainSubstring("hunter2"))
		o = outcome(302, http.Header{"Location": {"https://u:hunter2@example.com/elsewhere"}}, "", false)
		Expect(o.Reason).To(Equal(reasonRedirect))
		Expect(o.Detail).To(Equal("HTTP 302 Found (redirects are not followed) to https://u:xxxxx@example.com/elsewhere"))
		o = outcome(404, nil, strings.Repeat("x", 10_000), false)
		Expect(len(o.Detail)).To(BeNumerically("<=", secret.MaxShown+len("…")))
	})

	It("poisons a row at once on 410 Gone only where that is set", func() {
		Expect(outcome(410, nil, "", true)).To(Equal(sink.Outcome{Kind: sink.Refused, Reason: reasonGone, Poison: true, Detail: "HTTP 410 Gone"}))
		Expect(outcome(410, nil, "", false).Poison).To(BeFalse())
	})
})

var _ = Describe("A row's request", func() {
	row := func(headers string) outbox.Row {
		return outbox.Row{ID: "0193-id", Payload: []byte(`{"n":1}`), Headers: []byte(headers)}
	}

	It("carries the row's headers under the prefix, strings, numbers and booleans as they are", func() {
		r, fault := requestOf(row(`{"tenant":"acme","version":3,"replay":false}`), sink.Trace{}, "X-Outbox-", "application/json", 1<<20)
		Expect(fault).To(BeNil())
		Expect(r.header).To(Equal(http.Header{
			"X-Outbox-Tenant": {"acme"}, "X-Outbox-Version": {"3"}, "X-Outbox-Replay": {"false"},
			"Content-Type": {"application/json"},
		}))
		Expect(r.Size()).To(Equal(int64(7)))
	})

	DescribeTable("fails a row whose header HTTP cannot carry, naming it and the rule", func(headers, prefix, detail string) {
		_, fault := requestOf(row(headers), sink.Trace{}, prefix, "application/json", 1<<20)
		Expect(fault).NotTo(BeNil())
		Expect(fault.Reason).To(Equal(reasonBadHeaders))
		Expect(fault.Detail).To(ContainSubstring(detail))
	},
		Entry("a name with a space", `{"trace id":"x"}`, "X-Outbox-", `"X-Outbox-trace id" is not a valid HTTP header name`),
		Entry("a line break in a value", `{"note":"a\r\nSet-Cookie: x"}`, "X-Outbox-", "X-Outbox-note: the value holds a character HTTP does not allow"),
		Entry("an object as a value", `{"nested":{"a":1}}`, "X-Outbox-", "X-Outbox-nested: a value must be a string, a number or a boolean"),
		Entry("the request's own header, with no prefix", `{"webhook-signature":"v1,forged"}`, "", `"webhook-signature" would replace the request's own header`),
		Entry("not an object", `[1,2]`, "X-Outbox-", "must be a JSON object"),
	)

	It("fails an oversized row, whose payload was never loaded", func() {
		_, fault := requestOf(outbox.Row{ID: "big", Size: 2 << 20}, sink.Trace{}, "X-Outbox-", "application/json", 1<<20)
		Expect(fault).To(Equal(sink.Oversized(outbox.Row{ID: "big", Size: 2 << 20}, 1<<20)))
	})
})

var _ = Describe("The webhook's settings", func() {
	valid := func() Config {
		c := DefaultConfig()
		c.URL, c.SigningSecretFile = "https://user:hunter2@example.com/hook", "/etc/spillway/webhook/signing-secret"
		return c
	}

	It("accepts an https URL with a signing secret", func() {
		Expect(valid().Validate(nil)).To(BeEmpty())
	})

	It("names the field, the value (without its password) and the rule of each error", func() {
		c := valid()
		c.URL, c.SigningSecretFile, c.HeaderPrefix, c.Timeout = "http://user:hunter2@example.com/hook", "", "X Outbox", 0
		errs := c.Validate(nil).ToAggregate().Error()
		Expect(errs).To(ContainSubstring(`url: Invalid value: "http://user:xxxxx@example.com/hook": must be https: set allowHTTP`))
		Expect(errs).To(ContainSubstring("signingSecretFile: Required value"))
		Expect(errs).To(ContainSubstring(`headerPrefix: Invalid value: "X Outbox"`))
		Expect(errs).To(ContainSubstring(`timeout: Invalid value: "0s": must be greater than 0`))
		Expect(errs).NotTo(ContainSubstring("hunter2"))
		c = valid()
		c.URL, c.AllowHTTP = "http://example.com/hook", true
		Expect(c.Validate(nil)).To(BeEmpty())
		c.URL = "ftp://example.com/hook"
		Expect(c.Validate(nil).ToAggregate().Error()).To(ContainSubstring("must be an https URL, not ftp"))
	})
})

var _ = Describe("A request's signature", func() {
	It("is the Standard Webhooks library's, by each secret, and verifies with either during a rotation", func() {
		secrets := []string{testenv.NewSecret(), testenv.NewSecret()}
		var signers []*signer
		for _, s := range secrets {
			sg, err := newSigner(s)
			Expect(err).NotTo(HaveOccurred())
			signers = append(signers, sg)
		}
		at := time.Unix(1_796_000_000, 0)
		// The signer is used again and again: each signature must stand alone.
		for _, body := range []string{`{"order":7}`, "", strings.Repeat("é", 300)} {
			h := http.Header{}
			sign(h, "row-1", at, []byte(body), signers)
			Expect(h.Get("webhook-id")).To(Equal("row-1"))
			Expect(h.Get("webhook-timestamp")).To(Equal("1796000000"))
			got := strings.Split(h.Get("webhook-signature"), " ")
			Expect(got).To(HaveLen(2))
			for i, s := range secrets {
				lib, err := standardwebhooks.NewWebhook(s)
				Expect(err).NotTo(HaveOccurred())
				want, err := lib.Sign("row-1", at, []byte(body))
				Expect(err).NotTo(HaveOccurred())
				Expect(got[i]).To(Equal(want), "secret %d, body %q", i, body)
			}
		}
	})

	It("refuses a secret that is not whsec_ and base64", func() {
		for _, s := range []string{"whsec_!!!", "", "whsec_"} {
			_, err := newSigner(s)
			Expect(err).To(HaveOccurred(), "%q", s)
		}
	})
})
