package cpu_test

import (
	"testing"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/backendtest"
	"github.com/asynctp/asynctp/tensor/cpu"
)

func newBackend() tensor.Backend { return cpu.New() }

// The CPU backend in float32 against itself in float64: validates the suite
// as much as the backend.
func TestConformanceFloat32(t *testing.T) {
	backendtest.Run(t, cpu.New(), backendtest.Options{DType: tensor.Float32, Tol: 1e-5, NewBackend: newBackend})
}

// In float64 the backend and the reference run the same code on the same
// values; only the float32 side outputs (rstd, lse, losses) differ.
func TestConformanceFloat64(t *testing.T) {
	backendtest.Run(t, cpu.New(cpu.WithThreads(1)), backendtest.Options{DType: tensor.Float64, Tol: 1e-6, NewBackend: newBackend})
}
