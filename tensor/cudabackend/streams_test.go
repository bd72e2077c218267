package cudabackend

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

// foreignBuf is device memory of another allocator (cuda.Alloc), as NVSHMEM's
// symmetric heap is.
type foreignBuf struct {
	dev int
	ptr cuda.DevicePtr
	n   int
}

func (f *foreignBuf) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA, Index: f.dev} }
func (f *foreignBuf) DType() tensor.DType   { return tensor.Float32 }
func (f *foreignBuf) Len() int              { return f.n }
func (f *foreignBuf) Ptr() uint64           { return uint64(f.ptr) }

// The backend's ops accept same-device memory it did not allocate, and
// refuse to free it; a side stream forked after the backend's work and
// joined back orders a copy between two of its ops.
func TestForeignBuffersAndSideStreams(t *testing.T) {
	b := openGPU(t)
	const n = 1 << 20
	var f *foreignBuf
	err := b.OnDevice(func(*cuda.Stream) error {
		p, err := cuda.Alloc(4 * n)
		f = &foreignBuf{ptr: p, n: n}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.OnDevice(func(*cuda.Stream) error { return cuda.Free(f.ptr) })
	ft, err := tensor.New(f, 0, n)
	if err != nil {
		t.Fatal(err)
	}
	b.Fill(ft, 3) // an op writes the foreign tensor
	own := b.Zeros(tensor.Float32, n)
	host := tensor.MustHost(tensor.Float32, n)

	side, err := b.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	// On the side stream after the fill: copy the foreign tensor into own.
	if err := b.StreamWait(side, nil); err != nil {
		t.Fatal(err)
	}
	err = b.OnDevice(func(*cuda.Stream) error {
		return cuda.CopyDtoDAsync(cuda.DevicePtr(DevicePtr(own)), f.ptr, 4*n, side.(*cuda.Stream))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.StreamWait(nil, side); err != nil { // join
		t.Fatal(err)
	}
	b.Scale(own, own, 2)
	b.Download(host, own)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	for i, v := range host.F32() {
		if v != 6 {
			t.Fatalf("own[%d] = %v, want 6: the side stream's copy was not ordered between the fill and the scale", i, v)
		}
	}
	if err := b.DestroyStream(side); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamWait(42, nil); err == nil || !strings.Contains(err.Error(), "expected a *cuda.Stream") {
		t.Errorf("StreamWait on an int: %v, want a clear error", err)
	}

	b.Free(ft)
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "device memory of another allocator") {
		t.Fatalf("Free of a foreign tensor: %v, want it refused", err)
	}
}
