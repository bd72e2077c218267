package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// devices are the values --device takes.
var devices = []string{"auto", "cpu", "cuda"}

// openBackend opens the backend --device names, with the dtype the model's
// parameters and activations use there: float32 on the CPU, bfloat16 on the
// GPU (with fp32 master weights and optimizer state, kept by train). "auto"
// takes GPU 0 when a GPU and the kernels image are present, else the CPU;
// note says which it chose and why. grouped is --grouped-gemm (grouped.go);
// more are further options of a CUDA backend (WithMemLedger).
func openBackend(device, grouped string, more ...cudabackend.Option) (b tensor.Backend, dt tensor.DType, note deviceNote, err error) {
	opts, extra, set, err := cudaOptions(grouped)
	if err != nil {
		return nil, 0, deviceNote{}, err
	}
	opts = append(opts, more...)
	onCPU := func(c *cpu.Backend, note deviceNote) (tensor.Backend, tensor.DType, deviceNote, error) {
		b, err := cpuGrouped(c, grouped)
		if err != nil {
			return nil, 0, deviceNote{}, err
		}
		return b, tensor.Float32, note, nil
	}
	switch device {
	case "cpu":
		if set != "" {
			return nil, 0, deviceNote{}, fmt.Errorf("--device cpu: %s is a CUDA setting, expected it unset on the CPU", set)
		}
		c := cpu.New()
		return onCPU(c, deviceNote{line: fmt.Sprintf("cpu (%d threads)", c.Threads())})
	case "cuda":
		g, err := cudabackend.New(0, opts...)
		if err != nil {
			return nil, 0, deviceNote{}, fmt.Errorf("--device cuda: %w", err)
		}
		return g, tensor.BFloat16, deviceNote{line: "cuda:0 " + g.DeviceName() + ", bf16 with fp32 master weights" + extra}, nil
	case "auto":
		g, gerr := cudabackend.New(0, opts...)
		if gerr == nil {
			return g, tensor.BFloat16, deviceNote{line: "cuda:0 " + g.DeviceName() + ", bf16 with fp32 master weights (auto)" + extra}, nil
		}
		if set != "" {
			return nil, 0, deviceNote{}, fmt.Errorf("--device auto found no usable GPU (%v), and %s is a CUDA setting", gerr, set)
		}
		c := cpu.New()
		if n, err := cuda.DeviceCount(); err == nil && n > 0 {
			// A GPU is there but cannot be used (no kernels image, an old
			// driver): that is worth fixing, so the reason is on the line.
			return onCPU(c, deviceNote{line: fmt.Sprintf("a GPU is present but not usable (%v): training on the CPU (%d threads)", gerr, c.Threads())})
		}
		return onCPU(c, deviceNote{line: fmt.Sprintf("no GPU found: training on the CPU (%d threads)", c.Threads()), why: gerr.Error()})
	}
	return nil, 0, deviceNote{}, fmt.Errorf("unknown device %q, expected one of %v", device, devices)
}

// deviceNote is what the run prints about its device: one line, and for a
// machine without a GPU the detail of why none was found (the loader's or
// the driver's error), printed only with --verbose: on a machine meant to
// have no GPU it is noise.
type deviceNote struct {
	line string
	why  string
}

// envAttention picks the CUDA attention kernels: unset (the default: on
// sm_90 the deterministic two-pass backward and the D = 128 forward on
// wgmma, the D = 64 forward FA2's; mma.sync elsewhere), "wgmma"
// (cudabackend.AttentionWGMMA: sm_90 only), or "fa2" (attention_fa2.cu's
// mma.sync kernels both ways, cudabackend.AttentionFA2). "onepass" (the
// one-pass backward with fp32 atomic adds into dq) is refused: it was
// retired to cuda/kernels/experimental/.
const envAttention = "ASYNCTP_ATTENTION"

// envGEMM picks the CUDA backend's 2-D bf16 GEMMs: unset or "cublaslt"
// (the default) or "asynctp" (our engine, cuda/kernels/gemm_sm90.cu, where
// it applies, else cuBLASLt; cudabackend.WithGEMMEngine).
const envGEMM = "ASYNCTP_GEMM"

// cudaOptions are the CUDA backend's options from the environment and
// --grouped-gemm (grouped), the words the device line adds for the
// environment's, and those settings as NAME=value (empty: none set).
func cudaOptions(grouped string) (opts []cudabackend.Option, extra, set string, err error) {
	opts = groupedCUDA(grouped)
	var sets []string
	switch v := os.Getenv(envAttention); v {
	case "":
	case "onepass":
		return nil, "", "", fmt.Errorf("%s=%q: the one-pass attention backward (dq summed by fp32 atomics, not bit-reproducible) was retired to cuda/kernels/experimental/; expected wgmma or fa2, or unset for the default", envAttention, v)
	case "wgmma":
		opts = append(opts, cudabackend.WithAttention(cudabackend.AttentionWGMMA))
		extra += "; attention: wgmma backward, and forward at D = 128 (sm_90)"
		sets = append(sets, envAttention+"="+v)
	case "fa2":
		opts = append(opts, cudabackend.WithAttention(cudabackend.AttentionFA2))
		extra += "; attention: FA2 (mma.sync) both ways"
		sets = append(sets, envAttention+"="+v)
	default:
		return nil, "", "", fmt.Errorf("%s=%q: expected wgmma or fa2, or unset for the default", envAttention, v)
	}
	switch v := os.Getenv(envGEMM); v {
	case "":
	case cudabackend.GEMMCublasLt:
		sets = append(sets, envGEMM+"="+v)
	case cudabackend.GEMMAsyncTP:
		opts = append(opts, cudabackend.WithGEMMEngine(cudabackend.GEMMAsyncTP))
		extra += "; GEMMs: the asynctp engine where it applies, else cuBLASLt"
		sets = append(sets, envGEMM+"="+v)
	default:
		return nil, "", "", fmt.Errorf("%s=%q: expected %s or %s (or unset: %s)", envGEMM, v, cudabackend.GEMMCublasLt, cudabackend.GEMMAsyncTP, cudabackend.GEMMCublasLt)
	}
	return opts, extra, strings.Join(sets, " "), nil
}
