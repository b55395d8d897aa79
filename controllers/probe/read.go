package probe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
	databaseURL, missing, err := p.secretValue(ctx, t.Key.Namespace, "database URL", t.Database.URLSecretRef)
	if err != nil {
		return probe, "", err
	}
	if missing != "" {
		probe.MissingSecrets = append(probe.MissingSecrets, missing)
	}
	brokerURL, missing, err := p.secretValue(ctx, t.Key.Namespace, "broker URL", t.Broker)
	if err != nil {
		return probe, "", err
	}
	if missing != "" {
		probe.MissingSecrets = append(probe.MissingSecrets, missing)
	}
	if databaseURL == "" {
		probe.Reason, probe.Message = v1alpha1.ReasonSecretNotFound, probe.MissingSecrets[0]
		return probe, "", nil
	}
	probe.Reason, probe.Message, probe.Outbox = p.queryOutbox(ctx, t, databaseURL, brokerURL)
	return probe, databaseURL, nil
}

// secretValue reads one key of a Secret. missing describes a Secret or key
// that does not exist, and what it was for.
func (p *Prober) secretValue(ctx context.Context, namespace, what string, ref v1alpha1.SecretKeyRef) (value, missing string, err error) {
	return secretValue(ctx, p.secrets, namespace, what, ref)
}

func secretValue(ctx context.Context, secrets client.Reader, namespace, what string, ref v1alpha1.SecretKeyRef) (value, missing string, err error) {
	var secret corev1.Secret
	if err := secrets.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &secret); err != nil {
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

// queryOutbox reads the outbox's health on a pooled connection, in a
// read-only transaction whose statements the server stops at the timeout,
// and rehearses the drainers' statements, which the database may refuse
// though it lets the outbox be read.
// The messages it returns never include the URL's password, nor do the
// poisoned rows' last errors include either URL's.
func (p *Prober) queryOutbox(ctx context.Context, t Target, url, brokerURL string) (reason, message string, read *outbox.OutboxStatus) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	spec, err := resource.TableSpec(t.Database, t.Ordering)
	if err != nil {
		return v1alpha1.ReasonTableNotUsable, err.Error(), nil
	}
	ref := t.Database.URLSecretRef
	pool, err := p.pools.get(url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return v1alpha1.ReasonInvalidDatabaseURL, fmt.Sprintf("The database URL in Secret %q, key %q, is not a valid Postgres connection string",
			ref.Name, ref.Key), nil
	}
	redacted := secret.RedactURL(url)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return v1alpha1.ReasonConnectionFailed, fmt.Sprintf("Connect to %s: %v", redacted, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout)), nil
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return v1alpha1.ReasonConnectionFailed, fmt.Sprintf("Begin a read-only transaction on %s: %v", redacted, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout)), nil
	}
	// Rolled back: it only read.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	limits := outbox.ProbeLimits(p.opts.Timeout)
	if _, err := tx.Exec(ctx, limits.SQL, limits.Args...); err != nil {
		return v1alpha1.ReasonQueryFailed, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout).Error(), nil
	}
	resolved, err := outbox.ResolveOutbox(ctx, tx, spec)
	if unusable := (*outbox.UnusableTableError)(nil); errors.As(err, &unusable) {
		return v1alpha1.ReasonTableNotUsable, err.Error(), nil
	} else if err != nil {
		return v1alpha1.ReasonQueryFailed, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout).Error(), nil
	}
	o, err := outbox.ReadBoundedOutboxStatus(ctx, tx, resolved, t.MaxAttempts, p.opts.CountLimit, url, brokerURL)
	if err != nil {
		return v1alpha1.ReasonQueryFailed, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout).Error(), nil
	}
	if t.Ordering != nil && t.Ordering.OnFailure != outbox.OnFailureSkip {
		blocked, err := outbox.ReadBlockedKeys(ctx, tx, resolved, p.opts.CountLimit)
		if err != nil {
			return v1alpha1.ReasonQueryFailed, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout).Error(), nil
		}
		o.Blocked = &blocked
	}
	// Last, since a refused rehearsal ends the transaction: the numbers
	// are read, and go with the refusal.
	if err := outbox.Rehearse(ctx, tx, resolved, t.MaxAttempts); err != nil {
		if refused := (*outbox.StatementRefusedError)(nil); errors.As(err, &refused) {
			return v1alpha1.ReasonStatementRefused, err.Error(), &o
		}
		return v1alpha1.ReasonQueryFailed, noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout).Error(), nil
	}
	_ = tx.Rollback(ctx)
	p.releaseDead(ctx, conn, resolved, t, url)
	return v1alpha1.ReasonOutboxRead, "Read the outbox table " + resolved.Name(), &o
}

// releaseDead gives back the claims of the fleet's dead drainers, as the
// start-up release they will never run would: through the table mapping,
// fenced on the drainer's ID and on live leases, so that it touches only
// the rows the dead drainer holds. A drainer that is only cut off (its
// node unreachable) and still publishing settles nothing of what it loses
// here: its settles are fenced on their claims, so the rows are published
// again, a duplicate and never a loss. Each release is a short
// transaction of its own, bounded on the server like the read.
func (p *Prober) releaseDead(ctx context.Context, conn *pgxpool.Conn, table *outbox.Table, t Target, url string) {
	log := ctrl.LoggerFrom(ctx).WithValues("outboxdrainer", t.Key)
	fleet := &v1alpha1.OutboxDrainer{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "OutboxDrainer"},
		ObjectMeta: metav1.ObjectMeta{Namespace: t.Key.Namespace, Name: t.Key.Name, UID: t.UID},
	}
	limits := outbox.ProbeLimits(p.opts.Timeout)
	for _, d := range t.Dead {
		// The pod is the event's related object: the recorder folds events
		// of the same object, reason and related object into one series.
		pod := &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: t.Key.Namespace, Name: d.ID},
		}
		release := table.ReleaseHeld(d.ID, t.LeaseTTL, nil)
		var released int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, limits.SQL, limits.Args...); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, release.SQL, release.Args...)
			released = tag.RowsAffected()
			return err
		})
		if err != nil {
			err = noAnswer(ctx, secret.RedactError(err, url), p.opts.Timeout)
			log.Error(err, "Failed to release the claims of a dead drainer", "drainer", d.ID)
			p.recorder.Eventf(fleet, pod, corev1.EventTypeWarning, "FailedReleaseClaims", "ReleaseClaims",
				"Failed to release the claims of drainer %s (%s): %v", d.ID, d.Message, err)
			continue
		}
		if released == 0 {
			continue
		}
		p.metrics.ReleasedClaims.WithLabelValues(t.Key.Namespace, t.Key.Name, d.Reason).Add(float64(released))
		log.Info("Released the claims of a dead drainer", "drainer", d.ID, "reason", d.Reason, "rows", released)
		p.recorder.Eventf(fleet, pod, corev1.EventTypeNormal, "ReleasedClaims", "ReleaseClaims",
			"Released %d claims of drainer %s: %s", released, d.ID, d.Message)
	}
}

// noAnswer says plainly that the database did not answer in time, where
// pgx would say "context deadline exceeded".
func noAnswer(ctx context.Context, err error, timeout time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %s", timeout)
	}
	return err
}
