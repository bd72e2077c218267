package train

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tokens"
)

func TestLoaderTargetsAreShiftedInputs(t *testing.T) {
	data := corpus(1000)
	l := mustLoader(t, data, LoaderConfig{Batch: 3, Seq: 16, Vocab: 256, Seed: 1})
	for range 50 {
		in, tg, err := l.Next()
		if err != nil {
			t.Fatal(err)
		}
		if s := in.Shape(); s[0] != 3 || s[1] != 16 || !tg.Shape().Equal(s) {
			t.Fatalf("shapes %v %v, want (3, 16)", in.Shape(), tg.Shape())
		}
		x, y := in.I32(), tg.I32()
		for b := range 3 {
			row, trow := x[b*16:(b+1)*16], y[b*16:(b+1)*16]
			// The row is a window of the corpus starting at a multiple of Seq.
			w := -1
			for s := 0; s+17 <= len(data); s += 16 {
				ok := true
				for i := range 16 {
					if int32(data[s+i]) != row[i] || int32(data[s+i+1]) != trow[i] {
						ok = false
						break
					}
				}
				if ok {
					w = s
					break
				}
			}
			if w < 0 {
				t.Fatalf("batch row %d is not a window of the corpus with targets shifted by one", b)
			}
		}
	}
}

func TestLoaderEpochsArePermutations(t *testing.T) {
	data := corpus(16*10 + 1) // exactly 10 windows
	l := mustLoader(t, data, LoaderConfig{Batch: 1, Seq: 16, Vocab: 256, Seed: 42})
	if l.Windows() != 10 {
		t.Fatalf("windows = %d, want 10", l.Windows())
	}
	epochOrder := func() []int {
		var order []int
		for range 10 {
			in, _, err := l.Next()
			if err != nil {
				t.Fatal(err)
			}
			order = append(order, windowOf(t, data, in.I32()))
		}
		return order
	}
	e0, e1 := epochOrder(), epochOrder()
	for _, o := range [][]int{e0, e1} {
		seen := map[int]bool{}
		for _, w := range o {
			seen[w] = true
		}
		if len(seen) != 10 {
			t.Fatalf("epoch order %v does not visit every window once", o)
		}
	}
	if reflect.DeepEqual(e0, e1) {
		t.Errorf("epochs 0 and 1 have the same order %v", e0)
	}
	if p := l.Position(); p.Epoch != 2 || p.Index != 0 {
		t.Errorf("after two epochs position is %+v, want epoch 2 index 0", p)
	}
	// Same seed, same order; other seed, other order.
	l2 := mustLoader(t, data, LoaderConfig{Batch: 1, Seq: 16, Vocab: 256, Seed: 42})
	l3 := mustLoader(t, data, LoaderConfig{Batch: 1, Seq: 16, Vocab: 256, Seed: 43})
	var o2, o3 []int
	for range 10 {
		a, _, _ := l2.Next()
		b, _, _ := l3.Next()
		o2, o3 = append(o2, windowOf(t, data, a.I32())), append(o3, windowOf(t, data, b.I32()))
	}
	if !reflect.DeepEqual(o2, e0) {
		t.Errorf("same seed gave order %v, then %v", e0, o2)
	}
	if reflect.DeepEqual(o3, e0) {
		t.Errorf("seeds 42 and 43 gave the same order %v", e0)
	}
	// Sequential: in order.
	ls := mustLoader(t, data, LoaderConfig{Batch: 1, Seq: 16, Vocab: 256, Sequential: true})
	for i := range 10 {
		a, _, _ := ls.Next()
		if w := windowOf(t, data, a.I32()); w != i {
			t.Fatalf("sequential loader: batch %d is window %d", i, w)
		}
	}
}

func windowOf(t *testing.T, data []byte, row []int32) int {
	t.Helper()
	T := len(row)
	for w := 0; w*T+T <= len(data); w++ {
		ok := true
		for i := range T {
			if int32(data[w*T+i]) != row[i] {
				ok = false
				break
			}
		}
		if ok {
			return w
		}
	}
	t.Fatalf("row is not a window")
	return -1
}

func TestLoaderSeekRestoresExactly(t *testing.T) {
	data := corpus(2000)
	cfg := LoaderConfig{Batch: 5, Seq: 32, Vocab: 256, Seed: 9} // 62 windows: batches straddle epochs
	a := mustLoader(t, data, cfg)
	var pos DataPosition
	var want [][]int32
	for i := range 60 {
		if i == 23 {
			pos = a.Position()
		}
		in, tg, err := a.Next()
		if err != nil {
			t.Fatal(err)
		}
		if i >= 23 {
			want = append(want, append(append([]int32{}, in.I32()...), tg.I32()...))
		}
	}
	b := mustLoader(t, data, cfg)
	if err := b.Seek(pos); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		in, tg, _ := b.Next()
		if got := append(append([]int32{}, in.I32()...), tg.I32()...); !reflect.DeepEqual(got, w) {
			t.Fatalf("batch %d after Seek(%+v) differs", 23+i, pos)
		}
	}
	// Seek errors.
	testutil.ErrorContains(t, b.Seek(DataPosition{Epoch: 0, Index: 0, Seed: 8, Windows: b.Windows(), Seq: 32}), "seed 8")
	testutil.ErrorContains(t, b.Seek(DataPosition{Epoch: 0, Index: 99, Seed: 9, Windows: b.Windows(), Seq: 32}), "index 99")
}

func TestDatasetErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.txt")
	_, err := tokens.Open(missing, tokens.Auto)
	testutil.ErrorContains(t, err, missing, "does not exist")

	short := writeTemp(t, "short.txt", []byte("hello"))
	_, err = openLoader(short, LoaderConfig{Batch: 1, Seq: 8, Vocab: 256})
	testutil.ErrorContains(t, err, short, "has 5 tokens", "seq+1 = 9")

	// .bin tokens beyond the vocabulary.
	bin := make([]byte, 2*40)
	for i := range 40 {
		binary.LittleEndian.PutUint16(bin[2*i:], uint16(i))
	}
	binary.LittleEndian.PutUint16(bin[2*17:], 300)
	big := writeTemp(t, "toks.bin", bin)
	_, err = openLoader(big, LoaderConfig{Batch: 1, Seq: 8, Vocab: 256})
	testutil.ErrorContains(t, err, big, "token id 300 at position 17", "256 ids")
	// With a large enough vocabulary the same file loads, decoded LE.
	l, err := openLoader(big, LoaderConfig{Batch: 1, Seq: 8, Vocab: 512, Sequential: true})
	if err != nil {
		t.Fatal(err)
	}
	in, tg, _ := l.Next()
	if in.I32()[3] != 3 || tg.I32()[3] != 4 {
		t.Errorf(".bin decoding: inputs %v targets %v", in.I32(), tg.I32())
	}

	// Text bytes beyond a small vocabulary.
	_, err = NewLoader(tokens.FromIDs("mem", []int32{1, 2, 200, 3}), LoaderConfig{Batch: 1, Seq: 2, Vocab: 100})
	testutil.ErrorContains(t, err, "mem", "token id 200 at position 2")

	// Of several files, the one that holds the id, at its own position.
	two := writeTemp(t, "two.bin", bin)
	_, err = openLoader(big+","+two, LoaderConfig{Batch: 1, Seq: 8, Vocab: 256})
	testutil.ErrorContains(t, err, big, "position 17")
	ok := writeTemp(t, "ok.bin", bin[:34])
	_, err = openLoader(ok+","+two, LoaderConfig{Batch: 1, Seq: 8, Vocab: 256})
	testutil.ErrorContains(t, err, two, "token id 300 at position 17")

	_, err = NewLoader(tokens.FromBytes("none", nil), LoaderConfig{Batch: 1, Seq: 2, Vocab: 256})
	testutil.ErrorContains(t, err, "none", "empty")
}

func openLoader(spec string, cfg LoaderConfig) (*Loader, error) {
	ds, err := tokens.Open(spec, tokens.Auto)
	if err != nil {
		return nil, err
	}
	return NewLoader(ds, cfg)
}

// Ids past 65 535 reach the batches as they are.
func TestLoaderWideIDs(t *testing.T) {
	ids := make([]int32, 8*50+1)
	for i := range ids {
		ids[i] = int32(65530 + i*37%4470) // 65530 .. 69999
	}
	ids[100] = 69999
	l, err := NewLoader(tokens.FromIDs("wide", ids), LoaderConfig{Batch: 5, Seq: 8, Vocab: 70000, Sequential: true})
	if err != nil {
		t.Fatal(err)
	}
	for b := range 10 {
		in, tg, err := l.Next()
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range in.I32() {
			w := (5*b + i/8) % 50
			if p := w*8 + i%8; v != ids[p] || tg.I32()[i] != ids[p+1] {
				t.Fatalf("batch %d, element %d: %d -> %d, want %d -> %d", b, i, v, tg.I32()[i], ids[p], ids[p+1])
			}
		}
	}
	_, err = NewLoader(tokens.FromIDs("wide", ids), LoaderConfig{Batch: 5, Seq: 8, Vocab: 69999})
	testutil.ErrorContains(t, err, "token id 69999", "69999 ids")
}

// A dataset larger than CheckAllTokens starts without reading its ids; an
// id outside the vocabulary stops Next at the batch that reads it, with
// the position left where that batch began.
func TestLoaderChecksLargeDataByWindow(t *testing.T) {
	defer func(n int64) { checkAllTokens = n }(checkAllTokens)
	checkAllTokens = 100
	ids := make([]int32, 16*40+1)
	for i := range ids {
		ids[i] = int32(i % 97)
	}
	ids[16*23+5] = 500 // in window 23
	l, err := NewLoader(tokens.FromIDs("big", ids), LoaderConfig{Batch: 3, Seq: 16, Vocab: 256, Seed: 4})
	if err != nil {
		t.Fatalf("NewLoader read the ids of a large dataset: %v", err)
	}
	for range 20 {
		pos := l.Position()
		if _, _, err = l.Next(); err != nil {
			testutil.ErrorContains(t, err, "big", "token id 500 at position 373", "256 ids")
			if p := l.Position(); p != pos {
				t.Errorf("after the error the position is %+v, want %+v", p, pos)
			}
			return
		}
	}
	t.Fatalf("40 epochs of windows without reaching the bad id")
}

func TestSplitValidation(t *testing.T) {
	ds := tokens.FromBytes("c", corpus(1000))
	tr, va, err := SplitValidation(ds, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Len() != 950 || va.Len() != 50 {
		t.Fatalf("split 1000 tokens into %d + %d, want 950 + 50", tr.Len(), va.Len())
	}
	got, want := make([]int32, 50), make([]int32, 50)
	if err := va.Read(got, 0); err != nil {
		t.Fatal(err)
	}
	if err := ds.Read(want, 950); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("validation split is not the last tokens")
	}
	if _, _, err := SplitValidation(ds, 1.5); err == nil {
		t.Errorf("SplitValidation(1.5) gave no error")
	}
	_, _, err = SplitValidation(tokens.FromBytes("tiny", []byte("a")), 0.05)
	testutil.ErrorContains(t, err, "tiny", "too few")
}

// The window order holds nothing per window: each epoch is a permutation,
// a different one per epoch and seed, and not close to the identity.
func TestWindowOrder(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 10, 64, 100, 1000, 4097} {
		var first []int
		for e := range 3 {
			p := newPermutation(n, 11, e)
			seen := make([]bool, n)
			order := make([]int, n)
			for i := range n {
				w := p.at(i)
				if w < 0 || w >= n || seen[w] {
					t.Fatalf("n %d, epoch %d: index %d gives window %d again or out of range", n, e, i, w)
				}
				seen[w], order[i] = true, w
			}
			if e == 0 {
				first = order
			} else if n >= 10 && reflect.DeepEqual(order, first) {
				t.Errorf("n %d: epochs 0 and %d have the same order", n, e)
			}
			if n >= 1000 {
				// Spearman's rank correlation of index and window: near 0
				// for a shuffle (its deviation is 1/sqrt(n-1)).
				var s float64
				for i, w := range order {
					d := float64(i - w)
					s += d * d
				}
				if rho := 1 - 6*s/(float64(n)*(float64(n)*float64(n)-1)); math.Abs(rho) > 0.15 {
					t.Errorf("n %d, epoch %d: rank correlation %.3f of index and window", n, e, rho)
				}
			}
		}
	}
}

// A data position of a checkpoint written before OrderFeistel resumes in
// its own order: each epoch's permutation drawn whole.
func TestLoaderResumesTheDrawnOrder(t *testing.T) {
	data := corpus(16*10 + 1) // 10 windows
	cfg := LoaderConfig{Batch: 3, Seq: 16, Vocab: 256, Seed: 42}
	l := mustLoader(t, data, cfg)
	if err := l.Seek(DataPosition{Epoch: 1, Index: 8, Seed: 42, Windows: 10, Seq: 16}); err != nil {
		t.Fatal(err)
	}
	perm := func(e int) []int {
		return rand.New(rand.NewPCG(42, uint64(e)*0x9e3779b97f4a7c15+0x632be59bd9b4e019)).Perm(10)
	}
	want := append(perm(1)[8:], perm(2)...)
	for b := range 4 {
		in, _, err := l.Next()
		if err != nil {
			t.Fatal(err)
		}
		for r := range 3 {
			if w := windowOf(t, data, in.I32()[r*16:(r+1)*16]); w != want[3*b+r] {
				t.Fatalf("batch %d row %d is window %d, want %d of the drawn order", b, r, w, want[3*b+r])
			}
		}
	}
	if p := l.Position(); p.Order != OrderDrawn || p.Epoch != 3 || p.Index != 0 {
		t.Errorf("position %+v, want epoch 3 index 0 in the drawn order", p)
	}
	if p := mustLoader(t, data, cfg).Position(); p.Order != OrderFeistel {
		t.Errorf("a new loader's order is %q, want %q", p.Order, OrderFeistel)
	}
	testutil.ErrorContains(t, l.Seek(DataPosition{Epoch: 0, Index: 0, Seed: 42, Windows: 10, Seq: 16, Order: "sorted"}), `"sorted"`)
}
