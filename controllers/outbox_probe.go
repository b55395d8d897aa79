package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/controllers/resource"
	"github.com/spillway-io/spillway/controllers/status"
	"github.com/spillway-io/spillway/drainer"
)

// probeTimeout bounds one read of the outbox, connection included.
const probeTimeout = 10 * time.Second

// readOutbox reads the referenced Secrets, then the outbox's health, through
// the same table mapping the drainers use. What it finds, failures included,
// is the Probe; the error is only for the API server failing to answer.
func (r *OutboxDrainerReconciler) readOutbox(ctx context.Context, od *v1alpha1.OutboxDrainer) (status.Probe, error) {
	var p status.Probe
	databaseURL, missing, err := r.secretValue(ctx, od.Namespace, "database URL", od.Spec.Database.URLSecretRef)
	if err != nil {
		return p, err
	}
	if missing != "" {
		p.MissingSecrets = append(p.MissingSecrets, missing)
	}
	_, missing, err = r.secretValue(ctx, od.Namespace, "broker URL", od.Spec.Broker.URLSecretRef)
	if err != nil {
		return p, err
	}
	if missing != "" {
		p.MissingSecrets = append(p.MissingSecrets, missing)
	}
	if databaseURL == "" {
		p.Reason, p.Message = v1alpha1.ReasonSecretNotFound, p.MissingSecrets[0]
		return p, nil
	}
	p.Reason, p.Message, p.Outbox = queryOutbox(ctx, od.Spec, databaseURL)
	return p, nil
}

// secretValue reads one key of a Secret. missing describes a Secret or key
// that does not exist, and what it was for.
func (r *OutboxDrainerReconciler) secretValue(ctx context.Context, namespace, what string, ref v1alpha1.SecretKeyRef) (value, missing string, err error) {
	var secret corev1.Secret
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Sprintf("Secret %q (%s) was not found", ref.Name, what), nil
		}
		return "", "", fmt.Errorf("get Secret %s/%s: %w", namespace, ref.Name, err)
	}
	v, ok := secret.Data[ref.Key]
	if !ok || len(v) == 0 {
		return "", fmt.Sprintf("Secret %q (%s) has no key %q", ref.Name, what, ref.Key), nil
	}
	return string(v), "", nil
}

// queryOutbox connects to the outbox's database and reads its health. The
// messages it returns never include the URL's password.
func queryOutbox(ctx context.Context, spec v1alpha1.OutboxDrainerSpec, url string) (reason, message string, outbox *drainer.OutboxStatus) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	table, err := resource.TableSpec(spec.Database)
	if err != nil {
		return v1alpha1.ReasonTableNotUsable, err.Error(), nil
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return v1alpha1.ReasonInvalidDatabaseURL, fmt.Sprintf("The database URL in Secret %q, key %q, is not a valid Postgres connection string",
			spec.Database.URLSecretRef.Name, spec.Database.URLSecretRef.Key), nil
	}
	cfg.RuntimeParams["application_name"] = "spillway-operator"
	redacted := drainer.RedactURL(url)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return v1alpha1.ReasonConnectionFailed, fmt.Sprintf("Connect to %s: %v", redacted, drainer.RedactError(err, url)), nil
	}
	defer func() { _ = conn.Close(ctx) }()

	columns, err := drainer.Catalog(ctx, conn, table)
	if err != nil {
		return v1alpha1.ReasonQueryFailed, drainer.RedactError(err, url).Error(), nil
	}
	resolved, err := drainer.ResolveTable(table, columns)
	if err != nil {
		return v1alpha1.ReasonTableNotUsable, err.Error(), nil
	}
	o, err := drainer.ReadOutboxStatus(ctx, conn, resolved, int(spec.MaxAttempts))
	if err != nil {
		return v1alpha1.ReasonQueryFailed, drainer.RedactError(err, url).Error(), nil
	}
	return v1alpha1.ReasonOutboxRead, "Read the outbox table " + resolved.Name(), &o
}
