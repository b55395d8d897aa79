package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Sink kinds, as the status and kubectl get -o wide show them.
const (
	SinkRabbitMQ = "RabbitMQ"
	SinkWebhook  = "Webhook"
)

// SinkSpec is where a fleet's rows go: one of its fields. A fleet written
// before sinks had a field of their own sets spec.broker instead of
// sink.rabbitmq, which is the same.
type SinkSpec struct {
	// RabbitMQ publishes each row to an exchange.
	// +optional
	RabbitMQ *BrokerSpec `json:"rabbitmq,omitempty"`
	// Webhook posts each row to one HTTP endpoint.
	// +optional
	Webhook *WebhookSpec `json:"webhook,omitempty"`
}

// WebhookSpec posts each row to one HTTP endpoint, as the Standard Webhooks
// specification has it: the body is the payload, with the content type of
// the payload column; webhook-id is the row's id, and webhook-signature an
// HMAC-SHA256 of the id, the time and the body. A 2xx publishes the row;
// 408, 425, 429 and 5xx count an attempt and wait at least the response's
// Retry-After; any other status counts an attempt; a request that gets no
// response is given back with no attempt counted.
type WebhookSpec struct {
	// URLSecretRef is the key of a Secret holding the endpoint's URL, which
	// may carry credentials. It must be https unless allowHTTP is set.
	// +required
	URLSecretRef SecretKeyRef `json:"urlSecretRef"`
	// SigningSecretRef is the key of a Secret holding the signing secret
	// (whsec_ and base64), or two, one per line, while one replaces the
	// other: each request then carries a signature by each.
	// +required
	SigningSecretRef SecretKeyRef `json:"signingSecretRef"`
	// TLS is the certificates of an https endpoint: the CA that signs its
	// certificate (ca.crt), and a client certificate to present.
	// +optional
	TLS *TLS `json:"tls,omitempty"`
	// HeaderPrefix goes before the name of each of the row's headers.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[!#$%&'*+.^_|~0-9A-Za-z-]*$`
	// +kubebuilder:default="X-Outbox-"
	// +optional
	HeaderPrefix *string `json:"headerPrefix,omitempty"`
	// AllowHTTP lets the URL be http://, in the clear.
	// +optional
	AllowHTTP bool `json:"allowHTTP,omitempty"`
	// Timeout bounds each request: at most a third of leaseTTL.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive"
	// +kubebuilder:default="10s"
	// +optional
	Timeout metav1.Duration `json:"timeout,omitzero"`
	// BatchRows, when over 0, posts up to that many rows per request, as a
	// JSON array of envelopes (docs/webhooks.md gives its shape), instead of
	// one payload per request. pipelineDepth still counts rows.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	BatchRows int32 `json:"batchRows,omitempty"`
	// GonePoisons poisons a row at once when the endpoint answers 410 Gone;
	// otherwise a 410 counts an attempt as any other 4xx does.
	// +optional
	GonePoisons bool `json:"gonePoisons,omitempty"`
}

// RabbitMQ is the fleet's RabbitMQ sink: sink.rabbitmq, or else broker.
func (s OutboxDrainerSpec) RabbitMQ() BrokerSpec {
	if s.Sink != nil && s.Sink.RabbitMQ != nil {
		return *s.Sink.RabbitMQ
	}
	return s.Broker
}

// SinkKind is the kind of sink the spec names.
func (s OutboxDrainerSpec) SinkKind() string {
	if s.Sink != nil && s.Sink.Webhook != nil {
		return SinkWebhook
	}
	return SinkRabbitMQ
}
