//go:build asynctp_emu

package emu

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const kernelsDir = "../../../../cuda/kernels"

// TestSourcesCurrent fails when the kernel sources changed after
// cuda/kernels/emu/gen.sh last ran: the emulator compiled into this package
// would be stale, and the list of kernels it registers may be too.
func TestSourcesCurrent(t *testing.T) {
	var files []string
	for _, pat := range []string{"*.cu", "*.cuh", "emu/*.h", "emu/*.cc", "emu/*.inc"} {
		m, err := filepath.Glob(filepath.Join(kernelsDir, pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(kernelsDir, f)
			files = append(files, rel)
		}
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(kernelsDir, f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write([]byte(f + "\n"))
		h.Write(data)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != SourcesSum {
		t.Fatalf("the kernel sources changed since cuda/kernels/emu/gen.sh ran (sum %s, recorded %s): run it, then test again", got, SourcesSum)
	}
}

// TestRegistry checks that every kernel defined in the sources is
// registered with the emulator.
func TestRegistry(t *testing.T) {
	re := regexp.MustCompile(`(?m)^(?:KERNEL void ([A-Za-z0-9_]+)\(|KERNEL_LB\(\d+\) ([A-Za-z0-9_]+)\(|ATP_[A-Z0-9_]+\(([a-z][A-Za-z0-9_]*),)`)
	m, _ := filepath.Glob(filepath.Join(kernelsDir, "*.cu"))
	n := 0
	for _, f := range m {
		if strings.HasSuffix(f, "asynctp_kernels.cu") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range re.FindAllStringSubmatch(string(data), -1) {
			name := s[1] + s[2] + s[3]
			n++
			if !HasKernel(name) {
				t.Errorf("kernel %s (%s) is not registered with the emulator: run cuda/kernels/emu/gen.sh", name, filepath.Base(f))
			}
		}
	}
	if n < 50 {
		t.Errorf("found only %d kernels in %s", n, kernelsDir)
	}
}
