package tokens

import (
	"fmt"
	"math"
	"strings"
)

// Format is the layout of a token file.
type Format string

// The formats. Auto is not a layout: it asks Open to detect each file's.
const (
	Auto     Format = "auto"
	Text     Format = "text"     // one token per byte (vocabulary 256)
	Uint16   Format = "uint16"   // raw little-endian uint16 ids, no header
	Uint32   Format = "uint32"   // raw little-endian uint32 ids, no header
	LLMC     Format = "llmc"     // llm.c's shard: a header of 256 int32, then uint16 or uint32 ids
	Megatron Format = "megatron" // Megatron-LM's indexed dataset: PREFIX.bin (ids) and PREFIX.idx (index)
)

// Formats lists the values ParseFormat accepts, Auto first.
var Formats = []Format{Auto, Text, Uint16, Uint32, LLMC, Megatron}

// ParseFormat returns the format named s; the empty string is Auto.
func ParseFormat(s string) (Format, error) {
	if s == "" {
		return Auto, nil
	}
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("tokens: unknown data format %q, expected one of %s", s, strings.Join(names, ", "))
}

// MaxID is the largest token id: ids are int32 in the model's inputs.
const MaxID = math.MaxInt32

// The headers that name a format.
const (
	// llm.c's shards (dev/data/data_common.py, write_datafile): 256
	// little-endian int32; [0] the magic, [1] the version, [2] the number
	// of tokens that follow. The magic names the id width.
	llmcHeaderBytes = 256 * 4
	llmcMagic16     = 20240520 // uint16 ids ("gpt-2"), version 1
	llmcVersion16   = 1
	llmcMagic32     = 20240801 // uint32 ids ("llama-3"), version 7
	llmcVersion32   = 7

	// Megatron-LM's index (megatron/core/datasets/indexed_dataset.py,
	// _IndexWriter): the 9-byte magic, version (uint64, 1), dtype code
	// (uint8), sequence count and document count (uint64), then int32
	// sequence lengths, int64 sequence pointers (byte offsets into the
	// .bin), int64 document indices, and for a multimodal dataset one int8
	// mode per sequence.
	megatronMagic      = "MMIDIDX\x00\x00"
	megatronVersion    = 1
	megatronHeaderSize = 9 + 8 + 1 + 8 + 8
)

// encoding is how one id is stored: its width in bytes and whether it is
// a signed integer.
type encoding struct {
	width  int
	signed bool
}

func (e encoding) String() string {
	switch {
	case e.signed:
		return fmt.Sprintf("int%d", 8*e.width)
	default:
		return fmt.Sprintf("uint%d", 8*e.width)
	}
}

var (
	encUint8  = encoding{1, false}
	encUint16 = encoding{2, false}
	encUint32 = encoding{4, false}
)

// megatronDTypes are Megatron's DType codes of integer ids (the enum of
// indexed_dataset.py); 6 and 7 are float64 and float32, which hold no ids.
var megatronDTypes = map[uint8]encoding{
	1: {1, false}, // uint8
	2: {1, true},  // int8
	3: {2, true},  // int16
	4: {4, true},  // int32
	5: {8, true},  // int64
	8: {2, false}, // uint16
}

// MegatronCode is Megatron's DType code of an id width for writing: uint16
// (8) for 2 bytes, int32 (4) for 4, as Megatron's DType.optimal_dtype
// picks (uint16 below a vocabulary of 65 500, else int32).
func MegatronCode(width int) (uint8, error) {
	switch width {
	case 2:
		return 8, nil
	case 4:
		return 4, nil
	}
	return 0, fmt.Errorf("tokens: a Megatron dataset of %d-byte ids, expected 2 (uint16) or 4 (int32)", width)
}
