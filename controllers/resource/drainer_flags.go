package resource

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/drainer/rabbitmq"
	"github.com/spillway-io/spillway/outbox"
)

// Where a drainer finds its connection URLs: each referenced Secret key is
// mounted as a file, never passed as a value, and the drainer re-reads it on
// every reconnect, so a rotated Secret needs no restart.
const (
	DatabaseURLDir = "/var/run/secrets/spillway/database"
	BrokerURLDir   = "/var/run/secrets/spillway/broker"
	// DirectURLDir holds the URL past a transaction pooler.
	DirectURLDir = "/var/run/secrets/spillway/database-direct"
	urlFile      = "url"
	// The TLS Secrets are mounted whole, with the key names cert-manager
	// writes.
	DatabaseTLSDir = "/var/run/secrets/spillway/database-tls"
	BrokerTLSDir   = "/var/run/secrets/spillway/broker-tls"
	caFile         = "ca.crt"
	certFile       = "tls.crt"
	keyFile        = "tls.key"
)

// TLSKeys are the keys of a TLS Secret that the drainers read.
func TLSKeys(t *v1alpha1.TLS) []v1alpha1.SecretKeyRef {
	keys := []v1alpha1.SecretKeyRef{{Name: t.SecretName, Key: caFile}}
	if t.ClientCertificate {
		keys = append(keys, v1alpha1.SecretKeyRef{Name: t.SecretName, Key: certFile}, v1alpha1.SecretKeyRef{Name: t.SecretName, Key: keyFile})
	}
	return keys
}

// tlsArgs are the certificate flags of one connection (database, broker)
// whose Secret is mounted at dir, or none without TLS.
func tlsArgs(conn, dir string, t *v1alpha1.TLS) []string {
	if t == nil {
		return nil
	}
	args := []string{"--" + conn + "-ca-file=" + path.Join(dir, caFile)}
	if t.ClientCertificate {
		args = append(args, "--"+conn+"-cert-file="+path.Join(dir, certFile), "--"+conn+"-key-file="+path.Join(dir, keyFile))
	}
	return args
}

// poolerArgs are the flags of a pooler between the drainers and Postgres;
// none for Postgres itself.
func poolerArgs(p *v1alpha1.Pooler) []string {
	if p == nil {
		return nil
	}
	mode := outbox.PoolModeSession
	if p.Mode == v1alpha1.PoolModeTransaction {
		mode = outbox.PoolModeTransaction
	}
	args := []string{"--database-pool-mode=" + string(mode)}
	if p.PreparedStatements != nil {
		args = append(args, "--database-prepared-statements="+strconv.FormatBool(*p.PreparedStatements))
	}
	if p.DirectURLSecretRef != nil {
		args = append(args, "--database-direct-url-file="+path.Join(DirectURLDir, urlFile))
	}
	return args
}

// brokerTLS is the broker's certificates, or nil.
func BrokerTLS(b v1alpha1.BrokerSpec) *v1alpha1.TLS {
	if b.TLS == nil {
		return nil
	}
	return &b.TLS.TLS
}

// columnMapping pairs each logical column, named as in --columns, with the
// spec's name for it; "" keeps the canonical name.
func columnMapping(c v1alpha1.Columns) [][2]string {
	return [][2]string{
		{"id", string(c.ID)},
		{"payload", string(c.Payload)},
		{"headers", string(c.Headers)},
		{"enqueuedAt", string(c.EnqueuedAt)},
		{"availableAt", string(c.AvailableAt)},
		{"publishedAt", string(c.PublishedAt)},
		{"claimedAt", string(c.ClaimedAt)},
		{"claimedBy", string(c.ClaimedBy)},
		{"attempts", string(c.Attempts)},
		{"lastError", string(c.LastError)},
		{"parkedAt", string(c.ParkedAt)},
		{"traceparent", string(c.TraceParent)},
		{"tracestate", string(c.TraceState)},
	}
}

// TableSpec is the drainer's view of the spec's table, so that the
// operator's status query resolves the table exactly as a drainer does.
// With ordering, it is the ordered table, whose blocked keys the status
// counts.
func TableSpec(db v1alpha1.DatabaseSpec, ordering *v1alpha1.Ordering) (outbox.TableSpec, error) {
	spec := outbox.TableSpec{
		Name: db.Table,
		RoutingKey: outbox.RoutingKey{
			Column:       string(db.RoutingKey.Column),
			PayloadField: db.RoutingKey.PayloadField,
			Constant:     db.RoutingKey.Constant,
		},
	}
	for _, m := range columnMapping(db.Columns) {
		if m[1] == "" {
			continue
		}
		if err := spec.Columns.Set(m[0], m[1]); err != nil {
			return spec, fmt.Errorf("map column %s: %w", m[0], err)
		}
	}
	if ordering != nil {
		spec.Ordering = outbox.Ordering{KeyColumn: string(ordering.KeyColumn), OnFailure: ordering.OnFailure}
	}
	return spec, nil
}

// messageProperties is the drainer's name for the spec's choice; unset is
// the CRD's default.
func messageProperties(b v1alpha1.BrokerSpec) rabbitmq.MessageProperties {
	if b.MessageProperties == "" {
		return rabbitmq.FullProperties
	}
	return rabbitmq.MessageProperties(strings.ToLower(b.MessageProperties))
}

// messageFormats are the drainer's --message-format for each of the spec's
// formats but Plain, the drainer's default.
var messageFormats = map[string]string{"CloudEvents": "cloudevents", "CloudEventsStructured": "cloudevents-structured"}

// DrainArgs are the arguments of `spillway drain` for a spec: every setting
// explicit, so the Deployment says what its drainers do.
func DrainArgs(s v1alpha1.OutboxDrainerSpec) []string {
	args := []string{"drain", "--table=" + s.Database.Table}
	var mapped []string
	for _, m := range columnMapping(s.Database.Columns) {
		if m[1] != "" {
			mapped = append(mapped, m[0]+"="+m[1])
		}
	}
	if len(mapped) > 0 {
		args = append(args, "--columns="+strings.Join(mapped, ","))
	}
	switch rk := s.Database.RoutingKey; {
	case rk.Column != "":
		args = append(args, "--routing-key-column="+string(rk.Column))
	case rk.PayloadField != "":
		args = append(args, "--routing-key-field="+rk.PayloadField)
	case rk.Constant != "":
		args = append(args, "--routing-key="+rk.Constant)
	}
	args = append(args,
		"--database-url-file="+path.Join(DatabaseURLDir, urlFile),
		"--synchronous-commit="+strconv.FormatBool(s.Database.SynchronousCommit),
		sinkURLArg(s),
	)
	args = append(args, poolerArgs(s.Database.Pooler)...)
	args = append(args, tlsArgs("database", DatabaseTLSDir, s.Database.TLS)...)
	args = append(args, sinkArgs(s)...)
	args = append(args,
		"--batch-size="+strconv.Itoa(int(s.BatchSize)),
		"--pipeline-depth="+strconv.Itoa(int(s.PipelineDepth)),
		"--lease-ttl="+s.LeaseTTL.Duration.String(),
		"--poll-interval="+s.PollInterval.Duration.String(),
		"--max-attempts="+strconv.Itoa(int(s.MaxAttempts)),
		"--retry-initial="+s.RetryBackoff.Initial.Duration.String(),
		"--retry-max="+s.RetryBackoff.Max.Duration.String(),
		"--max-payload-bytes="+strconv.FormatInt(s.MaxPayloadBytes, 10),
		"--shutdown-timeout="+s.ShutdownTimeout.Duration.String(),
		fmt.Sprintf("--metrics-addr=:%d", MetricsPort),
	)
	if o := s.Ordering; o != nil {
		args = append(args, "--ordering-key-column="+string(o.KeyColumn))
		if o.OnFailure != "" {
			args = append(args, "--ordering-on-failure="+o.OnFailure)
		}
	}
	if s.MaxRate != nil {
		args = append(args, "--max-rate="+strconv.FormatInt(*s.MaxRate, 10))
	}
	if f, ok := messageFormats[s.MessageFormat]; ok {
		args = append(args, "--message-format="+f)
		if s.CloudEventsSource != "" {
			args = append(args, "--cloudevents-source="+s.CloudEventsSource)
		}
	}
	if s.MaxCommitLatency != nil {
		args = append(args, "--max-commit-latency="+s.MaxCommitLatency.Duration.String())
	}
	// Unset, the drainers keep no published row and every pending one; a
	// published window keeps published rows that long.
	if r := s.Retention; r != nil {
		if r.Published != nil {
			args = append(args, "--retention-published="+r.Published.Duration.String())
		}
		if r.UnpublishedMaxAge != nil {
			args = append(args, "--retention-unpublished-max-age="+r.UnpublishedMaxAge.Duration.String())
		}
	}
	return args
}
