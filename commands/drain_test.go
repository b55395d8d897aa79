package commands

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/tier"
)

func TestCommands(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Commands Suite")
}

var pool *pgxpool.Pool

var services suite.Lazy

// Only the specs that run against Postgres connect to it.
var _ = BeforeEach(func(ctx SpecContext) {
	if tier.Needs(tier.DB) {
		pool = services.Connect(ctx).DB
	}
})

var _ = AfterSuite(services.Close)

var _ = Describe("spillway drain flags", func() {
	It("parses --columns pairs and names an unknown logical column", func() {
		var c outbox.Columns
		Expect(columnsFlag{&c}.Set("id=event_id, enqueuedAt=created_at")).To(Succeed())
		Expect(c.ID).To(Equal("event_id"))
		Expect(c.EnqueuedAt).To(Equal("created_at"))
		Expect(columnsFlag{&c}.Set("key=x")).To(MatchError(ContainSubstring(`unknown column "key"`)))
	})

	base := []string{"--database-url=postgres://x@127.0.0.1/db", "--broker-url=amqp://127.0.0.1/", "--drainer-id=d-1"}

	It("rejects bad values before connecting to anything, naming the field, value and rule", func() {
		err := DrainCommand(context.Background(), append(base, "--batch-size=0", "--pipeline-depth=10", "--lease-ttl=1s"))
		Expect(err).To(MatchError(And(
			ContainSubstring("batchSize: Invalid value: 0: must be greater than 0"),
			ContainSubstring(`leaseTTL: Invalid value: "1s": must be at least 3 × pipelineDepth × 100ms = 3s for pipelineDepth 10`),
		)))
	})

	It("rejects a table name containing SQL", func() {
		err := DrainCommand(context.Background(), append(base, "--table=public.outbox;drop table users"))
		Expect(err).To(MatchError(ContainSubstring(`database.table: Invalid value: "public.outbox;drop table users"`)))
	})

	It("binds every setting to the config with the documented defaults", func() {
		cfg := drainer.DefaultConfig()
		fs := drainFlags(&cfg, new(string))
		Expect(fs.Parse([]string{"--columns=id=event_id", "--routing-key-field=type", "--mandatory", "--max-attempts=3"})).To(Succeed())
		Expect(cfg.Table.Columns.ID).To(Equal("event_id"))
		Expect(cfg.Table.RoutingKey.PayloadField).To(Equal("type"))
		Expect(cfg.Broker.Mandatory).To(BeTrue())
		Expect(cfg.MaxAttempts).To(Equal(3))
		Expect(cfg.BatchSize).To(Equal(500))
		Expect(cfg.PipelineDepth).To(Equal(256))
		Expect(cfg.LeaseTTL.String()).To(Equal("1m20s"))
		Expect(cfg.SynchronousCommit).To(BeFalse())
		Expect(cfg.ShutdownTimeout.String()).To(Equal("30s"))
		Expect(cfg.MaxClaimBytes).To(Equal(int64(8 << 20)))
		Expect(cfg.MaxPipelineBytes).To(Equal(int64(16 << 20)))
		Expect(cfg.Broker.MessageProperties).To(Equal(rabbitmq.FullProperties))
		Expect(cfg.Retention.Published).To(BeNil(), "unset: each row deleted once published, and no prune")
		Expect(cfg.Retention.UnpublishedMaxAge).To(BeNil())
	})

	It("takes secrets as files, retention windows as durations and the message properties by name", func() {
		cfg := drainer.DefaultConfig()
		fs := drainFlags(&cfg, new(string))
		Expect(fs.Parse([]string{"--database-url-file=/var/run/secrets/db/url", "--broker-url-file=/var/run/secrets/amqp/url",
			"--retention-published=168h", "--retention-unpublished-max-age=720h", "--shutdown-timeout=10s",
			"--message-properties=compact"})).To(Succeed())
		Expect(cfg.Database.File).To(Equal("/var/run/secrets/db/url"))
		Expect(cfg.Broker.File).To(Equal("/var/run/secrets/amqp/url"))
		Expect(*cfg.Retention.Published).To(Equal(168 * time.Hour))
		Expect(*cfg.Retention.UnpublishedMaxAge).To(Equal(720 * time.Hour))
		Expect(cfg.ShutdownTimeout).To(Equal(10 * time.Second))
		Expect(cfg.Broker.MessageProperties).To(Equal(rabbitmq.CompactProperties))
	})

	It("takes the pooler's mode, its statements and the URL past it, and refuses what does not fit, naming the field", func() {
		cfg := drainer.DefaultConfig()
		Expect(drainFlags(&cfg, new(string)).Parse(nil)).To(Succeed())
		Expect(cfg.Pooling.Transaction()).To(BeFalse())
		Expect(cfg.Pooling.Options("d", false)).To(Equal(outbox.PoolOptions{DrainerID: "d", Mode: outbox.PoolModeSession}), "prepared, in session mode")

		cfg = drainer.DefaultConfig()
		Expect(drainFlags(&cfg, new(string)).Parse([]string{"--database-pool-mode=transaction",
			"--database-direct-url-file=/var/run/secrets/direct/url", "--max-rate-drainers=3"})).To(Succeed())
		Expect(cfg.Pooling.Options("d", true)).To(Equal(outbox.PoolOptions{DrainerID: "d", SynchronousCommit: true, Mode: outbox.PoolModeTransaction, Unprepared: true}))
		Expect(cfg.Pooling.Direct.File).To(Equal("/var/run/secrets/direct/url"))
		Expect(cfg.MaxRateDrainers).To(Equal(3))
		Expect(drainFlags(&cfg, new(string)).Parse([]string{"--database-prepared-statements"})).To(Succeed())
		Expect(cfg.Pooling.Options("d", true).Unprepared).To(BeFalse(), "PgBouncer 1.21+ keeps them")

		err := DrainCommand(context.Background(), append(base, "--database-pool-mode=statement"))
		Expect(err).To(MatchError(ContainSubstring(`database.poolMode: Unsupported value: "statement": supported values: "session", "transaction"`)))
		err = DrainCommand(context.Background(), append(base, "--database-direct-url=postgres://u:s3cret@db:5432/x"))
		Expect(err).To(MatchError(ContainSubstring(`database.directURL: Invalid value: "postgres://u:xxxxx@db:5432/x": only serves a pooler in transaction mode`)))
		Expect(err.Error()).NotTo(ContainSubstring("s3cret"))
		err = DrainCommand(context.Background(), append(base, "--max-rate-drainers=0"))
		Expect(err).To(MatchError(ContainSubstring("maxRateDrainers: Invalid value: 0: must be greater than 0")))
	})

	It("refuses a zero unpublished retention window given as a flag", func() {
		err := DrainCommand(context.Background(), append(base, "--retention-unpublished-max-age=0s"))
		Expect(err).To(MatchError(ContainSubstring(`retention.unpublishedMaxAge: Invalid value: "0s": must be greater than 0`)))
	})

	It("takes a zero published window as deleting each row once published", func() {
		cfg := drainer.DefaultConfig()
		Expect(drainFlags(&cfg, new(string)).Parse([]string{"--retention-published=0s"})).To(Succeed())
		Expect(cfg.Retention.Published).To(HaveValue(BeZero()))
	})
})
