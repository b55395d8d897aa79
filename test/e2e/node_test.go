package e2e

import (
	"context"
	"os"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/test/testenv"
)

// shellPod is a pod of one shell container running script, from the
// cluster's busybox image.
func shellPod(namespace, name, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "sh", Image: cluster.Images.Shell, Command: []string{"sh", "-c", script},
			}},
		},
	}
}

func getPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	got := &corev1.Pod{}
	err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), got)
	return got, err
}

// containerState is the state of a pod's first container.
func containerState(ctx context.Context, pod *corev1.Pod) func(Gomega) corev1.ContainerStatus {
	return func(g Gomega) corev1.ContainerStatus {
		got, err := getPod(ctx, pod)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got.Status.ContainerStatuses).NotTo(BeEmpty())
		return got.Status.ContainerStatuses[0]
	}
}

var _ = Describe("The local cluster's node", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = testenv.UniqueObjectName("node")
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	})

	It("runs a container as its user, with its environment, volumes, hostname and API server, and reports its exit code", func(ctx SpecContext) {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: ns},
			StringData: map[string]string{"password": "sentinel-value"},
		}
		Expect(k8s.Create(ctx, secret)).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns},
			Data:       map[string]string{"greeting": "hello"},
		})).To(Succeed())
		pod := shellPod(ns, "inspect", `
echo "user $(id -u):$(id -g) groups $(id -G)"
echo "hostname $(cat /proc/sys/kernel/hostname)"
echo "pod $POD_NAME in $POD_NAMESPACE, secret $FROM_SECRET"
echo "api $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"
echo "secret file $(cat /etc/spillway-test/secret/password) mode $(stat -L -c %a:%g /etc/spillway-test/secret/password)"
echo "config file $(cat /etc/spillway-test/config/greeting)"
echo "token namespace $(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo "token present"
grep -q "BEGIN CERTIFICATE" /var/run/secrets/kubernetes.io/serviceaccount/ca.crt && echo "ca.crt present"
echo scratch > /scratch/file && echo "emptyDir $(cat /scratch/file)"
echo tmp > /tmp/file && test "$(ls /tmp)" = file && echo "emptyDir over /tmp"
touch /etc/spillway-test/secret/x 2>/dev/null || echo "secret volume read-only"
exit 7`)
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{
			RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(1000)), FSGroup: ptr.To(int64(2000)),
		}
		c := &pod.Spec.Containers[0]
		c.Env = []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "FROM_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "password"}}},
		}
		c.VolumeMounts = []corev1.VolumeMount{
			{Name: "secret", MountPath: "/etc/spillway-test/secret"},
			{Name: "config", MountPath: "/etc/spillway-test/config"},
			{Name: "scratch", MountPath: "/scratch"},
			// Over the host's /tmp, where the node keeps the volumes.
			{Name: "tmp", MountPath: "/tmp"},
		}
		pod.Spec.Volumes = []corev1.Volume{
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr.To(int32(0o440))}}},
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())

		Eventually(func(g Gomega) {
			got, err := getPod(ctx, pod)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodFailed))
		}, time.Minute).Should(Succeed())
		state := containerState(ctx, pod)(Default)
		Expect(state.State.Terminated).NotTo(BeNil())
		Expect(state.State.Terminated.ExitCode).To(BeEquivalentTo(7))
		Expect(state.State.Terminated.Reason).To(Equal("Error"))

		_, apiPort, _ := splitHostPort(cluster.Config.Host)
		out := logOf(ns, "inspect", "sh")
		Expect(out).To(ContainSubstring("user 1000:1000 groups 1000 2000"))
		Expect(out).To(ContainSubstring("hostname inspect"))
		Expect(out).To(ContainSubstring("pod inspect in " + ns + ", secret sentinel-value"))
		Expect(out).To(ContainSubstring("api 127.0.0.1:" + apiPort))
		Expect(out).To(ContainSubstring("secret file sentinel-value mode 440:2000"))
		Expect(out).To(ContainSubstring("config file hello"))
		Expect(out).To(ContainSubstring("token namespace " + ns))
		Expect(out).To(ContainSubstring("token present"))
		Expect(out).To(ContainSubstring("ca.crt present"))
		Expect(out).To(ContainSubstring("emptyDir scratch"))
		Expect(out).To(ContainSubstring("emptyDir over /tmp"))
		Expect(out).To(ContainSubstring("secret volume read-only"))
		_, err := os.Stat("/etc/spillway-test")
		Expect(os.IsNotExist(err)).To(BeTrue(), "the mount points are made in the container's own mount namespace, not on the host")
	})

	It("shows a pod whose image the registry lacks as ErrImagePull, then ImagePullBackOff, with the kubelet's events", func(ctx SpecContext) {
		missing := cluster.Images.Registry + "/spillway-io/missing:1"
		pod := shellPod(ns, "missing-image", "true")
		pod.Spec.Containers[0].Image = missing
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		Eventually(func(g Gomega) {
			s := containerState(ctx, pod)(g)
			g.Expect(s.State.Waiting).NotTo(BeNil())
			g.Expect(s.State.Waiting.Reason).To(Equal("ImagePullBackOff"))
			g.Expect(s.State.Waiting.Message).To(Equal(`Back-off pulling image "` + missing + `"`))
		}, time.Minute, 100*time.Millisecond).Should(Succeed())
		// ErrImagePull lasts two seconds before the back-off: its event, not
		// a poll of the status, shows that it came first.
		Eventually(func(g Gomega) {
			var events corev1.EventList
			g.Expect(k8s.List(ctx, &events, client.InNamespace(ns), client.MatchingFields{"involvedObject.name": pod.Name})).To(Succeed())
			first := map[string]time.Time{}
			for _, e := range events.Items {
				if e.Reason == "BackOff" || e.Message == "Error: ErrImagePull" {
					first[e.Reason] = e.FirstTimestamp.Time
				}
			}
			g.Expect(first).To(HaveKey("Failed"))
			g.Expect(first).To(HaveKey("BackOff"))
			g.Expect(first["Failed"]).To(BeTemporally("<=", first["BackOff"]), "ErrImagePull first")
		}, 30*time.Second).Should(Succeed())
		got, err := getPod(ctx, pod)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Status.Phase).To(Equal(corev1.PodPending))
		Eventually(func(g Gomega) {
			out, err := run("kubectl", "describe", "pod", "missing-image", "--namespace", ns)
			g.Expect(err).NotTo(HaveOccurred())
			// kubectl shows the container's field path before the message.
			g.Expect(out).To(MatchRegexp(`Normal\s+Pulling\s+.*kubelet\s+spec.containers\{sh\}: Pulling image "` + missing + `"`))
			g.Expect(out).To(MatchRegexp(`Warning\s+Failed\s+.*Failed to pull image "` + missing + `": .*NAME_UNKNOWN`))
			g.Expect(out).To(MatchRegexp(`Warning\s+Failed\s+.*Error: ErrImagePull`))
			g.Expect(out).To(MatchRegexp(`Normal\s+BackOff\s+.*Back-off pulling image "` + missing + `"`))
		}, 30*time.Second).Should(Succeed())
	})

	It("runs an image's entrypoint as its user in its own root, read-only when the pod asks, with the CA bundle in place", func(ctx SpecContext) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "image-root", Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					// spillway version: the image's entrypoint, and its cmd from args.
					Name: "spillway", Image: spillwayImage, Args: []string{"version"},
				}, {
					// The shell, in a root of its own, writable unless told.
					Name: "sh", Image: cluster.Images.Shell, Command: []string{"sh", "-c", `
echo "user $(id -u):$(id -g)"
touch /written && echo "root writable"
ls /usr/local/bin/spillway 2>/dev/null || echo "no spillway here"
test -f /etc/hosts && grep -q localhost /etc/hosts && echo "hosts present"`},
				}, {
					Name: "ro", Image: cluster.Images.Shell, Command: []string{"sh", "-c", `touch /written 2>/dev/null || echo "root read-only"; echo tmp > /tmp/f && echo "emptyDir /tmp writable"`},
					SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true), RunAsUser: ptr.To(int64(65532)), RunAsNonRoot: ptr.To(true)},
					VolumeMounts:    []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
				}},
				Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		Eventually(func(g Gomega) {
			got, err := getPod(ctx, pod)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodSucceeded))
		}, time.Minute).Should(Succeed())
		got, err := getPod(ctx, pod)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Status.ContainerStatuses[0].ImageID).To(Equal(spillwayImage), "the digest the node pulled")
		Expect(logOf(ns, "image-root", "spillway")).To(MatchRegexp(`spillway \S+`))
		sh := logOf(ns, "image-root", "sh")
		Expect(sh).To(ContainSubstring("user 0:0"), "busybox's image has no USER")
		Expect(sh).To(ContainSubstring("root writable"))
		Expect(sh).To(ContainSubstring("no spillway here"), "each image's own root")
		Expect(sh).To(ContainSubstring("hosts present"))
		ro := logOf(ns, "image-root", "ro")
		Expect(ro).To(ContainSubstring("root read-only"))
		Expect(ro).To(ContainSubstring("emptyDir /tmp writable"))
	})

	It("stops a deleted pod with SIGTERM, and with SIGKILL once its grace period is over", func(ctx SpecContext) {
		polite := shellPod(ns, "polite", `trap 'echo got SIGTERM; exit 0' TERM; echo started; while true; do sleep 0.1; done`)
		polite.Spec.TerminationGracePeriodSeconds = ptr.To(int64(60))
		stubborn := shellPod(ns, "stubborn", `trap 'echo ignored SIGTERM' TERM; echo started; while true; do sleep 0.1; done`)
		stubborn.Spec.TerminationGracePeriodSeconds = ptr.To(int64(3))
		for _, p := range []*corev1.Pod{polite, stubborn} {
			Expect(k8s.Create(ctx, p)).To(Succeed())
		}
		for _, p := range []*corev1.Pod{polite, stubborn} {
			Eventually(func(g Gomega) {
				g.Expect(containerState(ctx, p)(g).State.Running).NotTo(BeNil())
				g.Expect(logOf(ns, p.Name, "sh")).To(ContainSubstring("started"))
			}, 30*time.Second).Should(Succeed())
		}
		gone := func(p *corev1.Pod) func() bool {
			return func() bool { _, err := getPod(ctx, p); return err != nil }
		}

		start := time.Now()
		Expect(k8s.Delete(ctx, polite)).To(Succeed())
		Eventually(gone(polite), 20*time.Second, 100*time.Millisecond).Should(BeTrue())
		Expect(time.Since(start)).To(BeNumerically("<", 20*time.Second), "gone once it exited, long before its 60 s grace period")
		Expect(logOf(ns, "polite", "sh")).To(ContainSubstring("got SIGTERM"))

		start = time.Now()
		Expect(k8s.Delete(ctx, stubborn)).To(Succeed())
		Eventually(gone(stubborn), 30*time.Second, 100*time.Millisecond).Should(BeTrue())
		Expect(time.Since(start)).To(BeNumerically(">=", 3*time.Second), "killed only after its grace period")
		Expect(logOf(ns, "stubborn", "sh")).To(ContainSubstring("ignored SIGTERM"))
	})

	It("restarts containers by the restart policy, and a container that fails its liveness probe", func(ctx SpecContext) {
		failing := shellPod(ns, "failing", "echo run; exit 3")
		failing.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		succeeding := shellPod(ns, "succeeding", "echo run; exit 0")
		succeeding.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		unhealthy := shellPod(ns, "unhealthy", "echo run; exec sleep 600")
		unhealthy.Spec.RestartPolicy = corev1.RestartPolicyAlways
		unhealthy.Spec.TerminationGracePeriodSeconds = ptr.To(int64(1))
		unhealthy.Spec.Containers[0].LivenessProbe = &corev1.Probe{
			// Nothing listens in the pod.
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
			PeriodSeconds: 1, FailureThreshold: 2,
		}
		for _, p := range []*corev1.Pod{failing, succeeding, unhealthy} {
			Expect(k8s.Create(ctx, p)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			s := containerState(ctx, failing)(g)
			g.Expect(s.RestartCount).To(BeNumerically(">=", 1))
			g.Expect(s.LastTerminationState.Terminated).NotTo(BeNil())
			g.Expect(s.LastTerminationState.Terminated.ExitCode).To(BeEquivalentTo(3))
		}, time.Minute).Should(Succeed())
		Eventually(func(g Gomega) {
			got, err := getPod(ctx, succeeding)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodSucceeded))
			g.Expect(got.Status.ContainerStatuses[0].RestartCount).To(BeZero())
		}, time.Minute).Should(Succeed())
		Eventually(func(g Gomega) {
			s := containerState(ctx, unhealthy)(g)
			g.Expect(s.RestartCount).To(BeNumerically(">=", 1))
			g.Expect(s.LastTerminationState.Terminated).NotTo(BeNil())
			g.Expect(s.LastTerminationState.Terminated.ExitCode).To(BeEquivalentTo(143), "SIGTERM")
		}, time.Minute).Should(Succeed())
	})
})
