package localnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// A pod's containers: each run, its restarts with backoff, its probes, and
// what it is started with.

// runInit runs an init container to success; false means the pod stops
// here (terminated, or failed with restartPolicy Never).
func (p *podRuntime) runInit(c *container) bool {
	for {
		exit := p.runOnce(c, false)
		if p.ctx.Err() != nil {
			return false
		}
		if exit == 0 {
			return true
		}
		if p.spec.RestartPolicy == corev1.RestartPolicyNever {
			return false
		}
		if !p.backOff(c) {
			return false
		}
	}
}

// runApp runs a container until the pod terminates or the restart policy
// lets it rest.
func (p *podRuntime) runApp(c *container) {
	for {
		exit := p.runOnce(c, true)
		if p.ctx.Err() != nil || !shouldRestart(p.spec.RestartPolicy, exit) {
			return
		}
		if !p.backOff(c) {
			return
		}
	}
}

// backOff waits before a restart, showing CrashLoopBackOff meanwhile.
func (p *podRuntime) backOff(c *container) bool {
	var wait time.Duration
	p.update(func() {
		if c.proc != nil && c.proc.finishedAt.Sub(c.proc.startedAt) > backoffReset {
			c.failures = 0
		}
		if c.failures > 0 {
			wait = min(backoffInitial<<(c.failures-1), backoffMax)
		}
		c.failures++
		c.status.LastTerminationState = c.status.State
		if wait > 0 {
			c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason:  reasonCrashLoopBackOff,
				Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", wait, c.spec.Name, p.name),
			}}
		}
	})
	select {
	case <-p.ctx.Done():
		return false
	case <-time.After(wait):
	}
	p.update(func() { c.status.RestartCount++ })
	return true
}

// runOnce starts the container, runs its probes, and waits for it to exit;
// it returns the exit code.
func (p *podRuntime) runOnce(c *container, probes bool) int32 {
	img := p.pullImage(c)
	if img == nil {
		return startFailed
	}
	spec, err := p.containerSpec(c, img)
	for err != nil {
		// The kubelet waits, as here, until the configuration can be made:
		// no restart is counted.
		p.update(func() {
			c.status.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonCreateConfigError, Message: err.Error()}}
		})
		select {
		case <-p.ctx.Done():
			return startFailed
		case <-time.After(retryInterval):
		}
		spec, err = p.containerSpec(c, img)
	}
	logPath := filepath.Join(p.logDir, c.spec.Name, strconv.Itoa(int(c.status.RestartCount))+".log")
	log, err := openLog(logPath)
	if err != nil {
		p.node.logf("pod %s/%s: %v", p.namespace, p.name, err)
		return startFailed
	}
	defer log.Close()
	p.update(func() { c.logs = append(c.logs, logPath) })
	if p.ctx.Err() != nil {
		return startFailed
	}
	p.event(c, corev1.EventTypeNormal, "Created", "Created container: "+c.spec.Name)
	proc, err := startProcess(spec, p.netns, log)
	now := metav1.Now()
	if err != nil {
		p.event(c, corev1.EventTypeWarning, "Failed", "Error: "+err.Error())
		p.update(func() {
			c.status.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: startFailed, Reason: reasonStartError, Message: err.Error(), StartedAt: now, FinishedAt: now,
			}}
		})
		return startFailed
	}
	p.update(func() {
		c.proc = proc
		c.status.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		c.status.ContainerID = fmt.Sprintf("local://%d", proc.cmd.Process.Pid)
		c.status.ImageID = img.ID
		c.status.Started = ptr.To(!probes || c.spec.StartupProbe == nil)
		c.status.Ready = !probes || c.spec.ReadinessProbe == nil
	})
	p.event(c, corev1.EventTypeNormal, "Started", "Started container "+c.spec.Name)
	// A pod that began terminating while this container started.
	if p.ctx.Err() != nil {
		proc.signal(syscall.SIGTERM)
	}
	probeCtx, stopProbes := context.WithCancel(p.ctx)
	if probes {
		go p.probe(probeCtx, c, proc)
	}
	<-proc.exited
	stopProbes()
	p.update(func() {
		c.status.Ready = false
		c.status.Started = ptr.To(false)
		c.status.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode:    proc.exitCode,
			Reason:      terminatedReason(proc.exitCode),
			StartedAt:   metav1.NewTime(proc.startedAt),
			FinishedAt:  metav1.NewTime(proc.finishedAt),
			ContainerID: c.status.ContainerID,
		}}
	})
	return proc.exitCode
}

// probe runs the startup probe, then the liveness and readiness probes. A
// failed liveness probe kills the container, which its restart policy then
// restarts.
func (p *podRuntime) probe(ctx context.Context, c *container, proc *process) {
	newProber := func(pr *corev1.Probe) prober {
		return prober{netns: p.netns, container: c.spec, probe: pr}
	}
	if sp := c.spec.StartupProbe; sp != nil {
		started := make(chan struct{})
		go newProber(sp).run(ctx, func(ok bool, err error) {
			if ok {
				p.update(func() { c.status.Started = ptr.To(true) })
				close(started)
				return
			}
			p.node.logf("pod %s/%s: container %s failed its startup probe, killing it: %v", p.namespace, p.name, c.spec.Name, err)
			go proc.stop(p.containerGrace(sp))
		})
		select {
		case <-ctx.Done():
			return
		case <-started:
		}
	}
	if rp := c.spec.ReadinessProbe; rp != nil {
		go newProber(rp).run(ctx, func(ok bool, err error) {
			if !ok {
				p.node.logf("pod %s/%s: container %s is not ready: %v", p.namespace, p.name, c.spec.Name, err)
			}
			p.update(func() { c.status.Ready = ok })
		})
	}
	if lp := c.spec.LivenessProbe; lp != nil {
		go newProber(lp).run(ctx, func(ok bool, err error) {
			if ok {
				return
			}
			p.node.logf("pod %s/%s: container %s failed its liveness probe, restarting it: %v", p.namespace, p.name, c.spec.Name, err)
			go proc.stop(p.containerGrace(lp))
		})
	}
}

// containerGrace is how long a container killed by its probe may take to
// stop.
func (p *podRuntime) containerGrace(pr *corev1.Probe) time.Duration {
	if pr.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pr.TerminationGracePeriodSeconds) * time.Second
	}
	return time.Duration(ptr.Deref(p.spec.TerminationGracePeriodSeconds, 30)) * time.Second
}

// containerSpec is how the container init runs a container: its image's
// root, its program, environment, user and mounts.
func (p *podRuntime) containerSpec(c *container, img *image) (containerSpec, error) {
	imageUID, imageGID, err := imageUser(img)
	if err != nil {
		return containerSpec{}, err
	}
	p.mu.Lock()
	pod := p.pod
	p.mu.Unlock()
	psc := ptr.Deref(pod.Spec.SecurityContext, corev1.PodSecurityContext{})
	csc := ptr.Deref(c.spec.SecurityContext, corev1.SecurityContext{})
	uid := ptr.Deref(csc.RunAsUser, ptr.Deref(psc.RunAsUser, imageUID))
	gid := ptr.Deref(csc.RunAsGroup, ptr.Deref(psc.RunAsGroup, imageGID))
	if ptr.Deref(csc.RunAsNonRoot, ptr.Deref(psc.RunAsNonRoot, false)) && uid == 0 {
		return containerSpec{}, errors.New("container has runAsNonRoot and image will run as root")
	}
	var groups []int
	if psc.FSGroup != nil {
		groups = append(groups, int(*psc.FSGroup))
	}
	for _, g := range psc.SupplementalGroups {
		groups = append(groups, int(g))
	}
	env, vars := containerEnv(img.Config, c.spec, pod, p.node.apiHost, p.node.apiPort)
	args := argv(img.Config, c.spec, vars)
	if len(args) == 0 {
		return containerSpec{}, errors.New("no command specified: the image has no entrypoint and the container no command")
	}
	readOnly := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		s := v.VolumeSource
		readOnly[v.Name] = s.Secret != nil || s.ConfigMap != nil || s.Projected != nil || s.DownwardAPI != nil
	}
	var mounts []mountSpec
	for _, vm := range c.spec.VolumeMounts {
		if _, ok := readOnly[vm.Name]; !ok {
			return containerSpec{}, fmt.Errorf("volumeMount %q names no volume of the pod", vm.Name)
		}
		mounts = append(mounts, mountSpec{
			Source:   filepath.Join(p.vols.path(vm.Name), vm.SubPath),
			Target:   vm.MountPath,
			ReadOnly: vm.ReadOnly || readOnly[vm.Name],
		})
	}
	scratch := filepath.Join(p.dir, "scratch", c.spec.Name+"-"+strconv.Itoa(int(c.status.RestartCount)))
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return containerSpec{}, err
	}
	dir := c.spec.WorkingDir
	if dir == "" {
		dir = img.Config.WorkingDir
	}
	if dir == "" {
		dir = "/"
	}
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	hosts, err := p.hostsFile(hostname)
	if err != nil {
		return containerSpec{}, err
	}
	return containerSpec{
		Root:         img.Root,
		ReadOnlyRoot: ptr.Deref(csc.ReadOnlyRootFilesystem, false),
		Hosts:        hosts,
		Path:         args[0],
		Args:         args,
		Env:          env,
		Dir:          dir,
		Hostname:     hostname,
		UID:          int(uid),
		GID:          int(gid),
		Groups:       groups,
		Mounts:       mounts,
		Scratch:      scratch,
		ParentPID:    os.Getpid(),
	}, nil
}

// hostsFile is the pod's /etc/hosts, as a kubelet writes it: the loopback
// names and the pod's hostname. It is written once, by the pod's first
// container to start: the others may have it mounted already.
func (p *podRuntime) hostsFile(hostname string) (string, error) {
	path := filepath.Join(p.dir, "etc-hosts")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	content := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.0.1\t" + hostname + "\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

func openLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}
