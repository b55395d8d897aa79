// Command demo is make demo-drain: Spillway's main job on the local Postgres and
// RabbitMQ, no cluster needed. It migrates an outbox with the notify trigger,
// seeds it, drains it with two spillway drain processes while printing the
// backlog and the publish rate, stops them with SIGTERM, and removes what it
// created.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

type options struct {
	spillway string
	events   int
	drainers int
	timeout  time.Duration
	tick     time.Duration
}

// parseFlags uses a flag set of its own: testenv's Ginkgo import puts its
// flags on the default one.
func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&o.spillway, "spillway", "bin/spillway", "the spillway binary (make build)")
	fs.IntVar(&o.events, "events", 50_000, "events to seed")
	fs.IntVar(&o.drainers, "drainers", 2, "spillway drain processes")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up when the outbox is not drained by then")
	fs.DurationVar(&o.tick, "progress", time.Second, "interval of the progress lines")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: demo [flags]\n\nDrains a seeded outbox in the local Postgres to the local RabbitMQ;")
		fmt.Fprintln(fs.Output(), "SPILLWAY_TEST_DATABASE_URL and SPILLWAY_TEST_BROKER_URL override where they are.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.events < 1 || o.drainers < 1 || o.tick <= 0 {
		return o, errors.New("-events, -drainers and -progress must be positive")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = run(ctx, o, os.Stdout)
		stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, out io.Writer) error {
	services, err := testenv.Connect(ctx)
	if err != nil {
		return err
	}
	defer services.Close()
	ch, err := services.Broker.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	// A name of its own, so a demo never touches anything else in the
	// database or the broker; all of it is removed at the end.
	spec := outbox.TableSpec{Name: "public." + testenv.UniqueName("spillway_demo")}
	defer func() { _, _ = services.DB.Exec(context.Background(), "DROP TABLE IF EXISTS "+spec.Name) }()
	topology, err := testenv.DeclareTopology(ch, "#", nil)
	if err != nil {
		return err
	}
	defer topology.Delete(ch)
	fmt.Fprintf(out, "Spillway demo: %d events, %d drainers, local Postgres and RabbitMQ\n", o.events, o.drainers)
	if err := migrate(ctx, o.spillway, spec.Name, out); err != nil {
		return err
	}
	if err := seed(ctx, services.DB, spec.Name, o.events); err != nil {
		return err
	}
	store, err := outbox.OpenStore(ctx, services.DB, spec)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "seeded %d events; publishing to exchange %s, bound to queue %s\n", o.events, topology.Exchange, topology.Queue)

	logs, err := os.MkdirTemp("", "spillway-demo")
	if err != nil {
		return err
	}
	drainers, err := startFleet(o, spec.Name, topology.Exchange, logs)
	if err != nil {
		return fmt.Errorf("%w (drainer logs in %s)", err, logs)
	}
	drained, watchErr := watch(ctx, o, services.DB, store.Table(), drainers, out)
	published := drainers.published()
	stopErr := drainers.stop(out)
	if err := errors.Join(watchErr, stopErr); err != nil {
		return fmt.Errorf("%w (drainer logs in %s)", err, logs)
	}
	_ = os.RemoveAll(logs)

	queued, err := testenv.QueueDepth(ch, topology.Queue)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "drained %d events in %s (%.0f/s): %s; the queue holds %d messages\n",
		o.events, drained.Round(10*time.Millisecond), float64(o.events)/drained.Seconds(), published, queued)
	fmt.Fprintln(out, "removed the demo's table, exchange and queue")
	return nil
}

// migrate runs spillway migrate --notify, as a user adopting Spillway would,
// and shows what it did.
func migrate(ctx context.Context, spillway, table string, out io.Writer) error {
	cmd := exec.CommandContext(ctx, spillway, "migrate", "--notify", "--table", table)
	cmd.Env = drainerEnv()
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("spillway migrate: %w: %s", err, output)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(output)), "\n") {
		fmt.Fprintln(out, "migrate:", line)
	}
	return nil
}

// seed plays the application: events as it would insert them, three kinds.
func seed(ctx context.Context, db *pgxpool.Pool, table string, n int) error {
	_, err := db.Exec(ctx, `INSERT INTO `+table+` (event_type, payload)
SELECT (ARRAY['order.created', 'order.paid', 'order.shipped'])[1 + g % 3], jsonb_build_object('order', g)
FROM generate_series(1, $1) g`, n)
	return err
}

// drainerEnv passes the connection URLs the way a local user would: in the
// environment, where the process list does not show them.
func drainerEnv() []string {
	return append(os.Environ(), "DATABASE_URL="+testenv.DatabaseURL(), "BROKER_URL="+testenv.BrokerURL(), "POD_NAME=")
}

// watch prints the outbox's backlog, read with the operator's status query,
// and the rate at which it falls, until it is empty; it returns how long
// that took.
func watch(ctx context.Context, o options, db *pgxpool.Pool, table *outbox.Table, drainers fleet, out io.Writer) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ticker := time.NewTicker(o.tick)
	defer ticker.Stop()
	start := time.Now()
	last, lastAt := int64(o.events), start
	for {
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("outbox not drained: %w", ctx.Err())
		case <-ticker.C:
		}
		if err := drainers.exited(); err != nil {
			return time.Since(start), err
		}
		status, err := outbox.ReadOutboxStatus(ctx, db, table, drainer.DefaultConfig().MaxAttempts)
		if err != nil {
			return time.Since(start), err
		}
		now := time.Now()
		fmt.Fprintln(out, progressLine(now.Sub(start), status, rate(last, status.Backlog, now.Sub(lastAt))))
		if status.Backlog == 0 {
			if status.Poisoned > 0 {
				return now.Sub(start), fmt.Errorf("%d rows poisoned: the broker refused them", status.Poisoned)
			}
			return now.Sub(start), nil
		}
		last, lastAt = status.Backlog, now
	}
}

// rate is how many rows a second left the backlog between two readings.
func rate(before, after int64, elapsed time.Duration) float64 {
	if elapsed <= 0 || after > before {
		return 0
	}
	return float64(before-after) / elapsed.Seconds()
}

func progressLine(elapsed time.Duration, s outbox.OutboxStatus, perSecond float64) string {
	return fmt.Sprintf("%6.1fs  backlog %7d  published/s %7.0f  poisoned %d  oldest %s",
		elapsed.Seconds(), s.Backlog, perSecond, s.Poisoned, s.OldestPendingAge.Round(100*time.Millisecond))
}

// drainerProcess is one spillway drain.
type drainerProcess struct {
	id, metricsAddr string
	cmd             *exec.Cmd
	done            chan error
}

type fleet []*drainerProcess

func startFleet(o options, table, exchange, logs string) (fleet, error) {
	var f fleet
	for i := 1; i <= o.drainers; i++ {
		d, err := startDrainer(o.spillway, fmt.Sprintf("demo-%d", i), table, exchange, logs)
		if err != nil {
			_ = f.stop(io.Discard)
			return nil, err
		}
		f = append(f, d)
	}
	return f, nil
}

// startDrainer runs spillway drain with its JSON logs in a file, so the
// demo's own output stays readable.
func startDrainer(spillway, id, table, exchange, logs string) (*drainerProcess, error) {
	addr, err := testenv.UnusedAddr()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(logs, id+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(spillway, "drain", "--drainer-id", id, "--table", table, "--exchange", exchange, "--metrics-addr", addr)
	cmd.Env = drainerEnv()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start spillway drain: %w", err)
	}
	d := &drainerProcess{id: id, metricsAddr: addr, cmd: cmd, done: make(chan error, 1)}
	go func() {
		d.done <- cmd.Wait()
		log.Close()
	}()
	return d, nil
}

// exited reports a drainer that stopped on its own: it never should.
func (f fleet) exited() error {
	for _, d := range f {
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("drainer %s exited: %v", d.id, err)
		default:
		}
	}
	return nil
}

// published is each drainer's count of published rows, from its /metrics.
func (f fleet) published() string {
	var parts []string
	for _, d := range f {
		n, err := testenv.Metric(d.metricsAddr, "spillway_drainer_published_rows_total")
		if err != nil {
			parts = append(parts, d.id+" published ?")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s published %.0f", d.id, n))
	}
	return strings.Join(parts, ", ")
}

// stop sends SIGTERM to every drainer, as Kubernetes does, and waits for
// each to settle what it has in flight and exit 0.
func (f fleet) stop(out io.Writer) error {
	for _, d := range f {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
	}
	var errs []error
	var exits []string
	for _, d := range f {
		select {
		case err := <-d.done:
			if err != nil {
				errs = append(errs, fmt.Errorf("drainer %s: %w", d.id, err))
				continue
			}
			exits = append(exits, d.id+" exited 0")
		case <-time.After(45 * time.Second):
			_ = d.cmd.Process.Kill()
			errs = append(errs, fmt.Errorf("drainer %s did not exit within 45s of SIGTERM", d.id))
		}
	}
	if len(exits) > 0 {
		fmt.Fprintf(out, "SIGTERM: %s\n", strings.Join(exits, ", "))
	}
	return errors.Join(errs...)
}
