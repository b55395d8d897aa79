package resource

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/test/samples"
	"github.com/spillway-io/spillway/test/tier"
)

func TestResource(t *testing.T) {
	RegisterFailHandler(Fail)
	tier.Run(t, "Resource Builder Suite")
}

func testScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	return scheme
}

// outboxDrainer is a fleet of one at the drainer's defaults.
func outboxDrainer() *v1alpha1.OutboxDrainer { return samples.OutboxDrainer() }

func builderFor(od *v1alpha1.OutboxDrainer) *OutboxDrainerResourceBuilder {
	return &OutboxDrainerResourceBuilder{Instance: od, Scheme: testScheme(), Image: "ghcr.io/spillway-io/spillway:v1.2.3"}
}
