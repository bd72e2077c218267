package cudabackend

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
)

// openGPU opens GPU 0, or skips the test with the reason (no driver, no GPU,
// no kernels image).
func openGPU(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	b, err := New(0, opts...)
	if err != nil {
		t.Skipf("no CUDA backend here: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Logf("Close: %v", err)
		}
	})
	return b
}

func TestConformance(t *testing.T) { runConformance(t, openGPU) }

// TestConformanceSIMT runs the suite with the CUDA-core attention kernels
// only (the tensor-core ones are the default where they apply).
func TestConformanceSIMT(t *testing.T) { runConformance(t, openGPU, WithAttention(AttentionSIMT)) }

func TestDeterminism(t *testing.T) { runDeterminism(t, openGPU) }

func TestAttentionShapes(t *testing.T) { runAttentionShapes(t, openGPU) }

func TestRoPEShapes(t *testing.T) { runRoPEShapes(t, openGPU) }

func TestAttentionShapesFwdW8(t *testing.T) {
	fa2FwdD64Warps = 8
	defer func() { fa2FwdD64Warps = 4 }()
	runAttentionShapes(t, openGPU, WithAttention(AttentionFA2))
}

// TestAttentionShapesFA2: the FA2 kernels (mma.sync), which the default
// replaces with the wgmma ones on sm_90.
func TestAttentionShapesFA2(t *testing.T) {
	runAttentionShapes(t, openGPU, WithAttention(AttentionFA2))
}

// TestAttentionWG: on an sm_90 GPU the default attention backward, and the
// forward at D = 128, are the wgmma kernels' (so TestAttentionShapes,
// TestConformance and TestDeterminism test them there), with FA2's bits
// (runAttentionSameBits).
func TestAttentionWG(t *testing.T) {
	b := openGPU(t)
	cd := b.dev.(*cudaDevice)
	dev, err := cuda.GetDevice(cd.ordinal)
	if err != nil {
		t.Fatal(err)
	}
	if major, minor, err := dev.ComputeCapability(); err != nil || major != 9 || minor != 0 {
		t.Skipf("the wgmma attention kernels need an sm_90 GPU; %s is sm_%d%d (%v)", b.DeviceName(), major, minor, err)
	}
	if !b.useWG() {
		t.Fatalf("the default attention backward on %s is not the wgmma kernels' (hasWG %v: does the image have sm_90a code?)", b.DeviceName(), b.hasWG)
	}
	if !b.useWGFwd(128) || b.useWGFwd(64) {
		t.Fatalf("the default forward on %s: wgmma at D = 128 %v, at D = 64 %v; want D = 128 only", b.DeviceName(), b.useWGFwd(128), b.useWGFwd(64))
	}
	runAttentionSameBits(t, openGPU)
}

func TestAttentionShapesSIMT(t *testing.T) {
	runAttentionShapes(t, openGPU, WithAttention(AttentionSIMT))
}

func TestRoutingPlan(t *testing.T) { runRoutingPlan(t, openGPU) }

func TestGPT(t *testing.T) { runGPT(t, openGPU) }

func TestRoutingAgreement(t *testing.T) { runRoutingAgreement(t, openGPU) }

// TestStream checks the stream contract of the package documentation on the
// GPU: work queued on Stream by other code (as comm/nccl queues its
// collectives) comes before a later Download, and work on another stream
// that Stream is made to wait for with an event (as Work.Wait does for
// comm/nvshmem) comes before it too.
func TestStream(t *testing.T) {
	b := openGPU(t)
	s := b.Stream()
	if s == nil || s.Handle() == 0 || b.StreamHandle() != s.Handle() {
		t.Fatalf("Stream() = %v, StreamHandle() = %#x: expected the backend's own stream", s, b.StreamHandle())
	}
	const n = 1 << 20
	x := b.Zeros(tensor.Float32, n)
	ptr := cuda.DevicePtr(x.Buffer().(interface{ Ptr() uint64 }).Ptr())
	host := tensor.MustHost(tensor.Float32, n)
	check := func(what string, want float32) {
		t.Helper()
		b.Download(host, x)
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		for i, v := range host.F32() {
			if v != want {
				t.Fatalf("%s: x[%d] = %v, want %v", what, i, v, want)
			}
		}
	}
	// On the backend's stream, by other code.
	err := cuda.OnDevice(0, func(*cuda.Context) error {
		return cuda.MemsetD32Async(ptr, math.Float32bits(2), n, s)
	})
	if err != nil {
		t.Fatal(err)
	}
	check("a fill queued on Stream", 2)

	// On another stream, ordered after the backend's and waited for with
	// an event: x = 3 there, then x *= 2 on the backend's stream.
	err = cuda.OnDevice(0, func(*cuda.Context) error {
		other, err := cuda.NewStream()
		if err != nil {
			return err
		}
		defer other.Destroy()
		in, err := cuda.NewEvent(false)
		if err != nil {
			return err
		}
		out, err := cuda.NewEvent(false)
		if err != nil {
			return err
		}
		if err := in.Record(s); err != nil {
			return err
		}
		if err := other.WaitEvent(in); err != nil {
			return err
		}
		if err := cuda.MemsetD32Async(ptr, math.Float32bits(3), n, other); err != nil {
			return err
		}
		if err := out.Record(other); err != nil {
			return err
		}
		return s.WaitEvent(out)
	})
	if err != nil {
		t.Fatal(err)
	}
	b.Scale(x, x, 2) // queued after the wait: must see the 3s
	check("a fill on another stream, waited for with an event, then Scale", 6)
}
