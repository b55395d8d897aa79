package drainer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// identifierPattern is deliberately stricter than Postgres: a name that needs
// quoting to be legal is far more likely to be a typo or an injection attempt
// than a real outbox column.
var identifierPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

const identifierRule = "must be a plain SQL identifier: a letter or underscore, then letters, digits or underscores, at most 63 characters"

// Columns maps the outbox's logical columns to the table's physical names.
// An empty name means the canonical one; optional columns that the table
// does not have are left out when the table is resolved.
type Columns struct {
	ID          string
	Payload     string
	Headers     string
	EnqueuedAt  string
	AvailableAt string
	PublishedAt string
	ClaimedAt   string
	ClaimedBy   string
	Attempts    string
	LastError   string
}

// RoutingKey says where a row's routing key comes from. At most one field is
// set; with none, it is the canonical event_type column.
type RoutingKey struct {
	Column       string
	PayloadField string
	Constant     string
}

// TableSpec is the outbox table as the user declares it.
type TableSpec struct {
	// Name is "schema.table" or "table" (schema public).
	Name       string
	Columns    Columns
	RoutingKey RoutingKey
}

// logicalColumn describes one column of the table contract.
type logicalColumn struct {
	flag      string // the name used in --columns and in the CRD
	canonical string
	required  bool
	sqlType   string // as migrate creates it
	migrate   bool   // migrate adds it to an existing table
	field     func(*Columns) *string
}

var contract = []logicalColumn{
	{flag: "id", canonical: "id", required: true, sqlType: "uuid PRIMARY KEY DEFAULT gen_random_uuid()", field: func(c *Columns) *string { return &c.ID }},
	{flag: "payload", canonical: "payload", required: true, sqlType: "jsonb NOT NULL", field: func(c *Columns) *string { return &c.Payload }},
	{flag: "headers", canonical: "headers", sqlType: "jsonb", field: func(c *Columns) *string { return &c.Headers }},
	{flag: "enqueuedAt", canonical: "enqueued_at", sqlType: "timestamptz NOT NULL DEFAULT now()", field: func(c *Columns) *string { return &c.EnqueuedAt }},
	{flag: "availableAt", canonical: "available_at", sqlType: "timestamptz NOT NULL DEFAULT now()", field: func(c *Columns) *string { return &c.AvailableAt }},
	{flag: "publishedAt", canonical: "published_at", required: true, sqlType: "timestamptz", field: func(c *Columns) *string { return &c.PublishedAt }},
	{flag: "claimedAt", canonical: "claimed_at", required: true, sqlType: "timestamptz", migrate: true, field: func(c *Columns) *string { return &c.ClaimedAt }},
	{flag: "claimedBy", canonical: "claimed_by", required: true, sqlType: "text", migrate: true, field: func(c *Columns) *string { return &c.ClaimedBy }},
	{flag: "attempts", canonical: "attempts", required: true, sqlType: "integer NOT NULL DEFAULT 0", migrate: true, field: func(c *Columns) *string { return &c.Attempts }},
	{flag: "lastError", canonical: "last_error", sqlType: "text", field: func(c *Columns) *string { return &c.LastError }},
}

// ColumnFlagNames lists the logical names accepted by --columns.
func ColumnFlagNames() []string {
	names := make([]string, len(contract))
	for i, c := range contract {
		names[i] = c.flag
	}
	return names
}

// Set maps one logical column, named as in --columns, to a physical name.
func (c *Columns) Set(logical, physical string) error {
	for _, lc := range contract {
		if lc.flag == logical {
			*lc.field(c) = physical
			return nil
		}
	}
	return fmt.Errorf("unknown column %q: must be one of %s", logical, strings.Join(ColumnFlagNames(), ", "))
}

// name is the physical name the spec asks for: the mapped one, else canonical.
func (c Columns) name(lc logicalColumn) string {
	if n := *lc.field(&c); n != "" {
		return n
	}
	return lc.canonical
}

// QualifiedName splits the spec's table name into schema and table.
func (s TableSpec) QualifiedName() (schema, table string) {
	if schema, table, ok := strings.Cut(s.Name, "."); ok {
		return schema, table
	}
	return "public", s.Name
}

// Validate checks every identifier and the routing key source.
func (s TableSpec) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	schema, table := s.QualifiedName()
	if s.Name == "" {
		errs = append(errs, field.Required(path.Child("table"), "the outbox table, as schema.table or table"))
	} else if !identifierPattern.MatchString(schema) || !identifierPattern.MatchString(table) {
		errs = append(errs, field.Invalid(path.Child("table"), s.Name, "must be table or schema.table, each part "+identifierRule))
	}
	for _, lc := range contract {
		if n := *lc.field(&s.Columns); n != "" && !identifierPattern.MatchString(n) {
			errs = append(errs, field.Invalid(path.Child("columns", lc.flag), n, identifierRule))
		}
	}
	rk := s.RoutingKey
	set := 0
	for _, v := range []string{rk.Column, rk.PayloadField, rk.Constant} {
		if v != "" {
			set++
		}
	}
	if set > 1 {
		errs = append(errs, field.Invalid(path.Child("routingKey"), fmt.Sprintf("%+v", rk), "set only one of column, payloadField and constant"))
	}
	if rk.Column != "" && !identifierPattern.MatchString(rk.Column) {
		errs = append(errs, field.Invalid(path.Child("routingKey", "column"), rk.Column, identifierRule))
	}
	return errs
}

func (s TableSpec) routingKeyColumn() string {
	rk := s.RoutingKey
	if rk.PayloadField != "" || rk.Constant != "" {
		return ""
	}
	if rk.Column != "" {
		return rk.Column
	}
	return "event_type"
}

// CatalogColumn is one column of the live table, as pg_attribute has it.
type CatalogColumn struct {
	Name    string
	Type    string // format_type()
	NotNull bool
}

// Table is an outbox table resolved against the live catalog: every name is
// physical, an absent optional column is "", and the id's type is known. It
// renders every SQL statement Spillway runs against the outbox.
type Table struct {
	ident       string // quoted schema.table
	name        string // schema.table, for messages
	cols        Columns
	idType      string
	payloadType string
	routingKey  RoutingKey
}

// idTypes are the id column types the drainer can round-trip through text.
var idTypes = map[string]string{
	"uuid": "uuid", "bigint": "bigint", "integer": "integer", "text": "text",
}

var payloadTypes = map[string]bool{"jsonb": true, "json": true, "bytea": true, "text": true}

// ResolveTable checks the spec against the table's catalog columns and fixes
// the physical name of every column the drainer will use.
func ResolveTable(spec TableSpec, catalog []CatalogColumn) (*Table, error) {
	path := field.NewPath("database")
	if errs := spec.Validate(path); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	schema, name := spec.QualifiedName()
	qualified := schema + "." + name
	if len(catalog) == 0 {
		return nil, fmt.Errorf("table %s does not exist (run spillway migrate to create it)", qualified)
	}
	types := make(map[string]string, len(catalog))
	for _, c := range catalog {
		types[c.Name] = c.Type
	}
	t := &Table{
		ident:      pgx.Identifier{schema, name}.Sanitize(),
		name:       qualified,
		routingKey: spec.RoutingKey,
	}
	var errs field.ErrorList
	for _, lc := range contract {
		physical := spec.Columns.name(lc)
		explicit := *lc.field(&spec.Columns) != ""
		if _, ok := types[physical]; !ok {
			if lc.required || explicit {
				hint := ""
				if lc.migrate {
					hint = " (spillway migrate adds it)"
				}
				errs = append(errs, field.NotFound(path.Child("columns", lc.flag), fmt.Sprintf("%s in %s%s", physical, qualified, hint)))
			}
			continue
		}
		*lc.field(&t.cols) = physical
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	if idType, ok := idTypes[baseType(types[t.cols.ID])]; ok {
		t.idType = idType
	} else {
		errs = append(errs, field.Invalid(path.Child("columns", "id"), types[t.cols.ID], "the id column must be uuid, bigint, integer or text"))
	}
	t.payloadType = types[t.cols.Payload]
	if !payloadTypes[t.payloadType] {
		errs = append(errs, field.Invalid(path.Child("columns", "payload"), t.payloadType, "the payload column must be jsonb, json, bytea or text"))
	}
	if t.cols.Headers != "" && baseType(types[t.cols.Headers]) != "jsonb" && baseType(types[t.cols.Headers]) != "json" {
		errs = append(errs, field.Invalid(path.Child("columns", "headers"), types[t.cols.Headers], "the headers column must be jsonb or json"))
	}
	if rk := spec.routingKeyColumn(); rk != "" {
		if _, ok := types[rk]; !ok {
			errs = append(errs, field.NotFound(path.Child("routingKey", "column"), fmt.Sprintf("%s in %s", rk, qualified)))
		}
		t.routingKey = RoutingKey{Column: rk}
	}
	if spec.RoutingKey.PayloadField != "" && t.payloadType != "jsonb" && t.payloadType != "json" {
		errs = append(errs, field.Invalid(path.Child("routingKey", "payloadField"), spec.RoutingKey.PayloadField, "a payload field needs a jsonb or json payload column, not "+t.payloadType))
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return t, nil
}

// baseType strips a type modifier: "character varying(64)" is text to us.
func baseType(t string) string {
	if strings.HasPrefix(t, "character varying") {
		return "text"
	}
	return t
}

// Name is the table's schema-qualified name, for messages.
func (t *Table) Name() string { return t.name }

// PayloadType is the payload column's SQL type.
func (t *Table) PayloadType() string { return t.payloadType }

func q(name string) string { return pgx.Identifier{name}.Sanitize() }

// Statement is one SQL statement with its arguments.
type Statement struct {
	SQL  string
	Args []any
}

// ClaimParams are the knobs of one claim.
type ClaimParams struct {
	DrainerID       string
	BatchSize       int
	MaxAttempts     int
	LeaseMillis     int64
	MaxPayloadBytes int64
}

// Claim renders phase 1. The index that migrate creates is on
// (attempts, enqueued order) over pending rows, and the ORDER BY matches it:
// the range attempts < max never reaches poisoned rows, and fresh rows come
// before retries, so neither poison nor rows in backoff pile up in front of
// the live rows as the table ages.
//
// The update finds the locked rows by ctid, which cannot change while the
// row lock is held: a TID scan instead of a primary-key probe per row, which
// grows with the table. The ctids are an array rather than a join, so that
// even a generic plan, whose LIMIT is unknown, cannot pick a hash join over
// the whole table.
//
// A payload over the size limit comes back as NULL with its size, so an
// oversized row is never loaded into memory.
func (t *Table) Claim(p ClaimParams) Statement {
	c := t.cols
	var where []string
	where = append(where, q(c.PublishedAt)+" IS NULL", q(c.Attempts)+" < $3")
	if c.AvailableAt != "" {
		where = append(where, q(c.AvailableAt)+" <= now()")
	}
	where = append(where, fmt.Sprintf("(%s IS NULL OR %s < now() - $4 * interval '1 millisecond')", q(c.ClaimedAt), q(c.ClaimedAt)))

	args := []any{p.DrainerID, p.BatchSize, p.MaxAttempts, p.LeaseMillis, p.MaxPayloadBytes}
	routingKey := "o." + q(t.routingKey.Column) + "::text"
	switch {
	case t.routingKey.PayloadField != "":
		args = append(args, t.routingKey.PayloadField)
		routingKey = "o." + q(c.Payload) + " ->> $6::text"
	case t.routingKey.Constant != "":
		args = append(args, t.routingKey.Constant)
		routingKey = "$6::text"
	}
	size := "octet_length(o." + q(c.Payload) + ")"
	if t.payloadType == "jsonb" || t.payloadType == "json" {
		size = "octet_length(o." + q(c.Payload) + "::text)"
	}
	headers, enqueued := "NULL::jsonb", "now()"
	if c.Headers != "" {
		headers = "o." + q(c.Headers) + "::jsonb"
	}
	if c.EnqueuedAt != "" {
		enqueued = "o." + q(c.EnqueuedAt)
	}
	sql := fmt.Sprintf(`UPDATE %[1]s AS o SET %[5]s = now(), %[6]s = $1
WHERE o.ctid = ANY(ARRAY(
	SELECT ctid FROM %[1]s
	WHERE %[3]s
	ORDER BY %[4]s
	LIMIT $2
	FOR UPDATE SKIP LOCKED
))
RETURNING o.%[2]s::text, CASE WHEN %[7]s <= $5 THEN o.%[8]s END, %[7]s, %[9]s, %[10]s, %[11]s`,
		t.ident, q(c.ID), strings.Join(where, "\n\t  AND "), t.claimOrder(),
		q(c.ClaimedAt), q(c.ClaimedBy), size, q(c.Payload), routingKey, headers, enqueued)
	return Statement{SQL: sql, Args: args}
}

// claimOrder is the ORDER BY of the claim and the key of the claim index.
func (t *Table) claimOrder() string {
	order := q(t.cols.Attempts)
	if t.cols.EnqueuedAt != "" {
		return order + ", " + q(t.cols.EnqueuedAt)
	}
	return order + ", " + q(t.cols.ID)
}

// ids is the ANY(...) operand matching ids passed as text.
func (t *Table) ids(param string) string {
	return fmt.Sprintf("ANY(%s::text[]::%s[])", param, t.idType)
}

// fence guards every settle statement: a drainer whose lease was taken over
// changes nothing.
func (t *Table) fence(param string) string {
	return fmt.Sprintf("%s = %s AND %s IS NULL", q(t.cols.ClaimedBy), param, q(t.cols.PublishedAt))
}

// MarkPublished renders the settle of confirmed rows.
func (t *Table) MarkPublished(drainerID string, ids []string) Statement {
	return Statement{
		SQL: fmt.Sprintf("UPDATE %s SET %s = now() WHERE %s = %s AND %s",
			t.ident, q(t.cols.PublishedAt), q(t.cols.ID), t.ids("$1"), t.fence("$2")),
		Args: []any{ids, drainerID},
	}
}

// Backoff is the capped exponential retry delay for failed rows.
type Backoff struct {
	Initial, Max int64 // milliseconds
}

// RecordFailures renders the settle of rows the broker refused or that cannot
// be published: attempts + 1, last_error, and the next available_at at
// min(initial × 2^attempts, max) from the database's now(). The exponent is
// capped so a long-failing row cannot overflow the interval.
func (t *Table) RecordFailures(drainerID string, ids, reasons []string, b Backoff) Statement {
	c := t.cols
	set := []string{
		fmt.Sprintf("%[1]s = o.%[1]s + 1", q(c.Attempts)),
		q(c.ClaimedAt) + " = NULL",
		q(c.ClaimedBy) + " = NULL",
	}
	if c.LastError != "" {
		set = append(set, q(c.LastError)+" = f.reason")
	}
	if c.AvailableAt != "" {
		set = append(set, fmt.Sprintf("%s = now() + least($4 * interval '1 millisecond' * power(2, least(o.%s, 30)), $5 * interval '1 millisecond')",
			q(c.AvailableAt), q(c.Attempts)))
	}
	return Statement{
		SQL: fmt.Sprintf(`UPDATE %s AS o SET %s
FROM unnest($1::text[], $2::text[]) AS f(id, reason)
WHERE o.%s = f.id::%s AND o.%s`,
			t.ident, strings.Join(set, ", "), q(c.ID), t.idType, t.fence("$3")),
		Args: []any{ids, reasons, drainerID, b.Initial, b.Max},
	}
}

// Release renders the return of claims whose outcome is unknown or that were
// never published: no attempt is counted, because the row did nothing wrong.
func (t *Table) Release(drainerID string, ids []string) Statement {
	return Statement{
		SQL: fmt.Sprintf("UPDATE %s SET %s = NULL, %s = NULL WHERE %s = %s AND %s",
			t.ident, q(t.cols.ClaimedAt), q(t.cols.ClaimedBy), q(t.cols.ID), t.ids("$1"), t.fence("$2")),
		Args: []any{ids, drainerID},
	}
}

// ReleaseAll renders the startup release of every claim held under an ID: a
// restarted container inherits its pod name, and its predecessor's claims are
// no longer in flight.
func (t *Table) ReleaseAll(drainerID string) Statement {
	return Statement{
		SQL: fmt.Sprintf("UPDATE %s SET %s = NULL, %s = NULL WHERE %s",
			t.ident, q(t.cols.ClaimedAt), q(t.cols.ClaimedBy), t.fence("$1")),
		Args: []any{drainerID},
	}
}

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
// so that a claim or a release (which change no indexed column) can put the
// row's new version on the same page: a HOT update, with no index writes.
// In the benchmark this cut the drainer's Postgres CPU by about a third.
const canonicalFillfactor = 50

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
	return Statement{SQL: fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n\t%s\n) WITH (fillfactor = %d)",
		pgx.Identifier{schema, name}.Sanitize(), strings.Join(defs, ",\n\t"), canonicalFillfactor)}
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

// ClaimIndex renders the partial index that keeps claims cheap. CONCURRENTLY,
// because the table belongs to a live application.
// The index lives in the table's schema, so its name is unqualified.
func (t *Table) ClaimIndex(spec TableSpec) Statement {
	return Statement{SQL: fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (%s) WHERE %s IS NULL",
		q(spec.objectName(claimIndexSuffix)), t.ident, t.claimOrder(), q(t.cols.PublishedAt))}
}

// PublishedIndex renders the partial index on published_at that retention
// prunes through: without it, each prune batch would scan the table.
func (t *Table) PublishedIndex(spec TableSpec) Statement {
	return Statement{SQL: fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (%s) WHERE %s IS NOT NULL",
		q(spec.objectName(publishedIndexSuffix)), t.ident, q(t.cols.PublishedAt), q(t.cols.PublishedAt))}
}

// IndexValid renders the look-up of one of spillway's indexes: present, and
// valid (a failed concurrent build leaves an invalid index behind).
func (s TableSpec) IndexValid(suffix string) Statement {
	schema, _ := s.QualifiedName()
	return Statement{
		SQL:  "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)",
		Args: []any{pgx.Identifier{schema, s.objectName(suffix)}.Sanitize()},
	}
}

// DropIndex renders the removal of an invalid index.
func (s TableSpec) DropIndex(suffix string) Statement {
	schema, _ := s.QualifiedName()
	return Statement{SQL: "DROP INDEX CONCURRENTLY IF EXISTS " + pgx.Identifier{schema, s.objectName(suffix)}.Sanitize()}
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
	IF pg_try_advisory_xact_lock(hashtext('spillway.notify'), hashtext(TG_ARGV[0])) THEN
		PERFORM pg_notify(TG_ARGV[0], '');
	END IF;
	RETURN NULL;
END
$$`, function)},
		{SQL: fmt.Sprintf("CREATE TRIGGER %s AFTER INSERT ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s(%s)",
			q(s.objectName(notifyTriggerSuffix)), pgx.Identifier{schema, name}.Sanitize(), function, quoteLiteral(s.NotifyChannel()))},
	}
}

// quoteLiteral quotes a string as an SQL literal. Only used for names that
// passed the identifier pattern, so there is no backslash to worry about.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Listen renders the LISTEN on the table's notify channel.
func (s TableSpec) Listen() Statement { return Statement{SQL: "LISTEN " + q(s.NotifyChannel())} }

// PrunePublished renders one bounded batch of retention: published rows older
// than the window. SKIP LOCKED, so drainers pruning at once share the work.
func (t *Table) PrunePublished(window time.Duration, limit int) Statement {
	return t.prune(fmt.Sprintf("%s < now() - $1 * interval '1 millisecond'", q(t.cols.PublishedAt)),
		[]any{window.Milliseconds(), limit})
}

// PruneUnpublished renders one bounded batch of dropping pending rows older
// than maxAge, by enqueued_at. A row under a live lease is being published
// right now and is left to its drainer.
func (t *Table) PruneUnpublished(maxAge, lease time.Duration, limit int) Statement {
	c := t.cols
	return t.prune(fmt.Sprintf("%s IS NULL AND %s < now() - $1 * interval '1 millisecond' AND (%s IS NULL OR %s < now() - $3 * interval '1 millisecond')",
		q(c.PublishedAt), q(c.EnqueuedAt), q(c.ClaimedAt), q(c.ClaimedAt)),
		[]any{maxAge.Milliseconds(), limit, lease.Milliseconds()})
}

// prune deletes at most $2 rows matching where, found by ctid as the claim is.
func (t *Table) prune(where string, args []any) Statement {
	return Statement{
		SQL: fmt.Sprintf("DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s WHERE %s LIMIT $2 FOR UPDATE SKIP LOCKED))",
			t.ident, t.ident, where),
		Args: args,
	}
}

// HasEnqueuedAt reports whether the table has an enqueued-at column.
func (t *Table) HasEnqueuedAt() bool { return t.cols.EnqueuedAt != "" }
