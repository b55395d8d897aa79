// Package tier names the test tiers, as the Ginkgo labels of the specs: what
// a spec runs against. A spec without one is a unit spec, and runs with no
// service at all: make test-unit runs those alone, with the label filter
// that excludes every tier below.
package tier

import (
	"os"
	"slices"
	"testing"

	"github.com/onsi/ginkgo/v2"
)

const (
	// DB specs run against the local Postgres.
	DB = "db"
	// Broker specs run against the local RabbitMQ.
	Broker = "broker"
	// Envtest specs run against an API server and etcd, with no nodes.
	Envtest = "envtest"
	// Process specs run the spillway binary, against Postgres and RabbitMQ.
	Process = "process"
	// Cluster specs run on the local cluster of processes: helm, pods.
	Cluster = "cluster"
	// Faults specs stop, block or restart a shared service: they run alone,
	// after the others.
	Faults = "faults"
)

// Needs reports whether the current spec runs against any of tiers: a
// suite connects to a service only for the specs that need it.
func Needs(tiers ...string) bool {
	labels := ginkgo.CurrentSpecReport().Labels()
	return slices.ContainsFunc(tiers, func(t string) bool { return slices.Contains(labels, t) })
}

// Run runs a suite's specs, labelled with args' labels, under the label
// filter of SPILLWAY_TEST_LABELS too, when it is set: make test-unit sets
// Unit, so every package can be run at once without the -ginkgo flags that
// plain Go test binaries refuse.
func Run(t *testing.T, description string, args ...any) bool {
	suite, reporter := ginkgo.GinkgoConfiguration()
	if filter := os.Getenv("SPILLWAY_TEST_LABELS"); filter != "" {
		if suite.LabelFilter != "" {
			filter = "(" + suite.LabelFilter + ") && (" + filter + ")"
		}
		suite.LabelFilter = filter
	}
	return ginkgo.RunSpecs(t, description, append(args, suite, reporter)...)
}
