package outbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Migrate makes the spec's table drainable: it creates the canonical table
// when there is none, or adds the columns an existing table lacks (the lease
// columns, attempts and available_at), then the claim index and the
// published index (and with an ordering key, the order and key lease
// indexes), on the table and, for a partitioned or inherited table,
// on every partition or child. It never renames or drops a column, and a
// second run changes nothing. It returns what it did.
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
	rel, err := lookUpRelation(ctx, pool, spec)
	if err != nil {
		return nil, err
	}
	for _, def := range table.Indexes() {
		created, err := ensureIndex(ctx, pool, def, rel, nil)
		if err != nil {
			return nil, err
		}
		done = append(done, created...)
	}
	return done, nil
}

// ensureIndex gives rel the index def unless it has it, valid and of that
// shape, and then each of rel's partitions or children; a partition's index
// is attached to parent's. It returns what it created.
func ensureIndex(ctx context.Context, pool *pgxpool.Pool, def IndexDef, rel Relation, parent *Relation) ([]string, error) {
	name := rel.objectName(def.Suffix)
	if parent != nil {
		// Postgres builds the index itself, under a name of its own, for a
		// partition added after the parent's index existed.
		var attached bool
		check := def.AttachedQuery(*parent, rel)
		if err := pool.QueryRow(ctx, check.SQL, check.Args...).Scan(&attached); err != nil {
			return nil, fmt.Errorf("look up index of partition %s: %w", rel, err)
		}
		if attached {
			return nil, nil
		}
	}
	shape, found, err := lookUpIndex(ctx, pool, def, rel)
	if err != nil {
		return nil, err
	}
	if found && !shape.OnTable {
		return nil, fmt.Errorf("index %s belongs to another table than %s: rename it, and run migrate again", name, rel)
	}
	var done []string
	switch {
	case found && shape.Valid && def.Superseded(shape) && !rel.Partitioned && parent == nil:
		if err := rebuildIndex(ctx, pool, def, rel); err != nil {
			return nil, err
		}
		done = append(done, fmt.Sprintf("rebuilt index %s on (%s)", name, strings.Join(def.Columns, ", ")))
	// A partitioned parent's index is invalid until every partition's is
	// attached, which is what the rest of this does. Postgres drops a
	// partitioned index with its partitions', and builds no partitioned
	// index concurrently: its rebuild is a drop and a create.
	case found && (!def.Matches(shape) || (!shape.Valid && !rel.Partitioned)):
		if err := execStatement(ctx, pool, def.Drop(rel)); err != nil {
			return nil, fmt.Errorf("drop index %s, which is invalid or not the one migrate builds: %w", name, err)
		}
		found = false
	}
	if !found {
		if err := execStatement(ctx, pool, def.Create(rel)); err != nil {
			return nil, fmt.Errorf("create index %s: %w", name, err)
		}
		done = append(done, "created index "+name)
	}
	children, err := lookUpChildren(ctx, pool, rel)
	if err != nil {
		return nil, err
	}
	for _, child := range children {
		var attachTo *Relation
		if rel.Partitioned {
			attachTo = &rel
		}
		created, err := ensureIndex(ctx, pool, def, child, attachTo)
		if err != nil {
			return nil, err
		}
		done = append(done, created...)
	}
	if parent != nil {
		if err := execStatement(ctx, pool, def.Attach(*parent, rel)); err != nil {
			return nil, fmt.Errorf("attach index %s to %s: %w", name, parent.objectName(def.Suffix), err)
		}
	}
	return done, nil
}

// rebuildIndex replaces the index that def supersedes on rel, a plain
// table, with def: built concurrently beside it, then swapped in, so that
// claims never go without one. A rebuild an earlier run left, perhaps
// invalid, is dropped first.
func rebuildIndex(ctx context.Context, pool *pgxpool.Pool, def IndexDef, rel Relation) error {
	rebuild := def.Rebuild()
	for _, step := range []struct {
		what string
		stmt Statement
	}{
		{"drop an earlier rebuild of", rebuild.Drop(rel)},
		{"build the new", rebuild.Create(rel)},
		{"drop the superseded", def.Drop(rel)},
		{"rename into place the new", def.RenameRebuilt(rel)},
	} {
		if err := execStatement(ctx, pool, step.stmt); err != nil {
			return fmt.Errorf("rebuild index %s: %s index: %w", rel.objectName(def.Suffix), step.what, err)
		}
	}
	return nil
}

// lookUpRelation reads the kind of the spec's table.
func lookUpRelation(ctx context.Context, db Querier, spec TableSpec) (Relation, error) {
	stmt := spec.RelationQuery()
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return Relation{}, fmt.Errorf("look up table %s: %w", spec.Name, err)
	}
	rels, err := pgx.CollectRows(rows, scanRelation)
	if err != nil {
		return Relation{}, fmt.Errorf("look up table %s: %w", spec.Name, err)
	}
	if len(rels) == 0 {
		return Relation{}, fmt.Errorf("table %s does not exist (run spillway migrate to create it)", spec.Name)
	}
	return rels[0], nil
}

// lookUpChildren reads a relation's partitions or inheriting tables.
func lookUpChildren(ctx context.Context, db Querier, rel Relation) ([]Relation, error) {
	stmt := rel.ChildrenQuery()
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return nil, fmt.Errorf("look up partitions of %s: %w", rel, err)
	}
	children, err := pgx.CollectRows(rows, scanRelation)
	if err != nil {
		return nil, fmt.Errorf("look up partitions of %s: %w", rel, err)
	}
	return children, nil
}

func scanRelation(r pgx.CollectableRow) (Relation, error) {
	var rel Relation
	return rel, r.Scan(&rel.Schema, &rel.Name, &rel.Partitioned)
}

// lookUpIndex reads the shape of the index of def's name on rel, if any.
func lookUpIndex(ctx context.Context, db Querier, def IndexDef, rel Relation) (IndexShape, bool, error) {
	stmt := def.IndexShapeQuery(rel)
	rows, err := db.Query(ctx, stmt.SQL, stmt.Args...)
	if err != nil {
		return IndexShape{}, false, fmt.Errorf("look up index %s: %w", rel.objectName(def.Suffix), err)
	}
	shapes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (IndexShape, error) {
		var s IndexShape
		return s, r.Scan(&s.OnTable, &s.Valid, &s.Unique, &s.Expressions, &s.Method, &s.Columns, &s.Predicate)
	})
	if err != nil {
		return IndexShape{}, false, fmt.Errorf("look up index %s: %w", rel.objectName(def.Suffix), err)
	}
	if len(shapes) == 0 {
		return IndexShape{}, false, nil
	}
	return shapes[0], true, nil
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
