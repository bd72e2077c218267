package layers

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestCrossEntropyPart: the plain Loss part gives −log softmax(x)[t] per
// row (computed here on the host), 0 for ignored rows, the gradient
// scale·(softmax − onehot), and rejects bad inputs before any op.
func TestCrossEntropyPart(t *testing.T) {
	const N, V = 3, 5
	b := newBackend()
	ce, err := NewCrossEntropy(b, V)
	noErr(t, b, err)
	rng := testutil.Rng(4)
	logits := randDevice(t, b, rng, tensor.Float64, 2, N, V)
	x := download(t, b, logits)
	tg := hostInts(t, []int32{4, -1, 0}, N)
	losses, dl := b.Zeros(tensor.Float64, N), b.Zeros(tensor.Float64, N, V)
	const scale = 0.25
	noErr(t, b, ce.Forward(losses, dl, logits, tg, scale))
	wantL, wantD := make([]float64, N), make([]float64, N*V)
	for n, c := range tg.I32() {
		if c < 0 {
			continue
		}
		row := x[n*V : (n+1)*V]
		var z float64
		for _, v := range row {
			z += math.Exp(v)
		}
		wantL[n] = math.Log(z) - row[c]
		for j, v := range row {
			wantD[n*V+j] = scale * math.Exp(v) / z
		}
		wantD[n*V+int(c)] -= scale
	}
	testutil.AllClose(t, "losses", download(t, b, losses), wantL, 1e-12)
	testutil.AllClose(t, "dlogits", download(t, b, dl), wantD, 1e-12)

	wantErr(t, "target too large", ce.Forward(losses, nil, logits, hostInts(t, []int32{5, 0, 0}, N), 1), "targets[0] = 5, expected a value < Vocab = 5")
	wantErr(t, "targets count", ce.Forward(losses, nil, logits, hostInts(t, []int32{1, 0}, 2), 1), "expected a host int32 tensor of 3 values")
	wantErr(t, "losses size", ce.Forward(b.Zeros(tensor.Float64, 2), nil, logits, tg, 1), "expected 3 values")
	wantErr(t, "dlogits shape", ce.Forward(losses, b.Zeros(tensor.Float64, N, V+1), logits, tg, 1), "dlogits has shape (3, 6)")
	_, err = NewDecoder(b, DecoderParts{What: "test", Seq: 4, Vocab: V, Dim: 2, LogitCols: V, DType: tensor.Float64, Loss: ce})
	wantErr(t, "decoder without parts", err, "test: decoder parts without an embedding")
	if err := b.Err(); err != nil {
		t.Fatalf("bad inputs left a backend error: %v", err)
	}
}
