package resource

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

const (
	// SpecHashAnnotation holds the hash of the Deployment spec the operator
	// last built.
	SpecHashAnnotation = "spillway.io/spec-hash"
	// ContainerName is the drainer container's name.
	ContainerName = "drainer"
	// shutdownGrace is added to the drainer's shutdown timeout, so the
	// kubelet's SIGKILL never cuts a clean shutdown short.
	shutdownGrace = 10 * time.Second
	// nonRootID is the nonroot user and group of distroless images.
	nonRootID = 65532
)

// DeploymentBuilder builds the Deployment of drainers.
type DeploymentBuilder struct{ *OutboxDrainerResourceBuilder }

// Deployment returns the Deployment's builder.
func (b *OutboxDrainerResourceBuilder) Deployment() *DeploymentBuilder {
	return &DeploymentBuilder{b}
}

// Build returns the Deployment's name and namespace.
func (b *DeploymentBuilder) Build() client.Object {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name, Namespace: b.Instance.Namespace}}
}

// Wanted is always true: a paused fleet is a Deployment scaled to zero.
func (b *DeploymentBuilder) Wanted() bool { return true }

// Update rewrites the spec only when what the builder builds has changed.
// The API server defaults many fields of a pod template, so comparing the
// live template with a freshly built one would always find a difference and
// rewrite the Deployment on every reconcile; the hash of the built spec does
// not.
func (b *DeploymentBuilder) Update(obj client.Object) error {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return fmt.Errorf("update Deployment: got %T", obj)
	}
	desired := b.spec()
	hash, err := specHash(desired)
	if err != nil {
		return err
	}
	d.Labels = mergeInto(d.Labels, labelsOf(b.Instance))
	if d.Annotations[SpecHashAnnotation] != hash {
		d.Spec = desired
		d.Annotations = mergeInto(d.Annotations, map[string]string{SpecHashAnnotation: hash})
	}
	// The OutboxDrainer, through its scale subresource, owns the replica
	// count, even when someone scales the Deployment itself.
	d.Spec.Replicas = ptr.To(DesiredReplicas(b.Instance))
	return controllerutil.SetControllerReference(b.Instance, d, b.Scheme)
}

// specHash hashes a Deployment spec without its replica count, which
// changes without a rollout.
func specHash(spec appsv1.DeploymentSpec) (string, error) {
	spec.Replicas = nil
	data, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("hash Deployment spec: %w", err)
	}
	h := fnv.New64a()
	_, _ = h.Write(data)
	return strconv.FormatUint(h.Sum64(), 36), nil
}

func (b *DeploymentBuilder) spec() appsv1.DeploymentSpec {
	od := b.Instance
	image := b.Image
	if od.Spec.Image != "" {
		image = od.Spec.Image
	}
	overlay := od.Spec.Pod
	return appsv1.DeploymentSpec{
		Replicas: ptr.To(DesiredReplicas(od)),
		Selector: &metav1.LabelSelector{MatchLabels: SelectorLabels(od)},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{
				Labels:      mergeInto(maps.Clone(overlay.Labels), labelsOf(od)),
				Annotations: maps.Clone(overlay.Annotations),
			},
			Spec: corev1.PodSpec{
				ServiceAccountName:            od.Name,
				AutomountServiceAccountToken:  ptr.To(false),
				TerminationGracePeriodSeconds: ptr.To(int64(math.Ceil((od.Spec.ShutdownTimeout.Duration + shutdownGrace).Seconds()))),
				SecurityContext: &corev1.PodSecurityContext{
					RunAsNonRoot:   ptr.To(true),
					RunAsUser:      ptr.To(int64(nonRootID)),
					RunAsGroup:     ptr.To(int64(nonRootID)),
					FSGroup:        ptr.To(int64(nonRootID)),
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				NodeSelector: maps.Clone(overlay.NodeSelector),
				Tolerations:  overlay.Tolerations,
				Containers: []corev1.Container{{
					Name:  ContainerName,
					Image: image,
					Args:  DrainArgs(od.Spec),
					// The drainer ID is the pod name: a restarted container
					// inherits it and releases its predecessor's claims.
					Env: []corev1.EnvVar{{
						Name:      "POD_NAME",
						ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
					}},
					Ports:     []corev1.ContainerPort{{Name: MetricsPortName, ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP}},
					Resources: od.Spec.Resources,
					// Alive while the process serves; ready once the database
					// and the broker are connected.
					LivenessProbe:  httpProbe("/healthz", 10, 3),
					ReadinessProbe: httpProbe("/readyz", 5, 2),
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false),
						ReadOnlyRootFilesystem:   ptr.To(true),
						RunAsNonRoot:             ptr.To(true),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
					VolumeMounts: []corev1.VolumeMount{
						{Name: "database-url", MountPath: DatabaseURLDir, ReadOnly: true},
						{Name: "broker-url", MountPath: BrokerURLDir, ReadOnly: true},
					},
				}},
				Volumes: []corev1.Volume{
					secretVolume("database-url", od.Spec.Database.URLSecretRef),
					secretVolume("broker-url", od.Spec.Broker.URLSecretRef),
				},
			},
		},
	}
}

func httpProbe(path string, periodSeconds, failureThreshold int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString(MetricsPortName)},
		},
		PeriodSeconds:    periodSeconds,
		TimeoutSeconds:   5,
		FailureThreshold: failureThreshold,
	}
}

// secretVolume mounts only the referenced key, as a file named url, readable
// by the drainer's group alone.
func secretVolume(name string, ref v1alpha1.SecretKeyRef) corev1.Volume {
	return corev1.Volume{
		Name: name,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  ref.Name,
			Items:       []corev1.KeyToPath{{Key: ref.Key, Path: urlFile}},
			DefaultMode: ptr.To(int32(0o440)),
		}},
	}
}
