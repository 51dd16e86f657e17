//go:build !unix

package image

import "os/exec"

// ownGroup does nothing where there are no process groups: cmd.WaitDelay bounds the wait.
func ownGroup(*exec.Cmd) {}
