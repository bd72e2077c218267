package tokens

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
)

// WriteRaw writes ids as raw little-endian ids of width bytes: 2 (uint16,
// the Uint16 format) or 4 (uint32, the Uint32 format).
func WriteRaw(w io.Writer, ids []int32, width int) error {
	if err := checkIDs(ids, width, "raw"); err != nil {
		return err
	}
	return writeIDs(w, ids, width)
}

// WriteLLMC writes ids as an llm.c shard: the 256-int32 header (magic
// 20240520, version 1 for 2-byte ids; 20240801, version 7 for 4-byte
// ids; the token count), then the ids as uint16 or uint32.
func WriteLLMC(w io.Writer, ids []int32, width int) error {
	if err := checkIDs(ids, width, "llm.c"); err != nil {
		return err
	}
	if len(ids) == 0 || len(ids) > math.MaxInt32 {
		return fmt.Errorf("tokens: an llm.c shard of %d ids, expected 1 to %d", len(ids), math.MaxInt32)
	}
	var h [llmcHeaderBytes]byte
	magic, version := llmcMagic16, llmcVersion16
	if width == 4 {
		magic, version = llmcMagic32, llmcVersion32
	}
	binary.LittleEndian.PutUint32(h[0:], uint32(magic))
	binary.LittleEndian.PutUint32(h[4:], uint32(version))
	binary.LittleEndian.PutUint32(h[8:], uint32(len(ids)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	return writeIDs(w, ids, width)
}

// WriteMegatron writes a Megatron indexed dataset, PREFIX.bin and
// PREFIX.idx, as Megatron's IndexedDatasetBuilder does with one
// add_document per element of docs (one sequence per document): ids of 2
// bytes as uint16 (dtype code 8), of 4 bytes as int32 (code 4).
func WriteMegatron(prefix string, docs [][]int32, width int) error {
	code, err := MegatronCode(width)
	if err != nil {
		return err
	}
	for _, d := range docs {
		if err := checkIDs(d, width, "Megatron"); err != nil {
			return err
		}
		if len(d) > math.MaxInt32 {
			return fmt.Errorf("tokens: a Megatron sequence of %d ids, more than an int32 length holds", len(d))
		}
	}
	err = writeFile(prefix+".bin", func(w io.Writer) error {
		for _, d := range docs {
			if err := writeIDs(w, d, width); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return writeFile(prefix+".idx", func(w io.Writer) error {
		le := binary.LittleEndian
		b := append([]byte(megatronMagic), make([]byte, 8+1+8+8)...)
		le.PutUint64(b[9:], megatronVersion)
		b[17] = code
		le.PutUint64(b[18:], uint64(len(docs)))   // sequences
		le.PutUint64(b[26:], uint64(len(docs)+1)) // document indices: 0, then the end of each
		for _, d := range docs {
			b = le.AppendUint32(b, uint32(len(d)))
		}
		var ptr int64
		for _, d := range docs {
			b = le.AppendUint64(b, uint64(ptr))
			ptr += int64(len(d) * width)
		}
		for i := range len(docs) + 1 {
			b = le.AppendUint64(b, uint64(i))
		}
		_, err := w.Write(b)
		return err
	})
}

// checkIDs refuses ids that a width cannot hold.
func checkIDs(ids []int32, width int, what string) error {
	if width != 2 && width != 4 {
		return fmt.Errorf("tokens: %s ids of %d bytes, expected 2 or 4", what, width)
	}
	for i, v := range ids {
		if v < 0 || width == 2 && v > math.MaxUint16 {
			return fmt.Errorf("tokens: id %d at position %d does not fit %s ids of %d bytes", v, i, what, width)
		}
	}
	return nil
}

func writeIDs(w io.Writer, ids []int32, width int) error {
	bw := bufio.NewWriter(w)
	var b [4]byte
	for _, v := range ids {
		binary.LittleEndian.PutUint32(b[:], uint32(v))
		if _, err := bw.Write(b[:width]); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// writeFile writes path through fill, removing it again if that fails.
func writeFile(path string, fill func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("tokens: %w", err)
	}
	if err := fill(f); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("tokens: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("tokens: writing %s: %w", path, err)
	}
	return nil
}
