package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// This file holds the statements of spillway migrate and the catalog
// look-ups: the schema the drainer's statements rely on.

// CatalogQuery renders the look-up of a table's columns; no rows means no table.
func (s TableSpec) CatalogQuery() Statement {
	schema, name := s.QualifiedName()
	return Statement{
		SQL: `SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`,
		Args: []any{pgx.Identifier{schema, name}.Sanitize()},
	}
}

// TableQuery renders a look-up of the spec's table that the database
// answers with an error when there is none: relation does not exist
// (SQLSTATE 42P01).
func (s TableSpec) TableQuery() Statement {
	schema, name := s.QualifiedName()
	return Statement{SQL: "SELECT $1::regclass", Args: []any{pgx.Identifier{schema, name}.Sanitize()}}
}

// objectName names an object spillway adds beside the table (an index, a
// trigger) as the table's name plus a suffix, within Postgres's 63-byte limit.
func (s TableSpec) objectName(suffix string) string {
	_, name := s.QualifiedName()
	if len(name)+len(suffix) > 63 {
		name = name[:63-len(suffix)]
	}
	return name + suffix
}

// The indexes migrate creates.
const (
	claimIndexSuffix     = "_spillway_claim_idx"
	publishedIndexSuffix = "_spillway_published_idx"
)

// canonicalFillfactor leaves half of each page free when rows are inserted,
// so that the version a claim writes can stay on the row's page. It is not a
// HOT update (the claim moves the claim index's key), but an update on the
// same page logs only the bytes that changed, where one to another page logs
// the whole row: claiming and marking 50,000 rows after a checkpoint wrote
// 1,197 kB of WAL per 1,000 events at 50, 1,520 kB at 100. The mark's
// version fits too where the settle finds the row through an index on its
// id, whose fetch first prunes the claim's old version (see heldUnder).
const canonicalFillfactor = 50

// canonicalVacuumThreshold is the dead rows after which autovacuum comes to
// the canonical table, whatever its size. An outbox keeps its published rows
// by default and grows by design, so Postgres's default (a fifth of the
// table) spaced its vacuums further apart as it grew, and the claim index,
// whose dead entries only a vacuum removes, grew with the gaps: in make
// bench's 10-minute soak of 5.9 million events it ended at 2.11 × its size
// at minute 2; with this threshold (autovacuum then came every minute) at
// 1.01 ×, the drain as fast.
const canonicalVacuumThreshold = 100_000

// timeOrderedUUID is the canonical id's default: a version 7 uuid (RFC 9562),
// the time in milliseconds, then the millisecond's fraction in 12 bits, then
// random bits. Ids then follow enqueue order, so the primary-key entries that
// inserts, claims and marks add fall on a few index pages, where random
// (version 4) ids spread them over the whole index and each page is logged
// whole at its first change after a checkpoint. In make bench, Postgres spent
// 24 µs per event against 28, and the application's inserts beside a backlog
// wrote 256 kB of WAL a second against 943. Postgres 18's uuidv7() is the same
// uuid; this expression works from 13 on. It reads the clock twice, so an id
// made as a millisecond ends may sort before the others of that millisecond:
// order within a millisecond is all that costs, and the random bits keep ids
// unique.
const timeOrderedUUID = `encode(overlay(uuid_send(gen_random_uuid()) placing int8send(
		((floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint << 16) | (7 << 12))
		| (floor(extract(epoch FROM clock_timestamp()) * 1000 * 4096)::bigint & 4095)) from 1 for 8), 'hex')::uuid`

// canonicalStorage is the canonical table's storage parameters.
var canonicalStorage = fmt.Sprintf("fillfactor = %d, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = %d",
	canonicalFillfactor, canonicalVacuumThreshold)

// CreateTable renders the canonical table, under the spec's column names.
func (s TableSpec) CreateTable() Statement {
	schema, name := s.QualifiedName()
	var defs []string
	for _, lc := range contract {
		defs = append(defs, q(s.Columns.name(lc))+" "+lc.sqlType)
		if lc.flag == "payload" {
			if rk := s.routingKeyColumn(); rk != "" {
				defs = append(defs, q(rk)+" text NOT NULL")
			}
		}
	}
	return Statement{SQL: fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n\t%s\n) WITH (%s)",
		pgx.Identifier{schema, name}.Sanitize(), strings.Join(defs, ",\n\t"), canonicalStorage)}
}

// AddMissingColumns renders the ALTER that gives an existing table the lease
// columns and attempts it lacks; ok is false when nothing is missing, so an
// idempotent migrate takes no lock on the application's table.
func (s TableSpec) AddMissingColumns(catalog []CatalogColumn) (stmt Statement, added []string, ok bool) {
	have := map[string]bool{}
	for _, c := range catalog {
		have[c.Name] = true
	}
	var adds []string
	for _, lc := range contract {
		if n := s.Columns.name(lc); lc.migrate && !have[n] {
			adds = append(adds, "ADD COLUMN IF NOT EXISTS "+q(n)+" "+lc.sqlType)
			added = append(added, n)
		}
	}
	if len(adds) == 0 {
		return Statement{}, nil, false
	}
	schema, name := s.QualifiedName()
	return Statement{SQL: fmt.Sprintf("ALTER TABLE %s %s", pgx.Identifier{schema, name}.Sanitize(), strings.Join(adds, ", "))}, added, true
}

// Relation is a table as the catalog has it, for building indexes on it.
type Relation struct {
	Schema, Name string
	// Partitioned is a declaratively partitioned table (relkind 'p'), which
	// holds no rows of its own.
	Partitioned bool
}

// ident is the relation's quoted, schema-qualified name.
func (r Relation) ident() string { return pgx.Identifier{r.Schema, r.Name}.Sanitize() }

// String is schema.name, for messages.
func (r Relation) String() string { return r.Schema + "." + r.Name }

// objectName names an object spillway adds beside the relation, within
// Postgres's 63-byte limit.
func (r Relation) objectName(suffix string) string {
	return TableSpec{Name: r.Name}.objectName(suffix)
}

// index is the quoted, schema-qualified name of the relation's index with
// suffix: an index lives in its table's schema.
func (r Relation) index(suffix string) string {
	return pgx.Identifier{r.Schema, r.objectName(suffix)}.Sanitize()
}

// RelationQuery renders the look-up of the spec's table: its kind; no rows
// means no table.
func (s TableSpec) RelationQuery() Statement {
	schema, name := s.QualifiedName()
	return Statement{
		SQL:  "SELECT n.nspname, c.relname, c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
		Args: []any{pgx.Identifier{schema, name}.Sanitize()},
	}
}

// ChildrenQuery renders the look-up of a relation's partitions, or of the
// tables that inherit from it: each holds rows of the outbox, and needs the
// indexes too.
func (r Relation) ChildrenQuery() Statement {
	return Statement{
		SQL: `SELECT n.nspname, c.relname, c.relkind = 'p'
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.inhparent = to_regclass($1)
ORDER BY 1, 2`,
		Args: []any{r.ident()},
	}
}

// IndexDef is one of spillway's indexes, as migrate builds it and as the
// drainer expects to find it.
type IndexDef struct {
	Suffix string
	// Columns are the key's physical column names, in order.
	Columns []string
	// Predicate is the partial index's WHERE clause.
	Predicate string
	// Supersedes is the key an earlier release built under the same name,
	// if any: a drainer still drains through it, and migrate rebuilds it
	// without leaving the table a moment without one.
	Supersedes []string
}

// ClaimIndex is the index the claim reads: due times of pending rows, with
// their attempts, so that a claim passes over a spent row (see Claim) in
// the index, without reading it from the table: in make bench, a million
// of them cost a claim 170 ms read from the table, 24 ms in the index. It
// supersedes the index on the due time alone.
func (t *Table) ClaimIndex() IndexDef {
	return IndexDef{Suffix: claimIndexSuffix, Columns: []string{t.cols.AvailableAt, t.cols.Attempts},
		Predicate: q(t.cols.PublishedAt) + " IS NULL", Supersedes: []string{t.cols.AvailableAt}}
}

// PublishedIndex is the index retention prunes through: without it, each
// prune batch would scan the table.
func (t *Table) PublishedIndex() IndexDef {
	return IndexDef{Suffix: publishedIndexSuffix, Columns: []string{t.cols.PublishedAt}, Predicate: q(t.cols.PublishedAt) + " IS NOT NULL"}
}

// Create renders the index on rel. On a table, CONCURRENTLY, because it
// belongs to a live application. Postgres refuses CONCURRENTLY on a
// partitioned table, so there it is created ON ONLY the parent, which locks
// no partition and reads no row: each partition's own index is then built
// concurrently and attached, and the parent's index becomes valid once every
// partition has one. Partitions created later get it from the parent.
func (d IndexDef) Create(rel Relation) Statement {
	var key []string
	for _, c := range d.Columns {
		key = append(key, q(c))
	}
	how, on := "CONCURRENTLY ", ""
	if rel.Partitioned {
		how, on = "", "ONLY "
	}
	return Statement{SQL: fmt.Sprintf("CREATE INDEX %sIF NOT EXISTS %s ON %s%s (%s) WHERE %s",
		how, q(rel.objectName(d.Suffix)), on, rel.ident(), strings.Join(key, ", "), d.Predicate)}
}

// Drop renders the removal of the index on rel: one left invalid by an
// interrupted build, or one of another shape under spillway's name.
// Postgres drops a partitioned index with its partitions' indexes, and not
// concurrently.
func (d IndexDef) Drop(rel Relation) Statement {
	how := "CONCURRENTLY "
	if rel.Partitioned {
		how = ""
	}
	return Statement{SQL: fmt.Sprintf("DROP INDEX %sIF EXISTS %s", how, rel.index(d.Suffix))}
}

// Attach renders the attachment of a partition's index to its parent's.
func (d IndexDef) Attach(parent, partition Relation) Statement {
	return Statement{SQL: fmt.Sprintf("ALTER INDEX %s ATTACH PARTITION %s", parent.index(d.Suffix), partition.index(d.Suffix))}
}

// IndexShape is an existing index as the catalog describes it.
type IndexShape struct {
	// OnTable is false when an index of that name belongs to another table.
	OnTable     bool
	Valid       bool
	Unique      bool
	Expressions bool
	Method      string
	Columns     []string
	Predicate   string
}

// IndexShapeQuery renders the look-up of the index of d's name on rel; no
// rows means there is none.
func (d IndexDef) IndexShapeQuery(rel Relation) Statement {
	return Statement{
		SQL: `SELECT i.indrelid = to_regclass($2), i.indisvalid, i.indisunique, i.indexprs IS NOT NULL, am.amname,
	array(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n),
	coalesce(pg_get_expr(i.indpred, i.indrelid), '')
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
WHERE i.indexrelid = to_regclass($1)`,
		Args: []any{rel.index(d.Suffix), rel.ident()},
	}
}

// AttachedQuery renders whether partition has an index attached to its
// parent's index of d: Postgres builds one, under a name of its own, for a
// partition created or attached after the parent's index.
func (d IndexDef) AttachedQuery(parent, partition Relation) Statement {
	return Statement{
		SQL: `SELECT count(*) > 0 FROM pg_inherits h JOIN pg_index i ON i.indexrelid = h.inhrelid
WHERE h.inhparent = to_regclass($1) AND i.indrelid = to_regclass($2)`,
		Args: []any{parent.index(d.Suffix), partition.ident()},
	}
}

// IDIndexQuery renders whether settles can find a claimed row through an
// index on the id (see heldUnder): the relation is a plain table without
// partitions or inheriting children, whose update would probe each of
// theirs, and a valid btree or hash index over every row has the id as its
// first key.
func (t *Table) IDIndexQuery() Statement {
	return Statement{
		SQL: `SELECT c.relkind = 'r' AND NOT EXISTS (SELECT FROM pg_inherits h WHERE h.inhparent = c.oid)
	AND EXISTS (SELECT FROM pg_index i
		JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = c.oid AND i.indisvalid AND i.indpred IS NULL AND am.amname IN ('btree', 'hash') AND a.attname = $2)
FROM pg_class c WHERE c.oid = to_regclass($1)`,
		Args: []any{t.ident, t.cols.ID},
	}
}

// Matches reports whether an existing index is d: a plain btree on the same
// columns with the same predicate. Its name alone could be anyone's index.
func (d IndexDef) Matches(s IndexShape) bool {
	return s.OnTable && !s.Unique && !s.Expressions && s.Method == "btree" &&
		slices.Equal(s.Columns, d.Columns) && normalizePredicate(s.Predicate) == normalizePredicate(d.Predicate)
}

// Superseded reports whether an existing index is the one d supersedes.
func (d IndexDef) Superseded(s IndexShape) bool {
	return d.Supersedes != nil && IndexDef{Columns: d.Supersedes, Predicate: d.Predicate}.Matches(s)
}

// Rebuild is d under the name a rebuild builds it by, beside the index it
// replaces.
func (d IndexDef) Rebuild() IndexDef {
	d.Suffix += "_rebuild"
	d.Supersedes = nil
	return d
}

// RenameRebuilt renders the rename of d's rebuild on rel to d's name, once
// the index it replaces is dropped.
func (d IndexDef) RenameRebuilt(rel Relation) Statement {
	return Statement{SQL: fmt.Sprintf("ALTER INDEX %s RENAME TO %s", rel.index(d.Rebuild().Suffix), q(rel.objectName(d.Suffix)))}
}

// normalizePredicate drops what pg_get_expr adds or leaves out: quotes and
// parentheses. Our predicates have no strings in which they could matter.
func normalizePredicate(p string) string {
	p = strings.NewReplacer(`"`, "", "(", "", ")", "").Replace(p)
	return strings.Join(strings.Fields(p), " ")
}

// NotifyChannel is the channel that the insert trigger notifies and the
// drainer listens on. Postgres refuses channel names of 64 bytes or more, and
// a failing trigger would fail the application's inserts, so a long name is
// replaced by a hash of it.
func (s TableSpec) NotifyChannel() string {
	schema, name := s.QualifiedName()
	channel := "spillway." + schema + "." + name
	if len(channel) > 63 {
		sum := sha256.Sum256([]byte(schema + "." + name))
		channel = "spillway." + hex.EncodeToString(sum[:12])
	}
	return channel
}

const notifyTriggerSuffix = "_spillway_notify"

// NotifyTrigger is the name of the insert trigger that notifies.
func (s TableSpec) NotifyTrigger() string { return s.objectName(notifyTriggerSuffix) }

// NotifyTriggerExists renders the look-up of the insert trigger.
func (s TableSpec) NotifyTriggerExists() Statement {
	schema, name := s.QualifiedName()
	return Statement{
		SQL:  "SELECT count(*) > 0 FROM pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2",
		Args: []any{pgx.Identifier{schema, name}.Sanitize(), s.objectName(notifyTriggerSuffix)},
	}
}

// CreateNotifyTrigger renders the statement-level insert trigger that wakes
// listening drainers: one notification per inserting statement, not per row,
// and Postgres folds identical notifications of one transaction into one.
//
// A notifying transaction holds a database-wide lock from its commit until
// its WAL flush, so plain NOTIFY serializes the application's inserting
// commits (about 420 single-row commits/s here, against 1,000 without it).
// One notifying transaction at a time is enough to wake the drainers: a
// transaction that cannot take the try-lock because another is notifying
// skips its notification and commits in parallel. Its row is claimed with
// the notifier's, or by the drainer's follow-up claim shortly after.
func (s TableSpec) CreateNotifyTrigger() []Statement {
	schema, name := s.QualifiedName()
	function := pgx.Identifier{schema, "spillway_notify"}.Sanitize()
	return []Statement{
		{SQL: fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF pg_try_advisory_xact_lock(`+notifyLock("TG_ARGV[0]")+`) THEN
		PERFORM pg_notify(TG_ARGV[0], '');
	END IF;
	RETURN NULL;
END
$$`, function)},
		{SQL: fmt.Sprintf("CREATE TRIGGER %s AFTER INSERT ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s(%s)",
			q(s.objectName(notifyTriggerSuffix)), pgx.Identifier{schema, name}.Sanitize(), function, quoteLiteral(s.NotifyChannel()))},
	}
}

// notifyLock is the key of the advisory lock the notify trigger tries, for
// the channel named by the expression channel: held by a notifying
// transaction, or shared by the drainers that claim on their own
// (NotifyHush).
func notifyLock(channel string) string {
	return "hashtext('spillway.notify'), hashtext(" + channel + ")"
}

// quoteLiteral quotes a string as an SQL literal. Only used for names that
// passed the identifier pattern, so there is no backslash to worry about.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
