package routing

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// rec is one record of a dump file, as Dump.Write encodes it.
func rec(step, layer, rank, ranks, topk int, name string, ids ...uint16) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, []uint32{uint32(step), uint32(layer), uint32(rank), uint32(ranks), uint32(len(ids) / topk), uint32(topk)})
	binary.Write(&b, binary.LittleEndian, uint16(len(name)))
	b.WriteString(name)
	binary.Write(&b, binary.LittleEndian, ids)
	return b.Bytes()
}

func writeDump(t *testing.T, files map[int][][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for rank, recs := range files {
		data := append([]byte(magic), bytes.Join(recs, nil)...)
		if err := os.WriteFile(File(dir, rank), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Two ranks of one token group concatenate into the global order, which a
// single-rank dump of the same choices (in another order within each
// token's top-k) equals; a resumed step's later record replaces the
// earlier; a changed token is counted and named.
func TestReadAndDiff(t *testing.T) {
	two := writeDump(t, map[int][][]byte{
		0: {rec(1, 0, 0, 2, 2, "moe0", 1, 2, 3, 0), rec(2, 0, 0, 2, 2, "moe0", 9, 9, 9, 9), rec(2, 0, 0, 2, 2, "moe0", 5, 4, 0, 1)},
		1: {rec(1, 0, 1, 2, 2, "moe0", 7, 6), rec(2, 0, 1, 2, 2, "moe0", 2, 3)},
	})
	one := writeDump(t, map[int][][]byte{
		0: {rec(1, 0, 0, 1, 2, "moe0", 2, 1, 0, 3, 6, 7), rec(2, 0, 0, 1, 2, "moe0", 4, 5, 1, 0, 3, 6), rec(3, 0, 0, 1, 2, "moe0", 0, 1, 2, 3, 4, 5)},
	})
	a, err := Read(two)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Read(one)
	if err != nil {
		t.Fatal(err)
	}
	steps, only, err := Diff(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"step 3 only in " + one}; !slices.Equal(only, want) {
		t.Errorf("only: %q, want %q", only, want)
	}
	if len(steps) != 2 || steps[0].Diffs != 0 || steps[0].Tokens != 3 || steps[1].Diffs != 1 || steps[1].Tokens != 3 ||
		!slices.Equal(steps[1].PerLayer, []int{1}) || !strings.Contains(steps[1].First, "token 2: experts [2 3] vs [3 6]") {
		t.Errorf("steps: %+v; want step 1 equal, step 2 with token 2 differing", steps)
	}
}

// A dump missing a rank of its token group, and a file that is not a
// dump, are refused naming what is wrong.
func TestReadRefuses(t *testing.T) {
	missing := writeDump(t, map[int][][]byte{0: {rec(1, 0, 0, 2, 1, "moe0", 1)}})
	if _, err := Read(missing); err == nil || !strings.Contains(err.Error(), "no record of token-group rank 1 of 2") {
		t.Errorf("a missing rank: %v", err)
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "rank-00000.routing"), []byte("not a dump"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(bad); err == nil || !strings.Contains(err.Error(), "rank-00000.routing: expected a routing dump file") {
		t.Errorf("not a dump: %v", err)
	}
	if _, err := Read(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no rank-NNNNN.routing files") {
		t.Errorf("an empty directory: %v", err)
	}
}
