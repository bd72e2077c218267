package cuda

// Tests that need a GPU. Each skips, saying why, where the driver library
// or a device is missing.

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// withGPU runs fn on device 0 (its primary context bound on a locked OS
// thread), or skips when no GPU can be used.
func withGPU(tb testing.TB, fn func(ctx *Context)) {
	tb.Helper()
	if err := Init(); err != nil {
		tb.Skipf("no GPU: %v", err)
	}
	n, err := DeviceCount()
	if err != nil {
		tb.Skipf("no GPU: %v", err)
	}
	if n == 0 {
		tb.Skip("no GPU: the driver reports no CUDA device")
	}
	if err := OnDevice(0, func(c *Context) error { fn(c); return nil }); err != nil {
		tb.Fatal(err)
	}
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

// alloc allocates device memory freed at the end of the test.
func alloc(tb testing.TB, bytes int) DevicePtr {
	tb.Helper()
	p, err := Alloc(bytes)
	must(tb, err)
	cleanupOnGPU(tb, func() { Free(p) })
	return p
}

// cleanupOnGPU registers a cleanup that runs with device 0's context bound:
// cleanups run after withGPU has returned, maybe on another OS thread.
func cleanupOnGPU(tb testing.TB, fn func()) {
	tb.Cleanup(func() {
		OnDevice(0, func(*Context) error { fn(); return nil })
	})
}

func newStream(tb testing.TB) *Stream {
	tb.Helper()
	s, err := NewStream()
	must(tb, err)
	cleanupOnGPU(tb, func() { s.Destroy() })
	return s
}

func newEvent(tb testing.TB, timing bool) *Event {
	tb.Helper()
	e, err := NewEvent(timing)
	must(tb, err)
	cleanupOnGPU(tb, func() { e.Destroy() })
	return e
}

func TestDeviceQuery(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		d := ctx.Device()
		name, err := d.Name()
		must(t, err)
		major, minor, err := d.ComputeCapability()
		must(t, err)
		sms, err := d.SMCount()
		must(t, err)
		mem, err := d.TotalMem()
		must(t, err)
		ver, err := DriverVersion()
		must(t, err)
		free, total, err := MemInfo()
		must(t, err)
		optin, err := d.Attribute(AttrMaxSharedMemoryPerBlockOptin)
		must(t, err)
		memops, err := d.Attribute(AttrCanUse64BitStreamMemOps)
		must(t, err)
		t.Logf("%v: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free), driver CUDA %d, %d KiB shared/block opt-in, 64-bit stream memops %d",
			d, name, major, minor, sms, float64(mem)/(1<<30), float64(free)/(1<<30), ver, optin>>10, memops)
		if name == "" || major < 1 || sms < 1 || mem <= 0 || total <= 0 || free > total {
			t.Errorf("implausible device properties")
		}
		cur, err := CurrentDevice()
		must(t, err)
		if cur.Ordinal() != d.Ordinal() {
			t.Errorf("current device %v, want %v", cur, d)
		}
		if c2, err := d.PrimaryContext(); err != nil || c2 != ctx {
			t.Errorf("PrimaryContext is not cached: %v, %v", c2, err)
		}
		if _, err := GetDevice(1 << 20); err == nil || !errors.Is(err, ErrInvalidDevice) {
			t.Errorf("GetDevice(huge) = %v, want CUDA_ERROR_INVALID_DEVICE", err)
		}
	})
}

func TestAllocError(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		const huge = 1 << 50
		_, err := Alloc(huge)
		if err == nil {
			t.Fatal("allocating 1 PiB succeeded")
		}
		want := "cuda: cuMemAlloc(1125899906842624 bytes) on cuda:0: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
		if err.Error() != want || !errors.Is(err, ErrOutOfMemory) {
			t.Errorf("got  %q\nwant %q", err, want)
		}
	})
}

func TestCopyRoundTrip(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		rng := rand.New(rand.NewPCG(1, 2))
		const n = 1<<20 + 3
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		a, b := alloc(t, n), alloc(t, n)
		must(t, Upload(a, src))
		must(t, CopyDtoD(b, a, n))
		got := make([]byte, n)
		must(t, Download(got, b))
		if !bytes.Equal(got, src) {
			t.Fatal("sync round trip changed the bytes")
		}

		// Async through pinned memory on a stream, at an odd offset.
		s := newStream(t)
		h, err := AllocHost(n)
		must(t, err)
		defer h.Free()
		hb := h.Bytes()
		copy(hb, src)
		must(t, CopyHtoDAsync(a.Offset(1), h.Ptr(), n-1, s))
		must(t, MemsetD8Async(b, 0, n, s))
		must(t, CopyDtoDAsync(b, a.Offset(1), n-1, s))
		clear(hb)
		must(t, CopyDtoHAsync(h.Ptr(), b, n-1, s))
		must(t, s.Synchronize())
		if !bytes.Equal(hb[:n-1], src[:n-1]) {
			t.Fatal("async round trip through pinned memory changed the bytes")
		}

		// Typed copies.
		f := make([]float32, 1000)
		for i := range f {
			f[i] = rng.Float32()
		}
		must(t, UploadAsync(a, f, s))
		g := make([]float32, len(f))
		must(t, DownloadAsync(g, a, s))
		must(t, s.Synchronize())
		for i := range f {
			if f[i] != g[i] {
				t.Fatalf("float32 round trip: [%d] = %v, want %v", i, g[i], f[i])
			}
		}
		hs := HostSlice[float32](h)
		if len(hs) != n/4 {
			t.Errorf("HostSlice length %d, want %d", len(hs), n/4)
		}
	})
}

func TestMemset(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		const n = 4097 // words
		p := alloc(t, 4*n)
		s := newStream(t)
		got := make([]uint32, n)
		check := func(name string, want func(i int) uint32) {
			t.Helper()
			must(t, Download(got, p))
			for i := range got {
				if got[i] != want(i) {
					t.Fatalf("%s: word %d = %#x, want %#x", name, i, got[i], want(i))
				}
			}
		}
		must(t, MemsetD32(p, 0xdeadbeef, n))
		check("MemsetD32", func(int) uint32 { return 0xdeadbeef })
		must(t, MemsetD16(p, 0x3f80, 2*n)) // bf16 1.0
		check("MemsetD16", func(int) uint32 { return 0x3f803f80 })
		must(t, MemsetD8(p.Offset(4), 0xab, 4))
		check("MemsetD8", func(i int) uint32 {
			if i == 1 {
				return 0xabababab
			}
			return 0x3f803f80
		})
		must(t, MemsetD32Async(p, 7, n, s))
		must(t, MemsetD16Async(p, 0x1234, 2, s))
		must(t, MemsetD8Async(p.Offset(4*(n-1)), 0x55, 4, s))
		must(t, s.Synchronize())
		check("async memsets", func(i int) uint32 {
			switch i {
			case 0:
				return 0x12341234
			case n - 1:
				return 0x55555555
			}
			return 7
		})
	})
}

// TestStreamEventOrdering: a stream that waits for an event recorded after
// long work on another stream sees that work's result; timing events
// measure it.
func TestStreamEventOrdering(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		const bytes = 256 << 20
		x, y := alloc(t, bytes), alloc(t, 4096)
		s1, s2 := newStream(t), newStream(t)
		start, end := newEvent(t, true), newEvent(t, true)
		done := newEvent(t, false)
		must(t, MemsetD32(y, 0, 1024))
		must(t, ctx.Synchronize()) // legacy-stream memsets vs. non-blocking streams
		must(t, start.Record(s1))
		const reps = 40
		for i := 1; i <= reps; i++ {
			must(t, MemsetD32Async(x, uint32(i), bytes/4, s1))
		}
		must(t, end.Record(s1))
		must(t, done.Record(s1))
		must(t, s2.WaitEvent(done))
		// Copy the last words, written last.
		must(t, CopyDtoDAsync(y, x.Offset(bytes-4096), 4096, s2))
		must(t, s2.Synchronize())
		got := make([]uint32, 1024)
		must(t, Download(got, y))
		for i, v := range got {
			if v != reps {
				t.Fatalf("word %d = %d after waiting for the event, want %d", i, v, reps)
			}
		}
		if ok, err := end.Query(); err != nil || !ok {
			t.Errorf("end event not complete after the waiting stream finished: %v, %v", ok, err)
		}
		el, err := Elapsed(start, end)
		must(t, err)
		gbps := float64(reps) * bytes / el.Seconds() / 1e9
		t.Logf("%d memsets of %d MiB: %v (%.0f GB/s)", reps, bytes>>20, el, gbps)
		if el <= 0 || gbps < 50 || gbps > 50000 {
			t.Errorf("implausible elapsed time %v (%.0f GB/s): wrong units?", el, gbps)
		}
		if _, err := Elapsed(done, end); err == nil {
			t.Errorf("Elapsed accepted an event without timing")
		}
		if ok, err := s1.Query(); err != nil || !ok {
			t.Errorf("s1.Query() = %v, %v", ok, err)
		}
		must(t, ctx.Synchronize())
	})
}

// TestWaitWriteValue64: a stream blocked on a flag in device memory stays
// blocked until another stream writes the flag after producing data, and
// then sees the data.
func TestWaitWriteValue64(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		const words = 1 << 20
		flag := alloc(t, 8)
		x, y := alloc(t, 4*words), alloc(t, 4*words)
		must(t, MemsetD32(flag, 0, 2))
		must(t, MemsetD32(x, 0, words))
		must(t, MemsetD32(y, 0, words))
		must(t, ctx.Synchronize()) // the flag must read 0 before the streams start
		producer, consumer := newStream(t), newStream(t)

		must(t, consumer.WaitValue64(flag, 41, WaitGEQ))
		must(t, CopyDtoDAsync(y, x, 4*words, consumer))
		time.Sleep(50 * time.Millisecond)
		if ok, err := consumer.Query(); err != nil || ok {
			t.Fatalf("consumer ran before the flag was written: done=%v err=%v", ok, err)
		}
		must(t, MemsetD32Async(x, 0xabcd, words, producer))
		must(t, producer.WriteValue64(flag, 42))

		deadline := time.Now().Add(10 * time.Second)
		for {
			ok, err := consumer.Query()
			must(t, err)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("consumer still blocked 10 s after the flag was written")
			}
			time.Sleep(time.Millisecond)
		}
		got := make([]uint32, words)
		must(t, Download(got, y))
		for i, v := range got {
			if v != 0xabcd {
				t.Fatalf("consumer copied word %d = %#x, want 0xabcd (data written before the flag)", i, v)
			}
		}
		var f [1]uint64
		must(t, Download(f[:], flag))
		if f[0] != 42 {
			t.Errorf("flag = %d, want 42", f[0])
		}

		// 32-bit variants, equality condition.
		must(t, consumer.WaitValue32(flag, 7, WaitEQ))
		must(t, MemsetD32Async(y, 1, words, consumer))
		must(t, producer.WriteValue32(flag, 7))
		must(t, consumer.Synchronize())
		must(t, Download(got[:1], y))
		if got[0] != 1 {
			t.Errorf("after WaitValue32: %d, want 1", got[0])
		}
	})
}

func loadTestModule(t *testing.T) *Module {
	t.Helper()
	m, err := LoadModule("test.ptx", []byte(testPTX))
	must(t, err)
	cleanupOnGPU(t, func() { m.Unload() })
	return m
}

func TestModuleLaunch(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		m := loadTestModule(t)
		f, err := m.Function("add_scalar")
		must(t, err)
		regs, err := f.Attribute(FuncNumRegs)
		must(t, err)
		t.Logf("add_scalar: %d registers", regs)

		const n = 100003
		x := make([]float32, n)
		rng := rand.New(rand.NewPCG(3, 4))
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		d := alloc(t, 4*n)
		must(t, Upload(d, x))
		must(t, ctx.Synchronize()) // a pageable upload may still be in flight
		s := newStream(t)
		const block = 256
		grid := uint32((n + block - 1) / block)
		must(t, Launch(f, [3]uint32{grid, 1, 1}, [3]uint32{block, 1, 1}, 0, s, d, float32(0.25), uint32(n)))
		must(t, Launch(f, [3]uint32{grid, 1, 1}, [3]uint32{block, 1, 1}, 0, s, d, float32(-1.5), uint32(n-1)))
		must(t, s.Synchronize())
		got := make([]float32, n)
		must(t, Download(got, d))
		for i := range x {
			want := x[i] + 0.25
			if i < n-1 {
				want += -1.5
			}
			if got[i] != want {
				t.Fatalf("x[%d] = %v, want %v", i, got[i], want)
			}
		}

		// Large dynamic shared memory needs the attribute.
		optin, err := ctx.Device().Attribute(AttrMaxSharedMemoryPerBlockOptin)
		must(t, err)
		if optin > 48<<10 {
			must(t, f.SetMaxDynamicSharedMemory(optin))
			must(t, Launch(f, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, uint32(optin), s, d, float32(0), uint32(0)))
			must(t, s.Synchronize())
		}

		if err := Launch(f, [3]uint32{0, 1, 1}, [3]uint32{1, 1, 1}, 0, s, d, float32(0), uint32(0)); err == nil {
			t.Errorf("a zero grid was accepted")
		}
		if err := Launch(f, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, s, d, 1.0, 3); err == nil || !strings.Contains(err.Error(), "add_scalar") {
			t.Errorf("untyped arguments: %v", err)
		}
	})
}

// TestLaunchArgTypes checks every supported argument type end to end.
func TestLaunchArgTypes(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		m := loadTestModule(t)
		f, err := m.Function("args_probe")
		must(t, err)
		out := alloc(t, 8*8)
		must(t, MemsetD8(out, 0, 64))
		raw := make(RawArg, 16)
		for i := range raw {
			raw[i] = byte(0xa0 + i)
		}
		must(t, Launch(f, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, nil,
			out, int32(-5), uint32(0xfedcba98), int64(-1234567890123), uint64(0x8000000000000001),
			float32(3.25), float64(-1e300), raw))
		must(t, ctx.Synchronize())
		var got [8]uint64
		must(t, Download(got[:], out))
		want := [8]uint64{
			uint64(0xfffffffffffffffb), 0xfedcba98, uint64(0xfffffee08e04fb35), 0x8000000000000001,
			uint64(math.Float32bits(3.25)), math.Float64bits(-1e300),
			0xa7a6a5a4a3a2a1a0, 0xafaeadacabaaa9a8,
		}
		names := []string{"int32", "uint32", "int64", "uint64", "float32", "float64", "RawArg[0:8]", "RawArg[8:16]"}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: kernel saw %#x, want %#x", names[i], got[i], want[i])
			}
		}
	})
}

func TestModuleErrors(t *testing.T) {
	withGPU(t, func(ctx *Context) {
		m := loadTestModule(t)
		_, err := m.Function("no_such_kernel")
		if err == nil || !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"no_such_kernel"`) || !strings.Contains(err.Error(), "test.ptx") {
			t.Errorf("missing kernel: %v", err)
		}
		_, err = LoadModule("broken.ptx", []byte(".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k() { bogus; }\n"))
		if err == nil || !strings.Contains(err.Error(), "broken.ptx") {
			t.Errorf("broken PTX: %v", err)
		} else {
			t.Logf("broken PTX: %v", err)
		}
		// LoadModuleFile.
		path := filepath.Join(t.TempDir(), "k.ptx")
		must(t, os.WriteFile(path, []byte(testPTX), 0o644))
		m2, err := LoadModuleFile(path)
		must(t, err)
		defer m2.Unload()
		if _, err := m2.Function("add_scalar"); err != nil {
			t.Error(err)
		}
		if _, err := LoadModuleFile(path + ".missing"); err == nil {
			t.Errorf("missing file loaded")
		}
	})
}

func TestWorker(t *testing.T) {
	withGPU(t, func(*Context) {})
	w, err := NewWorker(0)
	must(t, err)
	var p DevicePtr
	must(t, w.Do(func(c *Context) error {
		var err error
		p, err = Alloc(1 << 20)
		return err
	}))
	// Another Do runs on the same thread, with the context still bound.
	must(t, w.Do(func(c *Context) error {
		if err := MemsetD32(p, 5, 1<<18); err != nil {
			return err
		}
		var v [1]uint32
		if err := Download(v[:], p.Offset(4)); err != nil {
			return err
		}
		if v[0] != 5 {
			t.Errorf("read %d, want 5", v[0])
		}
		return Free(p)
	}))
	if err := w.Do(func(*Context) error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic in a job: %v", err)
	}
	if err := w.Do(func(*Context) error { return nil }); err != nil {
		t.Errorf("worker died after a panicking job: %v", err)
	}
	w.Close()
	if err := w.Do(func(*Context) error { return nil }); !errors.Is(err, ErrWorkerClosed) {
		t.Errorf("Do after Close: %v", err)
	}
}
