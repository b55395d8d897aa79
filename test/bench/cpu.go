package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The processes whose CPU the benchmark attributes: the broker, the
// database, this process (the publisher or the drainers) and, in the runs
// through it, PgBouncer, shown only where it spent any.
var cpuGroups = []cpuGroup{
	{"rabbitmq", "beam.smp", false},
	{"postgres", "postgres", false},
	{"drainer", "", false}, // this process
	{"pgbouncer", "pgbouncer", true},
}

// cpuGroup is processes by their command name ("" for this process);
// ifUsed hides the group from a figure where it spent nothing.
type cpuGroup struct {
	name, comm string
	ifUsed     bool
}

// shows says whether a figure of the group's, v, is printed.
func (g cpuGroup) shows(v float64) bool { return !g.ifUsed || v > 0 }

// The groups' indexes.
const (
	groupBroker = iota
	groupDatabase
	groupDrainer
)

// cpuTimes is CPU seconds per group.
type cpuTimes []float64

// processCPU is one process's group and CPU seconds so far.
type processCPU struct {
	group   int
	seconds float64
}

// readCPU reads the CPU seconds of every process of a group, by pid: its
// own and those of its children that exited and were reaped. A backend or an
// autovacuum worker that exits takes its time out of /proc, and that time
// moves into the postmaster's children's.
func readCPU() map[string]processCPU {
	const clockTicks = 100 // USER_HZ on Linux
	out := map[string]processCPU{}
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ... utime, stime, cutime and cstime are fields 14 to 17.
		open, close := strings.IndexByte(string(raw), '('), strings.LastIndexByte(string(raw), ')')
		if open < 0 || close < open {
			continue
		}
		comm, rest := string(raw[open+1:close]), strings.Fields(string(raw[close+1:]))
		if len(rest) < 15 {
			continue
		}
		var ticks float64
		for _, f := range rest[11:15] { // utime, stime, cutime, cstime
			t, _ := strconv.ParseFloat(f, 64)
			ticks += t
		}
		pid := filepath.Base(filepath.Dir(path))
		for i, g := range cpuGroups {
			if (g.comm == "" && pid == self) || (g.comm != "" && comm == g.comm) {
				out[pid] = processCPU{group: i, seconds: ticks / clockTicks}
			}
		}
	}
	return out
}

// cpuSince is the CPU seconds each group spent since before was read. A
// process that exited since is taken out at what it had then, its whole time
// being in its parent's count now; a new one started from 0.
func cpuSince(before map[string]processCPU) cpuTimes { return cpuBetween(before, readCPU()) }

// cpuBetween is cpuSince at the reading now. Read in clock ticks from
// processes that come and go, an idle group can come out a tick below zero
// ("postgres -0" beside the raw publisher): it spent nothing.
func cpuBetween(before, now map[string]processCPU) cpuTimes {
	spent := make(cpuTimes, len(cpuGroups))
	for _, p := range now {
		spent[p.group] += p.seconds
	}
	for _, p := range before {
		spent[p.group] -= p.seconds
	}
	for g := range spent {
		spent[g] = max(spent[g], 0)
	}
	return spent
}

// stealWatch reads what share of the machine's CPU time the hypervisor gave
// to other guests. On a shared host it comes and goes: with 12–27 % stolen
// (vmstat), the latency section's p50 was twice that of a quieter run.
type stealWatch struct{ total, steal float64 }

// readSteal starts a watch from the cpu line of /proc/stat: user, nice,
// system, idle, iowait, irq, softirq and steal, in clock ticks.
func readSteal() stealWatch {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return stealWatch{}
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	var w stealWatch
	for i := 1; i < len(fields) && i <= 8; i++ {
		v, _ := strconv.ParseFloat(fields[i], 64)
		w.total += v
		if i == 8 {
			w.steal = v
		}
	}
	return w
}

// share is the part of the CPU time since the watch started that was stolen.
func (w stealWatch) share() float64 {
	now := readSteal()
	if now.total <= w.total {
		return 0
	}
	return (now.steal - w.steal) / (now.total - w.total)
}

// cpuUse is the CPU each group used over a stretch of wall time.
type cpuUse struct {
	seconds cpuTimes
	wall    time.Duration
}

// stopwatch times a stretch of work, the CPU each group spent on it, and
// the WAL the database wrote meanwhile.
type stopwatch struct {
	cpu   map[string]processCPU
	start time.Time
	db    *pgxpool.Pool
	wal   walUse
}

func startWatch(db *pgxpool.Pool) stopwatch {
	return stopwatch{cpu: readCPU(), start: time.Now(), db: db, wal: readWAL(db)}
}

// stop reads the watch's CPU and wall time. events is how many the stretch
// moved. The WAL is read by walSince, once the stretch's sessions have
// closed.
func (w stopwatch) stop(events int) run {
	use := cpuUse{seconds: cpuSince(w.cpu), wall: time.Since(w.start)}
	return run{rate: float64(events) / use.wall.Seconds(), cpu: use, events: events}
}

// sessionShares splits the database's CPU seconds since a watch started by
// whom each backend served: the drainers' own sessions, the other client
// sessions (the application's, and the bench's listener), and the rest
// (autovacuum, the WAL writer, the checkpointer, and backends that exited,
// whose time is the postmaster's now). It tells a dearer drain from dearer
// inserts, which the notify trigger and a drainer claiming beside them make.
type sessionShares struct{ drainers, clients, rest float64 }

// databaseShares reads the split while the sessions are still open. The
// rest is what the database spent beyond its client sessions.
func (w stopwatch) databaseShares() sessionShares {
	sessions, now := clientSessions(w.db), readCPU()
	var s sessionShares
	for pid, ours := range sessions {
		p, alive := now[pid]
		if !alive || p.group != groupDatabase {
			continue
		}
		if spent := p.seconds - w.cpu[pid].seconds; ours {
			s.drainers += spent
		} else {
			s.clients += spent
		}
	}
	s.rest = max(cpuBetween(w.cpu, now)[groupDatabase]-s.drainers-s.clients, 0)
	return s
}

func (s sessionShares) add(o sessionShares) sessionShares {
	return sessionShares{s.drainers + o.drainers, s.clients + o.clients, s.rest + o.rest}
}

// clientSessions tells, for each client backend by pid, whether it is a
// drainer's session (by its application_name).
func clientSessions(db *pgxpool.Pool) map[string]bool {
	rows, _ := db.Query(context.Background(),
		"SELECT pid::text, application_name LIKE 'spillway-drainer/%' FROM pg_stat_activity WHERE backend_type = 'client backend'")
	sessions := map[string]bool{}
	var pid string
	var ours bool
	if _, err := pgx.ForEachRow(rows, []any{&pid, &ours}, func() error { sessions[pid] = ours; return nil }); err != nil {
		log.Fatalf("read the database's sessions: %v", err)
	}
	return sessions
}

// String gives each share as a part of one core over wall.
func (s sessionShares) String(wall time.Duration) string {
	core := func(x float64) float64 { return 100 * x / wall.Seconds() }
	return fmt.Sprintf("postgres: drainer's sessions %.1f%%, application's %.1f%%, rest %.1f%%", core(s.drainers), core(s.clients), core(s.rest))
}

// walSince is the WAL written since the watch started. Its bytes come from
// the WAL insert position, exact at any time. Full pages and syncs come from
// pg_stat_wal, which a backend updates when it exits, and while it works
// about once a second, but after going idle within a second of its last
// update only ten seconds later: so they are read once the drainers'
// sessions (the naive one's too) are gone, or their last second would land in the next run.
func (w stopwatch) walSince() walUse {
	ctx := context.Background()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var sessions int
		if err := w.db.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'spillway-drainer/%' OR application_name = $1",
			naiveSession).Scan(&sessions); err != nil {
			log.Fatalf("count the drainers' sessions: %v", err)
		}
		if sessions == 0 {
			break
		}
	}
	now := readWAL(w.db)
	return walUse{bytes: now.bytes - w.wal.bytes, fpi: now.fpi - w.wal.fpi, syncs: now.syncs - w.wal.syncs}
}

// walUse is the WAL written, the full-page images in it (a page's first
// change after a checkpoint logs the whole page), and the WAL syncs made.
type walUse struct{ bytes, fpi, syncs float64 }

func readWAL(db *pgxpool.Pool) walUse {
	var w walUse
	if err := db.QueryRow(context.Background(),
		"SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8, wal_fpi::float8, wal_sync::float8 FROM pg_stat_wal").Scan(&w.bytes, &w.fpi, &w.syncs); err != nil {
		log.Fatalf("read the WAL position and pg_stat_wal: %v", err)
	}
	return w
}

func (w walUse) add(o walUse) walUse {
	return walUse{w.bytes + o.bytes, w.fpi + o.fpi, w.syncs + o.syncs}
}

// per1000 is the WAL per 1,000 events.
func (w walUse) per1000(events int) string {
	k := float64(events) / 1000
	return fmt.Sprintf("WAL/1k events: %4.0f kB, %4.0f full pages, %5.1f syncs", w.bytes/k/1024, w.fpi/k, w.syncs/k)
}

func (u cpuUse) add(o cpuUse) cpuUse {
	sum := cpuUse{seconds: make(cpuTimes, len(cpuGroups)), wall: u.wall + o.wall}
	for i := range sum.seconds {
		if i < len(u.seconds) {
			sum.seconds[i] += u.seconds[i]
		}
		sum.seconds[i] += o.seconds[i]
	}
	return sum
}

// String gives each group's share of one core, e.g. "rabbitmq 104%".
func (u cpuUse) String() string {
	var parts []string
	for i, g := range cpuGroups {
		if g.shows(u.seconds[i]) {
			parts = append(parts, fmt.Sprintf("%s %3.0f%%", g.name, 100*u.seconds[i]/u.wall.Seconds()))
		}
	}
	return "cpu: " + strings.Join(parts, ", ")
}

// quiesce waits until the broker and the database are idle, so a run does
// not pay for the background work an earlier one left behind: a purged
// queue's clean-up, vacuums, checkpoints. Measured with both at rest, the
// latency section's p99 was a third of what it was straight after the
// throughput and neighbour sections.
func quiesce(what string) {
	const (
		sample  = 500 * time.Millisecond
		idle    = 0.05 // of a core, per process group
		longest = 2 * time.Minute
	)
	start := time.Now()
	for time.Since(start) < longest {
		before := readCPU()
		time.Sleep(sample)
		busy, most := cpuSince(before), idle*sample.Seconds()
		if busy[groupBroker] <= most && busy[groupDatabase] <= most {
			if waited := time.Since(start); waited > 2*sample {
				log.Printf("%s: waited %s for the broker and the database to go idle", what, waited.Round(100*time.Millisecond))
			}
			return
		}
	}
	log.Printf("%s: the broker or the database is still busy after %s; measuring anyway", what, longest)
}
