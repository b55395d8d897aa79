package drainer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

// Each fault of a webhook receiver, under load, checked with the receiver's
// ledger: every row the receiver took, by webhook-id, against the rows.
var _ = Describe("Draining to a webhook", Label(tier.DB), func() {
	const rows = 2_000
	var (
		receiver *testenv.Receiver
		spec     outbox.TableSpec
		ids      []string
	)

	BeforeEach(func(ctx SpecContext) {
		var err error
		receiver, err = testenv.StartReceiver(testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { receiver.Stop() })
		spec = db.CanonicalOutbox(ctx)
		db.Seed(ctx, spec.Name, rows)
		ids = db.IDs(ctx, spec.Name, "true")
	})

	// webhookConfig posts to the receiver with depth requests in flight, a
	// lease as short as the depth allows and retries a tenth of a second
	// apart at first, a second at most.
	webhookConfig := func(depth int) Config {
		secrets, err := testenv.WriteSecrets(GinkgoT().TempDir(), receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		cfg := testConfig("webhook-drainer", spec, "")
		wh := webhook.DefaultConfig()
		wh.URL, wh.AllowHTTP, wh.SigningSecretFile = receiver.URL(), true, secrets
		cfg.Webhook, cfg.PipelineDepth, cfg.LeaseTTL = &wh, depth, MinLeaseTTL(depth)
		wh.Timeout = cfg.LeaseTTL / 3
		cfg.RetryInitial, cfg.RetryMax = 100*time.Millisecond, time.Second
		return cfg
	}

	// settled waits until every row is published, except gone rows, which
	// must be poisoned, then accounts for every row in the receiver's
	// ledger and reports it.
	settled := func(ctx context.Context, fault string, gone int) (duplicates int) {
		// Both, together: a row's poisoning and the others' publishing are
		// settled apart.
		Eventually(func() []int {
			return []int{db.Count(ctx, spec.Name, "published_at IS NOT NULL"),
				db.Count(ctx, spec.Name, "published_at IS NULL AND available_at = 'infinity' AND attempts >= 10")}
		}, 90*time.Second, 50*time.Millisecond).Should(Equal([]int{rows - gone, gone}), "every row published, and the gone ones poisoned")
		// A published row was taken before its 2xx was sent.
		lost, duplicates := receiver.Account(ids)
		Expect(lost).To(HaveLen(gone), "no row lost but the gone ones, which are poisoned, not lost")
		total, unverified, lastError := receiver.Requests()
		Expect(unverified).To(BeZero(), "every request verified: %s", lastError)
		AddReportEntry("ledger", fmt.Sprintf("%s: %d rows, %d requests, %d taken, %d lost, %d poisoned, %d duplicates",
			fault, rows, total, rows-len(lost)+duplicates, len(lost)-gone, gone, duplicates))
		return duplicates
	}

	DescribeTable("loses nothing through a storm of 500s, counting an attempt for each", func(ctx SpecContext, batchRows int) {
		var mu sync.Mutex
		var stormEnds time.Time
		receiver.Answer = func(w http.ResponseWriter, _ *http.Request, _ string, _ int) bool {
			mu.Lock()
			if stormEnds.IsZero() {
				stormEnds = time.Now().Add(2 * time.Second)
			}
			storm := time.Now().Before(stormEnds)
			mu.Unlock()
			if storm {
				http.Error(w, "upstream on fire", http.StatusInternalServerError)
				return false
			}
			w.WriteHeader(http.StatusOK)
			return true
		}
		cfg := webhookConfig(64)
		cfg.Webhook.BatchRows = batchRows
		d := startDrainer(ctx, cfg)
		Expect(settled(ctx, fmt.Sprintf("a 2 s storm of 500s, batches of %d", max(batchRows, 1)), 0)).To(BeZero())
		total, _, _ := receiver.Requests()
		responses := func(class string) float64 {
			return testutil.ToFloat64(d.metrics.WebhookResponses.WithLabelValues(class))
		}
		Expect(responses("5xx")).To(BeNumerically(">", 0))
		Expect(responses("2xx")).To(BeNumerically(">=", float64(rows/max(batchRows, 1))))
		Expect(responses("2xx")+responses("5xx")).To(BeEquivalentTo(total), "every request observed, by its status class")
		Expect(histogramCount(d.reg, "spillway_drainer_webhook_request_duration_seconds")).To(BeEquivalentTo(total))
		Expect(db.Count(ctx, spec.Name, "attempts > 0 AND last_error LIKE 'HTTP 500 Internal Server Error: upstream on fire%'")).To(BeNumerically(">", 0))
	},
		Entry("one row per request", 0),
		Entry("in batches of 16 rows", 16),
	)

	It("loses nothing to connection resets, counting no attempt", func(ctx SpecContext) {
		receiver.Answer = func(w http.ResponseWriter, _ *http.Request, _ string, n int) bool {
			if n == 0 {
				reset(w)
				return false
			}
			w.WriteHeader(http.StatusNoContent)
			return true
		}
		startDrainer(ctx, webhookConfig(64))
		Expect(settled(ctx, "the first request of every row reset", 0)).To(BeZero())
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero(), "a reset is the connection's fault, not the row's")
	})

	DescribeTable("loses nothing to 200s that come too late, which come back as duplicates", func(ctx SpecContext, late func(Config) time.Duration, fault string) {
		cfg := webhookConfig(4)
		slow := map[string]bool{}
		for _, id := range ids[:40] {
			slow[id] = true
		}
		receiver.Answer = func(w http.ResponseWriter, _ *http.Request, id string, n int) bool {
			if n == 0 && slow[id] {
				time.Sleep(late(cfg))
			}
			w.WriteHeader(http.StatusOK)
			return true
		}
		startDrainer(ctx, cfg)
		// A slow first request is taken when its handler wakes, which may be
		// after the row's second request was.
		Eventually(func() int { _, duplicates := receiver.Account(ids); return duplicates }, 30*time.Second).
			Should(Equal(40), "each slow row taken twice: once too late, once again")
		Expect(settled(ctx, "40 rows' first requests answered 200 "+fault, 0)).To(Equal(40))
	},
		Entry("after the request's timeout, within the lease", func(c Config) time.Duration { return c.Webhook.Timeout + 200*time.Millisecond },
			"after the timeout, within the lease"),
		Entry("after the lease passed", func(c Config) time.Duration { return c.LeaseTTL + 200*time.Millisecond }, "after the lease"),
	)

	It("waits out a 429's Retry-After before sending the row again", func(ctx SpecContext) {
		var mu sync.Mutex
		first, again := map[string]time.Time{}, map[string]time.Duration{}
		receiver.Answer = func(w http.ResponseWriter, _ *http.Request, id string, n int) bool {
			mu.Lock()
			defer mu.Unlock()
			if n == 0 {
				first[id] = time.Now()
				w.Header().Set("Retry-After", "2")
				http.Error(w, "slow down", http.StatusTooManyRequests)
				return false
			}
			again[id] = time.Since(first[id])
			w.WriteHeader(http.StatusOK)
			return true
		}
		cfg := webhookConfig(64)
		cfg.RetryMax = 5 * time.Second // Retry-After is honoured up to it
		startDrainer(ctx, cfg)
		Expect(settled(ctx, "429 with Retry-After 2 on every row's first request", 0)).To(BeZero())
		mu.Lock()
		defer mu.Unlock()
		Expect(again).To(HaveLen(rows))
		for id, wait := range again {
			// The due time is the database's now() + 2 s; the receiver's
			// clock saw the 429 a moment before the settle ran.
			Expect(wait).To(BeNumerically(">=", 1900*time.Millisecond), id)
		}
		Expect(db.Count(ctx, spec.Name, "attempts = 1")).To(Equal(rows))
	})

	It("in batches, poisons only the row a receiver refuses, however many batches it was sent in", func(ctx SpecContext) {
		bad := ids[7]
		receiver.Answer = func(w http.ResponseWriter, r *http.Request, id string, _ int) bool {
			body, _ := io.ReadAll(r.Body)
			if slices.Contains(testenv.Carried(id, r.Header, body), bad) {
				http.Error(w, "bad row", http.StatusBadRequest)
				return false
			}
			w.WriteHeader(http.StatusOK)
			return true
		}
		cfg := webhookConfig(64)
		cfg.Webhook.BatchRows = 16
		startDrainer(ctx, cfg)
		Expect(settled(ctx, "one row refused with 400, batches of 16", 1)).To(BeZero())
		Expect(db.IDs(ctx, spec.Name, "last_error = 'HTTP 400 Bad Request: bad row' AND attempts = 10")).To(Equal([]string{bad}))
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(Equal(1), "the rows batched with it count no attempt")
	})

	It("poisons at once the rows a receiver answers 410 Gone, where that is set", func(ctx SpecContext) {
		gone := map[string]bool{}
		for _, id := range ids[:25] {
			gone[id] = true
		}
		receiver.Answer = func(w http.ResponseWriter, _ *http.Request, id string, _ int) bool {
			if gone[id] {
				http.Error(w, "tenant deleted", http.StatusGone)
				return false
			}
			w.WriteHeader(http.StatusOK)
			return true
		}
		cfg := webhookConfig(64)
		cfg.Webhook.GonePoisons = true
		startDrainer(ctx, cfg)
		Expect(settled(ctx, "25 rows answered 410 Gone", 25)).To(BeZero())
		Expect(db.Count(ctx, spec.Name, "last_error = 'HTTP 410 Gone: tenant deleted' AND attempts = 10")).To(Equal(25))
	})

	It("loses nothing while the receiver is away for 30 s, pausing its claims and counting no attempt", func(ctx SpecContext) {
		var once sync.Once
		away := make(chan struct{})
		receiver.Answer = func(w http.ResponseWriter, _ *http.Request, _ string, n int) bool {
			time.Sleep(50 * time.Millisecond) // so that most rows are still pending when it goes
			w.WriteHeader(http.StatusOK)
			once.Do(func() { close(away) })
			return true
		}
		r := startDrainer(ctx, webhookConfig(64))
		Eventually(away).Should(BeClosed())
		receiver.Stop()
		Eventually(r.logs, 10*time.Second).Should(gbytes.Say("Webhook unavailable; claiming paused"))
		err := r.Ready(ctx)
		Expect(err).To(MatchError(And(ContainSubstring("webhook not connected: webhook http://"+receiver.Addr()+"/hooks/outbox: dial tcp"),
			ContainSubstring("connection refused"))), "the readiness probe says why, without the URL's password or token")
		Expect(err.Error()).NotTo(Or(ContainSubstring("receiver-password"), ContainSubstring("receiver-token")))
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL AND claimed_by IS NOT NULL") }, 10*time.Second).
			Should(BeZero(), "the rows in flight released")
		Expect(db.Count(ctx, spec.Name, "published_at IS NULL")).To(BeNumerically(">", rows/2), "most rows still waiting")
		Consistently(func() int { return db.Count(ctx, spec.Name, "claimed_by IS NOT NULL AND published_at IS NULL") }, 30*time.Second, time.Second).
			Should(BeZero(), "no row claimed while the receiver is away")
		Expect(receiver.Restart()).To(Succeed())
		Expect(settled(ctx, "the receiver away for 30 s", 0)).To(BeNumerically(">=", 0))
		Expect(db.Count(ctx, spec.Name, "attempts > 0")).To(BeZero(), "no attempt counted for the receiver's absence")
	})
})

// reset answers a request by resetting its connection: closed with no
// linger, the kernel sends RST.
func reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}

var _ = Describe("Draining an ordered outbox to a webhook", Label(tier.DB), func() {
	It("posts each key's rows one at a time, in order, with two drainers at once", func(ctx SpecContext) {
		receiver, err := testenv.StartReceiver(testenv.NewSecret())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(receiver.Stop)
		spec := db.OrderedOutbox(ctx, "")
		db.SeedKeys(ctx, spec.Name, 20, 25)
		var mu sync.Mutex
		// arrived is each key's seqs in the order they first arrived.
		inFlight, mostInFlight, arrived, seen := map[string]int{}, 0, map[string][]int{}, map[string]bool{}
		receiver.Inspect = func(body []byte) {
			var event struct {
				Key string `json:"key"`
				Seq int    `json:"seq"`
			}
			_ = json.Unmarshal(body, &event)
			mu.Lock()
			inFlight[event.Key]++
			mostInFlight = max(mostInFlight, inFlight[event.Key])
			if first := fmt.Sprint(event.Key, "/", event.Seq); !seen[first] {
				seen[first] = true
				arrived[event.Key] = append(arrived[event.Key], event.Seq)
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // long enough for a second request of the key to overlap, were one sent
			mu.Lock()
			inFlight[event.Key]--
			mu.Unlock()
		}
		secrets, err := testenv.WriteSecrets(GinkgoT().TempDir(), receiver.Secret)
		Expect(err).NotTo(HaveOccurred())
		for _, id := range []string{"drainer-a", "drainer-b"} {
			cfg := testConfig(id, spec, "")
			wh := webhook.DefaultConfig()
			wh.URL, wh.AllowHTTP, wh.SigningSecretFile = receiver.URL(), true, secrets
			cfg.Webhook, cfg.BatchSize = &wh, 7
			startDrainer(ctx, cfg)
		}
		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, 60*time.Second).Should(BeZero())
		mu.Lock()
		defer mu.Unlock()
		inOrder := make([]int, 25)
		for i := range inOrder {
			inOrder[i] = i + 1
		}
		Expect(arrived).To(HaveLen(20))
		for key, seqs := range arrived {
			Expect(seqs).To(Equal(inOrder), "key %s's rows posted in enqueue order", key)
		}
		Expect(mostInFlight).To(Equal(1), "one request per key in flight")
	})
})
