package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

func sampleTensors(t testing.TB) []Named {
	rng := testutil.Rng(3)
	ids := tensor.MustHost(tensor.Int32, 4)
	copy(ids.I32(), []int32{-1, 0, 7, 1 << 30})
	bf := tensor.MustHost(tensor.BFloat16, 3)
	copy(bf.BF16(), []uint16{0x3f80, 0xc000, 0x7fc0})
	return []Named{
		{"w", testutil.Rand(rng, tensor.Float32, 3, 5)},
		{"b", testutil.Rand(rng, tensor.Float64, 5)},
		{"ids", ids},
		{"h", bf},
		{"empty", tensor.MustHost(tensor.Float32, 0, 4)},
	}
}

func encodeSafetensors(t testing.TB, ts []Named, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, ts, meta); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSafetensorsRoundTrip(t *testing.T) {
	ts := sampleTensors(t)
	data := encodeSafetensors(t, ts, map[string]string{"step": "7"})
	if hl := binary.LittleEndian.Uint64(data); (8+hl)%8 != 0 {
		t.Errorf("data section starts at %d, not 8-byte aligned", 8+hl)
	}
	st, err := Read(data)
	if err != nil {
		t.Fatal(err)
	}
	if st.Metadata["step"] != "7" {
		t.Errorf("metadata %v", st.Metadata)
	}
	var names []string
	for _, nt := range ts {
		names = append(names, nt.Name)
		e := st.Entries[nt.Name]
		if e == nil {
			t.Fatalf("tensor %q missing", nt.Name)
		}
		got, err := e.Tensor()
		if err != nil {
			t.Fatal(err)
		}
		if got.DType() != nt.Tensor.DType() || !got.Shape().Equal(nt.Tensor.Shape()) {
			t.Fatalf("%q: got %v, want %v", nt.Name, got, nt.Tensor)
		}
		a, _ := tensorBytes(got)
		b, _ := tensorBytes(nt.Tensor)
		if !bytes.Equal(a, b) {
			t.Errorf("%q: data differs", nt.Name)
		}
	}
	// Names in data order (the empty tensor shares the last offset).
	if got := st.Names(); !reflect.DeepEqual(got[:4], names[:4]) {
		t.Errorf("Names() = %v, want data order %v", got, names)
	}
	// The header is plain safetensors JSON.
	var hdr map[string]json.RawMessage
	hl := binary.LittleEndian.Uint64(data)
	if err := json.Unmarshal(data[8:8+hl], &hdr); err != nil {
		t.Fatalf("header is not JSON: %v", err)
	}
	if string(hdr["b"]) != `{"dtype":"F64","shape":[5],"data_offsets":[60,100]}` {
		t.Errorf("header entry of b: %s", hdr["b"])
	}
	if err := Write(&bytes.Buffer{}, []Named{ts[0], ts[0]}, nil); err == nil {
		t.Errorf("duplicate names gave no error")
	}
}

// rawSafetensors builds a file from a header string and a data section.
func rawSafetensors(header string, data []byte) []byte {
	out := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(out, uint64(len(header)))
	return append(append(out, header...), data...)
}

func TestReadSafetensorsErrors(t *testing.T) {
	good := encodeSafetensors(t, sampleTensors(t), nil)
	d16 := make([]byte, 16)
	hugeLen := make([]byte, 16)
	binary.LittleEndian.PutUint64(hugeLen, 1<<62)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated: 0 bytes"},
		{"short", []byte{1, 2, 3}, "truncated: 3 bytes"},
		{"header beyond file", hugeLen, "header length 4611686018427387904 is beyond the file"},
		{"truncated data", good[:len(good)-3], "out of range"},
		{"trailing bytes", append(append([]byte{}, good...), 0, 0, 0, 0), "cover"},
		{"bad json", rawSafetensors(`{"a": `, nil), "bad header JSON"},
		{"not an object", rawSafetensors(`[1,2]`, nil), "bad header JSON"},
		{"trailing json", rawSafetensors(`{} {}`, nil), "unexpected bytes"},
		{"unknown dtype", rawSafetensors(`{"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}}`, d16[:2]), `unknown dtype "F8"`},
		{"shape mismatch", rawSafetensors(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}`, d16), "needs 12 bytes"},
		{"negative dim", rawSafetensors(`{"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}`, d16), "negative dimension"},
		{"huge shape", rawSafetensors(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}}`, d16), "more elements"},
		{"out of range", rawSafetensors(`{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`, d16), "out of range"},
		{"reversed", rawSafetensors(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, d16), "out of range"},
		{"overlap", rawSafetensors(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, d16), "overlap"},
		{"hole", rawSafetensors(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, d16), "hole"},
		{"duplicate", rawSafetensors(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, d16), "appears twice"},
		{"offsets arity", rawSafetensors(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}`, d16[:8]), "want [begin, end]"},
		{"bad metadata", rawSafetensors(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(tc.data)
			testutil.ErrorContains(t, err, tc.want)
		})
	}
}

func FuzzRead(f *testing.F) {
	f.Add(encodeSafetensors(f, sampleTensors(f), map[string]string{"k": "v"}))
	f.Add(encodeSafetensors(f, nil, nil))
	f.Add(rawSafetensors(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}`, make([]byte, 16)))
	f.Add(rawSafetensors(`{"a":{"dtype":"BF16","shape":[0,9223372036854775807],"data_offsets":[0,0]}}`, nil))
	f.Add(rawSafetensors(`{"__metadata__":{"x":"y"},"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Read(data)
		if err != nil {
			return
		}
		// Whatever parses decodes, and re-encodes to a file that parses to
		// the same tensors.
		var ts []Named
		for _, n := range st.Names() {
			if e := st.Entries[n]; e.DType == tensor.Invalid { // F16: float32 values only
				if _, err := e.Float32s(); err != nil {
					t.Fatalf("F16 entry %q parsed but does not decode: %v", n, err)
				}
				delete(st.Entries, n)
				continue
			}
			x, err := st.Entries[n].Tensor()
			if err != nil {
				t.Fatalf("entry %q parsed but does not decode: %v", n, err)
			}
			ts = append(ts, Named{n, x})
		}
		var buf bytes.Buffer
		if err := Write(&buf, ts, st.Metadata); err != nil {
			t.Fatalf("re-encoding: %v", err)
		}
		st2, err := Read(buf.Bytes())
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		if len(st2.Entries) != len(st.Entries) {
			t.Fatalf("re-encoded file has %d tensors, want %d", len(st2.Entries), len(st.Entries))
		}
		for n, e := range st.Entries {
			e2 := st2.Entries[n]
			if e2 == nil || e2.DType != e.DType || !e2.Shape.Equal(e.Shape) || !bytes.Equal(e2.Data, e.Data) {
				t.Fatalf("tensor %q changed in a round trip", n)
			}
		}
	})
}

// TestFloat32s decodes every float format, F16 included, against values
// computed independently (F16 bit patterns written out by hand).
func TestFloat32s(t *testing.T) {
	ts := sampleTensors(t)
	st, err := Read(encodeSafetensors(t, ts, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, nt := range ts[:2] { // "w" F32, "b" F64
		got, err := st.Entries[nt.Name].Float32s()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := nt.Tensor.Float64s()
		for i := range want {
			if got[i] != float32(want[i]) {
				t.Fatalf("%s[%d] = %v, want %v", nt.Name, i, got[i], float32(want[i]))
			}
		}
	}
	bf, err := st.Entries["h"].Float32s()
	if err != nil || bf[0] != 1 || bf[1] != -2 || !math.IsNaN(float64(bf[2])) {
		t.Errorf("BF16 values %v (%v), want [1 -2 NaN]", bf, err)
	}
	if _, err := st.Entries["ids"].Float32s(); err == nil {
		t.Error("Float32s of an I32 tensor gave no error")
	}
	// F16: 1, -2, 0.5, 65504 (max), 2^-24 (smallest subnormal), -0, +Inf.
	bits := []uint16{0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x8000, 0x7c00}
	want := []float64{1, -2, 0.5, 65504, math.Ldexp(1, -24), math.Copysign(0, -1), math.Inf(1)}
	data := make([]byte, 2*len(bits))
	for i, b := range bits {
		binary.LittleEndian.PutUint16(data[2*i:], b)
	}
	f, err := Read(rawSafetensors(`{"x":{"dtype":"F16","shape":[7],"data_offsets":[0,14]}}`, data))
	if err != nil {
		t.Fatal(err)
	}
	e := f.Entries["x"]
	if _, err := e.Tensor(); err == nil || !strings.Contains(err.Error(), "Float32s") {
		t.Errorf("Tensor() of an F16 entry: %v, want an error pointing at Float32s", err)
	}
	got, err := e.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if float64(got[i]) != want[i] || math.Signbit(float64(got[i])) != math.Signbit(want[i]) {
			t.Errorf("F16 %#04x = %v, want %v", bits[i], got[i], want[i])
		}
	}
}

// TestWriteFile round-trips through a file, checks its mode, and that a
// write that fails leaves neither the file nor a temporary behind.
func TestWriteFile(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	ts := sampleTensors(t)
	if err := WriteFile(path, ts, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 under umask 022", fi.Mode().Perm())
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["k"] != "v" || len(f.Entries) != len(ts) {
		t.Errorf("read back %d tensors, metadata %v", len(f.Entries), f.Metadata)
	}
	bad := filepath.Join(dir, "bad.safetensors")
	if err := WriteFile(bad, []Named{{"a", ts[0].Tensor}, {"a", ts[1].Tensor}}, nil); err == nil {
		t.Fatal("a duplicate name gave no error")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("after a failed write the directory holds %v, want only w.safetensors", names)
	}
	if _, err := ReadFile(filepath.Join(dir, "none")); err == nil {
		t.Error("ReadFile of a missing file gave no error")
	}
}

// F16 decoding against values whose bits are known.
func TestHalf(t *testing.T) {
	for h, want := range map[uint16]float32{0x3c00: 1, 0xc000: -2, 0x3555: 0.33325195, 0x0001: 5.9604645e-08, 0x7bff: 65504, 0x8000: float32(math.Copysign(0, -1))} {
		if got := halfToFloat32(h); got != want || math.Signbit(float64(got)) != math.Signbit(float64(want)) {
			t.Errorf("half %#04x = %v, want %v", h, got, want)
		}
	}
	if !math.IsInf(float64(halfToFloat32(0x7c00)), 1) || !math.IsNaN(float64(halfToFloat32(0x7e00))) {
		t.Error("half inf or nan")
	}
}
