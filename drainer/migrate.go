package drainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Migrate makes the spec's table drainable: it creates the canonical table
// when there is none, or adds the lease columns and attempts an existing
// table lacks, then the claim index and the published index. It never renames or drops a column, and
// a second run changes nothing. It returns what it did.
func Migrate(ctx context.Context, pool *pgxpool.Pool, spec TableSpec) ([]string, error) {
	if errs := spec.Validate(field.NewPath("database")); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	var done []string
	cols, err := Catalog(ctx, pool, spec)
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		if err := execStatement(ctx, pool, spec.CreateTable()); err != nil {
			return nil, fmt.Errorf("create table %s: %w", spec.Name, err)
		}
		done = append(done, "created table "+spec.Name)
	} else if stmt, added, ok := spec.AddMissingColumns(cols); ok {
		if err := execStatement(ctx, pool, stmt); err != nil {
			return nil, fmt.Errorf("add columns to %s: %w", spec.Name, err)
		}
		for _, c := range added {
			done = append(done, "added column "+c)
		}
	}
	if cols, err = Catalog(ctx, pool, spec); err != nil {
		return nil, err
	}
	table, err := ResolveTable(spec, cols)
	if err != nil {
		return nil, err
	}
	for _, idx := range []struct {
		suffix string
		create Statement
	}{
		{claimIndexSuffix, table.ClaimIndex(spec)},
		{publishedIndexSuffix, table.PublishedIndex(spec)},
	} {
		created, err := ensureIndex(ctx, pool, spec, idx.suffix, idx.create)
		if err != nil {
			return nil, err
		}
		if created {
			done = append(done, "created index "+spec.objectName(idx.suffix))
		}
	}
	return done, nil
}

// ensureIndex creates one of spillway's indexes unless a valid one exists,
// replacing an invalid one left by an interrupted concurrent build.
func ensureIndex(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, suffix string, create Statement) (bool, error) {
	name := spec.objectName(suffix)
	check := spec.IndexValid(suffix)
	var valid bool
	err := pool.QueryRow(ctx, check.SQL, check.Args...).Scan(&valid)
	switch {
	case err == nil && valid:
		return false, nil
	case err == nil:
		if err := execStatement(ctx, pool, spec.DropIndex(suffix)); err != nil {
			return false, fmt.Errorf("drop invalid index %s: %w", name, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("look up index %s: %w", name, err)
	}
	if err := execStatement(ctx, pool, create); err != nil {
		return false, fmt.Errorf("create index %s: %w", name, err)
	}
	return true, nil
}

// InstallNotifyTrigger adds the insert trigger that wakes listening drainers
// at once, unless it is there. Drainers work without it, at poll speed.
func InstallNotifyTrigger(ctx context.Context, pool *pgxpool.Pool, spec TableSpec) (bool, error) {
	check := spec.NotifyTriggerExists()
	var exists bool
	if err := pool.QueryRow(ctx, check.SQL, check.Args...).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up trigger %s: %w", spec.objectName(notifyTriggerSuffix), err)
	}
	if exists {
		return false, nil
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, stmt := range spec.CreateNotifyTrigger() {
		if _, err := tx.Exec(ctx, stmt.SQL, stmt.Args...); err != nil {
			return false, fmt.Errorf("create trigger %s: %w", spec.objectName(notifyTriggerSuffix), err)
		}
	}
	return true, tx.Commit(ctx)
}

func execStatement(ctx context.Context, pool *pgxpool.Pool, stmt Statement) error {
	_, err := pool.Exec(ctx, stmt.SQL, stmt.Args...)
	return err
}
