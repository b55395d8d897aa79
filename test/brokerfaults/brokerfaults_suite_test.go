// Package brokerfaults runs drainer processes against the broker users run
// in production: a three-node RabbitMQ cluster (hack/rabbitmq-cluster.sh),
// publishing to a quorum queue, over plain AMQP and over TLS. Each spec
// injects one fault for real under load (a node killed, a rolling restart,
// the queue's leader stopped, a memory alarm, a partition, a rotated
// certificate, a certificate of the wrong CA) and accounts for every row by
// its id against the messages the queue received.
package brokerfaults

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/faultwatch"
	"github.com/spillway-io/spillway/test/rabbitcluster"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestBrokerFaults(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Broker Cluster Faults Suite", Label(tier.Faults))
}

var (
	spillway string
	pool     *pgxpool.Pool
	// env is what hack/rabbitmq-cluster.sh env prints.
	env map[string]string
	// reports are the faults' figures, printed together after the suite.
	reports faultwatch.Reports
)

var _ = BeforeSuite(func(ctx SpecContext) {
	if missing := rabbitcluster.Missing(); missing != "" {
		if rabbitcluster.InCI() {
			Fail(missing)
		}
		Skip(missing)
	}
	spillway = suite.BuildSpillway()
	var err error
	pool, err = pgxpool.New(ctx, testenv.DatabaseURL())
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(pool.Close)
	env = map[string]string{}
	for _, line := range strings.Split(cluster("env"), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	cluster("start")
	DeferCleanup(func() { cluster("stop") })
}, NodeTimeout(5*time.Minute))

var _ = ReportAfterSuite("the faults' figures", func(Report) { reports.Print() })

// cluster runs hack/rabbitmq-cluster.sh, failing the spec if it fails.
func cluster(args ...string) string {
	out, err := rabbitcluster.Script(args...)
	Expect(err).NotTo(HaveOccurred())
	return out
}

// rabbitmqctl runs rabbitmqctl against node N (1–3).
func rabbitmqctl(node int, args ...string) string {
	out, err := rabbitcluster.Ctl(node, args...)
	Expect(err).NotTo(HaveOccurred())
	return out
}

// certs is the cluster's certificate directory (hack/tls-certs.sh).
func certs(name string) string { return filepath.Join(env["SPILLWAY_RMQ_CERTS"], name) }

// fleet is one spec's outbox, with a quorum queue on the cluster bound to
// its exchange, and traffic written into it while the spec runs.
type fleet struct {
	outbox  testenv.Outbox
	topo    testenv.Topology
	traffic *testenv.Traffic
	stopped sync.Once
	written []string
	err     error
}

// stopTraffic stops the traffic once, and returns the ids it wrote.
func (f *fleet) stopTraffic() ([]string, error) {
	f.stopped.Do(func() { f.written, f.err = f.traffic.Stop() })
	return f.written, f.err
}

// backlogRows are written before the drainers start, and trafficRate a
// second after that: enough that every fault lands mid-drain and keeps
// new rows coming through it.
const (
	backlogRows = 20_000
	trafficRate = 400
)

func newFleet(ctx context.Context) *fleet {
	// Every node up and clustered, whatever the last spec left.
	cluster("start")
	f := &fleet{outbox: testenv.Outbox{DB: pool, Table: suite.Migrate(spillway, pool, "cluster_outbox")}}
	onCluster(func(ch *amqp.Channel) {
		var err error
		f.topo, err = testenv.DeclareTopology(ch, "#", amqp.Table{"x-queue-type": "quorum"})
		Expect(err).NotTo(HaveOccurred())
	})
	DeferCleanup(func() { onCluster(f.topo.Delete) })
	suite.DB{Pool: pool}.Seed(ctx, f.outbox.Table, backlogRows)
	f.traffic = testenv.StartTraffic(f.outbox, trafficRate)
	DeferCleanup(func() { _, _ = f.stopTraffic() })
	return f
}

// drainer is one drainer process of a fleet, with its probes' address.
type drainer struct {
	id, addr string
	session  *gexec.Session
}

// drain starts a drainer publishing to the cluster through brokerURLs.
func (f *fleet) drain(id, brokerURLs string, extra ...string) drainer {
	d := drainer{id: id + "-" + testenv.UniqueName("d"), addr: suite.FreeAddr()}
	// Published rows are kept: the ledger reads every event's id, and its
	// attempts, from the table once the drain is over.
	args := []string{"drain", "--database-url", testenv.DatabaseURL(), "--broker-url", brokerURLs,
		"--table", f.outbox.Table, "--exchange", f.topo.Exchange, "--drainer-id", d.id, "--metrics-addr", d.addr,
		"--retention-published", "24h"}
	d.session = suite.Start(spillway, append(args, extra...)...)
	return d
}

// waitDraining waits until the drainer has published n rows and is
// connected: the fault then lands mid-drain, on a known node.
func (d drainer) waitDraining(n int) int {
	Eventually(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_published_rows_total") }, time.Minute, 50*time.Millisecond).
		Should(BeNumerically(">=", n))
	var node int
	Eventually(func() int { node = rabbitcluster.ConnectedNode(d.id); return node }, 30*time.Second, 200*time.Millisecond).ShouldNot(BeZero())
	return node
}

// finish stops the traffic, waits for every row to be published, accounts
// for each against the messages the queue received, and records the
// fault's figures.
func (f *fleet) finish(ctx context.Context, w *faultwatch.Watch, fault string) {
	written, err := f.stopTraffic()
	Expect(err).NotTo(HaveOccurred())
	_, err = f.outbox.WaitDrained(ctx, 3*time.Minute)
	Expect(err).NotTo(HaveOccurred())
	w.Stop()
	ids := suite.DB{Pool: pool}.IDs(ctx, f.outbox.Table, "true")
	Expect(len(ids)).To(Equal(backlogRows + len(written)))
	Expect(suite.DB{Pool: pool}.Count(ctx, f.outbox.Table, "attempts > 0")).To(BeZero(), "a broker fault counted an attempt against a row")
	var lost []string
	var duplicates int
	onCluster(func(ch *amqp.Channel) {
		lost, duplicates, err = rabbitcluster.Account(ch, f.topo.Queue, ids)
		Expect(err).NotTo(HaveOccurred())
	})
	reports.Record(w.Of(fault, len(ids), len(lost), duplicates))
}

// onCluster runs fn on a channel of a fresh connection to the first node of
// the broker cluster that answers.
func onCluster(fn func(ch *amqp.Channel)) {
	Expect(rabbitcluster.WithChannel(fn)).To(Succeed())
}
