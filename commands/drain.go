// Package commands holds spillway's subcommands, each a function of its
// arguments: drain, migrate, poisoned and manager. Only main imports it.
package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/drainer/webhook"
	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/telemetry"
)

// ParseDrainFlags turns the arguments of `spillway drain` into a checked
// config and the address of the metrics and probes. The operator's
// Deployment builder is tested against it.
func ParseDrainFlags(args []string) (cfg drainer.Config, httpAddr string, err error) {
	cfg = drainer.DefaultConfig()
	cfg.DrainerID = defaultDrainerID()
	fs := drainFlags(&cfg, &httpAddr)
	if err := fs.Parse(args); err != nil {
		return cfg, "", err
	}
	if cfg.Webhook != nil {
		cfg.Webhook.ContentType = cfg.Broker.ContentType
	}
	return cfg, httpAddr, cfg.Validate()
}

// DrainCommand is `spillway drain`.
func DrainCommand(ctx context.Context, args []string) error {
	cfg, httpAddr, err := ParseDrainFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(drainer.NewLogHandler(os.Stderr)).With("drainer", cfg.DrainerID)
	gcPercent, memoryLimit := drainer.TuneGC(cfg)
	store, closeStore, err := drainer.Open(ctx, cfg, log)
	if ctx.Err() != nil {
		return nil // stopped before it started
	}
	if err != nil {
		return err
	}
	defer closeStore()
	for _, note := range store.Notes() {
		log.Warn(note)
	}
	tracing, stopTracing, err := telemetry.Start(ctx, "spillway-drainer", semconv.ServiceInstanceID(cfg.DrainerID))
	if err != nil {
		return err
	}
	defer flushSpans(stopTracing, log)
	cfg.Tracing = tracing
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d, err := drainer.New(cfg, store, drainer.NewMetrics(reg), log)
	if err != nil {
		return err
	}
	if httpAddr != "" {
		srv := &http.Server{Addr: httpAddr, Handler: d.Handler(reg), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server stopped", "addr", httpAddr, "error", err)
			}
		}()
		defer srv.Close()
	}
	sinkAttrs := []any{"broker", secret.RedactURL(cfg.Broker.URL), "brokerFile", cfg.Broker.File, "exchange", cfg.Broker.Exchange}
	if cfg.Webhook != nil {
		// The URL itself is not logged: its query may hold a token.
		sinkAttrs = []any{"sink", "webhook", "webhookFile", cfg.Webhook.File}
	}
	log.Info("Drainer started", append(append([]any{"table", store.Table().Name(),
		"database", secret.RedactURL(cfg.Database.URL), "databaseFile", cfg.Database.File, "poolMode", cfg.Pooling.Options("", false).Mode},
		sinkAttrs...), "gcPercent", gcPercent, "memoryLimitBytes", memoryLimit)...)
	return d.Run(ctx)
}

// flushSpans sends the spans still buffered, for a few seconds at most:
// an exporter that cannot reach its collector must not hold up a shutdown.
func flushSpans(stop func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := stop(ctx); err != nil {
		log.Warn("Could not send the last spans", "error", err)
	}
}

// registerDrainFlags binds every drain flag to c, whose values are the
// defaults.
func registerDrainFlags(fs *flag.FlagSet, c *drainer.Config) {
	registerTableFlags(fs, &c.Database, &c.Pooling, &c.Table)
	fs.StringVar(&c.Pooling.Direct.URL, "database-direct-url", "",
		"with --database-pool-mode=transaction, a URL past the pooler to Postgres itself, for the drainer's own sessions: the LISTEN that wakes it, the notify hush, the --max-rate roster and the broker-blocked flag (unset: it polls and does without them; for local use)")
	fs.StringVar(&c.Pooling.Direct.File, "database-direct-url-file", "", "file holding --database-direct-url (a mounted secret)")
	fs.StringVar(&c.DrainerID, "drainer-id", c.DrainerID, "drainer ID, stamped on claims (default $POD_NAME, then the hostname)")
	fs.StringVar(&c.Broker.URL, "broker-url", os.Getenv("BROKER_URL"),
		"AMQP URL of the broker, or the URLs of a cluster's nodes, comma-separated: a drainer connects to one, and moves to the next when it fails (for local use; default $BROKER_URL)")
	fs.StringVar(&c.Broker.File, "broker-url-file", "", "file holding the AMQP URL or URLs, re-read at every reconnect (a mounted secret)")
	registerTLSFlags(fs, "broker", &c.Broker.TLS)
	fs.BoolVar(&c.Broker.External, "broker-sasl-external", false, "authenticate to the broker with the client certificate (SASL EXTERNAL), not the URL's password")
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
		func(v string) error { c.Broker.MessageProperties = rabbitmq.MessageProperties(v); return nil })
	fs.StringVar(&c.Broker.ContentType, "content-type", c.Broker.ContentType, "message content type (default from the payload column's type)")
	registerWebhookFlags(fs, c)
	fs.Func("message-format", `how each message presents its row: plain, cloudevents (the CloudEvents attributes as headers: cloudEvents_ on AMQP, ce- on HTTP) or cloudevents-structured (the row as an application/cloudevents+json event) (default "plain")`,
		func(v string) error { c.Format.Mode = sink.FormatMode(v); return nil })
	fs.StringVar(&c.Format.Source, "cloudevents-source", "", "the CloudEvents source attribute of every event (default /spillway/ and the table's schema.table)")
	fs.BoolVar(&c.SynchronousCommit, "synchronous-commit", c.SynchronousCommit,
		"commit claims and settles synchronously (off: the application's commits do not queue behind the drainer's WAL flushes)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout,
		"on SIGTERM, how long to wait for confirms in flight, settle them and release the rest")
	fs.Var(windowFlag{&c.Retention.Published}, "retention-published", "keep published rows this long, then delete them (unset or 0s: delete each row once its publish is confirmed; 0s also prunes rows kept before)")
	fs.Var(windowFlag{&c.Retention.UnpublishedMaxAge}, "retention-unpublished-max-age",
		"delete rows never published this long after enqueued_at, poisoned ones included (unset: keep)")
	fs.DurationVar(&c.Retention.Interval, "retention-interval", c.Retention.Interval, "pause between retention runs")
	fs.StringVar(&c.Table.Ordering.OnFailure, "ordering-on-failure", "",
		"with --ordering-key-column, what a failed row does to its key: block (the later rows wait for it; the default) or skip (it is poisoned at once, and they go on)")
	fs.Float64Var(&c.MaxRate, "max-rate", c.MaxRate,
		"events per second that all the drainers of the table publish together, at most, each taking an equal share (0: no cap)")
	fs.IntVar(&c.MaxRateDrainers, "max-rate-drainers", c.MaxRateDrainers,
		"how many drainers share --max-rate when they cannot count each other: transaction pool mode without --database-direct-url (for a fleet run by hand: a fleet's maxRate needs the direct URL)")
	fs.DurationVar(&c.MaxCommitLatency, "max-commit-latency", c.MaxCommitLatency,
		"slow the drain down while a commit on the database takes longer than this, as timed on one settle every 100ms committed synchronously (0: off)")
}

// registerWebhookFlags binds the flags of the webhook sink. --sink=webhook
// makes c's sink the webhook; the content type is --content-type, shared
// with the broker.
func registerWebhookFlags(fs *flag.FlagSet, c *drainer.Config) {
	wh := webhook.DefaultConfig()
	fs.Func("sink", `where rows go: rabbitmq (the broker) or webhook (an HTTP POST per row, signed per Standard Webhooks) (default "rabbitmq")`,
		func(v string) error {
			switch v {
			case "rabbitmq":
				c.Webhook = nil
			case "webhook":
				c.Webhook = &wh
			default:
				return fmt.Errorf("sink %q: must be rabbitmq or webhook", v)
			}
			return nil
		})
	fs.StringVar(&wh.URL, "webhook-url", "", "URL the webhook sink posts each row to, https unless --webhook-allow-http (for local use)")
	fs.StringVar(&wh.File, "webhook-url-file", "", "file holding the webhook URL, re-read at every connect (a mounted secret: the URL may carry credentials)")
	registerTLSFlags(fs, "webhook", &wh.TLS)
	fs.StringVar(&wh.SigningSecretFile, "webhook-signing-secret-file", "",
		"file holding the Standard Webhooks signing secret (whsec_...), or two, one per line, while rotating: each request carries a signature by each")
	fs.StringVar(&wh.HeaderPrefix, "webhook-header-prefix", wh.HeaderPrefix, "prefix of the HTTP header that carries each of the row's headers")
	fs.BoolVar(&wh.AllowHTTP, "webhook-allow-http", wh.AllowHTTP, "allow an http:// webhook URL (in the clear)")
	fs.DurationVar(&wh.Timeout, "webhook-timeout", wh.Timeout, "deadline of each webhook request, at most a third of --lease-ttl")
	fs.IntVar(&wh.BatchRows, "webhook-batch-rows", wh.BatchRows,
		"post up to this many rows per request, as a JSON array of envelopes (0: one row's payload per request); --pipeline-depth still counts rows")
	fs.BoolVar(&wh.GonePoisons, "webhook-gone-poisons", wh.GonePoisons, "poison a row at once when the receiver answers 410 Gone (otherwise it counts an attempt)")
}

func defaultDrainerID() string {
	if id := os.Getenv("POD_NAME"); id != "" {
		return id
	}
	host, _ := os.Hostname()
	return host
}

// drainFlags binds spillway drain's flags to cfg, whose values are the
// defaults, and to httpAddr.
func drainFlags(cfg *drainer.Config, httpAddr *string) *flag.FlagSet {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	registerDrainFlags(fs, cfg)
	fs.StringVar(httpAddr, "metrics-addr", ":8080", "listen address of /metrics, /healthz and /readyz (empty: off)")
	return fs
}
