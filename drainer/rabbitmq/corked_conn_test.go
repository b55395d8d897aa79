package rabbitmq

import (
	"errors"
	"net"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// recordingConn is a socket that records each write it is given.
type recordingConn struct {
	net.Conn
	writes []string
	fail   error
	closed bool
}

func (c *recordingConn) Write(p []byte) (int, error) {
	if c.fail != nil {
		return 0, c.fail
	}
	c.writes = append(c.writes, string(p))
	return len(p), nil
}

func (c *recordingConn) Close() error { c.closed = true; return nil }

var _ = Describe("The corked broker socket", func() {
	It("holds the writes made while corked, and writes them at once on flush", func() {
		raw := &recordingConn{}
		c := &corkedConn{Conn: raw}
		c.cork()
		for _, m := range []string{"publish 1;", "publish 2;", "publish 3;"} {
			Expect(c.Write([]byte(m))).To(Equal(len(m)))
		}
		Expect(raw.writes).To(BeEmpty())
		Expect(c.flush()).To(Succeed())
		Expect(raw.writes).To(Equal([]string{"publish 1;publish 2;publish 3;"}))
	})

	It("writes straight through once flushed, as a heartbeat between runs of publishes needs", func() {
		raw := &recordingConn{}
		c := &corkedConn{Conn: raw}
		c.cork()
		_, _ = c.Write([]byte("publish;"))
		Expect(c.flush()).To(Succeed())
		_, _ = c.Write([]byte("heartbeat;"))
		Expect(raw.writes).To(Equal([]string{"publish;", "heartbeat;"}))
	})

	It("writes what it holds before it would hold more than its limit, and never copies a large write", func() {
		raw := &recordingConn{}
		c := &corkedConn{Conn: raw}
		c.cork()
		small, large := strings.Repeat("s", 40<<10), strings.Repeat("l", corkLimit)
		_, _ = c.Write([]byte(small))
		_, _ = c.Write([]byte(small))
		Expect(raw.writes).To(HaveLen(1), "the second would take it over the limit")
		_, _ = c.Write([]byte(large))
		Expect(raw.writes).To(HaveLen(3), "the held one, then the large one on its own")
		Expect(raw.writes[2]).To(HaveLen(corkLimit))
	})

	It("closes the socket when a write fails, and fails every write after it", func() {
		raw := &recordingConn{}
		c := &corkedConn{Conn: raw}
		c.cork()
		_, _ = c.Write([]byte("publish;"))
		raw.fail = errors.New("connection reset by peer")
		Expect(c.flush()).To(MatchError("connection reset by peer"))
		Expect(raw.closed).To(BeTrue(), "amqp091's reader sees the connection end, and resolves the confirms as lost")
		_, err := c.Write([]byte("heartbeat;"))
		Expect(err).To(MatchError("connection reset by peer"))
	})
})
