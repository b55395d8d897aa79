package resource

import (
	"path"
	"strconv"

	"github.com/spillway-io/spillway/api/v1alpha1"
)

// Where a webhook fleet's drainers find the endpoint's URL, the signing
// secrets and the endpoint's certificates.
const (
	WebhookURLDir     = "/var/run/secrets/spillway/webhook"
	WebhookSigningDir = "/var/run/secrets/spillway/webhook-signing"
	WebhookTLSDir     = "/var/run/secrets/spillway/webhook-tls"
)

// webhookOf is the fleet's webhook sink, or nil for a broker fleet.
func webhookOf(s v1alpha1.OutboxDrainerSpec) *v1alpha1.WebhookSpec {
	if s.Sink == nil {
		return nil
	}
	return s.Sink.Webhook
}

// SinkURL is the Secret key of the URL the fleet publishes to: the
// webhook's, or the broker's.
func SinkURL(s v1alpha1.OutboxDrainerSpec) v1alpha1.SecretKeyRef {
	if wh := webhookOf(s); wh != nil {
		return wh.URLSecretRef
	}
	return s.RabbitMQ().URLSecretRef
}

// SigningSecret is the Secret key of a webhook's signing secrets, or nil
// for a broker fleet.
func SigningSecret(s v1alpha1.OutboxDrainerSpec) *v1alpha1.SecretKeyRef {
	if wh := webhookOf(s); wh != nil {
		return &wh.SigningSecretRef
	}
	return nil
}

// SinkTLS is the certificates of the fleet's sink, or nil.
func SinkTLS(s v1alpha1.OutboxDrainerSpec) *v1alpha1.TLS {
	if wh := webhookOf(s); wh != nil {
		return wh.TLS
	}
	return BrokerTLS(s.RabbitMQ())
}

// sinkURLArg is the flag of the file holding the sink's URL.
func sinkURLArg(s v1alpha1.OutboxDrainerSpec) string {
	if webhookOf(s) != nil {
		return "--webhook-url-file=" + path.Join(WebhookURLDir, urlFile)
	}
	return "--broker-url-file=" + path.Join(BrokerURLDir, urlFile)
}

// sinkArgs are the flags of the fleet's sink besides its URL's.
func sinkArgs(s v1alpha1.OutboxDrainerSpec) []string {
	wh := webhookOf(s)
	if wh == nil {
		b := s.RabbitMQ()
		args := tlsArgs("broker", BrokerTLSDir, BrokerTLS(b))
		if b.TLS != nil && b.TLS.External {
			args = append(args, "--broker-sasl-external")
		}
		return append(args,
			"--exchange="+b.Exchange,
			"--exchange-type="+b.ExchangeType,
			"--declare-exchange="+strconv.FormatBool(b.DeclareExchange),
			"--mandatory="+strconv.FormatBool(b.Mandatory),
			"--message-properties="+string(messageProperties(b)),
		)
	}
	prefix := "X-Outbox-"
	if wh.HeaderPrefix != nil {
		prefix = *wh.HeaderPrefix
	}
	args := append([]string{"--sink=webhook"}, tlsArgs("webhook", WebhookTLSDir, wh.TLS)...)
	return append(args,
		"--webhook-signing-secret-file="+path.Join(WebhookSigningDir, urlFile),
		"--webhook-header-prefix="+prefix,
		"--webhook-allow-http="+strconv.FormatBool(wh.AllowHTTP),
		"--webhook-timeout="+wh.Timeout.Duration.String(),
		"--webhook-gone-poisons="+strconv.FormatBool(wh.GonePoisons),
		"--webhook-batch-rows="+strconv.Itoa(int(wh.BatchRows)),
	)
}

// mountedSecret is one Secret a drainer reads, as a volume mounted at dir:
// one key, as the file url, or a TLS Secret whole.
type mountedSecret struct {
	volume, dir string
	key         *v1alpha1.SecretKeyRef
	whole       string
}

// mountedSecrets are the Secrets a fleet's drainers read: the URLs (and a
// webhook's signing secrets), and the certificates of each connection with
// TLS, in the order the Deployment has always listed them.
func mountedSecrets(s v1alpha1.OutboxDrainerSpec) []mountedSecret {
	m := []mountedSecret{{volume: "database-url", dir: DatabaseURLDir, key: &s.Database.URLSecretRef}}
	wh := webhookOf(s)
	if wh != nil {
		m = append(m, mountedSecret{volume: "webhook-url", dir: WebhookURLDir, key: &wh.URLSecretRef},
			mountedSecret{volume: "webhook-signing", dir: WebhookSigningDir, key: &wh.SigningSecretRef})
	} else {
		url := s.RabbitMQ().URLSecretRef
		m = append(m, mountedSecret{volume: "broker-url", dir: BrokerURLDir, key: &url})
	}
	if ref := directURL(s); ref != nil {
		m = append(m, mountedSecret{volume: "database-direct-url", dir: DirectURLDir, key: ref})
	}
	if t := s.Database.TLS; t != nil {
		m = append(m, mountedSecret{volume: "database-tls", dir: DatabaseTLSDir, whole: t.SecretName})
	}
	if t := SinkTLS(s); t != nil {
		volume, dir := "broker-tls", BrokerTLSDir
		if wh != nil {
			volume, dir = "webhook-tls", WebhookTLSDir
		}
		m = append(m, mountedSecret{volume: volume, dir: dir, whole: t.SecretName})
	}
	return m
}
