package packaging

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

// restrictedNamespace creates a namespace that enforces the restricted Pod
// Security Standard, as config/default's does.
func restrictedNamespace(ctx context.Context, name string) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return name
}

// admitPod asks the API server, in a dry run, whether it would admit a pod
// of the template: its PodSecurity admission checks the namespace's level.
func admitPod(ctx context.Context, namespace string, tmpl corev1.PodTemplateSpec) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-check", Namespace: namespace, Labels: tmpl.Labels},
		Spec:       tmpl.Spec,
	}
	return k8s.Create(ctx, pod, client.DryRunAll)
}

// get reads an object's current state from the API server.
func get[T client.Object](ctx context.Context, obj T) T {
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed(), "%T %s", obj, obj.GetName())
	return obj
}

// markAvailable plays the Deployment controller and the kubelet, which
// envtest does not run: the operator's pod is up and ready.
func markAvailable(ctx context.Context, d *appsv1.Deployment) {
	now := metav1.Now()
	d.Status = appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation,
		Replicas:           1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{
			Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable",
			LastUpdateTime: now, LastTransitionTime: now,
		}},
	}
	Expect(k8s.Status().Update(ctx, d)).To(Succeed())
}

var _ = Describe("The chart installed with helm into a real API server", Ordered, func() {
	// config/default's namespace, so that its dry run finds it.
	const namespace, release = "spillway-system", "spillway"
	operator := func() *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: release, Namespace: namespace}}
	}

	BeforeAll(func(ctx SpecContext) {
		restrictedNamespace(ctx, namespace)
		mustRun(helm, "install", release, chart, "--namespace", namespace)
	})

	It("installs the CRD, which the API server serves, and the operator's ServiceAccount, RBAC, Deployment and metrics Service", func(ctx SpecContext) {
		Expect(mustRun(helm, "status", release, "--namespace", namespace)).To(ContainSubstring("STATUS: deployed"))
		crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "outboxdrainers.spillway.io"}}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(crd), crd)).To(Succeed())
			g.Expect(crd.Status.Conditions).To(ContainElement(And(
				HaveField("Type", apiextensionsv1.Established), HaveField("Status", apiextensionsv1.ConditionTrue))))
		}).Should(Succeed())
		Eventually(func() error {
			return k8s.List(ctx, &v1alpha1.OutboxDrainerList{}, client.InNamespace(namespace))
		}).Should(Succeed())

		for _, obj := range []client.Object{
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: release, Namespace: namespace}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: release}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: release + "-leader-election", Namespace: namespace}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: release + "-leader-election", Namespace: namespace}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: release + "-metrics", Namespace: namespace}},
			operator(),
		} {
			get(ctx, obj)
		}
	})

	It("runs the operator's pods under the restricted Pod Security Standard, which refuses a privileged pod", func(ctx SpecContext) {
		tmpl := get(ctx, operator()).Spec.Template
		Expect(admitPod(ctx, namespace, tmpl)).To(Succeed())

		escalating := tmpl.DeepCopy()
		escalating.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		Expect(admitPod(ctx, namespace, *escalating)).To(MatchError(ContainSubstring(`violates PodSecurity "restricted`)))
	})

	It("runs spillway manager with the chart's arguments and ServiceAccount: it turns ready and reconciles the sample fleet", func(ctx SpecContext) {
		pod := get(ctx, operator()).Spec.Template.Spec
		probes, metrics := suite.FreeAddr(), suite.FreeAddr()
		GinkgoT().Setenv("KUBECONFIG", serviceAccountKubeconfig(namespace, pod.ServiceAccountName))
		// The pod's ports, moved to free ones: a later flag wins.
		manager := suite.Start(spillway, append(pod.Containers[0].Args, "--health-probe-addr="+probes, "--metrics-addr="+metrics)...)
		Eventually(func() int { return testenv.Probe(probes, "/readyz") }, 30*time.Second).Should(Equal(200))
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "operator.spillway.io", Namespace: namespace}}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(lease), lease) }, 30*time.Second).Should(Succeed())

		shop := restrictedNamespace(ctx, testenv.UniqueObjectName("shop"))
		mustRun("kubectl", "apply", "--namespace", shop, "-f", "config/samples/")
		fleet := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: shop}}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(fleet), fleet) }, 30*time.Second).Should(Succeed())
		Expect(fleet.OwnerReferences).To(ContainElement(HaveField("Kind", "OutboxDrainer")))
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Name: "orders", Namespace: shop}, &policyv1.PodDisruptionBudget{})
		}).Should(Succeed(), "two replicas get a PodDisruptionBudget")
		Expect(admitPod(ctx, shop, fleet.Spec.Template)).To(Succeed(), "the drainer pods are restricted too")
		// The status write and its events come after the children: wait for
		// them, so that the check below covers every kind of write.
		od := &v1alpha1.OutboxDrainer{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: shop}}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(od), od)).To(Succeed())
			g.Expect(od.Status.Conditions).NotTo(BeEmpty())
		}, 30*time.Second).Should(Succeed(), "the manager wrote the fleet's status")
		Expect(string(manager.Err.Contents())).NotTo(ContainSubstring("forbidden"))
	})

	It("passes the helm test hook's checks, with the hook's own RBAC, once the operator is Available, and fails them before", func(ctx SpecContext) {
		hooks := manifests(mustRun(helm, "get", "hooks", release, "--namespace", namespace))
		for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
			Expect(k8s.Create(ctx, find(hooks, kind, release+"-test"))).To(Succeed())
		}
		test := object[corev1.Pod](hooks, "Pod", release+"-test")
		Expect(test.Annotations).To(HaveKeyWithValue("helm.sh/hook", "test"))
		Expect(admitPod(ctx, namespace, corev1.PodTemplateSpec{ObjectMeta: test.ObjectMeta, Spec: test.Spec})).To(Succeed())

		asHook := serviceAccountKubeconfig(namespace, test.Spec.ServiceAccountName)
		check := func(c corev1.Container, extra ...string) (string, error) {
			return run("kubectl", append(append([]string{"--kubeconfig=" + asHook}, c.Args...), extra...)...)
		}
		available, served := test.Spec.InitContainers[0], test.Spec.Containers[0]
		out, err := check(available, "--timeout=1s")
		Expect(err).To(HaveOccurred(), "no kubelet runs the operator here, so it is not Available yet: %s", out)

		markAvailable(ctx, get(ctx, operator()))
		Expect(check(available)).To(ContainSubstring("condition met"))
		Expect(check(served)).To(ContainSubstring("No resources found"))
	})

	It("upgrades the CRD that helm installed with the install guide's kubectl apply --server-side step", func(ctx SpecContext) {
		// An older CRD, as an earlier release of the chart installed it: one
		// status field fewer.
		crd := get(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "outboxdrainers.spillway.io"}})
		status := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"]
		Expect(status.Properties).To(HaveKey("countCapped"))
		delete(status.Properties, "countCapped")
		crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"] = status
		Expect(k8s.Update(ctx, crd)).To(Succeed())

		out := mustRun("kubectl", "apply", "--server-side", "--force-conflicts", "--field-manager=spillway-crds", "-f", chart+"/crds/")
		Expect(out).To(ContainSubstring("customresourcedefinition.apiextensions.k8s.io/outboxdrainers.spillway.io serverside-applied"))
		crd = get(ctx, crd)
		Expect(crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties).To(HaveKey("countCapped"))
		Expect(mustRun(helm, "status", release, "--namespace", namespace)).To(ContainSubstring("STATUS: deployed"), "the release is untouched")
	})

	It("applies config/default in a server-side dry run, with the operator's image as its fleets' image", func() {
		out := mustRun("kubectl", "apply", "--dry-run=server", "-k", "config/default")
		Expect(out).To(ContainSubstring("deployment.apps/spillway-operator created (server dry run)"))
		Expect(out).To(ContainSubstring("clusterrole.rbac.authorization.k8s.io/spillway-operator created (server dry run)"))

		d := object[appsv1.Deployment](manifests(mustRun("kubectl", "kustomize", "config/default")), "Deployment", "spillway-operator")
		Expect(d.Namespace).To(Equal(namespace))
		c := d.Spec.Template.Spec.Containers[0]
		Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "SPILLWAY_DRAINER_IMAGE", Value: c.Image}))
		Expect(c.Image).NotTo(Equal("spillway"), "config/default sets the image")
	})

	It("applies config/samples in a server-side dry run: the OutboxDrainer, the two Secrets it references, and an OutboxReplay of its rows", func() {
		out := mustRun("kubectl", "apply", "--dry-run=server", "--namespace=default", "-f", "config/samples/")
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders created (server dry run)"))
		Expect(out).To(ContainSubstring("outboxreplay.spillway.io/orders-no-route created (server dry run)"))
		replay := object[v1alpha1.OutboxReplay](manifestsFile("config/samples/spillway_v1alpha1_outboxreplay.yaml"), "OutboxReplay", "orders-no-route")
		Expect(replay.Spec.DrainerRef.Name).To(Equal("orders"))
		Expect(replay.Spec.DryRun).To(BeTrue(), "the sample changes nothing")

		var objs []*unstructured.Unstructured
		for _, file := range []string{"config/samples/secrets.yaml", "config/samples/spillway_v1alpha1_outboxdrainer.yaml"} {
			objs = append(objs, manifestsFile(file)...)
		}
		od := object[v1alpha1.OutboxDrainer](objs, "OutboxDrainer", "orders")
		for _, ref := range []v1alpha1.SecretKeyRef{od.Spec.Database.URLSecretRef, od.Spec.Broker.URLSecretRef} {
			Expect(object[corev1.Secret](objs, "Secret", ref.Name).StringData).To(HaveKey(ref.Key))
			Expect(out).To(ContainSubstring("secret/" + ref.Name + " created (server dry run)"))
		}
	})

	It("applies the TLS sample in a server-side dry run, and builds drainers that mount its certificates and verify both servers", func() {
		out := mustRun("kubectl", "apply", "--dry-run=server", "--namespace=default", "-f", "config/samples/tls/")
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders-tls created (server dry run)"))
		od := object[v1alpha1.OutboxDrainer](manifestsFile("config/samples/tls/outboxdrainer-tls.yaml"), "OutboxDrainer", "orders-tls")
		args := resource.DrainArgs(od.Spec)
		Expect(args).To(ContainElements(
			"--database-ca-file=/var/run/secrets/spillway/database-tls/ca.crt",
			"--database-cert-file=/var/run/secrets/spillway/database-tls/tls.crt",
			"--database-key-file=/var/run/secrets/spillway/database-tls/tls.key",
			"--broker-ca-file=/var/run/secrets/spillway/broker-tls/ca.crt",
			"--broker-cert-file=/var/run/secrets/spillway/broker-tls/tls.crt",
			"--broker-key-file=/var/run/secrets/spillway/broker-tls/tls.key",
			"--broker-sasl-external"))
		Expect(resource.SecretNames(od.Spec)).To(ConsistOf("orders-db", "rabbit", "orders-db-drainer-tls", "rabbit-drainer-tls"))

		By("the API server refuses EXTERNAL without a client certificate, naming the field")
		refused := od.DeepCopy()
		refused.Namespace = "default"
		refused.Spec.Broker.TLS.ClientCertificate = false
		Expect(k8s.Create(context.Background(), refused, client.DryRunAll)).To(MatchError(And(
			ContainSubstring("spec.broker.tls.external"), ContainSubstring("external authenticates with the client certificate: set clientCertificate"))))
	})

	It("applies the PgBouncer sample in a server-side dry run, and builds drainers that mount the direct URL and run in transaction mode", func() {
		out := mustRun("kubectl", "apply", "--dry-run=server", "--namespace=default", "-f", "config/samples/pgbouncer/")
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders-pgbouncer created (server dry run)"))
		od := object[v1alpha1.OutboxDrainer](manifestsFile("config/samples/pgbouncer/outboxdrainer-pgbouncer.yaml"), "OutboxDrainer", "orders-pgbouncer")
		Expect(resource.DrainArgs(od.Spec)).To(ContainElements("--database-pool-mode=transaction",
			"--database-direct-url-file=/var/run/secrets/spillway/database-direct/url"))
		Expect(resource.SecretNames(od.Spec)).To(ConsistOf("orders-db-pgbouncer", "orders-rabbitmq", "orders-db-direct"))

		By("the API server refuses maxRate through the pooler without a direct URL, naming the field")
		refused := od.DeepCopy()
		refused.Namespace = "default"
		refused.Spec.Database.Pooler.DirectURLSecretRef = nil
		Expect(k8s.Create(context.Background(), refused, client.DryRunAll)).To(MatchError(And(
			ContainSubstring("spec.maxRate"), ContainSubstring("set database.pooler.directURLSecretRef"))))
	})

	It("applies the webhook sample in a server-side dry run, and builds drainers that post to the mounted URL with the mounted signing secret", func() {
		out := mustRun("kubectl", "apply", "--dry-run=server", "--namespace=default", "-f", "config/samples/webhook/")
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders-webhook created (server dry run)"))
		od := object[v1alpha1.OutboxDrainer](manifestsFile("config/samples/webhook/outboxdrainer-webhook.yaml"), "OutboxDrainer", "orders-webhook")
		Expect(resource.DrainArgs(od.Spec)).To(ContainElements("--sink=webhook",
			"--webhook-url-file=/var/run/secrets/spillway/webhook/url",
			"--webhook-signing-secret-file=/var/run/secrets/spillway/webhook-signing/url", "--webhook-gone-poisons=true"))
		Expect(resource.SecretNames(od.Spec)).To(ConsistOf("orders-db", "partner-webhook", "partner-webhook"))

		By("the API server refuses a fleet with both sinks")
		refused := od.DeepCopy()
		refused.Namespace = "default"
		refused.Spec.Broker = v1alpha1.BrokerSpec{URLSecretRef: v1alpha1.SecretKeyRef{Name: "rabbit", Key: "url"}, Exchange: "orders"}
		Expect(k8s.Create(context.Background(), refused, client.DryRunAll)).To(MatchError(
			ContainSubstring("set one sink: sink.rabbitmq (or broker, as earlier fleets name it) or sink.webhook")))
	})
})

var _ = Describe("The chart installed for some namespaces only, with secure metrics", func() {
	It("runs the operator with Roles in the watched namespaces only, and serves /metrics to the ServiceAccount it names", func(ctx SpecContext) {
		namespace := restrictedNamespace(ctx, testenv.UniqueObjectName("scoped-system"))
		shop := restrictedNamespace(ctx, testenv.UniqueObjectName("shop"))
		const release = "scoped"
		mustRun(helm, "install", release, chart, "--namespace", namespace,
			"--set", "watchNamespaces={"+shop+"}", "--set", "metrics.secure=true",
			"--set", "metrics.reader.serviceAccount.name=prometheus", "--set", "metrics.reader.serviceAccount.namespace="+namespace)
		DeferCleanup(func() { mustRun(helm, "uninstall", release, "--namespace", namespace) })
		role := get(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: release + "-spillway", Namespace: shop}})
		Expect(role.Rules).NotTo(BeEmpty())
		err := k8s.Get(ctx, client.ObjectKey{Name: release + "-spillway"}, &rbacv1.ClusterRole{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no ClusterRole for the operator's own work: %v", err)

		operatorPod := get(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: release + "-spillway", Namespace: namespace}}).Spec.Template.Spec
		Expect(operatorPod.Containers[0].Args).To(ContainElements("--watch-namespaces="+shop, "--metrics-secure"))
		probes, metrics := suite.FreeAddr(), suite.FreeAddr()
		GinkgoT().Setenv("KUBECONFIG", serviceAccountKubeconfig(namespace, operatorPod.ServiceAccountName))
		manager := suite.Start(spillway, append(operatorPod.Containers[0].Args, "--health-probe-addr="+probes, "--metrics-addr="+metrics)...)
		Eventually(func() int { return testenv.Probe(probes, "/readyz") }, 30*time.Second).Should(Equal(200))

		mustRun("kubectl", "apply", "--namespace", shop, "-f", "config/samples/")
		fleet := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: shop}}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKeyFromObject(fleet), fleet) }, 30*time.Second).Should(Succeed())
		od := &v1alpha1.OutboxDrainer{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: shop}}
		Eventually(func() []metav1.Condition { return get(ctx, od).Status.Conditions }, 30*time.Second).
			Should(ContainElement(HaveField("Type", "DatabaseReachable")), "the Prober read the Secrets with the Role's rights")

		// Prometheus's token: the chart bound its metrics reader to it.
		prometheus := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus", Namespace: namespace}}
		Expect(k8s.Create(ctx, prometheus)).To(Succeed())
		token := &authenticationv1.TokenRequest{}
		Expect(k8s.SubResource("token").Create(ctx, prometheus, token)).To(Succeed())
		scrape := func() string {
			req, err := http.NewRequest(http.MethodGet, "https://"+metrics+"/metrics", nil)
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("Authorization", "Bearer "+token.Status.Token)
			resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}).Do(req)
			if err != nil {
				return err.Error()
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return fmt.Sprintf("%d: %s", resp.StatusCode, body)
		}
		Eventually(scrape, 30*time.Second).Should(And(HavePrefix("200: "),
			ContainSubstring(`spillway_outboxdrainer_ready{name="orders",namespace="`+shop+`"}`)),
			"the token and access reviews ran with the chart's metrics-auth ClusterRole")
		Expect(string(manager.Err.Contents())).NotTo(ContainSubstring("forbidden"))
	})
})
