package main

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spillway-io/spillway/drainer"
)

// walRecord is one kind of WAL record written over a stretch, per event.
type walRecord struct {
	kind           string // resource manager/record type, as pg_waldump names it
	count, bytes   float64
	fullPageBytes  float64
	combinedShares float64
}

// walAnatomy is the section "wal": where each byte of WAL per event goes.
// The outbox is filled by one INSERT statement, as the application's
// transactions would fill it, then drained with the settle marking rows
// published (the default), and again with published rows deleted on
// confirm. Each stretch's WAL is read by record type with pg_walinspect; no
// checkpoint falls between the insert and the drain.
func (b *bench) walAnatomy(ctx context.Context) []string {
	if _, err := b.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		fmt.Printf("\nwhere the WAL goes: skipped, pg_walinspect is not available: %v\n", err)
		return nil
	}
	fmt.Printf("\nwhere the WAL goes, per event: %d events of %d bytes inserted by one statement, then drained by one drainer; records/event × bytes, by record type (pg_walinspect)\n",
		*events, *payloadBytes)
	var zero time.Duration
	settles := []struct {
		what  string
		tweak func(*drainer.Config)
	}{
		{"drain, settle marks published (default)", nil},
		{"drain, settle deletes (retention 0s)", func(c *drainer.Config) { c.Retention.Published = &zero }},
	}
	var insert, marked float64
	for i, s := range settles {
		spec := b.outbox(ctx)
		b.exec(ctx, "CHECKPOINT")
		start := b.lsn(ctx)
		pad := strings.Repeat("x", max(*payloadBytes-25, 0))
		b.exec(ctx, `INSERT INTO `+spec.Name+` (event_type, payload)
			SELECT 'bench.event', jsonb_build_object('n', g, 'pad', $2::text) FROM generate_series(1, $1) g`, *events, pad)
		inserted := b.lsn(ctx)
		b.exec(ctx, "ANALYZE "+spec.Name)
		drainStart := b.lsn(ctx)
		b.drain(ctx, spec, 1, s.tweak)
		drained := b.lsn(ctx)
		if i == 0 {
			insert = b.printWAL(ctx, "the application's insert (reference)", start, inserted)
		}
		total := b.printWAL(ctx, s.what, drainStart, drained)
		if i == 0 {
			marked = total
		}
		b.exec(ctx, "DROP TABLE "+spec.Name)
	}
	return []string{target("WAL per event of a drain at the defaults ≤ the insert's", fmt.Sprintf("%.0f B against %.0f B", marked, insert), marked <= insert)}
}

// lsn is the WAL insert position.
func (b *bench) lsn(ctx context.Context) string {
	var lsn string
	if err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		log.Fatalf("read the WAL position: %v", err)
	}
	return lsn
}

// printWAL prints a stretch's WAL per event by record type, the kinds of at
// least 1 % of its bytes, and returns its bytes per event.
func (b *bench) printWAL(ctx context.Context, what, from, to string) float64 {
	// pg_walinspect reads flushed WAL only; the WAL writer flushes an
	// asynchronous commit's within a few hundred milliseconds.
	for flushed := false; !flushed; time.Sleep(50 * time.Millisecond) {
		if err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn", to).Scan(&flushed); err != nil {
			log.Fatalf("read the flushed WAL position: %v", err)
		}
	}
	rows, err := b.pool.Query(ctx, `SELECT "resource_manager/record_type", count::float8, record_size::float8, fpi_size::float8, combined_size_percentage
		FROM pg_get_wal_stats($1::pg_lsn, $2::pg_lsn, true) WHERE count > 0 ORDER BY combined_size DESC`, from, to)
	if err != nil {
		log.Fatalf("read the WAL's records: %v", err)
	}
	records, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (walRecord, error) {
		var r walRecord
		err := row.Scan(&r.kind, &r.count, &r.bytes, &r.fullPageBytes, &r.combinedShares)
		return r, err
	})
	if err != nil {
		log.Fatalf("read the WAL's records: %v", err)
	}
	n := float64(*events)
	var total, fpi float64
	var parts []string
	for _, r := range records {
		total += (r.bytes + r.fullPageBytes) / n
		fpi += r.fullPageBytes / n
		if r.combinedShares >= 1 {
			parts = append(parts, fmt.Sprintf("%s %.2f×%.0f B", r.kind, r.count/n, r.bytes/r.count))
		}
	}
	fmt.Printf("  %-42s %4.0f B/event (full pages %3.0f B): %s\n", what, total, fpi, strings.Join(parts, ", "))
	return total
}
