package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer/sink"
)

// message is a row as an AMQP message, with its routing key. It carries
// the delivery its publish becomes, so that a row costs one allocation here,
// not two; once written, the message lets go of its payload.
type message struct {
	routingKey string
	amqp.Publishing
	delivery delivery
}

func (m *message) Size() int64 { return int64(len(m.Body)) }

// delivery is one publish awaiting its confirm.
type delivery struct {
	confirm *amqp.DeferredConfirmation
	channel *channel
	// id is the message_id: a return names its message by it.
	id string
}

func (d *delivery) Done() <-chan struct{} { return d.confirm.Done() }

// Outcome classifies the confirm: an ack is Confirmed, unless the message
// came back (Refused); a nack is the broker pushing back, unless the channel
// closed (amqp091 resolves pending confirms as nacks then), which is Lost.
func (d *delivery) Outcome() sink.Outcome {
	ret, returned := d.channel.takeReturn(d.id)
	if !d.confirm.Acked() {
		if d.channel.ch.IsClosed() {
			return sink.Outcome{Kind: sink.Lost, Detail: d.channel.failureReason()}
		}
		return sink.Outcome{Kind: sink.PushedBack}
	}
	if returned {
		return sink.Outcome{Kind: sink.Refused, Reason: reasonReturned,
			Detail: fmt.Sprintf("broker returned the message: %d %s (exchange %q, routing key %q)", ret.ReplyCode, ret.ReplyText, ret.Exchange, ret.RoutingKey)}
	}
	return sink.Outcome{Kind: sink.Confirmed}
}

// GiveUp forgets the delivery's return, so that one arriving late is not
// read as the return of a later publish of the same row. A channel that
// stalls past the deadline is not trusted again, and the claim loop
// reconnects; unless the broker blocked it, which explains the stall, and a
// new connection would only block again: then it is replaced once the
// broker unblocks.
func (d *delivery) GiveUp(timedOut bool) {
	d.channel.takeReturn(d.id)
	if !timedOut {
		return
	}
	if d.channel.Blocked() {
		d.channel.stale.Store(true)
	} else {
		d.channel.Close()
	}
}
