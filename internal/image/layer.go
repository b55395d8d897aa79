// Package image builds Spillway's container image from Go alone, with
// go-containerregistry: no Docker engine, no daemon. What goes in is fixed
// by the commit (the binary's build, the base's files, the time stamps), so
// the same commit gives the same digest on any machine with the same Go.
package image

import (
	"archive/tar"
	"bytes"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of a layer: a directory, a symbolic link, or a regular
// file with its data.
type File struct {
	Path     string // absolute, in the image
	Mode     int64  // permission bits, with the sticky bit where it applies
	UID, GID int
	Dir      bool
	Link     string
	Data     []byte
}

// Layer is a layer of files, reproducible: entries sorted by path, every
// time stamp at mtime, no user or group names.
func Layer(files []File, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range sorted {
		hdr := &tar.Header{
			Name:    strings.TrimPrefix(path.Clean(f.Path), "/"),
			Mode:    f.Mode,
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: mtime.UTC().Truncate(time.Second),
			Format:  tar.FormatPAX,
		}
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Link
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// dirs are the directories that lead to each file, for a layer that holds
// files only: a tar without its parents' entries unpacks with whatever
// modes the unpacker picks.
func dirs(files []File) []File {
	seen := map[string]bool{"/": true}
	for _, f := range files {
		if f.Dir {
			seen[path.Clean(f.Path)] = true
		}
	}
	var out []File
	for _, f := range files {
		for d := path.Dir(path.Clean(f.Path)); !seen[d]; d = path.Dir(d) {
			seen[d] = true
			out = append(out, File{Path: d, Mode: 0o755, Dir: true})
		}
	}
	return out
}
