package probe

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/outbox"
)

// ChangeResult is what one run of an OutboxReplay's change found and did.
type ChangeResult struct {
	// Reason is "" when the change ran to its end, or why it did not:
	// ReasonSecretNotFound, ReasonInvalidDatabaseURL, ReasonConnectionFailed,
	// ReasonTableNotUsable, ReasonQueryFailed, or ReasonInvalidSelector,
	// which trying again will not change.
	Reason string
	// Message never includes a secret.
	Message string
	// Table is the outbox table, once resolved.
	Table string
	// Change is what was done, also when the run stopped part way.
	Change outbox.PoisonedChange
}

// Change replays or parks an outbox's poisoned rows as req says, through
// the OutboxDrainer's database Secret and table mapping: the same
// statements as spillway poisoned, on one connection of its own that is
// closed when it is done (a change is rare, and holds its connection for
// every batch). timeout bounds the connect, the catalog look-up and each
// statement on the server. The error is only for the API server failing
// to answer; everything else is in the result.
func Change(ctx context.Context, secrets client.Reader, namespace string, db v1alpha1.DatabaseSpec, req outbox.PoisonedRequest,
	timeout time.Duration) (ChangeResult, error) {
	ref := db.URLSecretRef
	url, missing, err := secretValue(ctx, secrets, namespace, "database URL", ref)
	if err != nil {
		return ChangeResult{}, err
	}
	if missing != "" {
		return ChangeResult{Reason: v1alpha1.ReasonSecretNotFound, Message: missing}, nil
	}
	spec, err := resource.TableSpec(db, nil)
	if err != nil {
		return ChangeResult{Reason: v1alpha1.ReasonTableNotUsable, Message: err.Error()}, nil
	}
	table, done, err := outbox.NewReader(timeout).Change(ctx, url, spec, req, field.NewPath("spec"))
	result := ChangeResult{Table: table, Change: done}
	if err != nil {
		result.Reason, result.Message = failedRead(err, ref, url)
	}
	return result, nil
}
