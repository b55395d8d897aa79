package v1alpha1_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestAPI(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "OutboxDrainer API Suite", Label(tier.Envtest))
}

var k8s client.Client

var _ = BeforeSuite(func() {
	env, cfg, err := kubeenv.StartControlPlane()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)
	scheme := runtime.NewScheme()
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

// manifest is an OutboxDrainer as a user writes it, with only the required
// fields; edit changes it before it is applied, as kubectl would send it.
func manifest(edit func(spec map[string]any)) *unstructured.Unstructured {
	spec := map[string]any{
		"database": map[string]any{"urlSecretRef": map[string]any{"name": "orders-db", "key": "url"}},
		"broker":   map[string]any{"urlSecretRef": map[string]any{"name": "rabbit", "key": "url"}, "exchange": "orders"},
	}
	if edit != nil {
		edit(spec)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "spillway.io/v1alpha1",
		"kind":       "OutboxDrainer",
		"metadata":   map[string]any{"name": testenv.UniqueObjectName("orders"), "namespace": "default"},
		"spec":       spec,
	}}
	return u
}

func set(path string, value any) func(map[string]any) {
	return func(spec map[string]any) {
		keys := strings.Split(path, ".")
		m := spec
		for _, k := range keys[:len(keys)-1] {
			if _, ok := m[k]; !ok {
				m[k] = map[string]any{}
			}
			m = m[k].(map[string]any)
		}
		m[keys[len(keys)-1]] = value
	}
}

func unset(path string) func(map[string]any) {
	return func(spec map[string]any) {
		keys := strings.Split(path, ".")
		m := spec
		for _, k := range keys[:len(keys)-1] {
			m = m[k].(map[string]any)
		}
		delete(m, keys[len(keys)-1])
	}
}

func all(edits ...func(map[string]any)) func(map[string]any) {
	return func(spec map[string]any) {
		for _, e := range edits {
			e(spec)
		}
	}
}

var _ = Describe("The OutboxDrainer schema", func() {
	It("defaults every setting of a minimal fleet to the drainer's own default", func(ctx SpecContext) {
		u := manifest(nil)
		Expect(k8s.Create(ctx, u)).To(Succeed())
		var od v1alpha1.OutboxDrainer
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(u), &od)).To(Succeed())

		d := drainer.DefaultConfig()
		s := od.Spec
		Expect(s.Replicas).To(Equal(ptr.To(int32(1))))
		Expect(s.Database.Table).To(Equal(d.Table.Name))
		Expect(s.Broker.ExchangeType).To(Equal(d.Broker.ExchangeType))
		Expect(s.Broker.Mandatory).To(Equal(d.Broker.Mandatory))
		Expect(s.Broker.DeclareExchange).To(Equal(d.Broker.DeclareExchange))
		Expect(strings.ToLower(s.Broker.MessageProperties)).To(Equal(string(d.Broker.MessageProperties)))
		Expect(s.Database.SynchronousCommit).To(Equal(d.SynchronousCommit))
		Expect(int(s.BatchSize)).To(Equal(d.BatchSize))
		Expect(int(s.PipelineDepth)).To(Equal(d.PipelineDepth))
		Expect(s.LeaseTTL.Duration).To(Equal(d.LeaseTTL))
		Expect(s.PollInterval.Duration).To(Equal(d.PollInterval))
		Expect(int(s.MaxAttempts)).To(Equal(d.MaxAttempts))
		Expect(s.RetryBackoff.Initial.Duration).To(Equal(d.RetryInitial))
		Expect(s.RetryBackoff.Max.Duration).To(Equal(d.RetryMax))
		Expect(s.MaxPayloadBytes).To(Equal(d.MaxPayloadBytes))
		Expect(s.ShutdownTimeout.Duration).To(Equal(30 * time.Second))
		Expect(s.StatusInterval.Duration).To(Equal(15 * time.Second))
		Expect(s.Retention).To(BeNil(), "unset retention keeps no published row and every pending one")
	})

	DescribeTable("accepts",
		func(ctx SpecContext, edit func(map[string]any)) {
			Expect(k8s.Create(ctx, manifest(edit))).To(Succeed())
		},
		Entry("a lease exactly 3 × pipelineDepth × 100ms", all(set("pipelineDepth", int64(5)), set("leaseTTL", "1500ms"))),
		Entry("a lease in minutes", all(set("pipelineDepth", int64(1000)), set("leaseTTL", "5m"))),
		Entry("a schema-qualified table and mapped columns",
			all(set("database.table", "app.athena_outbox"), set("database.columns.id", "event_id"), set("database.columns.enqueuedAt", "created_at"))),
		Entry("one routing key source", set("database.routingKey.payloadField", "event_type")),
		Entry("compact message properties", set("broker.messageProperties", "Compact")),
		Entry("a positive retention", all(set("retention.published", "72h"), set("retention.unpublishedMaxAge", "720h"))),
		Entry("zero replicas", set("replicas", int64(0))),
		Entry("the RabbitMQ sink as sink.rabbitmq", func(spec map[string]any) {
			spec["sink"] = map[string]any{"rabbitmq": spec["broker"]}
			delete(spec, "broker")
		}),
		Entry("a webhook sink instead of the broker", all(unset("broker"), set("sink.webhook", map[string]any{"urlSecretRef": map[string]any{"name": "partner", "key": "url"},
			"signingSecretRef": map[string]any{"name": "partner", "key": "signing-secret"}}))),
		Entry("the default exchange with mandatory on", all(unset("broker.exchange"), set("broker.mandatory", true))),
		Entry("autoscaling down to zero", set("autoscaling", map[string]any{"minReplicas": int64(0), "maxReplicas": int64(4),
			"targetBacklogPerReplica": int64(25_000), "targetOldestPendingAge": "1m", "scaleDownStabilization": "0s"})),
		Entry("autoscaling beside the default replicas, which kubectl apply may send", all(set("replicas", int64(1)),
			set("autoscaling", map[string]any{"maxReplicas": int64(1), "targetBacklogPerReplica": int64(1)}))),
		Entry("a pooler in transaction mode, polling", set("database.pooler", map[string]any{"mode": "Transaction"})),
		Entry("a pooler in transaction mode with a direct URL and maxRate", all(set("maxRate", int64(500)),
			set("database.pooler", map[string]any{"mode": "Transaction", "preparedStatements": true,
				"directURLSecretRef": map[string]any{"name": "orders-db-direct", "key": "url"}}))),
		Entry("maxRate beside a pooler in session mode", all(set("maxRate", int64(500)), set("database.pooler", map[string]any{"mode": "Session"}))),
	)

	DescribeTable("rejects, naming the field and the rule,",
		func(ctx SpecContext, edit func(map[string]any), message string) {
			err := k8s.Create(ctx, manifest(edit))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("a table name containing SQL", set("database.table", "outbox; DROP TABLE users"),
			`spec.database.table: Invalid value: "outbox; DROP TABLE users": spec.database.table in body should match`),
		Entry("a quoted table name", set("database.table", `public."Outbox"`), "spec.database.table"),
		Entry("a column name containing SQL", set("database.columns.id", "id) OR (1=1"), "spec.database.columns.id"),
		Entry("a routing key column containing SQL", set("database.routingKey.column", "kind --"), "spec.database.routingKey.column"),
		Entry("batchSize 0", set("batchSize", int64(0)), "spec.batchSize: Invalid value: 0: spec.batchSize in body should be greater than or equal to 1"),
		Entry("pipelineDepth 0", set("pipelineDepth", int64(0)), "spec.pipelineDepth"),
		Entry("a lease too short for the default pipeline depth", set("leaseTTL", "10s"),
			"spec.leaseTTL: Invalid value: leaseTTL 10s is too short: the lease rule is leaseTTL >= 3 × pipelineDepth × 100ms = 76800ms for pipelineDepth 256"),
		Entry("a lease too short for its pipeline depth", all(set("pipelineDepth", int64(5)), set("leaseTTL", "1499ms")),
			"leaseTTL 1499ms is too short: the lease rule is leaseTTL >= 3 × pipelineDepth × 100ms = 1500ms for pipelineDepth 5"),
		Entry("a missing secret key", unset("database.urlSecretRef.key"), "spec.database.urlSecretRef.key: Required value"),
		Entry("a missing secret name", unset("broker.urlSecretRef.name"), "spec.broker.urlSecretRef.name: Required value"),
		Entry("an empty secret name", set("broker.urlSecretRef.name", ""), "spec.broker.urlSecretRef.name"),
		Entry("a missing database", unset("database"), "spec.database: Required value"),
		Entry("two routing key sources", all(set("database.routingKey.column", "kind"), set("database.routingKey.constant", "orders")),
			"set only one of column, payloadField and constant"),
		Entry("a zero unpublished retention, which would delete the pending set", set("retention.unpublishedMaxAge", "0s"),
			`spec.retention.unpublishedMaxAge: Invalid value: "0s": must be positive`),
		Entry("a negative published retention", set("retention.published", "-1h"), "spec.retention.published"),
		Entry("a duration that is not one", set("pollInterval", "soon"), "spec.pollInterval"),
		Entry("a negative duration", set("pollInterval", "-1s"), "spec.pollInterval"),
		Entry("the broker twice, as broker and as sink.rabbitmq", func(spec map[string]any) { spec["sink"] = map[string]any{"rabbitmq": spec["broker"]} },
			"set one sink: sink.rabbitmq (or broker, as earlier fleets name it) or sink.webhook"),
		Entry("sink.rabbitmq on the default exchange without mandatory", func(spec map[string]any) {
			spec["sink"] = map[string]any{"rabbitmq": map[string]any{"urlSecretRef": map[string]any{"name": "rabbit", "key": "url"}}}
			delete(spec, "broker")
		}, "spec.sink.rabbitmq.exchange: Invalid value"),
		Entry("no sink", unset("broker"), "set one sink: sink.rabbitmq (or broker, as earlier fleets name it) or sink.webhook"),
		Entry("two sinks", set("sink.webhook", map[string]any{"urlSecretRef": map[string]any{"name": "partner", "key": "url"},
			"signingSecretRef": map[string]any{"name": "partner", "key": "signing-secret"}}), "set one sink: sink.rabbitmq (or broker, as earlier fleets name it) or sink.webhook"),
		Entry("a webhook without its signing secret", all(unset("broker"), set("sink.webhook", map[string]any{
			"urlSecretRef": map[string]any{"name": "partner", "key": "url"}})), "spec.sink.webhook.signingSecretRef: Required value"),
		Entry("a webhook timeout over a third of the lease", all(unset("broker"), set("sink.webhook", map[string]any{"urlSecretRef": map[string]any{"name": "partner", "key": "url"},
			"signingSecretRef": map[string]any{"name": "partner", "key": "signing-secret"}}),
			set("sink.webhook.timeout", "30s")), "spec.sink.webhook.timeout: Invalid value: a webhook request must end well within its rows' lease"),
		Entry("a webhook header prefix HTTP cannot carry", all(unset("broker"), set("sink.webhook", map[string]any{"urlSecretRef": map[string]any{"name": "partner", "key": "url"},
			"signingSecretRef": map[string]any{"name": "partner", "key": "signing-secret"}}),
			set("sink.webhook.headerPrefix", "X Outbox:")), "spec.sink.webhook.headerPrefix"),
		Entry("a retry cap under the initial delay", all(set("retryBackoff.initial", "1m"), set("retryBackoff.max", "10s")),
			"max must be at least initial"),
		Entry("an unknown exchange type", set("broker.exchangeType", "x-delayed"), "spec.broker.exchangeType: Unsupported value"),
		Entry("message properties neither Full nor Compact", set("broker.messageProperties", "compact"),
			`spec.broker.messageProperties: Unsupported value: "compact": supported values: "Full", "Compact"`),
		Entry("negative replicas", set("replicas", int64(-1)), "spec.replicas"),
		Entry("maxAttempts 0", set("maxAttempts", int64(0)), "spec.maxAttempts"),
		Entry("a pool mode PgBouncer's statement mode", set("database.pooler", map[string]any{"mode": "Statement"}),
			`spec.database.pooler.mode: Unsupported value: "Statement": supported values: "Session", "Transaction"`),
		Entry("a direct URL without transaction mode", set("database.pooler", map[string]any{
			"directURLSecretRef": map[string]any{"name": "orders-db-direct", "key": "url"}}),
			"spec.database.pooler.directURLSecretRef: Invalid value: directURLSecretRef only serves a pooler in Transaction mode"),
		Entry("maxRate through a transaction pooler with no direct URL", all(set("maxRate", int64(500)),
			set("database.pooler", map[string]any{"mode": "Transaction"})),
			"spec.maxRate: Invalid value: maxRate is shared by the drainers counting each other on a session of their own"),
		Entry("the default exchange without mandatory, which drops unroutable rows", unset("broker.exchange"),
			"set an exchange, or broker.mandatory to publish to the default exchange"),
		Entry("an empty exchange without mandatory", set("broker.exchange", ""), "spec.broker.exchange: Invalid value"),
		Entry("replicas set by hand beside autoscaling", all(set("replicas", int64(3)),
			set("autoscaling", map[string]any{"maxReplicas": int64(4), "targetBacklogPerReplica": int64(100)})),
			"spec.replicas: Forbidden: replicas is 3, but autoscaling sets the replica count: remove replicas (it defaults to 1), "+
				"or remove autoscaling to scale the fleet with kubectl scale, an HPA or KEDA"),
		Entry("autoscaling with minReplicas above maxReplicas",
			set("autoscaling", map[string]any{"minReplicas": int64(5), "maxReplicas": int64(4), "targetBacklogPerReplica": int64(100)}),
			"spec.autoscaling.minReplicas: Invalid value: minReplicas 5 is above maxReplicas 4"),
		Entry("autoscaling without maxReplicas", set("autoscaling", map[string]any{"targetBacklogPerReplica": int64(100)}),
			"spec.autoscaling.maxReplicas: Required value"),
		Entry("autoscaling without a backlog target", set("autoscaling", map[string]any{"maxReplicas": int64(4)}),
			"spec.autoscaling.targetBacklogPerReplica: Required value"),
		Entry("a backlog target of 0", set("autoscaling", map[string]any{"maxReplicas": int64(4), "targetBacklogPerReplica": int64(0)}),
			"spec.autoscaling.targetBacklogPerReplica: Invalid value: 0"),
		Entry("a zero age target", set("autoscaling", map[string]any{"maxReplicas": int64(4), "targetBacklogPerReplica": int64(1),
			"targetOldestPendingAge": "0s"}), `spec.autoscaling.targetOldestPendingAge: Invalid value: "0s": must be positive`),
	)

	It("defaults autoscaling's minReplicas and stabilization window, and keeps an explicit minReplicas of 0", func(ctx SpecContext) {
		defaulted := manifest(set("autoscaling", map[string]any{"maxReplicas": int64(4), "targetBacklogPerReplica": int64(100)}))
		Expect(k8s.Create(ctx, defaulted)).To(Succeed())
		var od v1alpha1.OutboxDrainer
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(defaulted), &od)).To(Succeed())
		Expect(od.Spec.Autoscaling.MinReplicas).To(Equal(ptr.To(int32(1))))
		Expect(od.Spec.Autoscaling.ScaleDownStabilization.Duration).To(Equal(5 * time.Minute))

		zero := manifest(set("autoscaling", map[string]any{"minReplicas": int64(0), "maxReplicas": int64(4), "targetBacklogPerReplica": int64(100)}))
		Expect(k8s.Create(ctx, zero)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(zero), &od)).To(Succeed())
		Expect(od.Spec.Autoscaling.MinReplicas).To(Equal(ptr.To(int32(0))))
	})

	It("rejects a name too long for the metrics Service's", func(ctx SpecContext) {
		u := manifest(nil)
		u.SetName(strings.Repeat("a", 56))
		err := k8s.Create(ctx, u)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("metadata.name must be at most 55 characters"))
	})
})
