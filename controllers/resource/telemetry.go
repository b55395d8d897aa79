package resource

import (
	"cmp"
	"maps"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// telemetryEnv is the OTEL_* variables that turn on a fleet's tracing, as
// spec.telemetry says, but for those the pod overlay sets itself; none
// without it. k8s.pod.name refers to POD_NAME, which comes first.
func telemetryEnv(od *v1alpha1.OutboxDrainer, overlay []corev1.EnvVar) []corev1.EnvVar {
	t := od.Spec.Telemetry
	if t == nil {
		return nil
	}
	attrs := map[string]string{"spillway.fleet": od.Name, "k8s.namespace.name": od.Namespace}
	maps.Copy(attrs, t.ResourceAttributes)
	pairs := make([]string, 0, len(attrs)+1)
	for _, k := range slices.Sorted(maps.Keys(attrs)) {
		// The values are percent-encoded, as OTEL_RESOURCE_ATTRIBUTES has them.
		pairs = append(pairs, k+"="+url.PathEscape(attrs[k]))
	}
	pairs = append(pairs, "k8s.pod.name=$(POD_NAME)")
	env := []corev1.EnvVar{
		{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: t.Endpoint},
		{Name: "OTEL_EXPORTER_OTLP_PROTOCOL", Value: cmp.Or(t.Protocol, "http/protobuf")},
		{Name: "OTEL_TRACES_SAMPLER", Value: cmp.Or(t.Sampler, "parentbased_always_on")},
		{Name: "OTEL_RESOURCE_ATTRIBUTES", Value: strings.Join(pairs, ",")},
	}
	if t.SamplerRatio != "" {
		env = append(env, corev1.EnvVar{Name: "OTEL_TRACES_SAMPLER_ARG", Value: t.SamplerRatio})
	}
	return slices.DeleteFunc(env, func(e corev1.EnvVar) bool {
		return slices.ContainsFunc(overlay, func(o corev1.EnvVar) bool { return o.Name == e.Name })
	})
}
