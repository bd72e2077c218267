package hostreduce_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestAllReduce: random non-zero values on each of 3 ranks, reduced by
// Sum, Avg and Max through f32 and f64 buffers, against the reduction
// computed here in float64.
func TestAllReduce(t *testing.T) {
	const ranks, n = 3, 5
	rng := testutil.Rng(7)
	in := make([][]float64, ranks)
	for r := range in {
		in[r] = testutil.RandFloats(rng, n, 0.1, 10)
	}
	for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.Max} {
		want := make([]float64, n)
		for i := range want {
			acc := in[0][i]
			for r := 1; r < ranks; r++ {
				switch op {
				case comm.Max:
					acc = math.Max(acc, in[r][i])
				default:
					acc += in[r][i]
				}
			}
			if op == comm.Avg {
				acc /= ranks
			}
			want[i] = acc
		}
		for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
			tol := 1e-12
			if dt == tensor.Float32 {
				tol = 1e-6
			}
			got := make([][]float64, ranks)
			err := local.Run(ranks, func(c comm.Comm) error {
				v := append([]float64(nil), in[c.Rank()]...)
				got[c.Rank()] = v
				return hostreduce.AllReduce(cpu.New(), c, dt, v, op, nil)
			})
			if err != nil {
				t.Fatalf("%v %v: %v", op, dt, err)
			}
			for r := range ranks {
				for i := range n {
					if d := math.Abs(got[r][i] - want[i]); d > tol*math.Abs(want[i]) || math.IsNaN(got[r][i]) {
						t.Errorf("%v %v: rank %d value %d = %v, want %v", op, dt, r, i, got[r][i], want[i])
					}
				}
			}
		}
	}
}

// TestAllReduceOneRank: a group of one leaves the values alone.
func TestAllReduceOneRank(t *testing.T) {
	err := local.Run(1, func(c comm.Comm) error {
		v := []float64{1.25, -3}
		if err := hostreduce.AllReduce(cpu.New(), c, tensor.Float32, v, comm.Sum, nil); err != nil {
			return err
		}
		if v[0] != 1.25 || v[1] != -3 {
			t.Errorf("one rank: %v, want [1.25 -3]", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAllReduceErrors: a bad dtype and a failed backend are errors naming
// what was expected, and vals are left as they were.
func TestAllReduceErrors(t *testing.T) {
	err := local.Run(2, func(c comm.Comm) error {
		v := []float64{2, 3}
		if err := hostreduce.AllReduce(cpu.New(), c, tensor.Int32, v, comm.Sum, nil); err == nil || !strings.Contains(err.Error(), "expected float32 or float64") {
			t.Errorf("int32 buffer: %v", err)
		}
		b := cpu.New()
		b.Zeros(tensor.Float32, -1) // records a sticky error
		if err := hostreduce.AllReduce(b, c, tensor.Float32, v, comm.Sum, nil); err == nil || !strings.Contains(err.Error(), "hostreduce") {
			t.Errorf("failed backend: %v", err)
		}
		if v[0] != 2 || v[1] != 3 {
			t.Errorf("after errors: %v, want [2 3]", v)
		}
		if err := hostreduce.AllReduce(nil, c, tensor.Float32, v, comm.Sum, nil); err == nil {
			t.Error("nil backend: no error")
		}
		return nil
	})
	if err != nil && !errors.Is(err, comm.ErrAborted) {
		t.Fatal(err)
	}
}
