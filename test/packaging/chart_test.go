package packaging

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/spillway-io/spillway/test/testenv"
)

// allValues sets every value of the chart.
const allValues = chart + "/ci/all-values.yaml"

// render runs helm template as release spillway in namespace spillway-system.
func render(args ...string) (string, error) {
	return run(helm, append([]string{"template", "spillway", chart, "--namespace", "spillway-system"}, args...)...)
}

func mustRender(args ...string) []*unstructured.Unstructured {
	out, err := render(args...)
	Expect(err).NotTo(HaveOccurred(), out)
	return manifests(out)
}

// readYAML parses a YAML file of the repository into a map.
func readYAML(path string) map[string]any {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), path))
	Expect(err).NotTo(HaveOccurred())
	var m map[string]any
	Expect(yaml.Unmarshal(data, &m)).To(Succeed())
	return m
}

// leaves lists the paths to every leaf of values. A map with keys is
// walked; any other value, an empty map or a list included, is a leaf.
func leaves(values any, path []string) [][]string {
	m, ok := values.(map[string]any)
	if !ok || len(m) == 0 {
		return [][]string{path}
	}
	var out [][]string
	for key, child := range m {
		out = append(out, leaves(child, append(slices.Clone(path), key))...)
	}
	return out
}

// lookup follows a dotted path through nested maps.
func lookup(values map[string]any, path []string) (any, bool) {
	var v any = values
	for _, key := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[key]; !ok {
			return nil, false
		}
	}
	return v, true
}

var _ = Describe("The Helm chart", func() {
	It("passes helm lint --strict with its default values and with every value set", func() {
		mustRun(helm, "lint", "--strict", chart)
		mustRun(helm, "lint", "--strict", chart, "--values", allValues)
	})

	It("renders the operator, its ServiceAccount, RBAC, metrics Service and test hook with the default values", func() {
		objs := mustRender()
		Expect(kinds(objs)).To(ConsistOf(
			"ServiceAccount/spillway", "ClusterRole/spillway", "ClusterRoleBinding/spillway",
			"ClusterRole/spillway-nodes", "ClusterRoleBinding/spillway-nodes",
			"Role/spillway-leader-election", "RoleBinding/spillway-leader-election",
			"Service/spillway-metrics", "Deployment/spillway",
			"ServiceAccount/spillway-test", "Role/spillway-test", "RoleBinding/spillway-test", "Pod/spillway-test",
			"ClusterRole/spillway-outboxreplay-editor", "ClusterRole/spillway-outboxreplay-viewer",
		))
		appVersion := readYAML(chart + "/Chart.yaml")["appVersion"]
		image := "ghcr.io/spillway-io/spillway:" + appVersion.(string)

		d := object[appsv1.Deployment](objs, "Deployment", "spillway")
		Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal("spillway"))
		c := d.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal(image))
		Expect(c.Args).To(Equal([]string{
			"manager",
			"--drainer-image=" + image, // fleets run the operator's own image
			"--metrics-addr=:8080",
			"--health-probe-addr=:8081",
			"--leader-elect=true",
			"--leader-election-namespace=spillway-system",
			"--log-level=info",
			"--probe-concurrency=8",
			"--probe-timeout=10s",
			"--probe-count-limit=1000000",
		}))
		Expect(c.Env).To(BeEmpty(), "no tracing without an endpoint")
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))

		svc := object[corev1.Service](objs, "Service", "spillway-metrics")
		Expect(svc.Spec.Selector).To(Equal(d.Spec.Selector.MatchLabels))
		Expect(svc.Spec.Selector).To(HaveKeyWithValue("app.kubernetes.io/component", "operator"),
			"the operator's pods, not the drainer pods it creates")
	})

	It("renders every option of ci/all-values.yaml, which sets every value", func() {
		all := readYAML(allValues)
		var unset []string
		for _, path := range leaves(readYAML(chart+"/values.yaml"), nil) {
			if _, ok := lookup(all, path); !ok {
				unset = append(unset, strings.Join(path, "."))
			}
		}
		Expect(unset).To(BeEmpty(), "values that ci/all-values.yaml does not set")

		objs := mustRender("--values", allValues)
		Expect(kinds(objs)).To(ContainElements("ServiceMonitor/spillway-operator", "ServiceMonitor/spillway-operator-drainers",
			"PrometheusRule/spillway-operator", "ConfigMap/spillway-operator-dashboard",
			"Role/spillway-operator", "RoleBinding/spillway-operator",
			"ClusterRole/spillway-operator-metrics-auth", "ClusterRoleBinding/spillway-operator-metrics-auth",
			"ClusterRole/spillway-operator-metrics-reader", "ClusterRoleBinding/spillway-operator-metrics-reader"))
		Expect(kinds(objs)).NotTo(ContainElement("ClusterRole/spillway-operator"), "watchNamespaces: Roles, no ClusterRole")
		var roleNamespaces []string
		for _, o := range objs {
			if o.GetKind() == "Role" && o.GetName() == "spillway-operator" {
				roleNamespaces = append(roleNamespaces, o.GetNamespace())
			}
		}
		Expect(roleNamespaces).To(ConsistOf("shop", "payments"))
		monitor := find(objs, "ServiceMonitor", "spillway-operator")
		endpoint, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
		Expect(endpoint[0]).To(And(HaveKeyWithValue("scheme", "https"),
			HaveKeyWithValue("bearerTokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token")))
		dashboard := object[corev1.ConfigMap](objs, "ConfigMap", "spillway-operator-dashboard")
		Expect(dashboard.Labels).To(HaveKeyWithValue("grafana_dashboard", "1"))
		var board map[string]any
		Expect(json.Unmarshal([]byte(dashboard.Data["spillway-outbox.json"]), &board)).To(Succeed())
		Expect(board).To(HaveKeyWithValue("uid", "spillway-outbox"))
		d := object[appsv1.Deployment](objs, "Deployment", "spillway-operator")
		Expect(d.Spec.Replicas).To(Equal(ptr.To(int32(2))))
		pod := d.Spec.Template.Spec
		Expect(pod.ServiceAccountName).To(Equal("spillway-operator"))
		Expect(pod.ImagePullSecrets).To(ConsistOf(corev1.LocalObjectReference{Name: "registry-credentials"}))
		Expect(pod.PriorityClassName).To(Equal("platform-high"))
		Expect(pod.NodeSelector).To(HaveKeyWithValue("kubernetes.io/os", "linux"))
		Expect(pod.Tolerations).To(HaveLen(1))
		Expect(pod.Affinity.PodAntiAffinity).NotTo(BeNil())
		Expect(d.Spec.Template.Labels).To(HaveKeyWithValue("team", "platform"))
		Expect(d.Spec.Template.Annotations).To(HaveKeyWithValue("example.com/team", "platform"))
		c := pod.Containers[0]
		Expect(c.Image).To(Equal("registry.example.com/platform/spillway@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"), "the digest replaces the tag")
		Expect(c.ImagePullPolicy).To(Equal(corev1.PullAlways))
		Expect(c.Args).To(ContainElements(
			"--drainer-image=registry.example.com/platform/spillway-drainer:v0.1.0-rc.1",
			"--metrics-addr=:9090", "--health-probe-addr=:9091",
			"--log-level=debug", "--probe-concurrency=4", "--probe-timeout=5s", "--probe-count-limit=250000",
			"--watch-namespaces=shop,payments", "--metrics-secure", "--metrics-cert-dir=/var/run/secrets/spillway/metrics-tls"))
		Expect(pod.Volumes).To(ContainElement(HaveField("Secret.SecretName", "spillway-metrics-tls")))
		Expect(c.Resources.Limits.Cpu().String()).To(Equal("1"))
		Expect(c.Env).To(ContainElements(
			HaveField("Name", "POD_NAME"),
			corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.monitoring:4318"},
			corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_PROTOCOL", Value: "grpc"},
			corev1.EnvVar{Name: "OTEL_TRACES_SAMPLER_ARG", Value: "0.25"},
			corev1.EnvVar{Name: "OTEL_RESOURCE_ATTRIBUTES",
				Value: "deployment.environment.name=production,k8s.namespace.name=spillway-system,k8s.pod.name=$(POD_NAME)"}))
		svc := object[corev1.Service](objs, "Service", "spillway-operator-metrics")
		Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
		Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(9443))
		test := object[corev1.Pod](objs, "Pod", "spillway-operator-test")
		Expect(test.Spec.InitContainers[0].Image).To(Equal("registry.example.com/mirror/kubectl:v1.37.2"))
		Expect(test.Spec.InitContainers[0].Args).To(ContainElement("--timeout=60s"))
	})

	It("leaves out the RBAC, the ServiceAccount and the leader election when they are switched off", func() {
		objs := mustRender("--set", "rbac.create=false,serviceAccount.create=false,serviceAccount.name=ops,leaderElection.enabled=false")
		Expect(kinds(objs)).NotTo(ContainElement(Or(
			HavePrefix("ClusterRole"), HavePrefix("Role/spillway-leader"), HavePrefix("RoleBinding/spillway-leader"),
			Equal("ServiceAccount/spillway"))))
		Expect(kinds(objs)).To(ContainElement("Deployment/spillway"))
		d := object[appsv1.Deployment](objs, "Deployment", "spillway")
		Expect(d.Spec.Template.Spec.ServiceAccountName).To(Equal("ops"))
		Expect(d.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--leader-elect=false"))
	})

	DescribeTable("refuses, through values.schema.json, a values file with",
		func(values, complaint string) {
			file := filepath.Join(GinkgoT().TempDir(), "values.yaml")
			Expect(os.WriteFile(file, []byte(values), 0o600)).To(Succeed())
			out, err := render("--values", file)
			Expect(err).To(HaveOccurred(), out)
			Expect(out).To(ContainSubstring("values don't meet the specifications of the schema"))
			Expect(out).To(ContainSubstring(complaint))
		},
		Entry("a string for a number", "replicaCount: two\n", "at '/replicaCount': got string, want integer"),
		Entry("a string for a boolean", "leaderElection:\n  enabled: \"yes\"\n", "at '/leaderElection/enabled': got string, want boolean"),
		Entry("a number for a string", "image:\n  tag: 1.2\n", "at '/image/tag': got number, want string"),
		Entry("a digest that is not sha256", "image:\n  digest: v1.2\n", "at '/image/digest'"),
		Entry("a map for a list", "tolerations:\n  key: dedicated\n", "at '/tolerations': got object, want array"),
		Entry("a port out of range", "metrics:\n  port: 80800\n", "at '/metrics/port': maximum"),
		Entry("a misspelt key", "serviceMonitor:\n  enable: true\n", "at '/serviceMonitor': additional properties 'enable' not allowed"),
		Entry("two replicas without leader election", "replicaCount: 2\nleaderElection:\n  enabled: false\n", "at '/leaderElection/enabled': value must be true"),
		Entry("a namespace for a list of them", "watchNamespaces: shop\n", "at '/watchNamespaces': got string, want array"),
		Entry("an invalid namespace name", "watchNamespaces: [Shop]\n", "at '/watchNamespaces/0'"),
		Entry("an unknown log level", "logLevel: verbose\n", "at '/logLevel'"),
		Entry("a probe timeout that is no duration", "probe:\n  timeout: 10\n", "at '/probe/timeout': got number, want string"),
		Entry("a string for secure metrics", "metrics:\n  secure: \"on\"\n", "at '/metrics/secure': got string, want boolean"),
		Entry("a misspelt alert setting", "prometheusRule:\n  enable: true\n", "at '/prometheusRule': additional properties 'enable' not allowed"),
		Entry("a number for the dashboard switch", "grafanaDashboard:\n  enabled: 1\n", "at '/grafanaDashboard/enabled': got number, want boolean"),
	)

	It("alerts on a growing backlog, an old pending row, poisoned rows, a key blocked too long and a fleet not ready, as promtool test rules proves", func() {
		promtool := os.Getenv("PROMTOOL")
		Expect(promtool).NotTo(BeEmpty(), "PROMTOOL is not set: make test builds promtool into bin/ and sets it")
		rule := find(mustRender("--set", "prometheusRule.enabled=true"), "PrometheusRule", "spillway")
		spec, _, _ := unstructured.NestedMap(rule.Object, "spec")
		rules, err := yaml.Marshal(spec)
		Expect(err).NotTo(HaveOccurred())
		dir := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600)).To(Succeed())
		tests, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "test/packaging/testdata/alerts_test.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600)).To(Succeed())
		Expect(mustRun(promtool, "check", "rules", filepath.Join(dir, "rules.yaml"))).To(ContainSubstring("SUCCESS: 5 rules found"))
		Expect(mustRun(promtool, "test", "rules", filepath.Join(dir, "alerts_test.yaml"))).To(ContainSubstring("SUCCESS"))
	})

	It("ships config/crd/bases unchanged in crds/", func() {
		bases, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config/crd/bases/*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		shipped, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), chart, "crds/*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(bases).NotTo(BeEmpty())
		Expect(names(shipped)).To(Equal(names(bases)), "make manifests copies the CRDs into the chart")
		for _, base := range bases {
			want, err := os.ReadFile(base)
			Expect(err).NotTo(HaveOccurred())
			got, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), chart, "crds", filepath.Base(base)))
			Expect(err).NotTo(HaveOccurred())
			Expect(string(got)).To(Equal(string(want)), "%s drifted from config/crd/bases: run make manifests", filepath.Base(base))
		}
	})

	It("grants the operator exactly the RBAC rules controller-gen generates from the markers, cluster-wide or per watched namespace", func() {
		generated := manifestsFile("config/rbac/role.yaml")
		want := normalized(object[rbacv1.ClusterRole](generated, "ClusterRole", "spillway-operator").Rules)
		objs := mustRender("--set", "metrics.secure=true")
		nodes := object[rbacv1.ClusterRole](objs, "ClusterRole", "spillway-nodes").Rules
		auth := object[rbacv1.ClusterRole](objs, "ClusterRole", "spillway-metrics-auth").Rules
		Expect(normalized(slices.Concat(object[rbacv1.ClusterRole](objs, "ClusterRole", "spillway").Rules, nodes, auth))).To(Equal(want),
			"the operator's rules, the nodes', and secure metrics' token and access reviews")
		scoped := mustRender("--set", "watchNamespaces={shop}")
		Expect(normalized(slices.Concat(object[rbacv1.Role](scoped, "Role", "spillway").Rules,
			object[rbacv1.ClusterRole](scoped, "ClusterRole", "spillway-nodes").Rules, auth))).To(Equal(want),
			"nodes are cluster-scoped: their ClusterRole stays beside the Roles")
		Expect(find(scoped, "Role", "spillway").GetNamespace()).To(Equal("shop"))
		Expect(kinds(mustRender())).NotTo(ContainElement(HavePrefix("ClusterRole/spillway-metrics")), "no token reviews unless metrics are secure")
		Expect(normalized(object[rbacv1.Role](mustRender(), "Role", "spillway-leader-election").Rules)).
			To(Equal(normalized(object[rbacv1.Role](generated, "Role", "spillway-operator").Rules)))
		binding := object[rbacv1.ClusterRoleBinding](mustRender(), "ClusterRoleBinding", "spillway")
		Expect(binding.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: "spillway", Namespace: "spillway-system"}))
	})
})

// names are the base names of paths.
func names(paths []string) []string {
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(p))
	}
	return out
}
