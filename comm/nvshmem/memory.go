package nvshmem

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// SymmetricBuffer is memory on NVSHMEM's symmetric heap (AllocSymmetric):
// every rank of the world has a buffer at the same symmetric address, and
// Ptr of rank r's buffer is also where a kernel on any PE names it in NVSHMEM
// calls with pe = r. It implements tensor.Buffer, with Ptr like
// tensor/cudabackend's Buffer.
//
// Collectives on tensors of symmetric buffers skip the staging copies where
// NVSHMEM allows it (all-gather and reduce-scatter on a team); every rank
// must then pass the same view (offset and shape) of its buffer.
type SymmetricBuffer struct {
	w     *world
	ptr   uint64
	dtype tensor.DType
	n     int
	freed atomic.Bool
}

var _ tensor.Buffer = (*SymmetricBuffer)(nil)

// Device is the world's GPU on this rank.
func (b *SymmetricBuffer) Device() tensor.Device {
	return tensor.Device{Kind: tensor.CUDA, Index: b.w.dev}
}

// DType is the element type.
func (b *SymmetricBuffer) DType() tensor.DType { return b.dtype }

// Len is the number of elements.
func (b *SymmetricBuffer) Len() int { return b.n }

// Ptr is the symmetric (and local) device address of element 0.
func (b *SymmetricBuffer) Ptr() uint64 { return b.ptr }

// PeerPtr is the address through which this rank reaches world rank r's
// buffer with ordinary loads and stores (nvshmem_ptr), or 0 when r is not
// P2P-reachable (use NVSHMEM puts and gets with the symmetric address).
func (b *SymmetricBuffer) PeerPtr(r int) uint64 {
	if r < 0 || r >= b.w.size || b.freed.Load() {
		return 0
	}
	return cPtr(b.ptr, r)
}

// AllocSymmetric implements comm.SymmetricMemory: a zeroed tensor on
// NVSHMEM's symmetric heap (nvshmem_calloc). NVSHMEM allocates collectively
// over the whole world, so on the world or on any group it is a world
// collective: every rank of the world makes the same call (shape and
// dtype) in the same order as the other world-collective calls — ranks
// that build the same model do. The tensor is usable by every group. It
// waits for this group's queued ops first (NVSHMEM allows no collective
// during an allocation). The heap's size is NVSHMEM_SYMMETRIC_SIZE (1 GiB
// by default, grown on demand where NVSHMEM uses CUDA VMM).
func (c *Comm) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	const op = "alloc-symmetric"
	s := tensor.Shape(shape)
	for _, d := range s {
		if d < 0 {
			return nil, comm.Errorf(c, op, "shape %v: expected dimensions ≥ 0", s)
		}
	}
	if dt.Size() == 0 {
		return nil, comm.Errorf(c, op, "dtype %v: expected f32, bf16, i32 or f64", dt)
	}
	if err := c.usable(op); err != nil {
		return nil, err
	}
	c.w.splitMu.Lock()
	defer c.w.splitMu.Unlock()
	if err := c.drain(op); err != nil {
		return nil, err
	}
	n := s.Numel()
	bytes := max(int64(n)*int64(dt.Size()), 1)
	var p uint64
	err := c.w.blocking(fmt.Sprintf("nvshmem_calloc(%d bytes)", bytes), time.Now().Add(c.w.opts.timeout), func() error {
		q, err := cCalloc(bytes)
		p = q
		return err
	})
	if err != nil {
		return nil, comm.Errorf(c, op, "%v%v: %w", dt, s, err)
	}
	t, err := tensor.New(&SymmetricBuffer{w: c.w, ptr: p, dtype: dt, n: n}, 0, shape...)
	if err != nil { // cannot happen: the buffer fits the shape
		return nil, comm.Errorf(c, op, "%w", err)
	}
	return t, nil
}

// FreeSymmetric gives a tensor of AllocSymmetric back to the symmetric heap
// (nvshmem_free). Like AllocSymmetric it is collective over the world
// (called on any group, by every rank of the world); only whole allocations may be
// freed, and no op may still use them.
func (c *Comm) FreeSymmetric(t *tensor.Tensor) error {
	const op = "free-symmetric"
	b, ok := t.Buffer().(*SymmetricBuffer)
	switch {
	case !ok || b.w != c.w:
		return comm.Errorf(c, op, "%v: expected a tensor of this world's AllocSymmetric", t)
	case t.Offset() != 0 || t.Numel() != b.n:
		return comm.Errorf(c, op, "%v is a view of %d elements at offset %d of a buffer of %d: expected a whole allocation", t, t.Numel(), t.Offset(), b.n)
	}
	if err := c.usable(op); err != nil {
		return err
	}
	if b.freed.Swap(true) {
		return comm.Errorf(c, op, "%v: expected a tensor not freed yet", t)
	}
	c.w.splitMu.Lock()
	defer c.w.splitMu.Unlock()
	if err := c.drain(op); err != nil {
		return err
	}
	err := c.w.blocking("nvshmem_free", time.Now().Add(c.w.opts.timeout), func() error { return cFree(b.ptr) })
	if err != nil {
		return comm.Errorf(c, op, "%w", err)
	}
	return nil
}

// PeerPtr implements comm.SymmetricMemory: the address through which this
// rank reaches group rank r's copy of t (nvshmem_ptr of the PE of r, plus
// t's offset), or an error when that PE is not P2P-reachable.
func (c *Comm) PeerPtr(t *tensor.Tensor, r int) (uint64, error) {
	const op = "peer-ptr"
	b, ok := t.Buffer().(*SymmetricBuffer)
	if !ok || b.w != c.w {
		return 0, comm.Errorf(c, op, "%v: expected a tensor of this world's AllocSymmetric", t)
	}
	if r < 0 || r >= c.size {
		return 0, comm.Errorf(c, op, "rank %d: expected a rank of the group's %d", r, c.size)
	}
	p := b.PeerPtr(c.members[r])
	if p == 0 {
		return 0, comm.Errorf(c, op, "world rank %d (PE %d) is not reachable by loads and stores from this PE (nvshmem_ptr is NULL): another node", c.members[r], c.members[r])
	}
	return p + uint64(t.Offset()*t.DType().Size()), nil
}

// Reaches implements comm.LoadStore: whether group rank a's PE reaches
// group rank b's symmetric heap by loads and stores (nvshmem_ptr is not
// NULL), as every rank told the others at New.
func (c *Comm) Reaches(a, b int) bool {
	if a < 0 || b < 0 || a >= c.size || b >= c.size {
		return false
	}
	return c.w.peers[c.members[a]].P2P[c.members[b]]
}

// ---- plain device memory ------------------------------------------------------

// DeviceBuffer is plain device memory (not symmetric) from DeviceMemory: the
// transport moves it through the staging area. It implements tensor.Buffer,
// with Ptr like tensor/cudabackend's Buffer.
type DeviceBuffer struct {
	dev     int
	ptr     uint64
	dtype   tensor.DType
	n       int
	freed   atomic.Bool
	cleanup runtime.Cleanup
}

var _ tensor.Buffer = (*DeviceBuffer)(nil)

func (b *DeviceBuffer) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA, Index: b.dev} }
func (b *DeviceBuffer) DType() tensor.DType   { return b.dtype }
func (b *DeviceBuffer) Len() int              { return b.n }

// Ptr is the device address of element 0 (0 once freed).
func (b *DeviceBuffer) Ptr() uint64 {
	if b.freed.Load() {
		return 0
	}
	return b.ptr
}

// Free gives the memory back now; it happens anyway when the buffer becomes
// unreachable. No queued work may still use it.
func (b *DeviceBuffer) Free() error {
	if b.freed.Swap(true) {
		return nil
	}
	b.cleanup.Stop()
	return cDevFree(b.dev, b.ptr)
}

// DeviceMemory allocates tensors of any dtype (f64 included) in plain device
// memory of one GPU and copies them to and from the host, synchronously: the
// Memory of the conformance suite (commtest.WithMemory) and of tools that
// have no tensor backend. Allocation uses the stream-ordered allocator, so it
// never waits for kernels that other groups have queued.
type DeviceMemory struct {
	dev int
}

// NewDeviceMemory loads the library (Load) and returns the Memory of CUDA
// device ordinal device.
func NewDeviceMemory(device int) (*DeviceMemory, error) {
	if _, err := Load(); err != nil {
		return nil, err
	}
	n, err := cDeviceCount()
	if err != nil {
		return nil, fmt.Errorf("nvshmem: %w", err)
	}
	if device < 0 || device >= n {
		return nil, fmt.Errorf("nvshmem: device %d: this machine has %d CUDA devices", device, n)
	}
	return &DeviceMemory{dev: device}, nil
}

// Alloc returns a zeroed tensor in device memory.
func (m *DeviceMemory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	s := tensor.Shape(shape)
	for _, d := range s {
		if d < 0 {
			return nil, fmt.Errorf("nvshmem: Alloc(%v, %v): negative dimension", dt, s)
		}
	}
	if dt.Size() == 0 {
		return nil, fmt.Errorf("nvshmem: Alloc(%v, %v): invalid dtype", dt, s)
	}
	n := s.Numel()
	bytes := max(int64(n)*int64(dt.Size()), 1)
	p, err := cDevAlloc(m.dev, bytes)
	if err == nil {
		err = cMemsetAsync(m.dev, p, 0, bytes, 0)
		if err == nil {
			err = cStreamSync(m.dev, 0)
		}
		if err != nil {
			cDevFree(m.dev, p)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("nvshmem: Alloc(%v, %v) on cuda:%d: %w", dt, s, m.dev, err)
	}
	b := &DeviceBuffer{dev: m.dev, ptr: p, dtype: dt, n: n}
	b.cleanup = runtime.AddCleanup(b, func(p uint64) { cDevFree(m.dev, p) }, p)
	return tensor.New(b, 0, shape...)
}

// Upload copies the host tensor src into the device tensor dst (same dtype
// and number of elements).
func (m *DeviceMemory) Upload(dst, src *tensor.Tensor) error {
	h, bytes, err := hostBytes(src)
	if err != nil {
		return err
	}
	p, err := devicePtr(dst, src)
	if err != nil {
		return err
	}
	if bytes == 0 {
		return nil
	}
	err = cHtoD(m.dev, p, h, bytes)
	runtime.KeepAlive(src)
	return err
}

// Download copies the device tensor src into the host tensor dst (same
// dtype and number of elements).
func (m *DeviceMemory) Download(dst, src *tensor.Tensor) error {
	h, bytes, err := hostBytes(dst)
	if err != nil {
		return err
	}
	p, err := devicePtr(src, dst)
	if err != nil {
		return err
	}
	if bytes == 0 {
		return nil
	}
	err = cDtoH(m.dev, h, p, bytes)
	runtime.KeepAlive(dst)
	return err
}

// hostBytes returns the address and size of a host tensor's elements.
func hostBytes(t *tensor.Tensor) (unsafe.Pointer, int64, error) {
	bytes := int64(t.Bytes())
	if bytes == 0 {
		return nil, 0, nil
	}
	switch {
	case t.F32() != nil:
		return unsafe.Pointer(&t.F32()[0]), bytes, nil
	case t.F64() != nil:
		return unsafe.Pointer(&t.F64()[0]), bytes, nil
	case t.I32() != nil:
		return unsafe.Pointer(&t.I32()[0]), bytes, nil
	case t.BF16() != nil:
		return unsafe.Pointer(&t.BF16()[0]), bytes, nil
	}
	return nil, 0, fmt.Errorf("nvshmem: %v: expected a host tensor", t)
}

// devicePtr is the device address of d's first element, checked against the
// host tensor h it is copied to or from.
func devicePtr(d, h *tensor.Tensor) (uint64, error) {
	if d.DType() != h.DType() || d.Numel() != h.Numel() {
		return 0, fmt.Errorf("nvshmem: copy between %v and %v: expected the same dtype and number of elements", d, h)
	}
	b, ok := d.Buffer().(devicePointer)
	if !ok || d.Device().Kind != tensor.CUDA {
		return 0, fmt.Errorf("nvshmem: %v: expected a device tensor whose buffer has Ptr() uint64", d)
	}
	if b.Ptr() == 0 && d.Numel() > 0 {
		return 0, errors.New("nvshmem: " + d.String() + ": expected device memory, found a freed buffer")
	}
	return b.Ptr() + uint64(d.Offset()*d.DType().Size()), nil
}
