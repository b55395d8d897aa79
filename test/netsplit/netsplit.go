// Package netsplit runs a Postgres server on a host of its own, a network
// namespace reached over a veth pair, so that a spec can make the host
// vanish: cut the link, and nothing more crosses it, not even a reset.
// Killing a process or closing a socket cannot show that: the kernel says
// goodbye for them. The server's Unix socket stays reachable through the
// filesystem, so the spec can still ask the server what it holds.
package netsplit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// bin holds the server's binaries, as Debian's postgresql-15 installs them.
const bin = "/usr/lib/postgresql/15/bin"

// port is the server's, inside its own namespace, where nothing else listens.
const port = "5432"

// Server is a Postgres server on the far side of a link.
type Server struct {
	// URL reaches the server over the link, as the database user postgres.
	URL string
	// dir holds the server's data, its log and its Unix socket.
	dir       string
	namespace string
	// link is the host's end of the veth pair.
	link string
}

// Missing says why a server cannot run here, or is empty.
func Missing() string {
	if os.Geteuid() != 0 {
		return "not root: the spec makes a network namespace and a veth pair"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2 is not installed: the spec makes a network namespace with ip netns"
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		return "PostgreSQL 15 is not installed: the spec needs its server binaries"
	}
	return ""
}

// Start makes the namespace and the link, and starts a fresh server in the
// namespace, trusting every client. Names and addresses are the process's
// own, so concurrent runs do not meet. Stop undoes it all.
func Start(ctx context.Context) (*Server, error) {
	removeLeftovers()
	pid := os.Getpid()
	net := fmt.Sprintf("10.%d.%d", 200+pid/250%50, pid%250)
	s := ofProcess(pid)
	s.URL = fmt.Sprintf("postgres://postgres@%s.2:%s/postgres?sslmode=disable", net, port)
	far := fmt.Sprintf("spsplit%df", pid)
	dir, err := os.MkdirTemp("", fmt.Sprintf("spillway-split-%d-", pid))
	if err != nil {
		return nil, err
	}
	s.dir = dir
	data := filepath.Join(dir, "data")
	steps := [][]string{
		{"ip", "netns", "add", s.namespace},
		{"ip", "link", "add", s.link, "type", "veth", "peer", "name", far},
		{"ip", "link", "set", far, "netns", s.namespace},
		{"ip", "addr", "add", net + ".1/30", "dev", s.link},
		{"ip", "link", "set", s.link, "up"},
		{"ip", "-n", s.namespace, "addr", "add", net + ".2/30", "dev", far},
		{"ip", "-n", s.namespace, "link", "set", far, "up"},
		{"ip", "-n", s.namespace, "link", "set", "lo", "up"},
		{"chown", "postgres", dir},
		{"runuser", "-u", "postgres", "--", filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres"},
		{"sh", "-c", "echo 'host all all 0.0.0.0/0 trust' >> " + filepath.Join(data, "pg_hba.conf")},
		{"ip", "netns", "exec", s.namespace, "runuser", "-u", "postgres", "--", filepath.Join(bin, "pg_ctl"), "-D", data,
			"-l", filepath.Join(dir, "log"), "-w", "-o",
			fmt.Sprintf("-c listen_addresses=%s.2 -c port=%s -c unix_socket_directories=%s -c fsync=off", net, port, dir), "start"},
	}
	for _, step := range steps {
		if err := run(ctx, step...); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return s, nil
}

// ofProcess is the server of the test process pid, as far as names go.
func ofProcess(pid int) *Server {
	return &Server{namespace: fmt.Sprintf("spillway-split-%d", pid), link: fmt.Sprintf("spsplit%dh", pid)}
}

// removeLeftovers stops the servers of test processes that ended without
// stopping theirs (a run killed at its timeout), whose namespaces, links
// and server processes would otherwise stay until the machine restarts.
func removeLeftovers() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "spillway-split-*-*"))
	for _, dir := range dirs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(dir), "spillway-split-%d-", &pid); err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its process still runs, and stops it
		}
		s := ofProcess(pid)
		s.dir = dir
		s.Stop()
	}
}

// Cut takes the host's end of the link down: from then on the server's
// packets to this host, and this host's to it, are dropped unseen.
func (s *Server) Cut(ctx context.Context) error {
	return run(ctx, "ip", "link", "set", s.link, "down")
}

// Local opens a pool on the server's Unix socket, which the cut leaves
// open.
func (s *Server) Local(ctx context.Context) (*pgxpool.Pool, error) {
	return pgxpool.New(ctx, fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres", s.dir, port))
}

// Stop stops the server and removes the namespace, the link and the
// server's files, whatever of them Start made.
func (s *Server) Stop() {
	ctx := context.Background()
	data := filepath.Join(s.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		_ = run(ctx, "runuser", "-u", "postgres", "--", filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
	}
	_ = run(ctx, "ip", "link", "del", s.link)
	_ = run(ctx, "ip", "netns", "del", s.namespace)
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func run(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}
