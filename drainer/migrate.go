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
// table lacks, then the claim index. It never renames or drops a column, and
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
	created, err := ensureClaimIndex(ctx, pool, spec, table)
	if err != nil {
		return nil, err
	}
	if created {
		done = append(done, "created index "+spec.indexName())
	}
	return done, nil
}

// ensureClaimIndex creates the claim index unless a valid one exists,
// replacing an invalid one left by an interrupted concurrent build.
func ensureClaimIndex(ctx context.Context, pool *pgxpool.Pool, spec TableSpec, table *Table) (bool, error) {
	check := spec.ClaimIndexValid()
	var valid bool
	err := pool.QueryRow(ctx, check.SQL, check.Args...).Scan(&valid)
	switch {
	case err == nil && valid:
		return false, nil
	case err == nil:
		if err := execStatement(ctx, pool, spec.DropClaimIndex()); err != nil {
			return false, fmt.Errorf("drop invalid index %s: %w", spec.indexName(), err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return false, fmt.Errorf("look up index %s: %w", spec.indexName(), err)
	}
	if err := execStatement(ctx, pool, table.ClaimIndex(spec)); err != nil {
		return false, fmt.Errorf("create index %s: %w", spec.indexName(), err)
	}
	return true, nil
}

func execStatement(ctx context.Context, pool *pgxpool.Pool, stmt Statement) error {
	_, err := pool.Exec(ctx, stmt.SQL, stmt.Args...)
	return err
}
