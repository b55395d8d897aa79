package commands

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// poisonedOptions are the flags of spillway poisoned list, replay and park.
type poisonedOptions struct {
	Database secret.URLSource
	Pooling  outbox.Pooling
	Table    outbox.TableSpec
	Request  outbox.PoisonedRequest
}

// poisonedFlags binds the flags of one spillway poisoned verb to o: the
// table flags of drain and migrate, the selector, and for replay and park
// --dry-run and --batch-size.
func poisonedFlags(verb string, o *poisonedOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("poisoned "+verb, flag.ContinueOnError)
	registerTableFlags(fs, &o.Database, &o.Pooling, &o.Table)
	sel := &o.Request.Selector
	fs.IntVar(&o.Request.MaxAttempts, "max-attempts", drainer.DefaultConfig().MaxAttempts, "the fleet's --max-attempts: a row with this many attempts is poisoned")
	fs.DurationVar(&o.Request.Lease, "lease-ttl", drainer.DefaultConfig().LeaseTTL, "the fleet's --lease-ttl: a row claimed less than this ago is being published, and is left alone")
	fs.Var(listFlag{&sel.IDs}, "id", "pick these row ids (repeatable, or comma-separated)")
	fs.StringVar(&sel.LastErrorPattern, "last-error", "", `pick rows whose last_error matches this SQL LIKE pattern: % is any text, _ one character, \ escapes (case-sensitive)`)
	fs.Var(timeFlag{&sel.EnqueuedSince}, "enqueued-since", "pick rows enqueued at or after this RFC 3339 time")
	fs.Var(timeFlag{&sel.EnqueuedBefore}, "enqueued-before", "pick rows enqueued before this RFC 3339 time")
	fs.BoolVar(&sel.Parked, "parked", false, "pick parked rows instead of poisoned ones (list, replay)")
	fs.IntVar(&sel.Limit, "limit", outbox.DefaultSelectorLimit, "pick at most this many rows, oldest first")
	if verb != "list" {
		fs.BoolVar(&o.Request.DryRun, "dry-run", false, "print the rows that would change, and change nothing")
		fs.IntVar(&o.Request.BatchSize, "batch-size", outbox.DefaultChangeBatch, "rows changed per statement, each its own short transaction")
	}
	return fs
}

// parsePoisonedFlags reads the flags of one spillway poisoned verb: the
// table flags of drain and migrate, the selector, and for replay and park
// --dry-run and --batch-size.
func parsePoisonedFlags(verb string, args []string) (poisonedOptions, error) {
	o := poisonedOptions{Table: outbox.TableSpec{Name: outbox.DefaultTableName}, Request: outbox.PoisonedRequest{Action: outbox.PoisonedAction(verb)}}
	fs := poisonedFlags(verb, &o)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: every selector is a flag (see -h)", fs.Arg(0))
	}
	errs := o.Database.Validate(field.NewPath("database"), "the outbox database's connection URL")
	errs = append(errs, o.Pooling.Validate(field.NewPath("database"))...)
	errs = append(errs, o.Table.Validate(field.NewPath("database"))...)
	if verb == "list" {
		// Any selector lists: parked rows are listed as well as poisoned.
		listed := o.Request
		listed.Action = outbox.ActionReplay
		errs = append(errs, listed.Validate(nil)...)
	} else {
		errs = append(errs, o.Request.Validate(nil)...)
	}
	if o.Request.BatchSize < 0 {
		errs = append(errs, field.Invalid(field.NewPath("batchSize"), o.Request.BatchSize, "must be greater than 0"))
	}
	return o, errs.ToAggregate()
}

// poisonedVerbs are spillway poisoned's subcommands.
var poisonedVerbs = []string{"list", "replay", "park"}

// PoisonedCommand is `spillway poisoned list|replay|park`: the triage of
// poisoned rows without Kubernetes, through the same table mapping and the
// same statements as an OutboxReplay.
func PoisonedCommand(ctx context.Context, args []string) error {
	return runPoisoned(ctx, args, os.Stdout)
}

func runPoisoned(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || !slices.Contains(poisonedVerbs, args[0]) {
		return errors.New("usage: spillway poisoned list|replay|park [flags] (-h for the flags)")
	}
	verb := args[0]
	o, err := parsePoisonedFlags(verb, args[1:])
	if err != nil {
		return err
	}
	url, err := o.Database.Read()
	if err != nil {
		return err
	}
	pool, err := outbox.ConnectPool(ctx, o.Database, o.Pooling.Options("poisoned", true))
	if err != nil {
		return err
	}
	defer pool.Close()
	table, err := outbox.ResolveOutbox(ctx, pool, o.Table)
	if err != nil {
		return secret.RedactError(err, url)
	}
	r := o.Request
	if errs := table.CheckSelector(r.Action, r.Selector, field.NewPath("selector")); len(errs) > 0 {
		return errs.ToAggregate()
	}
	if verb == "list" || r.DryRun {
		rows, err := outbox.ListPoisoned(ctx, pool, table, r)
		if err != nil {
			return secret.RedactError(err, url)
		}
		printPoisoned(out, rows, url)
		if verb == "list" {
			fmt.Fprintf(out, "%d rows of %s%s\n", len(rows), table.Name(), limitNote(len(rows), r.Selector.Limit))
			return nil
		}
	}
	change, err := outbox.ChangePoisoned(ctx, pool, table, r, nil)
	if err != nil {
		if change.Changed > 0 {
			fmt.Fprintf(out, "%s %d of %d matched rows of %s before the error\n", pastTense(r.Action), change.Changed, change.Matched, table.Name())
		}
		return secret.RedactError(err, url)
	}
	if r.DryRun {
		fmt.Fprintf(out, "dry run: %s would %s %d rows%s; nothing changed\n", table.Name(), r.Action, change.Matched,
			limitNote(int(change.Matched), r.Selector.Limit))
		return nil
	}
	fmt.Fprintf(out, "%s %d of %d matched rows of %s\n", pastTense(r.Action), change.Changed, change.Matched, table.Name())
	if change.Changed < change.Matched {
		fmt.Fprintf(out, "%d rows were locked, leased or changed by others meanwhile, and left alone: run it again to take them\n",
			change.Matched-change.Changed)
	}
	return nil
}

// printPoisoned prints rows as a table, each last error scrubbed of secrets
// and cut to fit a line.
func printPoisoned(out io.Writer, rows []outbox.PoisonedRow, databaseURL string) {
	if len(rows) == 0 {
		return
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tATTEMPTS\tENQUEUED\tPARKED\tLAST ERROR")
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", r.ID, r.Attempts, at(r.EnqueuedAt), at(r.ParkedAt), secret.Truncate(secret.Scrub(r.LastError, databaseURL), 100))
	}
	_ = w.Flush()
}

// limitNote says that a count stopped at the limit, so more rows may match.
func limitNote(n, limit int) string {
	if n >= limit {
		return fmt.Sprintf(" (the limit, --limit %d: more may match)", limit)
	}
	return ""
}

func pastTense(a outbox.PoisonedAction) string {
	if a == outbox.ActionPark {
		return "parked"
	}
	return "replayed"
}
