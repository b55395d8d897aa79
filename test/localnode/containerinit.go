package localnode

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container starts as a copy of the node's own executable (the test
// binary, or the demo), re-executed with containerSpecEnv set: this init
// function then prepares the container's namespaces and root, and executes
// the container's program in its place, before any test or main function
// runs. The node clones it into a new mount and UTS namespace, and hands it
// the pod's network namespace and a pipe on which to report a failure to
// start.
const containerSpecEnv = "SPILLWAY_LOCALNODE_CONTAINER"

const (
	netnsFD     = 3 // the pod's network namespace
	startErrFD  = 4 // write end of the start-error pipe; exec closes it
	startFailed = 128
)

// containerSpec is what the container init needs to become the container.
type containerSpec struct {
	// Root is the image's unpacked file system, shared by every container
	// of the image: the container sees it through an overlay whose writable
	// layer is its own.
	Root         string      `json:"root"`
	ReadOnlyRoot bool        `json:"readOnlyRoot,omitempty"`
	Hosts        string      `json:"hosts"` // the pod's /etc/hosts
	Path         string      `json:"path"`  // the program, in the image, or a name to find in PATH
	Args         []string    `json:"args"`
	Env          []string    `json:"env"`
	Dir          string      `json:"dir"`
	Hostname     string      `json:"hostname"`
	UID          int         `json:"uid"`
	GID          int         `json:"gid"`
	Groups       []int       `json:"groups,omitempty"`
	Mounts       []mountSpec `json:"mounts,omitempty"`
	Scratch      string      `json:"scratch"` // a directory of the node's for the root's layers
	ParentPID    int         `json:"parentPID"`
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
	// The volumes' sources and the pod's files are on the host, out of the
	// container's root once it is entered: they are opened first and
	// reached through their file descriptors.
	var err error
	for i := range spec.Mounts {
		if spec.Mounts[i].Source, err = openPath(spec.Mounts[i].Source); err != nil {
			return err
		}
	}
	etc := []mountSpec{{Source: spec.Hosts, Target: "/etc/hosts", ReadOnly: true}}
	if _, err := os.Stat("/etc/resolv.conf"); err == nil {
		etc = append(etc, mountSpec{Source: "/etc/resolv.conf", Target: "/etc/resolv.conf", ReadOnly: true})
	}
	for i := range etc {
		if etc[i].Source, err = openPath(etc[i].Source); err != nil {
			return err
		}
	}
	if err := enterRoot(spec.Root, spec.Scratch); err != nil {
		return err
	}
	// Parents before children: /var before /var/run.
	sort.SliceStable(spec.Mounts, func(i, j int) bool { return spec.Mounts[i].Target < spec.Mounts[j].Target })
	for _, mnt := range append(etc, spec.Mounts...) {
		if err := bind(mnt); err != nil {
			return err
		}
	}
	if spec.ReadOnlyRoot {
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make the root file system read-only: %w", err)
		}
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fmt.Errorf("set the hostname: %w", err)
	}
	if err := os.Chdir(spec.Dir); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	program, err := lookPath(spec.Path, spec.Env)
	if err != nil {
		return err
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
	err = syscall.Exec(program, spec.Args, spec.Env)
	return fmt.Errorf("exec %s: %w", program, err)
}

// enterRoot makes the container's root and enters it (chroot): the image's
// files under an overlay whose writable layer is a tmpfs of this
// container's, so that the image's unpacked files, which every container
// of the image shares, are never written; then /proc, a /dev of the usual
// devices, and /sys read-only, as a runtime gives them.
func enterRoot(image, scratch string) error {
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "mode=0700"); err != nil {
		return fmt.Errorf("tmpfs for the container's layer: %w", err)
	}
	upper, work, root := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work"), filepath.Join(scratch, "root")
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	layers := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", image, upper, work)
	if err := unix.Mount("overlay", root, "overlay", 0, layers); err != nil {
		return fmt.Errorf("overlay the image %s: %w", image, err)
	}
	mounts := []struct {
		target, fstype, source, data string
		flags                        uintptr
	}{
		{"proc", "proc", "proc", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
		{"dev", "tmpfs", "tmpfs", "mode=0755", unix.MS_NOSUID},
		{"dev/shm", "tmpfs", "shm", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"sys", "", "/sys", "", unix.MS_BIND | unix.MS_REC},
	}
	for _, m := range mounts {
		target := filepath.Join(root, m.target)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.source, target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount /%s: %w", m.target, err)
		}
	}
	if err := unix.Mount("", filepath.Join(root, "sys"), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("make /sys read-only: %w", err)
	}
	for _, dev := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bind(mountSpec{Source: "/dev/" + dev, Target: filepath.Join(root, "dev", dev)}); err != nil {
			return err
		}
	}
	for link, to := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(to, filepath.Join(root, "dev", link)); err != nil {
			return err
		}
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("enter the container's root: %w", err)
	}
	return os.Chdir("/")
}

// lookPath finds a program by name in the container's PATH, as a runtime
// does for a command without a slash.
func lookPath(program string, env []string) (string, error) {
	if strings.Contains(program, "/") {
		return program, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		candidate := filepath.Join(dir, program)
		if info, err := os.Stat(candidate); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", program)
}

// openPath opens path for reference only, and returns the path of the
// descriptor, which leads to it from inside the container's root too.
func openPath(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd), nil
}

// bind bind-mounts a volume at its path, making the mount point if the
// image lacks it: in the container's own writable layer, as a runtime does.
func bind(mnt mountSpec) error {
	info, err := os.Stat(mnt.Source)
	if err != nil {
		return fmt.Errorf("volume source of %s: %w", mnt.Target, err)
	}
	if err := mountPoint(mnt.Target, info.IsDir()); err != nil {
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
func mountPoint(target string, dir bool) error {
	if _, err := os.Stat(target); err == nil {
		return nil
	}
	if dir {
		return os.MkdirAll(target, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}
