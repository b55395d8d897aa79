package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/spillway-io/spillway/test/localnode"
	"github.com/spillway-io/spillway/test/testenv"
)

// NodeName is the local cluster's one node.
const NodeName = "local"

// Cluster is a local Kubernetes cluster that runs pods: envtest's etcd and
// kube-apiserver, a kube-controller-manager and a kube-scheduler built like
// them (hack/control-plane.sh), and a node that runs each pod's containers
// as processes of this machine (test/localnode), from images it pulls from
// the cluster's own registry, served in-process. There is no kube-proxy:
// a pod reaches the API server, the local Postgres and the local RabbitMQ on
// its loopback, through its network namespace's forwarder.
type Cluster struct {
	// Dir holds the kubeconfig, the components' logs, and the node's pods.
	Dir string
	// Kubeconfig authenticates as an administrator.
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	Node       *localnode.Node
	// Kubectl is the kubectl built with the cluster, of the same release.
	Kubectl string
	// Images are the images the cluster's registry serves.
	Images Images

	env          *envtest.Environment
	components   []*exec.Cmd
	logs         []*os.File
	stopRegistry func()
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// ImageLayout is the OCI layout of Spillway's image (ImageLayout()),
	// which the cluster's registry serves.
	ImageLayout string
	// Progress receives a line per step; nil is quiet.
	Progress io.Writer
	// Forward are more loopback addresses of the host that the pods reach,
	// beside the test Postgres and RabbitMQ.
	Forward []string
	// CRDs installs Spillway's CRDs with the API server, for a run that
	// does not install the chart.
	CRDs bool
}

// ClusterAssets is the directory of the cluster's binaries, which
// KUBEBUILDER_ASSETS names.
func ClusterAssets() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", errors.New("KUBEBUILDER_ASSETS is not set: make test sets it to the directory hack/control-plane.sh builds and prints")
	}
	for _, bin := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("%s is missing from KUBEBUILDER_ASSETS (%s): run hack/control-plane.sh, which builds it", bin, dir)
		}
	}
	return dir, nil
}

// StartCluster starts the local cluster and waits until it runs pods.
// Stop tears it down.
func StartCluster(ctx context.Context, opts ClusterOptions) (c *Cluster, err error) {
	progress := func(format string, args ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "cluster: "+format+"\n", args...)
		}
	}
	assets, err := ClusterAssets()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "spillway-cluster")
	if err != nil {
		return nil, err
	}
	// The pods' users reach their volumes under it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	c = &Cluster{Dir: dir, Kubectl: filepath.Join(assets, "kubectl")}
	defer func() {
		if err != nil {
			_ = c.Stop()
			err = fmt.Errorf("%w (logs in %s)", err, dir)
		}
	}()

	start := time.Now()
	c.env = &envtest.Environment{}
	if opts.CRDs {
		c.env.CRDDirectoryPaths = []string{crdDir()}
		c.env.ErrorIfCRDPathMissing = true
	}
	api := c.env.ControlPlane.GetAPIServer()
	// envtest turns off the ServiceAccount admission plugin, which needs the
	// controller-manager's default ServiceAccounts; this cluster runs it,
	// and its pods need the token volume the plugin adds. TaintNodesByCondition
	// would taint the new node not-ready, a taint that only the
	// controller-manager's node lifecycle controller lifts, which is off:
	// it allocates pod CIDRs and evicts pods of unreachable nodes, neither of
	// which a one-node cluster of processes has.
	api.Configure().Set("disable-admission-plugins", "TaintNodesByCondition")
	if c.Config, err = c.env.Start(); err != nil {
		return c, fmt.Errorf("start etcd and kube-apiserver: %w", err)
	}
	progress("etcd and kube-apiserver up at %s in %s", c.Config.Host, since(start))
	if c.Kubeconfig, err = WriteKubeconfig(c.env, Administrator, dir); err != nil {
		return c, err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return c, err
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, api.SecureServing.CA, 0o644); err != nil {
		return c, err
	}

	if err := c.startComponent(assets, "kube-controller-manager",
		"--kubeconfig="+c.Kubeconfig,
		// nodeipam allocates pod CIDRs, nodelifecycle watches node health
		// and evicts: neither applies to one node of local processes.
		"--controllers=*,-nodeipam,-nodelifecycle",
		"--use-service-account-credentials=false",
		"--leader-elect=false",
		// Signs the ServiceAccount token Secrets with the API server's key,
		// and publishes the API server's CA as kube-root-ca.crt in every
		// namespace, which the token volumes project.
		"--service-account-private-key-file="+filepath.Join(api.CertDir, "sa-signer.key"),
		"--root-ca-file="+caFile,
		"--secure-port=0",
	); err != nil {
		return c, err
	}
	if err := c.startComponent(assets, "kube-scheduler",
		"--kubeconfig="+c.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	); err != nil {
		return c, err
	}
	if err := c.waitFor(ctx, "the controller-manager's default ServiceAccount and kube-root-ca.crt", func(ctx context.Context) error {
		if _, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := c.Client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	}); err != nil {
		return c, err
	}
	progress("kube-controller-manager and kube-scheduler up in %s", since(start))

	apiURL, err := url.Parse(c.Config.Host)
	if err != nil {
		return c, err
	}
	nodeLog, err := c.logFile("node")
	if err != nil {
		return c, err
	}
	forward, err := serviceAddrs()
	if err != nil {
		return c, err
	}
	forward = append(forward, opts.Forward...)
	registry, stopRegistry, err := startRegistry()
	if err != nil {
		return c, fmt.Errorf("start the registry: %w", err)
	}
	c.stopRegistry = stopRegistry
	if c.Images, err = pushImages(ctx, registry, opts.ImageLayout, assets); err != nil {
		return c, err
	}
	progress("registry at %s serves %s, built from %s, in %s", registry, c.Images.Spillway, c.Images.Revision, since(start))
	if head := testenv.Revision(); head != "" && head != c.Images.Revision {
		progress("the image was built from %s, not from HEAD %s: run make image to test the code as it is", c.Images.Revision, head)
	}
	c.Node, err = localnode.Start(ctx, localnode.Config{
		Name:      NodeName,
		Client:    c.Client,
		APIServer: apiURL.Host,
		Forward:   forward,
		Dir:       filepath.Join(dir, "node"),
		Log:       nodeLog,
	})
	if err != nil {
		return c, err
	}
	if err := c.waitFor(ctx, "node "+NodeName+" Ready", func(ctx context.Context) error {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("not Ready")
	}); err != nil {
		return c, err
	}
	progress("node %s Ready in %s; logs in %s", NodeName, since(start), dir)
	return c, nil
}

// serviceAddrs are the loopback addresses of the test Postgres and
// RabbitMQ, which every pod reaches at the same address.
func serviceAddrs() ([]string, error) {
	var addrs []string
	for _, raw := range []string{testenv.DatabaseURL(), testenv.BrokerURL()} {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("service URL: %w", err)
		}
		host, port := u.Hostname(), u.Port()
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("the local cluster's pods reach services on the loopback only, not %s", host)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, nil
}

// startComponent runs a control-plane binary with its output in a log file
// of the cluster's. It dies with this process.
func (c *Cluster) startComponent(assets, name string, args ...string) error {
	log, err := c.logFile(name)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(assets, name), args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := localnode.Spawn(cmd); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.components = append(c.components, cmd)
	return nil
}

func (c *Cluster) logFile(name string) (*os.File, error) {
	f, err := os.Create(filepath.Join(c.Dir, name+".log"))
	if err == nil {
		c.logs = append(c.logs, f)
	}
	return f, err
}

// waitFor polls check for up to 2 minutes.
func (c *Cluster) waitFor(ctx context.Context, what string, check func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = check(ctx)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w (last: %v)", what, err, last)
	}
	return nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

// LogFiles lists the components' logs and every container's output.
func (c *Cluster) LogFiles() []string {
	var out []string
	for _, f := range c.logs {
		out = append(out, f.Name())
	}
	if c.Node != nil {
		for _, l := range c.Node.Logs() {
			out = append(out, fmt.Sprintf("%s (pod %s/%s, container %s)", l.Path, l.Namespace, l.Pod, l.Container))
		}
	}
	return out
}

// Stop tears the cluster down: the controllers first, so that nothing
// replaces the pods, then every pod (SIGTERM, SIGKILL after 15 s), then the
// API server. The directory stays, with the logs: RemoveDir removes it.
func (c *Cluster) Stop() error {
	var errs []error
	for _, cmd := range c.components {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	if c.Node != nil {
		errs = append(errs, c.Node.Stop(15*time.Second))
	}
	if c.stopRegistry != nil {
		c.stopRegistry()
	}
	if c.env != nil && c.Config != nil {
		errs = append(errs, c.env.Stop())
	}
	for _, f := range c.logs {
		_ = f.Close()
	}
	return errors.Join(errs...)
}

// RemoveDir removes the cluster's directory, once its logs are not needed.
func (c *Cluster) RemoveDir() error { return os.RemoveAll(c.Dir) }

// Command is name (kubectl, helm) run against the cluster as an
// administrator, with helm's cache and configuration in the cluster's
// directory.
func (c *Cluster) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(c.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.Dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(c.Dir, "helm", "data"))
	return cmd
}
