package probe

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pools keeps one small connection pool per database URL, so that a read
// reuses a connection instead of opening one every status interval, and
// fleets on one database share it.
type pools struct {
	timeout time.Duration
	mu      sync.Mutex
	byURL   map[string]*pooled
}

type pooled struct {
	*pgxpool.Pool
	lastUsed time.Time
}

func newPools(timeout time.Duration) *pools {
	return &pools{timeout: timeout, byURL: map[string]*pooled{}}
}

// maxConnsPerDatabase bounds the operator's sessions on one database: its
// reads are few and short, and it is the application's database.
const maxConnsPerDatabase = 2

// get returns the URL's pool, opening it on first use. Opening connects
// nothing: the first read does.
func (ps *pools) get(url string) (*pgxpool.Pool, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if pool, ok := ps.byURL[url]; ok {
		pool.lastUsed = time.Now()
		return pool.Pool, nil
	}
	cfg, err := poolConfig(url, ps.timeout)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConnsPerDatabase
	// A connection idle for longer than a few status intervals is closed,
	// so the operator holds no session on a database it rarely reads.
	cfg.MaxConnIdleTime = 2 * time.Minute
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	ps.byURL[url] = &pooled{Pool: pool, lastUsed: time.Now()}
	return pool, nil
}

// poolConfig is how the operator connects to an outbox's database: named in
// pg_stat_activity, opening no connection before it is asked for one, and
// giving up on a connect after timeout.
func poolConfig(url string, timeout time.Duration) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MinConns = 0
	cfg.ConnConfig.ConnectTimeout = timeout
	cfg.ConnConfig.RuntimeParams["application_name"] = "spillway-operator"
	return cfg, nil
}

// closeUnused closes the pools whose URL is not in used, unless a read took
// one so recently that it may not have recorded its URL yet.
func (ps *pools) closeUnused(used map[string]bool) {
	ps.mu.Lock()
	var unused []*pooled
	for url, pool := range ps.byURL {
		if !used[url] && (used == nil || time.Since(pool.lastUsed) > 2*ps.timeout) {
			unused = append(unused, pool)
			delete(ps.byURL, url)
		}
	}
	ps.mu.Unlock()
	for _, pool := range unused {
		// Close waits for connections in use; a read holding one ends
		// within the timeout.
		go pool.Close()
	}
}

func (ps *pools) closeAll() { ps.closeUnused(nil) }
