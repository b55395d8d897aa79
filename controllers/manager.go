package controllers

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/probe"
	"github.com/spillway-io/spillway/controllers/resource"
)

// NewScheme knows the built-in types, OutboxDrainer and OutboxReplay.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// Leader election takes a Lease, and records events, in the operator's
// namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=spillway-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=spillway-system

// Serving metrics securely asks the API server who a scraper is and whether
// it may read /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// CacheOptions scope the manager's cache: the children only where they
// carry the operator's label, and every object only in namespaces, when
// set. Without the label selector, the operator would cache every
// Deployment, Service, ServiceAccount and PodDisruptionBudget in the
// cluster. Of the drainer pods and of the nodes it keeps only what tells
// whether a drainer is dead.
func CacheOptions(namespaces []string) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{resource.ManagedByLabel: resource.ManagedBy})
	drainers := labels.SelectorFromSet(labels.Set{resource.ManagedByLabel: resource.ManagedBy, resource.ComponentLabel: resource.Drainer})
	opts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.Deployment{}:            {Label: managed},
		&corev1.Service{}:               {Label: managed},
		&corev1.ServiceAccount{}:        {Label: managed},
		&policyv1.PodDisruptionBudget{}: {Label: managed},
		&corev1.Pod{}:                   {Label: drainers, Transform: keepPodFields},
		&corev1.Node{}:                  {Transform: keepNodeFields},
	}}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// Options are what the operator is told at its start.
type Options struct {
	// Image is the image of fleets that name none: the operator's own.
	Image string
	Probe probe.Options
	// Tracing, when set, makes each reconcile a span.
	Tracing trace.TracerProvider
}

// Setup adds the reconcilers of OutboxDrainers and OutboxReplays, and the
// Prober they share, to mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, scheme *runtime.Scheme, opts Options) error {
	recorder := mgr.GetEventRecorder("spillway-operator")
	reconciler := &OutboxDrainerReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    scheme,
		Recorder:  recorder,
		Image:     opts.Image,
		Prober:    probe.New(mgr.GetAPIReader(), recorder, probe.DefaultMetrics(), opts.Probe),
		Tracing:   opts.Tracing,
	}
	reconciler.Prober.CacheSecrets(mgr.GetClient())
	if err := reconciler.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	replays := &OutboxReplayReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  recorder,
		Timeout:   opts.Probe.Timeout,
		Prober:    reconciler.Prober,
		Tracing:   opts.Tracing,
	}
	return replays.SetupWithManager(ctx, mgr)
}
