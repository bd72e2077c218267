package nvshmem

import (
	"strings"
	"testing"
)

// TestMissingLibrary: a library named by ASYNCTP_LIBNVSHMEM that is not
// there gives an error naming the file, the variable and the build command.
func TestMissingLibrary(t *testing.T) {
	const bad = "/nonexistent/" + LibraryFile
	t.Setenv(EnvLibrary, bad)
	path, fromEnv, err := FindLibrary()
	if err != nil || path != bad || !fromEnv {
		t.Fatalf("FindLibrary() = %q, %v, %v; want %q from the environment", path, fromEnv, err, bad)
	}
	_, err = openLibrary(path, fromEnv)
	if err == nil {
		t.Fatal("openLibrary of a missing file: no error")
	}
	for _, want := range []string{bad, EnvLibrary, "bash cuda/nvshmem/build.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// Load says the same, unless another test of this process already
	// loaded the real library (which Load then keeps).
	have := loaded.Loaded()
	if have {
		t.Log("a library is already loaded in this process; Load keeps it")
		return
	}
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), EnvLibrary) || !strings.Contains(err.Error(), bad) {
		t.Errorf("Load() with %s=%s: %v, want an error naming both", EnvLibrary, bad, err)
	}
	if _, err := NewDeviceMemory(0); err == nil || !strings.Contains(err.Error(), EnvLibrary) {
		t.Errorf("NewDeviceMemory(0): %v, want the loader's error", err)
	}
}

// TestLibraryNotFound: without the variable, the error lists the places
// searched and the build command.
func TestLibraryNotFound(t *testing.T) {
	t.Setenv(EnvLibrary, "")
	t.Chdir(t.TempDir()) // no go.mod above: no repository build folder
	path, _, err := FindLibrary()
	if err == nil {
		t.Skipf("found %s next to the test binary", path)
	}
	for _, want := range []string{LibraryFile, EnvLibrary, "next to the executable", "bash cuda/nvshmem/build.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestLibraryNotALibrary: a file that is not the library is refused with
// the loader's message.
func TestLibraryNotALibrary(t *testing.T) {
	_, err := openLibrary("/etc/hostname", true)
	if err == nil || !strings.Contains(err.Error(), EnvLibrary) {
		t.Errorf("openLibrary(/etc/hostname): %v, want an error naming %s", err, EnvLibrary)
	}
}
