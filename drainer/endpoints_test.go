package drainer

import (
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-io/spillway/secret"
	"github.com/spillway-io/spillway/test/suite"
	"github.com/spillway-io/spillway/test/testenv"
	"github.com/spillway-io/spillway/test/tier"
)

var _ = Describe("A list of broker URLs", Label(tier.DB, tier.Broker), func() {
	It("moves past a URL that does not answer to the next, and drains through it", func(ctx SpecContext) {
		db := suite.DB{Pool: pool}
		spec := db.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		ledger := startLedger(topo.Queue)
		db.Seed(ctx, spec.Name, 500)
		cfg := testConfig("endpoints-a", spec, topo.Exchange)
		dead := "amqp://guest:hunter22@" + suite.FreeAddr() + "/"
		cfg.Broker.URL = dead + "," + testenv.BrokerURL()
		d := newDrainer(ctx, cfg).start()

		Eventually(func() int { return db.Count(ctx, spec.Name, "published_at IS NULL") }, drainTimeout).Should(BeZero())
		Eventually(ledger.Missing).WithArguments(db.IDs(ctx, spec.Name, "true")).Should(BeZero())
		Expect(testutil.ToFloat64(d.metrics.BrokerConnected)).To(Equal(1.0))
		Expect(testutil.ToFloat64(d.metrics.BrokerBlocked)).To(Equal(0.0))
		Expect(string(d.logs.Contents())).NotTo(ContainSubstring("hunter22"))
	})

	It("says in /readyz why it cannot connect, without the password, and reconnects once a URL answers", func(ctx SpecContext) {
		spec := suite.DB{Pool: pool}.CanonicalOutbox(ctx)
		topo := topology("#", nil)
		cfg := testConfig("endpoints-b", spec, topo.Exchange)
		file := filepath.Join(GinkgoT().TempDir(), "url")
		Expect(os.WriteFile(file, []byte("amqp://guest:hunter22@"+suite.FreeAddr()+"/,amqp://guest:hunter22@"+suite.FreeAddr()+"/"), 0o600)).To(Succeed())
		cfg.Broker.URLSource = secret.URLSource{File: file}
		d := newDrainer(ctx, cfg).start()

		Eventually(func() error { return d.Ready(ctx) }, drainTimeout, 20*time.Millisecond).
			Should(MatchError(ContainSubstring("broker not connected: none of the 2 broker URLs answered: connect to broker amqp://guest:xxxxx@127.0.0.1:")))
		err := d.Ready(ctx)
		Expect(err.Error()).To(ContainSubstring("connection refused"))
		Expect(err.Error()).NotTo(ContainSubstring("hunter22"))
		Expect(testutil.ToFloat64(d.metrics.BrokerConnected)).To(Equal(0.0))
		Eventually(d.logs).Should(gbytes.Say("Broker URL did not answer; trying the next"))
		Expect(string(d.logs.Contents())).NotTo(ContainSubstring("hunter22"))

		Expect(os.WriteFile(file, []byte(testenv.BrokerURL()), 0o600)).To(Succeed())
		Eventually(func() error { return d.Ready(ctx) }, drainTimeout, 20*time.Millisecond).Should(Succeed())
		// The gauge follows the connection a moment after Ready sees it.
		Eventually(func() float64 { return testutil.ToFloat64(d.metrics.BrokerConnected) }, drainTimeout, 20*time.Millisecond).Should(Equal(1.0))
	})
})
