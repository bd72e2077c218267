package overlap

import (
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

// devBuf is a stand-in for device memory: float64 elements that only the
// fake backend below can read.
type devBuf struct{ v []float64 }

func (b *devBuf) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA} }
func (b *devBuf) DType() tensor.DType   { return tensor.Float64 }
func (b *devBuf) Len() int              { return len(b.v) }

// devBackend implements the one op the column copies need; columns makes it
// a ColumnCopier too.
type devBackend struct {
	tensor.Backend
	copies, columnCopies int
}

func (b *devBackend) Copy(dst, src *tensor.Tensor) {
	b.copies++
	d, s := dst.Buffer().(*devBuf), src.Buffer().(*devBuf)
	copy(d.v[dst.Offset():dst.Offset()+dst.Numel()], s.v[src.Offset():src.Offset()+src.Numel()])
}

type columnBackend struct{ devBackend }

func (b *columnBackend) CopyColumns(dst *tensor.Tensor, dstCol int, src *tensor.Tensor, srcCol, n int) {
	b.columnCopies++
	d, s := dst.Buffer().(*devBuf), src.Buffer().(*devBuf)
	rows, cd, _ := as2D(dst)
	_, cs, _ := as2D(src)
	hostColumns(d.v[dst.Offset():], cd, dstCol, s.v[src.Offset():], cs, srcCol, n, rows)
}

func devTensor(vals []float64, shape ...int) *tensor.Tensor {
	t, err := tensor.New(&devBuf{vals}, 0, shape...)
	if err != nil {
		panic(err)
	}
	return t
}

// TestCopyColumns checks the three paths of copyColumns give the same
// result: host slices, one Copy per row, and a ColumnCopier.
func TestCopyColumns(t *testing.T) {
	src := []float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11} // (3, 4)
	want := []float64{-1, 1, 2, -1, 5, 6, -1, 9, 10}       // columns 1, 2 into columns 1, 2 of (3, 3)
	fresh := func() []float64 { return []float64{-1, -1, -1, -1, -1, -1, -1, -1, -1} }
	check := func(name string, got []float64) {
		t.Helper()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: got %v, want %v", name, got, want)
			}
		}
	}

	h := fresh()
	hd, _ := tensor.FromFloat64(h, 3, 3)
	hs, _ := tensor.FromFloat64(append([]float64(nil), src...), 3, 4)
	if err := copyColumns(&devBackend{}, hd, 1, hs, 1, 2); err != nil {
		t.Fatal(err)
	}
	check("host", h)

	rowWise := &devBackend{}
	d := fresh()
	if err := copyColumns(rowWise, devTensor(d, 3, 3), 1, devTensor(src, 3, 4), 1, 2); err != nil {
		t.Fatal(err)
	}
	check("row by row", d)
	if rowWise.copies != 3 {
		t.Errorf("row by row: %d copies, want 3", rowWise.copies)
	}

	cc := &columnBackend{}
	d = fresh()
	if err := copyColumns(cc, devTensor(d, 3, 3), 1, devTensor(src, 3, 4), 1, 2); err != nil {
		t.Fatal(err)
	}
	check("column copier", d)
	if cc.columnCopies != 1 || cc.copies != 0 {
		t.Errorf("column copier: %d column copies and %d copies, want 1 and 0", cc.columnCopies, cc.copies)
	}

	if err := copyColumns(cc, devTensor(fresh(), 3, 3), 2, devTensor(src, 3, 4), 1, 2); err == nil {
		t.Error("columns outside dst: no error")
	}
}
