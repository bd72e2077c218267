package nvshmem

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/nativebuild"
)

// TestMain removes the emulated library built for this run.
func TestMain(m *testing.M) {
	code := m.Run()
	if emu.path != "" {
		os.RemoveAll(filepath.Dir(emu.path))
	}
	os.Exit(code)
}

var emu struct {
	once sync.Once
	path string
	err  string
}

// emuLib builds the CPU emulation of the library (cuda/nvshmem/emu) with the
// C compiler, once per test binary, or skips saying why it cannot.
func emuLib(t testing.TB) childLib {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping the emulated multi-process tests")
	}
	emu.once.Do(func() {
		cc, err := exec.LookPath(os.Getenv("CC"))
		if err != nil {
			cc, err = exec.LookPath("cc")
		}
		if err != nil {
			emu.err = "no C compiler (cc) to build the emulated library"
			return
		}
		if _, err := os.Stat("/dev/shm"); err != nil {
			emu.err = "no /dev/shm for the emulated symmetric heaps"
			return
		}
		root, err := nativebuild.RepoRoot()
		if err != nil {
			emu.err = "cannot find the repository: " + err.Error()
			return
		}
		src := filepath.Join(root, "cuda", "nvshmem", "emu", "atp_emu.c")
		dir, err := os.MkdirTemp("", "atp-emu-")
		if err != nil {
			emu.err = err.Error()
			return
		}
		out := filepath.Join(dir, "libatp_emu.so")
		cmd := exec.Command(cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", out, src, "-lrt")
		if b, err := cmd.CombinedOutput(); err != nil {
			emu.err = "building " + src + ": " + err.Error() + "\n" + string(b)
			return
		}
		emu.path = out
	})
	if emu.path == "" {
		t.Skip(emu.err)
	}
	return childLib{path: emu.path, gpus: 1}
}

// TestEmulated runs the multi-process tests against the CPU emulation of
// libasynctp_nvshmem.so: several processes share "one GPU" (NVSHMEM's
// limited MPG mode), so every op runs on the exchange protocol, here
// executed by host threads on shared-memory heaps. It checks the Go side
// end to end (bootstrap, arena, Split and its slots, barriers, every op,
// failures, Close) where there is no GPU; the staging is made tiny so that
// the ops take many rounds.
func TestEmulated(t *testing.T) {
	lib := emuLib(t)
	tiny := stagingEnv + "=" + strconv.Itoa(4096)
	for _, n := range []int{2, 4} {
		t.Run("conformance/pes="+strconv.Itoa(n), func(t *testing.T) {
			runChildren(t, lib, "conformance", n, "auto", 3*time.Minute, tiny)
		})
	}
	t.Run("conformance/pes=3/kernels", func(t *testing.T) {
		runChildren(t, lib, "conformance", 3, "kernels", 3*time.Minute)
	})
	t.Run("put-signal", func(t *testing.T) { runChildren(t, lib, "smoke", 2, "auto", time.Minute) })
	t.Run("symmetric", func(t *testing.T) { runChildren(t, lib, "symmetric", 4, "auto", time.Minute, tiny) })
	t.Run("missing-rank", func(t *testing.T) { runChildren(t, lib, "missing", 2, "auto", time.Minute) })
}
