package train

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"
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
	mustContain(t, b.Seek(DataPosition{Epoch: 0, Index: 0, Seed: 8, Windows: b.Windows(), Seq: 32}), "seed 8")
	mustContain(t, b.Seek(DataPosition{Epoch: 0, Index: 99, Seed: 9, Windows: b.Windows(), Seq: 32}), "index 99")
}

func TestDatasetErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.txt")
	_, err := ReadDataset(missing)
	mustContain(t, err, missing, "does not exist")

	empty := writeTemp(t, "empty.txt", nil)
	_, err = ReadDataset(empty)
	mustContain(t, err, empty, "empty")

	odd := writeTemp(t, "odd.bin", []byte{1, 2, 3})
	_, err = ReadDataset(odd)
	mustContain(t, err, odd, "odd length of 3 bytes")

	short := writeTemp(t, "short.txt", []byte("hello"))
	_, err = OpenLoader(short, LoaderConfig{Batch: 1, Seq: 8, Vocab: 256})
	mustContain(t, err, short, "has 5 tokens", "seq+1 = 9")

	// .bin tokens beyond the vocabulary.
	bin := make([]byte, 2*40)
	for i := range 40 {
		binary.LittleEndian.PutUint16(bin[2*i:], uint16(i))
	}
	binary.LittleEndian.PutUint16(bin[2*17:], 300)
	big := writeTemp(t, "toks.bin", bin)
	_, err = OpenLoader(big, LoaderConfig{Batch: 1, Seq: 8, Vocab: 256})
	mustContain(t, err, big, "token id 300 at position 17", "256 ids")
	// With a large enough vocabulary the same file loads, decoded LE.
	l, err := OpenLoader(big, LoaderConfig{Batch: 1, Seq: 8, Vocab: 512, Sequential: true})
	if err != nil {
		t.Fatal(err)
	}
	in, tg, _ := l.Next()
	if in.I32()[3] != 3 || tg.I32()[3] != 4 {
		t.Errorf(".bin decoding: inputs %v targets %v", in.I32(), tg.I32())
	}

	// Text bytes beyond a small vocabulary.
	_, err = NewLoader(&Dataset{Name: "mem", Tokens: []uint16{1, 2, 200, 3}}, LoaderConfig{Batch: 1, Seq: 2, Vocab: 100})
	mustContain(t, err, "mem", "token id 200 at position 2")

	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = ReadDataset(filepath.Join(dir, "d"))
	mustContain(t, err, "is a directory")
}

func TestDatasetSplit(t *testing.T) {
	ds, err := BytesDataset("c", corpus(1000))
	if err != nil {
		t.Fatal(err)
	}
	tr, va, err := ds.Split(0.05)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Tokens) != 950 || len(va.Tokens) != 50 {
		t.Fatalf("split 1000 tokens into %d + %d, want 950 + 50", len(tr.Tokens), len(va.Tokens))
	}
	if &va.Tokens[0] != &ds.Tokens[950] {
		t.Errorf("validation split is not the last tokens")
	}
	if _, _, err := ds.Split(1.5); err == nil {
		t.Errorf("Split(1.5) gave no error")
	}
	tiny, _ := BytesDataset("tiny", []byte("a"))
	_, _, err = tiny.Split(0.05)
	mustContain(t, err, "tiny", "too few")
}
