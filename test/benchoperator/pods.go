package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/testenv"
)

// The fleets whose drainers run: the local cluster of processes, with one
// drainer pod per fleet.

// drainers is what fleets with running drainers need beyond the others.
type drainers struct {
	// image is the drainer image, from the cluster's registry.
	image string
	// bouncer is the PgBouncer's address: a hundred drainers' sessions
	// would pass the local Postgres's max_connections, as they would many
	// a production one's, so they go through a pooler in transaction mode.
	bouncer string
	// topology is where they publish.
	topology testenv.Topology
	channel  *amqp.Channel
}

// withPods measures n fleets on the local cluster, each with one drainer
// pod draining its outbox to the local RabbitMQ, as the other sizes are
// measured, and checks that every row reached the queue.
func (b *bench) withPods(ctx context.Context, n int) sizeResult {
	layout, err := kubeenv.ImageLayout()
	if err != nil {
		fatal(err)
	}
	d := &drainers{bouncer: b.startBouncer()}
	conn, err := amqp.Dial(testenv.BrokerURL())
	if err != nil {
		fatal(err)
	}
	atExit(func() { _ = conn.Close() })
	if d.channel, err = conn.Channel(); err != nil {
		fatal(err)
	}
	if d.topology, err = testenv.DeclareTopology(d.channel, "#", nil); err != nil {
		fatal(err)
	}
	atExit(func() { d.topology.Delete(d.channel) })

	log.Printf("starting the local cluster, whose node runs pods as processes")
	cluster, err := kubeenv.StartCluster(ctx, kubeenv.ClusterOptions{ImageLayout: layout, Progress: os.Stderr, Forward: []string{d.bouncer}, CRDs: true})
	if cluster != nil {
		atExit(func() {
			if err := cluster.Stop(); err != nil {
				log.Printf("stopping the cluster: %v", err)
			}
			_ = cluster.RemoveDir()
		})
	}
	if err != nil {
		fatal(err)
	}
	d.image = cluster.Images.Spillway
	scheme, err := controllers.NewScheme()
	if err != nil {
		fatal(err)
	}
	k8s, err := client.NewWithWatch(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		fatal(err)
	}
	pb := &bench{k8s: k8s, admin: b.admin, kubeconfig: cluster.Kubeconfig, dir: b.dir, pools: b.pools, tables: b.tables, drainers: d}
	pb.prepareNamespaces(ctx)
	op := pb.startOperator(ctx, "operator-pods", false)
	w := pb.watch(ctx)
	atExit(w.stop)
	r := pb.measure(ctx, op, w, n)
	r.rows, r.queued, r.pending = pb.drained(ctx, n)
	return r
}

// startBouncer runs a PgBouncer of the run's own, in transaction mode, in
// front of every database of the local Postgres, and returns its address.
func (b *bench) startBouncer() string {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer"
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		fatal(err)
	}
	uid, _ := strconv.ParseUint(pg.Uid, 10, 32)
	gid, _ := strconv.ParseUint(pg.Gid, 10, 32)
	addr := unusedAddr()
	host, port := splitAddr(addr)
	server, serverPort := splitAddr(databaseAddr())
	dir := filepath.Join(b.dir, "pgbouncer")
	// PgBouncer refuses to run as root, and its user reads this directory.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatal(err)
	}
	_ = os.Chmod(b.dir, 0o755)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = %s
listen_port = %s
unix_socket_dir =
auth_type = trust
auth_file = %s/userlist.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 4
ignore_startup_parameters = extra_float_digits
`, server, serverPort, host, port, dir)
	for name, text := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			fatal(err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, Pdeathsig: syscall.SIGKILL}
	out := b.logFile("pgbouncer")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		fatalf("start pgbouncer (make services installs it): %v", err)
	}
	atExit(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	if !listening(addr, 10*time.Second) {
		fatalf("pgbouncer does not listen on %s; see %s", addr, out.Name())
	}
	log.Printf("pgbouncer %s on %s, transaction mode, in front of %s:%s", bin, addr, server, serverPort)
	return addr
}

// drained waits until the first n fleets' outboxes have nothing pending and
// the queue holds a message for every row written pending, and returns
// those rows, the messages queued and the rows still pending.
func (b *bench) drained(ctx context.Context, n int) (rows, queued, pending int) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		rows, pending = 0, 0
		for i := range n {
			db, _, _ := fleetKey(i)
			var all, left int
			if err := b.pools[db].QueryRow(ctx, "SELECT count(*) FILTER (WHERE event_type <> '"+unsent+"'), count(*) FILTER (WHERE published_at IS NULL) FROM public."+fleetName(i)).
				Scan(&all, &left); err != nil {
				fatal(err)
			}
			rows, pending = rows+all, pending+left
		}
		var err error
		if queued, err = testenv.QueueDepth(b.drainers.channel, b.drainers.topology.Queue); err != nil {
			fatal(err)
		}
		if pending == 0 && queued >= rows || time.Now().After(deadline) {
			return rows, queued, pending
		}
		time.Sleep(time.Second)
	}
}

// listening waits until addr accepts connections.
func listening(addr string, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return true
		}
	}
	return false
}

// splitAddr is host and port of an address the bench made.
func splitAddr(addr string) (host, port string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fatal(err)
	}
	return host, port
}

// databaseAddr is the test Postgres's host:port.
func databaseAddr() string {
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		fatal(err)
	}
	return u.Host
}

// bouncedURL is the i-th database's URL through the PgBouncer.
func (d *drainers) bouncedURL(i int) string {
	u, err := url.Parse(databaseURL(i))
	if err != nil {
		fatal(err)
	}
	u.Host = d.bouncer
	return u.String()
}
