//go:build unix

package image

import (
	"os/exec"
	"syscall"
)

// ownGroup runs cmd in a process group of its own and makes its context's end kill the whole
// group: make's children (go build, the linker) would otherwise outlive a make that is killed,
// and hold its output pipe open, so that Wait never returned (a loaded machine's build ran past
// the test's 9 minutes, and the test hung until go test's own timeout).
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
