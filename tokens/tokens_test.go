package tokens_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/tokens/tokenstest"
)

func open(spec, format string) (tokenstest.Stream, error) {
	s, err := tokens.Open(spec, tokens.Format(format))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// The conformance suite over the reader: files mapped (Linux), and read
// whole (the fallback of other systems, run here too).
func TestConformance(t *testing.T) {
	t.Run("mapped", func(t *testing.T) {
		if !tokens.CanMap {
			t.Skip("this system's files are read whole, not mapped: the read-whole run covers it")
		}
		tokenstest.Run(t, open)
	})
	t.Run("read whole", func(t *testing.T) {
		defer tokens.SetMapFiles(tokens.SetMapFiles(false))
		tokenstest.Run(t, open)
	})
}

// The package's writers write what the suite's independent writers do,
// byte for byte.
func TestWritersMatchTheSuite(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ids16, ids32 := make([]int32, 777), make([]int32, 555)
	for i := range ids16 {
		ids16[i] = rng.Int32N(1 << 16)
	}
	for i := range ids32 {
		ids32[i] = rng.Int32N(math.MaxInt32)
	}
	wide := func(v []int32) []int64 {
		out := make([]int64, len(v))
		for i, x := range v {
			out[i] = int64(x)
		}
		return out
	}
	for _, c := range []struct {
		name  string
		write func(*bytes.Buffer) error
		want  []byte
	}{
		{"raw uint16", func(b *bytes.Buffer) error { return tokens.WriteRaw(b, ids16, 2) }, tokenstest.Raw(wide(ids16), 2)},
		{"raw uint32", func(b *bytes.Buffer) error { return tokens.WriteRaw(b, ids32, 4) }, tokenstest.Raw(wide(ids32), 4)},
		{"llm.c uint16", func(b *bytes.Buffer) error { return tokens.WriteLLMC(b, ids16, 2) }, tokenstest.LLMC(wide(ids16), 2)},
		{"llm.c uint32", func(b *bytes.Buffer) error { return tokens.WriteLLMC(b, ids32, 4) }, tokenstest.LLMC(wide(ids32), 4)},
	} {
		var b bytes.Buffer
		if err := c.write(&b); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(b.Bytes(), c.want) {
			t.Errorf("%s: %d bytes differ from the suite's %d", c.name, b.Len(), len(c.want))
		}
	}
	dir := t.TempDir()
	for _, width := range []int{2, 4} {
		ds := [][]int32{ids32[:10], {}, ids32[10:300], ids32[300:]}
		if width == 2 {
			ds = [][]int32{ids16[:100], ids16[100:]}
		}
		var wdocs [][]int64
		for _, d := range ds {
			wdocs = append(wdocs, wide(d))
		}
		prefix := filepath.Join(dir, "m")
		if err := tokens.WriteMegatron(prefix, ds, width); err != nil {
			t.Fatal(err)
		}
		code, _ := tokens.MegatronCode(width)
		bin, idx := tokenstest.Megatron(wdocs, code, false)
		for _, f := range []struct {
			ext  string
			want []byte
		}{{".bin", bin}, {".idx", idx}} {
			got, err := os.ReadFile(prefix + f.ext)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, f.want) {
				t.Errorf("Megatron %d-byte ids: %s differs from the suite's", width, f.ext)
			}
		}
	}
	// Ids a width cannot hold are refused.
	if err := tokens.WriteRaw(&bytes.Buffer{}, []int32{1, 70000}, 2); err == nil || !strings.Contains(err.Error(), "70000") {
		t.Errorf("WriteRaw of 70000 as uint16: %v", err)
	}
	if err := tokens.WriteLLMC(&bytes.Buffer{}, []int32{-1}, 4); err == nil {
		t.Errorf("WriteLLMC of -1: no error")
	}
}

// A file truncated while it is mapped makes Read fail with an error, not
// crash the process.
func TestTruncatedWhileMapped(t *testing.T) {
	if !tokens.CanMap {
		t.Skip("this system's files are read whole, not mapped: nothing can shrink under a read")
	}
	path := filepath.Join(t.TempDir(), "shrinks.bin")
	tokenstest.WriteFile(t, path, make([]byte, 1<<20))
	s, err := tokens.Open(path, tokens.Auto)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dst := make([]int32, 100)
	if err := s.Read(dst, 400000); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	err = s.Read(dst, 400000)
	if err == nil || !strings.Contains(err.Error(), "shrinks.bin") || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("read of a truncated mapped file: %v, want an error naming the file", err)
	}
	if err := s.Read(dst[:10], 0); err != nil { // the part still there reads
		t.Fatal(err)
	}
}

func TestMemoryStreams(t *testing.T) {
	b := FromText("abcdefghij")
	if !b.Text() || b.Len() != 10 {
		t.Fatalf("FromBytes: text %v, %d ids", b.Text(), b.Len())
	}
	tail, err := b.Slice(7, 10, "tail")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]int32, 3)
	if err := tail.Read(got, 0); err != nil || got[0] != 'h' || got[2] != 'j' {
		t.Fatalf("slice read %v, %v", got, err)
	}
	if f, p := tail.Locate(1); f != "mem" || p != 8 {
		t.Errorf("Locate(1) of the slice = %s, %d; want mem, 8", f, p)
	}
	if _, err := b.Slice(5, 11, "x"); err == nil {
		t.Errorf("a slice past the end gave no error")
	}
	ids := tokens.FromIDs("ids", []int32{5, 70000, -1, 3})
	if ids.Text() {
		t.Errorf("FromIDs is not text")
	}
	if err := ids.Read(got[:2], 0); err != nil || got[1] != 70000 {
		t.Fatalf("FromIDs read %v, %v", got, err)
	}
	if err := ids.Read(got[:2], 1); err == nil || !strings.Contains(err.Error(), "position 2") {
		t.Errorf("negative id: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tail.Read(got, 0); err == nil {
		t.Errorf("read after Close gave no error")
	}
}

func FromText(s string) *tokens.Stream { return tokens.FromBytes("mem", []byte(s)) }

// Where Auto refuses what a format given explicitly would read (text with
// token ids in one stream; an llm.c magic with another version), Open's
// error wraps ErrMixedKinds or ErrLLMCVersion and speaks of the package's
// API, not of a program's flags; the format given explicitly then reads
// the files.
func TestExplicitFormatErrors(t *testing.T) {
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }
	rng := rand.New(rand.NewPCG(5, 9))
	ids := make([]int64, 60)
	for i := range ids {
		ids[i] = 1 + rng.Int64N(60000)
	}
	tokenstest.WriteFile(t, at("notes.txt"), []byte("twelve bytes"))
	tokenstest.WriteFile(t, at("a.bin"), tokenstest.Raw(ids, 2))
	tokenstest.WriteFile(t, at("v2.bin"), append(tokenstest.LLMCHeader(20240520, 2, int32(len(ids))), tokenstest.Raw(ids, 2)...))
	for _, c := range []struct {
		spec     string
		sentinel error
		explicit tokens.Format
		n        int64 // the ids the explicit format reads
	}{
		{at("notes.txt") + "," + at("a.bin"), tokens.ErrMixedKinds, tokens.Uint16, 6 + 60},
		{at("v2.bin"), tokens.ErrLLMCVersion, tokens.Uint16, 512 + 60},
	} {
		_, err := tokens.Open(c.spec, tokens.Auto)
		if !errors.Is(err, c.sentinel) {
			t.Fatalf("open %s: %v, want an error wrapping %v", c.spec, err, c.sentinel)
		}
		if strings.Contains(err.Error(), "--") {
			t.Errorf("open %s: %q names a program's flag; the package speaks of its own API", c.spec, err)
		}
		s, err := tokens.Open(c.spec, c.explicit)
		if err != nil {
			t.Fatalf("open %s as %s: %v", c.spec, c.explicit, err)
		}
		if s.Len() != c.n {
			t.Errorf("open %s as %s: %d ids, want %d", c.spec, c.explicit, s.Len(), c.n)
		}
		s.Close()
	}
}
