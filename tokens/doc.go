// Package tokens reads the token files a model trains on, of any size and
// in the formats other trainers write, as one stream of int32 ids
// (0..2³¹−1; the model's vocabulary is checked by its loader, train.Loader).
//
// # Formats
//
//	text      one token per byte (vocabulary 256), any file
//	uint16    raw little-endian uint16 ids, no header (our .bin)
//	uint32    raw little-endian uint32 ids, no header
//	llmc      llm.c's shard (dev/data/data_common.py): 256 little-endian
//	          int32 of header, [0] the magic, [1] the version, [2] the
//	          number of ids, then the ids: magic 20240520 (version 1)
//	          for uint16 ids, 20240801 (version 7) for uint32 ids
//	megatron  Megatron-LM's indexed dataset (core/datasets/indexed_dataset.py):
//	          PREFIX.bin holds the ids, PREFIX.idx the index: the magic
//	          "MMIDIDX\0\0", version 1 (uint64), the dtype code (uint8:
//	          1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16), the
//	          sequence and document counts (uint64), then the sequence
//	          lengths (int32), the sequence pointers (int64 byte offsets
//	          into the .bin) and the document indices (int64)
//
// Auto detects each file's format, in this order: a path ending in .idx,
// a .bin with a .idx beside it, or a PREFIX that names PREFIX.bin and
// PREFIX.idx is Megatron's; a file that starts with an llm.c magic is an
// llm.c shard; a name ending in .bin or .u16 is raw uint16; one ending in
// .u32 is raw uint32 (raw formats have no header: raw uint32 is known by
// its name or by an explicit format); anything else is text. A format
// given explicitly is used as given: a file without its header or of the
// wrong size is refused.
//
// A stream of several files (Open's list, directory or glob pattern)
// reads them one after another as if they were one file: the first id of
// each follows the last of the one before, and the windows a loader cuts
// may span two files.
//
// # Mapping
//
// On Linux the files are mapped read-only (syscall.Mmap), not read: Open
// costs the same for a file of a kilobyte or of a hundred gigabytes, and
// after each Read the pages it touched are dropped from the process again
// (madvise MADV_DONTNEED; they stay in the page cache that every process
// on the machine shares), so the resident memory of a run does not grow
// with the ids it reads. A file truncated under a running stream makes
// Read return an error, not crash the process. Elsewhere the files are
// read whole into memory.
//
// WriteRaw, WriteLLMC and WriteMegatron write the formats (cmd/train's
// "train tokens" turns a text file into any of them); the package
// tokenstest holds an independent writer of each and the conformance
// suite of the readers.
package tokens
