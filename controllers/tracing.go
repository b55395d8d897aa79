package controllers

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// tracerName is the instrumentation scope of the operator's spans.
const tracerName = "github.com/spillway-io/spillway/controllers"

// tracedReconciler makes each reconcile of one kind a span, with the
// object's namespace and name, its requeue and its error.
type tracedReconciler struct {
	reconcile.Reconciler
	tracer trace.Tracer
	kind   string
}

// traced wraps r, whose objects are of kind, in a span per reconcile; with
// tp nil (tracing off) it returns r itself.
func traced(r reconcile.Reconciler, tp trace.TracerProvider, kind string) reconcile.Reconciler {
	if tp == nil {
		return r
	}
	return &tracedReconciler{Reconciler: r, tracer: tp.Tracer(tracerName), kind: kind}
}

func (t *tracedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ctx, span := t.tracer.Start(ctx, "reconcile "+t.kind, trace.WithAttributes(
		semconv.K8SNamespaceName(req.Namespace), attribute.String("spillway."+lowerKind(t.kind), req.Name)))
	defer span.End()
	result, err := t.Reconciler.Reconcile(ctx, req)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	if result.RequeueAfter > 0 {
		span.SetAttributes(attribute.String("spillway.requeue_after", result.RequeueAfter.String()))
	}
	return result, err
}

// lowerKind names the attribute of a kind's object: spillway.fleet for an
// OutboxDrainer, as the drainers' resource has it, spillway.replay for an
// OutboxReplay.
func lowerKind(kind string) string {
	if kind == "OutboxDrainer" {
		return "fleet"
	}
	return "replay"
}
