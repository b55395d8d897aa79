package image

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// WriteRoot writes files under dir, as a layer of them would unpack: the
// Dockerfile copies the base from there, so that both builds hold the same
// files. Ownership is set when the writer may set it (root, as in a build
// stage).
func WriteRoot(dir string, files []File) error {
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range sorted {
		target := filepath.Join(dir, f.Path)
		var err error
		switch {
		case f.Dir:
			err = os.MkdirAll(target, 0o755)
		case f.Link != "":
			err = os.Symlink(f.Link, target)
		default:
			err = os.WriteFile(target, f.Data, 0o600)
		}
		if err != nil {
			return err
		}
		if f.Link != "" {
			continue
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(target, f.UID, f.GID); err != nil {
				return err
			}
		}
		// Chmod after chown, which clears the sticky and set-id bits.
		if err := os.Chmod(target, FileMode(f.Mode)); err != nil {
			return err
		}
	}
	return nil
}

// FileMode is a tar header's mode as Go's: the permission bits and the
// sticky bit, which /tmp needs.
func FileMode(mode int64) os.FileMode {
	m := os.FileMode(mode & 0o777)
	if mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}
