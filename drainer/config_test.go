package drainer

import (
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

var _ = Describe("Config validation", func() {
	valid := func() Config {
		c := DefaultConfig()
		c.DrainerID, c.Database.URL, c.Broker.URL = "d-1", "postgres://localhost/x", "amqp://localhost/"
		c.Broker.Exchange = "orders"
		return c
	}

	It("accepts the defaults once the connections and ID are given", func() {
		Expect(valid().Validate()).To(Succeed())
	})

	DescribeTable("names the field, the value and the rule",
		func(mutate func(*Config), want string) {
			c := valid()
			mutate(&c)
			err := c.Validate()
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(want))
		},
		Entry("batch size 0", func(c *Config) { c.BatchSize = 0 },
			"batchSize: Invalid value: 0: must be greater than 0"),
		Entry("pipeline depth 0", func(c *Config) { c.PipelineDepth = 0 },
			"pipelineDepth: Invalid value: 0: must be greater than 0"),
		Entry("a lease under 3 × depth × 100ms", func(c *Config) { c.PipelineDepth, c.LeaseTTL = 64, 10*time.Second },
			`leaseTTL: Invalid value: "10s": must be at least 3 × pipelineDepth × 100ms = 19.2s for pipelineDepth 64`),
		Entry("a table name containing SQL", func(c *Config) { c.Table.Name = "outbox; DROP TABLE users" },
			`database.table: Invalid value: "outbox; DROP TABLE users": must be table or schema.table`),
		Entry("a quoted column name", func(c *Config) { c.Table.Columns.ID = `id"--` },
			`database.columns.id: Invalid value: "id\"--": must be a plain SQL identifier`),
		Entry("two routing key sources", func(c *Config) { c.Table.RoutingKey = outbox.RoutingKey{Column: "kind", Constant: "x"} },
			"database.routingKey: Invalid value"),
		Entry("a confirm timeout as long as the lease", func(c *Config) { c.ConfirmTimeout = c.LeaseTTL },
			`confirmTimeout: Invalid value: "1m20s": must be 0 (a third of leaseTTL) or positive and shorter than leaseTTL 1m20s`),
		Entry("a retry cap under the initial backoff", func(c *Config) { c.RetryMax = time.Millisecond },
			`retryBackoff.max: Invalid value: "1ms": must be at least retryBackoff.initial 1s`),
		Entry("no drainer ID", func(c *Config) { c.DrainerID = "" }, "drainerID: Required value"),
		Entry("no database URL", func(c *Config) { c.Database.URL = "" }, "database.url: Required value"),
		Entry("a broker URL and a URL file", func(c *Config) { c.Broker.File = "/secrets/url" },
			`broker.urlFile: Invalid value: "/secrets/url": set the URL or the file, not both`),
		Entry("a negative published retention window", func(c *Config) {
			d := -time.Second
			c.Retention.Published = &d
		}, `retention.published: Invalid value: "-1s": must be 0 (delete each row once published) or more`),
		Entry("a zero unpublishedMaxAge, which would delete the pending set", func(c *Config) { c.Retention.UnpublishedMaxAge = new(time.Duration) },
			`retention.unpublishedMaxAge: Invalid value: "0s": must be greater than 0`),
		Entry("a negative unpublishedMaxAge, which would delete the pending set", func(c *Config) {
			d := -time.Hour
			c.Retention.UnpublishedMaxAge = &d
		}, `retention.unpublishedMaxAge: Invalid value: "-1h0m0s": must be greater than 0`),
		Entry("a wake coalescing window as long as the poll interval", func(c *Config) { c.WakeCoalesce = c.PollInterval },
			`wakeCoalesce: Invalid value: "1s": must be 0 (claim at once) or positive and shorter than pollInterval 1s`),
		Entry("message properties neither full nor compact", func(c *Config) { c.Broker.MessageProperties = "lean" },
			`broker.messageProperties: Unsupported value: "lean": supported values: "full", "compact"`),
		Entry("a broker URL of a list that is not AMQP, shown without its password", func(c *Config) {
			c.Broker.URL = "amqp://u:hunter22@a:5672/,http://u:hunter22@b/"
		}, `broker.url: Invalid value: "http://u:xxxxx@b/": each of the comma-separated broker URLs must be an amqp:// or amqps:// URL`),
		Entry("a client certificate without its key", func(c *Config) { c.Broker.TLS = secret.TLSFiles{CAFile: "ca", CertFile: "crt"} },
			`broker.tls.keyFile: Invalid value: "": set --broker-cert-file and --broker-key-file together`),
		Entry("a client certificate without a CA", func(c *Config) {
			c.Database.TLS = secret.TLSFiles{CertFile: "crt", KeyFile: "key"}
		}, `database.tls.caFile: Required value: --database-ca-file`),
		Entry("SASL EXTERNAL without a client certificate", func(c *Config) { c.Broker.External = true },
			`broker.external: Invalid value: true: SASL EXTERNAL authenticates with the client certificate`),
		Entry("a zero shutdown timeout", func(c *Config) { c.ShutdownTimeout = 0 }, `shutdownTimeout: Invalid value: "0s": must be greater than 0`),
		Entry("the default exchange without mandatory, which drops unroutable rows and marks them published",
			func(c *Config) { c.Broker.Exchange, c.Broker.Mandatory = "", false },
			`broker.exchange: Invalid value: "": set an exchange (--exchange), or broker.mandatory (--mandatory) to publish to the default exchange`),
	)

	It("accepts the default exchange with mandatory on, which counts an unroutable row as a failed attempt", func() {
		c := valid()
		c.Broker.Exchange, c.Broker.Mandatory = "", true
		Expect(c.Validate()).To(Succeed())
	})

	It("accepts a lease exactly at the minimum", func() {
		c := valid()
		c.PipelineDepth, c.LeaseTTL = 10, 3*time.Second
		Expect(c.Validate()).To(Succeed())
	})

	It("defaults the confirm deadline to a third of the lease, always shorter than it", func() {
		c := valid()
		c.LeaseTTL = 30 * time.Second
		Expect(c.confirmTimeout()).To(Equal(10 * time.Second))
	})
})

var _ = Describe("URLs from files", func() {
	It("reads the file at every call, without its trailing newline", func() {
		file := filepath.Join(GinkgoT().TempDir(), "url")
		src := secret.URLSource{File: file}
		Expect(os.WriteFile(file, []byte("amqp://app:one@rabbit/\n"), 0o600)).To(Succeed())
		Expect(src.Read()).To(Equal("amqp://app:one@rabbit/"))
		Expect(os.WriteFile(file, []byte("amqp://app:two@rabbit/"), 0o600)).To(Succeed())
		Expect(src.Read()).To(Equal("amqp://app:two@rabbit/"))
	})

	It("names a missing or empty file in its error", func() {
		missing := filepath.Join(GinkgoT().TempDir(), "missing")
		_, err := secret.URLSource{File: missing}.Read()
		Expect(err).To(MatchError(ContainSubstring(missing)))
		empty := filepath.Join(GinkgoT().TempDir(), "empty")
		Expect(os.WriteFile(empty, nil, 0o600)).To(Succeed())
		_, err = secret.URLSource{File: empty}.Read()
		Expect(err).To(MatchError("URL file " + empty + " is empty"))
	})
})
