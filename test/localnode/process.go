package localnode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Spawn starts cmd from a thread that lives as long as this process. A
// child's parent-death signal (SysProcAttr.Pdeathsig) fires when the
// thread that forked it ends, and the Go runtime ends threads that a
// goroutine locked and left, as this package's namespace helpers do: a
// child forked from an ordinary goroutine could be killed at a random
// moment. Every container, and any other process that should die with this
// one, is started here.
func Spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawns = make(chan func())
		go func() {
			runtime.LockOSThread() // for good
			for fn := range spawns {
				fn()
			}
		}()
	})
	done := make(chan error, 1)
	spawns <- func() { done <- cmd.Start() }
	return <-done
}

var (
	spawnOnce sync.Once
	spawns    chan func()
)

// process is one run of a container.
type process struct {
	cmd       *exec.Cmd
	startedAt time.Time
	exited    chan struct{}
	// Set once exited is closed.
	exitCode   int32
	finishedAt time.Time
}

// startProcess starts a container: a copy of this executable that becomes
// the container (see containerinit.go). It returns once the container's
// program runs, or with the reason it could not start.
func startProcess(spec containerSpec, netns *os.File, log io.Writer) (*process, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	errRead, errWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer errRead.Close()
	cmd := &exec.Cmd{
		Path:       self,
		Args:       []string{"localnode-container"},
		Env:        []string{containerSpecEnv + "=" + string(raw)},
		Stdout:     log,
		Stderr:     log,
		ExtraFiles: []*os.File{netns, errWrite},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
			// Its own process group, so that a kill reaches whatever it
			// forked too.
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
		},
	}
	err = Spawn(cmd)
	errWrite.Close()
	if err != nil {
		return nil, fmt.Errorf("start the container: %w", err)
	}
	p := &process{cmd: cmd, startedAt: time.Now(), exited: make(chan struct{})}
	go p.wait()
	// The pipe closes on exec; a message on it is why the start failed.
	why, _ := io.ReadAll(errRead)
	if len(why) > 0 {
		<-p.exited
		return nil, errors.New(string(why))
	}
	return p, nil
}

func (p *process) wait() {
	_ = p.cmd.Wait()
	p.finishedAt = time.Now()
	p.exitCode = exitCode(p.cmd.ProcessState)
	close(p.exited)
}

// exitCode is the status a container runtime reports: the exit code, or
// 128 plus the signal that ended the process.
func exitCode(s *os.ProcessState) int32 {
	if ws, ok := s.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(s.ExitCode())
}

// signal sends sig to the container's program; SIGKILL goes to its whole
// process group.
func (p *process) signal(sig syscall.Signal) {
	pid := p.cmd.Process.Pid
	if sig == syscall.SIGKILL {
		_ = syscall.Kill(-pid, sig)
		return
	}
	_ = syscall.Kill(pid, sig)
}

// stop sends SIGTERM, then SIGKILL if the process has not exited within
// grace, and waits for it to exit.
func (p *process) stop(grace time.Duration) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-p.exited
	}
}

// running says whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}
