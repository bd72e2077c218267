package dispatch

import (
	"errors"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// threads256 is the block of the one-block kernels (ep_layout, ep_plan,
// ep_block_targets).
const threads256 = 256

// The engine's data checks: the layout's expert ids (err[1] = a bad id),
// the waits on the peers' signals and the blocks' counters (err[1] =
// code·65536 + the peer or the block), the fused combine's block waits
// (err[1] = 0x20000000 + the block).
var (
	checkLayout, errCheckLayout = cudabackend.NewDataCheck("expert dispatch: layout")
	checkWait, errCheckWait     = cudabackend.NewDataCheck("expert dispatch: wait")
	checkBlocks, errCheckBlocks = cudabackend.NewDataCheck("expert dispatch: fused combine blocks")
)

// errDataChecks is why the engine cannot have its data checks (New
// returns it), or nil.
var errDataChecks = errors.Join(errCheckLayout, errCheckWait, errCheckBlocks)

// ptr is the device address of t as a kernel argument (0 for nil).
func ptr(t *tensor.Tensor) cudabackend.Ptr { return cudabackend.PtrOf(t) }

// sfx is the kernel name suffix of dt.
func sfx(dt tensor.DType) string { return cudabackend.KernelSuffix(dt) }

func ceilDiv(a, b int) int { return (a + b - 1) / b }
