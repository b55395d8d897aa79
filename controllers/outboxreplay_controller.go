package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/controllers/status"
	"github.com/spillway-io/spillway/outbox"
)

// drainerRefIndex indexes OutboxReplays by the OutboxDrainer they name.
const drainerRefIndex = ".spec.drainerRef.name"

// OutboxReplayReconciler carries out each OutboxReplay once: it replays or
// parks the poisoned rows of the named OutboxDrainer's outbox, and records
// what matched and what changed in the status, which then never changes
// again. Its database work runs in its own controller, so a slow database
// holds up no OutboxDrainer's reconcile.
type OutboxReplayReconciler struct {
	client.Client
	// APIReader reads the database Secret straight from the API server: the
	// manager caches only Secrets' metadata.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Timeout bounds the connect and each statement on the server, as the
	// outbox reads' --probe-timeout does.
	Timeout time.Duration
	// RunTimeout bounds one run; a change that takes longer records how far
	// it got and goes on in the next run (default 5m).
	RunTimeout time.Duration
	// Prober, when set, reads the changed outbox again at once, so that the
	// OutboxDrainer's poisoned count follows the change.
	Prober *probe.Prober
	// Tracing, when set, makes each reconcile a span.
	Tracing trace.TracerProvider
}

// +kubebuilder:rbac:groups=spillway.io,resources=outboxreplays,verbs=get;list;watch
// +kubebuilder:rbac:groups=spillway.io,resources=outboxreplays/status,verbs=get;patch

// Reconcile runs an OutboxReplay's change unless its status says it was
// carried out or cannot be, and writes the status once.
func (r *OutboxReplayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	replay := &v1alpha1.OutboxReplay{}
	if err := r.Get(ctx, req.NamespacedName, replay); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if status.ReplayDone(replay.Status) || !replay.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // carried out once, and recorded
	}
	// Confirmed with the API server before anything runs: a cache that has
	// not seen the status of a change carried out yet would run it again.
	if err := r.APIReader.Get(ctx, req.NamespacedName, replay); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if status.ReplayDone(replay.Status) {
		return ctrl.Result{}, nil
	}
	run := status.ReplayRun{Generation: replay.Generation, Started: time.Now()}
	drainerKey := types.NamespacedName{Namespace: replay.Namespace, Name: replay.Spec.DrainerRef.Name}
	od := &v1alpha1.OutboxDrainer{}
	if err := r.Get(ctx, drainerKey, od); apierrors.IsNotFound(err) {
		od = nil
		run.Reason = v1alpha1.ReasonOutboxDrainerNotFound
		run.Message = fmt.Sprintf("OutboxDrainer %q was not found in namespace %q", drainerKey.Name, drainerKey.Namespace)
	} else if err != nil {
		return ctrl.Result{}, fmt.Errorf("get OutboxDrainer %s: %w", drainerKey, err)
	} else if err := r.change(ctx, replay, od, &run); err != nil {
		return ctrl.Result{}, err
	}
	run.Now = time.Now()

	if written, warning, err := r.writeStatus(ctx, replay, run); err != nil {
		return ctrl.Result{}, fmt.Errorf("update status of OutboxReplay %s: %w", req.NamespacedName, err)
	} else if written {
		r.record(ctx, replay, od, warning)
	}
	switch {
	case run.Reason == "":
		if r.Prober != nil && !replay.Spec.DryRun {
			r.Prober.Refresh(drainerKey)
		}
		return ctrl.Result{}, nil
	case run.Reason == v1alpha1.ReasonRunning:
		return ctrl.Result{RequeueAfter: time.Millisecond}, nil
	case run.Reason == v1alpha1.ReasonInvalidSelector:
		return ctrl.Result{}, nil // the spec is immutable: retrying cannot help
	}
	// The controller's rate limiter backs off: 1s, doubling up to 5 minutes.
	return ctrl.Result{}, fmt.Errorf("OutboxReplay %s: %s: %s", req.NamespacedName, run.Reason, run.Message)
}

// writeStatus adds the run to the replay's status, if that changes it. The
// write is fenced on the version read, and on a conflict (someone labelled
// the replay meanwhile) it is made again on the new version: the record of
// a change that was made must not be lost, nor written over a newer one.
func (r *OutboxReplayReconciler) writeStatus(ctx context.Context, replay *v1alpha1.OutboxReplay, run status.ReplayRun) (bool, *metav1.Condition, error) {
	var written bool
	warning := status.ReplayWarning(replay.Status.Conditions, status.NextReplayStatus(replay, run).Conditions)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		next := status.NextReplayStatus(replay, run)
		if equality.Semantic.DeepEqual(&replay.Status, next) {
			return nil
		}
		before := replay.DeepCopy()
		replay.Status = *next
		err := r.Status().Patch(ctx, replay, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) {
			if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(replay), replay); err != nil {
				return err
			}
		}
		written = err == nil
		return err
	})
	return written, warning, err
}

// change runs the replay's change on od's outbox, going on from where an
// earlier run stopped, and puts the outcome into run. The error is only for
// the API server failing to answer.
func (r *OutboxReplayReconciler) change(ctx context.Context, replay *v1alpha1.OutboxReplay, od *v1alpha1.OutboxDrainer, run *status.ReplayRun) error {
	runTimeout := r.RunTimeout
	if runTimeout <= 0 {
		runTimeout = 5 * time.Minute
	}
	runCtx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	req := replayRequest(replay, od.Spec.MaxAttempts, od.Spec.LeaseTTL.Duration)
	result, err := probe.Change(runCtx, r.APIReader, replay.Namespace, od.Spec.Database, req, r.Timeout)
	if err != nil {
		return fmt.Errorf("read the database Secret of OutboxDrainer %s/%s: %w", od.Namespace, od.Name, err)
	}
	run.Reason, run.Message, run.Table, run.Change, run.MaxAttempts = result.Reason, result.Message, result.Table, result.Change, od.Spec.MaxAttempts
	if result.Reason == v1alpha1.ReasonQueryFailed && errors.Is(runCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		run.Reason = v1alpha1.ReasonRunning
		run.Message = fmt.Sprintf("%d rows of %s changed in this run of %s; going on", result.Change.Changed, result.Table, runTimeout)
	}
	return nil
}

// replayRequest is the drainer's request for an OutboxReplay, less what
// earlier runs of it changed already.
func replayRequest(replay *v1alpha1.OutboxReplay, maxAttempts int32, lease time.Duration) outbox.PoisonedRequest {
	sel := replay.Spec.Selector
	limit := int(sel.Limit)
	if replay.Status.Changed != nil && !replay.Spec.DryRun {
		limit = max(1, limit-int(*replay.Status.Changed))
	}
	var since, before *time.Time
	if sel.EnqueuedSince != nil {
		since = &sel.EnqueuedSince.Time
	}
	if sel.EnqueuedBefore != nil {
		before = &sel.EnqueuedBefore.Time
	}
	return outbox.PoisonedRequest{
		Action: outbox.PoisonedAction(replay.Spec.Action),
		Selector: outbox.PoisonedSelector{
			IDs: sel.IDs, LastErrorPattern: sel.LastErrorPattern, EnqueuedSince: since, EnqueuedBefore: before,
			Parked: sel.Parked, Limit: limit,
		},
		MaxAttempts: int(maxAttempts),
		Lease:       lease,
		DryRun:      replay.Spec.DryRun,
	}
}

// record logs a run that changed the status, and records it as an event
// regarding the OutboxReplay, related to its OutboxDrainer: Normal once it
// is carried out, Warning when it cannot go on.
func (r *OutboxReplayReconciler) record(ctx context.Context, replay *v1alpha1.OutboxReplay, od *v1alpha1.OutboxDrainer, warning *metav1.Condition) {
	var related runtime.Object
	if od != nil {
		related = od
	}
	log, action := ctrl.LoggerFrom(ctx), string(replay.Spec.Action)
	if c := meta.FindStatusCondition(replay.Status.Conditions, string(v1alpha1.ReplayComplete)); c != nil && c.Status == metav1.ConditionTrue {
		log.Info("Carried out OutboxReplay", "action", action, "dryRun", replay.Spec.DryRun, "table", replay.Status.Table,
			"matched", replay.Status.Matched, "changed", replay.Status.Changed)
		r.Recorder.Eventf(replay, related, corev1.EventTypeNormal, c.Reason, action, "%s", c.Message)
		return
	}
	if warning != nil {
		log.Info("Failed to carry out OutboxReplay", "reason", warning.Reason, "message", warning.Message)
		r.Recorder.Eventf(replay, related, corev1.EventTypeWarning, warning.Reason, action, "%s", warning.Message)
	}
}

// SetupWithManager watches OutboxReplays and the OutboxDrainers they name.
func (r *OutboxReplayReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.OutboxReplay{}, drainerRefIndex, func(o client.Object) []string {
		return []string{o.(*v1alpha1.OutboxReplay).Spec.DrainerRef.Name}
	})
	if err != nil {
		return fmt.Errorf("index OutboxReplays by OutboxDrainer: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.OutboxReplay{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A replay waiting for its OutboxDrainer runs as soon as it is created.
		Watches(&v1alpha1.OutboxDrainer{}, handler.EnqueueRequestsFromMapFunc(r.replaysOf), builder.WithPredicates(predicate.Funcs{
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		WithOptions(controller.Options{
			// Two changes at once at most: each holds a connection to an
			// application's database for as long as it runs.
			MaxConcurrentReconciles: 2,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, 5*time.Minute),
		}).
		Complete(traced(r, r.Tracing, "OutboxReplay"))
}

// replaysOf maps an OutboxDrainer to the OutboxReplays that name it and are
// still to be carried out.
func (r *OutboxReplayReconciler) replaysOf(ctx context.Context, od client.Object) []reconcile.Request {
	var list v1alpha1.OutboxReplayList
	if err := r.List(ctx, &list, client.InNamespace(od.GetNamespace()), client.MatchingFields{drainerRefIndex: od.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Failed to list the OutboxReplays of an OutboxDrainer", "outboxdrainer", od.GetName())
		return nil
	}
	var requests []reconcile.Request
	for _, replay := range list.Items {
		if !status.ReplayDone(replay.Status) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&replay)})
		}
	}
	return requests
}
