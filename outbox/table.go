package outbox

import (
	"fmt"
	"regexp"
	"strings"

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
	ParkedAt    string
	// TraceParent and TraceState hold a row's W3C trace context, which its
	// message carries on (see the traceparent and tracestate keys of the
	// headers column for the other place it may be).
	TraceParent string
	TraceState  string
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
	// The trace context of the transaction that wrote the row. A new table
	// has them; an existing one without them is read as if they were NULL.
	{flag: "traceparent", canonical: "traceparent", sqlType: "text", field: func(c *Columns) *string { return &c.TraceParent }},
	{flag: "tracestate", canonical: "tracestate", sqlType: "text", field: func(c *Columns) *string { return &c.TraceState }},
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
	// claims is the quoted name of the claims table that holds the leases,
	// or "" where they are in the rows (see claims_table.go).
	claims string
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

// HasEnqueuedAt reports whether the table has an enqueued-at column.
func (t *Table) HasEnqueuedAt() bool { return t.cols.EnqueuedAt != "" }
