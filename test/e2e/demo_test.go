package e2e

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"

	"github.com/spillway-io/spillway/test/kubeenv"
)

var _ = Describe("make demo", func() {
	It("runs the journey on a cluster of its own: helm install, the sample fleet drained, a scale-up to 3, and tears it all down", func(ctx SpecContext) {
		demo, err := gexec.Build("github.com/spillway-io/spillway/test/clusterdemo")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(gexec.CleanupBuildArtifacts)
		spillway, err := gexec.Build("github.com/spillway-io/spillway")
		Expect(err).NotTo(HaveOccurred())
		layout, err := kubeenv.ImageLayout()
		Expect(err).NotTo(HaveOccurred())
		s, err := gexec.Start(exec.Command(demo, "-spillway", spillway, "-image-layout", layout, "-helm", helm, "-events", "5000"), GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { s.Interrupt().Wait(time.Minute) })
		Eventually(s, 5*time.Minute).Should(gexec.Exit(0))

		out := string(s.Out.Contents())
		Expect(out).To(MatchRegexp(`(?m)^cluster: node local Ready in `))
		Expect(out).To(ContainSubstring("STATUS: deployed"))
		Expect(out).To(ContainSubstring("outboxdrainer.spillway.io/orders created"))
		Expect(out).To(MatchRegexp(`(?m)^orders-\S+\s+Running\s+(127\.0\.0\.1:\d+/spillway-io/spillway@sha256:[0-9a-f]{64})\s+127\.0\.0\.1:\d+/spillway-io/spillway@sha256:[0-9a-f]{64}$`),
			"the drainer pods run the registry's image by digest, and the node reports the digest it pulled")
		Expect(out).To(MatchRegexp(`Normal\s+Pulling\s+.*Pulling image "127\.0\.0\.1:\d+/spillway-io/spillway@sha256:`), "the operator pod's pull in its events")
		Expect(out).To(MatchRegexp(`Normal\s+Pulled\s+.*Successfully pulled image "127\.0\.0\.1:\d+/spillway-io/spillway@sha256:[0-9a-f]{64}" in \S+\. Image size: \d+ bytes\.`))
		Expect(out).To(MatchRegexp(`Normal\s+Pulled\s+.*Container image "127\.0\.0\.1:\d+/spillway-io/spillway@sha256:[0-9a-f]{64}" already present on machine`), "the drainers' pods find it on the node")
		Expect(out).To(MatchRegexp(`(?m)^\s+[0-9.]+s\s+orders\s+True\s+2\s+0\s`), "the backlog drained")
		Expect(out).To(MatchRegexp(`(?m)^orders\s+True\s+3\s`), "REPLICAS 3 after the scale-up")
		Expect(out).To(ContainSubstring("tore down the cluster"))
		queued := regexp.MustCompile(`the queue holds (\d+) messages`).FindStringSubmatch(out)
		Expect(queued).To(HaveLen(2), out)
		Expect(strconv.Atoi(queued[1])).To(BeNumerically(">=", 5000), "at least once: every event reached the queue")
		dir := regexp.MustCompile(`logs in (/tmp/spillway-cluster\d+)`).FindStringSubmatch(out)
		Expect(dir).To(HaveLen(2), out)
		_, err = os.Stat(dir[1])
		Expect(os.IsNotExist(err)).To(BeTrue(), "the demo removes its cluster's directory")
	})
})
