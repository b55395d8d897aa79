package main

import (
	"context"
	"log"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// watcher follows the fleets, their Deployments and the events, as a
// client of the API server would, and keeps what the measurements read.
type watcher struct {
	mu sync.Mutex
	// statusWrites counts the fleets' updates that left the generation
	// as it was; events, the events written.
	statusWrites, events int
	// probed is each fleet's status.lastProbeTime: set once its outbox was
	// read, and moved by the reads that changed its status.
	probed map[types.NamespacedName]time.Time
	// ready is when each fleet was first seen with a ready drainer.
	ready map[types.NamespacedName]time.Time
	// observed is each fleet's status.observedGeneration.
	observed map[types.NamespacedName]int64
	// generation is each fleet's metadata.generation, as last seen.
	generation map[types.NamespacedName]int64
	// backwards counts a fleet's lastProbeTime or observedGeneration, or a
	// Deployment's generation, seen going back.
	backwards int
	// deployed is when each fleet's Deployment was first seen; args, its
	// drainer's arguments as last seen; deploymentGen, its generation.
	deployed      map[types.NamespacedName]time.Time
	args          map[types.NamespacedName][]string
	deploymentGen map[types.NamespacedName]int64
	cancel        context.CancelFunc
}

func (b *bench) watch(ctx context.Context) *watcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &watcher{probed: map[types.NamespacedName]time.Time{}, ready: map[types.NamespacedName]time.Time{}, observed: map[types.NamespacedName]int64{},
		generation: map[types.NamespacedName]int64{}, deployed: map[types.NamespacedName]time.Time{},
		args: map[types.NamespacedName][]string{}, deploymentGen: map[types.NamespacedName]int64{}, cancel: cancel}
	follow := func(list client.ObjectList, seen func(watch.Event)) {
		go func() {
			for ctx.Err() == nil {
				stream, err := b.k8s.Watch(ctx, list)
				if err != nil {
					log.Printf("watch: %v", err)
					time.Sleep(time.Second)
					continue
				}
				for e := range stream.ResultChan() {
					seen(e)
				}
			}
		}()
	}
	follow(&v1alpha1.OutboxDrainerList{}, w.fleetSeen)
	follow(&appsv1.DeploymentList{}, w.deploymentSeen)
	follow(&eventsv1.EventList{}, func(e watch.Event) {
		if e.Type == watch.Added || e.Type == watch.Modified {
			w.mu.Lock()
			w.events++
			w.mu.Unlock()
		}
	})
	return w
}

func (w *watcher) stop() { w.cancel() }

func (w *watcher) fleetSeen(e watch.Event) {
	od, ok := e.Object.(*v1alpha1.OutboxDrainer)
	if !ok || e.Type == watch.Deleted {
		return
	}
	key := client.ObjectKeyFromObject(od)
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Type == watch.Modified && w.generation[key] == od.Generation {
		w.statusWrites++
	}
	w.generation[key] = od.Generation
	if t := od.Status.LastProbeTime; t != nil {
		if t.Time.Before(w.probed[key]) {
			w.backwards++
		}
		w.probed[key] = t.Time
	}
	if _, ok := w.ready[key]; !ok && od.Status.ReadyReplicas > 0 {
		w.ready[key] = time.Now()
	}
	if od.Status.ObservedGeneration < w.observed[key] {
		w.backwards++
	}
	w.observed[key] = od.Status.ObservedGeneration
}

func (w *watcher) deploymentSeen(e watch.Event) {
	d, ok := e.Object.(*appsv1.Deployment)
	if !ok || e.Type == watch.Deleted || len(d.OwnerReferences) == 0 {
		return
	}
	key := types.NamespacedName{Namespace: d.Namespace, Name: d.OwnerReferences[0].Name}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.deployed[key]; !ok {
		w.deployed[key] = time.Now()
	}
	if d.Generation < w.deploymentGen[key] {
		w.backwards++
	}
	w.deploymentGen[key] = d.Generation
	if c := d.Spec.Template.Spec.Containers; len(c) > 0 {
		w.args[key] = c[0].Args
	}
}

// counts are the status writes and events so far.
func (w *watcher) counts() (statusWrites, events int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.statusWrites, w.events
}

// waitFor polls cond, under the watcher's lock, every few milliseconds until
// it holds or timeout passes, and reports when it held.
func (w *watcher) waitFor(timeout time.Duration, cond func() bool) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		ok := cond()
		w.mu.Unlock()
		if ok {
			return time.Now(), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}, false
}

// hasArg says the fleet's Deployment, as last seen, runs with arg. The
// watcher's lock must be held.
func (w *watcher) hasArg(key types.NamespacedName, arg string) bool {
	return slices.ContainsFunc(w.args[key], func(a string) bool { return strings.EqualFold(a, arg) })
}

// backward is how many times something was seen going back.
func (w *watcher) backward() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.backwards
}
