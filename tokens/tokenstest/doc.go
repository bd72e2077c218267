// Package tokenstest is the conformance suite of the token-file readers of
// package tokens (the gonum testblas pattern), and the independent writers
// it is built on.
//
// The writers (Raw, LLMC, Megatron) build each format byte by byte from
// its definition, llm.c's dev/data/data_common.py and Megatron-LM's
// core/datasets/indexed_dataset.py, sharing no code with the readers; they
// take int64 ids so that a test can write ids a reader must refuse.
// Programs' tests use them to write data files (cmd/train's two-step run
// on every format).
//
// Run reads every format back and compares it with the ids written: whole,
// and in windows at random positions that cross the files of a stream;
// detected and named explicitly; ids past 65 535 and up to 2³¹−1; a
// Megatron int32 dataset of a 70 000-id vocabulary; the order of lists,
// directories and patterns. It checks that bad files (missing, empty,
// truncated, a wrong magic, version or dtype, an index that does not match
// its data) are refused at open and bad ids (negative, above 2³¹−1) at the
// read that meets them, each with an error that names the file and what is
// wrong.
package tokenstest
