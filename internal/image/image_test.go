package image

import (
	"archive/tar"
	"errors"
	"io"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func fakeBinary(p v1.Platform) ([]byte, error) { return []byte("spillway for " + p.Architecture), nil }

func release(created time.Time) Release {
	return Release{Version: "v1.2.3", Revision: "abc", Source: "https://example.com/spillway", Created: created}
}

// The same inputs give the same digest; the time stamps are the commit's.
func TestSpillwayIsReproducible(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	digest := func(r Release) v1.Hash {
		t.Helper()
		index, err := Spillway(r, Platforms, fakeBinary)
		if err != nil {
			t.Fatal(err)
		}
		d, err := index.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	first, second := digest(release(at)), digest(release(at))
	if first != second {
		t.Errorf("two builds of the same inputs: %s and %s", first, second)
	}
	if later := digest(release(at.Add(time.Second))); later == first {
		t.Errorf("another commit time gave the same digest %s", first)
	}
}

func TestSpillwayImages(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	index, err := Spillway(release(at), Platforms, fakeBinary)
	if err != nil {
		t.Fatal(err)
	}
	m, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 2 || m.Annotations["org.opencontainers.image.revision"] != "abc" {
		t.Fatalf("index: %d manifests, annotations %v", len(m.Manifests), m.Annotations)
	}
	for _, d := range m.Manifests {
		img, err := index.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != d.Platform.Architecture || cf.Config.User != User || cf.Config.Entrypoint[0] != BinaryPath || !cf.Created.Equal(at) {
			t.Errorf("%s: config %+v, created %s", d.Platform, cf.Config, cf.Created)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 2 {
			t.Fatalf("%s: %d layers, %v", d.Platform, len(layers), err)
		}
		files := entries(t, layers[1])
		if got := string(files[BinaryPath]); got != "spillway for "+d.Platform.Architecture {
			t.Errorf("%s: the binary is %q", d.Platform, got)
		}
	}
}

// A tool's links lead to its program, and the directories above come first.
func TestTool(t *testing.T) {
	img, err := Tool(v1.Platform{OS: "linux", Architecture: "amd64"}, "/bin/busybox", []byte("bb"), []string{"/bin/sh"}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name+"→"+hdr.Linkname)
	}
	want := []string{"bin/→", "bin/busybox→", "bin/sh→/bin/busybox"}
	if len(names) != len(want) {
		t.Fatalf("entries %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Errorf("entry %d: %q, want %q", i, names[i], want[i])
		}
	}
}

func entries(t *testing.T, l v1.Layer) map[string][]byte {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out["/"+hdr.Name] = data
	}
}
