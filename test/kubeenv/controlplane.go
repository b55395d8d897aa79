// Package kubeenv starts Kubernetes for tests: envtest's control plane for the
// controller and packaging suites, and a local cluster whose pods run as
// processes for the end-to-end suite and make demo.
package kubeenv

import (
	"errors"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/spillway-io/spillway/test/testenv"
)

// StartControlPlane starts envtest's kube-apiserver and etcd, which
// hack/control-plane.sh builds, with Spillway's CRDs installed.
func StartControlPlane() (*envtest.Environment, *rest.Config, error) {
	return startControlPlane(crdDir())
}

// crdDir holds Spillway's CRDs as make manifests writes them.
func crdDir() string { return filepath.Join(testenv.RepoRoot(), "config", "crd", "bases") }

// StartEmptyControlPlane starts the control plane without Spillway's CRDs,
// for a suite that installs them the way a user does.
func StartEmptyControlPlane() (*envtest.Environment, *rest.Config, error) {
	return startControlPlane()
}

func startControlPlane(crdDirs ...string) (*envtest.Environment, *rest.Config, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, nil, errors.New("KUBEBUILDER_ASSETS is not set: make test sets it to the directory of the kube-apiserver and etcd that hack/control-plane.sh builds and prints")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
	}
	// Room for a thousand fleets' metrics Services (make bench-operator),
	// each with a cluster IP, as a cluster's range has: envtest's /24 holds
	// 254.
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", "10.0.0.0/16")
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, err
	}
	return env, cfg, nil
}

// Administrator is a user the API server lets do anything.
var Administrator = envtest.User{Name: "tester", Groups: []string{"system:masters"}}

// WriteKubeconfig writes a kubeconfig that authenticates as user into dir,
// for the command-line tools and processes a test runs, and returns its path.
func WriteKubeconfig(env *envtest.Environment, user envtest.User, dir string) (string, error) {
	authenticated, err := env.AddUser(user, nil)
	if err != nil {
		return "", err
	}
	config, err := authenticated.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig")
	return path, os.WriteFile(path, config, 0o600)
}
