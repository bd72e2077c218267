package cudabackend

import (
	"fmt"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// runRoutingPlan checks RoutingPlan against layers.NewRoutingPlan on random
// top-k choices, dropless and with a capacity, and that a bad choice is
// reported.
func runRoutingPlan(t *testing.T, open opener) {
	b := open(t)
	rng := testutil.Rng(5)
	for _, tc := range []struct{ n, k, e, capacity int }{
		{37, 2, 8, 0}, {37, 2, 8, 6}, {300, 4, 16, 0}, {300, 4, 16, 50}, {5, 1, 3, 1}, {1000, 2, 64, 0},
	} {
		name := fmt.Sprintf("N=%d K=%d E=%d capacity=%d", tc.n, tc.k, tc.e, tc.capacity)
		idx := make([]int32, tc.n*tc.k)
		for r := range tc.n {
			perm := rng.Perm(tc.e)
			for j := range tc.k {
				idx[r*tc.k+j] = int32(perm[j])
			}
		}
		want, err := layers.NewRoutingPlan(idx, tc.n, tc.k, tc.e, tc.capacity, nil)
		if err != nil {
			t.Fatal(err)
		}
		host, _ := tensor.FromInt32(idx, tc.n, tc.k)
		di := b.Zeros(tensor.Int32, tc.n, tc.k)
		b.Upload(di, host)
		tok, pos := b.Zeros(tensor.Int32, tc.n*tc.k), b.Zeros(tensor.Int32, tc.n, tc.k)
		routed, offsets := b.Zeros(tensor.Int32, tc.e), b.Zeros(tensor.Int32, tc.e+1)
		b.RoutingPlan(tok, pos, routed, offsets, di, tc.e, tc.capacity)
		ints := func(x *tensor.Tensor) []int32 {
			h := tensor.MustHost(tensor.Int32, x.Shape()...)
			b.Download(h, x)
			if err := b.Sync(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return h.I32()
		}
		eq := func(what string, got []int32, want []int) {
			t.Helper()
			for i := range want {
				if int(got[i]) != want[i] {
					t.Fatalf("%s: %s[%d] = %d, want %d (got %v, want %v)", name, what, i, got[i], want[i], got, want)
				}
			}
		}
		toInts := func(v []int32) []int {
			out := make([]int, len(v))
			for i, x := range v {
				out[i] = int(x)
			}
			return out
		}
		eq("routed", ints(routed), want.Routed)
		eq("offsets", ints(offsets), want.Offsets())
		eq("pos", ints(pos), toInts(want.Pos))
		wantTok := toInts(want.TokenOf())
		for len(wantTok) < tc.n*tc.k {
			wantTok = append(wantTok, -1)
		}
		eq("tok", ints(tok), wantTok)
	}

	bad := open(t)
	host, _ := tensor.FromInt32([]int32{0, 1, 2, 2}, 2, 2) // token 1 chooses expert 2 twice
	di := bad.Zeros(tensor.Int32, 2, 2)
	bad.Upload(di, host)
	bad.RoutingPlan(bad.Zeros(tensor.Int32, 4), bad.Zeros(tensor.Int32, 2, 2), bad.Zeros(tensor.Int32, 3), bad.Zeros(tensor.Int32, 4), di, 3, 0)
	if err := bad.Sync(); err == nil || !strings.Contains(err.Error(), "RoutingPlan") {
		t.Errorf("RoutingPlan with an expert chosen twice: error %v, want one naming RoutingPlan", err)
	}
}
