package image

import (
	"fmt"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the Dockerfile puts the binary, and how it runs it.
const BinaryPath = "/usr/local/bin/spillway"

// Entrypoint is the image's, and the Dockerfile's.
var Entrypoint = []string{BinaryPath}

// pathEnv is the PATH of every image built here.
const pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Env is the image's environment. SSL_CERT_FILE points libraries that do
// not look in CABundle's place at it.
var Env = []string{pathEnv, "SSL_CERT_FILE=" + CABundle}

// Platforms are the ones `make image` builds.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// Release is what the OCI annotations say of a build.
type Release struct {
	Version  string
	Revision string // the commit
	Source   string // the repository's URL
	// Created is the commit's time: every time stamp of the image.
	Created time.Time
}

func (r Release) annotations() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "spillway",
		"org.opencontainers.image.description": "Spillway: the operator of transactional-outbox drainer fleets, and its drainers",
		"org.opencontainers.image.source":      r.Source,
		"org.opencontainers.image.revision":    r.Revision,
		"org.opencontainers.image.version":     r.Version,
		"org.opencontainers.image.created":     r.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.base.name":   "scratch",
	}
}

// Binary compiles spillway for a platform.
type Binary func(v1.Platform) ([]byte, error)

// Spillway is the image of the operator and its drainers: one image per
// platform, the base's layer and the binary's, under one index.
func Spillway(r Release, platforms []v1.Platform, build Binary) (v1.ImageIndex, error) {
	base, err := Layer(Base(), r.Created)
	if err != nil {
		return nil, err
	}
	index := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		bin, err := build(p)
		if err != nil {
			return nil, fmt.Errorf("build spillway for %s: %w", p, err)
		}
		app, err := Layer([]File{
			{Path: "/usr", Mode: 0o755, Dir: true},
			{Path: "/usr/local", Mode: 0o755, Dir: true},
			{Path: "/usr/local/bin", Mode: 0o755, Dir: true},
			{Path: BinaryPath, Mode: 0o755, Data: bin},
		}, r.Created)
		if err != nil {
			return nil, err
		}
		img, err := Assemble(p, []v1.Layer{base, app}, v1.Config{
			Entrypoint: Entrypoint,
			User:       User,
			WorkingDir: Home,
			Env:        Env,
			Labels:     r.annotations(),
		}, r.Created)
		if err != nil {
			return nil, err
		}
		img = mutate.Annotations(img, r.annotations()).(v1.Image)
		index = mutate.AppendManifests(index, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	return mutate.Annotations(index, r.annotations()).(v1.ImageIndex), nil
}

// Tool is an image of one static program, its entrypoint, with symbolic
// links to it (a busybox's applets), for the tools the local cluster's pods
// run beside Spillway: the chart's helm test runs kubectl. It runs as root
// unless the pod says otherwise.
func Tool(p v1.Platform, program string, data []byte, links []string, created time.Time) (v1.Image, error) {
	files := []File{{Path: program, Mode: 0o755, Data: data}}
	for _, l := range links {
		files = append(files, File{Path: l, Mode: 0o777, Link: program})
	}
	layer, err := Layer(append(dirs(files), files...), created)
	if err != nil {
		return nil, err
	}
	return Assemble(p, []v1.Layer{layer}, v1.Config{Entrypoint: []string{program}, Env: []string{pathEnv}}, created)
}

// Assemble is an OCI image of layers, run as config says.
func Assemble(p v1.Platform, layers []v1.Layer, config v1.Config, created time.Time) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = config
	cf.Created = v1.Time{Time: created.UTC()}
	// No history: each entry would carry a time and a command, and a layer
	// built from Go has no command to show.
	cf.History = nil
	return mutate.ConfigFile(img, cf)
}

// PullSize is what a node downloads for img: its manifest, its config and
// its compressed layers; and the number of layers.
func PullSize(img v1.Image) (int64, int, error) {
	manifest, err := img.Manifest()
	if err != nil {
		return 0, 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, 0, err
	}
	size := int64(len(raw)) + manifest.Config.Size
	for _, l := range manifest.Layers {
		size += l.Size
	}
	return size, len(manifest.Layers), nil
}
