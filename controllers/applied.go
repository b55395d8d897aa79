package controllers

import (
	"crypto/sha256"
	"encoding/json"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// appliedChildren remembers, per fleet, what the operator's last apply of
// each child wrote: the applied object's hash, and the resourceVersion the
// API server answered with. A child whose cached copy still has that
// resourceVersion, and whose desired object still has that hash, is as the
// operator left it: nobody edited it since, and applying it again would
// change nothing but cost a request, one per child for every status read
// of every fleet. An edit by someone else changes the resourceVersion, and
// the next reconcile applies again, reverting it.
type appliedChildren struct {
	mu      sync.Mutex
	byFleet map[types.NamespacedName]map[string]appliedChild
}

type appliedChild struct {
	hash            [sha256.Size]byte
	resourceVersion string
}

// hashOf is the hash of an object to apply.
func hashOf(u *unstructured.Unstructured) ([sha256.Size]byte, error) {
	raw, err := json.Marshal(u.Object) // map keys sorted: the same object, the same bytes
	return sha256.Sum256(raw), err
}

// unchanged says the fleet's child of kind was last applied as hash, and
// the API server has kept it at resourceVersion since.
func (a *appliedChildren) unchanged(fleet types.NamespacedName, kind string, hash [sha256.Size]byte, resourceVersion string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.byFleet[fleet][kind]
	return ok && c.hash == hash && c.resourceVersion == resourceVersion
}

// record notes an apply of the fleet's child of kind.
func (a *appliedChildren) record(fleet types.NamespacedName, kind string, hash [sha256.Size]byte, resourceVersion string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byFleet == nil {
		a.byFleet = map[types.NamespacedName]map[string]appliedChild{}
	}
	if a.byFleet[fleet] == nil {
		a.byFleet[fleet] = map[string]appliedChild{}
	}
	a.byFleet[fleet][kind] = appliedChild{hash: hash, resourceVersion: resourceVersion}
}

// forget drops a deleted fleet's children.
func (a *appliedChildren) forget(fleet types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.byFleet, fleet)
}
