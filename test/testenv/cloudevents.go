package testenv

import (
	"bytes"
	"context"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The CloudEvents SDK has no AMQP 0-9-1 binding, so a consumer reads a
// delivery through a binding.Message of its own, as the SDK's AMQP 1.0
// binding reads a message's application properties: the SDK itself then
// decodes and validates the event.

// cloudEventsAMQP are the CloudEvents attributes as AMQP headers, which
// are read whatever their case: the SDK looks attributes up lowercased.
var cloudEventsAMQP = spec.WithPrefix("cloudevents_")

// AMQPEvent decodes a delivery as a CloudEvent: binary mode from its
// cloudEvents_ headers and content type, structured mode from its body.
func AMQPEvent(d amqp.Delivery) (*event.Event, error) {
	return binding.ToEvent(context.Background(), deliveryMessage{d})
}

type deliveryMessage struct{ d amqp.Delivery }

func (m deliveryMessage) ReadEncoding() binding.Encoding {
	if format.Lookup(m.d.ContentType) != nil {
		return binding.EncodingStructured
	}
	for k := range m.d.Headers {
		if strings.EqualFold(k, cloudEventsAMQP.PrefixedSpecVersionName()) {
			return binding.EncodingBinary
		}
	}
	return binding.EncodingUnknown
}

func (m deliveryMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(m.d.ContentType)
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(m.d.Body))
}

// header is the value of the header named name, whatever its case.
func (m deliveryMessage) header(name string) (any, bool) {
	for k, v := range m.d.Headers {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return nil, false
}

// version is the event's specversion, nil in no binary event.
func (m deliveryMessage) version() spec.Version {
	v, _ := m.header(cloudEventsAMQP.PrefixedSpecVersionName())
	s, _ := v.(string)
	return cloudEventsAMQP.Version(s)
}

func (m deliveryMessage) GetAttribute(kind spec.Kind) (spec.Attribute, any) {
	version := m.version()
	if version == nil {
		return nil, nil
	}
	attr := version.AttributeFromKind(kind)
	if kind == spec.DataContentType {
		return attr, m.d.ContentType
	}
	if attr == nil {
		return nil, nil
	}
	v, _ := m.header(attr.PrefixedName())
	return attr, v
}

func (m deliveryMessage) GetExtension(name string) any {
	v, _ := m.header(cloudEventsAMQP.Prefix() + name)
	return v
}

func (m deliveryMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	version := m.version()
	if version == nil {
		return binding.ErrNotBinary
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	if err := w.SetAttribute(version.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
		return err
	}
	for k, v := range m.d.Headers {
		if !strings.HasPrefix(strings.ToLower(k), cloudEventsAMQP.Prefix()) {
			continue
		}
		if attr := version.Attribute(strings.ToLower(k)); attr != nil {
			if attr.Kind() == spec.SpecVersion {
				continue
			}
			if err := w.SetAttribute(attr, v); err != nil {
				return err
			}
		} else if err := w.SetExtension(strings.ToLower(k[len(cloudEventsAMQP.Prefix()):]), v); err != nil {
			return err
		}
	}
	if err := w.SetData(bytes.NewReader(m.d.Body)); err != nil {
		return err
	}
	return w.End(ctx)
}

func (m deliveryMessage) Finish(error) error { return nil }
