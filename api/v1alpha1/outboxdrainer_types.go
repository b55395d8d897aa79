package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Identifier is a table, schema or column name. The pattern is the
// drainer's, deliberately stricter than Postgres: a name that needs quoting
// to be legal is far more likely a typo or an injection than a real column.
//
// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]{0,62}$`
type Identifier string

// SecretKeyRef names one key of a Secret in the OutboxDrainer's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// Key within the Secret whose value is the URL.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +required
	Key string `json:"key"`
}

// Columns maps the outbox's logical columns to the table's own names. The
// JSON names are the drainer's --columns names. An unset column has its
// canonical name; an optional column the table lacks is not used.
type Columns struct {
	// +optional
	ID Identifier `json:"id,omitempty"`
	// +optional
	Payload Identifier `json:"payload,omitempty"`
	// +optional
	Headers Identifier `json:"headers,omitempty"`
	// +optional
	EnqueuedAt Identifier `json:"enqueuedAt,omitempty"`
	// +optional
	AvailableAt Identifier `json:"availableAt,omitempty"`
	// +optional
	PublishedAt Identifier `json:"publishedAt,omitempty"`
	// +optional
	ClaimedAt Identifier `json:"claimedAt,omitempty"`
	// +optional
	ClaimedBy Identifier `json:"claimedBy,omitempty"`
	// +optional
	Attempts Identifier `json:"attempts,omitempty"`
	// +optional
	LastError Identifier `json:"lastError,omitempty"`
	// ParkedAt marks parked rows; spillway migrate adds it.
	// +optional
	ParkedAt Identifier `json:"parkedAt,omitempty"`
	// TraceParent and TraceState hold the W3C trace context of the
	// transaction that wrote a row, which its message carries on. Without
	// them, the traceparent and tracestate keys of the headers column are
	// used.
	// +optional
	TraceParent Identifier `json:"traceparent,omitempty"`
	// +optional
	TraceState Identifier `json:"tracestate,omitempty"`
}

// RoutingKey says where a row's routing key comes from. With none set, it is
// the event_type column.
//
// +kubebuilder:validation:XValidation:rule="[has(self.column), has(self.payloadField), has(self.constant)].filter(x, x).size() <= 1",message="set only one of column, payloadField and constant"
type RoutingKey struct {
	// Column holding the routing key.
	// +optional
	Column Identifier `json:"column,omitempty"`
	// PayloadField is a top-level field of a JSON payload holding the routing key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +optional
	PayloadField string `json:"payloadField,omitempty"`
	// Constant publishes every row with this routing key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Constant string `json:"constant,omitempty"`
}

// Ordering publishes the rows of one key (an aggregate, a customer) one at
// a time, in enqueue order, while rows of different keys flow in parallel.
type Ordering struct {
	// KeyColumn holds each row's ordering key; spillway migrate builds the
	// indexes ordering reads on it. A row whose key is NULL is not ordered.
	// +required
	KeyColumn Identifier `json:"keyColumn"`
	// OnFailure is what a failed row (returned, or unpublishable) does to
	// its key. block: the later rows of the key wait while it retries, and
	// while it is poisoned, until it is published, replayed or parked; the
	// key counts in status.blockedKeys. skip: it is poisoned at once, and
	// the later rows go on.
	// +kubebuilder:validation:Enum=block;skip
	// +kubebuilder:default=block
	// +optional
	OnFailure string `json:"onFailure,omitempty"`
}

// BrokerTLS is the broker's TLS.
//
// +kubebuilder:validation:XValidation:rule="!has(self.external) || !self.external || (has(self.clientCertificate) && self.clientCertificate)",fieldPath=".external",reason="FieldValueInvalid",message="external authenticates with the client certificate: set clientCertificate"
type BrokerTLS struct {
	TLS `json:",inline"`
	// External authenticates with the client certificate (SASL EXTERNAL:
	// RabbitMQ's rabbitmq_auth_mechanism_ssl plugin) instead of the URL's
	// user and password.
	// +optional
	External bool `json:"external,omitempty"`
}

// BrokerSpec is where rows are published. The default exchange drops a
// message whose routing key names no queue, and the broker acks it: without
// mandatory, such a row would be marked published and lost. The drainer
// refuses the same.
//
// +kubebuilder:validation:XValidation:rule="(has(self.exchange) && size(self.exchange) > 0) || (has(self.mandatory) && self.mandatory)",fieldPath=".exchange",reason="FieldValueInvalid",message="set an exchange, or broker.mandatory to publish to the default exchange: there a row whose routing key names no queue is dropped, and would be marked published"
type BrokerSpec struct {
	// URLSecretRef is the key of a Secret holding the AMQP URL, or the URLs
	// of a cluster's nodes, comma-separated: each drainer connects to one,
	// and moves to the next when it fails.
	// +required
	URLSecretRef SecretKeyRef `json:"urlSecretRef"`
	// TLS is the certificates of amqps:// URLs: the server's certificate
	// and its name are always verified.
	// +optional
	TLS *BrokerTLS `json:"tls,omitempty"`
	// Exchange to publish to; empty is the default exchange, which needs
	// mandatory.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Exchange string `json:"exchange,omitempty"`
	// ExchangeType is the type DeclareExchange declares.
	// +kubebuilder:validation:Enum=direct;fanout;topic;headers
	// +kubebuilder:default=topic
	// +optional
	ExchangeType string `json:"exchangeType,omitempty"`
	// DeclareExchange declares a durable exchange on connect, for setups where
	// nothing else owns the topology.
	// +optional
	DeclareExchange bool `json:"declareExchange,omitempty"`
	// Mandatory makes an unroutable row a failed attempt. Off by default: on a
	// fan-out topic exchange "no queue bound yet" is normal, and mandatory
	// would poison those events.
	// +optional
	Mandatory bool `json:"mandatory,omitempty"`
	// MessageProperties is Full, where each message carries besides its
	// message_id, delivery mode, content type and headers the row's enqueue
	// time as its timestamp, the routing key as its type and spillway as its
	// app_id; or Compact, where it carries none of the three. With a uuid id
	// and no headers, compact properties fit the 64 bytes that RabbitMQ keeps
	// on its process heap, and it spent 7–20 % less CPU per message in make bench.
	// +kubebuilder:validation:Enum=Full;Compact
	// +kubebuilder:default=Full
	// +optional
	MessageProperties string `json:"messageProperties,omitempty"`
}

// RetryBackoff is the capped exponential delay before a failed row is
// retried: min(initial × 2^attempts, max).
//
// +kubebuilder:validation:XValidation:rule="duration(self.max) >= duration(self.initial)",message="max must be at least initial"
type RetryBackoff struct {
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive"
	// +kubebuilder:default="1s"
	// +optional
	Initial metav1.Duration `json:"initial,omitzero"`
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="10m"
	// +optional
	Max metav1.Duration `json:"max,omitzero"`
}

// Retention is how long the drainers keep rows. Unset, no published row is
// kept, and every pending row is.
type Retention struct {
	// Published is how long a row is kept once it is published, marked
	// with its publishedAt column. Unset or 0s keeps none: each row is
	// deleted as its publish is confirmed, which costs the database a fifth
	// less CPU and half the WAL of marking it. 0s also deletes the rows an
	// earlier window kept; unset leaves them.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Published *metav1.Duration `json:"published,omitempty"`
	// UnpublishedMaxAge is the age past which a row that was never
	// published, such as a poisoned one, is deleted.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive; leave it unset to keep unpublished rows forever"
	// +optional
	UnpublishedMaxAge *metav1.Duration `json:"unpublishedMaxAge,omitempty"`
}

// PodOverlay is what a fleet may add to its drainer pods.
type PodOverlay struct {
	// Labels added to the pods; the operator's own labels win.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations added to the pods.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +optional
	// +listType=atomic
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// ImagePullSecrets for a drainer image in a private registry.
	// +optional
	// +listType=atomic
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// Env added to the drainer container, such as PGSSLROOTCERT for a CA
	// bundle used with sslmode=verify-full.
	// +optional
	// +listType=atomic
	Env []corev1.EnvVar `json:"env,omitempty"`
	// Volumes added to the pods, such as a CA bundle's ConfigMap.
	// +optional
	// +listType=atomic
	Volumes []corev1.Volume `json:"volumes,omitempty"`
	// VolumeMounts added to the drainer container.
	// +optional
	// +listType=atomic
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	// PlatformAssignsUser leaves runAsUser, runAsGroup and fsGroup unset, for
	// platforms that assign each namespace its own UIDs (OpenShift's
	// restricted-v2). The pods still run as non-root.
	// +optional
	PlatformAssignsUser bool `json:"platformAssignsUser,omitempty"`
}

// Autoscaling sizes a fleet from its outbox: every read of the outbox
// recommends a count, the larger of the backlog's and the oldest pending
// age's; the fleet grows to a higher recommendation at once, and shrinks
// only to the highest recommendation of the last scaleDownStabilization.
//
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",fieldPath=".minReplicas",reason="FieldValueInvalid",messageExpression="'minReplicas %d is above maxReplicas %d'.format([self.minReplicas, self.maxReplicas])"
type Autoscaling struct {
	// MinReplicas is the fewest drainers. At 0 an idle fleet runs no pods,
	// and the first read that finds a backlog starts them.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// MaxReplicas is the most drainers.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +required
	MaxReplicas int32 `json:"maxReplicas"`
	// TargetBacklogPerReplica is the backlog one drainer is sized for: the
	// backlog recommends ceil(backlog / targetBacklogPerReplica) drainers.
	// +kubebuilder:validation:Minimum=1
	// +required
	TargetBacklogPerReplica int64 `json:"targetBacklogPerReplica"`
	// TargetOldestPendingAge, when set, also recommends
	// ceil(replicas × oldestPendingAge / targetOldestPendingAge) drainers,
	// so a backlog that ages grows the fleet even below the backlog target.
	// A table without an enqueuedAt column has no age, and only the
	// backlog counts.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive"
	// +optional
	TargetOldestPendingAge *metav1.Duration `json:"targetOldestPendingAge,omitempty"`
	// ScaleDownStabilization is how long a lower recommendation must hold
	// before the fleet shrinks: it shrinks to the highest recommendation of
	// that window, so a backlog that comes in waves keeps its drainers.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="5m"
	// +optional
	ScaleDownStabilization metav1.Duration `json:"scaleDownStabilization,omitzero"`
}

// OutboxDrainerSpec declares a fleet of drainers for one outbox table. The
// defaults are the drainer's own.
//
// +kubebuilder:validation:XValidation:rule="duration(self.leaseTTL).getMilliseconds() >= 300 * self.pipelineDepth",fieldPath=".leaseTTL",reason="FieldValueInvalid",messageExpression="'leaseTTL %s is too short: the lease rule is leaseTTL >= 3 × pipelineDepth × 100ms = %dms for pipelineDepth %d'.format([self.leaseTTL, 300 * self.pipelineDepth, self.pipelineDepth])"
// +kubebuilder:validation:XValidation:rule="[has(self.broker), has(self.sink) && has(self.sink.rabbitmq), has(self.sink) && has(self.sink.webhook)].filter(x, x).size() == 1",reason="FieldValueInvalid",message="set one sink: sink.rabbitmq (or broker, as earlier fleets name it) or sink.webhook"
// +kubebuilder:validation:XValidation:rule="!has(self.sink) || !has(self.sink.webhook) || 3 * duration(self.sink.webhook.timeout).getMilliseconds() <= duration(self.leaseTTL).getMilliseconds()",fieldPath=".sink.webhook.timeout",reason="FieldValueInvalid",message="a webhook request must end well within its rows' lease: timeout must be at most a third of leaseTTL"
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || self.replicas == 1",fieldPath=".replicas",reason="FieldValueForbidden",messageExpression="'replicas is %d, but autoscaling sets the replica count: remove replicas (it defaults to 1), or remove autoscaling to scale the fleet with kubectl scale, an HPA or KEDA'.format([self.replicas])"
// +kubebuilder:validation:XValidation:rule="!has(self.maxRate) || !has(self.database.pooler) || !has(self.database.pooler.mode) || self.database.pooler.mode != 'Transaction' || has(self.database.pooler.directURLSecretRef)",fieldPath=".maxRate",reason="FieldValueInvalid",message="maxRate is shared by the drainers counting each other on a session of their own, which a pooler in Transaction mode cannot keep: set database.pooler.directURLSecretRef, a URL past the pooler"
type OutboxDrainerSpec struct {
	// Replicas is the number of drainers. They share the outbox through
	// leases, so any number is safe. It is the scale subresource's count,
	// which kubectl scale, an HPA or KEDA set. With autoscaling, the
	// operator sets the count instead, and replicas keeps its default.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Paused scales the fleet to zero; the status is still reported.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// Autoscaling sizes the fleet from its outbox's backlog instead of
	// replicas.
	// +optional
	Autoscaling *Autoscaling `json:"autoscaling,omitempty"`

	// +required
	Database DatabaseSpec `json:"database"`
	// Broker is the RabbitMQ sink as fleets written before sink.rabbitmq
	// name it; the two are the same, and a fleet sets one sink only.
	// +optional
	Broker BrokerSpec `json:"broker,omitzero"`
	// Sink is where rows go: sink.rabbitmq (or broker) or sink.webhook.
	// +optional
	Sink *SinkSpec `json:"sink,omitempty"`

	// BatchSize is the number of rows per claim.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=500
	// +optional
	BatchSize int32 `json:"batchSize,omitempty"`
	// PipelineDepth is the number of publisher confirms in flight at most.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +kubebuilder:default=256
	// +optional
	PipelineDepth int32 `json:"pipelineDepth,omitempty"`
	// LeaseTTL is how long a claim is held before another drainer may take
	// it over: at least 3 × pipelineDepth × 100ms.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="80s"
	// +optional
	LeaseTTL metav1.Duration `json:"leaseTTL,omitzero"`
	// PollInterval is the wait between claims when the outbox is drained.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive"
	// +kubebuilder:default="1s"
	// +optional
	PollInterval metav1.Duration `json:"pollInterval,omitzero"`
	// MaxAttempts is the number of failed attempts after which a row is
	// poisoned: never claimed again until it is replayed.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=10
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// RetryBackoff is the delay before a failed row is retried.
	// +kubebuilder:default={initial:"1s",max:"10m"}
	// +optional
	RetryBackoff RetryBackoff `json:"retryBackoff,omitzero"`
	// MaxPayloadBytes: a larger row is never loaded, and fails with the reason.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=16777216
	// +optional
	MaxPayloadBytes int64 `json:"maxPayloadBytes,omitempty"`
	// ShutdownTimeout is how long a stopping drainer waits for its confirms
	// and settles; the pod's grace period is longer.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive"
	// +kubebuilder:default="30s"
	// +optional
	ShutdownTimeout metav1.Duration `json:"shutdownTimeout,omitzero"`
	// +optional
	Retention *Retention `json:"retention,omitempty"`
	// Ordering publishes the rows of each key in enqueue order, one at a
	// time across the fleet. Unset: no per-key order.
	// +optional
	Ordering *Ordering `json:"ordering,omitempty"`
	// MaxRate caps the events per second the fleet publishes, all its
	// drainers together, so that a backlog drains at a pace the
	// application's database can live beside. Each drainer takes an equal
	// share among the drainers running on the table. Unset: no cap.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxRate *int64 `json:"maxRate,omitempty"`
	// MaxCommitLatency slows each drainer down while a commit on the
	// database takes longer than this: ten times a second, a drainer commits
	// one of its settles synchronously and times it, halves its pace when
	// the commit was slower (down to 10 events/s), and raises it step by
	// step while commits take under half of it. An application's commit
	// waits for the same WAL flush, so the drain yields to a busy database
	// without a rate chosen for its disk. Within maxRate, when both are
	// set. Unset: off.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be positive"
	// +optional
	MaxCommitLatency *metav1.Duration `json:"maxCommitLatency,omitempty"`

	// StatusInterval is how often the operator reads the outbox's backlog.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="must be at least 1s"
	// +kubebuilder:default="15s"
	// +optional
	StatusInterval metav1.Duration `json:"statusInterval,omitzero"`

	// ServiceAccountName runs the drainers as an existing ServiceAccount, for
	// cloud IAM database authentication; the operator then creates none.
	// Unset, the operator creates one named after the fleet, with no API
	// token mounted.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Image overrides the drainer image, by default the operator's own.
	// +optional
	Image string `json:"image,omitempty"`
	// Resources of the drainer container. Unset, the drainer requests 100m
	// CPU and 128Mi of memory, and has no limits.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitzero"`
	// Pod is added to the drainer pods.
	// +optional
	Pod PodOverlay `json:"pod,omitzero"`
	// MessageFormat is how each message presents its row: Plain, as it is;
	// CloudEvents, in the CloudEvents binary mode, its attributes as headers
	// (cloudEvents_ on AMQP, ce- on HTTP) beside the payload; or
	// CloudEventsStructured, each row an application/cloudevents+json event
	// (a webhook batch, a JSON array of them). The type is the row's routing
	// key, the time its enqueue time, the id its id.
	// +kubebuilder:validation:Enum=Plain;CloudEvents;CloudEventsStructured
	// +kubebuilder:default=Plain
	// +optional
	MessageFormat string `json:"messageFormat,omitempty"`
	// CloudEventsSource is every event's source attribute, a URI reference;
	// by default /spillway/<namespace>/<name> of the OutboxDrainer.
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[!-~]+$`
	// +optional
	CloudEventsSource string `json:"cloudEventsSource,omitempty"`
	// Telemetry sends the drainers' traces to an OpenTelemetry collector.
	// A row's trace context goes on in its message either way.
	// +optional
	Telemetry *Telemetry `json:"telemetry,omitempty"`
}

// OutboxDrainer is a fleet of drainers moving one outbox table's rows to
// RabbitMQ, and the outbox's health.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=od,categories=spillway
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Backlog",type=integer,JSONPath=`.status.backlog`
// +kubebuilder:printcolumn:name="Poisoned",type=integer,JSONPath=`.status.poisoned`
// +kubebuilder:printcolumn:name="Oldest",type=string,JSONPath=`.status.oldestPendingAge`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Desired",type=integer,priority=1,JSONPath=`.status.autoscaling.desiredReplicas`
// +kubebuilder:printcolumn:name="Blocked",type=integer,priority=1,JSONPath=`.status.blockedKeys.count`
// +kubebuilder:printcolumn:name="Sink",type=string,priority=1,JSONPath=`.status.sink`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 55",message="metadata.name must be at most 55 characters, so that <name>-metrics is a valid Service name"
type OutboxDrainer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   OutboxDrainerSpec   `json:"spec"`
	Status OutboxDrainerStatus `json:"status,omitzero"`
}

// OutboxDrainerList is a list of OutboxDrainers.
//
// +kubebuilder:object:root=true
type OutboxDrainerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []OutboxDrainer `json:"items"`
}
