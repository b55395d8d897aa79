package drainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// brokerChannel is one AMQP connection with a confirming channel. The claim
// loop publishes on it; the confirm loop alone reads its returns.
type brokerChannel struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	// mandatory asks the broker to return unroutable messages.
	mandatory bool
	// returns is buffered past the pipeline depth: amqp091 delivers a return
	// before the ack of the same message, and a full buffer would drop it.
	returns  chan amqp.Return
	returned map[string]amqp.Return
	// isBlocked is set while the broker has blocked publishing (a memory or
	// disk alarm). RabbitMQ tells a connection when it next publishes.
	isBlocked atomic.Bool
}

// dialBroker connects, enables confirms, and checks (or declares) the
// exchange before anything is claimed, so a missing exchange costs no claims.
// The URL is read afresh, so a rotated password file takes effect here.
// changed is called when the connection closes or is blocked or unblocked.
func dialBroker(cfg BrokerConfig, drainerID string, depth int, log *slog.Logger, changed func()) (*brokerChannel, error) {
	url, err := cfg.Read()
	if err != nil {
		return nil, err
	}
	conn, err := amqp.DialConfig(url, amqp.Config{
		Properties: amqp.Table{"connection_name": "spillway-drainer/" + drainerID},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to broker %s: %w", RedactURL(url), RedactError(err, url))
	}
	b := &brokerChannel{
		conn:      conn,
		exchange:  cfg.Exchange,
		mandatory: cfg.Mandatory,
		returns:   make(chan amqp.Return, depth+1),
		returned:  map[string]amqp.Return{},
	}
	if err := b.open(cfg); err != nil {
		b.close()
		return nil, err
	}
	go b.watch(log, changed)
	return b, nil
}

// watch follows the connection's blocked and closed notifications until it
// closes, so the claim loop stops claiming at once instead of at its next
// publish.
func (b *brokerChannel) watch(log *slog.Logger, changed func()) {
	blocked := b.conn.NotifyBlocked(make(chan amqp.Blocking, 2))
	connClosed := b.conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := b.ch.NotifyClose(make(chan *amqp.Error, 1))
	for {
		select {
		case bl, ok := <-blocked:
			if !ok {
				blocked = nil
				continue
			}
			b.isBlocked.Store(bl.Active)
			if bl.Active {
				log.Warn("Broker blocked publishing; claiming paused", "reason", bl.Reason)
			} else {
				log.Info("Broker unblocked publishing; claiming resumed")
			}
			changed()
		case err := <-connClosed:
			if err != nil {
				log.Warn("Broker closed the connection", "code", err.Code, "reason", err.Reason)
			}
			changed()
			return
		case err, ok := <-chClosed:
			if err != nil {
				log.Warn("Broker closed the channel", "code", err.Code, "reason", err.Reason)
			}
			if ok {
				changed()
			}
			chClosed = nil // closed channels are ready forever
		}
	}
}

func (b *brokerChannel) open(cfg BrokerConfig) error {
	var err error
	if b.ch, err = b.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := b.ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	b.ch.NotifyReturn(b.returns)
	if cfg.Exchange == "" { // the default exchange always exists
		return nil
	}
	if cfg.DeclareExchange {
		if err := b.ch.ExchangeDeclare(cfg.Exchange, cfg.ExchangeType, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %q: %w", cfg.Exchange, err)
		}
		return nil
	}
	if err := b.ch.ExchangeDeclarePassive(cfg.Exchange, cfg.ExchangeType, true, false, false, false, nil); err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
			return fmt.Errorf("exchange %q not found: declare it, or set broker.declareExchange", cfg.Exchange)
		}
		return fmt.Errorf("check exchange %q: %w", cfg.Exchange, err)
	}
	return nil
}

// blocked reports whether the broker is blocking this connection's publishes.
func (b *brokerChannel) blocked() bool { return b.isBlocked.Load() }

// healthy is false once the connection or the channel has closed.
func (b *brokerChannel) healthy() bool {
	return !b.conn.IsClosed() && b.ch != nil && !b.ch.IsClosed()
}

func (b *brokerChannel) publish(ctx context.Context, routingKey string, msg amqp.Publishing) (*amqp.DeferredConfirmation, error) {
	return b.ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, routingKey, b.mandatory, false, msg)
}

// takeReturn reports whether the broker returned the message. Called after
// its confirm arrived, by which time amqp091 has queued any return for it.
func (b *brokerChannel) takeReturn(messageID string) (amqp.Return, bool) {
drain:
	for {
		select {
		case r := <-b.returns:
			b.returned[r.MessageId] = r
		default:
			break drain
		}
	}
	r, ok := b.returned[messageID]
	delete(b.returned, messageID)
	return r, ok
}

func (b *brokerChannel) close() {
	_ = b.conn.Close()
}
