package cudabackend

import (
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// Launch geometry shared by the launchers. Grid-stride kernels get enough
// blocks to give each thread about one 16-byte pack, capped at a few waves of
// the GPU (the loop covers the rest).

const (
	threads256 = 256
	warpRows   = 8 // rows per block of the one-warp-per-row kernels (block 256)
)

// gridStride is the grid of a 1-D grid-stride kernel over n elements with
// perThread elements per thread and iteration.
func (b *Backend) gridStride(n, perThread int) gpu.Dim3 {
	blocks := ceilDiv(max(n, 1), threads256*perThread)
	limit := max(b.dev.SMCount(), 1) * 32
	return gpu.D1(min(blocks, limit))
}

// packOf is the number of elements of a 16-byte pack of dtype size bytes.
func packOf(size int) int { return 16 / size }

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// launch queues one kernel as op (the error names op and the kernel).
func (b *Backend) launch(op, kernel string, grid, block gpu.Dim3, smem int, args ...any) {
	b.do(op, func(d gpu.Device) error { return d.Launch(kernel, grid, block, smem, args...) })
}

// rowGrid is the grid of the one-warp-per-row kernels (block 256) over n rows.
func rowGrid(n int) gpu.Dim3 { return gpu.D1(max(ceilDiv(n, warpRows), 1)) }

// rowBlock picks the block of the one-block-per-row kernels (softmax,
// cross-entropy) for rows of c elements: a power of two from 32 to 1024,
// about one pack per thread.
func rowBlock(c, pack int) gpu.Dim3 {
	t := 32
	for t < 1024 && t*pack < c {
		t *= 2
	}
	return gpu.D1(t)
}
