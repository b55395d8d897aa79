package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/controllers/resource"
)

// A drainer that dies without its own shutdown (a force delete, an OOM
// kill that ends the pod, a lost node) leaves its claims until their lease
// expires, and a Deployment never reuses a pod's name, so no successor's
// start-up release finds them. The operator sees its drainer pods die: it
// names the dead ones to the Prober, whose next read, at once, releases
// their claims. Only positive evidence counts: a pod it saw deleted, a pod
// that is Failed, a pod on a node marked unreachable. A claimant it knows
// nothing of, such as a drainer run outside the cluster, is left alone.
const (
	reasonPodGone         = "PodGone"
	reasonPodFailed       = "PodFailed"
	reasonNodeUnreachable = "NodeUnreachable"
)

// podNodeIndex indexes the drainer pods by the node they run on.
const podNodeIndex = ".spec.nodeName"

// departures remembers the drainer pods seen deleted, for a lease from
// their deletion: every claim a pod made before it was deleted has expired
// by then anyway.
type departures struct {
	mu      sync.Mutex
	byFleet map[types.NamespacedName]map[string]time.Time
}

func (d *departures) add(fleet types.NamespacedName, pod string, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byFleet == nil {
		d.byFleet = map[types.NamespacedName]map[string]time.Time{}
	}
	if d.byFleet[fleet] == nil {
		d.byFleet[fleet] = map[string]time.Time{}
	}
	d.byFleet[fleet][pod] = at
}

// recent lists the fleet's pods deleted within lease before now, and
// forgets the older ones.
func (d *departures) recent(fleet types.NamespacedName, lease time.Duration, now time.Time) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var pods []string
	for pod, at := range d.byFleet[fleet] {
		if now.Sub(at) > lease {
			delete(d.byFleet[fleet], pod)
			continue
		}
		pods = append(pods, pod)
	}
	if len(d.byFleet[fleet]) == 0 {
		delete(d.byFleet, fleet)
	}
	return pods
}

func (d *departures) forget(fleet types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.byFleet, fleet)
}

// deadDrainers lists the fleet's drainers whose claims may still be held
// though they will settle nothing more, sorted by ID as the Prober's
// Target wants them.
func (r *OutboxDrainerReconciler) deadDrainers(ctx context.Context, od *v1alpha1.OutboxDrainer) ([]probe.DeadDrainer, error) {
	key := client.ObjectKeyFromObject(od)
	var dead []probe.DeadDrainer
	for _, pod := range r.departures.recent(key, od.Spec.LeaseTTL.Duration, time.Now()) {
		dead = append(dead, probe.DeadDrainer{ID: pod, Reason: reasonPodGone, Message: fmt.Sprintf("its pod %s is gone", pod)})
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(od.Namespace), client.MatchingLabels(resource.SelectorLabels(od))); err != nil {
		return nil, fmt.Errorf("list the drainer pods of OutboxDrainer %s: %w", key, err)
	}
	for i := range pods.Items {
		d, ok, err := r.deadPod(ctx, &pods.Items[i])
		if err != nil {
			return nil, err
		}
		if ok {
			dead = append(dead, d)
		}
	}
	slices.SortFunc(dead, func(a, b probe.DeadDrainer) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(dead, func(a, b probe.DeadDrainer) bool { return a.ID == b.ID }), nil
}

// deadPod says whether a drainer pod that still exists is dead: Failed (its
// container stopped for good, as after an eviction), or on a node the node
// controller marked unreachable or someone took out of service. A pod on
// an unreachable node may still be running, cut off: releasing its claims
// then costs duplicates, never a loss. A terminating pod is shutting down,
// and releases its own claims.
func (r *OutboxDrainerReconciler) deadPod(ctx context.Context, pod *corev1.Pod) (probe.DeadDrainer, bool, error) {
	if pod.Status.Phase == corev1.PodFailed {
		return probe.DeadDrainer{ID: pod.Name, Reason: reasonPodFailed, Message: fmt.Sprintf("its pod %s failed", pod.Name)}, true, nil
	}
	if pod.Spec.NodeName == "" {
		return probe.DeadDrainer{}, false, nil
	}
	var node corev1.Node
	if err := r.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, &node); apierrors.IsNotFound(err) {
		// The pod garbage collector deletes the pods of a deleted node.
		return probe.DeadDrainer{}, false, nil
	} else if err != nil {
		return probe.DeadDrainer{}, false, fmt.Errorf("get Node %s: %w", pod.Spec.NodeName, err)
	}
	if taint := unreachable(&node); taint != "" {
		return probe.DeadDrainer{ID: pod.Name, Reason: reasonNodeUnreachable,
			Message: fmt.Sprintf("its node %s is unreachable (taint %s)", node.Name, taint)}, true, nil
	}
	return probe.DeadDrainer{}, false, nil
}

// unreachable is the taint that says a node's pods are out of reach: the
// node controller's unreachable taint, or the out-of-service taint of a
// node shut down for good. "" when it has neither.
func unreachable(node *corev1.Node) string {
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeOutOfService {
			return t.Key
		}
	}
	return ""
}

// fleetOf is the OutboxDrainer a drainer pod belongs to.
func fleetOf(pod client.Object) (types.NamespacedName, bool) {
	name, ok := pod.GetLabels()[resource.InstanceLabel]
	return types.NamespacedName{Namespace: pod.GetNamespace(), Name: name}, ok && name != ""
}

// drainerPodEvents reconciles a fleet when one of its drainer pods dies: it
// is deleted, which is remembered, or it fails.
func (r *OutboxDrainerReconciler) drainerPodEvents() handler.EventHandler {
	enqueue := func(pod client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if fleet, ok := fleetOf(pod); ok {
			q.Add(reconcile.Request{NamespacedName: fleet})
		}
	}
	failed := func(pod client.Object) bool {
		p, ok := pod.(*corev1.Pod)
		return ok && p.Status.Phase == corev1.PodFailed
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if failed(e.Object) {
				enqueue(e.Object, q)
			}
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if failed(e.ObjectNew) && !failed(e.ObjectOld) {
				enqueue(e.ObjectNew, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if fleet, ok := fleetOf(e.Object); ok {
				r.departures.add(fleet, e.Object.GetName(), time.Now())
				enqueue(e.Object, q)
			}
		},
	}
}

// nodeEvents reconciles the fleets with drainers on a node that became
// unreachable, or reachable again.
func (r *OutboxDrainerReconciler) nodeEvents() handler.EventHandler {
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			before, after := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			if unreachable(before) == unreachable(after) {
				return
			}
			var pods corev1.PodList
			if err := r.List(ctx, &pods, client.MatchingFields{podNodeIndex: after.Name}); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Failed to list the drainer pods on a Node", "node", after.Name)
				return
			}
			for i := range pods.Items {
				if fleet, ok := fleetOf(&pods.Items[i]); ok {
					q.Add(reconcile.Request{NamespacedName: fleet})
				}
			}
		},
	}
}

// keepPodFields is the cache's transform of drainer pods: only what tells
// whether a drainer is dead, its fleet and its node, so that a cluster of
// many drainers costs the operator little memory.
func keepPodFields(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta:   pod.TypeMeta,
		ObjectMeta: strippedMeta(pod.ObjectMeta),
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status:     corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}

// keepNodeFields is the cache's transform of nodes: their taints, without
// the status (images, conditions, addresses) that makes a Node large.
func keepNodeFields(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		TypeMeta:   node.TypeMeta,
		ObjectMeta: strippedMeta(node.ObjectMeta),
		Spec:       corev1.NodeSpec{Taints: node.Spec.Taints},
	}, nil
}

func strippedMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: m.Labels, OwnerReferences: m.OwnerReferences, DeletionTimestamp: m.DeletionTimestamp,
	}
}
