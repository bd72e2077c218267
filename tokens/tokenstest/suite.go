package tokenstest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Stream is what the suite reads: package tokens' *Stream.
type Stream interface {
	Name() string
	Len() int64
	Read(dst []int32, pos int64) error
	Close() error
}

// Opener opens spec (a file, a list, a directory or a pattern) in format
// ("auto" to detect), as tokens.Open does.
type Opener func(spec, format string) (Stream, error)

// Run runs the conformance suite of a reader: every format, written by
// this package's writers, reads back equal (whole, and in windows at
// random positions that cross files), detected and named explicitly; ids
// past 65 535 and up to 2³¹−1; a Megatron int32 dataset of a 70 000-id
// vocabulary; the order of lists, directories and patterns; and bad
// files, refused with an error that names the file and what is wrong.
func Run(t *testing.T, open Opener) {
	t.Run("formats", func(t *testing.T) { testFormats(t, open) })
	t.Run("order", func(t *testing.T) { testOrder(t, open) })
	t.Run("bad files", func(t *testing.T) { testBadFiles(t, open) })
	t.Run("bad ids", func(t *testing.T) { testBadIDs(t, open) })
}

// ids are n random ids below limit, with the edge values that fit put
// in at random places.
func ids(rng *rand.Rand, n int, limit int64, edges ...int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = rng.Int64N(limit)
	}
	for _, e := range edges {
		if e < limit {
			out[rng.IntN(n)] = e
		}
	}
	return out
}

// docs cuts v into documents of random lengths, some of them empty.
func docs(rng *rand.Rand, v []int64) [][]int64 {
	var out [][]int64
	for len(v) > 0 {
		n := min(len(v), rng.IntN(40))
		out = append(out, v[:n])
		v = v[n:]
	}
	return out
}

// Check opens spec and compares it with want: its length, all of it, and
// windows at random positions; a read past the end must fail.
func Check(t *testing.T, open Opener, spec, format string, want []int64) {
	t.Helper()
	s, err := open(spec, format)
	if err != nil {
		t.Fatalf("open %s as %s: %v", spec, format, err)
	}
	defer s.Close()
	if s.Len() != int64(len(want)) {
		t.Fatalf("%s as %s: %d ids, want %d", spec, format, s.Len(), len(want))
	}
	got := make([]int32, len(want))
	for i := range got {
		got[i] = -7 // poison: every id must be written
	}
	if err := s.Read(got, 0); err != nil {
		t.Fatalf("%s as %s: %v", spec, format, err)
	}
	for i, v := range want {
		if int64(got[i]) != v {
			t.Fatalf("%s as %s: id %d is %d, want %d", spec, format, i, got[i], v)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(len(want)), 7))
	for range 50 {
		n := rng.IntN(min(len(want), 300) + 1)
		pos := rng.IntN(len(want) - n + 1)
		w := make([]int32, n)
		if err := s.Read(w, int64(pos)); err != nil {
			t.Fatalf("%s: read %d at %d: %v", spec, n, pos, err)
		}
		for i := range w {
			if int64(w[i]) != want[pos+i] {
				t.Fatalf("%s: read %d at %d: id %d is %d, want %d", spec, n, pos, pos+i, w[i], want[pos+i])
			}
		}
	}
	if err := s.Read(make([]int32, 2), int64(len(want))-1); err == nil {
		t.Errorf("%s: a read past the end gave no error", spec)
	}
}

func testFormats(t *testing.T, open Opener) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(28, 1))
	at := func(name string) string { return filepath.Join(dir, name) }
	text := []byte("Token files of every format, read back as the ids they hold.\n")
	bytesIDs := make([]int64, len(text))
	for i, c := range text {
		bytesIDs[i] = int64(c)
	}
	ids16 := ids(rng, 3001, 1<<16, 0, 65535, 65534)
	ids32 := ids(rng, 2999, math.MaxInt32+1, 0, 65535, 65536, 69999, math.MaxInt32)
	vocab70k := ids(rng, 4001, 70000, 0, 65535, 65536, 69999)

	type tc struct {
		name, spec, format string
		auto               bool // detected as format
		want               []int64
	}
	var cases []tc
	add := func(name string, b []byte, format string, auto bool, want []int64) {
		WriteFile(t, at(name), b)
		cases = append(cases, tc{name, at(name), format, auto, want})
	}
	add("corpus.txt", text, "text", true, bytesIDs)
	add("tokens.bin", Raw(ids16, 2), "uint16", true, ids16)
	add("tokens.u16", Raw(ids16, 2), "uint16", true, ids16)
	add("tokens16.dat", Raw(ids16, 2), "uint16", false, ids16)
	add("tokens.u32", Raw(ids32, 4), "uint32", true, ids32)
	add("tokens32.dat", Raw(ids32, 4), "uint32", false, ids32)
	add("gpt2_shard.bin", LLMC(ids16, 2), "llmc", true, ids16)
	add("llama3_shard.bin", LLMC(ids32, 4), "llmc", true, ids32)
	// A format given explicitly is used as given: the shard's header read
	// as raw ids.
	hdr := LLMC(ids16, 2)
	asRaw := make([]int64, len(hdr)/2)
	for i := range asRaw {
		asRaw[i] = int64(hdr[2*i]) | int64(hdr[2*i+1])<<8
	}
	cases = append(cases, tc{"llm.c shard read as raw uint16", at("gpt2_shard.bin"), "uint16", false, asRaw})

	for _, m := range []struct {
		prefix string
		code   uint8
		v      []int64
		modes  bool
	}{
		{"meg_uint16_text_document", 8, ids16, false},
		{"meg_int32_vocab70k", 4, vocab70k, false},
		{"meg_uint8", 1, ids(rng, 500, 256, 0, 255), false},
		{"meg_int8", 2, ids(rng, 500, 128, 0, 127), false},
		{"meg_int16", 3, ids(rng, 500, 1<<15, 0, 32767), false},
		{"meg_int64", 5, ids(rng, 500, math.MaxInt32+1, 0, math.MaxInt32), false},
		{"meg_multimodal", 4, vocab70k, true},
	} {
		bin, idx := Megatron(docs(rng, m.v), m.code, m.modes)
		WriteFile(t, at(m.prefix+".bin"), bin)
		WriteFile(t, at(m.prefix+".idx"), idx)
		for _, spec := range []string{m.prefix, m.prefix + ".bin", m.prefix + ".idx"} {
			cases = append(cases, tc{spec, at(spec), "megatron", true, m.v})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			Check(t, open, c.spec, c.format, c.want)
			if c.auto {
				Check(t, open, c.spec, "auto", c.want)
				s, err := open(c.spec, "auto")
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if kind := strings.ReplaceAll(c.format, "llmc", "llm.c"); !strings.Contains(s.Name(), kind) {
					t.Errorf("%s detected: named %q, which does not say %s", c.spec, s.Name(), kind)
				}
			}
		})
	}
}

func testOrder(t *testing.T, open Opener) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(28, 2))
	at := func(name string) string { return filepath.Join(dir, name) }
	a, b, c := ids(rng, 100, 1<<16), ids(rng, 77, 1<<20, 65536), ids(rng, 130, 70000)
	WriteFile(t, at("a.bin"), Raw(a, 2))
	WriteFile(t, at("b.u32"), Raw(b, 4))
	WriteMegatron(t, at("c"), docs(rng, c), 4)
	cat := func(parts ...[]int64) []int64 { return slices.Concat(parts...) }
	t.Run("list", func(t *testing.T) {
		Check(t, open, at("b.u32")+","+at("c")+","+at("a.bin"), "auto", cat(b, c, a))
		Check(t, open, at("a.bin")+","+at("a.bin"), "auto", cat(a, a))
	})

	// A directory: by name, byte-wise (s1 < s10 < s2), a Megatron pair as
	// one dataset at its .bin's place, hidden files left out.
	d := at("shards")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	s1, s2, s10, m := ids(rng, 60, 1<<16), ids(rng, 61, 1<<16), ids(rng, 62, 1<<16), ids(rng, 63, 1<<16)
	WriteFile(t, filepath.Join(d, "s2.bin"), LLMC(s2, 2))
	WriteFile(t, filepath.Join(d, "s10.bin"), Raw(s10, 2))
	WriteFile(t, filepath.Join(d, "s1.bin"), LLMC(s1, 4))
	WriteMegatron(t, filepath.Join(d, "m"), docs(rng, m), 8)
	WriteFile(t, filepath.Join(d, ".partial.bin"), []byte{1, 2, 3})
	t.Run("directory", func(t *testing.T) { Check(t, open, d, "auto", cat(m, s1, s10, s2)) })
	t.Run("pattern", func(t *testing.T) {
		Check(t, open, filepath.Join(d, "s*.bin"), "auto", cat(s1, s10, s2))
		Check(t, open, filepath.Join(d, "*"), "auto", cat(m, s1, s10, s2))
		Check(t, open, filepath.Join(d, "s1*.bin")+","+at("a.bin"), "auto", cat(s1, s10, a))
	})

	empty := at("empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	nested := at("nested")
	if err := os.MkdirAll(filepath.Join(nested, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	WriteFile(t, filepath.Join(nested, "x.bin"), Raw(a, 2))
	WriteFile(t, at("notes.txt"), []byte("some text"))
	for _, e := range []struct {
		spec, format, name string
		want               []string
	}{
		{empty, "auto", "empty directory", []string{empty, "no files"}},
		{nested, "auto", "subdirectory", []string{nested, "sub"}},
		{at("*.parquet"), "auto", "pattern without match", []string{"*.parquet", "matches no file"}},
		{at("a.bin") + ",," + at("a.bin"), "auto", "empty list element", []string{"empty element"}},
		{at("notes.txt") + "," + at("a.bin"), "auto", "text with ids", []string{"notes.txt", "a.bin", "mixes text"}},
		{at("a.bin"), "parquet", "unknown format", []string{"parquet", "unknown data format"}},
	} {
		t.Run(e.name, func(t *testing.T) { wantOpenError(t, open, e.spec, e.format, e.want...) })
	}
}

// wantOpenError checks that open refuses spec with an error holding every
// one of want.
func wantOpenError(t *testing.T, open Opener, spec, format string, want ...string) {
	t.Helper()
	s, err := open(spec, format)
	if err == nil {
		s.Close()
		t.Fatalf("open %s as %s: no error, want one saying %q", spec, format, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("open %s as %s: error %q does not say %q", spec, format, err, w)
		}
	}
}

func testBadFiles(t *testing.T, open Opener) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(28, 3))
	at := func(name string) string { return filepath.Join(dir, name) }
	v := ids(rng, 50, 1<<16)
	good := LLMC(v, 2)
	bin, idx := Megatron(docs(rng, v), 4, false)
	type bad struct {
		name, format string
		files        map[string][]byte
		spec         string // default: the first file's name
		want         []string
	}
	le32 := func(b []byte, off int, x uint32) []byte {
		b = slices.Clone(b)
		b[off], b[off+1], b[off+2], b[off+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
		return b
	}
	cases := []bad{
		{name: "missing", format: "auto", spec: "nope.bin", want: []string{"nope.bin", "does not exist"}},
		{name: "empty text", format: "auto", files: map[string][]byte{"empty.txt": nil}, spec: "empty.txt", want: []string{"empty.txt", "empty"}},
		{name: "empty uint16", format: "auto", files: map[string][]byte{"empty.bin": nil}, spec: "empty.bin", want: []string{"empty.bin", "empty"}},
		{name: "odd uint16", format: "auto", files: map[string][]byte{"odd.bin": {1, 2, 3}}, spec: "odd.bin", want: []string{"odd.bin", "odd length of 3 bytes"}},
		{name: "uint32 of 6 bytes", format: "auto", files: map[string][]byte{"six.u32": make([]byte, 6)}, spec: "six.u32", want: []string{"six.u32", "6 bytes", "multiple of 4"}},
		{name: "llm.c truncated", format: "auto", files: map[string][]byte{"cut.bin": good[:len(good)-1]}, spec: "cut.bin", want: []string{"cut.bin", "truncated"}},
		{name: "llm.c too long", format: "auto", files: map[string][]byte{"long.bin": append(slices.Clone(good), 0, 0)}, spec: "long.bin", want: []string{"long.bin", "50 uint16 tokens"}},
		{name: "llm.c version", format: "auto", files: map[string][]byte{"v2.bin": le32(good, 4, 2)}, spec: "v2.bin", want: []string{"v2.bin", "version 2"}},
		{name: "llm.c no tokens", format: "auto", files: map[string][]byte{"none.bin": LLMCHeader(20240520, 1, 0)}, spec: "none.bin", want: []string{"none.bin", "0 tokens"}},
		{name: "llm.c short header", format: "llmc", files: map[string][]byte{"short.bin": good[:100]}, spec: "short.bin", want: []string{"short.bin", "shorter than", "header"}},
		{name: "llm.c format on a raw file", format: "llmc", files: map[string][]byte{"raw.bin": Raw(ids(rng, 600, 1<<16), 2)}, spec: "raw.bin", want: []string{"raw.bin", "not an llm.c shard"}},
		{name: "megatron magic", format: "auto", files: map[string][]byte{"m.bin": bin, "m.idx": append([]byte("MMIDIDY"), idx[7:]...)}, spec: "m", want: []string{"m.idx", "magic"}},
		{name: "megatron version", format: "auto", files: map[string][]byte{"m.bin": bin, "m.idx": le32(idx, 9, 2)}, spec: "m", want: []string{"m.idx", "version 2"}},
		{name: "megatron float dtype", format: "auto", files: map[string][]byte{"m.bin": bin, "m.idx": func() []byte { b := slices.Clone(idx); b[17] = 7; return b }()}, spec: "m", want: []string{"m.idx", "dtype code 7"}},
		{name: "megatron index truncated", format: "auto", files: map[string][]byte{"m.bin": bin, "m.idx": idx[:len(idx)-8]}, spec: "m", want: []string{"m.idx", "truncated"}},
		{name: "megatron data truncated", format: "auto", files: map[string][]byte{"m.bin": bin[:len(bin)-4], "m.idx": idx}, spec: "m.bin", want: []string{"m.bin", "truncated"}},
		{name: "megatron without data", format: "auto", files: map[string][]byte{"m.idx": idx}, spec: "m.idx", want: []string{"m.bin", "does not exist"}},
		{name: "megatron without index", format: "megatron", files: map[string][]byte{"m.bin": bin}, spec: "m.bin", want: []string{"m.idx", "does not exist"}},
		{name: "megatron document indices", format: "auto", files: map[string][]byte{"m.bin": bin, "m.idx": le32(idx, len(idx)-8, 99)}, spec: "m", want: []string{"m.idx", "document indices"}},
		{name: "megatron empty", format: "auto", files: map[string][]byte{"e.bin": nil, "e.idx": func() []byte { _, i := Megatron(nil, 4, false); return i }()}, spec: "e", want: []string{"e.idx", "empty"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sub := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			for n, b := range c.files {
				WriteFile(t, filepath.Join(sub, n), b)
			}
			wantOpenError(t, open, filepath.Join(sub, c.spec), c.format, c.want...)
		})
	}
	_ = at
}

func testBadIDs(t *testing.T, open Opener) {
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }
	ok := func(n int) []int64 {
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(i % 1000)
		}
		return v
	}
	set := func(v []int64, i int, x int64) []int64 { v[i] = x; return v }
	WriteFile(t, at("big.u32"), Raw(set(ok(40), 5, math.MaxInt32+1), 4))
	WriteFile(t, at("big_llmc.bin"), LLMC(set(ok(40), 6, math.MaxUint32), 4))
	WriteMegatron(t, at("neg32"), [][]int64{ok(10), set(ok(20), 7, -3)}, 4)
	WriteMegatron(t, at("neg16"), [][]int64{set(ok(30), 8, -2)}, 3)
	WriteMegatron(t, at("neg8"), [][]int64{set(ok(30), 9, -1)}, 2)
	WriteMegatron(t, at("big64"), [][]int64{set(ok(30), 10, 1<<40)}, 5)
	for _, c := range []struct {
		spec, file string
		pos        int
		val        string
	}{
		{at("big.u32"), "big.u32", 5, fmt.Sprint(int64(math.MaxInt32 + 1))},
		{at("big_llmc.bin"), "big_llmc.bin", 6, fmt.Sprint(int64(math.MaxUint32))},
		{at("neg32"), "neg32.bin", 17, "-3"},
		{at("neg16"), "neg16.bin", 8, "-2"},
		{at("neg8"), "neg8.bin", 9, "-1"},
		{at("big64"), "big64.bin", 10, fmt.Sprint(int64(1 << 40))},
	} {
		t.Run(c.file, func(t *testing.T) {
			s, err := open(c.spec, "auto")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			before := make([]int32, c.pos)
			if err := s.Read(before, 0); err != nil {
				t.Fatalf("the ids before the bad one: %v", err)
			}
			err = s.Read(make([]int32, 4), int64(c.pos)-1)
			if err == nil {
				t.Fatalf("reading id %s at %d of %s gave no error", c.val, c.pos, c.file)
			}
			for _, w := range []string{c.file, c.val, fmt.Sprintf("position %d", c.pos)} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
