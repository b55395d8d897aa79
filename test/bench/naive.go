package main

import (
	"context"
	"errors"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/test/testenv"
)

// naiveBatch is how many rows the naive drainer takes per transaction.
const naiveBatch = 100

// naiveSession is the naive drainer's application_name.
const naiveSession = "bench-naive-drainer"

// naiveDrainer drains the outbox as the usual relay does, and as seed
// canopy's did before its refactor: one transaction held open across the
// broker I/O, a batch selected FOR UPDATE, each row published and its
// confirm awaited before the next, and each marked with an UPDATE of its
// own. It is the benchmark's reference for what Spillway replaces.
type naiveDrainer struct {
	published atomic.Int64
	stop      func()
}

// startNaive starts one naive drainer on spec; stop ends it.
func (b *bench) startNaive(ctx context.Context, spec outbox.TableSpec) *naiveDrainer {
	runCtx, cancel := context.WithCancel(ctx)
	n := &naiveDrainer{}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := b.runNaive(runCtx, spec, n); err != nil && !errors.Is(err, context.Canceled) {
			log.Fatalf("naive drainer: %v", err)
		}
	})
	n.stop = func() { cancel(); wg.Wait() }
	return n
}

func (b *bench) runNaive(ctx context.Context, spec outbox.TableSpec, n *naiveDrainer) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	// A session of its own, closed at the end, so that its WAL statistics
	// are reported before the run's are read (see walSince).
	cfg, err := pgx.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = naiveSession
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for ctx.Err() == nil {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id, event_type, payload::text FROM `+spec.Name+`
			WHERE published_at IS NULL ORDER BY enqueued_at LIMIT $1 FOR UPDATE SKIP LOCKED`, naiveBatch)
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		type row struct {
			id      [16]byte
			key     string
			payload []byte
		}
		batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.id, &x.key, &x.payload)
		})
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		for _, r := range batch {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.topo.Exchange, r.key, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: r.payload,
			})
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return err
			}
			if !dc.Wait() {
				continue // nacked: left for the next transaction
			}
			if _, err := tx.Exec(ctx, `UPDATE `+spec.Name+` SET published_at = now() WHERE id = $1`, r.id); err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return err
			}
			n.published.Add(1)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return ctx.Err()
}
