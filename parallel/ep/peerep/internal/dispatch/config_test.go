package dispatch

import (
	"fmt"
	"math/bits"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// good is a valid configuration the cases below break one field of.
func good() Config {
	return Config{Ranks: 3, Rank: 1, Experts: 6, TopK: 2, Cols: 8, MaxTokens: 5, DType: tensor.Float32}
}

// TestConfigCheck: every field out of range is refused with an error that
// names the value found and the range expected; a valid configuration (and
// its edges: K = E, one rank, bf16) passes.
func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want []string // fragments of the error; nil: valid
	}{
		{"valid", func(*Config) {}, nil},
		{"K=E", func(c *Config) { c.TopK = c.Experts }, nil},
		{"one rank", func(c *Config) { c.Ranks, c.Rank = 1, 0 }, nil},
		{"bf16", func(c *Config) { c.DType = tensor.BFloat16 }, nil},
		{"explicit deadline", func(c *Config) { c.Deadline = time.Millisecond }, nil},
		{"no ranks", func(c *Config) { c.Ranks, c.Rank = 0, 0 }, []string{"0 ranks", "expected at least one"}},
		{"rank past the group", func(c *Config) { c.Rank = 3 }, []string{"rank 3 of 3", "expected 0 ≤ rank < 3"}},
		{"negative rank", func(c *Config) { c.Rank = -1 }, []string{"rank -1 of 3", "expected 0 ≤ rank < 3"}},
		{"experts not a multiple", func(c *Config) { c.Experts = 7 }, []string{"7 experts over 3 ranks", "expected a positive multiple of 3"}},
		{"no experts", func(c *Config) { c.Experts = 0 }, []string{"0 experts over 3 ranks", "expected a positive multiple of 3"}},
		{"fewer experts than ranks", func(c *Config) { c.Experts = 2 }, []string{"2 experts over 3 ranks"}},
		{"K > E", func(c *Config) { c.TopK = 7 }, []string{"top-7 of 6 experts", "expected 1 ≤ K ≤ E"}},
		{"K = 0", func(c *Config) { c.TopK = 0 }, []string{"top-0 of 6 experts", "expected 1 ≤ K ≤ E"}},
		{"no columns", func(c *Config) { c.Cols = 0 }, []string{"0 columns", "positive"}},
		{"no max tokens", func(c *Config) { c.MaxTokens = 0 }, []string{"0 max tokens", "positive"}},
		{"f64", func(c *Config) { c.DType = tensor.Float64 }, []string{"dtype f64", "expected bf16 or f32"}},
		{"int32", func(c *Config) { c.DType = tensor.Int32 }, []string{"expected bf16 or f32"}},
		{"negative deadline", func(c *Config) { c.Deadline = -time.Second }, []string{"deadline -1s", "expected a positive duration (or 0"}},
		{"32-bit sizes", func(c *Config) { c.MaxTokens = 1 << 30 }, []string{"3 ranks × 1073741824 tokens × 8", "32-bit"}},
		// A failed wait names the peer in the low 16 bits of its report.
		{"65536 ranks", func(c *Config) { c.Ranks, c.Rank, c.Experts, c.TopK, c.MaxTokens = 1<<16, 1<<16-1, 1<<16, 1, 1 }, nil},
		{"65537 ranks", func(c *Config) { c.Ranks, c.Rank, c.Experts, c.TopK, c.MaxTokens = 1<<16+1, 0, 1<<16+1, 1, 1 },
			[]string{"65537 ranks", "expected at most 65536", "silent peer"}},
		// ... and the fused path's late block likewise: one rank, one
		// expert, 128·n tokens make n + 1 blocks.
		{"65536 fused blocks", func(c *Config) { oneExpert(c, 128*(1<<16-1)); c.Fused = true }, nil},
		{"65537 fused blocks", func(c *Config) { oneExpert(c, 128*(1<<16)); c.Fused = true },
			[]string{"fused: 65537 blocks of 128 rows", "expected at most 65536", "late block"}},
		{"65537 blocks unfused", func(c *Config) { oneExpert(c, 128*(1<<16)) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.edit(&c)
			err := c.check()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("%+v: %v, expected valid", c, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%+v: accepted, expected an error with %q", c, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%+v: %q, expected it to contain %q", c, err, w)
				}
			}
		})
	}
}

// oneExpert makes c one rank of one expert, top-1, with mt tokens.
func oneExpert(c *Config, mt int) {
	c.Ranks, c.Rank, c.Experts, c.TopK, c.MaxTokens = 1, 0, 1, 1, mt
}

// TestWaitReportNamesEveryPeer: a wait kernel's report (code·65536 +
// index, as ep_wait_words writes it) is explained with the channel and
// the peer, or the fused block, it encodes, up to the largest index
// Config accepts (rank 65535 of 65536, the last of 65536 fused blocks).
func TestWaitReportNamesEveryPeer(t *testing.T) {
	d := &Engine{cfg: Config{Rank: 3, Deadline: time.Second}}
	explain := d.waitExplain()
	for _, idx := range []int{0, 1, 1<<16 - 1} {
		for ch := range numSigChannels {
			err := explain(int32(ch*65536 + idx))
			want := fmt.Sprintf("rank %d never signalled %q", idx, sigNames[ch])
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("channel %d, peer %d: %v, expected %q", ch, idx, err, want)
			}
		}
		err := explain(int32(fusedCounterCode*65536 + idx))
		if want := fmt.Sprintf("the rows of block %d ", idx); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("fused block %d: %v, expected %q", idx, err, want)
		}
	}
}

// TestSymmetricShapes: the symmetric buffers hold what the protocol
// (cuda/kernels/ep.cuh) writes into them, for every rank the same: a header
// row and a signal word per channel per source, a token region of
// MaxTokens rows per source, each slot n·K + j of a rank's tokens in the
// combine and gradient buffers; the routing weights always in f32 (the
// kernels read them as float), the rows in the configured dtype.
func TestSymmetricShapes(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		c := good()
		c.DType = dt
		P, E, K, C, Mt := c.Ranks, c.Experts, c.TopK, c.Cols, c.MaxTokens
		s := SymmetricShapes(c)
		want := map[Buf]Shape{
			Header:  {[]int{P, E + 2}, tensor.Int32}, // per source: E counts, its tokens, the rows it sent here
			Tokens:  {[]int{P * Mt, C}, dt},
			Meta:    {[]int{P * Mt, 1 + 2*K}, tensor.Int32}, // the source token, then (expert, rank) per choice
			Weights: {[]int{P * Mt, K}, tensor.Float32},
			Y:       {[]int{Mt * K, C}, dt},
			G:       {[]int{Mt * K, C}, dt},
			Signals: {[]int{2 * 7 * P}, tensor.Int32}, // 7 channels of P 64-bit words
		}
		for b := range NumBufs {
			w := want[b]
			if s[b].DType != w.DType || !tensor.Shape(s[b].Shape).Equal(w.Shape) {
				t.Errorf("%v: buffer %d is %v%v, want %v%v", dt, b, s[b].DType, s[b].Shape, w.DType, w.Shape)
			}
		}
		if len(sigNames) != numSigChannels || 2*numSigChannels*P != s[Signals].Shape[0] {
			t.Errorf("%d signal channels named, %d in the pad of %d words, want 7 each", len(sigNames), numSigChannels, s[Signals].Shape[0])
		}
	}
}

// TestRecvBound: RecvBound is the most expert rows a rank can receive,
// found by brute force over small worlds: the tokens route independently,
// so it is P·MaxTokens times the most choices one token can put on a
// rank's experts, over every routing of the token.
func TestRecvBound(t *testing.T) {
	for _, c := range []Config{
		{Ranks: 1, Experts: 1, TopK: 1, MaxTokens: 3},
		{Ranks: 2, Experts: 4, TopK: 1, MaxTokens: 3},
		{Ranks: 2, Experts: 4, TopK: 3, MaxTokens: 3},
		{Ranks: 3, Experts: 6, TopK: 6, MaxTokens: 2},
		{Ranks: 3, Experts: 9, TopK: 2, MaxTokens: 4},
	} {
		// Every routing of one token (K distinct experts of E, a bit
		// mask): the most of its choices on rank 0's experts [0, L).
		L, most := c.Experts/c.Ranks, 0
		for m := range 1 << c.Experts {
			if bits.OnesCount(uint(m)) == c.TopK {
				most = max(most, bits.OnesCount(uint(m)&(1<<L-1)))
			}
		}
		if want := c.Ranks * c.MaxTokens * most; c.recvBound() != want {
			t.Errorf("%+v: recvBound %d, brute force %d", c, c.recvBound(), want)
		}
	}
}

// TestFusedBlocksBound: FusedBlocks bounds Σ_e ⌈rows_e / 128⌉ over every
// split of at most RecvBound rows among the L local experts (brute force),
// and is reached: the fused path's counters and flags never run short.
func TestFusedBlocksBound(t *testing.T) {
	for _, c := range []Config{
		{Ranks: 2, Experts: 4, TopK: 2, MaxTokens: 100}, // L = 2, R = 400
		{Ranks: 3, Experts: 9, TopK: 3, MaxTokens: 50},  // L = 3, R = 450
		{Ranks: 1, Experts: 3, TopK: 1, MaxTokens: 129}, // L = 3, R = 129
		{Ranks: 2, Experts: 2, TopK: 1, MaxTokens: 64},  // L = 1, R = 128
	} {
		L, R := c.Experts/c.Ranks, c.recvBound()
		most := 0
		var split func(e, left, blocks int)
		split = func(e, left, blocks int) {
			if e == L {
				most = max(most, blocks)
				return
			}
			for r := 0; r <= left; r++ {
				split(e+1, left-r, blocks+(r+FusedBlockRows-1)/FusedBlockRows)
			}
		}
		split(0, R, 0)
		if got := c.FusedBlocks(); got < most {
			t.Errorf("%+v: FusedBlocks %d, but %d rows over %d experts can take %d blocks", c, got, R, L, most)
		} else if got > most+1 {
			t.Errorf("%+v: FusedBlocks %d, far above the most blocks %d", c, got, most)
		}
	}
}
