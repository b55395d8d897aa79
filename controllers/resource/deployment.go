package resource

import (
	"maps"
	"math"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

const (
	// ContainerName is the drainer container's name.
	ContainerName = "drainer"
	// shutdownGrace is added to the drainer's shutdown timeout, so the
	// kubelet's SIGKILL never cuts a clean shutdown short.
	shutdownGrace = 10 * time.Second
	// nonRootID is the image's nonroot user and group (internal/image).
	nonRootID = 65532
)

// DefaultResources are the drainer's requests when the spec sets none: a
// scheduler that knows nothing of a pod packs it anywhere, and a namespace
// with a ResourceQuota refuses it.
var DefaultResources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("100m"),
		corev1.ResourceMemory: resource.MustParse("128Mi"),
	},
}

// DeploymentBuilder builds the Deployment of drainers.
type DeploymentBuilder struct{ *OutboxDrainerResourceBuilder }

// Deployment returns the Deployment's builder.
func (b *OutboxDrainerResourceBuilder) Deployment() *DeploymentBuilder {
	return &DeploymentBuilder{b}
}

// Build returns the Deployment. The OutboxDrainer, through its scale
// subresource, owns the replica count: a scale of the Deployment itself is
// reverted like any other edit.
func (b *DeploymentBuilder) Build() (client.Object, error) {
	return b.owned(&appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: b.Instance.Name, Namespace: b.Instance.Namespace, Labels: labelsOf(b.Instance)},
		Spec:       b.spec(),
	})
}

// Wanted is always true: a paused fleet is a Deployment scaled to zero.
func (b *DeploymentBuilder) Wanted() bool { return true }

func (b *DeploymentBuilder) spec() appsv1.DeploymentSpec {
	od := b.Instance
	image := b.Image
	if od.Spec.Image != "" {
		image = od.Spec.Image
	}
	overlay := od.Spec.Pod
	// The operator's own labels win over the overlay's.
	podLabels := maps.Clone(overlay.Labels)
	if podLabels == nil {
		podLabels = map[string]string{}
	}
	maps.Copy(podLabels, labelsOf(od))
	return appsv1.DeploymentSpec{
		Replicas: ptr.To(DesiredReplicas(od)),
		Selector: &metav1.LabelSelector{MatchLabels: SelectorLabels(od)},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{
				Labels:      podLabels,
				Annotations: maps.Clone(overlay.Annotations),
			},
			Spec: corev1.PodSpec{
				ServiceAccountName: ServiceAccountName(od),
				// A drainer never talks to the Kubernetes API.
				AutomountServiceAccountToken:  ptr.To(false),
				TerminationGracePeriodSeconds: ptr.To(int64(math.Ceil((od.Spec.ShutdownTimeout.Duration + shutdownGrace).Seconds()))),
				SecurityContext:               podSecurityContext(overlay.PlatformAssignsUser),
				NodeSelector:                  maps.Clone(overlay.NodeSelector),
				Tolerations:                   overlay.Tolerations,
				Affinity:                      overlay.Affinity,
				TopologySpreadConstraints:     overlay.TopologySpreadConstraints,
				PriorityClassName:             overlay.PriorityClassName,
				ImagePullSecrets:              overlay.ImagePullSecrets,
				Containers: []corev1.Container{{
					Name:  ContainerName,
					Image: image,
					Args:  append(DrainArgs(od.Spec), fleetArgs(od)...),
					// The drainer ID is the pod name: a restarted container
					// inherits it and releases its predecessor's claims. The
					// user's variables come after it and cannot replace it.
					Env: slices.Concat([]corev1.EnvVar{{
						Name:      "POD_NAME",
						ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}},
					}}, telemetryEnv(od, overlay.Env), withoutEnv(overlay.Env, "POD_NAME")),
					Ports:     []corev1.ContainerPort{{Name: MetricsPortName, ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP}},
					Resources: resources(od.Spec.Resources),
					// Alive while the process serves; ready while the database
					// and the broker are connected and the database does not
					// refuse the claims or the settles. Readiness is asked
					// every 2 s: the fleet's Ready condition follows it.
					LivenessProbe:  httpProbe("/healthz", 10, 3),
					ReadinessProbe: httpProbe("/readyz", 2, 2),
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false),
						ReadOnlyRootFilesystem:   ptr.To(true),
						RunAsNonRoot:             ptr.To(true),
						Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					},
					VolumeMounts: append(secretMounts(od.Spec), overlay.VolumeMounts...),
				}},
				Volumes: append(secretVolumes(od.Spec), overlay.Volumes...),
			},
		},
	}
}

// fleetArgs are the drain arguments that name the fleet itself: a
// CloudEvent's default source.
func fleetArgs(od *v1alpha1.OutboxDrainer) []string {
	if _, ok := messageFormats[od.Spec.MessageFormat]; ok && od.Spec.CloudEventsSource == "" {
		return []string{"--cloudevents-source=/spillway/" + od.Namespace + "/" + od.Name}
	}
	return nil
}

// podSecurityContext is the restricted Pod Security Standard. A platform
// that assigns UIDs (OpenShift's restricted-v2) refuses a pod that names its
// own, so then the user and groups are left to it.
func podSecurityContext(platformAssignsUser bool) *corev1.PodSecurityContext {
	sc := &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if !platformAssignsUser {
		sc.RunAsUser, sc.RunAsGroup, sc.FSGroup = ptr.To(int64(nonRootID)), ptr.To(int64(nonRootID)), ptr.To(int64(nonRootID))
	}
	return sc
}

// resources are the spec's, or DefaultResources when it sets none.
func resources(r corev1.ResourceRequirements) corev1.ResourceRequirements {
	if len(r.Requests) == 0 && len(r.Limits) == 0 && len(r.Claims) == 0 {
		return *DefaultResources.DeepCopy()
	}
	return r
}

// withoutEnv drops the variables the operator sets itself.
func withoutEnv(env []corev1.EnvVar, name string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		if e.Name != name {
			out = append(out, e)
		}
	}
	return out
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
	v := tlsVolume(name, ref.Name)
	v.Secret.Items = []corev1.KeyToPath{{Key: ref.Key, Path: urlFile}}
	return v
}

// tlsVolume mounts a whole Secret, read-only to the drainer's group.
func tlsVolume(name, secretName string) corev1.Volume {
	return corev1.Volume{
		Name: name,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  secretName,
			DefaultMode: ptr.To(int32(0o440)),
		}},
	}
}

// secretVolumes are the Secrets a drainer reads (see mountedSecrets).
func secretVolumes(s v1alpha1.OutboxDrainerSpec) []corev1.Volume {
	var vols []corev1.Volume
	for _, m := range mountedSecrets(s) {
		if m.key != nil {
			vols = append(vols, secretVolume(m.volume, *m.key))
		} else {
			vols = append(vols, tlsVolume(m.volume, m.whole))
		}
	}
	return vols
}

// directURL is the Secret key of the URL past the pooler, or nil.
func directURL(s v1alpha1.OutboxDrainerSpec) *v1alpha1.SecretKeyRef {
	if p := s.Database.Pooler; p != nil {
		return p.DirectURLSecretRef
	}
	return nil
}

// SecretNames are the Secrets a fleet's drainers mount.
func SecretNames(s v1alpha1.OutboxDrainerSpec) []string {
	var names []string
	for _, m := range mountedSecrets(s) {
		if m.key != nil {
			names = append(names, m.key.Name)
		} else {
			names = append(names, m.whole)
		}
	}
	return names
}

// secretMounts mount secretVolumes where the drainer's flags point.
func secretMounts(s v1alpha1.OutboxDrainerSpec) []corev1.VolumeMount {
	var mounts []corev1.VolumeMount
	for _, m := range mountedSecrets(s) {
		mounts = append(mounts, corev1.VolumeMount{Name: m.volume, MountPath: m.dir, ReadOnly: true})
	}
	return mounts
}
