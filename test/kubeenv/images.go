package kubeenv

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/spillway-io/spillway/internal/image"
	"github.com/spillway-io/spillway/test/testenv"
)

// Images are what the local cluster's registry serves, each by digest.
type Images struct {
	// Registry is the registry's address (host:port), on the loopback.
	Registry string
	// Spillway is the image make image built (ImageLayout).
	Spillway string
	// Kubectl is the cluster's kubectl as an image: the chart's helm test
	// runs it.
	Kubectl string
	// Shell is the static busybox as an image, for the node's own specs.
	Shell string
	// Revision is the commit Spillway's image was built from.
	Revision string
}

// Repository is the repository of Spillway's image in the cluster's
// registry, and Digest its digest, as the chart's image.repository and
// image.digest take them.
func (i Images) Repository() string { return i.Registry + "/spillway-io/spillway" }

// ImageLayout is the OCI layout of Spillway's image that make image writes
// (bin/image), which SPILLWAY_IMAGE_LAYOUT names.
func ImageLayout() (string, error) {
	dir := os.Getenv("SPILLWAY_IMAGE_LAYOUT")
	if dir == "" {
		dir = filepath.Join(testenv.RepoRoot(), "bin", "image")
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return "", fmt.Errorf("no image in %s: run make image, which builds it (make test does)", dir)
	}
	return dir, nil
}

// startRegistry serves an in-process registry on the loopback until the
// returned function stops it.
func startRegistry() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{
		Handler:           registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
	return ln.Addr().String(), stop, nil
}

// pushImages loads the layout and the tools into the registry.
func pushImages(ctx context.Context, reg, imageLayout, assets string) (Images, error) {
	imgs := Images{Registry: reg}
	var err error
	if imgs.Spillway, imgs.Revision, err = pushLayout(ctx, imgs.Repository(), imageLayout); err != nil {
		return imgs, fmt.Errorf("push Spillway's image from %s: %w", imageLayout, err)
	}
	if imgs.Kubectl, err = pushTool(ctx, reg+"/kubectl", filepath.Join(assets, "kubectl"), "/usr/local/bin/kubectl"); err != nil {
		return imgs, fmt.Errorf("push kubectl's image: %w", err)
	}
	if imgs.Shell, err = pushTool(ctx, reg+"/busybox", "/bin/busybox", "/bin/busybox",
		"/bin/sh", "/bin/id", "/bin/cat", "/bin/stat", "/bin/grep", "/bin/ls", "/bin/touch", "/bin/sleep", "/bin/echo", "/bin/test", "/bin/true"); err != nil {
		return imgs, fmt.Errorf("push the shell's image (the package busybox-static, which make test installs): %w", err)
	}
	return imgs, nil
}

// pushLayout pushes the layout's one index, under the tag its ref.name
// annotation gives, and returns its reference by digest and the commit it
// was built from.
func pushLayout(ctx context.Context, repo, dir string) (string, string, error) {
	path, err := layout.FromPath(dir)
	if err != nil {
		return "", "", err
	}
	top, err := path.ImageIndex()
	if err != nil {
		return "", "", err
	}
	manifest, err := top.IndexManifest()
	if err != nil {
		return "", "", err
	}
	if len(manifest.Manifests) != 1 {
		return "", "", fmt.Errorf("the layout holds %d entries, not one index", len(manifest.Manifests))
	}
	entry := manifest.Manifests[0]
	index, err := top.ImageIndex(entry.Digest)
	if err != nil {
		return "", "", err
	}
	tag := entry.Annotations["org.opencontainers.image.ref.name"]
	if tag == "" {
		tag = "latest"
	}
	ref, err := name.ParseReference(repo + ":" + tag)
	if err != nil {
		return "", "", err
	}
	if err := remote.WriteIndex(ref, index, remote.WithContext(ctx)); err != nil {
		return "", "", err
	}
	indexManifest, err := index.IndexManifest()
	if err != nil {
		return "", "", err
	}
	return repo + "@" + entry.Digest.String(), indexManifest.Annotations["org.opencontainers.image.revision"], nil
}

// pushTool pushes an image of one static program, with links to it, for
// this machine's platform, and returns its reference by digest.
func pushTool(ctx context.Context, repo, binary, program string, links ...string) (string, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}
	img, err := image.Tool(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}, program, data, links, time.Unix(0, 0))
	if err != nil {
		return "", err
	}
	ref, err := name.ParseReference(repo + ":local")
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	return repo + "@" + digest.String(), nil
}
