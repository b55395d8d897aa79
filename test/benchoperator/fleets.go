package main

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/samples"
	"github.com/spillway-io/spillway/test/testenv"
)

// The fleets, their databases and namespaces, and the operator's process.

// database is the name of the i-th database.
func database(i int) string { return fmt.Sprintf("spillway_bench_op_%d", i) }

// databaseURL is the URL of the i-th database on the test server.
func databaseURL(i int) string {
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		fatal(err)
	}
	u.Path = "/" + database(i)
	return u.String()
}

// namespace is the i-th database's fleets' namespace.
func namespace(i int) string { return fmt.Sprintf("bench-%d", i) }

func (b *bench) prepareDatabases(ctx context.Context) {
	b.dropDatabases(ctx)
	for i := range *databases {
		if _, err := b.admin.Exec(ctx, "CREATE DATABASE "+database(i)); err != nil {
			fatal(err)
		}
		pool, err := pgxpool.New(ctx, databaseURL(i))
		if err != nil {
			fatal(err)
		}
		b.pools = append(b.pools, pool)
	}
}

func (b *bench) dropDatabases(ctx context.Context) {
	for _, p := range b.pools {
		p.Close()
	}
	b.pools = nil
	for i := range *databases {
		if _, err := b.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+database(i)+" WITH (FORCE)"); err != nil {
			log.Printf("dropping %s: %v", database(i), err)
		}
	}
}

// prepareNamespaces makes each database's namespace, with the Secret of its
// URL.
func (b *bench) prepareNamespaces(ctx context.Context) {
	for i := range *databases {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace(i)}}
		if err := b.k8s.Create(ctx, ns); err != nil {
			fatal(err)
		}
		url := databaseURL(i)
		if b.drainers != nil {
			url = b.drainers.bouncedURL(i)
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: namespace(i)},
			StringData: map[string]string{"url": url, "amqp-url": testenv.BrokerURL()}}
		if err := b.k8s.Create(ctx, secret); err != nil {
			fatal(err)
		}
	}
}

// fleetName is the i-th fleet's name; its table has the same.
func fleetName(i int) string { return fmt.Sprintf("fleet_%04d", i) }

// fleetKey is where the i-th fleet lives: its database, namespace and name.
func fleetKey(i int) (db int, ns, name string) {
	return i % *databases, namespace(i % *databases), "fleet-" + fmt.Sprintf("%04d", i)
}

// addTables migrates the outbox tables of fleets up to to-1 that are not
// there yet, four at a time, each with a row published.
func (b *bench) addTables(ctx context.Context, to int) {
	from := b.tables
	b.tables = max(b.tables, to)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				db, _, _ := fleetKey(i)
				spec := outbox.TableSpec{Name: "public." + fleetName(i)}
				if _, err := outbox.Migrate(ctx, b.pools[db], spec); err != nil {
					fatal(err)
				}
				// Published, as a drained outbox is: a pending row's age would
				// change the status at every read.
				if _, err := b.pools[db].Exec(ctx, "INSERT INTO "+spec.Name+" (event_type, payload, published_at) VALUES ('"+unsent+"', '{}', now())"); err != nil {
					fatal(err)
				}
			}
		})
	}
	for i := from; i < to; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

// createFleet creates the i-th fleet, at the drainer's defaults over its
// own table, and returns when the API server took it.
func (b *bench) createFleet(ctx context.Context, i int) {
	_, ns, name := fleetKey(i)
	od := samples.OutboxDrainer()
	od.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: ns}
	od.Spec.Database.URLSecretRef.Name = "db"
	od.Spec.Database.Table = "public." + fleetName(i)
	od.Spec.Broker.URLSecretRef = v1alpha1.SecretKeyRef{Name: "db", Key: "amqp-url"}
	od.Spec.StatusInterval = metav1.Duration{Duration: *statusInterval}
	if b.drainers != nil {
		od.Spec.Broker.Exchange = b.drainers.topology.Exchange
		od.Spec.Database.Pooler = &v1alpha1.Pooler{Mode: v1alpha1.PoolModeTransaction}
		// A hundred drainers at the default 100m would ask for more than
		// the node's 8 cores; a drainer of a trickle needs far less.
		od.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("20m"), corev1.ResourceMemory: resource.MustParse("32Mi")}}
	}
	if err := b.k8s.Create(ctx, od); err != nil && !apierrors.IsAlreadyExists(err) {
		fatal(err)
	}
}

// trickle inserts one event a second into every tenth fleet's outbox until
// ctx ends, and returns how many it inserted.
func (b *bench) trickle(ctx context.Context, fleets int) (inserted int) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return inserted
		case <-tick.C:
		}
		batches := make([]*pgx.Batch, len(b.pools))
		for i := range batches {
			batches[i] = &pgx.Batch{}
		}
		for i := 0; i < fleets; i += 10 {
			db, _, _ := fleetKey(i)
			batches[db].Queue("INSERT INTO public." + fleetName(i) + " (event_type, payload) VALUES ('bench.event', '{}')")
		}
		for db, batch := range batches {
			if batch.Len() == 0 {
				continue
			}
			// Counted once committed: the window's end may cut a batch off.
			if err := b.pools[db].SendBatch(ctx, batch).Close(); err == nil {
				inserted += batch.Len()
			} else if ctx.Err() == nil {
				fatal(err)
			}
		}
	}
}

// unsent is the event type of the rows the bench marks published itself,
// which no drainer sends.
const unsent = "bench.unsent"

// publishTrickle marks the trickle's rows published, as drainers would have:
// without, the outboxes it wrote to would keep a backlog whose age changes
// their status at every read of the next idle window.
func (b *bench) publishTrickle(ctx context.Context, fleets int) {
	for i := 0; i < fleets; i += 10 {
		db, _, _ := fleetKey(i)
		if _, err := b.pools[db].Exec(ctx, "UPDATE public."+fleetName(i)+" SET published_at = now(), event_type = '"+unsent+"' WHERE published_at IS NULL"); err != nil {
			fatal(err)
		}
	}
}

// operator is a `spillway manager` process.
type operator struct {
	name        string
	cmd         *exec.Cmd
	metricsAddr string
	exited      chan struct{}
}

// startOperator runs spillway manager against the control plane, with
// leader election when elect is set.
func (b *bench) startOperator(ctx context.Context, name string, elect bool) *operator {
	op := &operator{name: name, metricsAddr: unusedAddr(), exited: make(chan struct{})}
	image := "registry.local/spillway:bench" // no drainer pod runs it
	if b.drainers != nil {
		image = b.drainers.image
	}
	op.cmd = exec.CommandContext(ctx, *spillwayBin, "manager", "--drainer-image="+image,
		"--metrics-addr="+op.metricsAddr, "--health-probe-addr="+unusedAddr(),
		fmt.Sprintf("--leader-elect=%t", elect), "--leader-election-namespace="+namespace(0), "--log-level=warn")
	op.cmd.Env = append(os.Environ(), "KUBECONFIG="+b.kubeconfig)
	// It dies with the benchmark, however that ends.
	op.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out := b.logFile(name)
	op.cmd.Stdout, op.cmd.Stderr = out, out
	if err := op.cmd.Start(); err != nil {
		fatalf("start %s: %v (make bench-operator builds it)", *spillwayBin, err)
	}
	go func() {
		_ = op.cmd.Wait()
		_ = out.Close()
		close(op.exited)
	}()
	atExit(op.stop)
	return op
}

func unusedAddr() string {
	addr, err := testenv.UnusedAddr()
	if err != nil {
		fatal(err)
	}
	return addr
}

// alive says the process has not exited.
func (op *operator) alive() bool {
	select {
	case <-op.exited:
		return false
	default:
		return true
	}
}

func (op *operator) pid() int { return op.cmd.Process.Pid }

// stop ends the process as Kubernetes would, SIGTERM first.
func (op *operator) stop() {
	if !op.alive() {
		return
	}
	_ = op.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-op.exited:
	case <-time.After(30 * time.Second):
		_ = op.cmd.Process.Kill()
		<-op.exited
	}
}

// kill ends the process at once, as a node's failure would.
func (op *operator) kill() {
	_ = op.cmd.Process.Kill()
	<-op.exited
}
