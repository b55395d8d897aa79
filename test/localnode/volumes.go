package localnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/utils/ptr"
)

// file is one file of a volume's payload.
type file struct {
	data []byte
	mode os.FileMode
}

// volumeSource gives the volumes what they hold: the node's caches of
// Secrets and ConfigMaps, and the API for service-account tokens.
type volumeSource struct {
	secrets    corev1listers.SecretLister
	configMaps corev1listers.ConfigMapLister
	client     kubernetes.Interface
}

// volumes are a pod's volumes, as directories of the node's that the
// containers' mount namespaces bind-mount at their mount paths.
type volumes struct {
	src    volumeSource
	dir    string
	pod    *corev1.Pod
	tokens map[string]token // by volume/path
}

type token struct {
	data      []byte
	refreshAt time.Time
}

func newVolumes(src volumeSource, dir string, pod *corev1.Pod) *volumes {
	return &volumes{src: src, dir: dir, pod: pod, tokens: map[string]token{}}
}

// path is where a volume's files are on the node.
func (v *volumes) path(name string) string { return filepath.Join(v.dir, name) }

// sync writes every volume's payload, creating the volumes the first time.
// It is called again every second: a changed Secret or ConfigMap, or a
// token near its expiry, is rewritten atomically, as the kubelet does, so a
// reader never sees half of an update.
func (v *volumes) sync(ctx context.Context) error {
	for _, vol := range v.pod.Spec.Volumes {
		if err := v.syncVolume(ctx, vol); err != nil {
			return fmt.Errorf("volume %q: %w", vol.Name, err)
		}
	}
	return nil
}

func (v *volumes) syncVolume(ctx context.Context, vol corev1.Volume) error {
	dir := v.path(vol.Name)
	s := vol.VolumeSource
	if s.EmptyDir != nil {
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return err
		}
		return os.Chmod(dir, 0o777) // as the kubelet makes an emptyDir
	}
	payload := map[string]file{}
	var err error
	mode := int32(0o644)
	switch {
	case s.Secret != nil:
		mode = ptr.Deref(s.Secret.DefaultMode, mode)
		err = v.secretFiles(payload, s.Secret.SecretName, s.Secret.Items, mode, ptr.Deref(s.Secret.Optional, false))
	case s.ConfigMap != nil:
		mode = ptr.Deref(s.ConfigMap.DefaultMode, mode)
		err = v.configMapFiles(payload, s.ConfigMap.Name, s.ConfigMap.Items, mode, ptr.Deref(s.ConfigMap.Optional, false))
	case s.DownwardAPI != nil:
		mode = ptr.Deref(s.DownwardAPI.DefaultMode, mode)
		err = v.downwardFiles(payload, s.DownwardAPI.Items, mode)
	case s.Projected != nil:
		mode = ptr.Deref(s.Projected.DefaultMode, mode)
		err = v.projectedFiles(ctx, payload, vol.Name, s.Projected.Sources, mode)
	default:
		return errors.New("only emptyDir, secret, configMap, downwardAPI and projected volumes are supported on the local node")
	}
	if err != nil {
		return err
	}
	return writeAtomically(dir, payload, v.pod.Spec.SecurityContext)
}

func (v *volumes) secretFiles(out map[string]file, name string, items []corev1.KeyToPath, mode int32, optional bool) error {
	secret, err := v.src.secrets.Secrets(v.pod.Namespace).Get(name)
	if apierrors.IsNotFound(err) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return project(out, secret.Data, items, mode, optional, "secret "+name)
}

func (v *volumes) configMapFiles(out map[string]file, name string, items []corev1.KeyToPath, mode int32, optional bool) error {
	cm, err := v.src.configMaps.ConfigMaps(v.pod.Namespace).Get(name)
	if apierrors.IsNotFound(err) && optional {
		return nil
	}
	if err != nil {
		return fmt.Errorf("configMap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, s := range cm.Data {
		data[k] = []byte(s)
	}
	for k, b := range cm.BinaryData {
		data[k] = b
	}
	return project(out, data, items, mode, optional, "configMap "+name)
}

// project puts a Secret's or ConfigMap's keys into files: every key, or the
// listed items at their paths.
func project(out map[string]file, data map[string][]byte, items []corev1.KeyToPath, mode int32, optional bool, what string) error {
	if len(items) == 0 {
		for k, d := range data {
			out[k] = file{data: d, mode: os.FileMode(mode)}
		}
		return nil
	}
	for _, it := range items {
		d, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s has no key %q", what, it.Key)
		}
		out[it.Path] = file{data: d, mode: os.FileMode(ptr.Deref(it.Mode, mode))}
	}
	return nil
}

func (v *volumes) downwardFiles(out map[string]file, items []corev1.DownwardAPIVolumeFile, mode int32) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downwardAPI %s: only fieldRef is supported on the local node", it.Path)
		}
		value, err := fieldValue(v.pod, it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		out[it.Path] = file{data: []byte(value), mode: os.FileMode(ptr.Deref(it.Mode, mode))}
	}
	return nil
}

// fieldValue is a pod field the downward API exposes.
func fieldValue(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	}
	return "", fmt.Errorf("downward API field %q is not supported on the local node", path)
}

func formatMap(m map[string]string) string {
	var lines []string
	for k, val := range m {
		lines = append(lines, fmt.Sprintf("%s=%q", k, val))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func (v *volumes) projectedFiles(ctx context.Context, out map[string]file, volume string, sources []corev1.VolumeProjection, mode int32) error {
	for _, s := range sources {
		var err error
		switch {
		case s.Secret != nil:
			err = v.secretFiles(out, s.Secret.Name, s.Secret.Items, mode, ptr.Deref(s.Secret.Optional, false))
		case s.ConfigMap != nil:
			err = v.configMapFiles(out, s.ConfigMap.Name, s.ConfigMap.Items, mode, ptr.Deref(s.ConfigMap.Optional, false))
		case s.DownwardAPI != nil:
			err = v.downwardFiles(out, s.DownwardAPI.Items, mode)
		case s.ServiceAccountToken != nil:
			var t []byte
			t, err = v.token(ctx, volume, s.ServiceAccountToken)
			out[s.ServiceAccountToken.Path] = file{data: t, mode: os.FileMode(mode)}
		default:
			err = errors.New("only secret, configMap, downwardAPI and serviceAccountToken projections are supported on the local node")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// token is a service-account token bound to the pod, requested from the API
// server as the kubelet does, and requested again at 80% of its lifetime.
func (v *volumes) token(ctx context.Context, volume string, p *corev1.ServiceAccountTokenProjection) ([]byte, error) {
	key := volume + "/" + p.Path
	if t, ok := v.tokens[key]; ok && time.Now().Before(t.refreshAt) {
		return t.data, nil
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(ptr.Deref(p.ExpirationSeconds, 3600)),
		BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: v.pod.Name, UID: v.pod.UID,
		},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	sa := v.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	issued, err := v.src.client.CoreV1().ServiceAccounts(v.pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token of service account %s/%s: %w", v.pod.Namespace, sa, err)
	}
	lifetime := time.Until(issued.Status.ExpirationTimestamp.Time)
	t := token{data: []byte(issued.Status.Token), refreshAt: time.Now().Add(lifetime * 8 / 10)}
	v.tokens[key] = t
	return t.data, nil
}

// writeAtomically lays a payload out as the kubelet's atomic writer does:
// the files in a fresh timestamped directory, a ..data link switched to it
// with one rename, and each top-level name a link through ..data. A reader
// sees the old payload or the new one, never a mix. Nothing is written when
// the payload is unchanged.
func writeAtomically(dir string, payload map[string]file, sc *corev1.PodSecurityContext) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if unchanged(dir, payload) {
		return nil
	}
	gid := -1
	if sc != nil && sc.FSGroup != nil {
		gid = int(*sc.FSGroup)
	}
	stamp, err := os.MkdirTemp(dir, ".."+time.Now().UTC().Format("2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	if err := os.Chmod(stamp, 0o755); err != nil {
		return err
	}
	for path, f := range payload {
		full := filepath.Join(stamp, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		mode := f.mode
		if gid >= 0 {
			// The kubelet's volume ownership for a pod's fsGroup: the
			// group owns the files and may read them.
			mode |= 0o440
		}
		if err := os.WriteFile(full, f.data, mode); err != nil {
			return err
		}
		if err := os.Chmod(full, mode); err != nil { // past the umask
			return err
		}
		if gid >= 0 {
			if err := os.Lchown(full, -1, gid); err != nil {
				return err
			}
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(stamp), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	top := map[string]bool{}
	for path := range payload {
		top[strings.Split(path, string(filepath.Separator))[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "..") || top[name] {
			continue
		}
		_ = os.Remove(filepath.Join(dir, name)) // a key that is gone
	}
	if old != "" && old != filepath.Base(stamp) {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// unchanged says whether dir already holds exactly payload.
func unchanged(dir string, payload map[string]file) bool {
	data := filepath.Join(dir, "..data")
	if _, err := os.Stat(data); err != nil {
		return false
	}
	count := 0
	err := filepath.WalkDir(data+"/", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		count++
		rel, _ := filepath.Rel(data, path)
		f, ok := payload[rel]
		if !ok {
			return errors.New("extra file")
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, f.data) {
			return errors.New("changed")
		}
		return nil
	})
	return err == nil && count == len(payload)
}
