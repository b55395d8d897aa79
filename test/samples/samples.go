// Package samples holds the API objects that specs start from: fleets at
// the drainer's defaults.
package samples

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/spillway-io/spillway/api/v1alpha1"
	"github.com/spillway-io/spillway/drainer"
)

// OutboxDrainer is a fleet of one at the drainer's defaults, over the
// default table, publishing to the exchange orders.
func OutboxDrainer() *v1alpha1.OutboxDrainer {
	d := drainer.DefaultConfig()
	return &v1alpha1.OutboxDrainer{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", UID: "6f1c1a52-1111-4c1e-9a55-1d2f3a4b5c6d", Generation: 1},
		Spec: v1alpha1.OutboxDrainerSpec{
			Replicas: ptr.To(int32(1)),
			Database: v1alpha1.DatabaseSpec{
				URLSecretRef: v1alpha1.SecretKeyRef{Name: "orders-db", Key: "url"},
				Table:        d.Table.Name,
			},
			Broker: v1alpha1.BrokerSpec{
				URLSecretRef: v1alpha1.SecretKeyRef{Name: "rabbit", Key: "amqp-url"},
				Exchange:     "orders",
				ExchangeType: d.Broker.ExchangeType,
			},
			BatchSize:       int32(d.BatchSize),
			PipelineDepth:   int32(d.PipelineDepth),
			LeaseTTL:        metav1.Duration{Duration: d.LeaseTTL},
			PollInterval:    metav1.Duration{Duration: d.PollInterval},
			MaxAttempts:     int32(d.MaxAttempts),
			RetryBackoff:    v1alpha1.RetryBackoff{Initial: metav1.Duration{Duration: d.RetryInitial}, Max: metav1.Duration{Duration: d.RetryMax}},
			MaxPayloadBytes: d.MaxPayloadBytes,
			ShutdownTimeout: metav1.Duration{Duration: 30 * time.Second},
			StatusInterval:  metav1.Duration{Duration: 15 * time.Second},
		},
	}
}
