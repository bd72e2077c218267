// Command saveload saves the weights of a model split over two
// tensor-parallel ranks, one safetensors file per rank, merges the files
// into the full weights, and loads those into the same model on one rank
// and on two ranks built from another seed; it checks that all three give
// the same output on the same input, and exits with status 1 when they
// differ.
package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const (
	in, hidden, out, rows = 4, 8, 2, 3
	dt                    = tensor.Float32
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "saveload:", err)
		os.Exit(1)
	}
}

// net is y = down(up(x)) on one rank (group nil) or on a rank of a TP
// group, with the descriptions of its parameters' shards.
type net struct {
	b        tensor.Backend
	up, down layers.Layer
	width    int
	shards   []shard.Shard
}

func newNet(group comm.Comm, seed uint64) (*net, error) {
	n := &net{b: cpu.New()}
	ps := layers.NewParamSet(seed)
	if group == nil {
		up, err := layers.NewLinear(n.b, ps, "up", layers.LinearConfig{In: in, Out: hidden, Std: 0.5})
		if err != nil {
			return nil, err
		}
		down, err := layers.NewLinear(n.b, ps, "down", layers.LinearConfig{In: hidden, Out: out, Bias: true, Std: 0.5})
		if err != nil {
			return nil, err
		}
		n.up, n.down, n.width, n.shards = up, down, hidden, shard.Whole(ps.Params())
	} else {
		par := tp.Parallel{Group: group}
		up, err := tp.NewColumnParallelLinear(n.b, ps, par, "up", tp.ColumnConfig{In: in, Out: hidden, Std: 0.5})
		if err != nil {
			return nil, err
		}
		down, err := tp.NewRowParallelLinear(n.b, ps, par, "down", tp.RowConfig{In: hidden, Out: out, Bias: true, Std: 0.5})
		if err != nil {
			return nil, err
		}
		n.up, n.down, n.width, n.shards = up, down, up.LocalOut, append(up.Shards(), down.Shards()...)
	}
	return n, ps.Materialize(n.b, dt)
}

// forward returns y for a fixed input.
func (n *net) forward() ([]float32, error) {
	x := tensor.MustHost(dt, rows, in)
	for i := range x.F32() {
		x.F32()[i] = float32(i%5) - 2
	}
	h, y := n.b.Zeros(dt, rows, n.width), n.b.Zeros(dt, rows, out)
	if err := n.up.Forward(h, x); err != nil {
		return nil, err
	}
	if err := n.down.Forward(y, h); err != nil {
		return nil, err
	}
	return y.F32(), n.b.Err()
}

func run() error {
	dir, err := os.MkdirTemp("", "asynctp-saveload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rankFile := func(r int) string { return filepath.Join(dir, fmt.Sprintf("rank-%d.safetensors", r)) }

	// Two TP ranks save their shards.
	var want []float32
	err = local.Run(2, func(c comm.Comm) error {
		n, err := newNet(c, 1)
		if err != nil {
			return err
		}
		y, err := n.forward()
		if c.Rank() == 0 {
			want = y
		}
		if err != nil {
			return err
		}
		return shard.SaveWeights(rankFile(c.Rank()), n.b, n.shards)
	})
	if err != nil {
		return err
	}
	// The files merge into the full weights, written as one file.
	full, err := shard.MergeFiles(rankFile(0), rankFile(1))
	if err != nil {
		return err
	}
	var names []string
	for name := range full {
		names = append(names, name)
	}
	sort.Strings(names)
	var tensors []safetensors.Named
	for _, name := range names {
		tensors = append(tensors, safetensors.Named{Name: name, Tensor: full[name]})
	}
	fullFile := filepath.Join(dir, "full.safetensors")
	if err := safetensors.WriteFile(fullFile, tensors, nil); err != nil {
		return err
	}
	// One rank of another seed loads them.
	one, err := newNet(nil, 2)
	if err != nil {
		return err
	}
	if err := shard.LoadWeights(fullFile, one.b, one.shards); err != nil {
		return err
	}
	gotOne, err := one.forward()
	if err != nil {
		return err
	}
	// Two ranks of another seed load them, each cutting its slices.
	var gotTwo []float32
	err = local.Run(2, func(c comm.Comm) error {
		n, err := newNet(c, 3)
		if err != nil {
			return err
		}
		if err := shard.LoadWeights(fullFile, n.b, n.shards); err != nil {
			return err
		}
		y, err := n.forward()
		if c.Rank() == 0 {
			gotTwo = y
		}
		return err
	})
	if err != nil {
		return err
	}
	worst := 0.0
	for i, w := range want {
		for _, g := range []float32{gotOne[i], gotTwo[i]} {
			worst = max(worst, math.Abs(float64(g-w))/(math.Abs(float64(w))+1e-6))
		}
	}
	fmt.Printf("saved %d tensors from 2 ranks; loaded into 1 and 2 ranks: largest relative difference of the outputs %.1e\n", len(full), worst)
	if !(worst <= 1e-5) {
		return fmt.Errorf("the loaded models' outputs differ from the saved model's by %.3g, expected ≤ 1e-5", worst)
	}
	return nil
}
