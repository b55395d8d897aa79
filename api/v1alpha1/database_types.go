package v1alpha1

// DatabaseSpec is the outbox: where it is and how its table is laid out.
type DatabaseSpec struct {
	// URLSecretRef is the key of a Secret holding the Postgres connection URL.
	// It is mounted into the drainers as a file, never passed as a value.
	// +required
	URLSecretRef SecretKeyRef `json:"urlSecretRef"`
	// Table is the outbox table, as schema.table or table (schema public).
	// +kubebuilder:validation:Pattern=`^([A-Za-z_][A-Za-z0-9_]{0,62}\.)?[A-Za-z_][A-Za-z0-9_]{0,62}$`
	// +kubebuilder:default="public.outbox"
	// +optional
	Table string `json:"table,omitempty"`
	// Columns maps logical columns to the table's names.
	// +optional
	Columns Columns `json:"columns,omitzero"`
	// RoutingKey says where a row's routing key comes from.
	// +optional
	RoutingKey RoutingKey `json:"routingKey,omitzero"`
	// TLS connects over TLS with the certificates of a Secret, verifying the
	// server's certificate and its name (sslmode=verify-full), whatever the
	// URL's sslmode says.
	// +optional
	TLS *TLS `json:"tls,omitempty"`
	// SynchronousCommit makes drainer commits wait for the WAL flush. Off, the
	// application's commits do not queue behind the drainer's; a claim or
	// mark lost in a crash only causes a duplicate.
	// +optional
	SynchronousCommit bool `json:"synchronousCommit,omitempty"`
	// Pooler is the connection pooler the URL names, if any, and how it
	// pools. Unset: Postgres itself, or a pooler in session mode.
	// +optional
	Pooler *Pooler `json:"pooler,omitempty"`
}

// TLS is a connection's certificates: a Secret in the fleet's namespace,
// mounted into the drainers, holding ca.crt, the CA that signs the server's
// certificate, and for a client certificate tls.crt and tls.key (the layout
// cert-manager writes). The drainers read them at every connect, so a
// rotated Secret takes effect at the next reconnect.
type TLS struct {
	// SecretName is the Secret holding the certificates.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	SecretName string `json:"secretName"`
	// ClientCertificate presents tls.crt and tls.key to the server.
	// +optional
	ClientCertificate bool `json:"clientCertificate,omitempty"`
}

// Pool modes of a pooler, as PgBouncer's pool_mode names them.
const (
	PoolModeSession     = "Session"
	PoolModeTransaction = "Transaction"
)

// Pooler is a connection pooler between the drainers and Postgres, such as
// PgBouncer.
//
// +kubebuilder:validation:XValidation:rule="!has(self.directURLSecretRef) || (has(self.mode) && self.mode == 'Transaction')",fieldPath=".directURLSecretRef",reason="FieldValueInvalid",message="directURLSecretRef only serves a pooler in Transaction mode"
type Pooler struct {
	// Mode is the pooler's pool mode. Session (pool_mode = session) works as
	// Postgres itself does. Transaction (pool_mode = transaction) hands each
	// transaction another server session, so the drainers keep no state on
	// one through it: no LISTEN, no session-level advisory lock, no session
	// setting; their settings open each claim and settle instead.
	// +kubebuilder:validation:Enum=Session;Transaction
	// +kubebuilder:default=Session
	// +optional
	Mode string `json:"mode,omitempty"`
	// DirectURLSecretRef is the key of a Secret holding a URL past the
	// pooler, to Postgres itself, for the drainers' own sessions in
	// Transaction mode: the LISTEN that wakes them, the notify hush, the
	// maxRate roster and the broker-blocked flag, one session each at most.
	// Without it the drainers poll every pollInterval, commits keep
	// notifying, maxRate cannot be shared (it is refused), and a broker that
	// blocks publishing shows in the drainers' readiness only.
	// +optional
	DirectURLSecretRef *SecretKeyRef `json:"directURLSecretRef,omitempty"`
	// PreparedStatements uses named prepared statements, cached per
	// session. Unset: on in Session mode, off in Transaction mode, where
	// only PgBouncer 1.21 and later keeps them (max_prepared_statements
	// above 0); off, each statement is described once per connection and
	// sent whole, unnamed.
	// +optional
	PreparedStatements *bool `json:"preparedStatements,omitempty"`
}

// TransactionPooled reports whether the database URL names a pooler in
// transaction mode.
func (d DatabaseSpec) TransactionPooled() bool {
	return d.Pooler != nil && d.Pooler.Mode == PoolModeTransaction
}
