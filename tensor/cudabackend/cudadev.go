package cudabackend

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// cudaDevice is gpu.Device on a real GPU through package cuda: the device's
// primary context, one non-blocking stream, a cuBLASLt handle and the
// kernels image.
type cudaDevice struct {
	ordinal int
	name    string
	ctx     *cuda.Context
	stream  *cuda.Stream
	blas    *cuda.Blas
	mod     *cuda.Module
	fns     map[string]*cuda.Function
	smemSet map[string]int // the dynamic shared memory limit set per kernel
	sms     int
	// engineSMs is the SMs this process may use (its MPS share): the
	// persistent grids of the GEMM engine are sized to it. engineSMsFrom
	// says where the figure came from.
	engineSMs     int
	engineSMsFrom string
	reads         []*readSlot // free pinned buffers and events of ReadAsync
}

// readSlot is one ReadAsync's pinned buffer and the event after its copies.
// Slots are kept for reuse: cuMemAllocHost is slow and cuMemFreeHost
// synchronises the device, neither of which a training step should pay.
type readSlot struct {
	host *cuda.HostBuffer
	ev   *cuda.Event
}

var _ gpu.Device = (*cudaDevice)(nil)

// openCUDA opens device ordinal and loads the kernels image at path.
func openCUDA(ordinal int, path string) (d *cudaDevice, err error) {
	if err := cuda.Init(); err != nil {
		return nil, err
	}
	dev, err := cuda.GetDevice(ordinal)
	if err != nil {
		return nil, err
	}
	ctx, err := dev.PrimaryContext()
	if err != nil {
		return nil, err
	}
	d = &cudaDevice{ordinal: ordinal, ctx: ctx, fns: make(map[string]*cuda.Function), smemSet: make(map[string]int)}
	if err := d.Acquire(); err != nil {
		return nil, err
	}
	defer d.Release()
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	d.name = dev.String()
	if n, err := dev.Name(); err == nil {
		d.name += " (" + n + ")"
	}
	if d.sms, err = dev.SMCount(); err != nil {
		return nil, err
	}
	d.engineSMs, d.engineSMsFrom = engineShare(d.sms, cuda.ContextSMCount)
	if d.stream, err = cuda.NewStream(); err != nil {
		return nil, err
	}
	if d.blas, err = cuda.NewBlas(0); err != nil {
		return nil, err
	}
	if d.mod, err = cuda.LoadModuleFile(path); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *cudaDevice) Acquire() error {
	runtime.LockOSThread()
	if err := d.ctx.Bind(); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

func (d *cudaDevice) Release() { runtime.UnlockOSThread() }

func (d *cudaDevice) Name() string { return d.name }

func (d *cudaDevice) SMCount() int { return d.sms }

func (d *cudaDevice) Alloc(bytes int) (gpu.Ptr, error) {
	p, err := cuda.Alloc(bytes)
	return gpu.Ptr(p), err
}

func (d *cudaDevice) Free(p gpu.Ptr) error { return cuda.Free(cuda.DevicePtr(p)) }

func (d *cudaDevice) Memset8(p gpu.Ptr, v uint8, n int) error {
	if n == 0 {
		return nil
	}
	return cuda.MemsetD8Async(cuda.DevicePtr(p), v, n, d.stream)
}

func (d *cudaDevice) Memset16(p gpu.Ptr, v uint16, n int) error {
	if n == 0 {
		return nil
	}
	return cuda.MemsetD16Async(cuda.DevicePtr(p), v, n, d.stream)
}

func (d *cudaDevice) Memset32(p gpu.Ptr, v uint32, n int) error {
	if n == 0 {
		return nil
	}
	return cuda.MemsetD32Async(cuda.DevicePtr(p), v, n, d.stream)
}

// CopyHtoD queues the copy on the stream; from pageable (Go) memory the
// driver stages src before returning, so src may be reused at once.
func (d *cudaDevice) CopyHtoD(dst gpu.Ptr, src unsafe.Pointer, bytes int) error {
	return cuda.CopyHtoDAsync(cuda.DevicePtr(dst), src, bytes, d.stream)
}

// CopyDtoH queues the copy on the stream; into pageable (Go) memory it
// returns once the copy, and so the work queued before it, is done.
func (d *cudaDevice) CopyDtoH(dst unsafe.Pointer, src gpu.Ptr, bytes int) error {
	if err := cuda.CopyDtoHAsync(dst, cuda.DevicePtr(src), bytes, d.stream); err != nil {
		return err
	}
	// Pageable copies complete before returning; a pinned destination
	// would not, so wait explicitly (cheap when already done).
	return d.stream.Synchronize()
}

// ReadAsync queues the copies into a pinned slot and records an event after
// them; wait synchronises on that event only, copies the bytes out and
// returns the slot to the free list.
func (d *cudaDevice) ReadAsync(spans []gpu.Span) (func() ([]byte, error), error) {
	total := 0
	for _, sp := range spans {
		total += sp.Bytes
	}
	if total > gpu.ReadAsyncMax {
		return nil, fmt.Errorf("ReadAsync of %d bytes, at most %d", total, gpu.ReadAsyncMax)
	}
	var sl *readSlot
	if n := len(d.reads); n > 0 {
		sl, d.reads = d.reads[n-1], d.reads[:n-1]
	} else {
		h, err := cuda.AllocHost(gpu.ReadAsyncMax)
		if err != nil {
			return nil, err
		}
		ev, err := cuda.NewEvent(false)
		if err != nil {
			h.Free()
			return nil, err
		}
		sl = &readSlot{host: h, ev: ev}
	}
	off := 0
	for _, sp := range spans {
		if sp.Bytes == 0 {
			continue
		}
		if err := cuda.CopyDtoHAsync(unsafe.Add(sl.host.Ptr(), off), cuda.DevicePtr(sp.Ptr), sp.Bytes, d.stream); err != nil {
			d.reads = append(d.reads, sl) // nothing queued into it can still land: the copy failed
			return nil, err
		}
		off += sp.Bytes
	}
	if err := sl.ev.Record(d.stream); err != nil {
		d.stream.Synchronize() // the copies must land before the slot is reused
		d.reads = append(d.reads, sl)
		return nil, err
	}
	return func() ([]byte, error) {
		err := sl.ev.Synchronize()
		out := append([]byte(nil), sl.host.Bytes()[:total]...)
		d.reads = append(d.reads, sl)
		return out, err
	}, nil
}

func (d *cudaDevice) CopyDtoD(dst, src gpu.Ptr, bytes int) error {
	return cuda.CopyDtoDAsync(cuda.DevicePtr(dst), cuda.DevicePtr(src), bytes, d.stream)
}

var _ gpu.Values = (*cudaDevice)(nil)

func (d *cudaDevice) WriteValue64(p gpu.Ptr, v uint64) error {
	return d.stream.WriteValue64(cuda.DevicePtr(p), v)
}

func (d *cudaDevice) WaitValue64(p gpu.Ptr, v uint64) error {
	return d.stream.WaitValue64(cuda.DevicePtr(p), v, cuda.WaitGEQ)
}

func (d *cudaDevice) function(name string) (*cuda.Function, error) {
	if f, ok := d.fns[name]; ok {
		return f, nil
	}
	f, err := d.mod.Function(name)
	if err != nil {
		return nil, err
	}
	d.fns[name] = f
	return f, nil
}

func (d *cudaDevice) HasKernel(name string) bool {
	_, err := d.function(name)
	return err == nil
}

func (d *cudaDevice) Launch(name string, grid, block gpu.Dim3, smem int, args ...any) error {
	return d.launchOn(d.stream, name, grid, block, smem, args...)
}

// launchOn is Launch on stream s (a side stream of the same context).
func (d *cudaDevice) launchOn(s *cuda.Stream, name string, grid, block gpu.Dim3, smem int, args ...any) error {
	f, err := d.function(name)
	if err != nil {
		return err
	}
	conv := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case gpu.Ptr:
			conv[i] = cuda.DevicePtr(v)
		case int32, int64, float32:
			conv[i] = v
		default:
			return fmt.Errorf("kernel %s: argument %d has type %T (want gpu.Ptr, int32, int64 or float32)", name, i, a)
		}
	}
	if smem > 48<<10 && d.smemSet[name] < smem {
		if err := f.SetMaxDynamicSharedMemory(smem); err != nil {
			return err
		}
		d.smemSet[name] = smem
	}
	return cuda.Launch(f, grid, block, uint32(smem), s, conv...)
}

func (d *cudaDevice) Gemm(g gpu.Gemm) error {
	t := cuda.BFloat16
	if g.Type == gpu.F32 {
		t = cuda.Float32
	}
	return d.blas.Gemm(d.stream, cuda.GemmParams{
		TransA: g.TransA, TransB: g.TransB,
		M: g.M, N: g.N, K: g.K,
		Alpha: g.Alpha, Beta: g.Beta,
		A: cuda.DevicePtr(g.A), B: cuda.DevicePtr(g.B), C: cuda.DevicePtr(g.C),
		TypeA: t, TypeB: t, TypeC: t,
		Batch: g.Batch,
	})
}

func (d *cudaDevice) Sync() error { return d.stream.Synchronize() }

// Close releases the stream, cuBLASLt and the module. The caller has
// acquired the device.
func (d *cudaDevice) Close() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if d.stream != nil {
		keep(d.stream.Synchronize())
	}
	for _, sl := range d.reads {
		keep(sl.ev.Destroy())
		keep(sl.host.Free())
	}
	d.reads = nil
	if d.blas != nil {
		keep(d.blas.Destroy())
		d.blas = nil
	}
	if d.mod != nil {
		keep(d.mod.Unload())
		d.mod = nil
	}
	if d.stream != nil {
		keep(d.stream.Destroy())
		d.stream = nil
	}
	return first
}
