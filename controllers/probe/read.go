package probe

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/controllers/status"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

// readOutbox reads the referenced Secrets, then the outbox's health through
// the same table mapping the drainers use. What it finds, failures included,
// is the Probe, with the database URL it used; the error is only for the
// API server failing to answer.
func (p *Prober) readOutbox(ctx context.Context, t Target) (status.Probe, string, error) {
	var probe status.Probe
	// read reads one Secret key, noting it when it is missing.
	read := func(what string, ref v1alpha1.SecretKeyRef) (string, error) {
		value, missing, err := p.secretValue(ctx, t.Key.Namespace, what, ref)
		if missing != "" {
			probe.MissingSecrets = append(probe.MissingSecrets, missing)
		}
		return value, err
	}
	databaseURL, err := read("database URL", t.Database.URLSecretRef)
	if err != nil {
		return probe, "", err
	}
	sinkURL, err := read(sinkName(t.SinkKind)+" URL", t.Sink)
	if err != nil {
		return probe, "", err
	}
	if t.Signing != nil {
		// A webhook's drainers sign with it; its value is not needed here.
		if _, err := read("webhook signing secret", *t.Signing); err != nil {
			return probe, "", err
		}
	}
	if pooler := t.Database.Pooler; pooler != nil && pooler.DirectURLSecretRef != nil {
		// The drainers mount it; the read goes through the pooler.
		if _, err := read("direct database URL", *pooler.DirectURLSecretRef); err != nil {
			return probe, "", err
		}
	}
	tlsMissing, err := p.missingTLSKeys(ctx, t)
	if err != nil {
		return probe, "", err
	}
	probe.MissingSecrets = append(probe.MissingSecrets, tlsMissing...)
	if databaseURL == "" {
		probe.Reason, probe.Message = v1alpha1.ReasonSecretNotFound, probe.MissingSecrets[0]
		return probe, "", nil
	}
	probe.Reason, probe.Message, probe.Outbox = p.queryOutbox(ctx, t, databaseURL, sinkURL)
	return probe, databaseURL, nil
}

// sinkName is what the missing Secrets of a sink of kind are said to be
// for: the broker's or the webhook's.
func sinkName(kind string) string {
	if kind == v1alpha1.SinkWebhook {
		return "webhook"
	}
	return "broker"
}

// missingTLSKeys describes the keys of the fleet's TLS Secrets that the
// drainers need and do not find: without them, no drainer pod starts.
func (p *Prober) missingTLSKeys(ctx context.Context, t Target) ([]string, error) {
	var missing []string
	for what, tls := range map[string]*v1alpha1.TLS{"database TLS": t.Database.TLS, sinkName(t.SinkKind) + " TLS": t.SinkTLS} {
		if tls == nil {
			continue
		}
		for _, key := range resource.TLSKeys(tls) {
			_, m, err := p.secretValue(ctx, t.Key.Namespace, what, key)
			if err != nil {
				return nil, err
			}
			if m != "" {
				missing = append(missing, m)
			}
		}
	}
	slices.Sort(missing)
	return missing, nil
}

// secretValue reads one key of a Secret from the API server. missing
// describes a Secret or key that does not exist, and what it was for.
func secretValue(ctx context.Context, secrets client.Reader, namespace, what string, ref v1alpha1.SecretKeyRef) (value, missing string, err error) {
	return readSecret(ctx, secrets, namespace, what, ref, &corev1.Secret{})
}

// readSecret is secretValue, reading the Secret into secret.
func readSecret(ctx context.Context, secrets client.Reader, namespace, what string, ref v1alpha1.SecretKeyRef, secret *corev1.Secret) (value, missing string, err error) {
	if err := secrets.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Sprintf("Secret %q (%s) was not found", ref.Name, what), nil
		}
		return "", "", fmt.Errorf("get Secret %s/%s: %w", namespace, ref.Name, err)
	}
	v, ok := secret.Data[ref.Key]
	if !ok || len(v) == 0 {
		return "", missingKey(ref, what), nil
	}
	return string(v), "", nil
}

// missingKey says that a Secret has no such key, or an empty one.
func missingKey(ref v1alpha1.SecretKeyRef, what string) string {
	return fmt.Sprintf("Secret %q (%s) has no key %q", ref.Name, what, ref.Key)
}

// queryOutbox reads the outbox's health through the table layer, which
// also rehearses the drainers' statements and releases the dead drainers'
// claims, and says what it found as a condition's reason and message. The
// messages never include the URL's password, nor do the poisoned rows' last
// errors include either URL's.
func (p *Prober) queryOutbox(ctx context.Context, t Target, url, sinkURL string) (reason, message string, read *outbox.OutboxStatus) {
	spec, err := resource.TableSpec(t.Database, t.Ordering)
	if err != nil {
		return v1alpha1.ReasonTableNotUsable, err.Error(), nil
	}
	req := outbox.HealthRead{Spec: spec, MaxAttempts: t.MaxAttempts, CountLimit: p.opts.CountLimit, Secrets: []string{sinkURL},
		BlockedKeys: t.Ordering != nil && t.Ordering.OnFailure != outbox.OnFailureSkip, Lease: t.LeaseTTL}
	for _, d := range t.Dead {
		req.Dead = append(req.Dead, d.ID)
	}
	health, err := p.reader.ReadHealth(ctx, url, req)
	if err != nil {
		reason, message := failedRead(err, t.Database.URLSecretRef, url)
		if reason == v1alpha1.ReasonStatementRefused {
			return reason, message, &health.Status
		}
		return reason, message, nil
	}
	p.recordReleases(ctx, t, health.Released)
	return v1alpha1.ReasonOutboxRead, "Read the outbox table " + health.Table, &health.Status
}

// failedRead is the reason and message of a read or a change of an outbox
// that failed with err, through the Secret ref holding url.
func failedRead(err error, ref v1alpha1.SecretKeyRef, url string) (reason, message string) {
	var (
		invalid   outbox.InvalidURLError
		connect   *outbox.ConnectError
		unusable  *outbox.UnusableTableError
		refused   *outbox.StatementRefusedError
		selection *outbox.InvalidSelectorError
	)
	switch {
	case errors.As(err, &invalid):
		return v1alpha1.ReasonInvalidDatabaseURL, fmt.Sprintf("The database URL in Secret %q, key %q, is %s", ref.Name, ref.Key, invalid)
	case errors.As(err, &connect):
		return v1alpha1.ReasonConnectionFailed, fmt.Sprintf("Connect to %s: %v", secret.RedactURL(url), connect)
	case errors.As(err, &unusable):
		return v1alpha1.ReasonTableNotUsable, err.Error()
	case errors.As(err, &refused):
		return v1alpha1.ReasonStatementRefused, err.Error()
	case errors.As(err, &selection):
		return v1alpha1.ReasonInvalidSelector, err.Error()
	}
	return v1alpha1.ReasonQueryFailed, err.Error()
}

// recordReleases tells of the releases of the fleet's dead drainers'
// claims: as the start-up release they will never run would, through the
// table mapping, fenced on the drainer's ID and on live leases, so that it
// touches only the rows the dead drainer holds. A drainer that is only cut
// off (its node unreachable) and still publishing settles nothing of what
// it loses here: its settles are fenced on their claims, so the rows are
// published again, a duplicate and never a loss.
func (p *Prober) recordReleases(ctx context.Context, t Target, released []outbox.Release) {
	log := ctrl.LoggerFrom(ctx).WithValues("outboxdrainer", t.Key)
	fleet := &v1alpha1.OutboxDrainer{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "OutboxDrainer"},
		ObjectMeta: metav1.ObjectMeta{Namespace: t.Key.Namespace, Name: t.Key.Name, UID: t.UID},
	}
	for i, r := range released {
		d := t.Dead[i]
		// The pod is the event's related object: the recorder folds events
		// of the same object, reason and related object into one series.
		pod := &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: t.Key.Namespace, Name: d.ID},
		}
		switch {
		case r.Err != nil:
			log.Error(r.Err, "Failed to release the claims of a dead drainer", "drainer", d.ID)
			p.recorder.Eventf(fleet, pod, corev1.EventTypeWarning, "FailedReleaseClaims", "ReleaseClaims",
				"Failed to release the claims of drainer %s (%s): %v", d.ID, d.Message, r.Err)
		case r.Rows > 0:
			p.metrics.ReleasedClaims.WithLabelValues(t.Key.Namespace, t.Key.Name, d.Reason).Add(float64(r.Rows))
			log.Info("Released the claims of a dead drainer", "drainer", d.ID, "reason", d.Reason, "rows", r.Rows)
			p.recorder.Eventf(fleet, pod, corev1.EventTypeNormal, "ReleasedClaims", "ReleaseClaims",
				"Released %d claims of drainer %s: %s", r.Rows, d.ID, d.Message)
		}
	}
}
