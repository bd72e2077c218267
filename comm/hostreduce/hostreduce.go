package hostreduce

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// AllReduce replaces vals, on every rank of c, with their reduction (op)
// over c's ranks, through a device buffer of dtype dt (Float32 or Float64,
// as b stores it) allocated on b for the call; the collective is ordered on
// stream s (nil on the CPU). A group of one rank leaves vals as they are
// and touches neither b nor c. Every rank of c must call it with the same
// number of values. It returns b's sticky error or the collective's, and
// on error leaves vals as they were.
func AllReduce(b tensor.Backend, c comm.Comm, dt tensor.DType, vals []float64, op comm.ReduceOp, s comm.Stream) error {
	switch {
	case b == nil || c == nil:
		return errors.New("hostreduce: all-reduce needs a backend and a group")
	case dt != tensor.Float32 && dt != tensor.Float64:
		return fmt.Errorf("hostreduce: all-reduce through a %v buffer, expected float32 or float64", dt)
	case c.Size() == 1 || len(vals) == 0:
		return nil
	}
	if err := b.Err(); err != nil {
		return fmt.Errorf("hostreduce: all-reduce of %d values over %s: %w", len(vals), c.Name(), err)
	}
	buf := b.Zeros(dt, len(vals))
	defer b.Free(buf)
	h, err := tensor.FromFloat64(append([]float64(nil), vals...), len(vals))
	if err != nil {
		return fmt.Errorf("hostreduce: all-reduce of %d values over %s: %w", len(vals), c.Name(), err)
	}
	b.Upload(buf, h)
	if err := b.Err(); err != nil {
		return fmt.Errorf("hostreduce: all-reduce of %d values over %s: %w", len(vals), c.Name(), err)
	}
	w, err := c.AllReduce(buf, op, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return fmt.Errorf("hostreduce: all-reduce of %d values over %s: %w", len(vals), c.Name(), err)
	}
	b.Download(h, buf)
	if err := b.Err(); err != nil {
		return fmt.Errorf("hostreduce: all-reduce of %d values over %s: %w", len(vals), c.Name(), err)
	}
	copy(vals, h.F64())
	return nil
}
