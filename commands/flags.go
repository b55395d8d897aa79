package commands

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// registerTLSFlags binds the certificate files of one connection, named
// for it: --database-ca-file, --broker-ca-file.
func registerTLSFlags(fs *flag.FlagSet, conn string, files *secret.TLSFiles) {
	fs.StringVar(&files.CAFile, conn+"-ca-file", "",
		"file holding the CA that signs the "+conn+"'s certificate: TLS, verifying the server's certificate and its name (a mounted secret)")
	fs.StringVar(&files.CertFile, conn+"-cert-file", "", "file holding the client certificate presented to the "+conn+", with --"+conn+"-key-file")
	fs.StringVar(&files.KeyFile, conn+"-key-file", "", "file holding the client certificate's private key")
}

// registerTableFlags binds the flags that name the outbox, its database and
// its mapping, which drain, migrate and poisoned share.
func registerTableFlags(fs *flag.FlagSet, database *secret.URLSource, pooling *outbox.Pooling, table *outbox.TableSpec) {
	fs.StringVar(&database.URL, "database-url", os.Getenv("DATABASE_URL"),
		"outbox database URL, for local use (default $DATABASE_URL); several hosts with target_session_attrs=read-write find the primary after a failover")
	fs.StringVar(&database.File, "database-url-file", "", "file holding the database URL, re-read at every connect (a mounted secret)")
	registerTLSFlags(fs, "database", &database.TLS)
	fs.Func("database-pool-mode", `how the URL's server hands out sessions: session (Postgres itself, or a pooler in session mode) or transaction (PgBouncer's pool_mode = transaction: no session state is kept through it) (default "session")`,
		func(v string) error { pooling.Mode = outbox.PoolMode(v); return nil })
	fs.BoolFunc("database-prepared-statements",
		"use named prepared statements (default true in session pool mode; false in transaction mode, where only PgBouncer 1.21+ with max_prepared_statements keeps them)",
		func(v string) error {
			on, err := strconv.ParseBool(v)
			pooling.PreparedStatements = &on
			return err
		})
	fs.StringVar(&table.Name, "table", table.Name, "outbox table, as schema.table")
	fs.Var(columnsFlag{&table.Columns}, "columns",
		"column mapping logical=physical, comma-separated; logical names: "+strings.Join(outbox.ColumnFlagNames(), ", "))
	fs.StringVar(&table.RoutingKey.Column, "routing-key-column", "", "take the routing key from this column (default event_type)")
	fs.StringVar(&table.RoutingKey.PayloadField, "routing-key-field", "", "take the routing key from this top-level field of a JSON payload")
	fs.StringVar(&table.RoutingKey.Constant, "routing-key", "", "publish every row with this routing key")
	fs.StringVar(&table.Ordering.KeyColumn, "ordering-key-column", "",
		"publish the rows of each value of this column (an aggregate's id) one at a time, in enqueue order (unset: no per-key order)")
}

// columnsFlag parses --columns logical=physical,...
type columnsFlag struct{ c *outbox.Columns }

func (f columnsFlag) String() string { return "" }

func (f columnsFlag) Set(s string) error {
	for _, pair := range strings.Split(s, ",") {
		logical, physical, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return fmt.Errorf("%q: want logical=physical, e.g. id=event_id", pair)
		}
		if err := f.c.Set(logical, physical); err != nil {
			return err
		}
	}
	return nil
}

// windowFlag is an optional duration: unset takes the default, and a zero
// or negative value reaches validation to be refused, not silently ignored.
type windowFlag struct{ d **time.Duration }

func (f windowFlag) String() string {
	if f.d == nil || *f.d == nil {
		return ""
	}
	return (*f.d).String()
}
func (f windowFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*f.d = &d
	return nil
}

// listFlag collects a repeatable, comma-separated flag.
type listFlag struct{ values *[]string }

func (f listFlag) String() string {
	if f.values == nil {
		return ""
	}
	return strings.Join(*f.values, ",")
}

func (f listFlag) Set(s string) error {
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*f.values = append(*f.values, v)
		}
	}
	return nil
}

// timeFlag is an optional RFC 3339 time.
type timeFlag struct{ t **time.Time }

func (f timeFlag) String() string {
	if f.t == nil || *f.t == nil {
		return ""
	}
	return (*f.t).Format(time.RFC3339Nano)
}

func (f timeFlag) Set(s string) error {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return errors.New("want an RFC 3339 time, such as 2024-06-01T12:00:00Z")
	}
	*f.t = &t
	return nil
}
