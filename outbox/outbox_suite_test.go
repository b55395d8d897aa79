package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
)

func TestOutbox(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Outbox Suite")
}

var (
	pool *pgxpool.Pool
	db   suite.DB
)

var _ = BeforeSuite(func(ctx SpecContext) {
	services, err := testenv.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(services.Close)
	pool = services.DB
	db = suite.DB{Pool: pool}
})
