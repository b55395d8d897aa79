package localnode

import (
	"context"
	"io"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/utils/ptr"
)

// provider is the node as virtual-kubelet's pod controller sees it.
type provider Node

func (pr *provider) node() *Node { return (*Node)(pr) }

// CreatePod starts running a pod bound to this node.
func (pr *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	n := pr.node()
	n.mu.Lock()
	if _, ok := n.pods[key(pod.Namespace, pod.Name)]; ok {
		n.mu.Unlock()
		return nil
	}
	p := newPodRuntime(n, pod.DeepCopy())
	n.pods[key(pod.Namespace, pod.Name)] = p
	n.mu.Unlock()
	n.logf("pod %s/%s: starting", pod.Namespace, pod.Name)
	go p.run()
	return nil
}

// UpdatePod takes a pod's new labels and annotations, which its downward
// API volumes show. A changed image is not applied: nothing here changes
// images.
func (pr *provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p := pr.node().pod(pod.Namespace, pod.Name)
	if p == nil {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	p.update(func() {
		p.pod.Labels = pod.Labels
		p.pod.Annotations = pod.Annotations
	})
	return nil
}

// DeletePod stops a pod that is being deleted, or that is gone from the API
// server (force-deleted): SIGTERM, and SIGKILL once the grace period ends.
// A force-deleted pod gets its spec's grace period, as from a kubelet.
func (pr *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	n := pr.node()
	p := n.pod(pod.Namespace, pod.Name)
	if p == nil {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	grace := ptr.Deref(pod.Spec.TerminationGracePeriodSeconds, corev1.DefaultTerminationGracePeriodSeconds)
	if g := pod.DeletionGracePeriodSeconds; g != nil && *g > 0 {
		grace = *g
	}
	n.logf("pod %s/%s: terminating, grace period %ds", pod.Namespace, pod.Name, grace)
	p.terminate(time.Duration(grace)*time.Second, true)
	return nil
}

// GetPod is the pod as the node runs it.
func (pr *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p := pr.node().pod(namespace, name)
	if p == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return p.snapshot(), nil
}

// GetPodStatus is the pod's current status.
func (pr *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := pr.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods lists the pods the node runs.
func (pr *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	n := pr.node()
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*corev1.Pod
	for _, p := range n.pods {
		out = append(out, p.snapshot())
	}
	return out, nil
}

// NotifyPods registers the pod controller's callback for status changes:
// the node pushes each change as it happens rather than being polled.
func (pr *provider) NotifyPods(_ context.Context, notify func(*corev1.Pod)) {
	n := pr.node()
	n.mu.Lock()
	n.notify = notify
	n.mu.Unlock()
}

func isGone(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err)
}

// The kubelet API's streams are not served: the containers' output is in
// files (Node.Logs).

func (pr *provider) GetContainerLogs(context.Context, string, string, string, api.ContainerLogOpts) (io.ReadCloser, error) {
	return nil, errNotServed
}

func (pr *provider) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errNotServed
}

func (pr *provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errNotServed
}

func (pr *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errNotServed
}

func (pr *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errNotServed
}

func (pr *provider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errNotServed
}

var errNotServed = errdefs.InvalidInput("the local node does not serve the kubelet API's streams")
