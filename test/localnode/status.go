package localnode

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons the node gives, as the kubelet does.
const (
	reasonContainerCreating  = "ContainerCreating"
	reasonPodInitializing    = "PodInitializing"
	reasonErrImagePull       = "ErrImagePull"
	reasonImagePullBackOff   = "ImagePullBackOff"
	reasonCrashLoopBackOff   = "CrashLoopBackOff"
	reasonCreateConfigError  = "CreateContainerConfigError"
	reasonStartError         = "StartError"
	reasonCompleted          = "Completed"
	reasonError              = "Error"
	reasonPodCompleted       = "PodCompleted"
	reasonContainersNotReady = "ContainersNotReady"
	reasonContainersNotInit  = "ContainersNotInitialized"
)

// podPhase is the kubelet's phase rule: Pending until every init container
// succeeded and every container started; Running while any runs or will be
// restarted; then Succeeded or Failed.
func podPhase(policy corev1.RestartPolicy, init, containers []corev1.ContainerStatus) corev1.PodPhase {
	for _, s := range init {
		if t := s.State.Terminated; t != nil && t.ExitCode == 0 {
			continue
		}
		if policy == corev1.RestartPolicyNever && s.State.Terminated != nil {
			return corev1.PodFailed
		}
		return corev1.PodPending
	}
	var waiting, running, stopped, succeeded int
	for _, s := range containers {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.LastTerminationState.Terminated != nil:
			// Waiting to be restarted.
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case policy == corev1.RestartPolicyAlways:
		return corev1.PodRunning
	case stopped == succeeded:
		return corev1.PodSucceeded
	case policy == corev1.RestartPolicyNever:
		return corev1.PodFailed
	default:
		return corev1.PodRunning
	}
}

// podConditions are the conditions the node owns; others, such as the
// scheduler's PodScheduled, are kept as they are.
func podConditions(existing []corev1.PodCondition, sandboxReady bool, phase corev1.PodPhase,
	init, containers []corev1.ContainerStatus, now metav1.Time) []corev1.PodCondition {
	initialized := true
	for _, s := range init {
		if t := s.State.Terminated; t == nil || t.ExitCode != 0 {
			initialized = false
		}
	}
	ready := len(containers) > 0
	for _, s := range containers {
		ready = ready && s.Ready
	}
	terminal := phase == corev1.PodSucceeded || phase == corev1.PodFailed
	readyReason := ""
	switch {
	case terminal:
		ready, readyReason = false, reasonPodCompleted
	case !initialized:
		readyReason = reasonContainersNotInit
	case !ready:
		readyReason = reasonContainersNotReady
	}
	owned := []corev1.PodCondition{
		condition(corev1.PodReadyToStartContainers, sandboxReady && !terminal, ""),
		condition(corev1.PodInitialized, initialized, reasonContainersNotInit),
		condition(corev1.ContainersReady, ready, readyReason),
		condition(corev1.PodReady, ready, readyReason),
	}
	var out []corev1.PodCondition
	for _, c := range existing {
		if !ownedCondition(c.Type) {
			out = append(out, c)
		}
	}
	for _, c := range owned {
		c.LastTransitionTime = now
		for _, old := range existing {
			if old.Type == c.Type && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		if c.Status == corev1.ConditionTrue {
			c.Reason = ""
		}
		out = append(out, c)
	}
	return out
}

func ownedCondition(t corev1.PodConditionType) bool {
	switch t {
	case corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady:
		return true
	}
	return false
}

func condition(t corev1.PodConditionType, ok bool, reason string) corev1.PodCondition {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	return corev1.PodCondition{Type: t, Status: status, Reason: reason}
}

// terminatedReason is the kubelet's reason for a container that exited.
func terminatedReason(exitCode int32) string {
	if exitCode == 0 {
		return reasonCompleted
	}
	return reasonError
}

// shouldRestart says whether a container that exited is started again.
func shouldRestart(policy corev1.RestartPolicy, exitCode int32) bool {
	switch policy {
	case corev1.RestartPolicyAlways:
		return true
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return false
	}
}
