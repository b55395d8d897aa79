package outbox

// What the specs, in package outbox_test, read of the table layer's inside.

// ObjectName names an object spillway adds beside the spec's table.
func (s TableSpec) ObjectName(suffix string) string { return s.objectName(suffix) }

// SettlesByID reports whether the settles find rows through the id's index.
func (t *Table) SettlesByID() bool { return t.settleByID }

const (
	ClaimIndexSuffix     = claimIndexSuffix
	PublishedIndexSuffix = publishedIndexSuffix
	OrderIndexSuffix     = orderIndexSuffix
	WaitingDue           = waitingDue
)

var (
	QuoteLiteral    = quoteLiteral
	TopPoisonCauses = topPoisonCauses
)
