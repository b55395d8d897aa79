package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// report prints each size's figures, and the targets at the largest.
func report(results []sizeResult) {
	for _, r := range results {
		describe(r)
	}
	r := results[len(results)-1]
	fmt.Println()
	target := func(what, figure string, ok bool) {
		verdict := "met"
		if !ok {
			verdict = "NOT MET"
		}
		fmt.Printf("target at %d fleets %-46s %-12s %s\n", r.fleets, what+":", figure, verdict)
	}
	p99 := quantile(r.idle.stale, 0.99)
	target("staleness p99 ≤ 2 × statusInterval", p99.String(), p99 <= 2**statusInterval)
	change := quantile(r.changed, 0.99)
	target("spec change → Deployment p99 ≤ 2 s", change.String(), change <= 2*time.Second)
	target("idle status writes + events = 0", fmt.Sprintf("%.2f/fleet-min", r.idle.statusWrites+r.idle.events), r.idle.statusWrites+r.idle.events == 0)
	idle := perFleetMinute(r.idle.requests, r.fleets)
	target("idle API requests ≤ 1 per fleet-minute", fmt.Sprintf("%.3f", idle), idle <= 1)
	target("probe sessions ≤ 2 per database", fmt.Sprint(max(r.idle.sessions, r.trickle.sessions)), max(r.idle.sessions, r.trickle.sessions) <= 2)
	target("operator RSS ≤ 256 MiB", fmt.Sprintf("%.0f MiB", r.rssMiB), r.rssMiB <= 256)
}

// describe prints one size's figures.
func describe(r sizeResult) {
	fleets := fmt.Sprintf("%d fleets", r.fleets)
	if r.withPods {
		fleets += " with a drainer pod each"
	}
	fmt.Printf("%s: operator RSS %.0f MiB (%.1f KiB per fleet); from creating the last fleet to its Deployment %s; "+
		"spec change to Deployment p50 %s, p99 %s, max %s\n",
		fleets, r.rssMiB, r.rssMiB*1024/float64(r.fleets), r.toDeployment.Round(time.Millisecond),
		quantile(r.changed, 0.5), quantile(r.changed, 0.99), quantile(r.changed, 1))
	if r.withPods {
		fmt.Printf("  every drainer Ready %s after the last fleet was created; %d rows, %d messages in the queue "+
			"(%d duplicates), %d rows still pending\n",
			r.toReady.Round(time.Millisecond), r.rows, r.queued, max(r.queued-r.rows, 0), r.pending)
	}
	for _, w := range []struct {
		name string
		r    windowResult
	}{{"idle", r.idle}, {fmt.Sprintf("trickle (%d events into a tenth of the outboxes)", r.trickle.trickled), r.trickle}} {
		probe := fmt.Sprintf("probe sessions ≤ %d per database; %.0f reads, Postgres %s CPU per read",
			w.r.sessions, w.r.reads, w.r.pgCPUPerRead.Round(time.Microsecond))
		if r.withPods {
			// PgBouncer's server sessions serve the drainers and the probe alike.
			probe = fmt.Sprintf("%.0f reads, through PgBouncer", w.r.reads)
		}
		fmt.Printf("  %s, %.0f s: CPU %.3f cores (%.2f ms/s per fleet); API requests/s %s (%.3f per fleet-minute); "+
			"status writes %.2f and events %.2f per fleet-minute; staleness p50 %s, p99 %s, max %s; %s\n",
			w.name, w.r.seconds, w.r.cpu, 1000*w.r.cpu/float64(r.fleets), verbs(w.r.requests), perFleetMinute(w.r.requests, r.fleets),
			w.r.statusWrites, w.r.events, quantile(w.r.stale, 0.5), quantile(w.r.stale, 0.99), quantile(w.r.stale, 1), probe)
		if w.r.served != nil {
			fmt.Printf("    the API server served, per second, to every client, itself included: %s\n", verbs(w.r.served))
		}
	}
}

func verbs(requests map[string]float64) string {
	var out []string
	for _, verb := range slices.Sorted(func(yield func(string) bool) {
		for k := range requests {
			if !yield(k) {
				return
			}
		}
	}) {
		if requests[verb] > 0 {
			out = append(out, fmt.Sprintf("%s %.2f", verb, requests[verb]))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

func perFleetMinute(requests map[string]float64, fleets int) float64 {
	var sum float64
	for _, v := range requests {
		sum += v
	}
	return sum * 60 / float64(fleets)
}

// quantile is the q quantile of a sorted sample; 0 for none.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	s := slices.Clone(sorted)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)].Round(time.Millisecond)
}

// handover runs two replicas with leader election in place of the single
// operator, kills the leader, and times how long the other takes to lead
// and to carry a spec change to its Deployment; nothing may go backwards.
func (b *bench) handover(ctx context.Context, w *watcher, fleets int) {
	replicas := []*operator{b.startOperator(ctx, "replica-1", true), b.startOperator(ctx, "replica-2", true)}
	defer func() {
		for _, op := range replicas {
			op.stop()
		}
	}()
	leaderOf := func() *operator {
		for _, op := range replicas {
			if op.alive() && scrape(op).leader {
				return op
			}
		}
		return nil
	}
	var leader *operator
	deadline := time.Now().Add(time.Minute)
	for leader = leaderOf(); leader == nil && time.Now().Before(deadline); leader = leaderOf() {
		time.Sleep(100 * time.Millisecond)
	}
	if leader == nil {
		fatal("no replica leads after a minute")
	}
	time.Sleep(*statusInterval) // the leader's reads under way
	backwards := w.backward()
	killed := time.Now()
	leader.kill()
	var next *operator
	for next = leaderOf(); next == nil && time.Since(killed) < 2*time.Minute; next = leaderOf() {
		time.Sleep(100 * time.Millisecond)
	}
	if next == nil {
		fatal("no replica leads two minutes after the leader was killed")
	}
	led := time.Since(killed)
	_, ns, name := fleetKey(0)
	key := types.NamespacedName{Namespace: ns, Name: name}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"batchSize":499}}`))
	if err := b.k8s.Patch(ctx, &v1alpha1.OutboxDrainer{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, patch); err != nil {
		fatal(err)
	}
	at, ok := w.waitFor(time.Minute, func() bool { return w.hasArg(key, "--batch-size=499") })
	if !ok {
		fatal("the new leader did not carry a spec change to its Deployment within a minute")
	}
	time.Sleep(2 * *statusInterval) // every status read again by the new leader
	back := w.backward() - backwards
	fmt.Printf("\nleader hand-over, %d fleets, two replicas, the leader killed (SIGKILL): the other leads after %s, "+
		"and a spec change made then reaches its Deployment %s after the kill; %d fleet statuses or Deployments went backwards\n",
		fleets, led.Round(time.Millisecond), at.Sub(killed).Round(time.Millisecond), back)
	ok = led <= 15*time.Second
	verdict := "met"
	if !ok || back > 0 {
		verdict = "NOT MET"
	}
	fmt.Printf("target at %d fleets %-46s %-12s %s\n", fleets, "leader hand-over ≤ 15 s, nothing backwards:", led.Round(time.Millisecond).String(), verdict)
}
