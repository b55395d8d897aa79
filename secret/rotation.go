package secret

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"path/filepath"

	"github.com/fsnotify/fsnotify"
)

// Rotation: a mounted Secret's file changes when the Secret does. The
// kubelet swaps the files atomically, through a symlink in their directory,
// so the directory is watched, and the file read again on every event.
// Every new connection reads the file anyway; what a change adds is that the
// connections open now are replaced soon, not when they happen to close.

// Watch calls changed after the file's content has changed, until ctx
// ends. A URL given inline never changes.
func (s URLSource) Watch(ctx context.Context, log *slog.Logger, changed func()) error {
	if s.File == "" {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }()
	if err := w.Add(filepath.Dir(s.File)); err != nil {
		return err
	}
	last := s.digest()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			log.Warn("Watching a URL file failed; its change is seen at the next reconnect", "file", s.File, "error", err)
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			// A half-swapped directory reads as missing or empty: wait for
			// the event that completes it.
			if now := s.digest(); now != nil && string(now) != string(last) {
				last = now
				changed()
			}
		}
	}
}

// digest identifies the file's content without keeping the secret, or is
// nil while it cannot be read.
func (s URLSource) digest() []byte {
	url, err := s.Read()
	if err != nil {
		return nil
	}
	sum := sha256.Sum256([]byte(url))
	return sum[:]
}
