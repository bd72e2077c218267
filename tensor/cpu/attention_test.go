package cpu_test

import (
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// expandKV returns x (B, T, Hkv, D) with each head repeated for the group
// of H/Hkv query heads it serves: (B, T, H, D), head h = x's head
// h / (H/Hkv).
func expandKV(x *tensor.Tensor, nh int) *tensor.Tensor {
	s := x.Shape()
	nb, nt, hkv, d := s[0], s[1], s[2], s[3]
	out := zeros(nb, nt, nh, d)
	for bt := range nb * nt {
		for h := range nh {
			copy(out.F64()[(bt*nh+h)*d:][:d], x.F64()[(bt*hkv+h/(nh/hkv))*d:][:d])
		}
	}
	return out
}

// sumGroups is expandKV's adjoint: the sum of each group's heads of dx
// (B, T, H, D), in head order, as (B, T, Hkv, D).
func sumGroups(dx *tensor.Tensor, hkv int) []float64 {
	s := dx.Shape()
	nb, nt, nh, d := s[0], s[1], s[2], s[3]
	out := make([]float64, nb*nt*hkv*d)
	for bt := range nb * nt {
		for h := range nh {
			o := out[(bt*hkv+h/(nh/hkv))*d:][:d]
			for x, v := range dx.F64()[(bt*nh+h)*d:][:d] {
				o[x] += v
			}
		}
	}
	return out
}

// TestAttentionGQAExpanded checks grouped-query attention (float64) against
// multi-head attention on k and v with each head repeated over its group
// explicitly: the same out, lse and dq, and dk, dv equal to the sums of the
// expanded ones over each group.
func TestAttentionGQAExpanded(t *testing.T) {
	const nb, nt, nh, d, scale = 2, 9, 8, 6, 0.4
	for _, hkv := range []int{8, 4, 2, 1} {
		t.Run(fmt.Sprintf("kv%d", hkv), func(t *testing.T) {
			rng := testutil.Rng(uint64(30 + hkv))
			b := cpu.New()
			shape, kvShape := []int{nb, nt, nh, d}, []int{nb, nt, hkv, d}
			q, k, v, dout := rnd(rng, shape...), rnd(rng, kvShape...), rnd(rng, kvShape...), rnd(rng, shape...)
			b.Scale(q, q, 3)
			out, lse := zeros(shape...), zeros(nb, nh, nt)
			b.Attention(out, lse, q, k, v, scale)
			dq, dk, dv := zeros(shape...), zeros(kvShape...), zeros(kvShape...)
			b.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, scale)
			noErr(t, b)

			ke, ve := expandKV(k, nh), expandKV(v, nh)
			wout, wlse := zeros(shape...), zeros(nb, nh, nt)
			b.Attention(wout, wlse, q, ke, ve, scale)
			wdq, wdk, wdv := zeros(shape...), zeros(shape...), zeros(shape...)
			b.AttentionBackward(wdq, wdk, wdv, dout, q, ke, ve, wout, wlse, scale)
			noErr(t, b)
			testutil.AllClose(t, "out", out.F64(), wout.F64(), 1e-13)
			testutil.AllClose(t, "lse", lse.F64(), wlse.F64(), 1e-13)
			testutil.AllClose(t, "dq", dq.F64(), wdq.F64(), 1e-13)
			testutil.AllClose(t, "dk", dk.F64(), sumGroups(wdk, hkv), 1e-12)
			testutil.AllClose(t, "dv", dv.F64(), sumGroups(wdv, hkv), 1e-12)
		})
	}
}

// TestRoPEQKVGrouped: RoPEQKV on packed grouped-query projections
// (B, T, (H + 2·Hkv)·D) against RoPE on q and k sliced out of them, and
// its backward against RoPEBackward packed by hand.
func TestRoPEQKVGrouped(t *testing.T) {
	const nb, nt, nh, hkv, d, theta = 2, 5, 4, 2, 6, 100
	rng := testutil.Rng(40)
	b := cpu.New()
	w := (nh + 2*hkv) * d
	qkv := rnd(rng, nb, nt, w)
	part := func(x *tensor.Tensor, off, heads int) *tensor.Tensor {
		out := zeros(nb, nt, heads, d)
		for bt := range nb * nt {
			copy(out.F64()[bt*heads*d:][:heads*d], x.F64()[bt*w+off:][:heads*d])
		}
		return out
	}
	q, k, v := zeros(nb, nt, nh, d), zeros(nb, nt, hkv, d), zeros(nb, nt, hkv, d)
	b.RoPEQKV(q, k, v, qkv, theta)
	wq, wk := zeros(nb, nt, nh, d), zeros(nb, nt, hkv, d)
	b.RoPE(wq, part(qkv, 0, nh), theta)
	b.RoPE(wk, part(qkv, nh*d, hkv), theta)
	noErr(t, b)
	testutil.AllClose(t, "q", q.F64(), wq.F64(), 0)
	testutil.AllClose(t, "k", k.F64(), wk.F64(), 0)
	testutil.AllClose(t, "v", v.F64(), part(qkv, (nh+hkv)*d, hkv).F64(), 0)

	dq, dk, dv := rnd(rng, nb, nt, nh, d), rnd(rng, nb, nt, hkv, d), rnd(rng, nb, nt, hkv, d)
	dqkv := zeros(nb, nt, w)
	b.RoPEQKVBackward(dqkv, dq, dk, dv, theta)
	rq, rk := zeros(nb, nt, nh, d), zeros(nb, nt, hkv, d)
	b.RoPEBackward(rq, dq, theta)
	b.RoPEBackward(rk, dk, theta)
	noErr(t, b)
	testutil.AllClose(t, "dq part", part(dqkv, 0, nh).F64(), rq.F64(), 0)
	testutil.AllClose(t, "dk part", part(dqkv, nh*d, hkv).F64(), rk.F64(), 0)
	testutil.AllClose(t, "dv part", part(dqkv, (nh+hkv)*d, hkv).F64(), dv.F64(), 0)
}
