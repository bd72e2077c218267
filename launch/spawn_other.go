//go:build !linux

package launch

import "os/exec"

// setProcAttr: only Linux can tie a rank's life to the launcher's.
func setProcAttr(cmd *exec.Cmd) {}
