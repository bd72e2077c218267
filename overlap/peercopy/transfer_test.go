package peercopy

import (
	"errors"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/overlap"
)

// The transfer is used as given or refused, naming the valid ones; the
// environment variable's errors name the variable.
func TestTransfer(t *testing.T) {
	for in, want := range map[string]string{"": TransferPull, "pull": TransferPull, "put": TransferPut} {
		if got, err := ParseTransfer(in); err != nil || got != want {
			t.Errorf("ParseTransfer(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"Put", "push", " pull"} {
		_, err := ParseTransfer(bad)
		if err == nil || !strings.Contains(err.Error(), "expected one of pull, put") {
			t.Errorf("ParseTransfer(%q): %v, want a refusal naming pull and put", bad, err)
		}
	}
	t.Setenv(TransferEnv, "put")
	if got, err := TransferFromEnv(); err != nil || got != TransferPut {
		t.Errorf("$%s=put: %q, %v", TransferEnv, got, err)
	}
	t.Setenv(TransferEnv, "fast")
	if _, err := TransferFromEnv(); err == nil || !strings.Contains(err.Error(), "$"+TransferEnv) || !strings.Contains(err.Error(), `"fast"`) {
		t.Errorf("$%s=fast: %v, want an error naming the variable and the value", TransferEnv, err)
	}
}

// An Engine with an unknown transfer (or PutCTAs without the put transfer) is
// refused by Supports and every constructor, and not as ErrUnavailable:
// the chooser must fail the run instead of keeping collective.
func TestFusedTransferRefused(t *testing.T) {
	sp := overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "x", K: 64, Outs: []int{64}}
	for _, f := range []Engine{{Transfer: "push"}, {PutCTAs: 4}, {Transfer: TransferPut, PutCTAs: -1}} {
		checks := map[string]error{"Supports": f.Supports(sp)}
		_, checks["NewAllGatherMatmul"] = f.NewAllGatherMatmul(sp)
		_, checks["NewMatmulReduceScatter"] = f.NewMatmulReduceScatter(sp)
		_, checks["NewMatmulAllReduce"] = f.NewMatmulAllReduce(sp)
		for name, err := range checks {
			if err == nil || errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "peercopy.Engine: ") {
				t.Errorf("%+v: %s: %v, want a refusal of the setting (not ErrUnavailable)", f, name, err)
			}
		}
	}
	// A valid transfer gets to the strategy's own checks (here: no CUDA
	// backend), which say the strategy is unavailable.
	for _, tr := range []string{"", TransferPull, TransferPut} {
		if err := (Engine{Transfer: tr}).Supports(sp); !errors.Is(err, overlap.ErrUnavailable) {
			t.Errorf("transfer %q without a GPU: %v, want ErrUnavailable", tr, err)
		}
	}
}

// Chunks never straddle two shards: the chunk rows divide the shard.
func TestPutChunkRows(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 1, 3: 1, 7: 7, 9: 3, 50: 25, 64: 16, 200: 50, 4096: 1024, 0: 1} {
		got := putChunkRows(n)
		if got != want || n > 0 && n%got != 0 {
			t.Errorf("putChunkRows(%d) = %d, want %d (a divisor, at most %d chunks)", n, got, want, putChunks)
		}
	}
}
