package main

import (
	"fmt"
	"os/exec"
	"testing"
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
