package commtest

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

var (
	allDTypes   = []tensor.DType{tensor.Float32, tensor.Float64, tensor.Int32, tensor.BFloat16}
	floatDTypes = []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}
	reduceOps   = []comm.ReduceOp{comm.Sum, comm.Avg, comm.Max}
)

func basicCase(r *rank) {
	if n, q := r.c.Size(), r.c.Rank(); n < 1 || q < 0 || q >= n {
		r.fatalf("rank %d of size %d", q, n)
	}
	if err := r.c.Barrier(); err != nil {
		r.fatalf("barrier: %v", err)
	}
}

// allGatherCases: every dtype, a 3-D row shape, zero rows, in place.
func allGatherCases(r *rank) {
	type tc struct {
		dt    tensor.DType
		shape []int // of src
	}
	var tcs []tc
	for _, dt := range allDTypes {
		tcs = append(tcs, tc{dt, []int{1, 5}}, tc{dt, []int{3, 4}})
	}
	tcs = append(tcs, tc{tensor.Float32, []int{2, 2, 3}}, tc{tensor.Float32, []int{0, 4}})
	for _, c := range tcs {
		name := fmt.Sprintf("all-gather %v%v", c.dt, tensor.Shape(c.shape))
		r.allGather(name, c.dt, c.shape, false)
	}
	r.allGather("all-gather in place", tensor.Float32, []int{2, 3}, true)
}

func (r *rank) allGather(name string, dt tensor.DType, shape []int, inPlace bool) {
	p, me := r.c.Size(), r.c.Rank()
	n := tensor.Shape(shape).Numel()
	full := append([]int{shape[0] * p}, shape[1:]...)
	var want []float64
	for q := range p {
		want = append(want, r.input(name, q, dt, n)...)
	}
	dst := r.alloc(dt, full...)
	var src *tensor.Tensor
	if inPlace { // src is this rank's part of dst
		var err error
		if src, err = dst.Rows(me*shape[0], (me+1)*shape[0]); err != nil {
			r.fatalf("%s: %v", name, err)
		}
		r.fill(src, r.input(name, me, dt, n))
	} else {
		src = r.tensor(dt, r.input(name, me, dt, n), shape...)
	}
	w, err := r.c.AllGather(dst, src, r.cfg.stream)
	r.done(name, w, err)
	r.expect(name, dst, want, 0)
}

// allReduceCases: every float dtype and reduction, and a long odd length.
func allReduceCases(r *rank) {
	for _, dt := range floatDTypes {
		for _, op := range reduceOps {
			r.allReduce(fmt.Sprintf("all-reduce(%v) %v", op, dt), dt, op, 3, 4)
		}
	}
	r.allReduce("all-reduce(sum) f32 long", tensor.Float32, comm.Sum, 1031)
	r.allReduce("all-reduce(sum) f32 scalar", tensor.Float32, comm.Sum)
}

func (r *rank) allReduce(name string, dt tensor.DType, op comm.ReduceOp, shape ...int) {
	p := r.c.Size()
	n := tensor.Shape(shape).Numel()
	parts := make([][]float64, p)
	for q := range p {
		parts[q] = r.input(name, q, dt, n)
	}
	buf := r.tensor(dt, parts[r.c.Rank()], shape...)
	w, err := r.c.AllReduce(buf, op, r.cfg.stream)
	r.done(name, w, err)
	r.expect(name, buf, reduceRef(parts, op), tol(dt))
}

// reduceScatterCases: every float dtype and reduction, 2-D and 3-D.
func reduceScatterCases(r *rank) {
	for _, dt := range floatDTypes {
		for _, op := range reduceOps {
			r.reduceScatter(fmt.Sprintf("reduce-scatter(%v) %v", op, dt), dt, op, 2, 3)
		}
	}
	r.reduceScatter("reduce-scatter(sum) f32 3-D", tensor.Float32, comm.Sum, 1, 2, 3)
}

func (r *rank) reduceScatter(name string, dt tensor.DType, op comm.ReduceOp, shape ...int) {
	p, me := r.c.Size(), r.c.Rank()
	part := tensor.Shape(shape).Numel()
	full := append([]int{shape[0] * p}, shape[1:]...)
	parts := make([][]float64, p)
	for q := range p {
		parts[q] = r.input(name, q, dt, p*part)[me*part : (me+1)*part]
	}
	src := r.tensor(dt, r.input(name, me, dt, p*part), full...)
	dst := r.alloc(dt, shape...)
	w, err := r.c.ReduceScatter(dst, src, op, r.cfg.stream)
	r.done(name, w, err)
	r.expect(name, dst, reduceRef(parts, op), tol(dt))
}

// countFunc gives the rows rank i sends to rank j in a world of n.
type countFunc func(n, i, j int) int

// uneven counts, with zeros, and (from 3 ranks) a last rank that sends and
// receives nothing.
func uneven(n, i, j int) int {
	if n >= 3 && (i == n-1 || j == n-1) {
		return 0
	}
	return (3*i + 2*j + 1) % 4
}

func allToAllCases(r *rank) {
	for _, dt := range allDTypes {
		r.allToAll("all-to-all-v uneven "+dt.String(), dt, uneven, 3)
	}
	r.allToAll("all-to-all-v zero", tensor.Float32, func(n, i, j int) int { return 0 }, 3)
	r.allToAll("all-to-all-v 3-D", tensor.BFloat16, func(n, i, j int) int { return 1 + (i+j)%2 }, 2, 2)
}

func (r *rank) allToAll(name string, dt tensor.DType, count countFunc, inner ...int) {
	p, me := r.c.Size(), r.c.Rank()
	row := tensor.Shape(inner).Numel()
	send, recv := make([]int, p), make([]int, p)
	sendRows, recvRows := 0, 0
	for q := range p {
		send[q], recv[q] = count(p, me, q), count(p, q, me)
		sendRows += send[q]
		recvRows += recv[q]
	}
	var want []float64
	for q := range p { // part q of dst: rank q's rows for me
		rows := 0
		for j := range me {
			rows += count(p, q, j)
		}
		total := rows
		for j := me; j < p; j++ {
			total += count(p, q, j)
		}
		in := r.input(name, q, dt, total*row)
		want = append(want, in[rows*row:(rows+count(p, q, me))*row]...)
	}
	src := r.tensor(dt, r.input(name, me, dt, sendRows*row), append([]int{sendRows}, inner...)...)
	dst := r.alloc(dt, append([]int{recvRows}, inner...)...)
	w, err := r.c.AllToAllV(dst, src, send, recv, r.cfg.stream)
	r.done(name, w, err)
	r.expect(name, dst, want, 0)
}

// broadcastCases: every root in f32, and bf16, i32 from the last root.
func broadcastCases(r *rank) {
	p := r.c.Size()
	for root := range p {
		r.broadcast(fmt.Sprintf("broadcast from %d", root), tensor.Float32, root, 4, 3)
	}
	r.broadcast("broadcast bf16", tensor.BFloat16, p-1, 5)
	r.broadcast("broadcast i32", tensor.Int32, p-1, 2, 2)
}

func (r *rank) broadcast(name string, dt tensor.DType, root int, shape ...int) {
	n := tensor.Shape(shape).Numel()
	buf := r.tensor(dt, r.input(name, r.c.Rank(), dt, n), shape...)
	w, err := r.c.Broadcast(buf, root, r.cfg.stream)
	r.done(name, w, err)
	r.expect(name, buf, r.input(name, root, dt, n), 0)
}

// workCase: Wait may be called more than once; two ops may be in flight
// before the first Wait.
func workCase(r *rank) {
	const name = "work"
	p := r.c.Size()
	a := r.tensor(tensor.Float32, r.input(name+"a", r.c.Rank(), tensor.Float32, 6), 6)
	b := r.tensor(tensor.Float32, r.input(name+"b", r.c.Rank(), tensor.Float32, 6), 6)
	wa, err := r.c.AllReduce(a, comm.Sum, r.cfg.stream)
	if err != nil {
		r.fatalf("%s: %v", name, err)
	}
	wb, err := r.c.AllReduce(b, comm.Max, r.cfg.stream)
	if err != nil {
		r.fatalf("%s: %v", name, err)
	}
	for i := range 2 {
		if err := wb.Wait(r.cfg.stream); err != nil {
			r.fatalf("%s: wait %d of b: %v", name, i, err)
		}
		if err := wa.Wait(r.cfg.stream); err != nil {
			r.fatalf("%s: wait %d of a: %v", name, i, err)
		}
	}
	pa, pb := make([][]float64, p), make([][]float64, p)
	for q := range p {
		pa[q], pb[q] = r.input(name+"a", q, tensor.Float32, 6), r.input(name+"b", q, tensor.Float32, 6)
	}
	r.expect(name+" a", a, reduceRef(pa, comm.Sum), tol(tensor.Float32))
	r.expect(name+" b", b, reduceRef(pb, comm.Max), 0)
}
