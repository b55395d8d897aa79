package rabbitmq

import (
	"io"
	"log/slog"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("A delivery", Label(tier.Broker), func() {
	It("is confirmed when its confirm arrived before its channel closed, instead of spinning on the closed return channel", func(ctx SpecContext) {
		conn, err := testenv.Connect(ctx)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(conn.Close)
		ch, err := conn.Broker.Channel()
		Expect(err).NotTo(HaveOccurred())
		topo, err := testenv.DeclareTopology(ch, "#", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { topo.Delete(ch); _ = ch.Close() })

		cfg := DefaultConfig()
		cfg.URL, cfg.Exchange = testenv.BrokerURL(), topo.Exchange
		s, err := NewDialer(cfg, "drainer-a", 8, 1<<20, "jsonb", slog.New(slog.NewTextHandler(io.Discard, nil))).Dial(ctx, func() {})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(s.Close)
		key := "order.created"
		msg, fault := s.Prepare(outbox.Row{ID: "row-1", Payload: []byte("{}"), RoutingKey: &key}, sink.Trace{})
		Expect(fault).To(BeNil())
		d, err := s.Publish(ctx, msg)
		Expect(err).NotTo(HaveOccurred())
		s.Flush()
		Eventually(d.Done()).Should(BeClosed())
		Expect(s.(*channel).ch.Close()).To(Succeed())

		outcome := make(chan sink.Outcome, 1)
		go func() { outcome <- d.Outcome() }()
		var got sink.Outcome
		Eventually(outcome, 5*time.Second).Should(Receive(&got))
		Expect(got.Kind).To(Equal(sink.Confirmed), "the broker acked it before the channel closed")
	})
})
