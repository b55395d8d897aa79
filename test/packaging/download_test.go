package packaging

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/testenv"
)

// releases is a release host of hack/download.sh's layout: envtest's index
// and tarball, dl.k8s.io's binaries and checksums, get.helm.sh's tarball.
type releases struct {
	files map[string][]byte
	srv   *httptest.Server
}

func tarGz(files map[string]string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, content := range files {
		Expect(tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg})).To(Succeed())
		_, err := tw.Write([]byte(content))
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(tw.Close()).To(Succeed())
	Expect(gz.Close()).To(Succeed())
	return buf.Bytes()
}

func newReleases(version string) *releases {
	r := &releases{files: map[string][]byte{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		data, ok := r.files[req.URL.Path]
		if !ok {
			http.NotFound(w, req)
			return
		}
		_, _ = w.Write(data)
	}))
	arch := runtime.GOARCH
	envtest := fmt.Sprintf("envtest-%s-linux-%s.tar.gz", version, arch)
	tarball := tarGz(map[string]string{
		"controller-tools/envtest/etcd":           "#!/bin/sh\necho etcd\n",
		"controller-tools/envtest/kube-apiserver": "#!/bin/sh\necho kube-apiserver\n",
		"controller-tools/envtest/kubectl":        "#!/bin/sh\necho envtest kubectl\n",
	})
	sum := sha512.Sum512(tarball)
	r.files["/envtest/"+envtest] = tarball
	r.files["/envtest-releases.yaml"] = []byte(fmt.Sprintf("releases:\n  %s:\n    %s:\n      hash: %s\n      selfLink: %s/envtest/%s\n",
		version, envtest, hex.EncodeToString(sum[:]), r.srv.URL, envtest))
	for _, b := range []string{"kube-controller-manager", "kube-scheduler", "kubectl"} {
		data := []byte("#!/bin/sh\necho " + b + "\n")
		sum := sha256.Sum256(data)
		path := fmt.Sprintf("/k8s/%s/bin/linux/%s/%s", version, arch, b)
		r.files[path] = data
		r.files[path+".sha256"] = []byte(hex.EncodeToString(sum[:]))
	}
	return r
}

// run runs hack/download.sh against the server.
func (r *releases) run(args ...string) (string, error) {
	cmd := exec.Command("hack/download.sh", args...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(),
		"ENVTEST_RELEASES="+r.srv.URL+"/envtest-releases.yaml",
		"KUBERNETES_RELEASES="+r.srv.URL+"/k8s",
		"HELM_RELEASES="+r.srv.URL+"/helm")
	out, err := cmd.CombinedOutput()
	GinkgoWriter.Printf("$ hack/download.sh %s\n%s", strings.Join(args, " "), out)
	return string(out), err
}

var _ = Describe("hack/download.sh, the fast first run where release downloads are reachable", func() {
	const version = "v1.37.2"
	var r *releases
	BeforeEach(func() {
		r = newReleases(version)
		DeferCleanup(r.srv.Close)
	})

	It("installs envtest's etcd and kube-apiserver and dl.k8s.io's controller-manager, scheduler and kubectl, each checked against its published checksum", func() {
		dir := filepath.Join(GinkgoT().TempDir(), "control-plane")
		out, err := r.run("control-plane", version, dir)
		Expect(err).NotTo(HaveOccurred(), out)
		for b, says := range map[string]string{
			"etcd": "etcd", "kube-apiserver": "kube-apiserver", "kube-controller-manager": "kube-controller-manager",
			"kube-scheduler": "kube-scheduler", "kubectl": "kubectl",
		} {
			got, err := exec.Command(filepath.Join(dir, b)).Output()
			Expect(err).NotTo(HaveOccurred(), b)
			Expect(strings.TrimSpace(string(got))).To(Equal(says), "dl.k8s.io's kubectl replaces envtest's")
		}
	})

	It("installs nothing when a checksum does not match, or a host cannot be reached, so that make builds instead", func() {
		path := fmt.Sprintf("/k8s/%s/bin/linux/%s/kube-scheduler", version, runtime.GOARCH)
		r.files[path] = []byte("#!/bin/sh\necho tampered\n")
		dir := filepath.Join(GinkgoT().TempDir(), "control-plane")
		out, err := r.run("control-plane", version, dir)
		Expect(err).To(HaveOccurred())
		Expect(out).To(MatchRegexp(`kube-scheduler: sha256 [0-9a-f]{64}, but the release publishes [0-9a-f]{64}`))
		_, err = os.Stat(dir)
		Expect(os.IsNotExist(err)).To(BeTrue(), "no binary lands until every one is checked")

		helm := filepath.Join(GinkgoT().TempDir(), "helm")
		out, err = r.run("helm", "v3.22.0", helm)
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("cannot fetch " + r.srv.URL + "/helm/helm-v3.22.0-linux-" + runtime.GOARCH + ".tar.gz"))
		_, err = os.Stat(helm)
		Expect(os.IsNotExist(err)).To(BeTrue())
	})

	It("installs helm from its release tarball, checked against its .sha256sum", func() {
		tarball := tarGz(map[string]string{"linux-" + runtime.GOARCH + "/helm": "#!/bin/sh\necho helm\n"})
		sum := sha256.Sum256(tarball)
		name := "/helm/helm-v3.22.0-linux-" + runtime.GOARCH + ".tar.gz"
		r.files[name] = tarball
		r.files[name+".sha256sum"] = []byte(hex.EncodeToString(sum[:]) + "  helm-v3.22.0-linux-" + runtime.GOARCH + ".tar.gz\n")
		helm := filepath.Join(GinkgoT().TempDir(), "bin", "helm-v3.22.0")
		out, err := r.run("helm", "v3.22.0", helm)
		Expect(err).NotTo(HaveOccurred(), out)
		got, err := exec.Command(helm).Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(string(got))).To(Equal("helm"))
	})
})
