package drainer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/testenv"
)

func TestDrainer(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Drainer Suite")
}

var (
	pool    *pgxpool.Pool
	amqpCon *amqp.Connection
)

var _ = BeforeSuite(func(ctx SpecContext) {
	services, err := testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(services.Close)
	pool, amqpCon = services.DB, services.Broker
})

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

// canonicalOutbox migrates a fresh canonical table for the current test.
func canonicalOutbox(ctx context.Context) TableSpec {
	spec := TableSpec{Name: "public." + testenv.UniqueName("outbox")}
	_, err := Migrate(ctx, pool, spec)
	Expect(err).NotTo(HaveOccurred())
	dropAfterTest(spec.Name)
	return spec
}

func dropAfterTest(table string) {
	DeferCleanup(func(ctx SpecContext) {
		_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table)
		Expect(err).NotTo(HaveOccurred())
	})
}

// exec runs fixture SQL: the test playing the application or the clock.
func exec(ctx context.Context, sql string, args ...any) int64 {
	tag, err := pool.Exec(ctx, sql, args...)
	Expect(err).NotTo(HaveOccurred(), sql)
	return tag.RowsAffected()
}

// seed inserts n pending rows with routing key order.created.
func seed(ctx context.Context, table string, n int) {
	exec(ctx, fmt.Sprintf(`INSERT INTO %s (event_type, payload, headers)
		SELECT 'order.created', jsonb_build_object('n', g), jsonb_build_object('seq', g)
		FROM generate_series(1, $1) g`, table), n)
}

// count returns the number of rows of table matching where.
func count(ctx context.Context, table, where string, args ...any) int {
	var n int
	Expect(pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE "+where, args...).Scan(&n)).To(Succeed())
	return n
}

// ids returns the ids of table matching where, as text.
func ids(ctx context.Context, table, where string, args ...any) []string {
	rows, err := pool.Query(ctx, "SELECT id::text FROM "+table+" WHERE "+where, args...)
	Expect(err).NotTo(HaveOccurred())
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	Expect(err).NotTo(HaveOccurred())
	return out
}

// testConfig is a valid config for the current test's table and exchange.
func testConfig(id string, spec TableSpec, exchange string) Config {
	cfg := DefaultConfig()
	cfg.DrainerID = id
	cfg.Database.URL = testenv.DatabaseURL()
	cfg.Broker.URL = testenv.BrokerURL()
	cfg.Broker.Exchange = exchange
	cfg.Table = spec
	cfg.PollInterval = 50 * time.Millisecond
	return cfg
}

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
func newDrainer(ctx context.Context, cfg Config) *running {
	store, err := OpenStore(ctx, pool, cfg.Table)
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
