package resource

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// builtDeployment is the Deployment the operator applies.
func builtDeployment(od *v1alpha1.OutboxDrainer) *appsv1.Deployment {
	d, err := builderFor(od).Deployment().Build()
	Expect(err).NotTo(HaveOccurred())
	return d.(*appsv1.Deployment)
}

func drainerContainer(d *appsv1.Deployment) corev1.Container {
	Expect(d.Spec.Template.Spec.Containers).To(HaveLen(1))
	return d.Spec.Template.Spec.Containers[0]
}

var _ = Describe("The drainer Deployment", func() {
	var od *v1alpha1.OutboxDrainer
	BeforeEach(func() { od = outboxDrainer() })

	It("runs spillway drain with every setting as a flag, the operator's image, and its own name", func() {
		d := builtDeployment(od)
		Expect(d.Name).To(Equal("orders"))
		Expect(d.Namespace).To(Equal("shop"))
		c := drainerContainer(d)
		Expect(c.Image).To(Equal("ghcr.io/spillway-io/spillway:v1.2.3"))
		Expect(c.Args).To(Equal([]string{
			"drain",
			"--table=public.outbox",
			"--database-url-file=/var/run/secrets/spillway/database/url",
			"--synchronous-commit=false",
			"--broker-url-file=/var/run/secrets/spillway/broker/url",
			"--exchange=orders",
			"--exchange-type=topic",
			"--declare-exchange=false",
			"--mandatory=false",
			"--message-properties=full",
			"--batch-size=500",
			"--pipeline-depth=256",
			"--lease-ttl=1m20s",
			"--poll-interval=1s",
			"--max-attempts=10",
			"--retry-initial=1s",
			"--retry-max=10m0s",
			"--max-payload-bytes=16777216",
			"--shutdown-timeout=30s",
			"--metrics-addr=:8080",
		}))
	})

	It("passes the column mapping, the routing key source and the retention only when they are set", func() {
		od.Spec.Database.Table = "app.athena_outbox"
		od.Spec.Database.Columns = v1alpha1.Columns{ID: "event_id", EnqueuedAt: "created_at"}
		od.Spec.Database.RoutingKey = v1alpha1.RoutingKey{PayloadField: "event_type"}
		od.Spec.Retention = &v1alpha1.Retention{Published: &metav1.Duration{Duration: 72 * time.Hour}}
		args := drainerContainer(builtDeployment(od)).Args
		Expect(args).To(ContainElements(
			"--table=app.athena_outbox",
			"--columns=id=event_id,enqueuedAt=created_at",
			"--routing-key-field=event_type",
			"--retention-published=72h0m0s",
		))
		Expect(args).NotTo(ContainElement(HavePrefix("--retention-unpublished-max-age")))
		Expect(args).NotTo(ContainElement(HavePrefix("--routing-key=")))
		Expect(args).NotTo(ContainElement(HavePrefix("--routing-key-column")))

		od.Spec.Database.RoutingKey = v1alpha1.RoutingKey{Constant: "orders.v1"}
		Expect(drainerContainer(builtDeployment(od)).Args).To(ContainElement("--routing-key=orders.v1"))
	})

	It("mounts only the referenced Secret keys, read-only, and never puts a secret in env or args", func() {
		d := builtDeployment(od)
		pod := d.Spec.Template.Spec
		Expect(pod.Volumes).To(ConsistOf(
			corev1.Volume{Name: "database-url", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "orders-db", Items: []corev1.KeyToPath{{Key: "url", Path: "url"}}, DefaultMode: ptr.To(int32(0o440)),
			}}},
			corev1.Volume{Name: "broker-url", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "rabbit", Items: []corev1.KeyToPath{{Key: "amqp-url", Path: "url"}}, DefaultMode: ptr.To(int32(0o440)),
			}}},
		))
		c := drainerContainer(d)
		Expect(c.VolumeMounts).To(ConsistOf(
			corev1.VolumeMount{Name: "database-url", MountPath: "/var/run/secrets/spillway/database", ReadOnly: true},
			corev1.VolumeMount{Name: "broker-url", MountPath: "/var/run/secrets/spillway/broker", ReadOnly: true},
		))
		Expect(c.EnvFrom).To(BeEmpty())
		for _, e := range c.Env {
			Expect(e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil).To(BeTrue(), e.Name)
		}
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--database-url=")))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--broker-url=")))
	})

	It("mounts each TLS Secret whole, read-only, where the certificate flags point, only when the spec sets it", func() {
		tlsFleet := od.DeepCopy()
		tlsFleet.Spec.Database.TLS = &v1alpha1.TLS{SecretName: "db-tls"}
		tlsFleet.Spec.Broker.TLS = &v1alpha1.BrokerTLS{TLS: v1alpha1.TLS{SecretName: "mq-tls", ClientCertificate: true}, External: true}
		d := builtDeployment(tlsFleet)
		Expect(d.Spec.Template.Spec.Volumes).To(ContainElements(
			corev1.Volume{Name: "database-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "db-tls", DefaultMode: ptr.To(int32(0o440))}}},
			corev1.Volume{Name: "broker-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "mq-tls", DefaultMode: ptr.To(int32(0o440))}}},
		))
		c := drainerContainer(d)
		Expect(c.VolumeMounts).To(ContainElements(
			corev1.VolumeMount{Name: "database-tls", MountPath: "/var/run/secrets/spillway/database-tls", ReadOnly: true},
			corev1.VolumeMount{Name: "broker-tls", MountPath: "/var/run/secrets/spillway/broker-tls", ReadOnly: true},
		))
		Expect(c.Args).To(ContainElements("--database-ca-file=/var/run/secrets/spillway/database-tls/ca.crt",
			"--broker-ca-file=/var/run/secrets/spillway/broker-tls/ca.crt", "--broker-cert-file=/var/run/secrets/spillway/broker-tls/tls.crt",
			"--broker-key-file=/var/run/secrets/spillway/broker-tls/tls.key", "--broker-sasl-external"))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--database-cert-file")), "no client certificate for the database")
		Expect(TLSKeys(tlsFleet.Spec.Database.TLS)).To(Equal([]v1alpha1.SecretKeyRef{{Name: "db-tls", Key: "ca.crt"}}))

		plain := drainerContainer(builtDeployment(od))
		Expect(plain.Args).NotTo(ContainElement(ContainSubstring("-ca-file")))
		Expect(plain.VolumeMounts).To(HaveLen(2))
	})

	It("mounts the URL past a transaction pooler, and passes the pooler's mode and statements, only when the spec sets them", func() {
		pooled := od.DeepCopy()
		pooled.Spec.Database.Pooler = &v1alpha1.Pooler{Mode: v1alpha1.PoolModeTransaction, PreparedStatements: ptr.To(true),
			DirectURLSecretRef: &v1alpha1.SecretKeyRef{Name: "db-direct", Key: "url"}}
		d := builtDeployment(pooled)
		Expect(d.Spec.Template.Spec.Volumes).To(ContainElement(corev1.Volume{Name: "database-direct-url", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: "db-direct", DefaultMode: ptr.To(int32(0o440)), Items: []corev1.KeyToPath{{Key: "url", Path: "url"}}}}}))
		c := drainerContainer(d)
		Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "database-direct-url", MountPath: "/var/run/secrets/spillway/database-direct", ReadOnly: true}))
		Expect(c.Args).To(ContainElements("--database-pool-mode=transaction", "--database-prepared-statements=true",
			"--database-direct-url-file=/var/run/secrets/spillway/database-direct/url"))
		Expect(SecretNames(pooled.Spec)).To(ContainElement("db-direct"))

		polling := od.DeepCopy()
		polling.Spec.Database.Pooler = &v1alpha1.Pooler{Mode: v1alpha1.PoolModeTransaction}
		c = drainerContainer(builtDeployment(polling))
		Expect(c.Args).To(ContainElement("--database-pool-mode=transaction"))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--database-direct-url")))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--database-prepared-statements")), "the mode's default")
		Expect(c.VolumeMounts).To(HaveLen(2))
		Expect(drainerContainer(builtDeployment(od)).Args).NotTo(ContainElement(HavePrefix("--database-pool-mode")))
	})

	It("takes the drainer ID from the pod name through the downward API", func() {
		Expect(drainerContainer(builtDeployment(od)).Env).To(ConsistOf(corev1.EnvVar{
			Name:      "POD_NAME",
			ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
		}))
	})

	It("turns tracing on through the standard OTEL_* variables only when spec.telemetry is set, naming the fleet, its namespace and the pod", func() {
		Expect(drainerContainer(builtDeployment(od)).Env).NotTo(ContainElement(HaveField("Name", HavePrefix("OTEL_"))))
		od.Spec.Telemetry = &v1alpha1.Telemetry{Endpoint: "http://otel-collector.monitoring:4318", Sampler: "parentbased_traceidratio", SamplerRatio: "0.01",
			ResourceAttributes: map[string]string{"team": "payments & billing", "deployment.environment.name": "prod"}}
		od.Spec.Pod.Env = []corev1.EnvVar{{Name: "OTEL_EXPORTER_OTLP_PROTOCOL", Value: "grpc"}}
		env := drainerContainer(builtDeployment(od)).Env
		Expect(env[0].Name).To(Equal("POD_NAME"), "first, so that k8s.pod.name can refer to it")
		Expect(env[1:]).To(Equal([]corev1.EnvVar{
			{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.monitoring:4318"},
			{Name: "OTEL_TRACES_SAMPLER", Value: "parentbased_traceidratio"},
			{Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "deployment.environment.name=prod,k8s.namespace.name=" + od.Namespace +
				",spillway.fleet=" + od.Name + ",team=payments%20&%20billing,k8s.pod.name=$(POD_NAME)"},
			{Name: "OTEL_TRACES_SAMPLER_ARG", Value: "0.01"},
			{Name: "OTEL_EXPORTER_OTLP_PROTOCOL", Value: "grpc"},
		}), "the overlay's protocol wins, set once")
	})

	It("passes the message format, with the fleet as the CloudEvents source unless the spec sets one, and nothing for Plain", func() {
		Expect(drainerContainer(builtDeployment(od)).Args).NotTo(ContainElement(HavePrefix("--message-format")))
		od.Spec.MessageFormat = "CloudEvents"
		Expect(drainerContainer(builtDeployment(od)).Args).To(ContainElements("--message-format=cloudevents",
			"--cloudevents-source=/spillway/"+od.Namespace+"/"+od.Name))
		od.Spec.MessageFormat, od.Spec.CloudEventsSource = "CloudEventsStructured", "urn:shop:orders"
		args := drainerContainer(builtDeployment(od)).Args
		Expect(args).To(ContainElements("--message-format=cloudevents-structured", "--cloudevents-source=urn:shop:orders"))
		Expect(args).NotTo(ContainElement(HavePrefix("--cloudevents-source=/spillway/")))
	})

	It("probes liveness and readiness on the drainer's metrics port", func() {
		c := drainerContainer(builtDeployment(od))
		Expect(c.Ports).To(ConsistOf(corev1.ContainerPort{Name: "metrics", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}))
		Expect(c.LivenessProbe.HTTPGet).To(Equal(&corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("metrics")}))
		Expect(c.ReadinessProbe.HTTPGet).To(Equal(&corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("metrics")}))
		Expect(c.ReadinessProbe.PeriodSeconds*c.ReadinessProbe.FailureThreshold).To(BeNumerically("<=", 5),
			"a drainer the database refuses turns unready within seconds")
	})

	It("runs restricted: non-root, read-only root filesystem, no capabilities, RuntimeDefault seccomp, no API token", func() {
		d := builtDeployment(od)
		pod := d.Spec.Template.Spec
		Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
		Expect(pod.SecurityContext.SeccompProfile).To(Equal(&corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}))
		Expect(pod.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
		Expect(pod.ServiceAccountName).To(Equal("orders"))
		sc := drainerContainer(d).SecurityContext
		Expect(sc.AllowPrivilegeEscalation).To(Equal(ptr.To(false)))
		Expect(sc.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
		Expect(sc.RunAsNonRoot).To(Equal(ptr.To(true)))
		Expect(sc.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		Expect(sc.Capabilities.Add).To(BeEmpty())
	})

	It("gives a stopping drainer longer than its shutdown timeout before the kubelet kills it", func() {
		od.Spec.ShutdownTimeout = metav1.Duration{Duration: 45500 * time.Millisecond}
		d := builtDeployment(od)
		Expect(drainerContainer(d).Args).To(ContainElement("--shutdown-timeout=45.5s"))
		Expect(*d.Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(int64(56)))
	})

	It("is owned by its OutboxDrainer", func() {
		Expect(builtDeployment(od).OwnerReferences).To(ConsistOf(metav1.OwnerReference{
			APIVersion: "spillway.io/v1alpha1", Kind: "OutboxDrainer", Name: "orders", UID: od.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
		}))
	})

	It("adds the pod overlay, with the operator's labels winning, and takes the image override", func() {
		od.Spec.Image = "registry.example/spillway:canary"
		od.Spec.Pod = v1alpha1.PodOverlay{
			Labels:       map[string]string{"team": "payments", "app.kubernetes.io/instance": "hijack"},
			Annotations:  map[string]string{"prometheus.io/scrape": "true"},
			NodeSelector: map[string]string{"pool": "general"},
			Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		}
		d := builtDeployment(od)
		tmpl := d.Spec.Template
		Expect(tmpl.Labels).To(HaveKeyWithValue("team", "payments"))
		Expect(tmpl.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", "orders"))
		Expect(tmpl.Annotations).To(Equal(map[string]string{"prometheus.io/scrape": "true"}))
		Expect(tmpl.Spec.NodeSelector).To(Equal(map[string]string{"pool": "general"}))
		Expect(tmpl.Spec.Tolerations).To(Equal(od.Spec.Pod.Tolerations))
		Expect(drainerContainer(d).Image).To(Equal("registry.example/spillway:canary"))
		Expect(od.Spec.Pod.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", "hijack"), "the spec is not modified")
	})

	It("selects its pods by labels that do not depend on the spec", func() {
		d := builtDeployment(od)
		od.Spec.BatchSize = 7
		Expect(builtDeployment(od).Spec.Selector).To(Equal(d.Spec.Selector))
		Expect(d.Spec.Template.Labels).To(HaveKeyWithValue("app.kubernetes.io/instance", "orders"))
		Expect(metav1.LabelSelectorAsMap(d.Spec.Selector)).To(Equal(SelectorLabels(od)))
	})

	It("scales a paused fleet to zero", func() {
		od.Spec.Replicas = ptr.To(int32(3))
		od.Spec.Paused = true
		Expect(builtDeployment(od).Spec.Replicas).To(Equal(ptr.To(int32(0))))
	})

	It("requests resources when the spec sets none, and takes the spec's otherwise", func() {
		Expect(drainerContainer(builtDeployment(od)).Resources).To(Equal(DefaultResources))
		od.Spec.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}}
		Expect(drainerContainer(builtDeployment(od)).Resources).To(Equal(od.Spec.Resources))
	})

	It("adds the pod options users expect: pull secrets, scheduling, extra env, volumes and mounts, without displacing its own", func() {
		od.Spec.Pod = v1alpha1.PodOverlay{
			ImagePullSecrets:  []corev1.LocalObjectReference{{Name: "registry"}},
			PriorityClassName: "platform-high",
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"general"}}}}},
			}}},
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway}},
			Env:                       []corev1.EnvVar{{Name: "PGSSLROOTCERT", Value: "/etc/ssl/db/ca.crt"}, {Name: "POD_NAME", Value: "hijack"}},
			Volumes: []corev1.Volume{{Name: "db-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "db-ca"}}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "db-ca", MountPath: "/etc/ssl/db", ReadOnly: true}},
		}
		d := builtDeployment(od)
		pod := d.Spec.Template.Spec
		Expect(pod.ImagePullSecrets).To(Equal(od.Spec.Pod.ImagePullSecrets))
		Expect(pod.PriorityClassName).To(Equal("platform-high"))
		Expect(pod.Affinity).To(Equal(od.Spec.Pod.Affinity))
		Expect(pod.TopologySpreadConstraints).To(Equal(od.Spec.Pod.TopologySpreadConstraints))
		Expect(pod.Volumes).To(HaveLen(3))
		Expect(pod.Volumes[2].Name).To(Equal("db-ca"))
		c := drainerContainer(d)
		Expect(c.VolumeMounts).To(ContainElement(od.Spec.Pod.VolumeMounts[0]))
		Expect(c.Env).To(HaveLen(2))
		Expect(c.Env[0].ValueFrom.FieldRef.FieldPath).To(Equal("metadata.name"), "the drainer ID stays the pod name")
		Expect(c.Env[1]).To(Equal(od.Spec.Pod.Env[0]))
	})

	It("runs as an existing ServiceAccount when the spec names one", func() {
		od.Spec.ServiceAccountName = "orders-iam"
		Expect(builtDeployment(od).Spec.Template.Spec.ServiceAccountName).To(Equal("orders-iam"))
		for _, b := range builderFor(od).ResourceBuilders() {
			_, isServiceAccount := b.(*ServiceAccountBuilder)
			Expect(isServiceAccount).To(BeFalse(), "no ServiceAccount of its own")
		}
	})

	It("leaves the user and groups to a platform that assigns them, and still runs as non-root", func() {
		od.Spec.Pod.PlatformAssignsUser = true
		sc := builtDeployment(od).Spec.Template.Spec.SecurityContext
		Expect(sc.RunAsUser).To(BeNil())
		Expect(sc.RunAsGroup).To(BeNil())
		Expect(sc.FSGroup).To(BeNil())
		Expect(sc.RunAsNonRoot).To(Equal(ptr.To(true)))
	})
})
