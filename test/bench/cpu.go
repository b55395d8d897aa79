package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The processes whose CPU the benchmark attributes: the broker, the
// database, and this process (the publisher or the drainers).
var cpuGroups = []struct{ name, comm string }{
	{"rabbitmq", "beam.smp"},
	{"postgres", "postgres"},
	{"drainer", ""}, // this process
}

// cpuTimes is CPU seconds per group.
type cpuTimes []float64

// processCPU is one process's group and CPU seconds so far.
type processCPU struct {
	group   int
	seconds float64
}

// readCPU reads the CPU seconds of every process of a group, by pid.
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
		// pid (comm) state ... utime stime are fields 14 and 15.
		open, close := strings.IndexByte(string(raw), '('), strings.LastIndexByte(string(raw), ')')
		if open < 0 || close < open {
			continue
		}
		comm, rest := string(raw[open+1:close]), strings.Fields(string(raw[close+1:]))
		if len(rest) < 13 {
			continue
		}
		utime, _ := strconv.ParseFloat(rest[11], 64)
		stime, _ := strconv.ParseFloat(rest[12], 64)
		pid := filepath.Base(filepath.Dir(path))
		for i, g := range cpuGroups {
			if (g.comm == "" && pid == self) || (g.comm != "" && comm == g.comm) {
				out[pid] = processCPU{group: i, seconds: (utime + stime) / clockTicks}
			}
		}
	}
	return out
}

// cpuUse is the CPU each group used over a stretch of wall time.
type cpuUse struct {
	seconds cpuTimes
	wall    time.Duration
}

// stopwatch times a stretch of work and the CPU each group spent on it.
type stopwatch struct {
	cpu   map[string]processCPU
	start time.Time
}

func startWatch() stopwatch { return stopwatch{cpu: readCPU(), start: time.Now()} }

// stop reads the watch while every process it measures is still alive: a
// backend that exits takes its CPU time out of /proc with it.
func (w stopwatch) stop() cpuUse {
	use := cpuUse{seconds: make(cpuTimes, len(cpuGroups)), wall: time.Since(w.start)}
	for pid, p := range readCPU() {
		use.seconds[p.group] += p.seconds - w.cpu[pid].seconds // a new process started from 0
	}
	return use
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
		parts = append(parts, fmt.Sprintf("%s %3.0f%%", g.name, 100*u.seconds[i]/u.wall.Seconds()))
	}
	return "cpu: " + strings.Join(parts, ", ")
}

// perEvent gives each group's CPU per event, e.g. "rabbitmq 67 µs".
func (u cpuUse) perEvent(events int) string {
	var parts []string
	for i, g := range cpuGroups {
		parts = append(parts, fmt.Sprintf("%s %3.0f µs", g.name, 1e6*u.seconds[i]/float64(events)))
	}
	return "cpu/event: " + strings.Join(parts, ", ")
}
