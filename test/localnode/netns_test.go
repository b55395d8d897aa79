package localnode

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// A listener on the host's loopback is reachable from a pod's namespace
// only through the forwarder, and a port opened inside the namespace is
// reachable from the host only by dialling into the namespace.
func TestForwarderJoinsNamespaceToHostLoopback(t *testing.T) {
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()

	ns, err := newNetworkNamespace()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if c, err := dialIn(ctx, ns, host.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the host's listener is reachable from a fresh namespace without a forwarder")
	}
	f, err := forward(ns, []string{host.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	c, err := dialIn(ctx, ns, host.Addr().String())
	if err != nil {
		t.Fatalf("dial through the forwarder: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the forwarder: %q, %v", buf, err)
	}

	inside, err := listenIn(ns, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if c, err := net.DialTimeout("tcp", inside.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("a port inside the namespace is reachable from the host's loopback")
	}
	c2, err := dialIn(ctx, ns, inside.Addr().String())
	if err != nil {
		t.Fatalf("dial into the namespace: %v", err)
	}
	c2.Close()
}
