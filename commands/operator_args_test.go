package commands

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/samples"
)

var _ = Describe("The drainer's command line", func() {
	It("is accepted by spillway drain, which reads back the spec's settings", func() {
		od := samples.OutboxDrainer()
		od.Spec.Database.Columns = v1alpha1.Columns{ID: "event_id", EnqueuedAt: "created_at"}
		od.Spec.Database.RoutingKey = v1alpha1.RoutingKey{PayloadField: "event_type"}
		od.Spec.Retention = &v1alpha1.Retention{
			Published:         &metav1.Duration{Duration: 72 * time.Hour},
			UnpublishedMaxAge: &metav1.Duration{Duration: 720 * time.Hour},
		}
		od.Spec.MaxRate = ptr.To(int64(1600))
		od.Spec.MaxCommitLatency = &metav1.Duration{Duration: 4 * time.Millisecond}
		od.Spec.Broker.MessageProperties = "Compact"
		od.Spec.Ordering = &v1alpha1.Ordering{KeyColumn: "aggregate_id", OnFailure: "skip"}
		od.Spec.Database.Columns.TraceParent = "trace_parent"
		od.Spec.MessageFormat, od.Spec.CloudEventsSource = "CloudEventsStructured", "urn:shop:orders"
		args := resource.DrainArgs(od.Spec)
		Expect(args[0]).To(Equal("drain"))
		GinkgoT().Setenv("POD_NAME", "orders-7d9f-abcde") // the downward API's, in a pod

		cfg, httpAddr, err := ParseDrainFlags(args[1:])
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.DrainerID).To(Equal("orders-7d9f-abcde"))
		Expect(cfg.Database.File).To(Equal(resource.DatabaseURLDir + "/url"))
		Expect(cfg.Broker.File).To(Equal(resource.BrokerURLDir + "/url"))
		Expect(cfg.Table.Columns.ID).To(Equal("event_id"))
		Expect(cfg.Table.RoutingKey.PayloadField).To(Equal("event_type"))
		Expect(cfg.Broker.Exchange).To(Equal(od.Spec.Broker.Exchange))
		Expect(cfg.BatchSize).To(BeEquivalentTo(od.Spec.BatchSize))
		Expect(cfg.PipelineDepth).To(BeEquivalentTo(od.Spec.PipelineDepth))
		Expect(cfg.LeaseTTL).To(Equal(od.Spec.LeaseTTL.Duration))
		Expect(cfg.ShutdownTimeout).To(Equal(od.Spec.ShutdownTimeout.Duration))
		Expect(*cfg.Retention.Published).To(Equal(72 * time.Hour))
		Expect(*cfg.Retention.UnpublishedMaxAge).To(Equal(720 * time.Hour))
		Expect(cfg.MaxRate).To(Equal(1600.0))
		Expect(cfg.MaxCommitLatency).To(Equal(4 * time.Millisecond))
		Expect(cfg.Broker.MessageProperties).To(Equal(rabbitmq.CompactProperties))
		Expect(cfg.Table.Ordering).To(Equal(outbox.Ordering{KeyColumn: "aggregate_id", OnFailure: "skip"}))
		Expect(cfg.Table.Columns.TraceParent).To(Equal("trace_parent"))
		Expect(cfg.Format).To(Equal(sink.Format{Mode: sink.CloudEventsStructured, Source: "urn:shop:orders"}))
		Expect(httpAddr).To(Equal(fmt.Sprintf(":%d", resource.MetricsPort)))
	})

	It("reaches Postgres through a transaction pooler as the spec says: unnamed statements, and its own sessions past the pooler", func() {
		GinkgoT().Setenv("POD_NAME", "orders-7d9f-abcde")
		od := samples.OutboxDrainer()
		od.Spec.Database.Pooler = &v1alpha1.Pooler{Mode: v1alpha1.PoolModeTransaction,
			DirectURLSecretRef: &v1alpha1.SecretKeyRef{Name: "db-direct", Key: "url"}}
		cfg, _, err := ParseDrainFlags(resource.DrainArgs(od.Spec)[1:])
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.Pooling.Mode).To(Equal(outbox.PoolModeTransaction))
		Expect(cfg.Pooling.Direct.File).To(Equal(resource.DirectURLDir + "/url"))
		Expect(cfg.Pooling.Options(cfg.DrainerID, false).Unprepared).To(BeTrue())

		od.Spec.Database.Pooler = &v1alpha1.Pooler{Mode: v1alpha1.PoolModeSession, PreparedStatements: ptr.To(false)}
		cfg, _, err = ParseDrainFlags(resource.DrainArgs(od.Spec)[1:])
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.Pooling.Transaction()).To(BeFalse())
		Expect(cfg.Pooling.Options(cfg.DrainerID, false).Unprepared).To(BeTrue())
	})

	It("publishes to the default exchange only with mandatory, as the CRD's rule allows", func() {
		GinkgoT().Setenv("POD_NAME", "orders-7d9f-abcde")
		od := samples.OutboxDrainer()
		od.Spec.Broker.Exchange, od.Spec.Broker.Mandatory = "", true
		_, _, err := ParseDrainFlags(resource.DrainArgs(od.Spec)[1:])
		Expect(err).NotTo(HaveOccurred())
		od.Spec.Broker.Mandatory = false
		_, _, err = ParseDrainFlags(resource.DrainArgs(od.Spec)[1:])
		Expect(err).To(MatchError(ContainSubstring(`broker.exchange: Invalid value: "": set an exchange`)))
	})
})

var _ = Describe("A RabbitMQ fleet written as sink.rabbitmq", func() {
	It("runs drainers with the same command line and Secrets as one written as spec.broker, so moving to it rolls no pod", func() {
		od := samples.OutboxDrainer()
		od.Spec.Broker.TLS = &v1alpha1.BrokerTLS{TLS: v1alpha1.TLS{SecretName: "mq-tls", ClientCertificate: true}, External: true}
		moved := od.DeepCopy()
		moved.Spec.Sink, moved.Spec.Broker = &v1alpha1.SinkSpec{RabbitMQ: &od.Spec.Broker}, v1alpha1.BrokerSpec{}
		Expect(resource.DrainArgs(moved.Spec)).To(Equal(resource.DrainArgs(od.Spec)))
		Expect(resource.SecretNames(moved.Spec)).To(Equal(resource.SecretNames(od.Spec)))
		Expect(moved.Spec.SinkKind()).To(Equal(v1alpha1.SinkRabbitMQ))
	})
})

var _ = Describe("A webhook fleet's command line", func() {
	It("is accepted by spillway drain, which posts to the mounted URL, signs with the mounted secrets and sends no broker flag", func() {
		GinkgoT().Setenv("POD_NAME", "orders-7d9f-abcde")
		od := samples.OutboxDrainer()
		od.Spec.Broker = v1alpha1.BrokerSpec{}
		od.Spec.Sink = &v1alpha1.SinkSpec{Webhook: &v1alpha1.WebhookSpec{
			URLSecretRef:     v1alpha1.SecretKeyRef{Name: "partner", Key: "url"},
			SigningSecretRef: v1alpha1.SecretKeyRef{Name: "partner", Key: "signing-secret"},
			TLS:              &v1alpha1.TLS{SecretName: "partner-tls", ClientCertificate: true},
			HeaderPrefix:     ptr.To("X-Shop-"),
			Timeout:          metav1.Duration{Duration: 5 * time.Second},
			GonePoisons:      true,
			BatchRows:        50,
		}}
		args := resource.DrainArgs(od.Spec)
		Expect(args).NotTo(ContainElement(HavePrefix("--broker")))
		Expect(args).NotTo(ContainElement(HavePrefix("--exchange")))
		cfg, _, err := ParseDrainFlags(args[1:])
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.Webhook).NotTo(BeNil())
		wh := *cfg.Webhook
		Expect(wh.File).To(Equal(resource.WebhookURLDir + "/url"))
		Expect(wh.SigningSecretFile).To(Equal(resource.WebhookSigningDir + "/url"))
		Expect(wh.TLS.CAFile).To(Equal(resource.WebhookTLSDir + "/ca.crt"))
		Expect(wh.TLS.CertFile).To(Equal(resource.WebhookTLSDir + "/tls.crt"))
		Expect(wh.HeaderPrefix).To(Equal("X-Shop-"))
		Expect(wh.Timeout).To(Equal(5 * time.Second))
		Expect(wh.GonePoisons).To(BeTrue())
		Expect(wh.BatchRows).To(Equal(50))
		Expect(wh.AllowHTTP).To(BeFalse())
		Expect(resource.SecretNames(od.Spec)).To(Equal([]string{"orders-db", "partner", "partner", "partner-tls"}))
	})

	It("refuses a timeout over a third of the lease, naming the field", func() {
		GinkgoT().Setenv("POD_NAME", "orders-7d9f-abcde")
		_, _, err := ParseDrainFlags([]string{"--database-url=postgres://db/app", "--sink=webhook", "--webhook-url=https://partner.example/hook",
			"--webhook-signing-secret-file=/s", "--lease-ttl=80s", "--webhook-timeout=30s"})
		Expect(err).To(MatchError(ContainSubstring(`sink.webhook.timeout: Invalid value: "30s": must be at most a third of leaseTTL 1m20s`)))
		_, _, err = ParseDrainFlags([]string{"--database-url=postgres://db/app", "--sink=kafka"})
		Expect(err).To(MatchError(ContainSubstring(`sink "kafka": must be rabbitmq or webhook`)))
	})
})
