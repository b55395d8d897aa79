package brokerfaults

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/rabbitcluster"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

// tlsArgs make a drainer connect over TLS with the cluster's CA, presenting
// the client certificate whose CN is guest, and log in with it (EXTERNAL).
func tlsArgs(ca string) []string {
	return []string{"--broker-ca-file", ca, "--broker-cert-file", certs("client.crt"), "--broker-key-file", certs("client.key"),
		"--broker-sasl-external"}
}

var _ = Describe("A RabbitMQ cluster with a quorum queue", Serial, func() {
	It("loses no event when the node the drainer is connected to is killed with kill -9", func(ctx SpecContext) {
		f := newFleet(ctx)
		d := f.drain("kill", rabbitcluster.URLs())
		node := d.waitDraining(2000)
		w := watchDrainer(d)

		w.Fault("kill -9 of " + rabbitcluster.NodeName(node) + ", the drainer's node")
		cluster("kill-node", strconv.Itoa(node))
		movedFrom(w, d, node)
		f.finish(ctx, w, "1. the drainer's node killed (kill -9)")
		cluster("start-node", strconv.Itoa(node))
	})

	It("loses no event through a rolling restart of all three nodes", func(ctx SpecContext) {
		f := newFleet(ctx)
		d := f.drain("rolling", rabbitcluster.URLs())
		d.waitDraining(2000)
		w := watchDrainer(d)

		for n := 1; n <= 3; n++ {
			w.Fault("restart of " + rabbitcluster.NodeName(n))
			cluster("restart-node", strconv.Itoa(n))
			w.Timeline.Mark("%s back in the cluster", rabbitcluster.NodeName(n))
		}
		f.finish(ctx, w, "2. rolling restart of the three nodes")
	})

	It("loses no event when the node leading the quorum queue stops and leadership moves", func(ctx SpecContext) {
		f := newFleet(ctx)
		d := f.drain("leader", rabbitcluster.URLs())
		d.waitDraining(2000)
		w := watchDrainer(d)

		leader := rabbitcluster.Leader(1, f.topo.Queue)
		Expect(leader).NotTo(BeZero(), "the queue has a leader")
		w.Fault("stop_app on " + rabbitcluster.NodeName(leader) + ", the queue's leader")
		rabbitmqctl(leader, "stop_app")
		DeferCleanup(func() { rabbitmqctl(leader, "start_app") })
		Eventually(func() int {
			for n := 1; n <= 3; n++ {
				if n != leader {
					return rabbitcluster.Leader(n, f.topo.Queue)
				}
			}
			return 0
		}, time.Minute, 200*time.Millisecond).Should(And(Not(BeZero()), Not(Equal(leader))))
		w.Timeline.Mark("leadership moved")
		time.Sleep(10 * time.Second) // draining with a two-node majority
		rabbitmqctl(leader, "start_app")
		w.Timeline.Mark("%s started again", rabbitcluster.NodeName(leader))
		f.finish(ctx, w, "3. the quorum queue's leader stopped")
	})

	It("takes no claim while a memory alarm on another node blocks publishing, shows it, and goes on once it clears", func(ctx SpecContext) {
		f := newFleet(ctx)
		d := f.drain("alarm", rabbitcluster.URLs(), "--pipeline-depth", "16", "--lease-ttl", "6s")
		node := d.waitDraining(2000)
		alarmed := node%3 + 1 // another node: an alarm anywhere blocks publishers everywhere
		w := watchDrainer(d)

		w.Fault("memory alarm on " + rabbitcluster.NodeName(alarmed))
		watermark := rabbitmqctl(alarmed, "eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
		rabbitmqctl(alarmed, "set_vm_memory_high_watermark", "0.0000001")
		alarmAt := time.Now()
		DeferCleanup(func() { rabbitmqctl(alarmed, "set_vm_memory_high_watermark", watermark) })
		Eventually(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_broker_blocked") }, 30*time.Second, 50*time.Millisecond).
			Should(Equal(1.0))
		Eventually(func() string { return readyz(d.addr) }, 10*time.Second, 50*time.Millisecond).
			Should(HavePrefix("503 broker is blocking publishes"))
		Eventually(func() int64 { return blockedDrainers(ctx, f) }, 10*time.Second, 50*time.Millisecond).Should(Equal(int64(1)),
			"the drainer flags the block for the operator's Ready condition")
		w.Timeline.Mark("the drainer's broker_blocked flag counted in the outbox's database")
		Eventually(func() int { return len(claimed(ctx, f)) }, 30*time.Second).Should(BeZero(), "claims in flight released")
		before, err := testenv.Metric(d.addr, "spillway_drainer_claimed_rows_total")
		Expect(err).NotTo(HaveOccurred())
		Consistently(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_claimed_rows_total") }, 15*time.Second, 200*time.Millisecond).
			Should(Equal(before), "no claim while blocked")

		time.Sleep(time.Until(alarmAt.Add(20 * time.Second)))
		rabbitmqctl(alarmed, "set_vm_memory_high_watermark", watermark)
		w.Timeline.Mark("alarm cleared")
		Eventually(func() int64 { return blockedDrainers(ctx, f) }, 30*time.Second, 50*time.Millisecond).Should(BeZero())
		f.finish(ctx, w, "4. memory alarm on one node for 20 s")
	})

	It("moves to the majority when its node is cut off from the other two, and loses no event", func(ctx SpecContext) {
		f := newFleet(ctx)
		d := f.drain("partition", rabbitcluster.URLs())
		node := d.waitDraining(2000)
		w := watchDrainer(d)

		w.Fault("partition: " + rabbitcluster.NodeName(node) + ", the drainer's node, cut off from the other two")
		cluster("partition-node", strconv.Itoa(node))
		DeferCleanup(func() { cluster("heal-node", strconv.Itoa(node)) })
		movedFrom(w, d, node)
		time.Sleep(10 * time.Second)
		cluster("heal-node", strconv.Itoa(node))
		w.Timeline.Mark("partition healed")
		f.finish(ctx, w, "5. the drainer's node partitioned, then healed")
	})

	It("keeps draining over TLS with a client certificate while the brokers' certificate is rotated", func(ctx SpecContext) {
		f := newFleet(ctx)
		d := f.drain("rotate", env["SPILLWAY_RMQ_AMQPS_URLS"], tlsArgs(certs("ca.crt"))...)
		node := d.waitDraining(2000)
		w := watchDrainer(d)
		served := servedSerial(node)

		w.Fault("server certificate renewed on every node")
		renewServerCertificate()
		Expect(servedSerial(node)).NotTo(Equal(served), "the node serves the new certificate")
		w.Timeline.Mark("connections closed, so the drainer reconnects through the new certificate")
		for n := 1; n <= 3; n++ {
			rabbitmqctl(n, "close_all_connections", "certificate rotated")
		}
		Eventually(func() int { return rabbitcluster.ConnectedNode(d.id) }, time.Minute, 200*time.Millisecond).ShouldNot(BeZero(), "reconnected")
		f.finish(ctx, w, "6. broker certificate rotated (TLS, EXTERNAL)")
	})

	It("refuses a broker whose certificate another CA signed, marks nothing, and drains once given the right CA", func(ctx SpecContext) {
		f := newFleet(ctx)
		ca := filepath.Join(GinkgoT().TempDir(), "ca.crt")
		copyFile(certs("wrong-ca.crt"), ca)
		d := f.drain("wrong-ca", env["SPILLWAY_RMQ_AMQPS_URLS"], tlsArgs(ca)...)
		w := watchDrainer(d)
		w.Fault("the drainer's CA file holds the wrong CA")

		Eventually(func() string { return readyz(d.addr) }, 30*time.Second, 50*time.Millisecond).
			Should(And(HavePrefix("503 broker not connected"), ContainSubstring("certificate signed by unknown authority")))
		Consistently(func() (float64, error) { return testenv.Metric(d.addr, "spillway_drainer_claimed_rows_total") }, 5*time.Second, 200*time.Millisecond).
			Should(BeZero(), "nothing claimed without a broker")
		Expect(pending(ctx, f)).To(BeNumerically(">=", backlogRows), "nothing marked published")

		copyFile(certs("ca.crt"), ca)
		w.Timeline.Mark("the right CA written to the file")
		f.finish(ctx, w, "7. a certificate of the wrong CA refused")
	})
})

func copyFile(from, to string) {
	b, err := os.ReadFile(from)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(to, b, 0o600)).To(Succeed())
}

// claimed are the rows claimed and not yet published.
func claimed(ctx context.Context, f *fleet) []string {
	return suite.DB{Pool: pool}.IDs(ctx, f.outbox.Table, "claimed_by IS NOT NULL AND published_at IS NULL")
}

// pending is how many rows are not published.
func pending(ctx context.Context, f *fleet) int {
	n, err := f.outbox.Backlog(ctx)
	Expect(err).NotTo(HaveOccurred())
	return n
}

// servedSerial is the serial of the certificate node N's TLS listener
// serves to a new connection.
func servedSerial(node int) string {
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", rabbitcluster.AMQPSPort(node)),
		&tls.Config{InsecureSkipVerify: true}) // only to read what it serves
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// renewServerCertificate signs a new server certificate with the same CA,
// puts it in every node's certificate directory, and makes the nodes serve
// it to new connections.
func renewServerCertificate() {
	cmd := exec.Command("hack/tls-certs.sh", "--renew-server", env["SPILLWAY_RMQ_CERTS"])
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s", out)
	for _, dir := range strings.Split(env["SPILLWAY_RMQ_NODE_CERTS"], ",") {
		out, err := exec.Command("cp", "-p", certs("server.crt"), certs("server.key"), dir).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s", out)
	}
	cluster("reload-certs")
}

// blockedDrainers is how many drainers flag their broker's block, as the
// operator's read counts them.
func blockedDrainers(ctx context.Context, f *fleet) int64 {
	stmt := outbox.TableSpec{Name: f.outbox.Table}.BlockedDrainers()
	var n int64
	Expect(pool.QueryRow(ctx, stmt.SQL, stmt.Args...).Scan(&n)).To(Succeed())
	return n
}
