package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/spillway-io/spillway/test/pgha"
	"github.com/spillway-io/spillway/test/testenv"
)

// The logical section: what a relay that reads the outbox's inserts from
// the WAL, through a logical replication slot and pgoutput, costs the
// database for the same rows as today's drain of them (issue 48's anchor).
// It is a comparison only: a slot admits one reader and keeps no lease, and
// the rows stay in the table for someone else to delete, which is why
// Spillway claims. It runs on hack/postgres-ha.sh's primary, whose
// wal_level is logical, with the insert and the drain measured there too.

// logical measures, in interleaved rounds, the insert of a fresh outbox,
// the decoding of those inserts by a slot's walsender, and today's drain of
// the same rows at the defaults.
func (b *bench) logical(ctx context.Context) []string {
	ha, down := b.onPrimary(ctx, "logical", pgha.MissingServers())
	if ha == nil {
		return nil
	}
	defer down()
	var level string
	if err := ha.pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		fmt.Printf("\nlogical: skipped: wal_level is %q on the primary (%v)\n", level, err)
		return nil
	}
	if !ha.readsWAL(ctx, "logical") {
		return nil
	}
	var ceiling scenario
	var inserts, decodes, drains []designCost
	for round := range *rounds {
		log.Printf("logical, round %d of %d: ceiling, then a fresh outbox inserted, decoded and drained", round+1, *rounds)
		ceiling.add(ha.ceiling(ctx, false))
		insert, decode, drain := ha.logicalRun(ctx)
		inserts, decodes, drains = append(inserts, insert), append(decodes, decode), append(drains, drain)
	}
	fmt.Printf("\nlogical: what a relay reading the WAL through a logical slot (pgoutput) costs the database, against the insert and today's drain "+
		"of the same %d events of %d bytes, on the HA primary (wal_level logical); medians of %d rounds for CPU and throughput\n", *events, *payloadBytes, *rounds)
	printCostHeader()
	insert, decode, drain := medianCost(inserts), medianCost(decodes), medianCost(drains)
	insert.print("the application's insert (reference)", 0)
	decode.print("a logical slot's walsender decoding the inserts", 0) // it publishes nothing
	drain.print("today: heap-only claim, deletes (default)", ceiling.rate())
	printRecords([]walRecords{{"the application's insert", insert.records}, {"the slot's decoding", decode.records}, {"today's drain", drain.records}})
	fmt.Printf("  per event, against the insert: the slot's decoding %.2f ×, today's drain %.2f ×; the slot's walsender decoded %.0f events/s\n",
		decode.total()/insert.total(), drain.total()/insert.total(), decode.rate)
	return nil
}

// logicalRun opens a temporary pgoutput slot on a publication of a fresh
// outbox's inserts, fills the outbox, decodes every insert through the slot
// (a walsender of its own, whose CPU is the session's share), closes the
// slot, and drains the rows at the defaults.
func (b *bench) logicalRun(ctx context.Context) (insert, decode, drain designCost) {
	spec := b.outbox(ctx)
	defer b.exec(ctx, "DROP TABLE "+spec.Name)
	name := testenv.UniqueName("bench_logical")
	b.exec(ctx, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", name, spec.Name))
	defer b.exec(ctx, "DROP PUBLICATION "+name)

	cfg, err := pgconn.ParseConfig(b.dbURL)
	if err != nil {
		log.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		log.Fatalf("open a replication session: %v", err)
	}
	// The slot is temporary: it goes with the session, so a run that dies
	// leaves nothing holding the primary's WAL.
	slot, err := pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication})
	if err != nil {
		log.Fatalf("create the slot: %v", err)
	}
	from, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		log.Fatal(err)
	}
	var walsender string
	if err := b.pool.QueryRow(ctx, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = $1", name).Scan(&walsender); err != nil {
		log.Fatalf("find the slot's walsender: %v", err)
	}

	insert = b.insertStretch(ctx, spec.Name)
	decode = b.decodeStretch(ctx, conn, name, from, walsender)
	conn.Close(ctx)
	return insert, decode, b.drainStretch(ctx, spec, design{})
}

// decodeStretch streams the slot from its start, with the publication of
// the same name, until the walsender has sent every inserted row, and returns what that cost: the walsender's CPU
// as the session's, and its rate. Every row's id must come once.
func (b *bench) decodeStretch(ctx context.Context, conn *pgconn.PgConn, name string, from pglogrepl.LSN, walsender string) designCost {
	quiesce("logical decoding")
	log.Printf("decoding %d inserts through the slot", *events)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	start, before, began := b.lsn(ctx), readCPU(), time.Now()
	if err := pglogrepl.StartReplication(ctx, conn, name, from, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", name)},
	}); err != nil {
		log.Fatalf("start streaming the slot: %v", err)
	}
	ids, inserts := decodeInserts(ctx, conn, *events)
	now, wall := readCPU(), time.Since(began)
	if len(ids) != *events || inserts != *events {
		log.Fatalf("the slot sent %d inserts of %d distinct ids, of %d inserted", inserts, len(ids), *events)
	}
	spent := now[walsender].seconds - before[walsender].seconds
	decode := b.walCost(ctx, start, b.lsn(ctx))
	decode.sessions, decode.rest = perEventµs(spent), perEventµs(max(cpuBetween(before, now)[groupDatabase]-spent, 0))
	decode.rate = float64(*events) / wall.Seconds()
	return decode
}

// decodeInserts reads the stream until n inserts have come, answering the
// walsender's keepalives, and returns the distinct ids (the first column)
// and the count of inserts.
func decodeInserts(ctx context.Context, conn *pgconn.PgConn, n int) (ids map[string]bool, inserts int) {
	ids = make(map[string]bool, n)
	var received pglogrepl.LSN
	for inserts < n {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			log.Fatalf("read the slot's stream after %d inserts: %v", inserts, err)
		}
		data, ok := msg.(*pgproto3.CopyData)
		if !ok || len(data.Data) == 0 {
			if e, isErr := msg.(*pgproto3.ErrorResponse); isErr {
				log.Fatalf("the slot's stream: %s", e.Message)
			}
			continue
		}
		switch data.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data.Data[1:])
			if err != nil {
				log.Fatal(err)
			}
			if k.ReplyRequested {
				if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: received}); err != nil {
					log.Fatal(err)
				}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(data.Data[1:])
			if err != nil {
				log.Fatal(err)
			}
			received = x.WALStart + pglogrepl.LSN(len(x.WALData))
			m, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				log.Fatalf("parse a pgoutput message: %v", err)
			}
			if in, ok := m.(*pglogrepl.InsertMessage); ok {
				inserts++
				ids[string(in.Tuple.Columns[0].Data)] = true
			}
		}
	}
	return ids, inserts
}
