package drainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spillway-io/spillway/outbox"
)

// This file holds what a drainer process shows the world and how it opens
// its outbox: its log format, its HTTP endpoints, its store.

// NewLogHandler is the drainer's JSON log handler. Durations print as Go
// durations ("1.5s"), not as integer nanoseconds.
func NewLogHandler(w io.Writer) slog.Handler {
	return slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			return slog.String(a.Key, a.Value.Duration().String())
		}
		return a
	}})
}

// Handler serves the metrics in reg and the probes on one port: /healthz
// says the process is alive, /readyz that it can drain.
func (d *Drainer) Handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.Alive(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := d.Ready(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Open connects to the outbox database as cfg says, and opens its table,
// waiting out a database that is not up yet. A table that does not fit the
// mapping, or that migrate has not made drainable, is a permanent error.
// close closes the store's connections.
func Open(ctx context.Context, cfg Config, log *slog.Logger) (store *outbox.Store, close func(), err error) {
	pool, opts, closeAll, err := outbox.ConnectDrainer(ctx, cfg.Database, cfg.Pooling, cfg.DrainerID, cfg.SynchronousCommit)
	if err != nil {
		return nil, nil, err
	}
	store, err = retry(ctx, log, "Database unavailable at start; retrying", func() (*outbox.Store, error) {
		store, err := outbox.OpenStore(ctx, pool, cfg.Table, opts...)
		if unusable := (*outbox.UnusableTableError)(nil); errors.As(err, &unusable) {
			return nil, backoff.Permanent(err)
		}
		return store, err
	})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return store, closeAll, nil
}
