// Package controllers turns OutboxDrainers into fleets of drainers and
// reports each outbox's health in its status.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/controllers/status"
)

// secretNameIndex indexes OutboxDrainers by the Secrets they reference.
const secretNameIndex = ".spec.urlSecretRefs.name"

// FieldOwner is the operator's field manager: server-side apply records it
// as the owner of every field the builders set, and reverts others' edits
// of them.
const FieldOwner = "spillway-operator"

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
// and reports its outbox's health, as the Prober last read it.
type OutboxDrainerReconciler struct {
	client.Client
	// APIReader reads straight from the API server: the manager caches only
	// the objects the operator labels, and a same-named object of someone
	// else's is found only there.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	Recorder  events.EventRecorder
	// Image is the drainer image of fleets that do not name one.
	Image string
	// Prober reads the outboxes off the reconcile path.
	Prober *probe.Prober
	// Tracing, when set, makes each reconcile a span.
	Tracing trace.TracerProvider

	// departures are the drainer pods seen deleted.
	departures departures
	// applied is what the last apply of each child wrote.
	applied appliedChildren
}

// +kubebuilder:rbac:groups=spillway.io,resources=outboxdrainers,verbs=get;list;watch
// +kubebuilder:rbac:groups=spillway.io,resources=outboxdrainers/status,verbs=get;update
// +kubebuilder:rbac:groups=spillway.io,resources=outboxdrainers/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=serviceaccounts;services,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile applies the fleet's objects, tells the Prober what to read, and
// writes the status once, if it changed. It never waits on a database.
func (r *OutboxDrainerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	od := &v1alpha1.OutboxDrainer{}
	if err := r.Get(ctx, req.NamespacedName, od); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !od.DeletionTimestamp.IsZero() {
		// The children go with it, through their owner references.
		r.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}

	dead, err := r.deadDrainers(ctx, od)
	if err != nil {
		return ctrl.Result{}, err
	}
	read := r.Prober.Want(probe.Target{
		Key:         req.NamespacedName,
		UID:         od.UID,
		Generation:  od.Generation,
		Database:    od.Spec.Database,
		Ordering:    od.Spec.Ordering,
		Sink:        resource.SinkURL(od.Spec),
		SinkKind:    od.Spec.SinkKind(),
		Signing:     resource.SigningSecret(od.Spec),
		SinkTLS:     resource.SinkTLS(od.Spec),
		MaxAttempts: int(od.Spec.MaxAttempts),
		Interval:    od.Spec.StatusInterval.Duration,
		LeaseTTL:    od.Spec.LeaseTTL.Duration,
		Dead:        dead,
	})
	// The children are built from the fleet as sized by this read.
	sized := od
	if a := od.Spec.Autoscaling; a != nil {
		sized = od.DeepCopy()
		sized.Status.Autoscaling = status.Autoscale(*a, od.Status.Autoscaling, od.Status.Replicas, reading(read), time.Now())
	}

	fleet := status.Fleet{Generation: od.Generation, Paused: od.Spec.Paused, DesiredReplicas: resource.DesiredReplicas(sized)}
	fleet.Deployment, fleet.Conflict, fleet.ApplyError = r.applyChildren(ctx, sized)
	if read != nil && read.Outbox != nil {
		fleet.BrokerBlocked = read.Outbox.BrokerBlocked
	}
	if errors.Is(fleet.ApplyError, errCacheBehind) {
		ctrl.LoggerFrom(ctx).V(1).Info("Retrying after a stale read", "error", fleet.ApplyError)
		return ctrl.Result{RequeueAfter: cacheRetry}, nil
	}

	next := nextStatus(od, fleet, read)
	next.Autoscaling = sized.Status.Autoscaling
	stampRead(&od.Status, next, read)
	r.Prober.ReportFleet(req.NamespacedName, meta.IsStatusConditionTrue(next.Conditions, string(v1alpha1.ConditionReady)),
		fleet.DesiredReplicas, next.ReadyReplicas)
	if !equality.Semantic.DeepEqual(&od.Status, next) {
		warnings := status.Warnings(od.Status.Conditions, next.Conditions)
		scaled := scaleEvent(od, next)
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
		if scaled != "" {
			ctrl.LoggerFrom(ctx).Info("Scaled OutboxDrainer", "replicas", next.Autoscaling.DesiredReplicas, "reason", next.Autoscaling.Reason)
			r.Recorder.Eventf(od, nil, corev1.EventTypeNormal, "Scaled", "Scale", "%s", scaled)
		}
	}
	if fleet.ApplyError != nil {
		return ctrl.Result{}, fleet.ApplyError
	}
	if fleet.Conflict != nil {
		// Nothing to watch tells the operator when the other object goes:
		// look again now and then.
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	return ctrl.Result{}, nil
}

// forget drops what the operator keeps of a deleted fleet.
func (r *OutboxDrainerReconciler) forget(key types.NamespacedName) {
	r.Prober.Forget(key)
	r.departures.forget(key)
	r.applied.forget(key)
}

// conflictRetry is how often a fleet blocked by another's object looks again.
const conflictRetry = time.Minute

// reading is what autoscaling learns from the Prober's latest result: nil
// until a read succeeded, and while reads fail, so that no count follows
// old numbers.
func reading(read *probe.Result) *status.Reading {
	if read == nil || read.Outbox == nil {
		return nil
	}
	o := read.Outbox
	return &status.Reading{Backlog: o.Backlog, OldestPendingAge: o.OldestPendingAge, AgeKnown: o.AgeKnown, Time: read.Time}
}

// scaleEvent is the note of the event that a change of autoscaling's count
// records, or "".
func scaleEvent(od *v1alpha1.OutboxDrainer, next *v1alpha1.OutboxDrainerStatus) string {
	if next.Autoscaling == nil {
		return ""
	}
	before := od.Status.Replicas
	if od.Status.Autoscaling != nil {
		before = od.Status.Autoscaling.DesiredReplicas
	}
	return status.ScaleEvent(before, next.Autoscaling)
}

// nextStatus is what this reconcile observed: the fleet as applied, and the
// outbox as the Prober last read it.
func nextStatus(od *v1alpha1.OutboxDrainer, fleet status.Fleet, read *probe.Result) *v1alpha1.OutboxDrainerStatus {
	next := od.Status.DeepCopy()
	var missingSecrets []string
	if read != nil {
		missingSecrets = read.MissingSecrets
		recordOutbox(next, read)
		meta.SetStatusCondition(&next.Conditions, status.DatabaseReachable(read.Probe, read.Generation))
	}
	database := ptr.Deref(meta.FindStatusCondition(next.Conditions, string(v1alpha1.ConditionDatabaseReachable)), metav1.Condition{})
	ready := status.Ready(fleet, missingSecrets, database)
	progressing := status.Progressing(fleet)
	stalled := status.Stalled(od.Generation, ready, database, progressing)
	for _, c := range []metav1.Condition{
		ready, progressing, status.Degraded(fleet, ptr.Deref(next.Poisoned, 0)),
		stalled, status.Reconciling(od.Generation, ready, progressing, stalled),
	} {
		meta.SetStatusCondition(&next.Conditions, c)
	}
	next.Selector = resource.Selector(od)
	next.Sink = od.Spec.SinkKind()
	if d := fleet.Deployment; d != nil {
		next.Replicas, next.ReadyReplicas = d.Status.Replicas, d.Status.ReadyReplicas
	}
	// kstatus: the spec has been acted on, however that went; Stalled and
	// Reconciling say how.
	next.ObservedGeneration = od.Generation
	return next
}

// recordOutbox puts a read into the status, at a second's precision, as
// the status can show it. A failed read removes the numbers: old numbers
// shown as current would mislead a reader and an autoscaler alike.
func recordOutbox(s *v1alpha1.OutboxDrainerStatus, read *probe.Result) {
	o := read.Outbox
	if o == nil {
		s.Backlog, s.Poisoned, s.OldestPendingAge, s.CountCapped = nil, nil, nil, false
		s.PoisonedBy, s.Parked, s.BlockedKeys = nil, nil, nil
		return
	}
	s.BlockedKeys = status.BlockedKeys(o)
	s.Backlog, s.Poisoned, s.CountCapped = ptr.To(o.Backlog), ptr.To(o.Poisoned), o.Capped
	s.PoisonedBy, s.Parked = status.PoisonedBy(o), nil
	if o.ParkedKnown {
		s.Parked = ptr.To(o.Parked)
	}
	s.OldestPendingAge = nil
	if o.AgeKnown {
		s.OldestPendingAge = &metav1.Duration{Duration: o.OldestPendingAge.Round(time.Second)}
	}
}

// stampRead dates the next status by the good read it carries, but only
// when the status changes: a read that finds the outbox as it was writes
// nothing. At a thousand fleets a write per read was all of the operator's
// idle load on the API server, as node heartbeats were before Leases. The
// time of the latest read is spillway_outbox_last_read_timestamp_seconds.
func stampRead(before, next *v1alpha1.OutboxDrainerStatus, read *probe.Result) {
	if read == nil || read.Outbox == nil {
		return
	}
	if next.LastProbeTime == nil || !equality.Semantic.DeepEqual(before, next) {
		next.LastProbeTime = ptr.To(metav1.NewTime(read.Time.Truncate(time.Second)))
	}
}

// applyChildren applies every child object in the builders' order, and
// returns the Deployment as the API server has it. It stops at the first
// object whose name another object holds: the ServiceAccount first, so
// drainers never run as someone else's.
func (r *OutboxDrainerReconciler) applyChildren(ctx context.Context, od *v1alpha1.OutboxDrainer) (*appsv1.Deployment, *status.Conflict, error) {
	builders := &resource.OutboxDrainerResourceBuilder{Instance: od, Scheme: r.Scheme, Image: r.Image}
	var deployment *appsv1.Deployment
	for _, b := range builders.ResourceBuilders() {
		obj, conflict, err := r.apply(ctx, od, b)
		if err != nil || conflict != nil {
			return deployment, conflict, err
		}
		if d, ok := obj.(*appsv1.Deployment); ok {
			deployment = d
		}
	}
	return deployment, nil, nil
}

// apply applies one child object with server-side apply, or deletes it when
// it is not wanted, and logs and records what it did. It never writes an
// object that the OutboxDrainer does not control: that is a Conflict.
func (r *OutboxDrainerReconciler) apply(ctx context.Context, od *v1alpha1.OutboxDrainer, b resource.ResourceBuilder) (client.Object, *status.Conflict, error) {
	desired, err := b.Build()
	if err != nil {
		return nil, nil, err
	}
	gvk, err := apiutil.GVKForObject(desired, r.Scheme)
	if err != nil {
		return nil, nil, err
	}
	kind, name := gvk.Kind, desired.GetName()
	log := ctrl.LoggerFrom(ctx).WithValues("kind", kind, "name", name)
	live, cached, err := r.existing(ctx, gvk, client.ObjectKeyFromObject(desired), b.Wanted())
	if err != nil {
		return nil, nil, fmt.Errorf("get %s %s: %w", kind, name, err)
	}
	if live != nil && !metav1.IsControlledBy(live, od) {
		if !b.Wanted() {
			return nil, nil, nil // not ours, and no business of ours
		}
		return nil, conflictWith(kind, live), nil
	}

	if !b.Wanted() {
		if live == nil {
			return nil, nil, nil
		}
		// The precondition makes sure the object deleted is the one checked.
		err := r.Delete(ctx, desired, client.Preconditions{UID: &live.UID, ResourceVersion: &live.ResourceVersion})
		if isCacheBehind(err) {
			return nil, nil, fmt.Errorf("delete %s %s: %w: %w", kind, name, errCacheBehind, err)
		}
		if client.IgnoreNotFound(err) != nil {
			r.Recorder.Eventf(od, desired, corev1.EventTypeWarning, "FailedDelete", "Delete", "Failed to delete %s %s: %v", kind, name, err)
			return nil, nil, fmt.Errorf("delete %s %s: %w", kind, name, err)
		}
		log.Info("Deleted " + kind)
		r.Recorder.Eventf(od, desired, corev1.EventTypeNormal, "SuccessfulDelete", "Delete", "Deleted %s %s", kind, name)
		return nil, nil, nil
	}

	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return nil, nil, fmt.Errorf("apply %s %s: %w", kind, name, err)
	}
	applied := &unstructured.Unstructured{Object: u}
	applied.SetGroupVersionKind(gvk)
	// Server-set or empty fields the typed object carries; applying them
	// would claim them.
	unstructured.RemoveNestedField(applied.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(applied.Object, "spec", "template", "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(applied.Object, "status")
	fleet := client.ObjectKeyFromObject(od)
	hash, err := hashOf(applied)
	if err != nil {
		return nil, nil, fmt.Errorf("apply %s %s: %w", kind, name, err)
	}
	if cached != nil && r.applied.unchanged(fleet, kind, hash, live.ResourceVersion) {
		return cached, nil, nil
	}
	err = r.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner(FieldOwner), client.ForceOwnership)
	if err != nil {
		r.Recorder.Eventf(od, desired, corev1.EventTypeWarning, "FailedApply", "Apply", "Failed to apply %s %s: %v", kind, name, err)
		return nil, nil, fmt.Errorf("apply %s %s: %w", kind, name, err)
	}
	switch {
	case live == nil:
		log.Info("Created " + kind)
		r.Recorder.Eventf(od, desired, corev1.EventTypeNormal, "SuccessfulCreate", "Create", "Created %s %s", kind, name)
	case applied.GetResourceVersion() != live.ResourceVersion:
		log.Info("Updated " + kind)
		r.Recorder.Eventf(od, desired, corev1.EventTypeNormal, "SuccessfulUpdate", "Update", "Updated %s %s", kind, name)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied.Object, desired); err != nil {
		return nil, nil, fmt.Errorf("apply %s %s: %w", kind, name, err)
	}
	r.applied.record(fleet, kind, hash, applied.GetResourceVersion())
	return desired, nil, nil
}

// existing returns the metadata of the object of that kind and name, or nil,
// and the object itself when the cache has it.
// The cache holds only what the operator labelled, so a miss of a wanted
// object is confirmed with the API server, which also sees an object of
// someone else's. A miss of an unwanted one is not: the operator deletes
// only what it controls, which it labelled, and asking the API server at
// every reconcile would cost each fleet a request per status read.
func (r *OutboxDrainerReconciler) existing(ctx context.Context, gvk schema.GroupVersionKind, key client.ObjectKey, wanted bool) (*metav1.ObjectMeta, client.Object, error) {
	obj, err := r.Scheme.New(gvk)
	if err != nil {
		return nil, nil, err
	}
	cached := obj.(client.Object)
	err = r.Get(ctx, key, cached)
	if err == nil {
		return &metav1.ObjectMeta{
			Name: cached.GetName(), Namespace: cached.GetNamespace(), UID: cached.GetUID(),
			ResourceVersion: cached.GetResourceVersion(), OwnerReferences: cached.GetOwnerReferences(),
		}, cached, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, nil, err
	}
	if !wanted {
		return nil, nil, nil
	}
	live := &metav1.PartialObjectMetadata{}
	live.SetGroupVersionKind(gvk)
	if err := r.APIReader.Get(ctx, key, live); apierrors.IsNotFound(err) {
		return nil, nil, nil
	} else if err != nil {
		return nil, nil, err
	}
	return &live.ObjectMeta, nil, nil
}

// conflictWith describes an object that holds a child's name.
func conflictWith(kind string, live *metav1.ObjectMeta) *status.Conflict {
	c := &status.Conflict{Kind: kind, Namespace: live.Namespace, Name: live.Name}
	if ref := metav1.GetControllerOfNoCopy(live); ref != nil {
		c.Controller = ref.Kind + " " + ref.Name
	}
	return c
}

// SetupWithManager watches OutboxDrainers, their children, the Secrets they
// reference and the Prober's results, and runs the Prober.
func (r *OutboxDrainerReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.OutboxDrainer{}, secretNameIndex, func(o client.Object) []string {
		od := o.(*v1alpha1.OutboxDrainer)
		return resource.SecretNames(od.Spec)
	})
	if err != nil {
		return fmt.Errorf("index OutboxDrainers by Secret: %w", err)
	}
	err = mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, podNodeIndex, func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	})
	if err != nil {
		return fmt.Errorf("index drainer pods by Node: %w", err)
	}
	if err := mgr.Add(r.Prober); err != nil {
		return fmt.Errorf("add the outbox prober: %w", err)
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
		// A drainer pod that dies, and a node that becomes unreachable,
		// name drainers whose claims to release at once.
		Watches(&corev1.Pod{}, r.drainerPodEvents()).
		Watches(&corev1.Node{}, r.nodeEvents()).
		// Each read of an outbox, done or failed, comes back as an event.
		WatchesRawSource(r.Prober.Source()).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(traced(r, r.Tracing, "OutboxDrainer"))
}

// drainersUsingSecret maps a Secret to the OutboxDrainers that reference it,
// and has the Prober read their outboxes again.
func (r *OutboxDrainerReconciler) drainersUsingSecret(ctx context.Context, secret client.Object) []reconcile.Request {
	var list v1alpha1.OutboxDrainerList
	if err := r.List(ctx, &list, client.InNamespace(secret.GetNamespace()), client.MatchingFields{secretNameIndex: secret.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the OutboxDrainers using a Secret", "secret", secret.GetName())
		return nil
	}
	requests := make([]reconcile.Request, len(list.Items))
	for i, od := range list.Items {
		requests[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&od)}
		r.Prober.Refresh(requests[i].NamespacedName)
	}
	return requests
}
