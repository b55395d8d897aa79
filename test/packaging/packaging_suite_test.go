// Package packaging tests what a newcomer touches first: the Helm chart,
// rendered and linted by the real helm and installed into a real API server,
// the kustomize configuration and samples, and make demo.
package packaging

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/spillway-io/spillway/controllers"
	"github.com/spillway-io/spillway/test/kubeenv"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

func TestPackaging(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Packaging Suite", Label(tier.Envtest))
}

const chart = "charts/spillway"

var (
	// helm is the binary make builds into bin/ at a pinned version.
	helm string
	// toolEnv points helm and kubectl at the test API server, and keeps
	// helm's cache and configuration out of the user's home.
	toolEnv []string
	// k8s reads and writes straight to the API server.
	k8s client.Client
	env *envtest.Environment
	// spillway is the binary, built for the suite.
	spillway string
)

var _ = BeforeSuite(func() {
	helm = os.Getenv("HELM")
	Expect(helm).NotTo(BeEmpty(), "HELM is not set: make test builds helm into bin/ and sets it")

	spillway = suite.BuildSpillway()
	var cfg *rest.Config
	var err error
	env, cfg, err = kubeenv.StartEmptyControlPlane()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)
	dir, err := os.MkdirTemp("", "spillway-packaging")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(os.RemoveAll, dir)
	kubeconfig, err := kubeenv.WriteKubeconfig(env, kubeenv.Administrator, dir)
	Expect(err).NotTo(HaveOccurred())
	toolEnv = append(os.Environ(), "KUBECONFIG="+kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(dir, "helm", "data"))

	scheme, err := controllers.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	Expect(apiextensionsv1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

// run runs a command in the repository's root against the test API server
// and returns its combined output.
func run(name string, args ...string) (string, error) {
	return runWithInput(nil, name, args...)
}

func runWithInput(stdin []byte, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = toolEnv
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ %s %s\n%s\n", filepath.Base(name), strings.Join(args, " "), out)
	return string(out), err
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as a
// ServiceAccount, so that what runs with it has exactly the RBAC the chart
// grants that account.
func serviceAccountKubeconfig(namespace, name string) string {
	path, err := kubeenv.WriteKubeconfig(env, envtest.User{
		Name:   "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace},
	}, GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	return path
}

// mustRun is run for a command that has to succeed.
func mustRun(name string, args ...string) string {
	out, err := run(name, args...)
	Expect(err).NotTo(HaveOccurred(), out)
	return out
}

// manifests parses a stream of YAML documents, as helm and kustomize print
// them, skipping empty ones.
func manifests(text string) []*unstructured.Unstructured {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			return objs
		}
		Expect(err).NotTo(HaveOccurred())
		obj := &unstructured.Unstructured{}
		Expect(yaml.Unmarshal(doc, &obj.Object)).To(Succeed(), string(doc))
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// manifestsFile parses a file of the repository.
func manifestsFile(path string) []*unstructured.Unstructured {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), path))
	Expect(err).NotTo(HaveOccurred())
	return manifests(string(data))
}

// kinds lists the objects as "Kind/name".
func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// find returns the one object of a kind and name among objs.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			found = append(found, o)
		}
	}
	Expect(found).To(HaveLen(1), "%s/%s among %v", kind, name, kinds(objs))
	return found[0]
}

// object is find's object converted to T.
func object[T any](objs []*unstructured.Unstructured, kind, name string) T {
	var typed T
	Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(find(objs, kind, name).Object, &typed)).To(Succeed())
	return typed
}

// normalized sorts rules and the lists within each, so that rule sets
// compare as sets: RBAC grants the same whatever the order.
func normalized(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, r := range rules {
		verbs := slices.Sorted(slices.Values(r.Verbs))
		if len(r.NonResourceURLs) > 0 {
			out = append(out, rbacv1.PolicyRule{NonResourceURLs: slices.Sorted(slices.Values(r.NonResourceURLs)), Verbs: verbs})
			continue
		}
		// One rule per group and resource: how rules are grouped grants
		// nothing.
		for _, group := range r.APIGroups {
			for _, resource := range r.Resources {
				out = append(out, rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource},
					ResourceNames: slices.Sorted(slices.Values(r.ResourceNames)), Verbs: verbs})
			}
		}
	}
	slices.SortFunc(out, func(a, b rbacv1.PolicyRule) int { return strings.Compare(a.String(), b.String()) })
	return out
}
