package scriptcheck

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// noGPUStatus is the status scripts/gpu-env.sh gives a script that finds
// no GPU (scripts/README.md).
const noGPUStatus = 77

// root is the repository root (this package is internal/scriptcheck).
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "scripts", "gpu-env.sh")); err != nil {
		t.Fatalf("the repository root %s has no scripts/gpu-env.sh: %v", r, err)
	}
	return r
}

func needBash(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this machine: the scripts are bash scripts")
	}
}

// gpuScripts are the scripts that source scripts/gpu-env.sh, relative to
// root: every script of scripts/ and cuda/*/ but the sourced files. A
// script named gpu*.sh that does not source it fails the test: it would
// not follow the convention.
func gpuScripts(t *testing.T, root string) []string {
	t.Helper()
	var all []string
	for _, pat := range []string{"scripts/*.sh", "cuda/*/*.sh"} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, m...)
	}
	var gpu []string
	for _, p := range all {
		rel, _ := filepath.Rel(root, p)
		if rel == "scripts/gpu-env.sh" || rel == "scripts/mps.sh" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		sources := bytes.Contains(b, []byte("\n. scripts/gpu-env.sh\n"))
		if strings.HasPrefix(filepath.Base(p), "gpu") && !sources {
			t.Errorf("%s: a GPU script that does not source scripts/gpu-env.sh (the exit-status convention, scripts/README.md)", rel)
		}
		if sources {
			gpu = append(gpu, rel)
		}
	}
	if len(gpu) < 10 {
		t.Fatalf("found %d GPU scripts (%v), expected every scripts/gpu*.sh and cuda/kernels/gpu_check.sh", len(gpu), gpu)
	}
	return gpu
}

// run runs a script under bash with env added, within 20 s, and returns
// its stdout, stderr and exit status.
func run(t *testing.T, dir string, env []string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("bash %v: still running after 20 s (stdout %q, stderr %q)", args, o.String(), e.String())
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		status = ee.ExitCode()
	default:
		t.Fatalf("bash %v: %v", args, err)
	}
	return o.String(), e.String(), status
}

// fakeGPU writes an nvidia-smi that lists one GPU and answers any query,
// and returns its path.
func fakeGPU(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvidia-smi")
	script := "#!/bin/sh\nif [ \"$1\" = -L ]; then echo 'GPU 0: Fake GPU (UUID: GPU-0)'; else echo 'Fake GPU, 0.0, 0 MiB'; fi\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// On a machine without a GPU every GPU script exits with status 77 and one
// line on stderr naming itself, prints nothing on stdout and writes
// nothing into its OUT directory: it tells "cannot run here" from success
// and from a failed step, before it builds or runs anything. The scripts
// find no GPU through ASYNCTP_NVIDIA_SMI pointing at no program, so this
// holds on a machine that has one too.
func TestGPUScriptsWithoutGPU(t *testing.T) {
	needBash(t)
	r := root(t)
	for _, s := range gpuScripts(t, r) {
		t.Run(filepath.Base(s), func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			stdout, stderr, status := run(t, r, []string{"ASYNCTP_NVIDIA_SMI=" + filepath.Join(out, "no-such-nvidia-smi"), "OUT=" + out}, s)
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if status != noGPUStatus || stdout != "" || len(lines) != 1 ||
				!strings.HasPrefix(lines[0], filepath.Base(s)+": no GPU found") {
				t.Fatalf("%s without a GPU: exit %d, stdout %q, stderr %q; want exit %d, no stdout and one line %q",
					s, status, stdout, stderr, noGPUStatus, filepath.Base(s)+": no GPU found ...")
			}
			if left, _ := os.ReadDir(out); len(left) != 0 {
				t.Errorf("%s wrote %d entries into OUT without a GPU, want none", s, len(left))
			}
		})
	}
}

// The convention of scripts/gpu-env.sh on a machine with a (fake) GPU: a
// FAIL, TIMEOUT or NOT-RUN row makes the exit status 1, ok and skipped rows
// leave it 0, an explicit exit keeps its status, a missing input exits 1
// naming it; the summary is printed at exit in every case.
func TestStatusConvention(t *testing.T) {
	needBash(t)
	r := root(t)
	smi := fakeGPU(t)
	for _, tc := range []struct {
		body   string
		status int
		say    string
	}{
		{`row a ok ""; row b skipped "by choice"`, 0, "b"},
		{`row a ok ""; row b FAIL "see b.log"`, 1, "FAIL"},
		{`row a TIMEOUT "after 9 s"`, 1, "TIMEOUT"},
		{`row a NOT-RUN "budget spent"`, 1, "NOT-RUN"},
		{`row a FAIL ""; exit 3`, 3, "FAIL"},
		{`need /no/such/build/train; row never ok ""`, 1, "/no/such/build/train"},
		{`false; row a ok "a failing command alone is not a step"`, 0, "a failing"},
	} {
		script := filepath.Join(t.TempDir(), "check.sh")
		text := "set -uo pipefail\ncd " + r + "\n. scripts/gpu-env.sh\nsummary_on_exit title\n" + tc.body + "\n"
		if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, status := run(t, r, []string{"ASYNCTP_NVIDIA_SMI=" + smi}, script)
		if status != tc.status || !strings.Contains(stdout, "== title") || !strings.Contains(stdout, tc.say) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d and a summary saying %q", tc.body, status, stdout, stderr, tc.status, tc.say)
		}
		if strings.Contains(stdout, "never") {
			t.Errorf("%s: the script went on after a missing input:\n%s", tc.body, stdout)
		}
	}
}

// scripts/gpu.sh on a machine with a (fake) GPU whose kernels do not build
// (NVCC is a compiler that fails) stops with exit status 1, its summary
// naming the failed step: a script whose steps fail never exits 0.
func TestGPUScriptFailsLoudly(t *testing.T) {
	needBash(t)
	r := root(t)
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false(1) on this machine to stand in for a failing nvcc")
	}
	out := t.TempDir()
	stdout, stderr, status := run(t, r, []string{"ASYNCTP_NVIDIA_SMI=" + fakeGPU(t), "NVCC=" + falseBin, "OUT=" + out, "OUT_DIR=" + out}, "scripts/gpu.sh")
	if status != 1 || !strings.Contains(stdout, "kernels (nvcc)") || !strings.Contains(stdout, "FAIL") {
		t.Fatalf("scripts/gpu.sh with a failing nvcc: exit %d, stdout %q, stderr %q; want exit 1 and the FAIL row of the kernels", status, stdout, stderr)
	}
}
