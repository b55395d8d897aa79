package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/tier"
)

func TestOutbox(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Outbox Suite")
}

var (
	pool *pgxpool.Pool
	db   suite.DB
)

var services suite.Lazy

// Only the specs that run against Postgres connect to it.
var _ = BeforeEach(func(ctx SpecContext) {
	if tier.Needs(tier.DB) {
		pool = services.Connect(ctx).DB
		db = suite.DB{Pool: pool}
	}
})

var _ = AfterSuite(services.Close)
