package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/internal/atomicfile"
	"github.com/asynctp/asynctp/tensor"
)

// MaxHeader bounds the JSON header a reader accepts (100 MB, the limit of
// the reference implementation).
const MaxHeader = 100 << 20

const metadataKey = "__metadata__"

// Named is a host tensor with its name in a file.
type Named struct {
	Name   string         // unique in the file, not "__metadata__"
	Tensor *tensor.Tensor // a host tensor of a dtype with a format name (F32, F64, BF16, I32)
}

// Entry describes one tensor of a parsed file.
type Entry struct {
	Name string // the tensor's name in the file
	// DType is the tensor's dtype, or tensor.Invalid for a format that has
	// no dtype here (F16: read it with Float32s).
	DType  tensor.DType
	Format string       // the dtype's name in the file: "F32", "F64", "BF16", "F16" or "I32"
	Shape  tensor.Shape // row-major
	Offset uint64       // where Data starts in the data section
	Data   []byte       // the tensor's bytes, little-endian; they alias the file's
}

// File is a parsed file: its metadata and its tensors by name.
type File struct {
	Metadata map[string]string // the "__metadata__" object (empty when absent)
	Entries  map[string]*Entry // every tensor, by name
}

type format struct {
	name string
	dt   tensor.DType
	size int
}

// formats are the element types this package reads: their names in a
// file, our dtype (tensor.Invalid for F16, which is read as float32 only:
// Entry.Float32s) and their size in bytes.
var formats = []format{{"F32", tensor.Float32, 4}, {"F64", tensor.Float64, 8}, {"BF16", tensor.BFloat16, 2}, {"I32", tensor.Int32, 4}, {"F16", tensor.Invalid, 2}}

// formatOf is the name of dt in a file.
func formatOf(dt tensor.DType) (string, bool) {
	for _, f := range formats {
		if f.dt == dt && dt != tensor.Invalid {
			return f.name, true
		}
	}
	return "", false
}

type stHeaderEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// Write writes host tensors in the safetensors format, in the order given,
// with optional metadata. Names must be unique and not "__metadata__". The
// data section starts 8-byte aligned (the header is padded with spaces).
func Write(w io.Writer, tensors []Named, metadata map[string]string) error {
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header[metadataKey] = metadata
	}
	var off uint64
	for _, nt := range tensors {
		if nt.Name == "" || nt.Name == metadataKey {
			return fmt.Errorf("safetensors: invalid tensor name %q", nt.Name)
		}
		if _, dup := header[nt.Name]; dup {
			return fmt.Errorf("safetensors: tensor name %q appears twice", nt.Name)
		}
		if nt.Tensor == nil {
			return fmt.Errorf("safetensors: tensor %q is nil", nt.Name)
		}
		name, ok := formatOf(nt.Tensor.DType())
		if !ok {
			return fmt.Errorf("safetensors: tensor %q has dtype %v, which has no safetensors name", nt.Name, nt.Tensor.DType())
		}
		shape := make([]int64, len(nt.Tensor.Shape()))
		for i, d := range nt.Tensor.Shape() {
			shape[i] = int64(d)
		}
		n := uint64(nt.Tensor.Bytes())
		header[nt.Name] = stHeaderEntry{DType: name, Shape: shape, DataOffsets: []uint64{off, off + n}}
		off += n
	}
	hj, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("safetensors: header: %w", err)
	}
	// Pad with spaces so the data section starts 8-byte aligned.
	if pad := (8 - len(hj)%8) % 8; pad > 0 {
		hj = append(hj, bytes.Repeat([]byte(" "), pad)...)
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hj)))
	if _, err := w.Write(lenBuf[:]); err != nil {
		return err
	}
	if _, err := w.Write(hj); err != nil {
		return err
	}
	for _, nt := range tensors {
		b, err := tensorBytes(nt.Tensor)
		if err != nil {
			return fmt.Errorf("safetensors: tensor %q: %w", nt.Name, err)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// tensorBytes encodes a host tensor little-endian.
func tensorBytes(t *tensor.Tensor) ([]byte, error) {
	out := make([]byte, t.Bytes())
	switch t.DType() {
	case tensor.Float32:
		v := t.F32()
		if v == nil {
			return nil, fmt.Errorf("%v is not a host tensor", t)
		}
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
	case tensor.Float64:
		v := t.F64()
		if v == nil {
			return nil, fmt.Errorf("%v is not a host tensor", t)
		}
		for i, x := range v {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(x))
		}
	case tensor.Int32:
		v := t.I32()
		if v == nil {
			return nil, fmt.Errorf("%v is not a host tensor", t)
		}
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], uint32(x))
		}
	case tensor.BFloat16:
		v := t.BF16()
		if v == nil {
			return nil, fmt.Errorf("%v is not a host tensor", t)
		}
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], x)
		}
	default:
		return nil, fmt.Errorf("unsupported dtype %v", t.DType())
	}
	return out, nil
}

// Read parses a whole safetensors file held in data. It checks
// the header length against the file, the header JSON, every dtype, shape
// and offset, and that the tensors tile the data section exactly. It never
// allocates more than a small multiple of len(data).
func Read(data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("truncated: %d bytes, but a safetensors file starts with an 8-byte header length", len(data))
	}
	hlen := binary.LittleEndian.Uint64(data)
	if hlen > uint64(len(data)-8) {
		return nil, fmt.Errorf("header length %d is beyond the file (%d bytes after the length field): truncated or not a safetensors file", hlen, len(data)-8)
	}
	if hlen > MaxHeader {
		return nil, fmt.Errorf("header length %d exceeds the limit of %d bytes", hlen, MaxHeader)
	}
	hdr := data[8 : 8+hlen]
	body := data[8+hlen:]
	if len(bytes.TrimSpace(hdr)) == 0 || bytes.TrimSpace(hdr)[0] != '{' {
		return nil, fmt.Errorf("bad header JSON: want an object, found %q", clip(hdr, 40))
	}

	dec := json.NewDecoder(bytes.NewReader(hdr))
	if _, err := dec.Token(); err != nil { // '{'
		return nil, fmt.Errorf("bad header JSON: %v", err)
	}
	st := &File{Metadata: map[string]string{}, Entries: map[string]*Entry{}}
	type span struct {
		begin, end uint64
		name       string
	}
	var spans []span
	sawMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("bad header JSON: %v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("bad header JSON: key %v is not a string", tok)
		}
		if key == metadataKey {
			if sawMeta {
				return nil, fmt.Errorf("bad header JSON: %q appears twice", metadataKey)
			}
			sawMeta = true
			var meta map[string]string
			if err := dec.Decode(&meta); err != nil {
				return nil, fmt.Errorf("bad header JSON: %s must map strings to strings: %v", metadataKey, err)
			}
			if meta != nil {
				st.Metadata = meta
			}
			continue
		}
		if key == "" {
			return nil, fmt.Errorf("bad header JSON: a tensor has an empty name")
		}
		if _, dup := st.Entries[key]; dup {
			return nil, fmt.Errorf("bad header JSON: tensor %q appears twice", key)
		}
		var he stHeaderEntry
		if err := dec.Decode(&he); err != nil {
			return nil, fmt.Errorf("bad header JSON: tensor %q: %v", key, err)
		}
		fi := slices.IndexFunc(formats, func(f format) bool { return f.name == he.DType })
		if fi < 0 {
			return nil, fmt.Errorf("tensor %q has unknown dtype %q (this reader handles F32, F64, BF16, F16 and I32)", key, he.DType)
		}
		dt, size := formats[fi].dt, formats[fi].size
		if len(he.DataOffsets) != 2 {
			return nil, fmt.Errorf("tensor %q: data_offsets has %d values, want [begin, end]", key, len(he.DataOffsets))
		}
		begin, end := he.DataOffsets[0], he.DataOffsets[1]
		if begin > end || end > uint64(len(body)) {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] out of range of the %d-byte data section (truncated file?)", key, begin, end, len(body))
		}
		// Numel, bounded by the data section so it cannot overflow.
		shape := make(tensor.Shape, len(he.Shape))
		numel := uint64(1)
		limit := uint64(len(body)) + 1
		for i, d := range he.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension %d in shape %v", key, d, he.Shape)
			}
			if d > 0 && numel > limit/uint64(d) {
				numel = limit // too big for the file; reported below
			} else {
				numel *= uint64(d)
			}
			if uint64(d) > math.MaxInt {
				return nil, fmt.Errorf("tensor %q: dimension %d too large", key, d)
			}
			shape[i] = int(d)
		}
		if want := numel * uint64(size); want != end-begin {
			if numel >= limit {
				return nil, fmt.Errorf("tensor %q: shape %v holds more elements than the file has bytes", key, he.Shape)
			}
			return nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, but data_offsets [%d, %d] hold %d", key, he.Shape, he.DType, want, begin, end, end-begin)
		}
		st.Entries[key] = &Entry{Name: key, DType: dt, Format: he.DType, Shape: shape, Offset: begin, Data: body[begin:end:end]}
		spans = append(spans, span{begin, end, key})
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, fmt.Errorf("bad header JSON: %v", err)
	}
	if rest := bytes.TrimSpace(hdr[dec.InputOffset():]); len(rest) > 0 {
		return nil, fmt.Errorf("bad header JSON: %d unexpected bytes after the header object", len(rest))
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	var pos uint64
	for i, s := range spans {
		if s.begin < pos {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q", s.name, s.begin, s.end, spans[i-1].name)
		}
		if s.begin > pos {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a hole of %d bytes before it", s.name, s.begin, s.end, s.begin-pos)
		}
		pos = s.end
	}
	if pos != uint64(len(body)) {
		return nil, fmt.Errorf("the tensors cover %d bytes of the %d-byte data section", pos, len(body))
	}
	return st, nil
}

// Names lists the tensor names in data order.
func (s *File) Names() []string {
	names := make([]string, 0, len(s.Entries))
	for n := range s.Entries {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := s.Entries[names[i]], s.Entries[names[j]]
		if a.Offset != b.Offset {
			return a.Offset < b.Offset
		}
		return names[i] < names[j]
	})
	return names
}

// Tensor decodes the entry into a new host tensor of its dtype (an F16
// entry has none: Float32s reads it).
func (e *Entry) Tensor() (*tensor.Tensor, error) {
	if e.DType == tensor.Invalid {
		return nil, fmt.Errorf("tensor %q is %s, which has no dtype here (read it with Float32s)", e.Name, e.Format)
	}
	t, err := tensor.Host(e.DType, e.Shape...)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", e.Name, err)
	}
	if t.Bytes() != len(e.Data) {
		return nil, fmt.Errorf("tensor %q: %d bytes for shape %v of %v", e.Name, len(e.Data), e.Shape, e.DType)
	}
	d := e.Data
	switch e.DType {
	case tensor.Float32:
		v := t.F32()
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		}
	case tensor.Float64:
		v := t.F64()
		for i := range v {
			v[i] = math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:]))
		}
	case tensor.Int32:
		v := t.I32()
		for i := range v {
			v[i] = int32(binary.LittleEndian.Uint32(d[4*i:]))
		}
	case tensor.BFloat16:
		v := t.BF16()
		for i := range v {
			v[i] = binary.LittleEndian.Uint16(d[2*i:])
		}
	}
	return t, nil
}

func clip(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Float32s decodes a floating-point entry (F32, F64, BF16 or F16) into
// float32 values, row-major: how a model's weights are read whatever the
// precision they were saved in.
func (e *Entry) Float32s() ([]float32, error) {
	var size int
	switch e.Format {
	case "F32", "I32":
		size = 4
	case "F64":
		size = 8
	case "BF16", "F16":
		size = 2
	}
	if e.Format == "I32" || size == 0 {
		return nil, fmt.Errorf("tensor %q is %s, expected a floating-point format (F32, F64, BF16 or F16)", e.Name, e.Format)
	}
	n := e.Shape.Numel()
	if len(e.Data) != n*size {
		return nil, fmt.Errorf("tensor %q: %d bytes for shape %v of %s", e.Name, len(e.Data), e.Shape, e.Format)
	}
	d := e.Data
	out := make([]float32, n)
	for i := range out {
		switch e.Format {
		case "F32":
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		case "F64":
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(d[8*i:])))
		case "BF16":
			out[i] = tensor.BF16ToFloat32(binary.LittleEndian.Uint16(d[2*i:]))
		case "F16":
			out[i] = halfToFloat32(binary.LittleEndian.Uint16(d[2*i:]))
		}
	}
	return out, nil
}

// halfToFloat32 decodes an IEEE 754 half-precision value.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		f := float32(frac) / 1024 / 16384
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// ReadFile reads and parses the safetensors file at path (Read).
func ReadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	f, err := Read(data)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return f, nil
}

// WriteFile writes tensors and metadata (Write) to path through a
// temporary file of the same directory, fsynced and renamed into place, so
// a reader sees the old file or the new one, never a part, and a failed
// write leaves path as it was. The file's mode is 0644 less the umask.
func WriteFile(path string, tensors []Named, metadata map[string]string) error {
	if err := atomicfile.Write(path, func(w io.Writer) error { return Write(w, tensors, metadata) }); err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	return nil
}
