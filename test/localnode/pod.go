package localnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Restart back-off, as the kubelet's: the first restart at once, then 10 s
// doubling up to 5 minutes; a run of 10 minutes forgets the failures.
const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
	backoffReset   = 10 * time.Minute
	// retryInterval paces the retries of a pod that cannot start yet: a
	// missing Secret.
	retryInterval = 2 * time.Second
)

// podRuntime runs one pod: its network namespace and forwarder, its
// volumes, its init containers in order, then its containers, each
// restarted by the pod's policy, and their probes.
type podRuntime struct {
	node   *Node
	dir    string // volumes and scratch space, removed with the pod
	logDir string // the containers' output, kept

	ctx    context.Context // ends when the pod terminates
	cancel context.CancelFunc

	// What a pod cannot change once created.
	namespace, name string
	spec            corev1.PodSpec

	mu           sync.Mutex
	pod          *corev1.Pod
	init, app    []*container
	conditions   []corev1.PodCondition
	startTime    metav1.Time
	sandboxReady bool
	terminating  bool
	// deleted: the pod is being deleted through the API, and the node
	// removes it once its containers have stopped, as a kubelet does.
	deleted  bool
	deadline time.Time
	nudge    chan struct{} // the deadline moved closer
	stopped  chan struct{} // every container has stopped
	synced   chan struct{} // the volumes are no longer written
	finished bool

	netns *os.File
	fwd   *forwarder
	vols  *volumes
}

// container is one container of the pod and its current run.
type container struct {
	spec     corev1.Container
	status   corev1.ContainerStatus
	proc     *process
	failures int // restarts since the last long run
	logs     []string
}

func newPodRuntime(n *Node, pod *corev1.Pod) *podRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	p := &podRuntime{
		node:      n,
		dir:       filepath.Join(n.cfg.Dir, "pods", string(pod.UID)),
		logDir:    filepath.Join(n.cfg.Dir, "logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
		ctx:       ctx,
		cancel:    cancel,
		pod:       pod,
		namespace: pod.Namespace,
		name:      pod.Name,
		spec:      pod.Spec,
		startTime: metav1.Now(),
		nudge:     make(chan struct{}, 1),
		stopped:   make(chan struct{}),
		synced:    make(chan struct{}),
	}
	p.conditions = pod.Status.Conditions
	for _, c := range pod.Spec.InitContainers {
		p.init = append(p.init, newContainer(c, reasonPodInitializing))
	}
	waiting := reasonContainerCreating
	if len(p.init) > 0 {
		waiting = reasonPodInitializing
	}
	for _, c := range pod.Spec.Containers {
		p.app = append(p.app, newContainer(c, waiting))
	}
	return p
}

func newContainer(c corev1.Container, waiting string) *container {
	return &container{spec: c, status: corev1.ContainerStatus{
		Name:  c.Name,
		Image: c.Image,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: waiting}},
	}}
}

// run is the pod's life until it terminates or every container has ended
// for good.
func (p *podRuntime) run() {
	defer p.tearDown()
	if !p.setUp() {
		return
	}
	for _, c := range p.init {
		if !p.runInit(c) {
			return
		}
	}
	var wg sync.WaitGroup
	for _, c := range p.app {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.runApp(c)
		}()
	}
	wg.Wait()
}

// setUp makes the network namespace and the volumes, retrying until it succeeds or the pod terminates.
func (p *podRuntime) setUp() bool {
	for {
		err := p.trySetUp()
		if err == nil {
			p.update(func() { p.sandboxReady = true })
			go p.syncVolumes()
			return true
		}
		p.node.logf("pod %s/%s cannot start yet: %v", p.namespace, p.name, err)
		select {
		case <-p.ctx.Done():
			close(p.synced)
			return false
		case <-time.After(retryInterval):
		}
	}
}

func (p *podRuntime) trySetUp() error {
	if p.vols == nil {
		p.vols = newVolumes(p.node.volumeSource, filepath.Join(p.dir, "volumes"), p.snapshot())
	}
	if err := p.vols.sync(p.ctx); err != nil {
		p.setWaitingMessage("MountVolume failed: " + err.Error())
		return err
	}
	if p.netns == nil {
		ns, err := newNetworkNamespace()
		if err != nil {
			return err
		}
		fwd, err := forward(ns, p.node.forwarded())
		if err != nil {
			ns.Close()
			return err
		}
		p.mu.Lock() // Node.Dial reads it
		p.netns, p.fwd = ns, fwd
		p.mu.Unlock()
	}
	return nil
}

// setWaitingMessage explains a ContainerCreating wait.
func (p *podRuntime) setWaitingMessage(msg string) {
	p.update(func() {
		for _, c := range append(append([]*container{}, p.init...), p.app...) {
			if w := c.status.State.Waiting; w != nil && (w.Reason == reasonContainerCreating || w.Reason == reasonPodInitializing) {
				w.Message = msg
			}
		}
	})
}

// syncVolumes keeps the volumes current: a rotated Secret reaches the
// containers within a second or two, as it does within a minute or so on a
// kubelet.
func (p *podRuntime) syncVolumes() {
	defer close(p.synced)
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-ticker.C:
		}
		p.mu.Lock()
		pod := p.pod
		p.mu.Unlock()
		p.vols.pod = pod
		if err := p.vols.sync(p.ctx); err != nil && p.ctx.Err() == nil {
			p.node.logf("pod %s/%s: sync volumes: %v", pod.Namespace, pod.Name, err)
		}
	}
}

// tearDown runs when every container has ended: it closes the pod's
// network namespace, and finishes the pod's deletion if it is terminating.
func (p *podRuntime) tearDown() {
	if p.fwd != nil {
		_ = p.fwd.close()
	}
	if p.netns != nil {
		_ = p.netns.Close()
	}
	p.update(func() { p.finished = true })
	close(p.stopped)
}

// terminate stops the pod: SIGTERM to every container, SIGKILL to those
// still running after grace. Called again with a shorter grace (a second
// delete), it moves the deadline closer.
func (p *podRuntime) terminate(grace time.Duration, deleted bool) {
	deadline := time.Now().Add(grace)
	p.mu.Lock()
	p.deleted = p.deleted || deleted
	if p.terminating {
		if deadline.Before(p.deadline) {
			p.deadline = deadline
			select {
			case p.nudge <- struct{}{}:
			default:
			}
		}
		p.mu.Unlock()
		return
	}
	p.terminating, p.deadline = true, deadline
	p.mu.Unlock()
	p.cancel()
	go p.kill()
}

func (p *podRuntime) kill() {
	p.signalAll(syscall.SIGTERM)
	for {
		p.mu.Lock()
		wait := time.Until(p.deadline)
		p.mu.Unlock()
		select {
		case <-p.stopped:
			p.node.terminated(p)
			return
		case <-p.nudge:
		case <-time.After(wait):
			p.signalAll(syscall.SIGKILL)
			<-p.stopped
			p.node.terminated(p)
			return
		}
	}
}

func (p *podRuntime) signalAll(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range append(append([]*container{}, p.init...), p.app...) {
		if c.proc != nil && c.proc.running() {
			c.proc.signal(sig)
		}
	}
}

// update changes the pod's state and tells the pod controller the new
// status.
func (p *podRuntime) update(change func()) {
	p.mu.Lock()
	change()
	pod := p.snapshotLocked()
	p.mu.Unlock()
	p.node.notifyPod(pod)
}

// snapshot is the pod with its current status.
func (p *podRuntime) snapshot() *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snapshotLocked()
}

func (p *podRuntime) snapshotLocked() *corev1.Pod {
	pod := p.pod.DeepCopy()
	var init, app []corev1.ContainerStatus
	for _, c := range p.init {
		init = append(init, *c.status.DeepCopy())
	}
	for _, c := range p.app {
		app = append(app, *c.status.DeepCopy())
	}
	policy := pod.Spec.RestartPolicy
	if p.terminating && p.finished {
		// A pod stopped for deletion ends in a terminal phase.
		policy = corev1.RestartPolicyNever
	}
	phase := podPhase(policy, init, app)
	p.conditions = podConditions(p.conditions, p.sandboxReady, phase, init, app, metav1.Now())
	pod.Status = corev1.PodStatus{
		Phase:                 phase,
		Conditions:            p.conditions,
		HostIP:                hostIP,
		HostIPs:               []corev1.HostIP{{IP: hostIP}},
		StartTime:             &p.startTime,
		InitContainerStatuses: init,
		ContainerStatuses:     app,
		QOSClass:              pod.Status.QOSClass,
	}
	return pod
}

// logFiles lists the files of every run of every container.
func (p *podRuntime) logFiles() []ContainerLog {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ContainerLog
	for _, c := range append(append([]*container{}, p.init...), p.app...) {
		for _, path := range c.logs {
			out = append(out, ContainerLog{Namespace: p.namespace, Pod: p.name, Container: c.spec.Name, Path: path})
		}
	}
	return out
}
