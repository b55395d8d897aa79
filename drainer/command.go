package drainer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// columnsFlag parses --columns logical=physical,...
type columnsFlag struct{ c *Columns }

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

// registerTableFlags binds the flags that name the outbox and its mapping,
// shared by drain and migrate.
func registerTableFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "outbox database URL (default $DATABASE_URL)")
	fs.StringVar(&c.Table.Name, "table", c.Table.Name, "outbox table, as schema.table")
	fs.Var(columnsFlag{&c.Table.Columns}, "columns",
		"column mapping logical=physical, comma-separated; logical names: "+strings.Join(ColumnFlagNames(), ", "))
	fs.StringVar(&c.Table.RoutingKey.Column, "routing-key-column", "", "take the routing key from this column (default event_type)")
	fs.StringVar(&c.Table.RoutingKey.PayloadField, "routing-key-field", "", "take the routing key from this top-level field of a JSON payload")
	fs.StringVar(&c.Table.RoutingKey.Constant, "routing-key", "", "publish every row with this routing key")
}

// RegisterFlags binds every drain flag to c, whose values are the defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	registerTableFlags(fs, c)
	fs.StringVar(&c.DrainerID, "drainer-id", c.DrainerID, "drainer ID, stamped on claims (default $POD_NAME, then the hostname)")
	fs.StringVar(&c.Broker.URL, "broker-url", os.Getenv("BROKER_URL"), "AMQP URL of the broker (default $BROKER_URL)")
	fs.StringVar(&c.Broker.Exchange, "exchange", c.Broker.Exchange, "exchange to publish to")
	fs.BoolVar(&c.Broker.Mandatory, "mandatory", c.Broker.Mandatory, "publish mandatory: an unroutable row counts a failed attempt")
	fs.BoolVar(&c.Broker.DeclareExchange, "declare-exchange", c.Broker.DeclareExchange, "declare the exchange (durable) on connect")
	fs.StringVar(&c.Broker.ExchangeType, "exchange-type", c.Broker.ExchangeType, "exchange type for --declare-exchange")
	fs.IntVar(&c.BatchSize, "batch-size", c.BatchSize, "rows per claim")
	fs.IntVar(&c.PipelineDepth, "pipeline-depth", c.PipelineDepth, "publisher confirms in flight at most")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "how long a claim is held before another drainer may take it over")
	fs.DurationVar(&c.PollInterval, "poll-interval", c.PollInterval, "wait between claims when the outbox is drained")
	fs.DurationVar(&c.ConfirmTimeout, "confirm-timeout", c.ConfirmTimeout, "deadline of one publisher confirm (0: a third of --lease-ttl)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", c.MaxAttempts, "failed attempts after which a row is poisoned")
	fs.DurationVar(&c.RetryInitial, "retry-initial", c.RetryInitial, "backoff after a row's first failure")
	fs.DurationVar(&c.RetryMax, "retry-max", c.RetryMax, "cap of the exponential retry backoff")
	fs.Int64Var(&c.MaxPayloadBytes, "max-payload-bytes", c.MaxPayloadBytes, "larger payloads are not loaded and fail the row")
	fs.StringVar(&c.ContentType, "content-type", c.ContentType, "message content type (default from the payload column's type)")
	fs.BoolVar(&c.SynchronousCommit, "synchronous-commit", c.SynchronousCommit,
		"commit claims and settles synchronously (off: the application's commits do not queue behind the drainer's WAL flushes)")
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

// DrainCommand is `spillway drain`.
func DrainCommand(ctx context.Context, args []string) error {
	cfg := DefaultConfig()
	cfg.DrainerID = defaultDrainerID()
	fs := newFlagSet(&cfg)
	metricsAddr := fs.String("metrics-addr", ":8080", "listen address of /metrics (empty: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	pool, err := ConnectPool(ctx, cfg.DatabaseURL, cfg.DrainerID, cfg.SynchronousCommit)
	if err != nil {
		return redactError(err, cfg.DatabaseURL)
	}
	defer pool.Close()
	store, err := OpenStore(ctx, pool, cfg.Table)
	if err != nil {
		return redactError(err, cfg.DatabaseURL)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d, err := New(cfg, store, NewMetrics(reg), log)
	if err != nil {
		return err
	}
	if *metricsAddr != "" {
		srv := &http.Server{Addr: *metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("Metrics server stopped", "error", err)
			}
		}()
		defer srv.Close()
	}
	log.Info("Drainer started", "drainer", cfg.DrainerID, "table", store.Table().Name(),
		"database", RedactURL(cfg.DatabaseURL), "broker", RedactURL(cfg.Broker.URL), "exchange", cfg.Broker.Exchange)
	return d.Run(ctx)
}

// MigrateCommand is `spillway migrate`.
func MigrateCommand(ctx context.Context, args []string) error {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	registerTableFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.DatabaseURL == "" {
		return errors.New("database.url: Required value: set --database-url or DATABASE_URL")
	}
	pool, err := ConnectPool(ctx, cfg.DatabaseURL, "migrate", true)
	if err != nil {
		return redactError(err, cfg.DatabaseURL)
	}
	defer pool.Close()
	done, err := Migrate(ctx, pool, cfg.Table)
	if err != nil {
		return redactError(err, cfg.DatabaseURL)
	}
	if len(done) == 0 {
		fmt.Printf("%s is up to date\n", cfg.Table.Name)
	}
	for _, step := range done {
		fmt.Println(step)
	}
	return nil
}
