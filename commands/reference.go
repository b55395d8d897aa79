package commands

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/spillway-io/spillway/drainer"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// usage is one subcommand's synopsis and flags, for the reference.
type usage struct {
	synopsis, what string
	flags          *flag.FlagSet
}

// usages are every subcommand's, built as each command builds them: a
// flag's default in the reference is the default the command takes.
func usages() []usage {
	cfg := drainer.DefaultConfig()
	var httpAddr string
	var database secret.URLSource
	table := outbox.TableSpec{Name: outbox.DefaultTableName}
	var manager managerOptions
	out := []usage{
		{"spillway drain [flags]", "One drainer: claims, publishes and settles the outbox's rows until SIGTERM, then settles what is " +
			"in flight and releases the rest. What every pod of a fleet runs; the operator writes these flags from the OutboxDrainer.",
			drainFlags(&cfg, &httpAddr)},
		{"spillway migrate [flags]", "Creates the canonical outbox table, or adds to an existing one only what it lacks (the lease " +
			"columns, attempts, available_at, parked_at) and the indexes, each built concurrently. It renames and drops nothing; " +
			"a second run changes nothing.", migrateFlags(&database, new(outbox.Pooling), &table, new(bool))},
	}
	for _, verb := range poisonedVerbs {
		o := poisonedOptions{Table: outbox.TableSpec{Name: outbox.DefaultTableName}}
		out = append(out, usage{"spillway poisoned " + verb + " [flags]", poisonedWhat[verb], poisonedFlags(verb, &o)})
	}
	return append(out, usage{"spillway manager [flags]", "The operator: reconciles OutboxDrainers and OutboxReplays " +
		"(what the chart's Deployment runs).", managerFlags(&manager)})
}

// poisonedWhat says what each spillway poisoned verb does.
var poisonedWhat = map[string]string{
	"list":   "Lists the poisoned rows the selector picks (or the parked ones, with --parked), oldest first, each last error scrubbed of secrets.",
	"replay": "Gives the picked rows their attempts back, due again at their place in line: a running drainer publishes them.",
	"park":   "Sets the picked poisoned rows aside, out of the poisoned count and never claimed, until they are replayed.",
}

// WriteReference writes the command line's reference, as Markdown, from
// the flags themselves. Run it with DATABASE_URL, BROKER_URL and
// SPILLWAY_DRAINER_IMAGE unset: they are defaults of some flags.
func WriteReference(w io.Writer) error {
	var b strings.Builder
	b.WriteString("# Command-line reference\n\n" +
		"Generated from the flags by `make manifests` (`go run ./hack/cli-reference`); do not edit. One binary, `spillway`, " +
		"runs every role: `spillway version` prints its build.\n")
	for _, u := range usages() {
		fmt.Fprintf(&b, "\n## `%s`\n\n%s\n\n| flag | default | meaning |\n|---|---|---|\n", u.synopsis, u.what)
		u.flags.VisitAll(func(f *flag.Flag) {
			def := f.DefValue
			if def != "" {
				def = "`" + def + "`"
			}
			fmt.Fprintf(&b, "| `--%s` | %s | %s |\n", f.Name, def, strings.ReplaceAll(f.Usage, "|", `\|`))
		})
	}
	_, err := io.WriteString(w, b.String())
	return err
}
