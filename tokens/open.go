package tokens

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The errors of Open that a format given explicitly resolves (errors.Is
// finds them in what Open returns), so that a program can name its own
// way of giving one.
var (
	// ErrMixedKinds: the files of a stream, each detected (Auto), are
	// text and token ids.
	ErrMixedKinds = errors.New("tokens: text and token ids in one stream")
	// ErrLLMCVersion: a file starts with an llm.c magic but not its
	// version (llm.c's shard of another version, or a raw file).
	ErrLLMCVersion = errors.New("tokens: an llm.c magic with another version")
)

// mapFiles chooses mapping over reading whole where the system maps
// (the tests read whole on Linux too, to cover the fallback).
var mapFiles = canMap

// Open opens the token files of spec as one stream. spec is a
// comma-separated list; each element is a file, a directory (its files,
// not its subdirectories, which are refused) or a glob pattern
// (filepath.Match syntax); the files of a directory or a pattern whose
// names start with "." are left out. The stream holds
// the elements in the order given; a directory's or a pattern's files in
// byte-wise order of their names. Among a directory's or a pattern's
// files, PREFIX.idx beside PREFIX.bin is that file's Megatron index, not a
// file of its own.
//
// format is the layout of every file, or Auto to detect each one's (see
// the package comment); a format given explicitly is used as given, and a
// file that does not have it is refused. The files of one stream are all
// text or all token ids. Where a format given explicitly would read what
// Auto refused, the error wraps ErrMixedKinds or ErrLLMCVersion.
func Open(spec string, format Format) (*Stream, error) {
	format, err := ParseFormat(string(format))
	if err != nil {
		return nil, err
	}
	paths, err := expand(spec)
	if err != nil {
		return nil, err
	}
	var parts []*part
	closeAll := func() {
		for _, p := range parts {
			if p.mapped {
				_ = unmap(p.mem)
			}
		}
	}
	for _, path := range paths {
		p, err := openPart(path, format)
		if err != nil {
			closeAll()
			return nil, err
		}
		parts = append(parts, p)
	}
	var text, ids *part
	for _, p := range parts {
		if p.format == Text && text == nil {
			text = p
		} else if p.format != Text && ids == nil {
			ids = p
		}
	}
	if text != nil && ids != nil {
		closeAll()
		return nil, fmt.Errorf("%w: %s mixes text (%s, one token per byte) with token ids (%s, %s); give files of one kind, or a format other than Auto to read them all one way",
			ErrMixedKinds, spec, text.path, ids.path, ids.describe())
	}
	return newStream(streamName(spec, parts), parts), nil
}

// streamName is spec with what its files are: "a.bin (raw uint16)",
// "shards/*.bin (3 files: llm.c uint16)".
func streamName(spec string, parts []*part) string {
	var kinds []string
	seen := map[string]bool{}
	for _, p := range parts {
		if d := p.describe(); !seen[d] {
			seen[d] = true
			kinds = append(kinds, d)
		}
	}
	if len(parts) == 1 {
		return fmt.Sprintf("%s (%s)", spec, kinds[0])
	}
	return fmt.Sprintf("%s (%d files: %s)", spec, len(parts), strings.Join(kinds, ", "))
}

// expand lists the files of spec in stream order (Open's rules).
func expand(spec string) ([]string, error) {
	if spec == "" {
		return nil, errors.New("tokens: no data files given")
	}
	var out []string
	for _, el := range strings.Split(spec, ",") {
		if el == "" {
			return nil, fmt.Errorf("tokens: the list of data files %q has an empty element", spec)
		}
		if strings.ContainsAny(el, "*?[") {
			m, err := filepath.Glob(el)
			if err != nil {
				return nil, fmt.Errorf("tokens: data pattern %s: %w", el, err)
			}
			if len(m) == 0 {
				return nil, fmt.Errorf("tokens: data pattern %s matches no file", el)
			}
			sort.Strings(m)
			var files []string
			for _, f := range m {
				if hidden(f) && !hidden(el) {
					continue
				}
				if st, err := os.Stat(f); err == nil && st.IsDir() {
					return nil, fmt.Errorf("tokens: data pattern %s matches the directory %s; a pattern names data files", el, f)
				}
				files = append(files, f)
			}
			if len(files) == 0 {
				return nil, fmt.Errorf("tokens: data pattern %s matches no file (names starting with \".\" are left out)", el)
			}
			out = append(out, withoutIndexes(files)...)
			continue
		}
		st, err := os.Stat(el)
		if err != nil || !st.IsDir() {
			out = append(out, el) // a file, or a Megatron prefix: openPart says what is wrong
			continue
		}
		ents, err := os.ReadDir(el) // sorted by name
		if err != nil {
			return nil, fmt.Errorf("tokens: data directory %s: %w", el, err)
		}
		var files []string
		for _, e := range ents {
			if hidden(e.Name()) {
				continue
			}
			if e.IsDir() {
				return nil, fmt.Errorf("tokens: data directory %s holds the directory %s; a directory's files are read, not its subdirectories (a pattern such as %s takes those)",
					el, e.Name(), filepath.Join(el, "*", "*"))
			}
			files = append(files, filepath.Join(el, e.Name()))
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("tokens: data directory %s holds no files", el)
		}
		out = append(out, withoutIndexes(files)...)
	}
	return out, nil
}

// hidden reports whether a file's name starts with ".": such files of a
// directory or a pattern are left out, as a shell's pattern leaves them.
func hidden(path string) bool { return strings.HasPrefix(filepath.Base(path), ".") }

// withoutIndexes drops from names each PREFIX.idx whose PREFIX.bin is
// also there: it is that file's Megatron index.
func withoutIndexes(names []string) []string {
	bins := map[string]bool{}
	for _, n := range names {
		if p, ok := cutExt(n, ".bin"); ok {
			bins[p] = true
		}
	}
	var out []string
	for _, n := range names {
		if p, ok := cutExt(n, ".idx"); ok && bins[p] {
			continue
		}
		out = append(out, n)
	}
	return out
}

// cutExt returns path without ext (compared without case) and whether it
// had it.
func cutExt(path, ext string) (string, bool) {
	if e := filepath.Ext(path); strings.EqualFold(e, ext) {
		return strings.TrimSuffix(path, e), true
	}
	return path, false
}

func exists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
}

// detect is a file's format by its content, its name and its neighbours:
// a Megatron dataset (PREFIX.idx, PREFIX.bin beside PREFIX.idx, or a
// PREFIX naming both), an llm.c shard (its magic), raw uint16 (.bin,
// .u16), raw uint32 (.u32), else text.
func detect(path string) (Format, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if exists(path+".bin") && exists(path+".idx") {
				return Megatron, nil
			}
			return "", fmt.Errorf("tokens: data file %s does not exist", path)
		}
		return "", fmt.Errorf("tokens: data file %s: %w", path, err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("tokens: data file %s is a directory", path)
	}
	if _, ok := cutExt(path, ".idx"); ok {
		return Megatron, nil
	}
	if p, ok := cutExt(path, ".bin"); ok && exists(p+".idx") {
		return Megatron, nil
	}
	if head, err := readHead(path, 4); err == nil && len(head) == 4 {
		if m := int32(binary.LittleEndian.Uint32(head)); m == llmcMagic16 || m == llmcMagic32 {
			return LLMC, nil
		}
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".bin", ".u16":
		return Uint16, nil
	case ".u32":
		return Uint32, nil
	}
	return Text, nil
}

func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := io.ReadFull(f, b)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return b[:k], err
}

func openPart(path string, f Format) (*part, error) {
	if f == Auto {
		var err error
		if f, err = detect(path); err != nil {
			return nil, err
		}
	}
	switch f {
	case Text:
		return openRaw(path, Text, encUint8)
	case Uint16:
		return openRaw(path, Uint16, encUint16)
	case Uint32:
		return openRaw(path, Uint32, encUint32)
	case LLMC:
		return openLLMC(path)
	case Megatron:
		return openMegatron(path)
	}
	return nil, fmt.Errorf("tokens: no reader for format %q", f)
}

// openFile opens a data file and returns its size.
func openFile(path, what string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, 0, fmt.Errorf("tokens: %s %s does not exist", what, path)
		}
		return nil, 0, fmt.Errorf("tokens: %s %s: %w", what, path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("tokens: %s %s: %w", what, path, err)
	}
	if st.IsDir() {
		f.Close()
		return nil, 0, fmt.Errorf("tokens: %s %s is a directory", what, path)
	}
	return f, st.Size(), nil
}

// load maps (or reads) the first size bytes of f and closes f.
func load(f *os.File, size int64) (mem []byte, isMapped bool, err error) {
	defer f.Close()
	if mapFiles {
		mem, err = mapFile(f, size)
		if err != nil {
			return nil, false, fmt.Errorf("tokens: data file %s: %w", f.Name(), err)
		}
		return mem, true, nil
	}
	mem, err = readWhole(f, size)
	if err != nil {
		return nil, false, fmt.Errorf("tokens: reading data file %s: %w", f.Name(), err)
	}
	return mem, false, nil
}

// readWhole reads the first size bytes of f into memory: the fallback of
// the systems where files are not mapped.
func readWhole(f *os.File, size int64) ([]byte, error) {
	if size != int64(int(size)) {
		return nil, fmt.Errorf("%d bytes do not fit in memory here", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, size), b); err != nil {
		return nil, err
	}
	return b, nil
}

// openRaw opens a file of ids without a header.
func openRaw(path string, format Format, e encoding) (*part, error) {
	f, size, err := openFile(path, "data file")
	if err != nil {
		return nil, err
	}
	if size == 0 {
		f.Close()
		return nil, fmt.Errorf("tokens: data file %s is empty", path)
	}
	if w := int64(e.width); size%w != 0 {
		f.Close()
		if w == 2 {
			return nil, fmt.Errorf("tokens: data file %s has an odd length of %d bytes; a raw uint16 file holds little-endian uint16 tokens (2 bytes each)", path, size)
		}
		return nil, fmt.Errorf("tokens: data file %s has a length of %d bytes, not a multiple of %d; a raw %s file holds little-endian %s tokens (%d bytes each)", path, size, w, e, e, w)
	}
	mem, m, err := load(f, size)
	if err != nil {
		return nil, err
	}
	return &part{path: path, format: format, enc: e, n: size / int64(e.width), mem: mem, mapped: m}, nil
}

// openLLMC opens an llm.c shard: its header's magic names the id width,
// its token count must match the file's size.
func openLLMC(path string) (*part, error) {
	f, size, err := openFile(path, "data file")
	if err != nil {
		return nil, err
	}
	fail := func(format string, args ...any) (*part, error) {
		f.Close()
		return nil, fmt.Errorf("tokens: "+format, args...)
	}
	if size < llmcHeaderBytes {
		return fail("data file %s is %d bytes, shorter than the %d-byte header of an llm.c shard", path, size, llmcHeaderBytes)
	}
	var h [12]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return fail("data file %s: reading its header: %v", path, err)
	}
	magic := int32(binary.LittleEndian.Uint32(h[0:]))
	version := int32(binary.LittleEndian.Uint32(h[4:]))
	ntok := int64(int32(binary.LittleEndian.Uint32(h[8:])))
	var e encoding
	var want int32
	switch magic {
	case llmcMagic16:
		e, want = encUint16, llmcVersion16
	case llmcMagic32:
		e, want = encUint32, llmcVersion32
	default:
		return fail("data file %s is not an llm.c shard: its first int32 is %d, expected the magic %d (uint16 ids) or %d (uint32 ids)",
			path, magic, llmcMagic16, llmcMagic32)
	}
	if version != want {
		f.Close()
		return nil, fmt.Errorf("%w: %s has version %d with magic %d, expected version %d (a raw file that happens to start so is read with the format Uint16 or Uint32)",
			ErrLLMCVersion, path, version, magic, want)
	}
	if ntok <= 0 {
		return fail("llm.c shard %s: its header says %d tokens, expected at least 1", path, ntok)
	}
	if body := ntok * int64(e.width); size != llmcHeaderBytes+body {
		return fail("llm.c shard %s is %d bytes, but its header says %d %s tokens, which take %d + %d = %d bytes: truncated, or not an llm.c shard",
			path, size, ntok, e, llmcHeaderBytes, body, llmcHeaderBytes+body)
	}
	mem, m, err := load(f, size)
	if err != nil {
		return nil, err
	}
	return &part{path: path, format: LLMC, enc: e, n: ntok, mem: mem, off: llmcHeaderBytes, mapped: m}, nil
}

// openMegatron opens a Megatron indexed dataset named by its prefix, its
// .bin or its .idx. The stream is the .bin's ids in order: the dataset's
// sequences in index order, each sequence's pointer being the sum of the
// sizes before it, as Megatron's builder writes them. The index's header,
// its size, its first and last pointers and document indices are checked
// against the .bin (the sequences in between are not read: they do not
// change which ids the .bin holds).
func openMegatron(path string) (*part, error) {
	prefix, ok := cutExt(path, ".bin")
	if !ok {
		prefix, _ = cutExt(path, ".idx")
	}
	idxPath, binPath := prefix+".idx", prefix+".bin"
	f, size, err := openFile(idxPath, "Megatron index")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fail := func(format string, args ...any) (*part, error) {
		return nil, fmt.Errorf("tokens: Megatron index %s "+format, append([]any{idxPath}, args...)...)
	}
	if size < megatronHeaderSize {
		return fail("is %d bytes, shorter than its %d-byte header", size, megatronHeaderSize)
	}
	var h [megatronHeaderSize]byte
	if _, err := f.ReadAt(h[:], 0); err != nil {
		return fail("header: %v", err)
	}
	if string(h[:9]) != megatronMagic {
		return fail("does not start with Megatron's magic %q but with %q: not a Megatron index", megatronMagic, h[:9])
	}
	if v := binary.LittleEndian.Uint64(h[9:]); v != megatronVersion {
		return fail("has version %d, expected %d", v, megatronVersion)
	}
	code := h[17]
	e, ok := megatronDTypes[code]
	if !ok {
		return fail("has dtype code %d, expected an integer type: 1 (uint8), 2 (int8), 3 (int16), 4 (int32), 5 (int64) or 8 (uint16); 6 and 7 are float64 and float32", code)
	}
	nseq, ndoc := binary.LittleEndian.Uint64(h[18:]), binary.LittleEndian.Uint64(h[26:])
	// Each sequence takes 12 bytes of the index, each document index 8.
	if nseq > uint64(size)/12 || ndoc > uint64(size)/8 {
		return fail("is %d bytes, too small for the %d sequences and %d document indices its header names: truncated or corrupt", size, nseq, ndoc)
	}
	want := uint64(megatronHeaderSize) + 12*nseq + 8*ndoc
	if uint64(size) != want && uint64(size) != want+nseq {
		return fail("is %d bytes; its %d sequences and %d document indices take %d (or %d with a mode per sequence): truncated or corrupt",
			size, nseq, ndoc, want, want+nseq)
	}
	if nseq == 0 {
		return fail("holds no sequences: the dataset is empty")
	}
	i64 := func(off uint64) (int64, error) {
		var b [8]byte
		_, err := f.ReadAt(b[:], int64(off))
		return int64(binary.LittleEndian.Uint64(b[:])), err
	}
	var lb [4]byte
	if _, err := f.ReadAt(lb[:], int64(megatronHeaderSize+4*(nseq-1))); err != nil {
		return fail("last sequence length: %v", err)
	}
	lastLen := int64(int32(binary.LittleEndian.Uint32(lb[:])))
	ptrs := uint64(megatronHeaderSize) + 4*nseq
	docs := ptrs + 8*nseq
	firstPtr, err1 := i64(ptrs)
	lastPtr, err2 := i64(ptrs + 8*(nseq-1))
	if err := errors.Join(err1, err2); err != nil {
		return fail("sequence pointers: %v", err)
	}
	if ndoc == 0 {
		return fail("has no document indices, expected 0 first and the sequence count last")
	}
	firstDoc, err1 := i64(docs)
	lastDoc, err2 := i64(docs + 8*(ndoc-1))
	if err := errors.Join(err1, err2); err != nil {
		return fail("document indices: %v", err)
	}
	if firstDoc != 0 || lastDoc != int64(nseq) {
		return fail("has document indices from %d to %d, expected from 0 to its %d sequences", firstDoc, lastDoc, nseq)
	}
	w := int64(e.width)
	if firstPtr != 0 || lastLen < 0 || lastPtr < 0 || lastPtr%w != 0 {
		return fail("has the first sequence at byte %d and the last at byte %d with %d ids, expected the first at 0 and %d-byte aligned pointers: corrupt",
			firstPtr, lastPtr, lastLen, w)
	}
	end := lastPtr + lastLen*w
	bf, bsize, err := openFile(binPath, "Megatron data file")
	if err != nil {
		return nil, err
	}
	if bsize != end {
		bf.Close()
		return nil, fmt.Errorf("tokens: Megatron data file %s is %d bytes, but its index %s ends its last sequence at byte %d (%d %s ids): truncated, or not the index of this file",
			binPath, bsize, idxPath, end, end/w, e)
	}
	if bsize == 0 {
		bf.Close()
		return nil, fmt.Errorf("tokens: Megatron data file %s is empty", binPath)
	}
	mem, m, err := load(bf, bsize)
	if err != nil {
		return nil, err
	}
	return &part{path: binPath, format: Megatron, enc: e, n: bsize / w, mem: mem, mapped: m}, nil
}
