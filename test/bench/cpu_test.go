package main

import (
	"os/exec"
	"testing"
)

// A child that runs and exits between two readings is counted, through the
// parent's reaped children's time, as a backend is in the postmaster's.
func TestCPUCountsExitedChildren(t *testing.T) {
	before := readCPU()
	child := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	used := (child.ProcessState.UserTime() + child.ProcessState.SystemTime()).Seconds()
	if used < 0.1 {
		t.Fatalf("the child used only %.2f s of CPU, too little to tell", used)
	}
	// Clock ticks are 10 ms: allow one each for the child's user and
	// system time.
	if spent := cpuSince(before)[groupDrainer]; spent < used-0.02 {
		t.Errorf("%.2f s of CPU counted for this process, though its exited child alone used %.2f s", spent, used)
	}
}
