package localnode

import (
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
)

// argv is what a container runs, as a kubelet's runtime makes it: the
// container's command replaces the image's entrypoint, and its args the
// image's cmd (the image's cmd is dropped when the command is set).
// $(VAR) references in the container's own words are expanded as the
// kubelet does.
func argv(img v1.Config, c corev1.Container, env map[string]string) []string {
	var words []string
	for _, w := range append(append([]string{}, c.Command...), c.Args...) {
		words = append(words, expand(w, env))
	}
	switch {
	case len(c.Command) > 0:
		return words
	case len(c.Args) > 0:
		return append(append([]string{}, img.Entrypoint...), words...)
	default:
		return append(append([]string{}, img.Entrypoint...), img.Cmd...)
	}
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
// image's and the container's env as the pod controller resolved it (downward API,
// secretKeyRef, configMapKeyRef, envFrom, service links). With no
// kube-proxy, the kubernetes Service's cluster IP leads nowhere, so the API
// server's variables name its loopback address, as a kubelet's name the
// Service, and the pod reaches it through its namespace's forwarder.
func containerEnv(img v1.Config, c corev1.Container, pod *corev1.Pod, apiHost string, apiPort int) ([]string, map[string]string) {
	vars := map[string]string{}
	var order []string
	set := func(name, value string) {
		if _, ok := vars[name]; !ok {
			order = append(order, name)
		}
		vars[name] = value
	}
	set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	set("HOSTNAME", pod.Name)
	set("HOME", "/")
	// The image's environment, then the container's, which wins.
	for _, kv := range img.Env {
		name, value, _ := strings.Cut(kv, "=")
		set(name, value)
	}
	// As a kubelet does, a value's $(NAME) refers to a variable the
	// container defines before it.
	defined := map[string]string{}
	for _, e := range c.Env {
		defined[e.Name] = expand(e.Value, defined)
		set(e.Name, defined[e.Name])
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
