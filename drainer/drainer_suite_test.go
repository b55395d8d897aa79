package drainer

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestDrainer(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Drainer Suite")
}

var (
	pool    *pgxpool.Pool
	db      suite.DB
	amqpCon *amqp.Connection
)

var services suite.Lazy

// Only the specs that run against Postgres or RabbitMQ connect to them.
var _ = BeforeEach(func(ctx SpecContext) {
	if tier.Needs(tier.DB, tier.Broker) {
		s := services.Connect(ctx)
		pool, amqpCon, db = s.DB, s.Broker, suite.DB{Pool: s.DB}
	}
})

var _ = AfterSuite(services.Close)

// amqpChannel opens a channel for the current test.
func amqpChannel() *amqp.Channel {
	ch, err := amqpCon.Channel()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = ch.Close() })
	return ch
}

// topology declares an exchange and a bound queue for the current test.
func topology(bindingKey string, queueArgs amqp.Table) testenv.Topology {
	ch := amqpChannel()
	t, err := testenv.DeclareTopology(ch, bindingKey, queueArgs)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		ch, err := amqpCon.Channel()
		if err == nil {
			t.Delete(ch)
			_ = ch.Close()
		}
	})
	return t
}

// startLedger counts what reaches queue, by message_id, until the test ends.
func startLedger(queue string) *testenv.Ledger {
	ledger, err := testenv.StartLedger(amqpCon, queue)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(ledger.Stop)
	return ledger
}

// testConfig is a valid config for the current test's table and exchange.
func testConfig(id string, spec outbox.TableSpec, exchange string) Config {
	cfg := DefaultConfig()
	cfg.DrainerID = id
	cfg.Database.URL = testenv.DatabaseURL()
	cfg.Broker.URL = testenv.BrokerURL()
	cfg.Broker.Exchange = exchange
	cfg.Table = spec
	cfg.PollInterval = 50 * time.Millisecond
	// The specs read the published history as their evidence (which rows
	// were published, by whom): they keep it. The default keeps none, and
	// has specs of its own.
	cfg.Retention.Published = &specHistory
	return cfg
}

// specHistory is how long the specs keep published rows: longer than any
// spec runs.
var specHistory = 24 * time.Hour

// running is a drainer started by a test.
type running struct {
	*Drainer
	reg *prometheus.Registry
	// logs holds what the drainer logged, for specs that wait for a log line.
	logs *gbytes.Buffer
	stop context.CancelFunc
	// done receives Run's result; exited closes after it.
	done   chan error
	exited chan struct{}
}

// newDrainer builds a drainer over the shared pool, with its own metrics.
func newDrainer(ctx context.Context, cfg Config) *running { return newDrainerOn(ctx, pool, cfg) }

// newDrainerOn builds a drainer over p, with its own metrics.
func newDrainerOn(ctx context.Context, p *pgxpool.Pool, cfg Config) *running {
	store, err := outbox.OpenStore(ctx, p, cfg.Table)
	Expect(err).NotTo(HaveOccurred())
	reg, logs := prometheus.NewRegistry(), gbytes.NewBuffer()
	d, err := New(cfg, store, NewMetrics(reg), testLog(logs))
	Expect(err).NotTo(HaveOccurred())
	return &running{Drainer: d, reg: reg, logs: logs}
}

// start runs the drainer until the test ends.
func (r *running) start() *running {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop, r.done, r.exited = cancel, make(chan error, 1), make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(r.exited)
		r.done <- r.Run(ctx)
	}()
	DeferCleanup(func() {
		r.stop()
		Eventually(r.exited, 30*time.Second).Should(BeClosed())
		select {
		case err := <-r.done: // unless the test took it
			Expect(err).NotTo(HaveOccurred())
		default:
		}
	})
	return r
}

// testLog writes a drainer's log into buf, and also to the spec's output
// when SPILLWAY_TEST_LOG is set.
func testLog(buf io.Writer) *slog.Logger {
	if os.Getenv("SPILLWAY_TEST_LOG") != "" {
		buf = io.MultiWriter(buf, GinkgoWriter)
	}
	return slog.New(NewLogHandler(buf))
}

// startDrainer builds and runs a drainer until the test ends.
func startDrainer(ctx context.Context, cfg Config) *running {
	return newDrainer(ctx, cfg).start()
}

// histogramCount is the number of observations of a histogram in reg.
func histogramCount(reg *prometheus.Registry, name string) uint64 {
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}
