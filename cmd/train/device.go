package main

import (
	"fmt"
	"os"

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
func openBackend(device, grouped string, more ...cudabackend.Option) (b tensor.Backend, dt tensor.DType, note string, err error) {
	opts, extra, err := cudaOptions(grouped)
	if err != nil {
		return nil, 0, "", err
	}
	opts = append(opts, more...)
	onCPU := func(c *cpu.Backend, note string) (tensor.Backend, tensor.DType, string, error) {
		b, err := cpuGrouped(c, grouped)
		if err != nil {
			return nil, 0, "", err
		}
		return b, tensor.Float32, note, nil
	}
	switch device {
	case "cpu":
		if extra != "" {
			return nil, 0, "", fmt.Errorf("--device cpu: %s=%s is a CUDA setting, expected it unset on the CPU", envAttention, os.Getenv(envAttention))
		}
		c := cpu.New()
		return onCPU(c, fmt.Sprintf("cpu (%d threads)", c.Threads()))
	case "cuda":
		g, err := cudabackend.New(0, opts...)
		if err != nil {
			return nil, 0, "", fmt.Errorf("--device cuda: %w", err)
		}
		return g, tensor.BFloat16, "cuda:0 " + g.DeviceName() + ", bf16 with fp32 master weights" + extra, nil
	case "auto":
		g, gerr := cudabackend.New(0, opts...)
		if gerr == nil {
			return g, tensor.BFloat16, "cuda:0 " + g.DeviceName() + ", bf16 with fp32 master weights (auto)" + extra, nil
		}
		if extra != "" {
			return nil, 0, "", fmt.Errorf("--device auto found no usable GPU (%v), and %s=%s is a CUDA setting", gerr, envAttention, os.Getenv(envAttention))
		}
		c := cpu.New()
		return onCPU(c, fmt.Sprintf("cpu (%d threads; auto: no usable GPU: %v)", c.Threads(), gerr))
	}
	return nil, 0, "", fmt.Errorf("unknown device %q, expected one of %v", device, devices)
}

// envAttention picks the CUDA attention backward: unset (the default, the
// deterministic two-pass kernels) or "onepass" (one pass with fp32 atomic
// adds into dq: faster, not bit-reproducible; cudabackend.AttentionFA2Atomic).
const envAttention = "ASYNCTP_ATTENTION"

// cudaOptions are the CUDA backend's options from the environment and
// --grouped-gemm (grouped), and the words the device line adds for the
// environment's.
func cudaOptions(grouped string) ([]cudabackend.Option, string, error) {
	opts := groupedCUDA(grouped)
	switch v := os.Getenv(envAttention); v {
	case "":
		return opts, "", nil
	case "onepass":
		return append(opts, cudabackend.WithAttention(cudabackend.AttentionFA2Atomic)),
			"; attention backward: one pass, atomic dq (not bit-reproducible)", nil
	default:
		return nil, "", fmt.Errorf("%s=%q: expected onepass, or unset for the deterministic default", envAttention, v)
	}
}
