package controllers_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Controllers Suite", Label(tier.Envtest, tier.DB))
}

var (
	// k8s reads and writes straight to the API server, as a user would.
	k8s client.WithWatch
	// reconciler is the one the manager runs.
	reconciler *controllers.OutboxDrainerReconciler
	// replays is the manager's OutboxReplay reconciler.
	replays *controllers.OutboxReplayReconciler
	// outboxMetrics are the Prober's, where the latest read's time shows.
	outboxMetrics *probe.Metrics
	db            *pgxpool.Pool
	kubeconfig    string
)

var _ = BeforeSuite(func(ctx SpecContext) {
	ctrl.SetLogger(GinkgoLogr)
	// The controller reacts within a reconcile; the slow path, a read of
	// the outbox, comes every statusInterval.
	SetDefaultEventuallyTimeout(10 * time.Second)
	env, cfg, err := kubeenv.StartControlPlane()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)

	scheme, err := controllers.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   controllers.CacheOptions(nil),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// spillway manager's own test registers the controller's name again.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	outboxMetrics = probe.NewMetrics(prometheus.NewRegistry())
	reconciler = &controllers.OutboxDrainerReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    scheme,
		Recorder:  mgr.GetEventRecorder("spillway-operator"),
		Image:     "ghcr.io/spillway-io/spillway:test",
		// A short timeout, so a database that never answers shows as such
		// within a spec's patience.
		Prober: probe.New(mgr.GetAPIReader(), mgr.GetEventRecorder("spillway-operator"), outboxMetrics, probe.Options{Timeout: probeTimeout}),
	}
	replays = &controllers.OutboxReplayReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("spillway-operator"),
		Timeout:   probeTimeout,
		Prober:    reconciler.Prober,
	}
	reconciler.Prober.CacheSecrets(mgr.GetClient())
	mgrCtx, stop := context.WithCancel(context.Background())
	Expect(reconciler.SetupWithManager(mgrCtx, mgr)).To(Succeed())
	Expect(replays.SetupWithManager(mgrCtx, mgr)).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	DeferCleanup(func() {
		stop()
		Eventually(done, 30*time.Second).Should(Receive(BeNil()))
	})

	db, err = pgxpool.New(ctx, testenv.DatabaseURL())
	Expect(err).NotTo(HaveOccurred())
	Expect(db.Ping(ctx)).To(Succeed(), "postgres at %s (make test starts it)", testenv.DatabaseURL())
	DeferCleanup(db.Close)

	dir, err := os.MkdirTemp("", "spillway-kubeconfig")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	kubeconfig, err = kubeenv.WriteKubeconfig(env, kubeenv.Administrator, dir)
	Expect(err).NotTo(HaveOccurred())
})

// lastRead is when the Prober last read od's outbox successfully, by its
// metric: a read that changes nothing writes no status.
func lastRead(od *v1alpha1.OutboxDrainer) time.Time {
	at := testutil.ToFloat64(outboxMetrics.LastRead.WithLabelValues(od.Namespace, od.Name))
	return time.Unix(0, int64(at*1e9))
}

// kubectl runs kubectl against the test API server and returns its output.
func kubectl(args ...string) string {
	out, err := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), string(out))
	return string(out)
}

// namespace creates a namespace of the test's own.
func namespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testenv.UniqueObjectName("od")}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// secret creates a Secret with one key, url.
func secret(ctx context.Context, ns, name, url string) {
	Expect(k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		StringData: map[string]string{"url": url},
	})).To(Succeed())
}

// connectionSecrets creates the Secrets outboxDrainer references.
func connectionSecrets(ctx context.Context, ns string) {
	secret(ctx, ns, "orders-db", testenv.DatabaseURL())
	secret(ctx, ns, "rabbit", testenv.BrokerURL())
}

// outboxTable migrates a canonical outbox of the test's own.
func outboxTable(ctx context.Context) string {
	name := "public." + testenv.UniqueName("outbox")
	_, err := outbox.Migrate(ctx, db, outbox.TableSpec{Name: name})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func(ctx SpecContext) {
		_, err := db.Exec(ctx, "DROP TABLE IF EXISTS "+name)
		Expect(err).NotTo(HaveOccurred())
	})
	return name
}

// runSQL runs fixture SQL: the test playing the application and the drainers.
func runSQL(ctx context.Context, sql string, args ...any) {
	_, err := db.Exec(ctx, sql, args...)
	Expect(err).NotTo(HaveOccurred(), sql)
}

// statusInterval is short, so a test sees the status follow the outbox.
const statusInterval = 2 * time.Second

// probeTimeout bounds the suite's reads of an outbox.
const probeTimeout = 3 * time.Second

// outboxDrainer is a fleet over table with the Secrets connectionSecrets
// creates, reading its outbox every statusInterval.
func outboxDrainer(ns, table string) *v1alpha1.OutboxDrainer {
	return &v1alpha1.OutboxDrainer{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: ns},
		Spec: v1alpha1.OutboxDrainerSpec{
			Replicas:       ptr.To(int32(2)),
			Database:       v1alpha1.DatabaseSpec{URLSecretRef: v1alpha1.SecretKeyRef{Name: "orders-db", Key: "url"}, Table: table},
			Broker:         v1alpha1.BrokerSpec{URLSecretRef: v1alpha1.SecretKeyRef{Name: "rabbit", Key: "url"}, Exchange: "orders"},
			MaxAttempts:    3,
			StatusInterval: metav1.Duration{Duration: statusInterval},
		},
	}
}

// get reads an object's current state from the API server.
func get[T client.Object](ctx context.Context, obj T) T {
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
	return obj
}

// writeCountingReconciler is a second reconciler on the same API server
// that reads without a cache and records every write it makes. The API
// server drops a write that changes nothing, so resourceVersions alone
// cannot show a needless one.
func writeCountingReconciler() (*controllers.OutboxDrainerReconciler, *[]string) {
	var writes []string
	record := func(verb string, obj client.Object) {
		writes = append(writes, fmt.Sprintf("%s %T %s", verb, obj, obj.GetName()))
	}
	c := interceptor.NewClient(k8s, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			record("create", obj)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			record("update", obj)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			record("patch", obj)
			return c.Patch(ctx, obj, patch, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			u, _ := obj.(interface{ GetName() string })
			name := ""
			if u != nil {
				name = u.GetName()
			}
			writes = append(writes, "apply "+name)
			return c.Apply(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			record("delete", obj)
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			record("update "+sub, obj)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			record("patch "+sub, obj)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	// The suite's Prober: a reconcile reports what it last read.
	return &controllers.OutboxDrainerReconciler{
		Client: c, APIReader: c, Scheme: reconciler.Scheme, Recorder: reconciler.Recorder, Image: reconciler.Image,
		Prober: reconciler.Prober,
	}, &writes
}

// deploymentOf waits for the fleet's Deployment and returns it.
func deploymentOf(ctx context.Context, od *v1alpha1.OutboxDrainer) *appsv1.Deployment {
	d := &appsv1.Deployment{}
	Eventually(func() error {
		return k8s.Get(ctx, client.ObjectKeyFromObject(od), d)
	}).Should(Succeed())
	return d
}

// condition returns one of the fleet's current conditions.
func condition(ctx context.Context, od *v1alpha1.OutboxDrainer, t v1alpha1.ConditionType) func() *metav1.Condition {
	return func() *metav1.Condition {
		for _, c := range get(ctx, od.DeepCopy()).Status.Conditions {
			if c.Type == string(t) {
				return &c
			}
		}
		return nil
	}
}

// events returns the events recorded about the fleet, as "Type Reason: note".
func events(ctx context.Context, od *v1alpha1.OutboxDrainer) func() []string {
	return func() []string {
		var list eventsv1.EventList
		Expect(k8s.List(ctx, &list, client.InNamespace(od.Namespace))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Name == od.Name && e.Regarding.Kind == "OutboxDrainer" {
				out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Note))
			}
		}
		return out
	}
}
