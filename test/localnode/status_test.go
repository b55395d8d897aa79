package localnode

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func running() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
}

func exited(code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}

func waiting() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonContainerCreating}}}
}

func backingOff() corev1.ContainerStatus {
	s := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonCrashLoopBackOff}}}
	s.LastTerminationState = exited(1).State
	return s
}

func TestPodPhase(t *testing.T) {
	type statuses = []corev1.ContainerStatus
	cases := []struct {
		name       string
		policy     corev1.RestartPolicy
		init, apps statuses
		want       corev1.PodPhase
	}{
		{"an init container still running", corev1.RestartPolicyAlways, statuses{running()}, statuses{waiting()}, corev1.PodPending},
		{"an init container failed, never restarted", corev1.RestartPolicyNever, statuses{exited(1)}, statuses{waiting()}, corev1.PodFailed},
		{"a container not started yet", corev1.RestartPolicyAlways, nil, statuses{running(), waiting()}, corev1.PodPending},
		{"containers running", corev1.RestartPolicyAlways, statuses{exited(0)}, statuses{running()}, corev1.PodRunning},
		{"backing off before a restart", corev1.RestartPolicyAlways, nil, statuses{backingOff()}, corev1.PodRunning},
		{"all exited 0, never restarted", corev1.RestartPolicyNever, nil, statuses{exited(0), exited(0)}, corev1.PodSucceeded},
		{"one failed, never restarted", corev1.RestartPolicyNever, nil, statuses{exited(0), exited(2)}, corev1.PodFailed},
		{"one failed, restarted on failure", corev1.RestartPolicyOnFailure, nil, statuses{exited(2)}, corev1.PodRunning},
		{"exited 0 but always restarted", corev1.RestartPolicyAlways, nil, statuses{exited(0)}, corev1.PodRunning},
	}
	for _, c := range cases {
		if got := podPhase(c.policy, c.init, c.apps); got != c.want {
			t.Errorf("%s: phase %s, want %s", c.name, got, c.want)
		}
	}
}

func TestShouldRestart(t *testing.T) {
	for _, c := range []struct {
		policy corev1.RestartPolicy
		code   int32
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 137, true},
		{corev1.RestartPolicyNever, 1, false},
	} {
		if got := shouldRestart(c.policy, c.code); got != c.want {
			t.Errorf("restart policy %s, exit %d: restart %v, want %v", c.policy, c.code, got, c.want)
		}
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"POD_NAME": "orders-1", "EMPTY": ""}
	for in, want := range map[string]string{
		"--drainer-id=$(POD_NAME)": "--drainer-id=orders-1",
		"$(EMPTY)x":                "x",
		"$(UNKNOWN)":               "$(UNKNOWN)",
		"$$(POD_NAME)":             "$(POD_NAME)",
		"cost $5":                  "cost $5",
		"$(unterminated":           "$(unterminated",
		"trailing $":               "trailing $",
	} {
		if got := expand(in, env); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestContainerEnvPointsAtTheAPIServersLoopbackAddress(t *testing.T) {
	c := corev1.Container{Env: []corev1.EnvVar{
		{Name: "KUBERNETES_SERVICE_HOST", Value: "10.0.0.1"},
		{Name: "KUBERNETES_PORT_443_TCP_ADDR", Value: "10.0.0.1"},
		{Name: "POD_NAME", Value: "orders-1"},
	}}
	pod := &corev1.Pod{}
	pod.Name = "orders-1"
	env, vars := containerEnv(c, pod, "127.0.0.1", 6443)
	for name, want := range map[string]string{
		"KUBERNETES_SERVICE_HOST": "127.0.0.1",
		"KUBERNETES_SERVICE_PORT": "6443",
		"KUBERNETES_PORT":         "tcp://127.0.0.1:6443",
		"HOSTNAME":                "orders-1",
		"POD_NAME":                "orders-1",
	} {
		if vars[name] != want {
			t.Errorf("%s=%q, want %q", name, vars[name], want)
		}
	}
	if _, ok := vars["KUBERNETES_PORT_443_TCP_ADDR"]; ok {
		t.Errorf("the cluster IP's service link stayed: %v", env)
	}
	if len(env) != len(vars) {
		t.Errorf("env %v does not list each variable once", env)
	}
}

// A rewrite swaps the whole payload at once, and drops a key that is gone.
func TestWriteAtomically(t *testing.T) {
	dir := t.TempDir()
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(data)
	}
	if err := writeAtomically(dir, map[string]file{"url": {data: []byte("amqp://a"), mode: 0o440}, "old": {data: []byte("x"), mode: 0o644}}, nil); err != nil {
		t.Fatal(err)
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	if read("url") != "amqp://a" || read("old") != "x" {
		t.Fatalf("first payload: url %q, old %q", read("url"), read("old"))
	}
	if info, err := os.Stat(filepath.Join(dir, "url")); err != nil || info.Mode().Perm() != 0o440 {
		t.Errorf("url's mode: %v, %v", info.Mode(), err)
	}
	if err := writeAtomically(dir, map[string]file{"url": {data: []byte("amqp://a"), mode: 0o440}, "old": {data: []byte("x"), mode: 0o644}}, nil); err != nil {
		t.Fatal(err)
	}
	if same, _ := os.Readlink(filepath.Join(dir, "..data")); same != first {
		t.Errorf("an unchanged payload was rewritten: %s, then %s", first, same)
	}
	if err := writeAtomically(dir, map[string]file{"url": {data: []byte("amqp://b"), mode: 0o440}}, nil); err != nil {
		t.Fatal(err)
	}
	if read("url") != "amqp://b" {
		t.Errorf("rotated url %q", read("url"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "old")); !os.IsNotExist(err) {
		t.Errorf("the key that is gone is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
		t.Errorf("the previous payload %s was not removed: %v", first, err)
	}
}
