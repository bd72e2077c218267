package tokens

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Stream is a sequence of token ids read from one or more files as one:
// the ids of the first file, then those of the second, and so on. The
// files are mapped into memory (read whole where the system does not map
// them; see the package comment), and Read decodes only the ids it is
// asked for, so opening a corpus of any size costs the same and the ids a
// run reads do not stay resident. A Stream is safe for concurrent Reads.
type Stream struct {
	name   string
	parts  []*part
	ends   []int64 // ends[i]: the stream position after parts[i]
	lo, hi int64   // this view of the parts' ids: [lo, hi)
	files  *fileSet
}

// part is one file's ids, or ids in memory.
type part struct {
	path   string // the file that holds the ids (a Megatron dataset's .bin), or an in-memory name
	format Format
	enc    encoding
	n      int64   // ids
	mem    []byte  // the file's bytes (mapped, or read whole); nil for ids in memory
	off    int     // bytes before the ids in mem (a header)
	ids    []int32 // ids in memory (FromIDs)
	mapped bool    // mem is a mapping: unmapped by Close, released after each read
}

// fileSet owns the mappings of a stream and of every slice of it.
type fileSet struct {
	once   sync.Once
	closed atomic.Bool
	parts  []*part
}

func (fs *fileSet) close() error {
	var err error
	fs.once.Do(func() {
		fs.closed.Store(true)
		for _, p := range fs.parts {
			if p.mapped {
				if e := unmap(p.mem); e != nil && err == nil {
					err = fmt.Errorf("tokens: unmapping %s: %w", p.path, e)
				}
			}
			p.mem = nil
		}
	})
	return err
}

func newStream(name string, parts []*part) *Stream {
	s := &Stream{name: name, parts: parts, ends: make([]int64, len(parts)), files: &fileSet{parts: parts}}
	var n int64
	for i, p := range parts {
		n += p.n
		s.ends[i] = n
	}
	s.hi = n
	return s
}

// FromBytes is a stream of text held in memory: one token per byte
// (vocabulary 256), as the Text format reads a file. b is not copied and
// must not change while the stream is used. name is used in messages.
func FromBytes(name string, b []byte) *Stream {
	return newStream(name, []*part{{path: name, format: Text, enc: encUint8, n: int64(len(b)), mem: b}})
}

// FromIDs is a stream of ids held in memory. ids is not copied and must
// not change while the stream is used; a negative id is an error of the
// Read that meets it. name is used in messages.
func FromIDs(name string, ids []int32) *Stream {
	return newStream(name, []*part{{path: name, format: memIDs, enc: encoding{4, true}, n: int64(len(ids)), ids: ids}})
}

// memIDs is the format of the ids of FromIDs.
const memIDs Format = "ids"

// Name says what the stream is: the files as given to Open with their
// formats ("data/*.bin (3 files: llm.c uint16)"), or the name given to
// FromBytes, FromIDs or Slice.
func (s *Stream) Name() string { return s.name }

// Len is the number of ids.
func (s *Stream) Len() int64 { return s.hi - s.lo }

// Text reports whether the ids are bytes of text (every file is Text),
// rather than the ids of a tokenizer.
func (s *Stream) Text() bool {
	for _, p := range s.parts {
		if p.format != Text {
			return false
		}
	}
	return true
}

// File describes one file of a stream.
type File struct {
	Path   string // the file that holds the ids (a Megatron dataset's .bin)
	Format Format // its format, as detected or given
	IDs    string // how each id is stored: uint8 (text), uint16, uint32, int32, ...
	Tokens int64  // the number of ids it holds
}

// Files lists the stream's files in stream order (those of the stream it
// was sliced from, for a slice).
func (s *Stream) Files() []File {
	out := make([]File, len(s.parts))
	for i, p := range s.parts {
		out[i] = File{Path: p.path, Format: p.format, IDs: p.enc.String(), Tokens: p.n}
	}
	return out
}

// Slice is the view of ids [from, to) of s under a new name. It shares
// s's files: closing either closes both.
func (s *Stream) Slice(from, to int64, name string) (*Stream, error) {
	if from < 0 || to < from || to > s.Len() {
		return nil, fmt.Errorf("tokens: slice [%d, %d) of %s, which holds %d ids", from, to, s.name, s.Len())
	}
	v := *s
	v.name, v.lo, v.hi = name, s.lo+from, s.lo+to
	return &v, nil
}

// Locate says where id pos of the stream is: in which file, at which id
// position of that file (counted from its first id, past any header).
func (s *Stream) Locate(pos int64) (path string, filePos int64) {
	p := s.lo + pos
	i := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] > p })
	if pos < 0 || i == len(s.ends) {
		return s.name, pos
	}
	return s.parts[i].path, p - (s.ends[i] - s.parts[i].n)
}

// Read decodes ids [pos, pos+len(dst)) into dst. An id that does not fit
// an int32 token (a negative one, or one above MaxID) is an error naming
// its file and position; so is a file that was truncated while mapped.
func (s *Stream) Read(dst []int32, pos int64) error {
	if pos < 0 || int64(len(dst)) > s.Len()-pos {
		return fmt.Errorf("tokens: reading ids [%d, %d) of %s, which holds %d", pos, pos+int64(len(dst)), s.name, s.Len())
	}
	if s.files.closed.Load() {
		return fmt.Errorf("tokens: reading %s after Close", s.name)
	}
	p := s.lo + pos
	i := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] > p })
	for len(dst) > 0 {
		pt := s.parts[i]
		start := s.ends[i] - pt.n
		n := min(int64(len(dst)), s.ends[i]-p)
		if err := pt.read(dst[:n], p-start); err != nil {
			return err
		}
		dst, p = dst[n:], p+n
		i++
	}
	return nil
}

// Close releases the stream's files (and those of every slice of it).
// No Read may run then or later.
func (s *Stream) Close() error { return s.files.close() }

// read decodes ids [k, k+len(dst)) of the part.
func (p *part) read(dst []int32, k int64) (err error) {
	if p.ids != nil {
		copy(dst, p.ids[k:])
		for i, v := range dst {
			if v < 0 {
				return p.badID(int64(v), k+int64(i))
			}
		}
		return nil
	}
	w := p.enc.width
	lo, hi := p.off+int(k)*w, p.off+(int(k)+len(dst))*w
	if p.mapped {
		// A mapped file that shrank under us faults instead of reading:
		// made an error here rather than a crash.
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			r := recover()
			if r == nil {
				return
			}
			if re, ok := r.(runtime.Error); ok && isFault(re) {
				err = fmt.Errorf("tokens: data file %s: reading ids %d..%d failed (%v): the file was truncated or replaced while in use", p.path, k, k+int64(len(dst)), re)
				return
			}
			panic(r)
		}()
		defer release(p.mem, lo, hi)
	}
	if bad, v := decode(dst, p.mem[lo:hi], p.enc); bad >= 0 {
		return p.badID(v, k+int64(bad))
	}
	return nil
}

func isFault(e runtime.Error) bool {
	_, ok := e.(interface{ Addr() uintptr })
	return ok || strings.Contains(e.Error(), "fault")
}

func (p *part) badID(v, pos int64) error {
	return fmt.Errorf("tokens: data file %s holds token id %d at position %d, outside the ids 0..%d (%s)", p.path, v, pos, MaxID, p.describe())
}

// describe names the part's format and id type for messages.
func (p *part) describe() string {
	switch p.format {
	case Text:
		return "text"
	case Uint16, Uint32:
		return "raw " + p.enc.String()
	case LLMC:
		return "llm.c " + p.enc.String()
	case Megatron:
		return "megatron " + p.enc.String()
	}
	return "int32 ids"
}

// decode converts the little-endian ids of b into dst and returns -1, or
// the index of the first id that is not a token (below 0, above MaxID)
// and its value.
func decode(dst []int32, b []byte, e encoding) (int, int64) {
	switch e {
	case encoding{1, false}:
		for i := range dst {
			dst[i] = int32(b[i])
		}
	case encoding{1, true}:
		for i := range dst {
			v := int8(b[i])
			if v < 0 {
				return i, int64(v)
			}
			dst[i] = int32(v)
		}
	case encoding{2, false}:
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	case encoding{2, true}:
		for i := range dst {
			v := int16(binary.LittleEndian.Uint16(b[2*i:]))
			if v < 0 {
				return i, int64(v)
			}
			dst[i] = int32(v)
		}
	case encoding{4, false}:
		for i := range dst {
			v := binary.LittleEndian.Uint32(b[4*i:])
			if v > MaxID {
				return i, int64(v)
			}
			dst[i] = int32(v)
		}
	case encoding{4, true}:
		for i := range dst {
			v := int32(binary.LittleEndian.Uint32(b[4*i:]))
			if v < 0 {
				return i, int64(v)
			}
			dst[i] = v
		}
	case encoding{8, true}:
		for i := range dst {
			v := int64(binary.LittleEndian.Uint64(b[8*i:]))
			if v < 0 || v > MaxID {
				return i, v
			}
			dst[i] = int32(v)
		}
	default:
		panic(fmt.Sprintf("tokens: no decoder for %v", e)) // the openers only make the encodings above
	}
	return -1, 0
}
