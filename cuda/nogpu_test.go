package cuda

// Tests of the pure-Go parts; they run everywhere, GPU or not.

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/dynlib"
)

func TestPackArgs(t *testing.T) {
	raw := RawArg{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	p, err := packArgs([]any{DevicePtr(0x1122334455667788), int32(-2), uint32(7), int64(-3), uint64(1 << 40), float32(1.5), float64(-2.25), raw, int32(9)})
	if err != nil {
		t.Fatal(err)
	}
	wantOffs := []uint32{0, 8, 12, 16, 24, 32, 40, 48, 60}
	if len(p.offs) != len(wantOffs) {
		t.Fatalf("offsets %v, want %v", p.offs, wantOffs)
	}
	for i := range wantOffs {
		if p.offs[i] != wantOffs[i] {
			t.Fatalf("offsets %v, want %v", p.offs, wantOffs)
		}
	}
	if len(p.blob) != 64 {
		t.Fatalf("blob is %d bytes, want 64", len(p.blob))
	}
	le := binary.LittleEndian
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"DevicePtr", le.Uint64(p.blob[0:]), 0x1122334455667788},
		{"int32", uint64(le.Uint32(p.blob[8:])), uint64(uint32(0xfffffffe))},
		{"uint32", uint64(le.Uint32(p.blob[12:])), 7},
		{"int64", le.Uint64(p.blob[16:]), uint64(0xfffffffffffffffd)},
		{"uint64", le.Uint64(p.blob[24:]), 1 << 40},
		{"float32", uint64(le.Uint32(p.blob[32:])), uint64(math.Float32bits(1.5))},
		{"float64", le.Uint64(p.blob[40:]), math.Float64bits(-2.25)},
		{"int32 after RawArg", uint64(le.Uint32(p.blob[60:])), 9},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if string(p.blob[48:60]) != string(raw) {
		t.Errorf("RawArg bytes %v, want %v", p.blob[48:60], raw)
	}
	// The padding before float64 stays zero.
	if le.Uint32(p.blob[36:]) != 0 {
		t.Errorf("padding is not zero")
	}
}

func TestPackArgsEmpty(t *testing.T) {
	p, err := packArgs(nil)
	if err != nil || len(p.blob) != 0 || len(p.offs) != 0 {
		t.Fatalf("packArgs(nil) = %v, %v", p, err)
	}
}

func TestPackArgsRejects(t *testing.T) {
	for _, tc := range []struct {
		arg  any
		want string
	}{
		{42, "use int32 or int64"},
		{uint(42), "use int32 or int64"},
		{"x", "unsupported type string"},
		{&struct{}{}, "unsupported type"},
		{[]float32{1}, "unsupported type []float32"},
		{RawArg{}, "empty RawArg"},
		{RawArg(make([]byte, 40000)), "more than"},
	} {
		_, err := packArgs([]any{DevicePtr(1), tc.arg})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("packArgs(%T): error %v, want it to mention %q", tc.arg, err, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "argument 1") && tc.want != "more than" {
			t.Errorf("error %q does not name the argument", err)
		}
	}
}

// withFallbackText makes the error text independent of a loaded driver.
func withFallbackText(t *testing.T) {
	t.Helper()
	saved, savedBlas := resultText, blasStatusText
	resultText = func(Result) (string, string, bool) { return "", "", false }
	blasStatusText = func(BlasStatus) (string, string, bool) { return "", "", false }
	t.Cleanup(func() { resultText, blasStatusText = saved, savedBlas })
}

func TestErrorText(t *testing.T) {
	withFallbackText(t)
	err := newError("cuMemAlloc(1073741824 bytes) on cuda:0", ErrOutOfMemory)
	want := "cuda: cuMemAlloc(1073741824 bytes) on cuda:0: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
	if err.Error() != want {
		t.Errorf("got  %q\nwant %q", err, want)
	}
	if !errors.Is(err, ErrOutOfMemory) || errors.Is(err, ErrInvalidValue) {
		t.Errorf("errors.Is does not see the Result")
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.Result != ErrOutOfMemory {
		t.Errorf("errors.As: %v", ce)
	}
	if got := Result(12345).Error(); got != "CUresult(12345): unrecognized CUDA result" {
		t.Errorf("unknown result: %q", got)
	}
	if !IsNotReady(newError("cuStreamQuery", ErrNotReady)) {
		t.Errorf("IsNotReady")
	}
	// The invalid-context error explains thread binding.
	if s := newError("cuMemAlloc(8 bytes) on no current context", ErrInvalidContext).Error(); !strings.Contains(s, "runtime.LockOSThread") {
		t.Errorf("invalid context error gives no advice: %q", s)
	}
}

func TestBlasErrorText(t *testing.T) {
	withFallbackText(t)
	err := checkBlas("cublasLtMatmul(bf16×bf16→bf16 m=1 n=2 k=3)", BlasNotSupported)
	want := "cuda: cublasLtMatmul(bf16×bf16→bf16 m=1 n=2 k=3): CUBLAS_STATUS_NOT_SUPPORTED"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	if !errors.Is(err, BlasNotSupported) {
		t.Errorf("errors.Is does not see the status")
	}
	if checkBlas("x", BlasSuccess) != nil {
		t.Errorf("checkBlas(success) != nil")
	}
}

func TestLibCUDAOverrideMissing(t *testing.T) {
	t.Setenv(EnvLibCUDA, "/nonexistent/libcuda.so.1")
	_, err := openDriver()
	if err == nil {
		t.Fatal("loading a nonexistent libcuda succeeded")
	}
	for _, want := range []string{"cuda: cannot load /nonexistent/libcuda.so.1", EnvLibCUDA, "No such file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestLibCublasLtOverrideMissing(t *testing.T) {
	t.Setenv(EnvLibCublasLt, "/nonexistent/libcublasLt.so.13")
	_, err := openBlas()
	if err == nil || !strings.Contains(err.Error(), EnvLibCublasLt) || !strings.Contains(err.Error(), "/nonexistent/libcublasLt.so.13") {
		t.Errorf("error %v does not name the variable and the path", err)
	}
}

func TestDefaultLoadMessage(t *testing.T) {
	_, err := dynlib.Open(driverSpec, []string{"libasynctp-no-such-lib.so.1"}, false)
	want := "cuda: cannot load libasynctp-no-such-lib.so.1 (set ASYNCTP_LIBCUDA to its path; it comes with the NVIDIA driver): "
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want prefix %q", err, want)
	}
}

// A library that loads but is not libcuda: the error names the library and
// the first missing symbol.
func TestLibCUDAWrongLibrary(t *testing.T) {
	t.Setenv(EnvLibCUDA, "libc.so.6")
	_, err := openDriver()
	if err != nil && strings.Contains(err.Error(), "cannot load") {
		t.Skipf("no libc.so.6 to test with: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "libc.so.6 has no symbol cuGetErrorName") {
		t.Errorf("got %v, want a missing-symbol error naming libc.so.6 and cuGetErrorName", err)
	}
	t.Setenv(EnvLibCublasLt, "libc.so.6")
	_, err = openBlas()
	if err == nil || !strings.Contains(err.Error(), "libc.so.6 has no symbol cublasLtCreate") {
		t.Errorf("got %v, want a missing-symbol error naming cublasLtCreate", err)
	}
}

// Where a driver library is installed (GPU or not), every symbol the
// package uses must resolve.
func TestDriverSymbols(t *testing.T) {
	l, err := openDriver()
	if err != nil && strings.Contains(err.Error(), "cannot load") {
		t.Skipf("no driver library: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	v, err := DriverVersion()
	if err != nil {
		t.Fatal(err)
	}
	path, syms, err := DriverLibrary()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: CUDA driver version %d, %d symbols", path, v, len(syms))
	var versioned []string
	for _, s := range syms {
		if strings.Contains(s, "_v") {
			versioned = append(versioned, s)
		}
	}
	t.Logf("versioned symbols used: %s", strings.Join(versioned, " "))
}

func TestBlasSymbols(t *testing.T) {
	l, err := openBlas()
	if err != nil && strings.Contains(err.Error(), "cannot load") {
		t.Skipf("no cuBLASLt library: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	path, v, err := BlasLibrary()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: cuBLASLt version %d", path, v)
}

func TestAlignment(t *testing.T) {
	for _, tc := range []struct {
		p       DevicePtr
		strides []int64
		want    uint32
	}{
		{0x7f0000000000, nil, 256},
		{0x7f0000000010, nil, 16},
		{0x7f0000000002, nil, 2},
		{0x7f0000000000, []int64{2 * 37}, 2},
		{0x7f0000000000, []int64{4 * 64, 2 * 8}, 16},
		{0, nil, 256},
	} {
		if got := alignment(tc.p, tc.strides...); got != tc.want {
			t.Errorf("alignment(%v, %v) = %d, want %d", tc.p, tc.strides, got, tc.want)
		}
	}
}

func TestGemmNormalize(t *testing.T) {
	base := GemmParams{M: 4, N: 6, K: 5, A: 256, B: 512, C: 1024, TypeA: BFloat16, TypeB: BFloat16, TypeC: BFloat16}
	p, err := base.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if p.LDA != 5 || p.LDB != 6 || p.LDC != 6 || p.Batch != 1 || p.StrideA != 0 {
		t.Errorf("defaults: %+v", p)
	}
	tb := base
	tb.TransA, tb.TransB, tb.Batch = true, true, 3
	p, err = tb.normalize()
	if err != nil {
		t.Fatal(err)
	}
	// A stored K×M = 5×4, B stored N×K = 6×5.
	if p.LDA != 4 || p.LDB != 5 || p.StrideA != 20 || p.StrideB != 30 || p.StrideC != 24 {
		t.Errorf("transposed batched defaults: %+v", p)
	}
	for _, tc := range []struct {
		mod  func(*GemmParams)
		want string
	}{
		{func(p *GemmParams) { p.K = 0 }, "must be positive"},
		{func(p *GemmParams) { p.TypeA = 0 }, "TypeA"},
		{func(p *GemmParams) { p.TypeB = Float32 }, "TypeB must equal TypeA"},
		{func(p *GemmParams) { p.TypeC = 0 }, "TypeC"},
		{func(p *GemmParams) { p.C = 0 }, "must be set"},
		{func(p *GemmParams) { p.LDA = 3 }, "leading dimensions"},
		{func(p *GemmParams) { p.Epilogue = EpilogueBias }, "needs Bias"},
		{func(p *GemmParams) { p.Epilogue = EpilogueGELUAuxBias; p.Bias = 256 }, "needs Aux"},
		{func(p *GemmParams) { p.Epilogue = 200 }, "unknown epilogue"},
	} {
		q := base
		tc.mod(&q)
		if _, err := q.normalize(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want it to mention %q", err, tc.want)
		}
	}
}

// TestGemmMapping checks the row-major to column-major mapping without a
// GPU: a column-major GEMM, as cuBLASLt defines it, run on the operands
// GemmParams.lt describes, must give the row-major product.
func TestGemmMapping(t *testing.T) {
	for _, tc := range []struct {
		name           string
		transA, transB bool
		ldPad, batch   int
	}{
		{"NN", false, false, 0, 1}, {"TN", true, false, 0, 1}, {"NT", false, true, 0, 1}, {"TT", true, true, 0, 1},
		{"NN/padded", false, false, 3, 1}, {"TT/padded", true, true, 2, 1},
		{"NT/batched", false, true, 0, 3}, {"TN/batched+padded", true, false, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const m, n, k = 5, 7, 4
			p := GemmParams{TransA: tc.transA, TransB: tc.transB, M: m, N: n, K: k, Alpha: 1.5, Beta: 0.5,
				TypeA: Float32, TypeB: Float32, TypeC: Float32, Batch: tc.batch}
			ar, ac := p.storedA()
			br, bc := p.storedB()
			p.LDA, p.LDB, p.LDC = ac+tc.ldPad, bc+tc.ldPad, n+tc.ldPad
			// One flat "memory"; element addresses are indices.
			sizeA, sizeB, sizeC := ar*p.LDA, br*p.LDB, m*p.LDC
			mem := make([]float64, tc.batch*(sizeA+sizeB+sizeC))
			for i := range mem {
				mem[i] = float64((i*7919)%23) - 11
			}
			p.A, p.B, p.C = 1, DevicePtr(1+tc.batch*sizeA), DevicePtr(1+tc.batch*(sizeA+sizeB)) // 1-based: 0 means unset
			q, err := p.normalize()
			if err != nil {
				t.Fatal(err)
			}
			at := func(ptr DevicePtr, i int) *float64 { return &mem[int(ptr)-1+i] }

			// The row-major reference.
			want := make([]float64, len(mem))
			copy(want, mem)
			for bt := 0; bt < tc.batch; bt++ {
				for i := 0; i < m; i++ {
					for j := 0; j < n; j++ {
						var s float64
						for l := 0; l < k; l++ {
							var a, b float64
							if tc.transA {
								a = *at(q.A, bt*int(q.StrideA)+l*q.LDA+i)
							} else {
								a = *at(q.A, bt*int(q.StrideA)+i*q.LDA+l)
							}
							if tc.transB {
								b = *at(q.B, bt*int(q.StrideB)+j*q.LDB+l)
							} else {
								b = *at(q.B, bt*int(q.StrideB)+l*q.LDB+j)
							}
							s += a * b
						}
						c := int(q.C) - 1 + bt*int(q.StrideC) + i*q.LDC + j
						want[c] = float64(q.Alpha)*s + float64(q.Beta)*mem[c]
					}
				}
			}

			// cuBLASLt's definition: D = alpha·op(A)·op(B) + beta·C,
			// column-major, op(X)[r][c] = X[r + c·ld] or X[c + r·ld].
			g := q.lt()
			if g.a.rows*g.a.cols == 0 || g.m != n || g.n != m {
				t.Fatalf("mapping %+v", g)
			}
			opAt := func(x ltMatrix, trans bool, bt, r, c int) float64 {
				if trans {
					r, c = c, r
				}
				if uint64(r) >= x.rows || uint64(c) >= x.cols {
					t.Fatalf("index (%d,%d) outside the %dx%d layout", r, c, x.rows, x.cols)
				}
				return *at(x.ptr, bt*int(x.stride)+r+c*int(x.ld))
			}
			got := make([]float64, len(mem))
			copy(got, mem)
			for bt := 0; bt < g.batch; bt++ {
				for r := 0; r < int(g.m); r++ {
					for c := 0; c < int(g.n); c++ {
						var s float64
						for l := 0; l < int(g.k); l++ {
							s += opAt(g.a, g.transA, bt, r, l) * opAt(g.b, g.transB, bt, l, c)
						}
						d := int(g.c.ptr) - 1 + bt*int(g.c.stride) + r + c*int(g.c.ld)
						got[d] = float64(q.Alpha)*s + float64(q.Beta)*mem[d]
					}
				}
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("element %d: column-major mapping gives %v, row-major reference %v", i, got[i], want[i])
				}
			}
		})
	}
}
