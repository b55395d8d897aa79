package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/spillway-io/spillway/drainer/sink"
	"github.com/spillway-io/spillway/outbox"
	"github.com/spillway-io/spillway/secret"
)

const (
	// dialTimeout bounds the TCP connect and the AMQP handshake.
	dialTimeout = 10 * time.Second
	// closeTimeout bounds the close handshake: a broker that blocks the
	// connection (a memory alarm) stops reading it, and would never answer.
	closeTimeout = time.Second
)

// channel is one AMQP connection with a confirming channel: a sink.Sink.
// The claim loop publishes on it and resolves its confirms, so only that
// goroutine touches the return bookkeeping.
type channel struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	// mandatory asks the broker to return unroutable messages.
	mandatory bool
	// shape is what every message carries besides its row.
	shape messageShape
	// limits are what a row is checked against before it is published.
	limits messageLimits
	// returns is buffered past the pipeline depth: amqp091 delivers a return
	// before the ack of the same message, and waits while the buffer is full.
	// amqp091 closes it when the channel closes.
	returns chan amqp.Return
	// returned holds the returns read but not yet matched to their confirm.
	returned map[string]amqp.Return
	// stale is set when a confirm was given up while the broker blocked the
	// connection, which is then kept: its return may still come, and must
	// not be read as the return of a later publish of the same row. The
	// claim loop replaces a stale channel before it publishes again.
	stale atomic.Bool
	// failure receives the channel's or the connection's close reason.
	failure chan *amqp.Error
	lastErr string
	// isBlocked is set while the broker has blocked publishing (a memory or
	// disk alarm). RabbitMQ tells a connection when it next publishes.
	isBlocked atomic.Bool
	// unhook stops the hard stop from cutting the socket's I/O.
	unhook func() bool
	// socket holds a run of publishes until the drainer waits.
	socket *corkedConn
}

// dial connects to one endpoint of the broker, enables confirms, and checks
// (or declares) the exchange before anything is claimed, so a missing
// exchange costs no claims. changed is called when the connection closes
// or is blocked or unblocked. Once hardStop ends, every read and write of
// the connection's socket fails at once, so nothing on it, not even a write
// blocked on a full socket, outlives the shutdown.
func dial(hardStop context.Context, cfg Config, url, drainerID string, depth int, shape messageShape, limits messageLimits,
	log *slog.Logger, changed func()) (*channel, error) {
	amqpCfg, err := connectionConfig(cfg, url, drainerID)
	if err != nil {
		return nil, err
	}
	var unhook func() bool
	var socket *corkedConn
	amqpCfg.Dial = func(network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(hardStop, network, addr)
		if err != nil {
			return nil, err
		}
		// The handshake's deadline (TLS's too); amqp091 clears it once open.
		if err := c.SetDeadline(time.Now().Add(dialTimeout)); err != nil {
			return nil, err
		}
		unhook = context.AfterFunc(hardStop, func() { _ = c.SetDeadline(time.Now()) })
		socket = &corkedConn{Conn: c}
		return socket, nil
	}
	conn, err := amqp.DialConfig(url, amqpCfg)
	if err != nil {
		if unhook != nil {
			unhook()
		}
		return nil, fmt.Errorf("connect to broker %s: %w", secret.RedactURL(url), secret.RedactError(err, url))
	}
	limits.frameMax = conn.Config.FrameSize
	b := &channel{
		conn:      conn,
		exchange:  cfg.Exchange,
		mandatory: cfg.Mandatory,
		shape:     shape,
		limits:    limits,
		returns:   make(chan amqp.Return, depth+1),
		returned:  map[string]amqp.Return{},
		unhook:    unhook,
		socket:    socket,
	}
	if err := b.open(cfg); err != nil {
		b.Close()
		return nil, err
	}
	go b.watch(log, changed)
	return b, nil
}

// watch follows the connection's blocked and closed notifications until it
// closes, so the claim loop stops claiming at once instead of at its next
// publish.
func (b *channel) watch(log *slog.Logger, changed func()) {
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

func (b *channel) open(cfg Config) error {
	var err error
	if b.ch, err = b.conn.Channel(); err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := b.ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	b.ch.NotifyReturn(b.returns)
	// amqp091 tells the channel's listeners why it closed before it resolves
	// the confirms in flight, so a lost confirm finds the reason here.
	b.failure = b.ch.NotifyClose(make(chan *amqp.Error, 1))
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

// Blocked reports whether the broker is blocking this connection's publishes.
func (b *channel) Blocked() bool { return b.isBlocked.Load() }

// Healthy is false once the connection or the channel has closed.
func (b *channel) Healthy() bool {
	return !b.conn.IsClosed() && b.ch != nil && !b.ch.IsClosed()
}

// Stale reports whether a confirm was given up while the broker blocked
// the connection.
func (b *channel) Stale() bool { return b.stale.Load() }

// Prepare builds the row's message, or says why the row cannot be sent.
func (b *channel) Prepare(row outbox.Row, tc sink.Trace) (sink.Message, *sink.RowFault) {
	key, msg, fault := buildMessage(row, tc, b.shape, b.limits)
	if fault != nil {
		return nil, fault
	}
	return &message{routingKey: key, Publishing: msg}, nil
}

// Publish publishes m, held in the socket's cork with the publishes before
// it until Flush.
func (b *channel) Publish(ctx context.Context, m sink.Message) (sink.Delivery, error) {
	msg := m.(*message)
	b.socket.cork()
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, msg.routingKey, b.mandatory, false, msg.Publishing)
	switch {
	case err == nil:
		msg.delivery = delivery{confirm: dc, channel: b, id: msg.MessageId}
		msg.Publishing = amqp.Publishing{}
		return &msg.delivery, nil
	case errors.Is(err, amqp.ErrClosed) || isNetError(err):
		// Closed under it, or the socket failed (the network, or the
		// hard stop cutting it): not the row's doing.
		return nil, fmt.Errorf("%w: %w", sink.ErrDown, err)
	default:
		// amqp091 could not encode what the row holds, and closed the
		// connection: the failure is this row's.
		return nil, err
	}
}

// isNetError is a function of its own so that the target errors.As needs
// is allocated only when a publish fails, not for every publish.
func isNetError(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr)
}

// Flush sends the publishes held since the last flush. A failed write
// closes the socket, and the confirms of what it held resolve as lost.
func (b *channel) Flush() {
	_ = b.socket.flush()
}

// takeReturn reports whether the broker returned the message, and forgets
// its return: it is called for every publish whose confirm is resolved,
// whatever the outcome, so no return outlives its publish. When the confirm
// arrived, amqp091 has already queued any return of the message.
func (b *channel) takeReturn(messageID string) (amqp.Return, bool) {
	b.readReturns()
	r, ok := b.returned[messageID]
	delete(b.returned, messageID)
	return r, ok
}

// readReturns moves the returns amqp091 queued into returned.
func (b *channel) readReturns() {
	for b.returns != nil {
		select {
		case r, ok := <-b.returns:
			if !ok {
				// amqp091 closed it with the channel: a closed channel is
				// always ready, and reading it again would spin.
				b.returns = nil
				return
			}
			b.returned[r.MessageId] = r
		default:
			return
		}
	}
}

// failureReason is why the channel or the connection closed, once it has.
func (b *channel) failureReason() string {
	select {
	case err, ok := <-b.failure:
		if ok && err != nil {
			b.lastErr = err.Error()
		}
	default:
	}
	if b.lastErr == "" {
		return "the channel closed"
	}
	return b.lastErr
}

// Close closes the connection, waiting a moment at most for the broker to
// answer.
func (b *channel) Close() {
	_ = b.conn.CloseDeadline(time.Now().Add(closeTimeout))
	if b.unhook != nil {
		b.unhook()
	}
}
