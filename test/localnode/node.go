// Package localnode is a Kubernetes node that runs pods as processes of
// this machine, for the local cluster the fleet suite and make demo run:
// there is no container runtime here, and no image registry.
//
// virtual-kubelet's node and nodeutil packages do the node's side of the
// API: they register the Node and renew its lease, watch the pods bound to
// it, resolve their environment (downward API, Secret and ConfigMap keys,
// service links) and write their status back. This package is the
// provider: it pulls each container's image from its registry (with
// go-containerregistry; the local cluster serves one in-process) and
// unpacks it once per digest, then runs the container's entrypoint as a
// process inside that file system, in a mount namespace of its own with the
// pod's volumes bind-mounted at their paths, all of a pod's in one network
// namespace, so ports never collide between pods.
package localnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vklogrus "github.com/virtual-kubelet/virtual-kubelet/log/logrus"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// hostIP is the node's address: every pod reaches the host's services on
// its loopback.
const hostIP = "127.0.0.1"

// Config is a node's configuration.
type Config struct {
	// Name of the Node object.
	Name string
	// Client reaches the API server as the node.
	Client kubernetes.Interface
	// APIServer is the API server's loopback address (host:port). Pods find
	// it in KUBERNETES_SERVICE_HOST and _PORT and reach it through their
	// network namespace's forwarder; its serving certificate must cover it.
	APIServer string
	// Forward lists other loopback addresses of the host that every pod
	// reaches at the same address, such as the local Postgres and RabbitMQ.
	Forward []string
	// Dir holds the pulled images, the pods' volumes and the containers'
	// output.
	Dir string
	// Log receives the node's own log.
	Log io.Writer
}

// Node is a running node.
type Node struct {
	cfg          Config
	apiHost      string
	apiPort      int
	volumeSource volumeSource
	images       *imageStore
	events       record.EventRecorder
	stopEvents   func()
	vk           *nodeutil.Node
	cancel       context.CancelFunc
	log          *logrus.Logger

	mu     sync.Mutex
	pods   map[string]*podRuntime // by namespace/name
	gone   []*podRuntime          // deleted pods, whose logs are kept
	notify func(*corev1.Pod)
}

// ContainerLog is the output of one run of a container.
type ContainerLog struct {
	Namespace, Pod, Container, Path string
}

// Start registers the node and runs the pods bound to it until Stop.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	host, portText, err := net.SplitHostPort(cfg.APIServer)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", cfg.APIServer, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", cfg.APIServer, err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	// The containers run as other users, who need to reach their volumes.
	if err := os.Chmod(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	logger := logrus.New()
	logger.SetOutput(cfg.Log)
	logger.SetLevel(logrus.InfoLevel)
	n := &Node{
		cfg:     cfg,
		apiHost: host,
		apiPort: port,
		pods:    map[string]*podRuntime{},
		log:     logger,
		images:  newImageStore(filepath.Join(cfg.Dir, "images")),
	}
	n.events, n.stopEvents = newRecorder(n)
	vklog.L = vklogrus.FromLogrus(logrus.NewEntry(logger))
	// client-go's informers log through klog, a line per pod status update
	// in virtual-kubelet's use of them: into the node's log too.
	klog.LogToStderr(false)
	klog.SetOutput(cfg.Log)
	vk, err := nodeutil.NewNode(cfg.Name, func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		n.volumeSource = volumeSource{secrets: pc.Secrets, configMaps: pc.ConfigMaps, client: cfg.Client}
		describe(pc.Node, cfg.Name)
		return (*provider)(n), nil, nil
	}, nodeutil.WithClient(cfg.Client), func(c *nodeutil.NodeConfig) error {
		c.NumWorkers = 4
		c.InformerResyncPeriod = time.Minute
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create the node: %w", err)
	}
	n.vk = vk
	runCtx, cancel := context.WithCancel(vklog.WithLogger(context.Background(), vklog.L))
	n.cancel = cancel
	go func() { _ = vk.Run(runCtx) }()
	if err := vk.WaitReady(ctx, 2*time.Minute); err != nil {
		cancel()
		return nil, fmt.Errorf("node %s did not become ready: %w", cfg.Name, err)
	}
	return n, nil
}

// describe fills in what the Node object says about this node.
func describe(n *corev1.Node, name string) {
	n.Labels["kubernetes.io/os"] = "linux"
	n.Labels["kubernetes.io/arch"] = "amd64"
	n.Labels["type"] = "local-process"
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("24Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: hostIP},
		{Type: corev1.NodeHostName, Address: name},
	}
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		OperatingSystem: "linux", Architecture: "amd64",
		KubeletVersion: "local-process", ContainerRuntimeVersion: "local://processes",
	}
}

// forwarded lists the addresses each pod's forwarder serves.
func (n *Node) forwarded() []string {
	return append([]string{n.cfg.APIServer}, n.cfg.Forward...)
}

func (n *Node) logf(format string, args ...any) {
	n.log.Infof(format, args...)
}

// notifyPod passes a pod's status to the pod controller.
func (n *Node) notifyPod(pod *corev1.Pod) {
	n.mu.Lock()
	notify := n.notify
	n.mu.Unlock()
	if notify != nil {
		notify(pod)
	}
}

// terminated finishes a pod whose containers have all stopped: the final
// status, then, for a pod deleted through the API, the removal of its
// object, which is the kubelet's part of a graceful deletion.
func (n *Node) terminated(p *podRuntime) {
	pod := p.snapshot()
	n.notifyPod(pod)
	p.mu.Lock()
	deleted := p.deleted
	p.mu.Unlock()
	if deleted {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := n.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
		})
		if err != nil && !isGone(err) {
			n.logf("pod %s/%s: remove the deleted pod: %v", pod.Namespace, pod.Name, err)
		}
	}
	<-p.synced
	_ = os.RemoveAll(p.dir)
	n.mu.Lock()
	if n.pods[key(pod.Namespace, pod.Name)] == p {
		delete(n.pods, key(pod.Namespace, pod.Name))
	}
	n.gone = append(n.gone, p)
	n.mu.Unlock()
}

func key(namespace, name string) string { return namespace + "/" + name }

func (n *Node) pod(namespace, name string) *podRuntime {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pods[key(namespace, name)]
}

// Logs lists the output files of every container the node has run, the
// deleted pods' included, ordered by pod and container.
func (n *Node) Logs() []ContainerLog {
	n.mu.Lock()
	all := append([]*podRuntime{}, n.gone...)
	for _, p := range n.pods {
		all = append(all, p)
	}
	n.mu.Unlock()
	var out []ContainerLog
	for _, p := range all {
		out = append(out, p.logFiles()...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace+"/"+a.Pod != b.Namespace+"/"+b.Pod {
			return a.Namespace+"/"+a.Pod < b.Namespace+"/"+b.Pod
		}
		return a.Container < b.Container
	})
	return out
}

// Signal sends sig to the running process of a pod's container: a test
// freezes (SIGSTOP) or kills (SIGKILL) a container with it, as a hung or
// crashed program would.
func (n *Node) Signal(namespace, pod, name string, sig syscall.Signal) error {
	p := n.pod(namespace, pod)
	if p == nil {
		return fmt.Errorf("pod %s/%s does not run on node %s", namespace, pod, n.cfg.Name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range append(append([]*container{}, p.init...), p.app...) {
		if c.spec.Name == name && c.proc != nil && c.proc.running() {
			c.proc.signal(sig)
			return nil
		}
	}
	return fmt.Errorf("container %s of pod %s/%s is not running", name, namespace, pod)
}

// Dial connects to addr inside a pod's network namespace, as kubectl
// port-forward reaches a pod's port: a test reads a container's own
// endpoints with it.
func (n *Node) Dial(ctx context.Context, namespace, pod, addr string) (net.Conn, error) {
	p := n.pod(namespace, pod)
	if p == nil {
		return nil, fmt.Errorf("pod %s/%s does not run on node %s", namespace, pod, n.cfg.Name)
	}
	p.mu.Lock()
	ns := p.netns
	p.mu.Unlock()
	if ns == nil {
		return nil, fmt.Errorf("pod %s/%s has no network namespace yet", namespace, pod)
	}
	return dialIn(ctx, ns, addr)
}

// Stop stops the node, then ends every pod, giving each container grace
// after SIGTERM. The pods' objects stay in the API server as they were: a
// node that stops reports nothing more.
func (n *Node) Stop(grace time.Duration) error {
	var errs []error
	n.cancel()
	select {
	case <-n.vk.Done():
	case <-time.After(30 * time.Second):
		errs = append(errs, errors.New("the node's controllers did not stop"))
	}
	n.mu.Lock()
	n.notify = nil
	var running []*podRuntime
	for _, p := range n.pods {
		running = append(running, p)
	}
	n.mu.Unlock()
	for _, p := range running {
		p.terminate(grace, false)
	}
	for _, p := range running {
		select {
		case <-p.stopped:
		case <-time.After(grace + 10*time.Second):
			errs = append(errs, fmt.Errorf("pod %s/%s did not stop", p.namespace, p.name))
		}
	}
	n.stopEvents()
	return errors.Join(errs...)
}

// Dir is where the node keeps its pods' volumes and output.
func (n *Node) Dir() string { return filepath.Clean(n.cfg.Dir) }
