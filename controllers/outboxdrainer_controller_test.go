package controllers_test

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/test/testenv"
)

var _ = Describe("OutboxDrainer controller", func() {
	var (
		ns    string
		table string
		od    *v1alpha1.OutboxDrainer
	)
	BeforeEach(func(ctx SpecContext) {
		ns = namespace(ctx)
		table = outboxTable(ctx)
		od = outboxDrainer(ns, table)
	})

	Describe("the fleet's objects", func() {
		BeforeEach(func(ctx SpecContext) {
			connectionSecrets(ctx, ns)
			// Not due for another read of the outbox while the test runs, so
			// a reconcile has nothing new to write.
			od.Spec.StatusInterval = metav1.Duration{Duration: time.Hour}
			Expect(k8s.Create(ctx, od)).To(Succeed())
		})

		It("creates a Deployment running spillway drain, and its siblings, all owned by the OutboxDrainer", func(ctx SpecContext) {
			d := deploymentOf(ctx, od)
			owner := metav1.OwnerReference{APIVersion: "spillway.io/v1alpha1", Kind: "OutboxDrainer", Name: od.Name, UID: od.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
			Expect(d.OwnerReferences).To(ConsistOf(owner))
			Expect(d.Spec.Replicas).To(Equal(ptr.To(int32(2))))
			Expect(d.ManagedFields).To(ContainElement(And(HaveField("Manager", "spillway-operator"), HaveField("Operation", metav1.ManagedFieldsOperationApply))),
				"applied server-side, under the operator's field manager")

			pod := d.Spec.Template.Spec
			Expect(pod.Containers).To(HaveLen(1))
			c := pod.Containers[0]
			Expect(c.Image).To(Equal("ghcr.io/spillway-io/spillway:test"))
			Expect(c.Args[0]).To(Equal("drain"), "the subcommand comes first")
			Expect(c.Args).To(ContainElements(
				"--table="+table,
				"--database-url-file=/var/run/secrets/spillway/database/url",
				"--broker-url-file=/var/run/secrets/spillway/broker/url",
				"--exchange=orders",
				"--batch-size=500",
				"--pipeline-depth=256",
				"--lease-ttl=1m20s",
				"--max-attempts=3",
				"--shutdown-timeout=30s",
				"--metrics-addr=:8080",
			), "the schema's defaults reach the flags")
			Expect(c.Env).To(ConsistOf(corev1.EnvVar{Name: "POD_NAME",
				ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}))
			Expect(pod.Volumes).To(ContainElement(And(
				HaveField("Name", "database-url"),
				HaveField("Secret.SecretName", "orders-db"),
				HaveField("Secret.Items", ConsistOf(corev1.KeyToPath{Key: "url", Path: "url"})),
			)))
			Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "database-url", MountPath: "/var/run/secrets/spillway/database", ReadOnly: true}))
			Expect(c.LivenessProbe.HTTPGet).To(And(HaveField("Path", "/healthz"), HaveField("Port", intstr.FromString("metrics"))))
			Expect(c.ReadinessProbe.HTTPGet).To(And(HaveField("Path", "/readyz"), HaveField("Port", intstr.FromString("metrics"))))
			Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
			Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
			Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
			Expect(c.SecurityContext.AllowPrivilegeEscalation).To(Equal(ptr.To(false)))
			Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
			Expect(*pod.TerminationGracePeriodSeconds).To(BeNumerically(">", 30))
			Expect(pod.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
			Expect(pod.ServiceAccountName).To(Equal(od.Name))

			sa := get(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: od.Name, Namespace: ns}})
			Expect(sa.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
			Expect(sa.OwnerReferences).To(ConsistOf(owner))
			svc := get(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: od.Name + "-metrics", Namespace: ns}})
			Expect(svc.Spec.Ports).To(ConsistOf(HaveField("Port", int32(8080))))
			Expect(svc.Spec.Selector).To(Equal(d.Spec.Selector.MatchLabels))
			Expect(svc.OwnerReferences).To(ConsistOf(owner))
			pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: od.Name, Namespace: ns}}
			Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(pdb), pdb) }).Should(Succeed(), "applied after the Deployment")
			Expect(pdb.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))))
			Expect(pdb.OwnerReferences).To(ConsistOf(owner))

			Eventually(events(ctx, od)).Should(ContainElements(
				"Normal SuccessfulCreate: Created Deployment "+od.Name,
				"Normal SuccessfulCreate: Created ServiceAccount "+od.Name,
				"Normal SuccessfulCreate: Created Service "+od.Name+"-metrics",
				"Normal SuccessfulCreate: Created PodDisruptionBudget "+od.Name,
			))
		})

		It("leaves every object and the status as they were when nothing changed, and updates the Deployment when the spec does", func(ctx SpecContext) {
			Eventually(func() int64 { return get(ctx, od.DeepCopy()).Status.ObservedGeneration }).Should(Equal(od.Generation))
			Eventually(func() *metav1.Time { return get(ctx, od.DeepCopy()).Status.LastProbeTime }).ShouldNot(BeNil())
			od = get(ctx, od)
			d := deploymentOf(ctx, od)
			sa := get(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: od.Name, Namespace: ns}})
			svc := get(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: od.Name + "-metrics", Namespace: ns}})
			counting, writes := writeCountingReconciler()
			_, err := counting.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(od)})
			Expect(err).NotTo(HaveOccurred())
			// Server-side apply sends the desired objects every time; the
			// API server writes nothing when they are already so.
			Expect(*writes).To(HaveEach(HavePrefix("apply ")))
			Expect(get(ctx, d.DeepCopy()).ResourceVersion).To(Equal(d.ResourceVersion))
			Expect(get(ctx, sa.DeepCopy()).ResourceVersion).To(Equal(sa.ResourceVersion))
			Expect(get(ctx, svc.DeepCopy()).ResourceVersion).To(Equal(svc.ResourceVersion))
			Expect(get(ctx, od.DeepCopy()).ResourceVersion).To(Equal(od.ResourceVersion))

			patch := client.MergeFrom(od.DeepCopy())
			od.Spec.BatchSize = 7
			Expect(k8s.Patch(ctx, od, patch)).To(Succeed())
			Eventually(func() []string {
				return get(ctx, d.DeepCopy()).Spec.Template.Spec.Containers[0].Args
			}).Should(ContainElement("--batch-size=7"))
			Eventually(events(ctx, od)).Should(ContainElement("Normal SuccessfulUpdate: Updated Deployment " + od.Name))
		})

		It("reverts a hand edit of what it owns, and leaves alone what others add", func(ctx SpecContext) {
			d := deploymentOf(ctx, od)
			edited := d.DeepCopy()
			edited.Spec.Replicas = ptr.To(int32(5))
			edited.Spec.Template.Spec.Containers[0].Args = []string{"drain", "--batch-size=1"}
			edited.Annotations = map[string]string{"example.com/owner": "platform"}
			Expect(k8s.Update(ctx, edited)).To(Succeed(), "as kubectl edit does")
			Eventually(func(g Gomega) {
				now := get(ctx, d.DeepCopy())
				g.Expect(now.Spec.Replicas).To(Equal(ptr.To(int32(2))))
				g.Expect(now.Spec.Template.Spec.Containers[0].Args).To(Equal(d.Spec.Template.Spec.Containers[0].Args))
				g.Expect(now.Annotations).To(HaveKeyWithValue("example.com/owner", "platform"))
			}).Should(Succeed())
		})

		It("scales the Deployment through the scale subresource, as kubectl scale and an HPA do", func(ctx SpecContext) {
			deploymentOf(ctx, od)
			kubectl("scale", "outboxdrainer/"+od.Name, "-n", ns, "--replicas=3")
			Eventually(func() *int32 { return get(ctx, deploymentOf(ctx, od)).Spec.Replicas }).Should(Equal(ptr.To(int32(3))))
			Eventually(func() string { return get(ctx, od.DeepCopy()).Status.Selector }).Should(Equal(resource.Selector(od)))

			kubectl("scale", "outboxdrainer/"+od.Name, "-n", ns, "--replicas=1")
			Eventually(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(od), &policyv1.PodDisruptionBudget{}))
			}).Should(BeTrue(), "a budget on a single drainer would block every node drain")
			Eventually(events(ctx, od)).Should(ContainElement("Normal SuccessfulDelete: Deleted PodDisruptionBudget " + od.Name))
		})
	})

	Describe("the outbox's health", func() {
		BeforeEach(func(ctx SpecContext) {
			// 4 pending, the oldest enqueued 2 minutes ago; 2 poisoned at
			// maxAttempts 3, older still; 3 published.
			runSQL(ctx, `INSERT INTO `+table+` (event_type, payload, enqueued_at, attempts, published_at)
				SELECT 'order.created', '{}'::jsonb, now() - interval '2 minutes', 0, NULL::timestamptz
				UNION ALL SELECT 'order.created', '{}', now(), 1, NULL FROM generate_series(1, 3)
				UNION ALL SELECT 'order.created', '{}', now() - interval '1 hour', 3, NULL FROM generate_series(1, 2)
				UNION ALL SELECT 'order.created', '{}', now() - interval '1 day', 0, now() FROM generate_series(1, 3)`)
		})

		It("shows the backlog, the poisoned rows and the oldest pending age, and follows the outbox within a status interval", func(ctx SpecContext) {
			connectionSecrets(ctx, ns)
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).Should(Equal(ptr.To(int64(4))))
			s := get(ctx, od.DeepCopy()).Status
			Expect(s.Poisoned).To(Equal(ptr.To(int64(2))))
			Expect(s.OldestPendingAge.Duration).To(BeNumerically("~", 2*time.Minute, 10*time.Second))
			Expect(s.LastProbeTime).NotTo(BeNil())
			Expect(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)()).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "OutboxRead"), HaveField("ObservedGeneration", od.Generation)))
			Expect(condition(ctx, od, v1alpha1.ConditionDegraded)()).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "PoisonedRows"), HaveField("Message", ContainSubstring("2 rows"))))
			Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ReplicasNotReady")), "envtest runs no pods")

			// The application enqueues 5 and a drainer publishes the oldest.
			runSQL(ctx, `INSERT INTO `+table+` (event_type, payload) SELECT 'order.paid', '{}' FROM generate_series(1, 5)`)
			runSQL(ctx, `UPDATE `+table+` SET published_at = now() WHERE enqueued_at < now() - interval '1 minute' AND attempts = 0 AND published_at IS NULL`)
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).
				WithTimeout(statusInterval + 2*time.Second).Should(Equal(ptr.To(int64(8))))
			Expect(get(ctx, od.DeepCopy()).Status.OldestPendingAge.Duration).To(BeNumerically("<", time.Minute))

			out := kubectl("get", "outboxdrainers", "-n", ns)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			Expect(lines).To(HaveLen(2), out)
			Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "READY", "REPLICAS", "BACKLOG", "POISONED", "OLDEST", "AGE"}))
			Expect(lines[1]).To(MatchRegexp(`^orders\s+False\s+0\s+8\s+2\s+\d+s\s+\d+s$`))
			// AGE may tick between two calls.
			withoutAge := func(s string) string { return regexp.MustCompile(`\d+s\n`).ReplaceAllString(s, "\n") }
			// The category also holds OutboxReplays, so kubectl names the kind.
			category := kubectl("get", "spillway", "-n", ns)
			Expect(category).To(MatchRegexp(`\noutboxdrainer\.spillway\.io/orders\s+False\s+0\s+8\s+2\s+\d+s\s+\d+s\n`), "the category: %s", category)
			Expect(withoutAge(kubectl("get", "od", "-n", ns))).To(Equal(withoutAge(out)), "the short name")
		})

		It("writes no status while its reads find the outbox as it was, and dates the status by the read that changed it", func(ctx SpecContext) {
			// Nothing pending, so no age that grows with each read.
			runSQL(ctx, `UPDATE `+table+` SET published_at = now() WHERE published_at IS NULL`)
			connectionSecrets(ctx, ns)
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).Should(Equal(ptr.To(int64(0))))
			written := get(ctx, od.DeepCopy())

			after := time.Now()
			Eventually(func() time.Time { return lastRead(od) }).WithTimeout(4*statusInterval).
				Should(BeTemporally(">", after.Add(statusInterval)), "two more reads")
			now := get(ctx, od.DeepCopy())
			Expect(now.ResourceVersion).To(Equal(written.ResourceVersion), "reads that found the outbox as it was wrote nothing")
			Expect(now.Status.LastProbeTime.Time).To(BeTemporally("<", after))

			runSQL(ctx, `INSERT INTO `+table+` (event_type, payload) VALUES ('order.paid', '{}')`)
			inserted := time.Now()
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).
				WithTimeout(statusInterval + 2*time.Second).Should(Equal(ptr.To(int64(1))))
			// lastProbeTime has a second's precision.
			Expect(get(ctx, od.DeepCopy()).Status.LastProbeTime.Time).To(BeTemporally(">=", inserted.Truncate(time.Second)),
				"the status is dated by the read that saw the row")
		})

		It("keeps reporting the outbox of a paused fleet scaled to zero", func(ctx SpecContext) {
			connectionSecrets(ctx, ns)
			od.Spec.Paused = true
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).Should(Equal(ptr.To(int64(4))))
			Expect(deploymentOf(ctx, od).Spec.Replicas).To(Equal(ptr.To(int32(0))))
			Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(HaveField("Reason", "Paused"))
			err := k8s.Get(ctx, client.ObjectKeyFromObject(od), &policyv1.PodDisruptionBudget{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no budget for a fleet of zero: %v", err)

			runSQL(ctx, `INSERT INTO `+table+` (event_type, payload) VALUES ('order.paid', '{}')`)
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).
				WithTimeout(statusInterval + 2*time.Second).Should(Equal(ptr.To(int64(5))))

			patch := client.MergeFrom(od.DeepCopy())
			od.Spec.Paused = false
			Expect(k8s.Patch(ctx, od, patch)).To(Succeed())
			Eventually(func() *int32 { return get(ctx, deploymentOf(ctx, od)).Spec.Replicas }).Should(Equal(ptr.To(int32(2))))
			Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(od), &policyv1.PodDisruptionBudget{}) }).Should(Succeed())
		})

		It("says SecretNotFound, without a crash loop, until the Secret appears, and then recovers on its own", func(ctx SpecContext) {
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).Should(And(
				Not(BeNil()), HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "SecretNotFound"),
				HaveField("Message", `Secret "orders-db" (database URL) was not found`)))
			Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(And(HaveField("Reason", "SecretNotFound"),
				HaveField("Message", ContainSubstring(`Secret "rabbit" (broker URL) was not found`))))
			Eventually(events(ctx, od)).Should(ContainElement(`Warning SecretNotFound: Secret "orders-db" (database URL) was not found`))
			Expect(get(ctx, od.DeepCopy()).Status.ObservedGeneration).To(Equal(od.Generation),
				"kstatus: the spec was acted on; Stalled says it is stuck")
			Expect(condition(ctx, od, v1alpha1.ConditionStalled)()).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "SecretNotFound")))
			deploymentOf(ctx, od)
			counting, _ := writeCountingReconciler()
			_, err := counting.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(od)})
			Expect(err).NotTo(HaveOccurred(), "an error would be retried at once, with backoff; the Prober reads again on its own")

			connectionSecrets(ctx, ns)
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).Should(HaveField("Status", metav1.ConditionTrue))
			Eventually(condition(ctx, od, v1alpha1.ConditionReady)).Should(HaveField("Reason", "ReplicasNotReady"))
			Expect(get(ctx, od.DeepCopy()).Status.Backlog).To(Equal(ptr.To(int64(4))))
			Expect(get(ctx, od.DeepCopy()).Status.ObservedGeneration).To(Equal(od.Generation))
			Expect(events(ctx, od)()).To(HaveEach(Not(HavePrefix("Warning FailedUpdate"))))
		})

		It("says the database is unreachable without ever showing the URL's password", func(ctx SpecContext) {
			const password = "s3cr3t-pw"
			secret(ctx, ns, "orders-db", "postgres://spillway:"+password+"@127.0.0.1:1/test?connect_timeout=2")
			secret(ctx, ns, "rabbit", testenv.BrokerURL())
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).Should(And(
				Not(BeNil()), HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ConnectionFailed"),
				HaveField("Message", ContainSubstring("postgres://spillway:xxxxx@127.0.0.1:1/test"))))
			Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(HaveField("Reason", "DatabaseUnreachable"))
			Eventually(events(ctx, od)).Should(ContainElement(HavePrefix("Warning ConnectionFailed: ")))

			s := get(ctx, od.DeepCopy()).Status
			for _, c := range s.Conditions {
				Expect(c.Message).NotTo(ContainSubstring(password))
			}
			Expect(events(ctx, od)()).To(HaveEach(Not(ContainSubstring(password))))
			Expect(s.Backlog).To(BeNil(), "never read")
		})

		It("removes the numbers when a read fails, rather than show old ones as current", func(ctx SpecContext) {
			connectionSecrets(ctx, ns)
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(func() *int64 { return get(ctx, od.DeepCopy()).Status.Backlog }).Should(Equal(ptr.To(int64(4))))
			read := get(ctx, od.DeepCopy()).Status.LastProbeTime

			runSQL(ctx, "ALTER TABLE "+table+" RENAME COLUMN claimed_by TO leased_by")
			altered := time.Now()
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).WithTimeout(statusInterval + 5*time.Second).
				Should(HaveField("Reason", "TableNotUsable"))
			s := get(ctx, od.DeepCopy()).Status
			Expect(s.Backlog).To(BeNil())
			Expect(s.Poisoned).To(BeNil())
			Expect(s.OldestPendingAge).To(BeNil())
			Expect(s.LastProbeTime).NotTo(BeNil())
			Expect(s.LastProbeTime.Time).To(And(BeTemporally(">=", read.Time), BeTemporally("<=", altered)), "the time of the last good read")
			out := kubectl("get", "outboxdrainers", "-n", ns)
			Expect(out).To(MatchRegexp(`\norders\s+False\s+0\s+\d+s\s*$`), "no backlog, poisoned or oldest shown: %s", out)
		})

		It("says the drainers cannot drain a table the database refuses them or that is gone, in its words, never the URL's, and recovers on its own", func(ctx SpecContext) {
			role, password := testenv.UniqueName("drainer"), "s3cr3t-pw"
			runSQL(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD '"+password+"'")
			DeferCleanup(func(ctx SpecContext) { runSQL(ctx, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
			runSQL(ctx, "GRANT SELECT ON "+table+" TO "+role)
			secret(ctx, ns, "orders-db", "postgres://"+role+":"+password+"@127.0.0.1:5432/test")
			secret(ctx, ns, "rabbit", testenv.BrokerURL())
			Expect(k8s.Create(ctx, od)).To(Succeed())
			_, name, _ := strings.Cut(table, ".")

			refused := fmt.Sprintf("the database refuses the drainers' claims on %s: ERROR: permission denied for table %s (SQLSTATE 42501)", table, name)
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).Should(And(
				Not(BeNil()), HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "StatementRefused"), HaveField("Message", refused)))
			Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "StatementRefused"), HaveField("Message", refused)))
			Expect(condition(ctx, od, v1alpha1.ConditionStalled)()).To(HaveField("Reason", "StatementRefused"))
			Expect(get(ctx, od.DeepCopy()).Status.Backlog).To(Equal(ptr.To(int64(4))), "the outbox itself could be read")
			Eventually(events(ctx, od)).Should(ContainElement("Warning StatementRefused: " + refused))

			runSQL(ctx, "GRANT UPDATE ON "+table+" TO "+role)
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).WithTimeout(statusInterval + 5*time.Second).
				Should(HaveField("Reason", "OutboxRead"))
			Expect(condition(ctx, od, v1alpha1.ConditionReady)()).To(HaveField("Reason", "ReplicasNotReady"), "envtest runs no pods")

			runSQL(ctx, "ALTER TABLE "+table+" RENAME TO "+name+"_away")
			gone := fmt.Sprintf(`table %s: ERROR: relation "%s" does not exist (SQLSTATE 42P01); run spillway migrate to create it`, table, table)
			Eventually(condition(ctx, od, v1alpha1.ConditionReady)).WithTimeout(statusInterval + 5*time.Second).Should(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "TableNotUsable"), HaveField("Message", gone)))
			runSQL(ctx, "ALTER TABLE "+table+"_away RENAME TO "+name)
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).WithTimeout(2*statusInterval+5*time.Second).
				Should(HaveField("Reason", "OutboxRead"), "read again within the failing read's backoff")

			for _, c := range get(ctx, od.DeepCopy()).Status.Conditions {
				Expect(c.Message).NotTo(ContainSubstring(password))
			}
			Expect(events(ctx, od)()).To(HaveEach(Not(ContainSubstring(password))))
		})

		It("says which column a table lacks", func(ctx SpecContext) {
			connectionSecrets(ctx, ns)
			od.Spec.Database.Columns.ClaimedBy = "leased_by"
			Expect(k8s.Create(ctx, od)).To(Succeed())
			Eventually(condition(ctx, od, v1alpha1.ConditionDatabaseReachable)).Should(And(
				Not(BeNil()), HaveField("Reason", "TableNotUsable"),
				HaveField("Message", MatchRegexp(regexp.QuoteMeta("database.columns.claimedBy: Not found: \"leased_by in "+table)))))
		})
	})
})
