package tokenstest

import (
	"encoding/binary"
	"os"
	"testing"
)

// The writers below build each format byte by byte from its definition
// (llm.c's dev/data/data_common.py, Megatron-LM's indexed_dataset.py),
// sharing no code with the readers they test. Ids are int64 so that a
// test can write ids a reader must refuse.

// Raw is ids as little-endian integers of width bytes (1, 2, 4 or 8).
func Raw(ids []int64, width int) []byte {
	b := make([]byte, len(ids)*width)
	for i, v := range ids {
		u := uint64(v)
		for k := range width {
			b[i*width+k] = byte(u >> (8 * k))
		}
	}
	return b
}

// LLMCHeader is llm.c's 1024-byte shard header: 256 little-endian int32,
// [0] magic, [1] version, [2] the number of ids, the rest zero.
func LLMCHeader(magic, version, ntok int32) []byte {
	h := make([]byte, 1024)
	binary.LittleEndian.PutUint32(h[0:], uint32(magic))
	binary.LittleEndian.PutUint32(h[4:], uint32(version))
	binary.LittleEndian.PutUint32(h[8:], uint32(ntok))
	return h
}

// LLMC is an llm.c shard of ids: uint16 ids (magic 20240520, version 1)
// for width 2, uint32 ids (magic 20240801, version 7) for width 4.
func LLMC(ids []int64, width int) []byte {
	magic, version := int32(20240520), int32(1)
	if width == 4 {
		magic, version = 20240801, 7
	}
	return append(LLMCHeader(magic, version, int32(len(ids))), Raw(ids, width)...)
}

// MegatronWidth is the id width of each of Megatron's integer dtype codes
// (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16).
var MegatronWidth = map[uint8]int{1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 8: 2}

// Megatron is a Megatron indexed dataset of one sequence per document
// (IndexedDatasetBuilder.add_document): the .bin's bytes (the documents'
// ids one after another) and the .idx's: magic "MMIDIDX\0\0", version 1
// (uint64), dtype code (uint8), sequence count and document count
// (uint64), sequence lengths (int32), sequence pointers (int64 byte
// offsets into the .bin), document indices (int64: 0, then the sequence
// count after each document), and with modes one int8 per sequence.
func Megatron(docs [][]int64, code uint8, modes bool) (bin, idx []byte) {
	w := MegatronWidth[code]
	if w == 0 {
		w = 4 // a float code, for a test that the reader refuses it
	}
	le := binary.LittleEndian
	idx = []byte("MMIDIDX\x00\x00")
	idx = le.AppendUint64(idx, 1)
	idx = append(idx, code)
	idx = le.AppendUint64(idx, uint64(len(docs)))
	idx = le.AppendUint64(idx, uint64(len(docs)+1))
	for _, d := range docs {
		idx = le.AppendUint32(idx, uint32(int32(len(d))))
	}
	ptr := int64(0)
	for _, d := range docs {
		idx = le.AppendUint64(idx, uint64(ptr))
		ptr += int64(len(d) * w)
	}
	for i := range len(docs) + 1 {
		idx = le.AppendUint64(idx, uint64(i))
	}
	if modes {
		idx = append(idx, make([]byte, len(docs))...)
	}
	for _, d := range docs {
		bin = append(bin, Raw(d, w)...)
	}
	return bin, idx
}

// WriteFile writes b to path, failing t on error.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// WriteMegatron writes Megatron(docs, code, false) to prefix.bin and
// prefix.idx.
func WriteMegatron(t testing.TB, prefix string, docs [][]int64, code uint8) {
	t.Helper()
	bin, idx := Megatron(docs, code, false)
	WriteFile(t, prefix+".bin", bin)
	WriteFile(t, prefix+".idx", idx)
}
