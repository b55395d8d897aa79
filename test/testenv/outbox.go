package testenv

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spillway-io/spillway/outbox"
)

// Outbox is a canonical outbox table (spillway migrate's) as a test's
// application sees it: it writes events, and reads what the drainers did.
type Outbox struct {
	DB    *pgxpool.Pool
	Table string
}

// Spec is the table as Spillway's table layer names it.
func (o Outbox) Spec() outbox.TableSpec { return outbox.TableSpec{Name: o.Table} }

// Migrate runs spillway migrate's work on the table.
func (o Outbox) Migrate(ctx context.Context) error {
	_, err := outbox.Migrate(ctx, o.DB, o.Spec())
	return err
}

// Insert writes n events in one transaction and returns their ids.
func (o Outbox) Insert(ctx context.Context, n int) ([]string, error) {
	rows, err := o.DB.Query(ctx, `INSERT INTO `+o.Table+` (event_type, payload)
SELECT (ARRAY['order.created', 'order.paid', 'order.shipped'])[1 + g % 3], jsonb_build_object('order', g)
FROM generate_series(1, $1) g RETURNING id::text`, n)
	if err != nil {
		return nil, fmt.Errorf("insert %d events: %w", n, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Backlog is the number of events not yet published.
func (o Outbox) Backlog(ctx context.Context) (int, error) {
	var n int
	err := o.DB.QueryRow(ctx, "SELECT count(*) FROM "+o.Table+" WHERE published_at IS NULL").Scan(&n)
	return n, err
}

// Claims counts the pending events each drainer holds a claim on.
func (o Outbox) Claims(ctx context.Context) (map[string]int, error) {
	return o.countBy(ctx, "published_at IS NULL AND claimed_by IS NOT NULL")
}

// PublishedBy counts the published events by the drainer that published
// them: a settle keeps claimed_by.
func (o Outbox) PublishedBy(ctx context.Context) (map[string]int, error) {
	return o.countBy(ctx, "published_at IS NOT NULL")
}

func (o Outbox) countBy(ctx context.Context, where string) (map[string]int, error) {
	rows, err := o.DB.Query(ctx, "SELECT coalesce(claimed_by, ''), count(*) FROM "+o.Table+" WHERE "+where+" GROUP BY 1")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var by string
		var n int
		if err := rows.Scan(&by, &n); err != nil {
			return nil, err
		}
		out[by] = n
	}
	return out, rows.Err()
}

// ClaimedBy lists the ids of the pending events a drainer holds claims on.
func (o Outbox) ClaimedBy(ctx context.Context, drainer string) ([]string, error) {
	rows, err := o.DB.Query(ctx, "SELECT id::text FROM "+o.Table+" WHERE published_at IS NULL AND claimed_by = $1", drainer)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Unpublished is how many of ids are not published yet.
func (o Outbox) Unpublished(ctx context.Context, ids []string) (int, error) {
	var n int
	err := o.DB.QueryRow(ctx, "SELECT count(*) FROM "+o.Table+" WHERE id::text = ANY($1) AND published_at IS NULL", ids).Scan(&n)
	return n, err
}

// WaitDrained polls the backlog until it is 0, and returns when that was
// seen.
func (o Outbox) WaitDrained(ctx context.Context, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := -1
	for {
		n, err := o.Backlog(ctx)
		if err == nil && n == 0 {
			return time.Now(), nil
		}
		if err == nil {
			last = n
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("backlog still %d after %s: %w", last, timeout, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Traffic is an application writing events at a steady rate, a small
// transaction every 50 ms, until Stop.
type Traffic struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	ids  []string
	err  error
}

// StartTraffic writes perSecond events a second into o.
func StartTraffic(o Outbox, perSecond int) *Traffic {
	t := &Traffic{stop: make(chan struct{}), done: make(chan struct{})}
	const tick = 50 * time.Millisecond
	batch := max(perSecond*int(tick)/int(time.Second), 1)
	go func() {
		defer close(t.done)
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-ticker.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ids, err := o.Insert(ctx, batch)
			cancel()
			t.mu.Lock()
			t.ids = append(t.ids, ids...)
			if err != nil && t.err == nil {
				t.err = err
			}
			t.mu.Unlock()
		}
	}()
	return t
}

// Stop stops writing and returns the ids written, and the first error.
func (t *Traffic) Stop() ([]string, error) {
	close(t.stop)
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ids, t.err
}

// Count is how many events have been written so far.
func (t *Traffic) Count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ids)
}
