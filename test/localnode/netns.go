package localnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// A pod's network namespace is held by an open file of the node's, not by a
// pause process: the namespace lives while the file is open or a container
// runs in it.
//
// Namespaces belong to threads. Every function here that enters a pod's
// namespace does so on a thread of its own, locked, and lets that thread
// end with its goroutine (a locked goroutine that returns without unlocking
// takes its thread with it), so no thread of the Go runtime's pool is ever
// left in a pod's namespace. Sockets keep the namespace they were created
// in, whichever thread uses them later.

// onThreadIn runs fn on a fresh thread that has entered the network
// namespace of ns.
func onThreadIn(ns *os.File, fn func() error) error {
	return onFreshThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return fn()
	})
}

// onFreshThread runs fn on a locked thread that is discarded afterwards.
func onFreshThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread ends with this goroutine.
		done <- fn()
	}()
	return <-done
}

// newNetworkNamespace creates a network namespace whose loopback interface
// is up, and returns a file that holds it.
func newNetworkNamespace() (*os.File, error) {
	var ns *os.File
	err := onFreshThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare network namespace: %w", err)
		}
		if err := loopbackUp(); err != nil {
			return err
		}
		f, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			return fmt.Errorf("open network namespace: %w", err)
		}
		ns = f
		return nil
	})
	return ns, err
}

// loopbackUp brings up lo in the calling thread's network namespace; a new
// namespace has it down, with 127.0.0.1 and ::1 configured.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("read the flags of lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}

// listenIn opens a TCP listener inside the namespace ns.
func listenIn(ns *os.File, addr string) (net.Listener, error) {
	var l net.Listener
	err := onThreadIn(ns, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// dialIn connects to addr from inside the namespace ns: how the node's
// probes reach a container's port.
func dialIn(ctx context.Context, ns *os.File, addr string) (net.Conn, error) {
	var c net.Conn
	err := onThreadIn(ns, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// forwarder gives a pod's namespace the host's loopback services: it
// listens on each address inside the namespace and relays every connection
// to the same address on the host. The local Postgres, RabbitMQ and API
// server listen on 127.0.0.1 only, which a pod's own loopback is not.
type forwarder struct {
	listeners []net.Listener
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	closed    bool
}

func forward(ns *os.File, addrs []string) (*forwarder, error) {
	f := &forwarder{conns: map[net.Conn]struct{}{}}
	for _, addr := range addrs {
		l, err := listenIn(ns, addr)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("forward %s into the pod: %w", addr, err)
		}
		f.listeners = append(f.listeners, l)
		f.wg.Add(1)
		go f.serve(l, addr)
	}
	return f, nil
}

func (f *forwarder) serve(l net.Listener, target string) {
	defer f.wg.Done()
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.relay(in, target)
		}()
	}
}

// relay copies both ways until either side closes.
func (f *forwarder) relay(in net.Conn, target string) {
	out, err := net.Dial("tcp", target)
	if err != nil {
		in.Close()
		return
	}
	if !f.track(in, out) {
		in.Close()
		out.Close()
		return
	}
	defer f.untrack(in, out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Pass the half-close on, as the peer would see it on one socket.
		if tcp, ok := dst.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
	in.Close()
	out.Close()
}

func (f *forwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *forwarder) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		delete(f.conns, c)
	}
}

// close stops listening and cuts every relayed connection.
func (f *forwarder) close() error {
	f.mu.Lock()
	f.closed = true
	var errs []error
	for _, l := range f.listeners {
		errs = append(errs, l.Close())
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	return errors.Join(errs...)
}
