package testenv

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology is a durable topic exchange with one durable queue bound to it,
// as an application's consumers would have it.
type Topology struct {
	Exchange, Queue string
}

// DeclareTopology declares a fresh exchange and queue, the queue bound with
// bindingKey ("#" for everything). queueArgs may be nil.
func DeclareTopology(ch *amqp.Channel, bindingKey string, queueArgs amqp.Table) (Topology, error) {
	return declareTopology(ch, bindingKey, queueArgs, true)
}

// DeclareMemoryTopology declares a fresh exchange and a queue bound to it
// with "#" that the broker keeps in memory only: the queue is transient and
// exclusive to ch's connection, so a message is confirmed once routed,
// persistent or not, and the broker writes nothing to disk.
func DeclareMemoryTopology(ch *amqp.Channel) (Topology, error) {
	return declareTopology(ch, "#", nil, false)
}

func declareTopology(ch *amqp.Channel, bindingKey string, queueArgs amqp.Table, durable bool) (Topology, error) {
	t := Topology{Exchange: UniqueName("spillway_x"), Queue: UniqueName("spillway_q")}
	if err := ch.ExchangeDeclare(t.Exchange, "topic", durable, false, false, false, nil); err != nil {
		return t, fmt.Errorf("declare exchange: %w", err)
	}
	if _, err := ch.QueueDeclare(t.Queue, durable, false, !durable, false, queueArgs); err != nil {
		return t, fmt.Errorf("declare queue: %w", err)
	}
	if err := ch.QueueBind(t.Queue, bindingKey, t.Exchange, false, nil); err != nil {
		return t, fmt.Errorf("bind queue: %w", err)
	}
	return t, nil
}

// Delete removes the exchange and the queue.
func (t Topology) Delete(ch *amqp.Channel) {
	_, _ = ch.QueueDelete(t.Queue, false, false, false)
	_ = ch.ExchangeDelete(t.Exchange, false, false)
}

// QueueDepth is the number of ready messages in a queue.
func QueueDepth(ch *amqp.Channel, queue string) (int, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// Consume takes up to n messages off a queue, waiting at most timeout.
func Consume(ch *amqp.Channel, queue string, n int, timeout time.Duration) ([]amqp.Delivery, error) {
	if err := ch.Qos(1000, 0, false); err != nil {
		return nil, err
	}
	tag := UniqueName("consumer")
	deliveries, err := ch.Consume(queue, tag, false, true, false, false, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Cancel(tag, false) }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []amqp.Delivery
	for len(got) < n {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return got, fmt.Errorf("consumer closed after %d of %d messages", len(got), n)
			}
			if err := d.Ack(false); err != nil {
				return got, err
			}
			got = append(got, d)
		case <-ctx.Done():
			return got, fmt.Errorf("got %d of %d messages in %s", len(got), n, timeout)
		}
	}
	return got, nil
}
