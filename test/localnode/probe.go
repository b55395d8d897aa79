package localnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// prober runs a container's probe against the pod's network namespace, as
// the kubelet reaches the pod's IP.
type prober struct {
	netns     *os.File
	container corev1.Container
	probe     *corev1.Probe
}

// check runs the probe once.
func (p prober) check(ctx context.Context) error {
	timeout := time.Duration(max(p.probe.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch h := p.probe.ProbeHandler; {
	case h.HTTPGet != nil:
		return p.httpGet(ctx, h.HTTPGet)
	case h.TCPSocket != nil:
		port, err := p.port(h.TCPSocket.Port)
		if err != nil {
			return err
		}
		c, err := dialIn(ctx, p.netns, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return c.Close()
	default:
		return errors.New("only httpGet and tcpSocket probes are supported on the local node")
	}
}

func (p prober) httpGet(ctx context.Context, h *corev1.HTTPGetAction) error {
	port, err := p.port(h.Port)
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	host := h.Host
	if host == "" {
		host = "127.0.0.1"
	}
	path := h.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), path), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "kube-probe/local-node")
	for _, hdr := range h.HTTPHeaders {
		req.Header.Add(hdr.Name, hdr.Value)
	}
	client := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialIn(ctx, p.netns, addr)
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet's probes
		DisableKeepAlives: true,
	}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return nil
}

// port resolves a probe's port, which may name one of the container's.
func (p prober) port(port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, cp := range p.container.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", p.container.Name, port.StrVal)
}

// run probes every period and calls result on each change of outcome, once
// successThreshold successes or failureThreshold failures in a row decide
// it. It returns when ctx ends.
func (p prober) run(ctx context.Context, result func(ok bool, err error)) {
	pr := p.probe
	period := time.Duration(max(pr.PeriodSeconds, 1)) * time.Second
	successes, failures := max(pr.SuccessThreshold, 1), max(pr.FailureThreshold, 1)
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(pr.InitialDelaySeconds) * time.Second):
	}
	var okRun, failRun int32
	decided := 0 // 0 undecided, 1 ok, -1 failed
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	for {
		err := p.check(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
			if okRun >= successes && decided != 1 {
				decided = 1
				result(true, nil)
			}
		} else {
			okRun, failRun = 0, failRun+1
			if failRun >= failures && decided != -1 {
				decided = -1
				result(false, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
