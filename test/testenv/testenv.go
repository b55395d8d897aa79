// Package testenv connects tests to the real local Postgres and RabbitMQ and
// gives each test its own table, exchange and queue, so packages can run in
// parallel against the one server of each. It asserts nothing and imports
// neither Ginkgo nor envtest, so the benchmark uses it too and lists only its
// own flags; test/suite holds the helpers that assert, test/kubeenv the
// control plane and the local cluster.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DatabaseURL is the test Postgres; override with SPILLWAY_TEST_DATABASE_URL.
func DatabaseURL() string {
	return env("SPILLWAY_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// BrokerURL is the test RabbitMQ; override with SPILLWAY_TEST_BROKER_URL.
func BrokerURL() string {
	return env("SPILLWAY_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// UniqueName returns prefix_ plus 8 random hex digits: a legal identifier
// for a table, an exchange or a queue that no other test uses.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// Services is a connection to each of the local test services.
type Services struct {
	DB     *pgxpool.Pool
	Broker *amqp.Connection
}

// Connect reaches the test Postgres and RabbitMQ, saying which one is down
// and that make test starts it.
func Connect(ctx context.Context) (Services, error) {
	db, err := pgxpool.New(ctx, DatabaseURL())
	if err == nil {
		err = db.Ping(ctx)
	}
	if err != nil {
		return Services{}, fmt.Errorf("postgres at %s (make test starts it): %w", redacted(DatabaseURL()), err)
	}
	broker, err := amqp.Dial(BrokerURL())
	if err != nil {
		db.Close()
		return Services{}, fmt.Errorf("rabbitmq (make test starts it): %w", err)
	}
	return Services{DB: db, Broker: broker}, nil
}

// redacted is a URL without its password: an overridden test URL may carry
// one, and no password is ever printed.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

// Close closes both connections.
func (s Services) Close() {
	s.DB.Close()
	_ = s.Broker.Close()
}

// UniqueObjectName is UniqueName as a legal Kubernetes object name.
func UniqueObjectName(prefix string) string {
	return strings.ReplaceAll(UniqueName(prefix), "_", "-")
}

// RepoRoot is the repository's root, two levels above this file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Revision is the checkout's commit, or empty outside a git checkout.
func Revision() string {
	out, err := exec.Command("git", "-C", RepoRoot(), "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
