package drainer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// columnsFlag parses --columns logical=physical,...
type columnsFlag struct{ c *outbox.Columns }

func (f columnsFlag) String() string { return "" }

func (f columnsFlag) Set(s string) error {
	for _, pair := range strings.Split(s, ",") {
		logical, physical, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return fmt.Errorf("%q: want logical=physical, e.g. id=event_id", pair)
		}
		if err := f.c.Set(logical, physical); err != nil {
			return err
		}
	}
	return nil
}

// windowFlag is an optional duration: unset keeps rows forever, and a zero
// or negative value reaches validation to be refused, not silently ignored.
type windowFlag struct{ d **time.Duration }

func (f windowFlag) String() string {
	if f.d == nil || *f.d == nil {
		return ""
	}
	return (*f.d).String()
}

func (f windowFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*f.d = &d
	return nil
}

// registerTableFlags binds the flags that name the outbox and its mapping,
// shared by drain and migrate.
func registerTableFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.Database.URL, "database-url", os.Getenv("DATABASE_URL"), "outbox database URL, for local use (default $DATABASE_URL)")
	fs.StringVar(&c.Database.File, "database-url-file", "", "file holding the database URL, re-read at every connect (a mounted secret)")
	fs.StringVar(&c.Table.Name, "table", c.Table.Name, "outbox table, as schema.table")
	fs.Var(columnsFlag{&c.Table.Columns}, "columns",
		"column mapping logical=physical, comma-separated; logical names: "+strings.Join(outbox.ColumnFlagNames(), ", "))
	fs.StringVar(&c.Table.RoutingKey.Column, "routing-key-column", "", "take the routing key from this column (default event_type)")
	fs.StringVar(&c.Table.RoutingKey.PayloadField, "routing-key-field", "", "take the routing key from this top-level field of a JSON payload")
	fs.StringVar(&c.Table.RoutingKey.Constant, "routing-key", "", "publish every row with this routing key")
	fs.StringVar(&c.Table.Ordering.KeyColumn, "ordering-key-column", "",
		"publish the rows of each value of this column (an aggregate's id) one at a time, in enqueue order (unset: no per-key order)")
}

// RegisterFlags binds every drain flag to c, whose values are the defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	registerTableFlags(fs, c)
	fs.StringVar(&c.DrainerID, "drainer-id", c.DrainerID, "drainer ID, stamped on claims (default $POD_NAME, then the hostname)")
	fs.StringVar(&c.Broker.URL, "broker-url", os.Getenv("BROKER_URL"), "AMQP URL of the broker, for local use (default $BROKER_URL)")
	fs.StringVar(&c.Broker.File, "broker-url-file", "", "file holding the AMQP URL, re-read at every reconnect (a mounted secret)")
	fs.StringVar(&c.Broker.Exchange, "exchange", c.Broker.Exchange, "exchange to publish to (required, unless --mandatory publishes to the default exchange)")
	fs.BoolVar(&c.Broker.Mandatory, "mandatory", c.Broker.Mandatory, "publish mandatory: an unroutable row counts a failed attempt")
	fs.BoolVar(&c.Broker.DeclareExchange, "declare-exchange", c.Broker.DeclareExchange, "declare the exchange (durable) on connect")
	fs.StringVar(&c.Broker.ExchangeType, "exchange-type", c.Broker.ExchangeType, "exchange type for --declare-exchange")
	fs.IntVar(&c.BatchSize, "batch-size", c.BatchSize, "rows per claim")
	fs.IntVar(&c.PipelineDepth, "pipeline-depth", c.PipelineDepth, "publisher confirms in flight at most")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "how long a claim is held before another drainer may take it over")
	fs.DurationVar(&c.PollInterval, "poll-interval", c.PollInterval, "wait between claims when the outbox is drained")
	fs.DurationVar(&c.WakeCoalesce, "wake-coalesce", c.WakeCoalesce,
		"least time between the starts of claims woken by notifications, so that a stream of commits shares claims; a notification after a quiet spell is claimed at once (0: claim at every notification)")
	fs.DurationVar(&c.ConfirmTimeout, "confirm-timeout", c.ConfirmTimeout, "deadline of one publisher confirm (0: a third of --lease-ttl)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", c.MaxAttempts, "failed attempts after which a row is poisoned")
	fs.DurationVar(&c.RetryInitial, "retry-initial", c.RetryInitial, "backoff after a row's first failure")
	fs.DurationVar(&c.RetryMax, "retry-max", c.RetryMax, "cap of the exponential retry backoff")
	fs.Int64Var(&c.MaxPayloadBytes, "max-payload-bytes", c.MaxPayloadBytes, "larger payloads are not loaded and fail the row")
	fs.Int64Var(&c.MaxClaimBytes, "max-claim-bytes", c.MaxClaimBytes,
		"a claim stops at the first row whose payload would take it over this many bytes; a larger row is claimed alone")
	fs.Int64Var(&c.MaxPipelineBytes, "max-pipeline-bytes", c.MaxPipelineBytes,
		"payload bytes published and awaiting their confirm, at most; a larger message is published alone")
	fs.Func("message-properties", `AMQP properties beside message_id, delivery mode, content type and headers: full (also the enqueue time as timestamp, the routing key as type, spillway as app_id) or compact (none: with a uuid id, RabbitMQ spends 7–20 % less CPU per message) (default "full")`,
		func(v string) error { c.Broker.MessageProperties = MessageProperties(v); return nil })
	fs.StringVar(&c.ContentType, "content-type", c.ContentType, "message content type (default from the payload column's type)")
	fs.BoolVar(&c.SynchronousCommit, "synchronous-commit", c.SynchronousCommit,
		"commit claims and settles synchronously (off: the application's commits do not queue behind the drainer's WAL flushes)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout,
		"on SIGTERM, how long to wait for confirms in flight, settle them and release the rest")
	fs.Var(windowFlag{&c.Retention.Published}, "retention-published", "delete published rows this long after publishing; 0s deletes each row once its publish is confirmed (unset: keep)")
	fs.Var(windowFlag{&c.Retention.UnpublishedMaxAge}, "retention-unpublished-max-age",
		"delete rows never published this long after enqueued_at, poisoned ones included (unset: keep)")
	fs.DurationVar(&c.Retention.Interval, "retention-interval", c.Retention.Interval, "pause between retention runs")
	fs.StringVar(&c.Table.Ordering.OnFailure, "ordering-on-failure", "",
		"with --ordering-key-column, what a failed row does to its key: block (the later rows wait for it; the default) or skip (it is poisoned at once, and they go on)")
	fs.Float64Var(&c.MaxRate, "max-rate", c.MaxRate,
		"events per second that all the drainers of the table publish together, at most, each taking an equal share (0: no cap)")
	fs.DurationVar(&c.MaxCommitLatency, "max-commit-latency", c.MaxCommitLatency,
		"slow the drain down while a commit on the database takes longer than this, as timed on one settle every 100ms committed synchronously (0: off)")
}

func defaultDrainerID() string {
	if id := os.Getenv("POD_NAME"); id != "" {
		return id
	}
	host, _ := os.Hostname()
	return host
}

func newFlagSet(cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	return fs
}

// ParseDrainFlags turns the arguments of `spillway drain` into a checked
// config and the address of the metrics and probes. The operator's
// Deployment builder is tested against it.
func ParseDrainFlags(args []string) (cfg Config, httpAddr string, err error) {
	cfg = DefaultConfig()
	cfg.DrainerID = defaultDrainerID()
	fs := newFlagSet(&cfg)
	fs.StringVar(&httpAddr, "metrics-addr", ":8080", "listen address of /metrics, /healthz and /readyz (empty: off)")
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	return cfg, httpAddr, cfg.Validate()
}

// DrainCommand is `spillway drain`.
func DrainCommand(ctx context.Context, args []string) error {
	cfg, httpAddr, err := ParseDrainFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(NewLogHandler(os.Stderr)).With("drainer", cfg.DrainerID)
	gcPercent, memoryLimit := TuneGC(cfg)
	pool, err := outbox.ConnectPool(ctx, cfg.Database, cfg.DrainerID, cfg.SynchronousCommit)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := openStoreRetrying(ctx, pool, cfg.Table, log)
	if ctx.Err() != nil {
		return nil // stopped before it started
	}
	if err != nil {
		return err
	}
	for _, note := range store.Notes() {
		log.Warn(note)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d, err := New(cfg, store, NewMetrics(reg), log)
	if err != nil {
		return err
	}
	if httpAddr != "" {
		srv := &http.Server{Addr: httpAddr, Handler: probeMux(reg, d), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server stopped", "addr", httpAddr, "error", err)
			}
		}()
		defer srv.Close()
	}
	log.Info("Drainer started", "table", store.Table().Name(),
		"database", secret.RedactURL(cfg.Database.URL), "databaseFile", cfg.Database.File,
		"broker", secret.RedactURL(cfg.Broker.URL), "brokerFile", cfg.Broker.File, "exchange", cfg.Broker.Exchange,
		"gcPercent", gcPercent, "memoryLimitBytes", memoryLimit)
	return d.Run(ctx)
}

// probeMux serves the metrics and the probes on one port: /healthz says the
// process is alive, /readyz that it can drain.
func probeMux(reg *prometheus.Registry, d *Drainer) *http.ServeMux {
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

// openStoreRetrying opens the store, waiting out a database that is not up
// yet. A table that does not fit the mapping, or that migrate has not made
// drainable, is a permanent error.
func openStoreRetrying(ctx context.Context, pool *pgxpool.Pool, spec outbox.TableSpec, log *slog.Logger) (*outbox.Store, error) {
	return retry(ctx, log, "Database unavailable at start; retrying", func() (*outbox.Store, error) {
		store, err := outbox.OpenStore(ctx, pool, spec)
		if unusable := (*outbox.UnusableTableError)(nil); errors.As(err, &unusable) {
			return nil, backoff.Permanent(err)
		}
		return store, err
	})
}

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

// MigrateCommand is `spillway migrate`.
func MigrateCommand(ctx context.Context, args []string) error {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	registerTableFlags(fs, &cfg)
	notify := fs.Bool("notify", false, "install a statement-level insert trigger that wakes drainers at once (NOTIFY takes a database-wide lock at commit: see README)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if errs := cfg.Database.Validate(field.NewPath("database"), "the outbox database's connection URL"); len(errs) > 0 {
		return errs.ToAggregate()
	}
	pool, err := outbox.ConnectPool(ctx, cfg.Database, "migrate", true)
	if err != nil {
		return err
	}
	defer pool.Close()
	done, err := outbox.Migrate(ctx, pool, cfg.Table)
	if err != nil {
		return err
	}
	if *notify {
		installed, err := outbox.InstallNotifyTrigger(ctx, pool, cfg.Table)
		if err != nil {
			return err
		}
		if installed {
			done = append(done, "created trigger "+cfg.Table.NotifyTrigger()+" notifying "+cfg.Table.NotifyChannel())
		}
	}
	if len(done) == 0 {
		fmt.Printf("%s is up to date\n", cfg.Table.Name)
	}
	for _, step := range done {
		fmt.Println(step)
	}
	return nil
}
