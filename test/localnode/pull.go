package localnode

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/reference"
)

// Image pull back-off, as the kubelet's: 10 s doubling up to 5 minutes.
const (
	pullBackoffInitial = 10 * time.Second
	pullBackoffMax     = 5 * time.Minute
)

// pullImage gets a container's image: from the node when its pull policy
// allows and it was pulled before, from its registry otherwise. A failed
// pull shows as ErrImagePull, then ImagePullBackOff until the next try, each
// with its event, as from a kubelet. It returns nil once the pod terminates.
func (p *podRuntime) pullImage(c *container) *image {
	ref := c.spec.Image
	for failures := 0; ; failures++ {
		if !pullNeeded(c.spec) {
			if img := p.node.images.present(ref); img != nil {
				p.event(c, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("Container image %q already present on machine", ref))
				return img
			}
		}
		p.event(c, corev1.EventTypeNormal, "Pulling", fmt.Sprintf("Pulling image %q", ref))
		start := time.Now()
		img, fresh, err := p.node.images.pull(p.ctx, ref)
		if err == nil {
			took := time.Since(start).Round(time.Millisecond)
			what := "Successfully pulled"
			if !fresh {
				what = "Resolved"
			}
			p.event(c, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("%s image %q in %s. Image size: %d bytes.", what, ref, took, img.Size))
			return img
		}
		if p.ctx.Err() != nil {
			return nil
		}
		msg := fmt.Sprintf("Failed to pull image %q: %v", ref, err)
		p.node.logf("pod %s/%s: %s", p.namespace, p.name, msg)
		p.event(c, corev1.EventTypeWarning, "Failed", msg)
		p.event(c, corev1.EventTypeWarning, "Failed", "Error: "+reasonErrImagePull)
		p.setWaiting(c, reasonErrImagePull, msg)
		// ErrImagePull until the kubelet's next sync, then the back-off.
		if !p.sleep(retryInterval) {
			return nil
		}
		backOff := fmt.Sprintf("Back-off pulling image %q", ref)
		p.event(c, corev1.EventTypeNormal, "BackOff", backOff)
		p.setWaiting(c, reasonImagePullBackOff, backOff)
		if !p.sleep(min(pullBackoffInitial<<min(failures, 5), pullBackoffMax)) {
			return nil
		}
	}
}

// sleep waits for d, or until the pod terminates (false).
func (p *podRuntime) sleep(d time.Duration) bool {
	select {
	case <-p.ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (p *podRuntime) setWaiting(c *container, reason, msg string) {
	p.update(func() {
		c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	})
}

// event records an event about a container of the pod, as the kubelet of
// this node.
func (p *podRuntime) event(c *container, eventType, reason, msg string) {
	ref, err := reference.GetReference(scheme.Scheme, p.snapshot())
	if err != nil {
		return
	}
	ref.FieldPath = fmt.Sprintf("spec.containers{%s}", c.spec.Name)
	if p.isInit(c) {
		ref.FieldPath = fmt.Sprintf("spec.initContainers{%s}", c.spec.Name)
	}
	p.node.events.Event(ref, eventType, reason, msg)
}

func (p *podRuntime) isInit(c *container) bool {
	for _, ic := range p.init {
		if ic == c {
			return true
		}
	}
	return false
}

// newRecorder records events as the node's kubelet.
func newRecorder(n *Node) (record.EventRecorder, func()) {
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: n.cfg.Client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: n.cfg.Name})
	return recorder, broadcaster.Shutdown
}
