package cuda

import (
	"strings"
	"testing"
)

// TestTensorMapChecks checks the argument checks made before the driver is
// asked (they need no GPU).
func TestTensorMapChecks(t *testing.T) {
	ok := TiledTensorMap{DType: TensorMapBFloat16, Addr: 0x1000, Dims: []uint64{64, 8}, Strides: []uint64{128},
		Box: []uint32{64, 8}, Swizzle: Swizzle128B}
	if err := ok.check(); err != nil {
		t.Fatalf("a valid map is refused: %v", err)
	}
	for _, tc := range []struct {
		want string
		edit func(*TiledTensorMap)
	}{
		{"not 16-byte aligned", func(p *TiledTensorMap) { p.Addr = 0x1008 }},
		{"stride 1 is 120 bytes", func(p *TiledTensorMap) { p.Strides = []uint64{120} }},
		{"1 strides for 3 dimensions, expected 2", func(p *TiledTensorMap) { p.Dims = []uint64{64, 8, 2}; p.Box = []uint32{64, 8, 1} }},
		{"box dimension 1 is 300", func(p *TiledTensorMap) { p.Box = []uint32{64, 300} }},
		{"256 bytes, more than the 128-byte swizzle span", func(p *TiledTensorMap) { p.Box = []uint32{128, 8} }},
		{"dimension 0 is 0", func(p *TiledTensorMap) { p.Dims = []uint64{0, 8} }},
	} {
		p := ok
		tc.edit(&p)
		err := p.check()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v", tc.want, err)
		}
	}
	var m TensorMap
	if len(m.Arg()) != 128 {
		t.Fatalf("Arg has %d bytes, want 128", len(m.Arg()))
	}
}
