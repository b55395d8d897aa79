package rabbitmq

import (
	"net"
	"sync"
)

// corkedConn is the broker connection's socket with a cork: while corked,
// writes are held in a buffer, and the next flush writes them at once.
// amqp091 flushes its own buffer after every publish; a write for each
// message cost the drainer a system call, and the broker a socket read,
// per message. The drainer corks before each publish and flushes before it
// waits for a confirm, so a run of publishes leaves in one write, and
// nothing is held while anything waits for an answer.
//
// Writes while uncorked go straight through: heartbeats and the replies of
// amqp091's reader are never held for longer than a run of publishes.
type corkedConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
	// err is the first failed write: later writes fail with it, and the
	// socket is closed, so amqp091's reader sees the connection end.
	err error
}

// corkLimit is how much a cork holds before it writes anyway: a few hundred
// small messages, so a large payload is never copied into the buffer.
const corkLimit = 64 << 10

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		return c.writeLocked(p)
	}
	if len(c.buf)+len(p) > corkLimit {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) >= corkLimit {
			return c.writeLocked(p)
		}
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

// cork holds the writes that follow until the next flush.
func (c *corkedConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// flush writes what the cork held, and uncorks.
func (c *corkedConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flushLocked()
}

func (c *corkedConn) flushLocked() error {
	if len(c.buf) == 0 || c.err != nil {
		return c.err
	}
	_, err := c.writeLocked(c.buf)
	c.buf = c.buf[:0]
	return err
}

func (c *corkedConn) writeLocked(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.err = err
		// The messages held are lost with the socket: amqp091 must see the
		// connection end, so that their confirms resolve as lost.
		_ = c.Conn.Close()
	}
	return n, err
}
