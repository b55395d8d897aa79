package localnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	c.Env = append(c.Env, corev1.EnvVar{Name: "OVERRIDDEN", Value: "by the container"})
	pod := &corev1.Pod{}
	pod.Name = "orders-1"
	img := v1.Config{Env: []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "OVERRIDDEN=by the image", "PATH=/image/bin"}}
	env, vars := containerEnv(img, c, pod, "127.0.0.1", 6443)
	for name, want := range map[string]string{
		"SSL_CERT_FILE":           "/etc/ssl/certs/ca-certificates.crt",
		"OVERRIDDEN":              "by the container",
		"PATH":                    "/image/bin",
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

// The container's command replaces the image's entrypoint, and its args the
// image's cmd, as in a kubelet's runtime.
func TestArgv(t *testing.T) {
	img := v1.Config{Entrypoint: []string{"/usr/local/bin/spillway"}, Cmd: []string{"--help"}}
	env := map[string]string{"POD": "orders-1"}
	for _, tc := range []struct {
		command, args, want []string
	}{
		{nil, nil, []string{"/usr/local/bin/spillway", "--help"}},
		{nil, []string{"drain", "--id=$(POD)"}, []string{"/usr/local/bin/spillway", "drain", "--id=orders-1"}},
		{[]string{"sh", "-c"}, []string{"echo $(POD)"}, []string{"sh", "-c", "echo orders-1"}},
		{[]string{"/bin/true"}, nil, []string{"/bin/true"}},
	} {
		got := argv(img, corev1.Container{Command: tc.command, Args: tc.args}, env)
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("command %q args %q: %q, want %q", tc.command, tc.args, got, tc.want)
		}
	}
}

// An image's USER is resolved in its own /etc/passwd and /etc/group.
func TestImageUser(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\nnonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nnonroot:x:65532:\nstaff:x:50:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string][2]int64{
		"":              {0, 0},
		"65532:65532":   {65532, 65532},
		"nonroot":       {65532, 65532},
		"nonroot:staff": {65532, 50},
		"1000":          {1000, 0},
		"1000:1001":     {1000, 1001},
	} {
		uid, gid, err := imageUser(&image{Root: root, Config: v1.Config{User: user}})
		if err != nil || uid != want[0] || gid != want[1] {
			t.Errorf("USER %q: %d:%d, %v; want %d:%d", user, uid, gid, err, want[0], want[1])
		}
	}
	if _, _, err := imageUser(&image{Root: root, Config: v1.Config{User: "nobody-here"}}); err == nil || !strings.Contains(err.Error(), `"nobody-here" is not in the image's passwd`) {
		t.Errorf("an unknown user: %v", err)
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
