package probe

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// secretMemo keeps the Secret keys the reads used, each with the
// resourceVersion of the Secret it was read from. The manager caches only
// Secrets' metadata, so without it every read of every outbox asked the API
// server for its Secrets again: two requests per fleet and statusInterval,
// two thirds of an idle operator's requests in make bench-operator. While
// the cached metadata still shows that resourceVersion, the Secret has not
// changed, and the key's value is taken from here. The values are the URLs
// whose pools the reads keep open anyway.
type secretMemo struct {
	mu   sync.Mutex
	keys map[secretKey]memoized
}

type secretKey struct {
	namespace, name, key string
}

type memoized struct {
	resourceVersion string
	value           string
	found           bool
}

// CacheSecrets lets the Prober take a Secret key from what it read before,
// while versions, the manager's cache of Secrets' metadata, shows the
// Secret unchanged.
func (p *Prober) CacheSecrets(versions client.Reader) { p.versions = versions }

// secretValue reads one key of a Secret, from the memo when the Secret has
// not changed since. missing describes a Secret or key that does not
// exist, and what it was for.
func (p *Prober) secretValue(ctx context.Context, namespace, what string, ref v1alpha1.SecretKeyRef) (value, missing string, err error) {
	k := secretKey{namespace: namespace, name: ref.Name, key: ref.Key}
	if p.versions != nil {
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		if p.versions.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, meta) == nil {
			p.memo.mu.Lock()
			m, ok := p.memo.keys[k]
			p.memo.mu.Unlock()
			if ok && m.resourceVersion == meta.ResourceVersion {
				if !m.found {
					return "", missingKey(ref, what), nil
				}
				return m.value, "", nil
			}
		}
	}
	var secret corev1.Secret
	value, missing, err = readSecret(ctx, p.secrets, namespace, what, ref, &secret)
	if err == nil && secret.ResourceVersion != "" {
		p.memo.mu.Lock()
		if p.memo.keys == nil {
			p.memo.keys = map[secretKey]memoized{}
		}
		p.memo.keys[k] = memoized{resourceVersion: secret.ResourceVersion, value: value, found: missing == ""}
		p.memo.mu.Unlock()
	}
	return value, missing, err
}
