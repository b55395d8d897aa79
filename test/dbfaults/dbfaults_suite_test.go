// Package dbfaults runs drainer processes against the databases users run
// in production: a primary with a streaming replica that fails over
// (hack/postgres-ha.sh), reached by a multi-host URL with
// target_session_attrs=read-write, and PgBouncer in front of it in
// transaction mode. Each spec injects one fault for real under load (a
// switchover, a crash, a demoted primary left reachable, a drain through
// the pooler, the pooler paused, reconnected and restarted, and every server
// connection killed by it) and accounts for every row by its id against the
// messages the queue received; and one cuts the link between a drainer and
// a server of its own without a word (test/netsplit).
package dbfaults

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/faultwatch"
	"github.com/spillway-io/spillway/test/pgha"
	"github.com/spillway-io/spillway/test/rabbitcluster"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestDatabaseFaults(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Database Failover and Pooler Faults Suite", Label(tier.Faults))
}

var (
	spillway string
	// pool is the application's, following the primary.
	pool    *pgxpool.Pool
	broker  *amqp.Connection
	reports faultwatch.Reports
)

var _ = BeforeSuite(func(ctx SpecContext) {
	if missing := pgha.Missing(); missing != "" {
		if pgha.InCI() {
			Fail(missing)
		}
		Skip(missing)
	}
	spillway = suite.BuildSpillway()
	ha("up", "sync")
	ha("pgbouncer", "up")
	DeferCleanup(func() { ha("down") })
	var err error
	pool, err = pgha.Pool(ctx, pgha.URL("postgres"))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(pool.Close)
	broker, err = amqp.Dial(testenv.BrokerURL())
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(broker.Close)
}, NodeTimeout(5*time.Minute))

var _ = ReportAfterSuite("the faults' figures", func(Report) { reports.Print() })

// ha runs hack/postgres-ha.sh, failing the spec if it fails, and returns
// its result line.
func ha(args ...string) string {
	out, err := pgha.Script(args...)
	Expect(err).NotTo(HaveOccurred())
	return out
}

// channel opens a channel on the system broker for the current spec.
func channel() *amqp.Channel {
	ch, err := broker.Channel()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = ch.Close() })
	return ch
}

// fleet is one spec's outbox on the primary, with a queue bound to its
// exchange, and traffic written into it while the spec runs.
type fleet struct {
	outbox  testenv.Outbox
	spec    outbox.TableSpec
	topo    testenv.Topology
	traffic *testenv.Traffic
	stopped sync.Once
	written []string
	err     error
}

// backlogRows are written before the drainers start, and trafficRate a
// second after that: enough that every fault lands mid-drain and keeps
// new rows coming through it.
const (
	backlogRows = 20_000
	trafficRate = 400
)

// newFleet restores the primary, its synchronous replica and PgBouncer,
// whatever the last spec left, and makes the spec's outbox: canonical, or
// ordered on aggregate_id with the application's rows spread over 500 keys.
func newFleet(ctx context.Context, ordered bool) *fleet {
	ha("up", "sync")
	ha("pgbouncer", "up")
	db := suite.DB{Pool: pool}
	f := &fleet{}
	if ordered {
		f.spec = db.OrderedOutbox(ctx, "block")
		db.Exec(ctx, "ALTER TABLE "+f.spec.Name+" ALTER COLUMN aggregate_id SET DEFAULT 'k' || floor(random() * 500)::int")
		db.SeedKeys(ctx, f.spec.Name, 500, backlogRows/500)
	} else {
		f.spec = db.CanonicalOutbox(ctx)
		db.Seed(ctx, f.spec.Name, backlogRows)
	}
	f.outbox = testenv.Outbox{DB: pool, Table: f.spec.Name}
	var err error
	f.topo, err = testenv.DeclareTopology(channel(), "#", nil)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		if ch, err := broker.Channel(); err == nil {
			f.topo.Delete(ch)
			_ = ch.Close()
		}
	})
	f.traffic = testenv.StartTraffic(f.outbox, trafficRate)
	DeferCleanup(func() { _, _ = f.stopTraffic() })
	return f
}

// stopTraffic stops the traffic once, and returns the ids it wrote: the
// inserts whose commit the application saw succeed.
func (f *fleet) stopTraffic() ([]string, error) {
	f.stopped.Do(func() { f.written, f.err = f.traffic.Stop() })
	return f.written, f.err
}

// drainer is one drainer process of a fleet, with its probes' address.
type drainer struct {
	id, addr string
	session  *gexec.Session
}

// drain starts a drainer on the fleet's table through the database URL.
func (f *fleet) drain(id, url string, extra ...string) drainer {
	d := drainer{id: id + "-" + testenv.UniqueName("d"), addr: suite.FreeAddr()}
	// Published rows are kept: the ledger tells an event a failover lost
	// (its row gone) from one published (its row marked).
	args := []string{"drain", "--database-url", url, "--broker-url", testenv.BrokerURL(), "--table", f.spec.Name,
		"--exchange", f.topo.Exchange, "--drainer-id", d.id, "--metrics-addr", d.addr, "--retention-published", "24h"}
	if f.spec.Ordering.KeyColumn != "" {
		args = append(args, "--ordering-key-column", f.spec.Ordering.KeyColumn)
	}
	d.session = suite.Start(spillway, append(args, extra...)...)
	return d
}

// waitDraining waits until the drainer has published n rows: the fault
// then lands mid-drain.
func (d drainer) waitDraining(n int) {
	Eventually(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_published_rows_total") }, time.Minute, 50*time.Millisecond).
		Should(BeNumerically(">=", n))
}

// watch samples the drainer while a fault runs, with the outbox's status as
// the operator reads it through statusURL.
func (f *fleet) watch(d drainer, statusURL string) *faultwatch.Watch {
	reader := outbox.NewReader(2 * time.Second)
	DeferCleanup(reader.Close)
	status := func() string {
		h, err := reader.ReadHealth(context.Background(), statusURL, outbox.HealthRead{Spec: f.spec, MaxAttempts: 10, CountLimit: 1_000_000})
		if err != nil {
			return "read failed: " + err.Error()
		}
		return fmt.Sprintf("backlog %d", h.Status.Backlog)
	}
	return faultwatch.Start(faultwatch.Target{Addr: d.addr, Logs: d.session.Err.Contents, LogTopic: "atabase", Status: status,
		Gauges: []string{"spillway_drainer_listening"}})
}

// finish stops the traffic, waits for every row to be published, accounts
// for each against the messages the queue received, and records the
// fault's figures. An event is lost if the application's commit succeeded
// and the row is not in the table, or if the row is in the table and no
// message came for it.
func (f *fleet) finish(ctx context.Context, w *faultwatch.Watch, fault string) {
	written, err := f.stopTraffic()
	if err != nil {
		w.Timeline.Mark("the application's writes failed for a while: %v", err)
	}
	_, err = f.outbox.WaitDrained(ctx, 3*time.Minute)
	Expect(err).NotTo(HaveOccurred())
	w.Stop()
	db := suite.DB{Pool: pool}
	ids := db.IDs(ctx, f.spec.Name, "true")
	inTable := make(map[string]bool, len(ids))
	for _, id := range ids {
		inTable[id] = true
	}
	var vanished int
	for _, id := range written {
		if !inTable[id] {
			vanished++
		}
	}
	if vanished > 0 {
		w.Timeline.Mark("%d committed rows are not in the table after the fault", vanished)
	}
	Expect(db.Count(ctx, f.spec.Name, "attempts > 0")).To(BeZero(), "a database fault counted an attempt against a row")
	lost, duplicates, err := rabbitcluster.Account(channel(), f.topo.Queue, ids)
	Expect(err).NotTo(HaveOccurred())
	reports.Record(w.Of(fault, len(ids), len(lost)+vanished, duplicates))
}

// serverNow is the primary's clock.
func serverNow(ctx context.Context) time.Time {
	var now time.Time
	Expect(pool.QueryRow(ctx, "SELECT now()").Scan(&now)).To(Succeed())
	return now
}

// settledAcross counts the rows claimed before at and settled after it:
// claimed on the old primary, and fenced on that claim on the new one.
func (f *fleet) settledAcross(ctx context.Context, at time.Time) int {
	return suite.DB{Pool: pool}.Count(ctx, f.spec.Name, fmt.Sprintf("claimed_at < '%s' AND published_at >= '%s'",
		at.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano)))
}
