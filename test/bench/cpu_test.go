package main

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spillway-io/spillway/test/testenv"
)

// A child that runs and exits between two readings is counted, through the
// parent's reaped children's time, as a backend is in the postmaster's.
func TestCPUCountsExitedChildren(t *testing.T) {
	before := readCPU()
	// Children with twice the work each time, until they used enough CPU
	// to tell from a clock tick on any machine.
	used := 0.0
	for loops := 100000; used < 0.1; loops *= 2 {
		child := exec.Command("sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do i=$((i+1)); done", loops))
		if err := child.Run(); err != nil {
			t.Fatal(err)
		}
		used += (child.ProcessState.UserTime() + child.ProcessState.SystemTime()).Seconds()
	}
	// Clock ticks are 10 ms: the reaped children's user and system times
	// are each read a tick short at most.
	if spent := cpuSince(before)[groupDrainer]; spent < used-0.02 {
		t.Errorf("%.2f s of CPU counted for this process, though its exited children alone used %.2f s", spent, used)
	}
}

// Each backend's CPU lands in the share of whom it served: a drainer's
// session (by its application_name) or another client's.
func TestDatabaseSharesSplitBySession(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	session := func(name string) (*pgx.Conn, string) {
		cfg, err := pgx.ParseConfig(testenv.DatabaseURL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = name
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(ctx) })
		return conn, strconv.FormatUint(uint64(conn.PgConn().PID()), 10)
	}
	drainer, drainerPID := session("spillway-drainer/test")
	app, appPID := session("application")
	watch := startWatch(pool)
	// Work enough to tell from a clock tick.
	for conn, rows := range map[*pgx.Conn]int{drainer: 4_000_000, app: 2_000_000} {
		if _, err := conn.Exec(ctx, "SELECT sum(i) FROM generate_series(1, $1) i", rows); err != nil {
			t.Fatal(err)
		}
	}
	kinds := clientSessions(pool)
	if ours, ok := kinds[drainerPID]; !ok || !ours {
		t.Errorf("the session named spillway-drainer/test is not counted as a drainer's (found %v, drainer's %v)", ok, ours)
	}
	if ours, ok := kinds[appPID]; !ok || ours {
		t.Errorf("the session named application is not counted as another client's (found %v, drainer's %v)", ok, ours)
	}
	// Other suites' sessions may add to either share, never take from it.
	shares, now := watch.databaseShares(), readCPU()
	spent := func(pid string) float64 { return now[pid].seconds - watch.cpu[pid].seconds }
	// The backends are read a little after the shares, a tick later at most.
	if want := spent(drainerPID); shares.drainers < want-0.02 || want < 0.05 {
		t.Errorf("the drainer's sessions got %.2f s; its backend spent %.2f s", shares.drainers, want)
	}
	if want := spent(appPID); shares.clients < want-0.02 || want < 0.02 {
		t.Errorf("the other clients got %.2f s; the application's backend spent %.2f s", shares.clients, want)
	}
}
