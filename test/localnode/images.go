package localnode

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	spillwayimage "github.com/spillway-io/spillway/internal/image"
)

// image is a pulled image: its root file system unpacked on the node, and
// how it runs.
type image struct {
	// ID is the reference by digest, as a kubelet reports it in a
	// container's imageID: the repository and the digest the reference
	// resolved to (an index's, for a multi-platform image).
	ID     string
	Root   string
	Config v1.Config
	Size   int64 // compressed, as pulled
}

// imageStore pulls images from their registries and unpacks each root file
// system once per digest. Registries on the loopback are spoken to over
// plain HTTP, as go-containerregistry does by default.
type imageStore struct {
	dir string

	mu    sync.Mutex
	byRef map[string]*image // the last pull of each reference
	roots map[string]string // unpacked roots by the platform image's digest
}

func newImageStore(dir string) *imageStore {
	return &imageStore{dir: dir, byRef: map[string]*image{}, roots: map[string]string{}}
}

// present is an image pulled before, for a pull policy that reuses it.
func (s *imageStore) present(ref string) *image {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byRef[ref]
}

// pull resolves ref in its registry to this node's platform and unpacks
// the image unless its digest is unpacked already.
func (s *imageStore) pull(ctx context.Context, ref string) (*image, bool, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, false, fmt.Errorf("invalid image reference %q: %w", ref, err)
	}
	desc, err := remote.Get(r, remote.WithContext(ctx),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, false, err
	}
	img, err := desc.Image()
	if err != nil {
		return nil, false, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, false, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, false, err
	}
	size, _, err := spillwayimage.PullSize(img)
	if err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	root, unpacked := s.roots[digest.String()]
	if !unpacked {
		root = filepath.Join(s.dir, digest.Hex)
		if err := unpack(img, root); err != nil {
			return nil, false, fmt.Errorf("unpack %s: %w", ref, err)
		}
		s.roots[digest.String()] = root
	}
	pulled := &image{ID: r.Context().Digest(desc.Digest.String()).String(), Root: root, Config: cf.Config, Size: size}
	s.byRef[ref] = pulled
	return pulled, !unpacked, nil
}

// unpack writes the image's flattened file system into root, readable by
// every user (the containers run as others): into a temporary directory
// first, so that a failed unpack leaves nothing behind.
func unpack(img v1.Image, root string) error {
	tmp := root + ".unpacking"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	fs := mutate.Extract(img)
	defer fs.Close()
	tr := tar.NewReader(fs)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := unpackEntry(tmp, hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	return os.Rename(tmp, root)
}

func unpackEntry(root string, hdr *tar.Header, r io.Reader) error {
	rel := filepath.Clean("/" + hdr.Name)
	target := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	mode := spillwayimage.FileMode(hdr.Mode)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
	case tar.TypeReg:
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	case tar.TypeSymlink:
		return os.Symlink(hdr.Linkname, target)
	case tar.TypeLink:
		return os.Link(filepath.Join(root, filepath.Clean("/"+hdr.Linkname)), target)
	default:
		// Devices and FIFOs: a container gets its /dev from the node.
		return nil
	}
	if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	return os.Chmod(target, mode)
}

// imageUser is the UID and GID of the image's USER: numbers, or names that
// the image's /etc/passwd and /etc/group resolve. No USER is root.
func imageUser(img *image) (uid, gid int64, err error) {
	user, group, hasGroup := strings.Cut(img.Config.User, ":")
	if user == "" {
		return 0, 0, nil
	}
	uid, primary, err := lookUp(filepath.Join(img.Root, "etc/passwd"), user)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: %w", img.Config.User, err)
	}
	gid = primary
	if hasGroup {
		if gid, _, err = lookUp(filepath.Join(img.Root, "etc/group"), group); err != nil {
			return 0, 0, fmt.Errorf("image group %q: %w", img.Config.User, err)
		}
	}
	return uid, gid, nil
}

// lookUp finds a user (or group) by name or number in a passwd (or group)
// file: its ID, and for a user the primary group's. A number that the file
// does not list stands for itself, with group 0, as in Docker.
func lookUp(file, who string) (id, group int64, err error) {
	n, err := strconv.ParseInt(who, 10, 64)
	numeric := err == nil
	data, err := os.ReadFile(file)
	if err != nil && !(numeric && os.IsNotExist(err)) {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Split(line, ":")
		if len(fields) < 3 || (fields[0] != who && !(numeric && fields[2] == who)) {
			continue
		}
		id, _ = strconv.ParseInt(fields[2], 10, 64)
		group = id
		if len(fields) > 3 {
			group, _ = strconv.ParseInt(fields[3], 10, 64)
		}
		return id, group, nil
	}
	if numeric {
		return n, 0, nil
	}
	return 0, 0, fmt.Errorf("%q is not in the image's %s", who, filepath.Base(file))
}

// pullNeeded says whether a container's image must be resolved again in its
// registry, by its pull policy (the API server defaults it: Always for
// :latest and untagged references, IfNotPresent otherwise).
func pullNeeded(c corev1.Container) bool {
	return c.ImagePullPolicy == corev1.PullAlways
}
