package localnode

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container starts as a copy of the node's own executable (the test
// binary, or the demo), re-executed with containerSpecEnv set: this init
// function then prepares the container's namespaces and executes the
// container's program in its place, before any test or main function runs.
// The node clones it into a new mount and UTS namespace, and hands it the
// pod's network namespace and a pipe on which to report a failure to start.
const containerSpecEnv = "SPILLWAY_LOCALNODE_CONTAINER"

const (
	netnsFD     = 3 // the pod's network namespace
	startErrFD  = 4 // write end of the start-error pipe; exec closes it
	startFailed = 128
)

// containerSpec is what the container init needs to become the container.
type containerSpec struct {
	Path      string      `json:"path"`
	Args      []string    `json:"args"`
	Env       []string    `json:"env"`
	Dir       string      `json:"dir"`
	Hostname  string      `json:"hostname"`
	UID       int         `json:"uid"`
	GID       int         `json:"gid"`
	Groups    []int       `json:"groups,omitempty"`
	Mounts    []mountSpec `json:"mounts,omitempty"`
	Scratch   string      `json:"scratch"` // a directory of the node's for the mount set-up
	ParentPID int         `json:"parentPID"`
}

// mountSpec bind-mounts Source at Target.
type mountSpec struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func init() {
	raw, ok := os.LookupEnv(containerSpecEnv)
	if !ok {
		return
	}
	// Namespaces and credentials are set on this thread, which then executes
	// the container's program.
	runtime.LockOSThread()
	err := becomeContainer(raw)
	report := os.NewFile(startErrFD, "start-error")
	fmt.Fprintf(report, "%v", err)
	fmt.Fprintf(os.Stderr, "localnode: the container could not start: %v\n", err)
	os.Exit(startFailed)
}

// becomeContainer returns only when it fails.
func becomeContainer(raw string) error {
	var spec containerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("read the container spec: %w", err)
	}
	unix.CloseOnExec(netnsFD)
	unix.CloseOnExec(startErrFD)
	if err := unix.Setns(netnsFD, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the pod's network namespace: %w", err)
	}
	// The node cloned this process into a mount namespace of its own; keep
	// its mounts from propagating back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	// The program, the volumes' sources and the scratch space are on the
	// host, maybe under a path that a mount hides (an emptyDir at /tmp
	// hides the host's /tmp): they are opened first and reached through
	// their file descriptors.
	scratch, err := openPath(spec.Scratch)
	if err != nil {
		return err
	}
	program := spec.Path
	if spec.Path, err = openPath(spec.Path); err != nil {
		return err
	}
	for i := range spec.Mounts {
		if spec.Mounts[i].Source, err = openPath(spec.Mounts[i].Source); err != nil {
			return err
		}
	}
	// Parents before children: /var before /var/run.
	sort.SliceStable(spec.Mounts, func(i, j int) bool { return spec.Mounts[i].Target < spec.Mounts[j].Target })
	m := &mounter{scratch: scratch}
	for _, mnt := range spec.Mounts {
		if err := m.bind(mnt); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fmt.Errorf("set the hostname: %w", err)
	}
	if err := os.Chdir(spec.Dir); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	if err := syscall.Setgroups(spec.Groups); err != nil {
		return fmt.Errorf("supplementary groups %v: %w", spec.Groups, err)
	}
	if err := syscall.Setresgid(spec.GID, spec.GID, spec.GID); err != nil {
		return fmt.Errorf("group %d: %w", spec.GID, err)
	}
	if err := syscall.Setresuid(spec.UID, spec.UID, spec.UID); err != nil {
		return fmt.Errorf("user %d: %w", spec.UID, err)
	}
	// A change of credentials clears the parent-death signal: set it again,
	// so that the container dies with the node even when the node is killed.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	if os.Getppid() != spec.ParentPID {
		return errors.New("the node exited")
	}
	syscall.Umask(0o022)
	err = syscall.Exec(spec.Path, spec.Args, spec.Env)
	return fmt.Errorf("exec %s: %w", program, err)
}

// openPath opens path for reference only, and returns the path of the
// descriptor, which leads to it whatever is mounted over it later.
func openPath(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd), nil
}

// mounter bind-mounts volumes at their paths. A mount point that does not
// exist is made on a tmpfs laid over its nearest existing directory, which
// keeps that directory's entries visible by bind-mounting each of them
// back: nothing is ever created on the host's file systems.
type mounter struct {
	scratch string
	// shadows are the devices of the tmpfs this container laid, where
	// mount points may be created freely.
	shadows []uint64
	n       int
}

func (m *mounter) bind(mnt mountSpec) error {
	info, err := os.Stat(mnt.Source)
	if err != nil {
		return fmt.Errorf("volume source of %s: %w", mnt.Target, err)
	}
	if err := m.mountPoint(mnt.Target, info.IsDir()); err != nil {
		return fmt.Errorf("mount point %s: %w", mnt.Target, err)
	}
	if err := unix.Mount(mnt.Source, mnt.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s at %s: %w", mnt.Source, mnt.Target, err)
	}
	if mnt.ReadOnly {
		if err := unix.Mount("", mnt.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", mnt.Target, err)
		}
	}
	return nil
}

// mountPoint makes sure target exists, as a directory or a file.
func (m *mounter) mountPoint(target string, dir bool) error {
	target = filepath.Clean(target)
	if _, err := os.Stat(target); err == nil {
		return nil
	}
	existing, missing := splitExisting(target)
	if !m.onShadow(existing) {
		if err := m.shadow(existing); err != nil {
			return err
		}
	}
	path := filepath.Join(append([]string{existing}, missing...)...)
	if dir {
		return os.MkdirAll(path, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// splitExisting resolves the longest existing prefix of path, symbolic
// links included, and returns it with the components that do not exist.
func splitExisting(path string) (string, []string) {
	var missing []string
	for {
		if resolved, err := filepath.EvalSymlinks(path); err == nil {
			return resolved, missing
		}
		missing = append([]string{filepath.Base(path)}, missing...)
		path = filepath.Dir(path)
	}
}

func (m *mounter) onShadow(dir string) bool {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return false
	}
	for _, dev := range m.shadows {
		if st.Dev == dev {
			return true
		}
	}
	return false
}

// shadow lays a tmpfs over dir that shows dir's entries as before.
func (m *mounter) shadow(dir string) error {
	if dir == "/" {
		return m.shadowRoot()
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	m.n++
	holder := filepath.Join(m.scratch, fmt.Sprintf("shadow-%d", m.n))
	if err := os.MkdirAll(holder, 0o700); err != nil {
		return err
	}
	// Keep a handle on the original entries, then cover the directory.
	if err := unix.Mount(dir, holder, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("hold %s: %w", dir, err)
	}
	defer unix.Unmount(holder, unix.MNT_DETACH)
	options := fmt.Sprintf("mode=%o,uid=%d,gid=%d", st.Mode&0o7777, st.Uid, st.Gid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, options); err != nil {
		return fmt.Errorf("tmpfs over %s: %w", dir, err)
	}
	entries, err := os.ReadDir(holder)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := restore(filepath.Join(holder, e.Name()), filepath.Join(dir, e.Name()), e); err != nil {
			return fmt.Errorf("show %s over the tmpfs: %w", filepath.Join(dir, e.Name()), err)
		}
	}
	var shadowed unix.Stat_t
	if err := unix.Stat(dir, &shadowed); err != nil {
		return err
	}
	m.shadows = append(m.shadows, shadowed.Dev)
	return nil
}

// shadowRoot is shadow for /: a mount over / is not seen by the process,
// whose root stays where it was, so the new root is built aside, moved
// over /, and entered, as switch_root does.
func (m *mounter) shadowRoot() error {
	root := filepath.Join(m.scratch, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("tmpfs for a new root: %w", err)
	}
	entries, err := os.ReadDir("/")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := restore(filepath.Join("/", e.Name()), filepath.Join(root, e.Name()), e); err != nil {
			return fmt.Errorf("show /%s in the new root: %w", e.Name(), err)
		}
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root over /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("enter the new root: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		return err
	}
	m.shadows = append(m.shadows, st.Dev)
	return nil
}

// restore shows the original entry src at dst: a symbolic link is copied,
// anything else bind-mounted.
func restore(src, dst string, e os.DirEntry) error {
	switch {
	case e.Type()&os.ModeSymlink != 0:
		link, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(link, dst)
	case e.IsDir():
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
	default:
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		f.Close()
	}
	// An entry that vanished since it was listed stays an empty stand-in.
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}
