package testenv

import (
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Ledger consumes a queue for as long as a suite runs and counts each
// message by its message_id, which a drainer sets to the row's id: so
// every event can be accounted for, lost or delivered more than once.
type Ledger struct {
	ch  *amqp.Channel
	tag string

	mu      sync.Mutex
	seen    map[string]int
	total   int
	last    time.Time
	latest  amqp.Delivery // the last message, without its body
	stopped bool
	err     error
	done    chan struct{}
}

// StartLedger consumes queue on its own channel of conn, acknowledging each
// message once it is counted.
func StartLedger(conn *amqp.Connection, queue string) (*Ledger, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		ch.Close()
		return nil, err
	}
	l := &Ledger{ch: ch, tag: UniqueName("ledger"), seen: map[string]int{}, done: make(chan struct{})}
	deliveries, err := ch.Consume(queue, l.tag, false, true, false, false, nil)
	if err != nil {
		ch.Close()
		return nil, fmt.Errorf("consume %s: %w", queue, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		defer close(l.done)
		defer func() {
			l.mu.Lock()
			if !l.stopped {
				l.err = fmt.Errorf("the ledger's consumer of %s stopped: %v", queue, <-closed)
			}
			l.mu.Unlock()
		}()
		for d := range deliveries {
			l.mu.Lock()
			l.seen[d.MessageId]++
			l.total++
			l.last = time.Now()
			l.latest, l.latest.Body = d, nil
			l.mu.Unlock()
			_ = d.Ack(false)
		}
	}()
	return l, nil
}

// Stop cancels the consumer.
func (l *Ledger) Stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	_ = l.ch.Cancel(l.tag, false)
	<-l.done
	_ = l.ch.Close()
}

// Account says, of the events with these ids, how many never arrived and
// how many extra copies arrived.
func (l *Ledger) Account(ids []string) (lost []string, duplicates int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return account(l.seen, ids)
}

// account says, of ids, which were never counted and how many extra times
// the others were.
func account(counts map[string]int, ids []string) (lost []string, duplicates int) {
	for _, id := range ids {
		switch n := counts[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			duplicates += n - 1
		}
	}
	return lost, duplicates
}

// Missing is how many of ids have not arrived yet, or an error if the
// ledger stopped consuming (its connection was closed): then what is
// missing may be in the queue.
func (l *Ledger) Missing(ids []string) (int, error) {
	lost, _ := l.Account(ids)
	return len(lost), l.Err()
}

// Err says why the ledger stopped consuming before Stop.
func (l *Ledger) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Total is how many messages arrived in all.
func (l *Ledger) Total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Latest is the last message that arrived, without its body.
func (l *Ledger) Latest() amqp.Delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latest
}

// Quiet says how long ago the last message arrived.
func (l *Ledger) Quiet() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.last)
}
