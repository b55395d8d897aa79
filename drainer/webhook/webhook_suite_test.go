package webhook

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/spillway-io/spillway/test/tier"
)

func TestWebhook(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Webhook Sink Suite")
}
