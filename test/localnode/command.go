package localnode

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Image is what an image reference runs on this node: a local program,
// which plays the image's entrypoint, and the image's default user.
type Image struct {
	Binary string
	// User and Group are the image's USER; a pod's runAsUser and
	// runAsGroup override them.
	User, Group int64
}

// resolveImage finds a container's program. An image the node does not
// know cannot be pulled: there is no registry here.
func resolveImage(images map[string]Image, ref string) (Image, error) {
	img, ok := images[ref]
	if !ok {
		return Image{}, fmt.Errorf("image %q is not mapped to a local binary on this node (it knows %s)", ref, strings.Join(imageNames(images), ", "))
	}
	if _, err := os.Stat(img.Binary); err != nil {
		return Image{}, fmt.Errorf("image %q: %w", ref, err)
	}
	return img, nil
}

func imageNames(images map[string]Image) []string {
	var names []string
	for name := range images {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// argv is the program's arguments: the image's entrypoint replaced by its
// binary when the container sets no command; otherwise the command's first
// word names the image's one program, which the binary stands for.
// $(VAR) references are expanded as the kubelet does.
func argv(img Image, c corev1.Container, env map[string]string) []string {
	args := []string{img.Binary}
	if len(c.Command) > 0 {
		args = append(args, c.Command[1:]...)
	}
	args = append(args, c.Args...)
	for i := 1; i < len(args); i++ {
		args[i] = expand(args[i], env)
	}
	return args
}

// expand replaces $(NAME) with the variable's value and $$ with $; a
// reference to an unknown variable stays as written.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// containerEnv is the environment of a container's process, from the
// container's env as the pod controller resolved it (downward API,
// secretKeyRef, configMapKeyRef, envFrom, service links). With no
// kube-proxy, the kubernetes Service's cluster IP leads nowhere, so the API
// server's variables name its loopback address, as a kubelet's name the
// Service, and the pod reaches it through its namespace's forwarder.
func containerEnv(c corev1.Container, pod *corev1.Pod, apiHost string, apiPort int) ([]string, map[string]string) {
	vars := map[string]string{
		"PATH":     "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME": pod.Name,
		"HOME":     "/",
	}
	var order []string
	set := func(name, value string) {
		if _, ok := vars[name]; !ok {
			order = append(order, name)
		}
		vars[name] = value
	}
	order = append(order, "PATH", "HOSTNAME", "HOME")
	for _, e := range c.Env {
		set(e.Name, e.Value)
	}
	port := strconv.Itoa(apiPort)
	url := "tcp://" + apiHost + ":" + port
	set("KUBERNETES_SERVICE_HOST", apiHost)
	set("KUBERNETES_SERVICE_PORT", port)
	set("KUBERNETES_SERVICE_PORT_HTTPS", port)
	set("KUBERNETES_PORT", url)
	for name := range vars {
		if strings.HasPrefix(name, "KUBERNETES_PORT_443_TCP") {
			delete(vars, name)
		}
	}
	set("KUBERNETES_PORT_"+port+"_TCP", url)
	set("KUBERNETES_PORT_"+port+"_TCP_PROTO", "tcp")
	set("KUBERNETES_PORT_"+port+"_TCP_PORT", port)
	set("KUBERNETES_PORT_"+port+"_TCP_ADDR", apiHost)
	var out []string
	for _, name := range order {
		if v, ok := vars[name]; ok {
			out = append(out, name+"="+v)
		}
	}
	return out, vars
}
