package v1alpha1

// Telemetry is where a fleet's drainers send their spans, through OTLP, and
// which of them they keep. It sets the standard OTEL_* variables of the
// drainer pods; a variable the pod overlay sets wins.
type Telemetry struct {
	// Endpoint is the collector's OTLP endpoint, such as
	// http://otel-collector.monitoring:4318 (OTEL_EXPORTER_OTLP_ENDPOINT).
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	// +required
	Endpoint string `json:"endpoint"`
	// Protocol is the OTLP transport: http/protobuf, or grpc.
	// +kubebuilder:validation:Enum=http/protobuf;grpc
	// +kubebuilder:default="http/protobuf"
	// +optional
	Protocol string `json:"protocol,omitempty"`
	// Sampler decides which traces are kept (OTEL_TRACES_SAMPLER). The
	// parentbased ones follow the decision of the row's own trace, where it
	// has one.
	// +kubebuilder:validation:Enum=parentbased_always_on;parentbased_always_off;parentbased_traceidratio;always_on;always_off;traceidratio
	// +kubebuilder:default="parentbased_always_on"
	// +optional
	Sampler string `json:"sampler,omitempty"`
	// SamplerRatio is the share of traces a traceidratio sampler keeps,
	// from "0" to "1" (OTEL_TRACES_SAMPLER_ARG).
	// +kubebuilder:validation:Pattern=`^(0(\.[0-9]+)?|1(\.0+)?)$`
	// +optional
	SamplerRatio string `json:"samplerRatio,omitempty"`
	// ResourceAttributes are added to every span's resource, beside the
	// fleet's own: service.name (spillway-drainer, unless set here),
	// spillway.fleet, k8s.namespace.name and k8s.pod.name.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[A-Za-z0-9._/-]{1,255}$'))",message="a resource attribute's name has letters, digits and . _ / - only"
	// +optional
	ResourceAttributes map[string]string `json:"resourceAttributes,omitempty"`
}
