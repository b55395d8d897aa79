// Package controllers turns OutboxDrainers into fleets of drainers and
// reports each outbox's health in its status.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/controllers/status"
	"github.com/spillway-io/spillway/drainer"
)

// secretNameIndex indexes OutboxDrainers by the Secrets they reference.
const secretNameIndex = ".spec.urlSecretRefs.name"

// errCacheBehind marks a write the API server refused because the cache
// that the reconcile read had not seen a recent write yet. It is not a
// failure: the next reconcile, shortly after, reads the newer state.
var errCacheBehind = errors.New("the cache is behind the API server")

// cacheRetry is how soon a reconcile that read a stale cache runs again.
const cacheRetry = 200 * time.Millisecond

func isCacheBehind(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
}

// OutboxDrainerReconciler turns an OutboxDrainer into a fleet of drainers
// and reports its outbox's health.
type OutboxDrainerReconciler struct {
	client.Client
	// APIReader reads Secrets straight from the API server: the manager
	// caches only their metadata, never their values.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	// Image is the drainer image of fleets that do not name one.
	Image string
}

// +kubebuilder:rbac:groups=spillway.io,resources=outboxdrainers,verbs=get;list;watch
// +kubebuilder:rbac:groups=spillway.io,resources=outboxdrainers/status,verbs=get;update
// +kubebuilder:rbac:groups=spillway.io,resources=outboxdrainers/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=serviceaccounts;services,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile applies the fleet's objects, reads the outbox when a read is
// due, and writes the status once, if it changed.
func (r *OutboxDrainerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	od := &v1alpha1.OutboxDrainer{}
	if err := r.Get(ctx, req.NamespacedName, od); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !od.DeletionTimestamp.IsZero() {
		// The children go with it, through their owner references.
		return ctrl.Result{}, nil
	}

	fleet := status.Fleet{Generation: od.Generation, Paused: od.Spec.Paused, DesiredReplicas: resource.DesiredReplicas(od)}
	fleet.Deployment, fleet.ApplyError = r.applyChildren(ctx, od)
	if errors.Is(fleet.ApplyError, errCacheBehind) {
		ctrl.LoggerFrom(ctx).V(1).Info("Retrying after a stale read", "error", fleet.ApplyError)
		return ctrl.Result{RequeueAfter: cacheRetry}, nil
	}

	now := time.Now()
	next, err := r.nextStatus(ctx, od, fleet, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !equality.Semantic.DeepEqual(&od.Status, next) {
		warnings := status.Warnings(od.Status.Conditions, next.Conditions)
		od.Status = *next
		if err := r.Status().Update(ctx, od); isCacheBehind(err) {
			ctrl.LoggerFrom(ctx).V(1).Info("Retrying after a stale read", "error", err)
			return ctrl.Result{RequeueAfter: cacheRetry}, nil
		} else if err != nil {
			return ctrl.Result{}, fmt.Errorf("update status of OutboxDrainer %s: %w", req.NamespacedName, err)
		}
		for _, c := range warnings {
			r.Recorder.Eventf(od, nil, corev1.EventTypeWarning, c.Reason, "ReportStatus", "%s", c.Message)
		}
	}
	if fleet.ApplyError != nil {
		return ctrl.Result{}, fleet.ApplyError
	}
	return ctrl.Result{RequeueAfter: untilNextProbe(next, od.Spec.StatusInterval.Duration, now)}, nil
}

// nextStatus is what this reconcile observed: the fleet as applied, and the
// outbox as read now or, when no read is due, as last read.
func (r *OutboxDrainerReconciler) nextStatus(ctx context.Context, od *v1alpha1.OutboxDrainer, fleet status.Fleet, now time.Time) (*v1alpha1.OutboxDrainerStatus, error) {
	next := od.Status.DeepCopy()
	// A read that is not due would find what the last one did: everything.
	probe := status.Probe{Reason: v1alpha1.ReasonOutboxRead}
	if probeDue(od, now) {
		var err error
		if probe, err = r.readOutbox(ctx, od); err != nil {
			return nil, err
		}
		if probe.Outbox != nil {
			recordOutbox(next, *probe.Outbox, now)
		}
		meta.SetStatusCondition(&next.Conditions, status.DatabaseReachable(probe, od.Generation))
	}
	database := ptr.Deref(meta.FindStatusCondition(next.Conditions, string(v1alpha1.ConditionDatabaseReachable)), metav1.Condition{})
	meta.SetStatusCondition(&next.Conditions, status.Ready(fleet, probe.MissingSecrets, database))
	meta.SetStatusCondition(&next.Conditions, status.Progressing(fleet))
	meta.SetStatusCondition(&next.Conditions, status.Degraded(fleet, ptr.Deref(next.Poisoned, 0)))
	next.Selector = resource.Selector(od)
	if d := fleet.Deployment; d != nil {
		next.Replicas, next.ReadyReplicas = d.Status.Replicas, d.Status.ReadyReplicas
	}
	// observedGeneration says the spec has been fully acted on: every object
	// applied and every Secret the drainers mount found.
	if fleet.ApplyError == nil && len(probe.MissingSecrets) == 0 {
		next.ObservedGeneration = od.Generation
	}
	return next, nil
}

// untilNextProbe is when to reconcile again. A failed read, a missing Secret
// included, is retried at the status interval, not in a tight loop; a Secret
// that appears sooner triggers a reconcile through the Secret watch.
func untilNextProbe(s *v1alpha1.OutboxDrainerStatus, interval time.Duration, now time.Time) time.Duration {
	if s.LastProbeTime == nil || !probeHealthy(s) {
		return interval
	}
	return max(s.LastProbeTime.Add(interval).Sub(now), time.Second)
}

// probeDue says whether to read the outbox now. A healthy fleet's outbox is
// read once per status interval, however often the Deployment's status
// changes; one that was not read, or whose spec changed, at every reconcile.
func probeDue(od *v1alpha1.OutboxDrainer, now time.Time) bool {
	last := od.Status.LastProbeTime
	return last == nil || !probeHealthy(&od.Status) || od.Status.ObservedGeneration != od.Generation ||
		!now.Before(last.Add(od.Spec.StatusInterval.Duration))
}

// probeHealthy says whether the last read found the outbox and every Secret.
func probeHealthy(s *v1alpha1.OutboxDrainerStatus) bool {
	ready := meta.FindStatusCondition(s.Conditions, string(v1alpha1.ConditionReady))
	return meta.IsStatusConditionTrue(s.Conditions, string(v1alpha1.ConditionDatabaseReachable)) &&
		(ready == nil || ready.Reason != v1alpha1.ReasonSecretNotFound)
}

// recordOutbox puts a successful read into the status, at a second's
// precision, as the status can show it.
func recordOutbox(s *v1alpha1.OutboxDrainerStatus, o drainer.OutboxStatus, now time.Time) {
	s.Backlog, s.Poisoned = ptr.To(o.Backlog), ptr.To(o.Poisoned)
	s.OldestPendingAge = nil
	if o.AgeKnown {
		s.OldestPendingAge = &metav1.Duration{Duration: o.OldestPendingAge.Round(time.Second)}
	}
	s.LastProbeTime = ptr.To(metav1.NewTime(now.Truncate(time.Second)))
}

// applyChildren applies every child object in the builders' order, and
// returns the Deployment as the API server has it.
func (r *OutboxDrainerReconciler) applyChildren(ctx context.Context, od *v1alpha1.OutboxDrainer) (*appsv1.Deployment, error) {
	builders := &resource.OutboxDrainerResourceBuilder{Instance: od, Scheme: r.Scheme, Image: r.Image}
	var deployment *appsv1.Deployment
	for _, b := range builders.ResourceBuilders() {
		obj, err := r.apply(ctx, od, b)
		if err != nil {
			return deployment, err
		}
		if d, ok := obj.(*appsv1.Deployment); ok {
			deployment = d
		}
	}
	return deployment, nil
}

// apply creates or updates one child object, or deletes it when it is not
// wanted, and logs and records what it did.
func (r *OutboxDrainerReconciler) apply(ctx context.Context, od *v1alpha1.OutboxDrainer, b resource.ResourceBuilder) (client.Object, error) {
	obj := b.Build()
	gvk, err := apiutil.GVKForObject(obj, r.Scheme)
	if err != nil {
		return nil, err
	}
	kind, name := gvk.Kind, obj.GetName()
	log := ctrl.LoggerFrom(ctx).WithValues("kind", kind, "name", name)

	if !b.Wanted() {
		if err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj); apierrors.IsNotFound(err) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("get %s %s: %w", kind, name, err)
		}
		if err := r.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			r.Recorder.Eventf(od, obj, corev1.EventTypeWarning, "FailedDelete", "Delete", "Failed to delete %s %s: %v", kind, name, err)
			return nil, fmt.Errorf("delete %s %s: %w", kind, name, err)
		}
		log.Info("Deleted " + kind)
		r.Recorder.Eventf(od, obj, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "Deleted %s %s", kind, name)
		return nil, nil
	}

	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error { return b.Update(obj) })
	if isCacheBehind(err) {
		return nil, fmt.Errorf("create or update %s %s: %w: %w", kind, name, errCacheBehind, err)
	}
	if err != nil {
		r.Recorder.Eventf(od, obj, corev1.EventTypeWarning, "FailedUpdate", "Update", "Failed to create or update %s %s: %v", kind, name, err)
		return nil, fmt.Errorf("create or update %s %s: %w", kind, name, err)
	}
	switch op {
	case controllerutil.OperationResultCreated:
		log.Info("Created " + kind)
		r.Recorder.Eventf(od, obj, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created %s %s", kind, name)
	case controllerutil.OperationResultUpdated:
		log.Info("Updated " + kind)
		r.Recorder.Eventf(od, obj, corev1.EventTypeNormal, "SuccessfulUpdate", "Update", "Updated %s %s", kind, name)
	}
	return obj, nil
}

// SetupWithManager watches OutboxDrainers, their children, and the
// Secrets they reference.
func (r *OutboxDrainerReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.OutboxDrainer{}, secretNameIndex, func(o client.Object) []string {
		od := o.(*v1alpha1.OutboxDrainer)
		return []string{od.Spec.Database.URLSecretRef.Name, od.Spec.Broker.URLSecretRef.Name}
	})
	if err != nil {
		return fmt.Errorf("index OutboxDrainers by Secret: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		// Only spec changes: the status the reconciler writes must not
		// trigger another reconcile.
		For(&v1alpha1.OutboxDrainer{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		// Metadata is enough to notice a Secret appear or change, and keeps
		// every Secret's value out of the operator's memory.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.drainersUsingSecret), builder.OnlyMetadata).
		// A slow database delays only its own fleet's reconcile.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// drainersUsingSecret maps a Secret to the OutboxDrainers that reference it.
func (r *OutboxDrainerReconciler) drainersUsingSecret(ctx context.Context, secret client.Object) []reconcile.Request {
	var list v1alpha1.OutboxDrainerList
	if err := r.List(ctx, &list, client.InNamespace(secret.GetNamespace()), client.MatchingFields{secretNameIndex: secret.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the OutboxDrainers using a Secret", "secret", secret.GetName())
		return nil
	}
	requests := make([]reconcile.Request, len(list.Items))
	for i, od := range list.Items {
		requests[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&od)}
	}
	return requests
}
