package commands

import (
	"context"
	"flag"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// migrateFlags binds spillway migrate's flags.
func migrateFlags(database *secret.URLSource, pooling *outbox.Pooling, table *outbox.TableSpec, notify *bool) *flag.FlagSet {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	registerTableFlags(fs, database, pooling, table)
	fs.BoolVar(notify, "notify", false,
		"install a statement-level insert trigger that wakes drainers at once (NOTIFY takes a database-wide lock at commit: see docs/outbox-table.md)")
	return fs
}

// MigrateCommand is `spillway migrate`.
func MigrateCommand(ctx context.Context, args []string) error {
	var database secret.URLSource
	var pooling outbox.Pooling
	table := outbox.TableSpec{Name: outbox.DefaultTableName}
	notify := new(bool)
	fs := migrateFlags(&database, &pooling, &table, notify)
	if err := fs.Parse(args); err != nil {
		return err
	}
	errs := database.Validate(field.NewPath("database"), "the outbox database's connection URL")
	if errs = append(errs, pooling.Validate(field.NewPath("database"))...); len(errs) > 0 {
		return errs.ToAggregate()
	}
	pool, err := outbox.ConnectPool(ctx, database, pooling.Options("migrate", true))
	if err != nil {
		return err
	}
	defer pool.Close()
	done, err := outbox.Migrate(ctx, pool, table)
	if err != nil {
		return err
	}
	if *notify {
		installed, err := outbox.InstallNotifyTrigger(ctx, pool, table)
		if err != nil {
			return err
		}
		if installed {
			done = append(done, "created trigger "+table.NotifyTrigger()+" notifying "+table.NotifyChannel())
		}
	}
	if len(done) == 0 {
		fmt.Printf("%s is up to date\n", table.Name)
	}
	for _, step := range done {
		fmt.Println(step)
	}
	return nil
}
