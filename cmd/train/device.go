package main

import (
	"fmt"

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
// note says which it chose and why.
func openBackend(device string) (b tensor.Backend, dt tensor.DType, note string, err error) {
	switch device {
	case "cpu":
		c := cpu.New()
		return c, tensor.Float32, fmt.Sprintf("cpu (%d threads)", c.Threads()), nil
	case "cuda":
		g, err := cudabackend.New(0)
		if err != nil {
			return nil, 0, "", fmt.Errorf("--device cuda: %w", err)
		}
		return g, tensor.BFloat16, "cuda:0 " + g.DeviceName() + ", bf16 with fp32 master weights", nil
	case "auto":
		g, gerr := cudabackend.New(0)
		if gerr == nil {
			return g, tensor.BFloat16, "cuda:0 " + g.DeviceName() + ", bf16 with fp32 master weights (auto)", nil
		}
		c := cpu.New()
		return c, tensor.Float32, fmt.Sprintf("cpu (%d threads; auto: no usable GPU: %v)", c.Threads(), gerr), nil
	}
	return nil, 0, "", fmt.Errorf("unknown device %q, expected one of %v", device, devices)
}
