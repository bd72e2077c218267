package cudabackend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindKernels(t *testing.T) {
	dir := t.TempDir()

	// $ASYNCTP_KERNELS wins, and must exist.
	img := filepath.Join(dir, "img.fatbin")
	if err := os.WriteFile(img, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvKernels, img)
	if p, err := FindKernels(); err != nil || p != img {
		t.Fatalf("FindKernels with $%s set: %q, %v", EnvKernels, p, err)
	}
	t.Setenv(EnvKernels, filepath.Join(dir, "missing.fatbin"))
	if _, err := FindKernels(); err == nil || !strings.Contains(err.Error(), EnvKernels) {
		t.Fatalf("FindKernels with a missing $%s: %v", EnvKernels, err)
	}

	// Unset: the repository's build folder, found from a subfolder.
	t.Setenv(EnvKernels, "")
	repo := filepath.Join(dir, "repo")
	sub := filepath.Join(repo, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	if exe, err := os.Executable(); err == nil {
		if _, err := os.Stat(filepath.Join(filepath.Dir(exe), KernelsFile)); err == nil {
			// Where the test binary sits beside a real image (scripts/gpu.sh
			// builds both into build/), that image is rightly found first.
			t.Skip("an image lies next to the test executable; the not-found case cannot be checked here")
		}
	}
	_, err := FindKernels()
	if err == nil {
		t.Fatal("FindKernels found an image that does not exist")
	}
	for _, want := range []string{EnvKernels, "next to the executable", filepath.Join(repo, "build", KernelsFile), "build.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if err := os.MkdirAll(filepath.Join(repo, "build"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(repo, "build", KernelsFile)
	if err := os.WriteFile(want, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := FindKernels(); err != nil || p != want {
		t.Fatalf("FindKernels in a repository with build/%s: %q, %v", KernelsFile, p, err)
	}
}

func TestBucketSize(t *testing.T) {
	prev := 0
	for n := 1; n < 1<<34; n = n*9/8 + 1 {
		s := bucketSize(n)
		if s < n || s < minBucket {
			t.Fatalf("bucketSize(%d) = %d: too small", n, s)
		}
		if n > minBucket && float64(s) > 1.25*float64(n)+1 {
			t.Fatalf("bucketSize(%d) = %d wastes more than a quarter", n, s)
		}
		if n >= largeBucket && float64(s) > float64(n)*33/32 {
			t.Fatalf("bucketSize(%d) = %d wastes more than 1/32 of a large block", n, s)
		}
		if s < prev {
			t.Fatalf("bucketSize is not monotonic at %d", n)
		}
		if bucketSize(s) != s {
			t.Fatalf("bucketSize(%d) = %d, not a fixed point", s, bucketSize(s))
		}
		prev = s
	}
}
