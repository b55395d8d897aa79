// Package rabbitmq is the drainer's RabbitMQ sink: a connection with
// publisher confirms, over which each row is a persistent message whose
// message_id is the row's id. A confirm is Confirmed, a return of a
// mandatory message Refused, a nack PushedBack, and a confirm lost with its
// channel Lost. It is the one package that speaks AMQP.
package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/secret"
)

// Config says where and how rows are published.
type Config struct {
	secret.URLSource
	Exchange string
	// Mandatory is off by default: on a fan-out topic exchange "no queue bound
	// yet" is normal, and with mandatory on it would poison those events.
	Mandatory bool
	// DeclareExchange declares a durable exchange of ExchangeType on connect,
	// for setups where nothing else owns the topology.
	DeclareExchange bool
	ExchangeType    string
	// MessageProperties is full (or unset) or compact: whether each message
	// also carries a timestamp, type and app_id.
	MessageProperties MessageProperties
	// ContentType overrides the one derived from the payload column's type.
	ContentType string
	// External authenticates with the TLS client certificate (SASL
	// EXTERNAL) instead of the URL's user and password.
	External bool
	// Format is the drainer's message format: plain, or CloudEvents.
	Format sink.Format
}

// DefaultConfig is a topic exchange's, with full properties.
func DefaultConfig() Config {
	return Config{ExchangeType: "topic", MessageProperties: FullProperties}
}

// exchangeTypes are the exchange types --declare-exchange declares.
var exchangeTypes = []string{"direct", "fanout", "topic", "headers"}

// Validate checks every rule of the broker's settings, at path; each error
// names the field, the value and the rule.
func (c Config) Validate(path *field.Path) field.ErrorList {
	errs := c.URLSource.Validate(path, "the AMQP URL of the broker")
	for _, u := range secret.Endpoints(c.URL) {
		if _, err := amqp.ParseURI(u); err != nil {
			errs = append(errs, field.Invalid(path.Child("url"), secret.RedactURL(u),
				fmt.Sprintf("each of the comma-separated broker URLs must be an amqp:// or amqps:// URL: %v", secret.RedactError(err, u))))
		}
	}
	if c.External && c.TLS.CertFile == "" {
		errs = append(errs, field.Invalid(path.Child("external"), c.External,
			"SASL EXTERNAL authenticates with the client certificate: set --broker-cert-file and --broker-key-file"))
	}
	if c.Exchange == "" && !c.Mandatory {
		errs = append(errs, field.Invalid(path.Child("exchange"), c.Exchange,
			"set an exchange (--exchange), or broker.mandatory (--mandatory) to publish to the default exchange: "+
				"there a row whose routing key names no queue is dropped by the broker, and would be marked published"))
	}
	if len(c.Exchange) > maxShortString {
		errs = append(errs, field.TooLong(path.Child("exchange"), c.Exchange, maxShortString))
	}
	if len(c.ContentType) > maxShortString {
		errs = append(errs, field.TooLong(field.NewPath("contentType"), c.ContentType, maxShortString))
	}
	switch c.ExchangeType {
	case "direct", "fanout", "topic", "headers":
	default:
		errs = append(errs, field.NotSupported(path.Child("exchangeType"), c.ExchangeType, exchangeTypes))
	}
	switch c.MessageProperties {
	case "", FullProperties, CompactProperties: // unset is full
	default:
		errs = append(errs, field.NotSupported(path.Child("messageProperties"), c.MessageProperties,
			[]MessageProperties{FullProperties, CompactProperties}))
	}
	return errs
}

// Where is where rows go, for a log line.
func (c Config) Where() string { return fmt.Sprintf("exchange %q", c.Exchange) }
