package launch

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts a rank in a process group of its own (a terminal's
// interrupt reaches the launcher, which passes it on) and has the kernel
// kill it if the launcher dies, so that no rank outlives it.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
