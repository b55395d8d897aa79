package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// StartControlPlane starts envtest's kube-apiserver and etcd, which
// hack/control-plane.sh builds, with Spillway's CRDs installed.
func StartControlPlane() (*envtest.Environment, *rest.Config, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, nil, errors.New("KUBEBUILDER_ASSETS is not set: make test sets it to the directory of the kube-apiserver and etcd that hack/control-plane.sh builds and prints")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, err
	}
	return env, cfg, nil
}

// UniqueObjectName is UniqueName as a legal Kubernetes object name.
func UniqueObjectName(prefix string) string {
	return strings.ReplaceAll(UniqueName(prefix), "_", "-")
}

// repoRoot is the repository's root, two levels above this file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
