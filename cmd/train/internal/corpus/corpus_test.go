package corpus

import (
	"bytes"
	"testing"
)

func TestDefaultIsStableAndText(t *testing.T) {
	a, b := Default(), Default()
	if !bytes.Equal(a, b) {
		t.Fatal("Default differs between calls")
	}
	if len(a) < 300_000 {
		t.Fatalf("Default has %d bytes, want at least 300000", len(a))
	}
	for i, c := range a {
		if c >= 128 || (c < 32 && c != '\n') {
			t.Fatalf("byte %d is %q, want printable ASCII or newline", i, c)
		}
	}
	if bytes.Equal(Generate(1, 1000), Generate(2, 1000)) {
		t.Fatal("different seeds gave the same text")
	}
}
