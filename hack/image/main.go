// Command image builds Spillway's image for linux/amd64 and linux/arm64 as
// one OCI index, with no Docker engine (internal/image), and writes it as an
// OCI layout, pushes it to a registry, or both. It prints the digest, the
// size and the platforms. With -rootfs it writes the base's files to a
// directory instead, for the Dockerfile to copy.
//
//	go run ./hack/image -version v0.4.0 -layout bin/image [-push registry/spillway-io/spillway:v0.4.0]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/spillway-io/spillway/internal/image"
)

const source = "https://github.com/spillway-io/spillway"

func main() {
	var (
		version   = flag.String("version", "dev", "the release's version: the binary's and the image's annotation")
		layoutDir = flag.String("layout", "", "write the index as an OCI layout into this directory (replaced)")
		push      = flag.String("push", "", "push the index to this reference (registry/repository:tag)")
		platforms = flag.String("platforms", "linux/amd64,linux/arm64", "the platforms, comma-separated")
		rootfs    = flag.String("rootfs", "", "write the base's files into this directory and exit")
	)
	flag.Parse()
	if err := run(*version, *layoutDir, *push, *platforms, *rootfs); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(version, layoutDir, push, platformList, rootfs string) error {
	if rootfs != "" {
		return image.WriteRoot(rootfs, image.Base())
	}
	if layoutDir == "" && push == "" {
		return fmt.Errorf("nothing to do: name -layout, -push or both")
	}
	var platforms []v1.Platform
	for _, s := range strings.Split(platformList, ",") {
		p, err := v1.ParsePlatform(s)
		if err != nil {
			return fmt.Errorf("-platforms %q: %w", s, err)
		}
		platforms = append(platforms, *p)
	}
	release, err := gitRelease(version)
	if err != nil {
		return err
	}
	start := time.Now()
	index, err := image.Spillway(release, platforms, compile(version))
	if err != nil {
		return err
	}
	if layoutDir != "" {
		if err := os.RemoveAll(layoutDir); err != nil {
			return err
		}
		p, err := layout.Write(layoutDir, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendIndex(index, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": version,
		})); err != nil {
			return fmt.Errorf("write the layout: %w", err)
		}
	}
	if push != "" {
		ref, err := name.ParseReference(push)
		if err != nil {
			return fmt.Errorf("-push %q: %w", push, err)
		}
		if err := remote.WriteIndex(ref, index); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
	}
	return report(index, layoutDir, push, time.Since(start))
}

// gitRelease reads the commit and its time: the time stamp of every file,
// so that a rebuild of the commit is identical.
func gitRelease(version string) (image.Release, error) {
	rev, err := git("rev-parse", "HEAD")
	if err != nil {
		return image.Release{}, err
	}
	when, err := git("log", "-1", "--format=%ct")
	if err != nil {
		return image.Release{}, err
	}
	secs, err := strconv.ParseInt(when, 10, 64)
	if err != nil {
		return image.Release{}, fmt.Errorf("commit time %q: %w", when, err)
	}
	return image.Release{Version: version, Revision: rev, Source: source, Created: time.Unix(secs, 0)}, nil
}

func git(args ...string) (string, error) {
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// compile builds the static binary as the Dockerfile does: no cgo, no file
// system paths, the version stamped in.
func compile(version string) image.Binary {
	return func(p v1.Platform) ([]byte, error) {
		dir, err := os.MkdirTemp("", "spillway-image")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "spillway")
		fmt.Fprintf(os.Stderr, "image: building spillway for %s\n", p)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", out, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, err
		}
		return os.ReadFile(out)
	}
}

// report prints the index's digest and each platform's image with its size:
// the compressed bytes a node pulls (manifest, config and layers).
func report(index v1.ImageIndex, layoutDir, push string, took time.Duration) error {
	digest, err := index.Digest()
	if err != nil {
		return err
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		return err
	}
	fmt.Printf("image: %s (built in %s)\n", digest, took.Round(100*time.Millisecond))
	for _, d := range manifest.Manifests {
		img, err := index.Image(d.Digest)
		if err != nil {
			return err
		}
		size, layers, err := image.PullSize(img)
		if err != nil {
			return err
		}
		fmt.Printf("  %-12s %s  %.1f MiB in %d layers\n", d.Platform, d.Digest, float64(size)/(1<<20), layers)
	}
	if layoutDir != "" {
		fmt.Printf("  written to %s\n", layoutDir)
	}
	if push != "" {
		fmt.Printf("  pushed to %s\n", push)
	}
	return nil
}
