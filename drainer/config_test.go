package drainer

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("Config validation", func() {
	valid := func() Config {
		c := DefaultConfig()
		c.DrainerID, c.Database.URL, c.Broker.URL = "d-1", "postgres://localhost/x", "amqp://localhost/"
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
		Entry("two routing key sources", func(c *Config) { c.Table.RoutingKey = RoutingKey{Column: "kind", Constant: "x"} },
			"database.routingKey: Invalid value"),
		Entry("a confirm timeout as long as the lease", func(c *Config) { c.ConfirmTimeout = c.LeaseTTL },
			`confirmTimeout: Invalid value: "30s": must be 0 (a third of leaseTTL) or positive and shorter than leaseTTL 30s`),
		Entry("a retry cap under the initial backoff", func(c *Config) { c.RetryMax = time.Millisecond },
			`retryBackoff.max: Invalid value: "1ms": must be at least retryBackoff.initial 1s`),
		Entry("no drainer ID", func(c *Config) { c.DrainerID = "" }, "drainerID: Required value"),
	)

	It("accepts a lease exactly at the minimum", func() {
		c := valid()
		c.PipelineDepth, c.LeaseTTL = 10, 3*time.Second
		Expect(c.Validate()).To(Succeed())
	})

	It("defaults the confirm deadline to a third of the lease, always shorter than it", func() {
		c := valid()
		Expect(c.confirmTimeout()).To(Equal(10 * time.Second))
	})
})

var _ = Describe("Redacting connection strings", func() {
	It("hides a URL's password and keeps the rest", func() {
		Expect(RedactURL("amqp://app:s3cr3t@rabbit:5672/vh")).To(Equal("amqp://app:xxxxx@rabbit:5672/vh"))
	})
	It("hides a key/value DSN's password", func() {
		Expect(RedactURL("host=db user=app password=s3cr3t dbname=x")).NotTo(ContainSubstring("s3cr3t"))
	})
})
