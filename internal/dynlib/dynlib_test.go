package dynlib

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

var spec = Spec{Package: "pkg", Env: "ASYNCTP_LIBTEST", Hint: "it comes with the test"}

// A library that does not open gives one error style, naming the first
// path, the variable and the hint, with dlerror's text; said otherwise
// when the variable named it.
func TestOpenErrors(t *testing.T) {
	_, err := Open(spec, []string{"libasynctp-no-such-lib.so.1", "/nonexistent/libasynctp-no-such-lib.so.1"}, false)
	want := "pkg: cannot load libasynctp-no-such-lib.so.1 (set ASYNCTP_LIBTEST to its path; it comes with the test): "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "libasynctp-no-such-lib.so.1: cannot open shared object file") {
		t.Errorf("got %v, want %q and dlerror's text about the first path", err, want)
	}
	_, err = Open(spec, []string{"/nonexistent/lib.so"}, true)
	want = "pkg: cannot load /nonexistent/lib.so (named by ASYNCTP_LIBTEST; it comes with the test): "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("got %v, want %q and dlerror's text", err, want)
	}
	if _, err := Open(spec, nil, false); err == nil || !strings.Contains(err.Error(), "ASYNCTP_LIBTEST") {
		t.Errorf("no paths: %v, want an error naming the variable", err)
	}
	// A file that is not a shared object.
	if _, err := Open(spec, []string{"/etc/hostname"}, true); err == nil || !strings.Contains(err.Error(), "cannot load /etc/hostname (named by ASYNCTP_LIBTEST") {
		t.Errorf("not a library: %v", err)
	}
}

// Open takes the first path that loads; a missing symbol is said in the
// same style, naming the library and the variable.
func TestOpenFallbackAndMissingSymbol(t *testing.T) {
	l, err := Open(spec, []string{"/nonexistent/libc.so.6", "libc.so.6"}, false)
	if err != nil {
		t.Skipf("no libc.so.6 to test with: %v", err)
	}
	defer l.Close()
	if l.Path != "libc.so.6" || l.Handle == nil {
		t.Errorf("opened %q (handle %v), want libc.so.6", l.Path, l.Handle)
	}
	err = l.MissingSymbol("cuInit", "the NVIDIA driver's libcuda.so.1")
	want := "pkg: libc.so.6 has no symbol cuInit (expected the NVIDIA driver's libcuda.so.1; set ASYNCTP_LIBTEST to another file)"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	l.Close()
	l.Close() // a second Close does nothing
}

func TestCandidates(t *testing.T) {
	t.Setenv("ASYNCTP_LIBTEST", "")
	if p, env := Candidates("ASYNCTP_LIBTEST", "a.so", "b.so"); env || !slices.Equal(p, []string{"a.so", "b.so"}) {
		t.Errorf("unset: %v, %v; want the defaults", p, env)
	}
	t.Setenv("ASYNCTP_LIBTEST", "/x/c.so")
	if p, env := Candidates("ASYNCTP_LIBTEST", "a.so"); !env || !slices.Equal(p, []string{"/x/c.so"}) {
		t.Errorf("set: %v, %v; want the variable's path alone", p, env)
	}
}

// The cache keeps the first library that installs, remembers a failure per
// path without trying it again, and tries another path.
func TestCache(t *testing.T) {
	var c Cache[string]
	installs := 0
	path := "a.so"
	find := func() (string, bool, error) { return path, false, nil }
	install := func(p string, _ bool) (string, error) {
		installs++
		if p == "a.so" {
			return "", errors.New("a.so is broken")
		}
		return "lib:" + p, nil
	}
	for range 2 {
		if _, err := c.Load(find, install); err == nil || err.Error() != "a.so is broken" {
			t.Fatalf("Load(a.so): %v, want its failure", err)
		}
	}
	if installs != 1 || c.Loaded() {
		t.Fatalf("after two failed loads of one path: %d installs (want 1), loaded %v", installs, c.Loaded())
	}
	path = "b.so"
	if l, err := c.Load(find, install); err != nil || l != "lib:b.so" || !c.Loaded() {
		t.Fatalf("Load(b.so): %q, %v", l, err)
	}
	path = "c.so"
	if l, err := c.Load(find, install); err != nil || l != "lib:b.so" || installs != 2 {
		t.Fatalf("Load after one loaded: %q, %v, %d installs; want the kept library, no install", l, err, installs)
	}
}
