// Command benchoperator measures what one operator costs as the fleets it
// carries grow: make bench-operator. On the local control plane (an API
// server and etcd, no controller manager, so no drainer pod runs) it
// creates fleets over databases of the local Postgres, each with an outbox
// table of its own, runs `spillway manager` as a process of its own, and
// prints, for each size in -fleets, one run:
//   - the operator's RSS and CPU, in all and per fleet;
//   - its API requests per second, by verb (its client's own metric), and
//     by verb and resource (the API server's, while it is the one client);
//   - status writes and events per fleet-minute, idle and under a trickle
//     of events into a tenth of the outboxes;
//   - the probe's Postgres sessions per database, and its Postgres CPU per
//     read;
//   - status staleness (now − the fleet's last read, by the operator's
//     spillway_outbox_last_read_timestamp_seconds) at p50/p99/max;
//   - the time from creating the last fleet to its Deployment, and from a
//     spec change to its Deployment's;
//   - with -handover, the time for a second replica to lead once the
//     leader is killed;
//   - with -pods, the same for fleets whose drainers run, one pod each, on
//     the local cluster (kubeenv.StartCluster), through a PgBouncer of its
//     own in transaction mode, and that every row reached the queue.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/testenv"
)

var (
	fleetSizes     = flag.String("fleets", "100,1000", "the numbers of fleets to measure, in increasing order, comma-separated")
	databases      = flag.Int("databases", 10, "databases the fleets' outboxes are spread over")
	statusInterval = flag.Duration("status-interval", 15*time.Second, "each fleet's spec.statusInterval")
	window         = flag.Duration("window", time.Minute, "how long each of the idle and the trickle measurements lasts")
	changes        = flag.Int("changes", 20, "spec changes timed at each size")
	handover       = flag.Bool("handover", true, "measure the leader hand-over with two operator replicas at the largest size")
	podFleets      = flag.Int("pods", 100, "fleets measured last with one drainer pod each, on the local cluster of processes; 0 skips them")
	spillwayBin    = flag.String("spillway", "bin/spillway", "the spillway binary the operator runs as")
)

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("bench-operator: ")
	ctrllog.SetLogger(logr.Discard()) // envtest's own progress is not the report's
	var sizes []int
	for _, s := range strings.Split(*fleetSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
			fatalf("-fleets %q: want increasing positive numbers", *fleetSizes)
		}
		sizes = append(sizes, n)
	}
	ctx := context.Background()

	log.Printf("starting the control plane")
	env, cfg, err := kubeenv.StartControlPlane()
	if err != nil {
		fatal(err)
	}
	atExit(func() { _ = env.Stop() })
	defer runCleanups()
	dir, err := os.MkdirTemp("", "spillway-bench-operator")
	if err != nil {
		fatal(err)
	}
	atExit(func() { _ = os.RemoveAll(dir) })
	kubeconfig, err := kubeenv.WriteKubeconfig(env, kubeenv.Administrator, dir)
	if err != nil {
		fatal(err)
	}
	scheme, err := controllers.NewScheme()
	if err != nil {
		fatal(err)
	}
	k8s, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fatal(err)
	}
	admin, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		fatal(err)
	}
	atExit(admin.Close)

	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fatal(err)
	}
	b := &bench{k8s: k8s, api: clientset.Discovery().RESTClient(), admin: admin, kubeconfig: kubeconfig, dir: dir}
	b.prepareDatabases(ctx)
	atExit(func() { b.dropDatabases(ctx) })
	b.prepareNamespaces(ctx)
	op := b.startOperator(ctx, "operator", false)
	w := b.watch(ctx)
	atExit(w.stop)

	fmt.Printf("Spillway operator benchmark: fleets over %d databases, statusInterval %s, no drainer pods; windows of %s; %s\n\n",
		*databases, *statusInterval, *window, time.Now().UTC().Format(time.RFC3339))
	var results []sizeResult
	for _, n := range sizes {
		results = append(results, b.measure(ctx, op, w, n))
	}
	report(results)
	op.stop()
	if *handover {
		b.handover(ctx, w, sizes[len(sizes)-1])
	}
	if *podFleets > 0 {
		w.stop()
		if err := env.Stop(); err != nil {
			log.Printf("stopping the control plane: %v", err)
		}
		fmt.Println()
		describe(b.withPods(ctx, *podFleets))
	}
}

// cleanups undo what the run started, last first, when it ends early too:
// an operator or a control plane left running would go on reading the next
// run's databases.
var cleanups []func()

func atExit(f func()) { cleanups = append(cleanups, f) }

func runCleanups() {
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	cleanups = nil
}

func fatal(v ...any) {
	log.Print(v...)
	runCleanups()
	os.Exit(1)
}

func fatalf(format string, v ...any) { fatal(fmt.Sprintf(format, v...)) }

// bench holds what every measurement shares.
type bench struct {
	k8s client.WithWatch
	// api reads the API server's own metrics.
	api        rest.Interface
	admin      *pgxpool.Pool
	kubeconfig string
	dir        string
	// fleets is how many fleets exist so far; tables, how many outbox
	// tables.
	fleets, tables int
	// drainers is set where the fleets' drainers run.
	drainers *drainers
	// pools are the databases' own pools, for the trickle.
	pools []*pgxpool.Pool
}

// logFile is a file in the run's directory for a process's output.
func (b *bench) logFile(name string) *os.File {
	f, err := os.Create(filepath.Join(b.dir, name+".log"))
	if err != nil {
		fatal(err)
	}
	return f
}
