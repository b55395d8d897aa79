package packaging

import (
	"archive/tar"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/testenv"
)

// makeImage runs make image's command into dir and returns its output.
func makeImage(dir string) string {
	cmd := exec.Command("go", "run", "./hack/image", "-version", "v0.0.0-spec", "-layout", dir)
	cmd.Dir = testenv.RepoRoot()
	cmd.Stderr = GinkgoWriter
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), string(out))
	GinkgoWriter.Print(string(out))
	return string(out)
}

// layoutIndex is the one index of an OCI layout.
func layoutIndex(dir string) v1.ImageIndex {
	path, err := layout.FromPath(dir)
	Expect(err).NotTo(HaveOccurred())
	top, err := path.ImageIndex()
	Expect(err).NotTo(HaveOccurred())
	m, err := top.IndexManifest()
	Expect(err).NotTo(HaveOccurred())
	Expect(m.Manifests).To(HaveLen(1))
	index, err := top.ImageIndex(m.Manifests[0].Digest)
	Expect(err).NotTo(HaveOccurred())
	return index
}

// entry is a file of a layer or a directory tree, as an image holds it.
type entry struct {
	Mode     int64
	UID, GID int
	Link     string
	SHA256   string
}

func layerEntries(l v1.Layer) map[string]entry {
	rc, err := l.Uncompressed()
	Expect(err).NotTo(HaveOccurred())
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		Expect(err).NotTo(HaveOccurred())
		sum := sha256.New()
		_, err = io.Copy(sum, tr)
		Expect(err).NotTo(HaveOccurred())
		e := entry{Mode: hdr.Mode & 0o7777, UID: hdr.Uid, GID: hdr.Gid, Link: hdr.Linkname}
		if hdr.Typeflag == tar.TypeReg {
			e.SHA256 = hex.EncodeToString(sum.Sum(nil))
		}
		out["/"+strings.TrimSuffix(hdr.Name, "/")] = e
	}
}

func treeEntries(root string) map[string]entry {
	out := map[string]entry{}
	Expect(filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		if err != nil || path == root {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		e := entry{Mode: int64(st.Mode & 0o7777), UID: int(st.Uid), GID: int(st.Gid)}
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			e.Link, err = os.Readlink(path)
		case info.Mode().IsRegular():
			var data []byte
			data, err = os.ReadFile(path)
			sum := sha256.Sum256(data)
			e.SHA256 = hex.EncodeToString(sum[:])
		}
		out[strings.TrimPrefix(path, root)] = e
		return err
	})).To(Succeed())
	return out
}

// finalStage is the Dockerfile's last stage: its base and instructions,
// continuation lines joined.
func finalStage() (from string, instructions []string) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Dockerfile"))
	Expect(err).NotTo(HaveOccurred())
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	var all []string
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			all = append(all, line)
		}
	}
	for _, line := range all {
		if strings.HasPrefix(line, "FROM ") {
			from, instructions = strings.Fields(line)[1], nil
			continue
		}
		instructions = append(instructions, line)
	}
	return from, instructions
}

// instruction is the arguments of the final stage's only instruction of
// this kind, or of every one.
func instruction(instructions []string, kind string) []string {
	var out []string
	for _, line := range instructions {
		if rest, ok := strings.CutPrefix(line, kind+" "); ok {
			out = append(out, strings.TrimSpace(rest))
		}
	}
	return out
}

var _ = Describe("The image (make image)", Ordered, func() {
	var built string
	BeforeAll(func() {
		built = GinkgoT().TempDir()
		makeImage(built)
	})

	It("is one index of linux/amd64 and linux/arm64, and a second build of the commit gives the same digest", func() {
		again := GinkgoT().TempDir()
		out := makeImage(again)
		first, err := layoutIndex(built).Digest()
		Expect(err).NotTo(HaveOccurred())
		second, err := layoutIndex(again).Digest()
		Expect(err).NotTo(HaveOccurred())
		Expect(second).To(Equal(first), "reproducible")
		Expect(out).To(ContainSubstring("image: " + first.String()))
		Expect(out).To(MatchRegexp(`linux/amd64\s+sha256:[0-9a-f]{64}\s+[0-9.]+ MiB in 2 layers`))
		Expect(out).To(MatchRegexp(`linux/arm64\s+sha256:[0-9a-f]{64}\s+[0-9.]+ MiB in 2 layers`))
		AddReportEntry("make image", out)
	})

	It("agrees with the Dockerfile on base, files, user, working directory, environment and entrypoint", func() {
		from, instructions := finalStage()
		Expect(from).To(Equal("scratch"), "both build on nothing but the base's files")
		copies := instruction(instructions, "COPY")
		Expect(copies).To(HaveLen(2))
		Expect(copies[0]).To(Equal("--from=build /out/rootfs/ /"), "the base's files first")
		binary := strings.Fields(copies[1])
		Expect(binary[:2]).To(Equal([]string{"--from=build", "/out/spillway"}))
		binaryPath := binary[2]

		index := layoutIndex(built)
		manifest, err := index.IndexManifest()
		Expect(err).NotTo(HaveOccurred())
		for _, d := range manifest.Manifests {
			img, err := index.Image(d.Digest)
			Expect(err).NotTo(HaveOccurred())
			cf, err := img.ConfigFile()
			Expect(err).NotTo(HaveOccurred())
			Expect(cf.OS + "/" + cf.Architecture).To(Equal(d.Platform.String()))
			Expect(instruction(instructions, "USER")).To(Equal([]string{cf.Config.User}))
			Expect(instruction(instructions, "WORKDIR")).To(Equal([]string{cf.Config.WorkingDir}))
			entrypoint, err := json.Marshal(cf.Config.Entrypoint)
			Expect(err).NotTo(HaveOccurred())
			Expect(instruction(instructions, "ENTRYPOINT")).To(Equal([]string{string(entrypoint)}))
			Expect(instruction(instructions, "ENV")).To(Equal([]string{strings.Join(cf.Config.Env, " ")}))
			Expect(cf.Config.Entrypoint).To(Equal([]string{binaryPath}), "the entrypoint is the binary the Dockerfile copies")

			layers, err := img.Layers()
			Expect(err).NotTo(HaveOccurred())
			Expect(layers).To(HaveLen(2))
			app := layerEntries(layers[1])
			Expect(app).To(HaveKey(binaryPath))
			Expect(app[binaryPath].Mode).To(BeEquivalentTo(0o755))

			// The Dockerfile's build stage writes the base with the same
			// command: the same paths, modes, owners and contents.
			rootfs := GinkgoT().TempDir()
			cmd := exec.Command("go", "run", "./hack/image", "-rootfs", rootfs)
			cmd.Dir = testenv.RepoRoot()
			out, err := cmd.CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), string(out))
			Expect(layerEntries(layers[0])).To(Equal(treeEntries(rootfs)))
		}
		dockerfile, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Dockerfile"))
		Expect(err).NotTo(HaveOccurred())
		var run []string
		for _, line := range strings.Split(string(dockerfile), "\n") {
			if strings.HasPrefix(line, "RUN go run ./hack/image") {
				run = append(run, line)
			}
		}
		Expect(run).To(Equal([]string{"RUN go run ./hack/image -rootfs /out/rootfs"}))
	})

	It("holds the CA bundle, the nonroot user and a /tmp anyone may write", func() {
		index := layoutIndex(built)
		img, err := index.Image(mustDigest(index, "linux/amd64"))
		Expect(err).NotTo(HaveOccurred())
		layers, err := img.Layers()
		Expect(err).NotTo(HaveOccurred())
		base := layerEntries(layers[0])
		Expect(base).To(HaveKey("/etc/ssl/certs/ca-certificates.crt"))
		bundle := filepath.Join(GinkgoT().TempDir(), "rootfs")
		cmd := exec.Command("go", "run", "./hack/image", "-rootfs", bundle)
		cmd.Dir = testenv.RepoRoot()
		Expect(cmd.Run()).To(Succeed())
		pem, err := os.ReadFile(filepath.Join(bundle, "etc/ssl/certs/ca-certificates.crt"))
		Expect(err).NotTo(HaveOccurred())
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM(pem)).To(BeTrue())
		Expect(strings.Count(string(pem), "BEGIN CERTIFICATE")).To(BeNumerically(">", 100), "Mozilla's roots")
		Expect(base["/tmp"].Mode).To(BeEquivalentTo(0o1777))
		Expect(base["/home/nonroot"]).To(Equal(entry{Mode: 0o700, UID: 65532, GID: 65532}))
		annotations := regexp.MustCompile(`^org\.opencontainers\.image\.(source|revision|version)$`)
		m, err := index.IndexManifest()
		Expect(err).NotTo(HaveOccurred())
		var found []string
		for k := range m.Annotations {
			if annotations.MatchString(k) {
				found = append(found, k)
			}
		}
		Expect(found).To(HaveLen(3), fmt.Sprint(m.Annotations))
		Expect(m.Annotations["org.opencontainers.image.version"]).To(Equal("v0.0.0-spec"))
	})
})

func mustDigest(index v1.ImageIndex, platform string) v1.Hash {
	m, err := index.IndexManifest()
	Expect(err).NotTo(HaveOccurred())
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.String() == platform {
			return d.Digest
		}
	}
	Fail("no " + platform + " image in the index")
	return v1.Hash{}
}
