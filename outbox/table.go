package outbox

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	ParkedAt    string
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
	// Ordering, when its key column is set, publishes the rows of one key
	// one at a time, in enqueue order.
	Ordering Ordering
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
	{flag: "id", canonical: "id", required: true, sqlType: "uuid PRIMARY KEY DEFAULT " + timeOrderedUUID, field: func(c *Columns) *string { return &c.ID }},
	{flag: "payload", canonical: "payload", required: true, sqlType: "jsonb NOT NULL", field: func(c *Columns) *string { return &c.Payload }},
	{flag: "headers", canonical: "headers", sqlType: "jsonb", field: func(c *Columns) *string { return &c.Headers }},
	{flag: "enqueuedAt", canonical: "enqueued_at", sqlType: "timestamptz NOT NULL DEFAULT now()", field: func(c *Columns) *string { return &c.EnqueuedAt }},
	// available_at is every row's due time: the claim orders and indexes by
	// it, and a lease, a backoff and a poison are values of it. Postgres 11
	// and later add it with its default without rewriting the table.
	{flag: "availableAt", canonical: "available_at", sqlType: "timestamptz NOT NULL DEFAULT now()", migrate: true, field: func(c *Columns) *string { return &c.AvailableAt }},
	{flag: "publishedAt", canonical: "published_at", required: true, sqlType: "timestamptz", field: func(c *Columns) *string { return &c.PublishedAt }},
	{flag: "claimedAt", canonical: "claimed_at", required: true, sqlType: "timestamptz", migrate: true, field: func(c *Columns) *string { return &c.ClaimedAt }},
	{flag: "claimedBy", canonical: "claimed_by", required: true, sqlType: "text", migrate: true, field: func(c *Columns) *string { return &c.ClaimedBy }},
	{flag: "attempts", canonical: "attempts", required: true, sqlType: "integer NOT NULL DEFAULT 0", migrate: true, field: func(c *Columns) *string { return &c.Attempts }},
	{flag: "lastError", canonical: "last_error", sqlType: "text", field: func(c *Columns) *string { return &c.LastError }},
	// parked_at marks a poisoned row that was parked: kept for a later
	// replay or export, out of the poisoned count, and due at 'infinity' so
	// no claim reaches it. Nullable without a default, so adding it rewrites
	// nothing; a table without it can be replayed, not parked.
	{flag: "parkedAt", canonical: "parked_at", sqlType: "timestamptz", migrate: true, field: func(c *Columns) *string { return &c.ParkedAt }},
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

// physical is the physical name the spec asks for of the logical column
// named flag, as in --columns.
func (c Columns) physical(flag string) string {
	for _, lc := range contract {
		if lc.flag == flag {
			return c.name(lc)
		}
	}
	panic("no logical column " + flag)
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
	return append(errs, s.Ordering.validate(path.Child("ordering"))...)
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
	// dueNotNull says the available_at column refuses NULL: a row with a
	// NULL due time would never be claimed.
	dueNotNull bool
	// order is nil unless rows are published in order per key.
	order *keyOrder
	// settleByID says an index leads with the id, so settles find their rows
	// through it (see heldUnder).
	settleByID bool
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
	notNull := make(map[string]bool, len(catalog))
	for _, c := range catalog {
		types[c.Name], notNull[c.Name] = c.Type, c.NotNull
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
	t.dueNotNull = t.cols.AvailableAt != "" && notNull[t.cols.AvailableAt]
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
	if key := spec.Ordering.KeyColumn; key != "" {
		t.order, errs = resolveKeyOrder(spec.Ordering, types, qualified, path.Child("ordering"), errs)
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

// DefaultTableName is the outbox table of a drainer or a migrate that names
// none.
const DefaultTableName = "public.outbox"

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
	// MaxClaimBytes is the claim's byte budget: it stops adding rows at the
	// first whose payload would take it over, so a row larger than the
	// budget is claimed alone.
	MaxClaimBytes int64
}

// Claim renders phase 1, on a table whose every row carries its due time in
// available_at: a fresh row is due when it is enqueued, a row in backoff when
// its backoff ends, a claimed row when its lease expires (the claim moves its
// due time a lease ahead), and a poisoned row never ('infinity'). The claim
// takes live due rows in due order, so a retried row waits only behind rows
// that were due before it, whatever the fresh backlog. Through the claim
// index on (available_at) over pending rows it reads only due rows: rows in
// backoff, poisoned rows, rows leased by others and published history all
// lie past now() or outside the index, so a claim costs O(batch) however
// many of them pile up.
//
// A due row that is not live (at maxAttempts with a finite due time: an
// adopted table's poisoned rows, a lowered maxAttempts, a row set back by
// hand; or a parked row made due by hand) is passed over, never locked:
// taking such rows out of line a batch per claim kept the live rows behind
// a million of them waiting for two thousand claims. They cost the claim a
// look each until ShelveSpent gives them the due time they should have.
//
// The statement, step by step:
//   - live: up to a batch of live due rows, locked, in due order.
//   - the budget: those rows in due order, adding each payload's size, up
//     to the first row that would take the claim over its byte budget; the
//     first row is always taken. A payload that is cheap to size (a text or
//     bytea, or a JSON payload stored in under 2 kB) is sized as it is
//     found; when every row was, the budget is a running sum. Otherwise a
//     walk sizes each row only as it reaches it, so a large backlog of large
//     payloads costs one row each.
//   - taken: the rows within the budget, with their sizes and their places
//     in due order. The rest stay unclaimed and are unlocked at commit.
//   - the update stamps the lease; claimed_by names the drainer and
//     claimed_at, the claim's transaction time, is the claim's token: every
//     settle is fenced on both.
//
// Rows are found again by table oid and ctid, which cannot change while the
// row lock is held: one TID scan, not a primary-key probe per row. A ctid
// names a row only within one table, and a partition or an inheriting child
// numbers its own, so the oid goes with it.
//
// A payload over the size limit comes back as NULL with its size, so an
// oversized row is never loaded into memory; it counts nothing against the
// budget.
//
// Each row returns its place in due order, since an update returns its rows
// in the order it found them (by ctid, which follows where each row landed in
// the table, not when it came due), and the number of live rows that were
// due, so the drainer can tell a claim cut short by its budget from an
// outbox with nothing more due.
func (t *Table) Claim(p ClaimParams) Statement {
	if t.order != nil {
		return t.claimInOrder(p)
	}
	args, terms := t.claimTerms(p)
	sql := fmt.Sprintf(`WITH RECURSIVE live AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid, %[3]s AS due_at, %[13]s AS size
	FROM %[1]s
	WHERE %[5]s IS NULL AND %[3]s <= now() AND %[4]s
	ORDER BY %[3]s
	LIMIT $2
	FOR UPDATE SKIP LOCKED
),
`+claimBudget+`
UPDATE %[1]s AS o SET %[7]s = now(), %[8]s = $1, %[3]s = now() + $4 * interval '1 millisecond'
FROM taken k
WHERE `+takenRows+`
RETURNING o.%[2]s::text, o.tableoid, o.ctid, o.%[7]s, CASE WHEN k.size <= $5 THEN o.%[9]s END, k.size, %[10]s, %[11]s, %[12]s,
	k.n, (SELECT count(*) FROM live)`, terms...)
	return Statement{SQL: sql, Args: args}
}

// claimBudget is the part of the claim that sizes the live due rows and
// keeps those within the byte budget (see Claim): from live, the rows the
// claim may take in due order, it makes taken. It takes the claim's format
// arguments. The walk's lateral stays a subquery (OFFSET 0): pulled up, its
// size became five subplans, each set up by every claim, walking or not.
const claimBudget = `sized AS (
	SELECT toid, tid, size, n FROM (
		SELECT toid, tid, size, row_number() OVER w AS n, sum(CASE WHEN size <= $5 THEN size ELSE 0 END) OVER w AS bytes
		FROM live
		WINDOW w AS (ORDER BY due_at, tid)
	) s
	WHERE n = 1 OR bytes <= $6
),
queue AS MATERIALIZED (
	SELECT array_agg(toid ORDER BY due_at, tid) AS toids, array_agg(tid ORDER BY due_at, tid) AS tids,
		array_agg(size ORDER BY due_at, tid) AS sizes
	FROM live
),
budget(n, bytes, size) AS (
	SELECT 0, 0::bigint, 0::bigint
	UNION ALL
	SELECT b.n + 1, b.bytes + CASE WHEN r.size <= $5 THEN r.size ELSE 0 END, r.size
	FROM budget b, queue q, LATERAL (
		SELECT coalesce(q.sizes[b.n + 1],
			(SELECT %[6]s FROM %[1]s o WHERE o.tableoid = q.toids[b.n + 1] AND o.ctid = q.tids[b.n + 1])) AS size
		OFFSET 0
	) r
	WHERE b.n < cardinality(q.tids) AND (b.n = 0 OR b.bytes + CASE WHEN r.size <= $5 THEN r.size ELSE 0 END <= $6)
),
taken AS (
	SELECT toid, tid, size, n FROM sized WHERE (SELECT coalesce(bool_and(size IS NOT NULL), true) FROM live)
	UNION ALL
	SELECT q.toids[b.n], q.tids[b.n], b.size, b.n FROM budget b, queue q
	WHERE b.n > 0 AND NOT (SELECT coalesce(bool_and(size IS NOT NULL), true) FROM live)
)`

// takenRows is how a claim's update finds the rows it takes (alias o) in
// taken (alias k): all in one TID scan, matched to taken by a hash join.
// Compared as tids, the ctids let a session that planned the claim while
// few rows were due look each row up in a TID scan of its own, filtered by
// the whole list: quadratic in the claim, and a quarter of the Postgres CPU
// of a claim of 500 rows once a backlog built up. As text, they can only be
// hashed or sorted. The other lists found again by ctid (see locatedIn)
// keep comparing tids: the planner expects a row or so in them, and would
// nest a scan of every listed ctid inside each.
const takenRows = "o.ctid = ANY(ARRAY(SELECT tid FROM taken)) AND o.tableoid = k.toid AND o.ctid::text = k.tid::text"

// claimTerms are the claim's arguments, and its format arguments: 1 the
// table, 2 id, 3 due time, 4 live, 5 published at, 6 a payload's size, 7
// claimed at, 8 claimed by, 9 payload, 10 routing key, 11 headers, 12
// enqueued at, 13 the cheap size.
func (t *Table) claimTerms(p ClaimParams) (args, terms []any) {
	c := t.cols
	args = []any{p.DrainerID, p.BatchSize, p.MaxAttempts, p.LeaseMillis, p.MaxPayloadBytes, p.MaxClaimBytes}
	routingKey := "o." + q(t.routingKey.Column) + "::text"
	switch {
	case t.routingKey.PayloadField != "":
		args = append(args, t.routingKey.PayloadField)
		routingKey = "o." + q(c.Payload) + " ->> $7::text"
	case t.routingKey.Constant != "":
		args = append(args, t.routingKey.Constant)
		routingKey = "$7::text"
	}
	headers, enqueued := "NULL::jsonb", "now()"
	if c.Headers != "" {
		headers = "o." + q(c.Headers) + "::jsonb"
	}
	if c.EnqueuedAt != "" {
		enqueued = "o." + q(c.EnqueuedAt)
	}
	return args, []any{t.ident, q(c.ID), q(c.AvailableAt), t.live("$3"), q(c.PublishedAt), t.payloadSize("o"),
		q(c.ClaimedAt), q(c.ClaimedBy), q(c.Payload), routingKey, headers, enqueued, t.cheapPayloadSize()}
}

// live is the condition that a pending row (unqualified) may be claimed
// when it is due: it has attempts left, maxAttempts being the parameter
// maxAttempts, and it is not parked. A parked row is due at 'infinity' and
// never reaches a claim; one made due by hand is still not published.
func (t *Table) live(maxAttempts string) string {
	live := q(t.cols.Attempts) + " < " + maxAttempts
	if t.cols.ParkedAt != "" {
		live += " AND " + q(t.cols.ParkedAt) + " IS NULL"
	}
	return live
}

// ShelveSpent renders one bounded batch of the shelving of spent rows: due
// rows that are not live (see Claim) get the due time 'infinity', the one a
// failure at maxAttempts gives, so that claims no longer pass over them. A
// parked row keeps its parked_at, and with it its place out of the
// poisoned count. Rows are taken in due order, the oldest first, as claims
// meet them.
func (t *Table) ShelveSpent(maxAttempts, limit int) Statement {
	c := t.cols
	return Statement{
		SQL: fmt.Sprintf(`WITH spent AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid FROM %[1]s
	WHERE %[2]s IS NULL AND %[3]s <= now() AND NOT (%[4]s)
	ORDER BY %[3]s
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE %[1]s AS o SET %[3]s = 'infinity', %[5]s = NULL, %[6]s = NULL WHERE %[7]s`,
			t.ident, q(c.PublishedAt), q(c.AvailableAt), t.live("$1"), q(c.ClaimedAt), q(c.ClaimedBy), locatedIn("spent")),
		Args: []any{maxAttempts, limit},
	}
}

// NamedStatement is a statement and what it is, for messages.
type NamedStatement struct {
	Name string
	Statement
}

// Rehearsal renders the drainers' claim and settles under EXPLAIN, named
// claim and settle: the database plans each, checking the table, the
// columns and the privileges it needs, and runs none. So even a read-only
// transaction can rehearse them.
func (t *Table) Rehearsal(maxAttempts int) []NamedStatement {
	explain := func(name string, s Statement) NamedStatement {
		s.SQL = "EXPLAIN " + s.SQL
		return NamedStatement{Name: name, Statement: s}
	}
	const drainer = "rehearsal"
	claim := ClaimParams{DrainerID: drainer, BatchSize: 1, MaxAttempts: maxAttempts, LeaseMillis: 1, MaxPayloadBytes: 1, MaxClaimBytes: 1}
	return []NamedStatement{
		explain(StatementClaim, t.Claim(claim)),
		explain(StatementSettle, t.MarkPublished(drainer, nil)),
		explain(StatementSettle, t.RecordFailures(drainer, nil, []string{}, FailurePolicy{InitialMillis: 1, MaxMillis: 1, MaxAttempts: maxAttempts})),
	}
}

// payloadSize is the size of the payload of the row aliased alias as the
// drainer receives it: a JSON payload as its text.
func (t *Table) payloadSize(alias string) string {
	payload := alias + "." + q(t.cols.Payload)
	if t.isJSON() {
		return "octet_length(" + payload + "::text)"
	}
	return "octet_length(" + payload + ")"
}

// cheapPayloadSize is the payload's size where it costs little to know, and
// NULL where it does not: a text or bytea knows its length without being
// read, but a JSON payload is sized by writing it out as text, which for a
// large one is more work than its claim, so only one stored in under 2 kB is.
func (t *Table) cheapPayloadSize() string {
	payload := q(t.cols.Payload)
	if t.isJSON() {
		return "CASE WHEN pg_column_size(" + payload + ") < 2048 THEN octet_length(" + payload + "::text) END"
	}
	return "octet_length(" + payload + ")"
}

func (t *Table) isJSON() bool { return t.payloadType == "jsonb" || t.payloadType == "json" }

// dueInLine is the due time a row, aliased alias, gets when it goes back in
// line (a waiting row whose turn came, a replayed row): its enqueued_at, so
// that it queues among the other rows by age, where rows made due at one
// now() would tie and go out in the order of their places in the table. A
// table or a row without enqueued_at has no place to go back to: now().
func (t *Table) dueInLine(alias string) string {
	if t.cols.EnqueuedAt == "" {
		return "now()"
	}
	return "coalesce(" + alias + "." + q(t.cols.EnqueuedAt) + ", now())"
}

// locatedIn matches the target rows (alias o) whose table oid and ctid are
// listed by a query over from, which selects toid and tid.
func locatedIn(from string) string {
	return fmt.Sprintf("o.ctid = ANY(ARRAY(SELECT tid FROM %[1]s)) AND (o.tableoid, o.ctid) IN (SELECT toid, tid FROM %[1]s)", from)
}

// Locator is where the version of a row that a claim returned lives: its
// table's oid (a partition's, for a partitioned outbox) and its ctid.
type Locator struct {
	Table uint32
	TID   pgtype.TID
}

// Lease is one claimed row as its claim holds it: the row's id and locator,
// and the claim's token. A settle changes the row only while the locator and
// the token still match, so a row whose lease expired and was claimed again,
// even by the same drainer, is left to its new claim.
type Lease struct {
	ID    string
	Row   Locator
	Token time.Time
}

// leaseArgs splits leases into the parallel arrays that settle statements
// unnest.
func leaseArgs(leases []Lease) (tables []uint32, tids []pgtype.TID, tokens []time.Time) {
	tables, tids, tokens = make([]uint32, len(leases)), make([]pgtype.TID, len(leases)), make([]time.Time, len(leases))
	for i, l := range leases {
		tables[i], tids[i], tokens[i] = l.Row.Table, l.Row.TID, l.Token
	}
	return tables, tids, tokens
}

// leaseIDs are the leases' row ids, for a settle that finds rows by id.
func leaseIDs(leases []Lease) []string {
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = l.ID
	}
	return ids
}

// settle renders one settle statement: set applies to the rows of leases
// that this drainer still holds under the same claim. args follow the
// drainer ID as $5...; reasons, when given, ride along with each lease as
// s.reason. Each lease finds its own row (see heldUnder): a condition on all
// the ctids at once (ctid = ANY) turned the join into a comparison of every
// row with every lease, quadratic in the batch.
func (t *Table) settle(drainerID string, leases []Lease, set []string, reasons []string, args ...any) Statement {
	from, where, all := t.heldUnder(drainerID, leases, reasons, args)
	return Statement{
		SQL:  fmt.Sprintf("UPDATE %s AS o SET %s\nFROM %s\nWHERE %s", t.ident, strings.Join(set, ", "), from, where),
		Args: all,
	}
}

// heldUnder is what every settle shares: the leases unnested (aliased s),
// and the condition that the row (aliased o) is still held under the same
// claim: the same version, stamped by this drainer with the same token.
//
// Where an index leads with the id, the row is found through it, and the
// version is checked in a form the planner cannot turn into a TID scan. An
// index's fetch prunes the page of the versions no one can see any more (the
// claim's old ones), where a TID scan does not, so the settle's new version
// can stay on the row's page. Found by TID, it went to a new page unless a
// claim running ahead had read past the row and pruned its page: in claims
// of 30, each settled before the next, the table grew by 85 % and the drain
// wrote 792 kB of WAL per 1,000 events; found by id, the table kept its
// size and the drain wrote 540 kB.
//
// The row being unpublished is checked in a form that no partial index of
// pending rows matches: planned while the table was new and small (see
// ConnectPool), a settle read every pending row of the drainer's through
// the claim index rather than look up its own.
func (t *Table) heldUnder(drainerID string, leases []Lease, reasons []string, args []any) (from, where string, all []any) {
	tables, tids, tokens := leaseArgs(leases)
	all = append([]any{tables, tids, tokens, drainerID}, args...)
	arrays, columns := "$1::oid[], $2::tid[], $3::timestamptz[]", "toid, tid, token"
	if reasons != nil {
		all = append(all, reasons)
		arrays, columns = arrays+fmt.Sprintf(", $%d::text[]", len(all)), columns+", reason"
	}
	c := t.cols
	located := "o.tableoid = s.toid AND o.ctid = s.tid"
	if t.settleByID {
		all = append(all, leaseIDs(leases))
		arrays, columns = arrays+fmt.Sprintf(", $%d::text[]", len(all)), columns+", id"
		located = fmt.Sprintf("o.%s = s.id::%s AND o.tableoid = s.toid AND (o.ctid = s.tid) IS TRUE", q(c.ID), t.idType)
	}
	from = fmt.Sprintf("unnest(%s) AS s(%s)", arrays, columns)
	where = fmt.Sprintf("%s\n\tAND o.%s = $4 AND o.%s = s.token AND (o.%s IS NULL) IS TRUE",
		located, q(c.ClaimedBy), q(c.ClaimedAt), q(c.PublishedAt))
	return from, where, all
}

// MarkPublished renders the settle of confirmed rows.
func (t *Table) MarkPublished(drainerID string, leases []Lease) Statement {
	return t.settle(drainerID, leases, []string{q(t.cols.PublishedAt) + " = now()"}, nil)
}

// DeletePublished renders the settle of confirmed rows when published rows
// are not kept (retention.published 0s): fenced like every settle, it
// deletes them. A deletion writes no new row version and no index entry,
// where marking writes both; in make bench the drain cost Postgres 22 µs per
// event against 32, and a third less WAL.
func (t *Table) DeletePublished(drainerID string, leases []Lease) Statement {
	from, where, all := t.heldUnder(drainerID, leases, nil, nil)
	return Statement{SQL: fmt.Sprintf("DELETE FROM %s AS o\nUSING %s\nWHERE %s", t.ident, from, where), Args: all}
}

// FailurePolicy is what a failed attempt costs a row: the capped exponential
// delay before its next attempt, and the attempts after which it is poisoned.
type FailurePolicy struct {
	InitialMillis, MaxMillis int64
	MaxAttempts              int
}

// RecordFailures renders the settle of rows the broker refused or that cannot
// be published: attempts + 1, last_error, and the next due time, at
// min(initial × 2^attempts, max) from the database's now(), or 'infinity'
// once the row has used its attempts: it is poisoned. The exponent is capped
// so a long-failing row cannot overflow the interval.
func (t *Table) RecordFailures(drainerID string, leases []Lease, reasons []string, f FailurePolicy) Statement {
	c := t.cols
	set := []string{
		fmt.Sprintf("%[1]s = o.%[1]s + 1", q(c.Attempts)),
		q(c.ClaimedAt) + " = NULL",
		q(c.ClaimedBy) + " = NULL",
		fmt.Sprintf(`%s = CASE WHEN o.%s + 1 >= $7 THEN 'infinity'::timestamptz
		ELSE now() + least($5 * interval '1 millisecond' * power(2, least(o.%s, 30)), $6 * interval '1 millisecond') END`,
			q(c.AvailableAt), q(c.Attempts), q(c.Attempts)),
	}
	if c.LastError != "" {
		set = append(set, q(c.LastError)+" = s.reason")
	}
	return t.settle(drainerID, leases, set, reasons, f.InitialMillis, f.MaxMillis, f.MaxAttempts)
}

// Release renders the return of claims whose outcome is unknown or that were
// never published: no attempt is counted, because the row did nothing wrong.
// The row is due again at once.
func (t *Table) Release(drainerID string, leases []Lease) Statement {
	return t.settle(drainerID, leases, t.unclaim(), nil)
}

// unclaim is the assignments that give a claim back. The row is due before
// any row that was not claimed ('-infinity'): it was first in line when it
// was claimed, and a due time of now() would queue it behind every row that
// came due while it was held, in a backlog enqueued at once behind all of it.
func (t *Table) unclaim() []string {
	c := t.cols
	return []string{q(c.ClaimedAt) + " = NULL", q(c.ClaimedBy) + " = NULL", q(c.AvailableAt) + " = '-infinity'"}
}

// ReleaseHeld renders the release of every claim held under drainerID except
// those of the claims whose tokens are kept: at start-up (a restarted
// container inherits its pod name, and its predecessor's claims are no
// longer in flight), at shutdown, and after a claim whose result was lost
// (it may have committed); and by the operator, for a drainer it knows is
// dead. A held row is due when its lease ends, within a lease from now, so
// the look-up reads only that stretch of the claim index. The rows are due
// first, as Release's are.
func (t *Table) ReleaseHeld(drainerID string, lease time.Duration, keep []time.Time) Statement {
	c := t.cols
	if keep == nil {
		keep = []time.Time{} // NULL would make <> ALL unknown, and release nothing
	}
	return Statement{
		SQL: fmt.Sprintf(`UPDATE %[1]s SET %[6]s
WHERE %[3]s = $1 AND %[5]s IS NULL AND %[4]s > now() AND %[4]s <= now() + $2 * interval '1 millisecond'
	AND %[2]s <> ALL($3::timestamptz[])`,
			t.ident, q(c.ClaimedAt), q(c.ClaimedBy), q(c.AvailableAt), q(c.PublishedAt), strings.Join(t.unclaim(), ", ")),
		Args: []any{drainerID, lease.Milliseconds(), keep},
	}
}

// PrunePublished renders one bounded batch of retention: published rows older
// than the window. SKIP LOCKED, so drainers pruning at once share the work.
func (t *Table) PrunePublished(window time.Duration, limit int) Statement {
	return t.prune(fmt.Sprintf("%s < now() - $1 * interval '1 millisecond'", q(t.cols.PublishedAt)),
		[]any{window.Milliseconds(), limit})
}

// PruneUnpublished renders one bounded batch of dropping pending rows older
// than maxAge, by enqueued_at. A row under a live lease (claimed, and due
// only when the lease ends) is being published right now and is left to its
// drainer.
func (t *Table) PruneUnpublished(maxAge time.Duration, limit int) Statement {
	c := t.cols
	where := fmt.Sprintf("%s IS NULL AND %s < now() - $1 * interval '1 millisecond' AND (%s IS NULL OR %s <= now())",
		q(c.PublishedAt), q(c.EnqueuedAt), q(c.ClaimedBy), q(c.AvailableAt))
	if c.ParkedAt != "" {
		// A parked row was kept on purpose, for a later replay or export.
		where += " AND " + q(c.ParkedAt) + " IS NULL"
	}
	return t.prune(where, []any{maxAge.Milliseconds(), limit})
}

// prune deletes at most $2 rows matching where, found again by table oid and
// ctid as the claim's rows are: by ctid alone, a partitioned outbox would
// lose rows of one partition to a prune of another.
func (t *Table) prune(where string, args []any) Statement {
	return Statement{
		SQL: fmt.Sprintf(`WITH doomed AS MATERIALIZED (
	SELECT tableoid AS toid, ctid AS tid FROM %[1]s WHERE %[2]s LIMIT $2 FOR UPDATE SKIP LOCKED
)
DELETE FROM %[1]s AS o WHERE %[3]s`, t.ident, where, locatedIn("doomed")),
		Args: args,
	}
}

// HasEnqueuedAt reports whether the table has an enqueued-at column.
func (t *Table) HasEnqueuedAt() bool { return t.cols.EnqueuedAt != "" }
