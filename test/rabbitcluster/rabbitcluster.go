// Package rabbitcluster drives the three-node RabbitMQ cluster that
// hack/rabbitmq-cluster.sh runs beside the system node, for the suites that
// inject broker faults: its nodes and ports, the node a drainer is
// connected to, and an account of a queue's messages by message_id.
package rabbitcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/test/testenv"
)

// Nodes is how many nodes the cluster has, numbered from 1.
const Nodes = 3

// Script runs hack/rabbitmq-cluster.sh with args.
func Script(args ...string) (string, error) {
	cmd := exec.Command("hack/rabbitmq-cluster.sh", args...)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("hack/rabbitmq-cluster.sh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Missing says why the cluster cannot run here, or is empty: a suite skips
// its specs then, unless CI=true, where a missing piece fails the run.
func Missing() string {
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		return "RabbitMQ is not installed: the broker cluster specs start three rabbitmq-server nodes (apt-get install rabbitmq-server)"
	}
	return ""
}

// InCI reports whether a missing piece must fail the run.
func InCI() bool { return os.Getenv("CI") == "true" }

// NodeName is node n's Erlang name.
func NodeName(n int) string { return fmt.Sprintf("spill%d@localhost", n) }

// AMQPPort and AMQPSPort are node n's listeners.
func AMQPPort(n int) int  { return 5681 + n }
func AMQPSPort(n int) int { return 5691 + n }

// Addrs are the nodes' AMQP addresses, which a local cluster's pods need
// forwarded.
func Addrs() []string {
	var addrs []string
	for n := 1; n <= Nodes; n++ {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", AMQPPort(n)))
	}
	return addrs
}

// TLSAddrs are the nodes' AMQPS addresses.
func TLSAddrs() []string {
	var addrs []string
	for n := 1; n <= Nodes; n++ {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", AMQPSPort(n)))
	}
	return addrs
}

// TLSURLs are the nodes' AMQPS URLs, comma-separated: their certificates
// name localhost and 127.0.0.1, signed by CAFile's CA.
func TLSURLs() string {
	var urls []string
	for _, a := range TLSAddrs() {
		urls = append(urls, "amqps://guest:guest@"+a+"/")
	}
	return strings.Join(urls, ",")
}

// CAFile is the CA that signs the nodes' certificates (hack/tls-certs.sh).
func CAFile() string {
	dir := os.Getenv("SPILLWAY_RMQ_CLUSTER_DIR")
	if dir == "" {
		dir = "/tmp/spillway-rabbitmq-cluster"
	}
	return filepath.Join(dir, "certs", "ca.crt")
}

// URLs are the nodes' AMQP URLs, comma-separated: a fleet's broker URL.
func URLs() string {
	var urls []string
	for _, a := range Addrs() {
		urls = append(urls, "amqp://guest:guest@"+a+"/")
	}
	return strings.Join(urls, ",")
}

// Ctl runs rabbitmqctl against node n.
func Ctl(n int, args ...string) (string, error) {
	out, err := exec.Command("rabbitmqctl", append([]string{"-n", NodeName(n), "--quiet"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl -n %s %v: %w: %s", NodeName(n), args, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// nodeOfPort is the node listening on port, or 0.
func nodeOfPort(port int) int {
	for n := 1; n <= Nodes; n++ {
		if port == AMQPPort(n) || port == AMQPSPort(n) {
			return n
		}
	}
	return 0
}

// connectionPort matches a connection's name, "client -> 127.0.0.1:5683".
var connectionPort = regexp.MustCompile(`-> [^ \t]*:(\d+)`)

// ConnectedNode is the node the drainer's connection is on, as the cluster
// lists its connections, or 0 while it has none.
func ConnectedNode(drainerID string) int {
	for n := 1; n <= Nodes; n++ {
		out, err := Ctl(n, "list_connections", "name", "client_properties")
		if err != nil {
			continue // a node down or paused: ask the next
		}
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, `"spillway-drainer/`+drainerID+`"`) {
				continue
			}
			if m := connectionPort.FindStringSubmatch(line); m != nil {
				port, _ := strconv.Atoi(m[1])
				return nodeOfPort(port)
			}
		}
		return 0
	}
	return 0
}

// Dial connects to the first node that answers.
func Dial() (*amqp.Connection, error) {
	var errs []error
	for _, a := range Addrs() {
		conn, err := amqp.Dial("amqp://guest:guest@" + a + "/")
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("no node of the cluster answers: %w", errors.Join(errs...))
}

// WithChannel runs fn on a channel of a fresh connection to the first node
// that answers.
func WithChannel(fn func(ch *amqp.Channel)) error {
	conn, err := Dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	fn(ch)
	return nil
}

// Account consumes queue until it has stayed empty for a second, and
// returns the ids that never arrived and counts the extra copies of those
// that did.
func Account(ch *amqp.Channel, queue string, ids []string) (lost []string, duplicates int, err error) {
	if err := ch.Qos(2000, 0, false); err != nil {
		return nil, 0, err
	}
	tag := testenv.UniqueName("ledger")
	deliveries, err := ch.Consume(queue, tag, true, true, false, false, nil)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = ch.Cancel(tag, false) }()
	seen := make(map[string]int, len(ids))
	quiet := time.NewTimer(10 * time.Second) // the first message may take a moment
	for done := false; !done; {
		select {
		case d := <-deliveries:
			seen[d.MessageId]++
			quiet.Reset(time.Second)
		case <-quiet.C:
			done = true
		}
	}
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			duplicates += n - 1
		}
	}
	return lost, duplicates, nil
}

// Leader is the node leading the quorum queue, as node n lists it, or 0.
func Leader(n int, queue string) int {
	out, err := Ctl(n, "list_queues", "name", "leader")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(out, "\n") {
		if fields := strings.Fields(line); len(fields) == 2 && fields[0] == queue {
			for m := 1; m <= Nodes; m++ {
				if fields[1] == NodeName(m) {
					return m
				}
			}
		}
	}
	return 0
}
