package train

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/tensor"
)

// The safetensors format: an 8-byte little-endian header length N, N bytes
// of JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {string: string}}, then the data section, to which the
// offsets are relative. Tensors are little-endian, row-major, and together
// they cover the data section exactly, without overlap or holes.

// MaxSafetensorsHeader bounds the JSON header a reader accepts (100 MB, the
// limit of the reference implementation).
const MaxSafetensorsHeader = 100 << 20

const metadataKey = "__metadata__"

// NamedTensor is a host tensor with its name in a safetensors file.
type NamedTensor struct {
	Name   string
	Tensor *tensor.Tensor
}

// SafetensorsEntry describes one tensor of a parsed file. Data aliases the
// file's bytes.
type SafetensorsEntry struct {
	Name   string
	DType  tensor.DType
	Shape  tensor.Shape
	Offset uint64 // where Data starts in the data section
	Data   []byte
}

// Safetensors is a parsed file: its metadata and its tensors by name.
type Safetensors struct {
	Metadata map[string]string
	Entries  map[string]*SafetensorsEntry
}

// stDType maps our dtypes to safetensors names and back.
var stDTypes = []struct {
	name string
	dt   tensor.DType
}{{"F32", tensor.Float32}, {"F64", tensor.Float64}, {"BF16", tensor.BFloat16}, {"I32", tensor.Int32}}

func stName(dt tensor.DType) (string, bool) {
	for _, d := range stDTypes {
		if d.dt == dt {
			return d.name, true
		}
	}
	return "", false
}

func stDType(name string) (tensor.DType, bool) {
	for _, d := range stDTypes {
		if d.name == name {
			return d.dt, true
		}
	}
	return tensor.Invalid, false
}

type stHeaderEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

// WriteSafetensors writes host tensors, in the order given, with optional
// metadata. Names must be unique and not "__metadata__".
func WriteSafetensors(w io.Writer, tensors []NamedTensor, metadata map[string]string) error {
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header[metadataKey] = metadata
	}
	var off uint64
	for _, nt := range tensors {
		if nt.Name == "" || nt.Name == metadataKey {
			return fmt.Errorf("train: safetensors: invalid tensor name %q", nt.Name)
		}
		if _, dup := header[nt.Name]; dup {
			return fmt.Errorf("train: safetensors: tensor name %q appears twice", nt.Name)
		}
		if nt.Tensor == nil {
			return fmt.Errorf("train: safetensors: tensor %q is nil", nt.Name)
		}
		name, ok := stName(nt.Tensor.DType())
		if !ok {
			return fmt.Errorf("train: safetensors: tensor %q has dtype %v, which has no safetensors name", nt.Name, nt.Tensor.DType())
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
		return fmt.Errorf("train: safetensors header: %w", err)
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
			return fmt.Errorf("train: safetensors tensor %q: %w", nt.Name, err)
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

// ReadSafetensors parses a whole safetensors file held in data. It checks
// the header length against the file, the header JSON, every dtype, shape
// and offset, and that the tensors tile the data section exactly. It never
// allocates more than a small multiple of len(data).
func ReadSafetensors(data []byte) (*Safetensors, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("truncated: %d bytes, but a safetensors file starts with an 8-byte header length", len(data))
	}
	hlen := binary.LittleEndian.Uint64(data)
	if hlen > uint64(len(data)-8) {
		return nil, fmt.Errorf("header length %d is beyond the file (%d bytes after the length field): truncated or not a safetensors file", hlen, len(data)-8)
	}
	if hlen > MaxSafetensorsHeader {
		return nil, fmt.Errorf("header length %d exceeds the limit of %d bytes", hlen, MaxSafetensorsHeader)
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
	st := &Safetensors{Metadata: map[string]string{}, Entries: map[string]*SafetensorsEntry{}}
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
		dt, ok := stDType(he.DType)
		if !ok {
			return nil, fmt.Errorf("tensor %q has unknown dtype %q (this reader handles F32, F64, BF16 and I32)", key, he.DType)
		}
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
		if want := numel * uint64(dt.Size()); want != end-begin {
			if numel >= limit {
				return nil, fmt.Errorf("tensor %q: shape %v holds more elements than the file has bytes", key, he.Shape)
			}
			return nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, but data_offsets [%d, %d] hold %d", key, he.Shape, he.DType, want, begin, end, end-begin)
		}
		st.Entries[key] = &SafetensorsEntry{Name: key, DType: dt, Shape: shape, Offset: begin, Data: body[begin:end:end]}
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
func (s *Safetensors) Names() []string {
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

// Tensor decodes entry into a new host tensor.
func (e *SafetensorsEntry) Tensor() (*tensor.Tensor, error) {
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
