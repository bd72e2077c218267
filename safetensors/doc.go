// Package safetensors reads and writes the safetensors file format: an
// 8-byte little-endian header length N, N bytes of JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {string: string}}, then the data section, to which the
// offsets are relative. Tensors are little-endian and row-major, and
// together they cover the data section exactly, without overlap or holes.
//
// Write and WriteFile write host tensors (F32, F64, BF16, I32); Read and
// ReadFile parse a whole file, checking the header, every dtype, shape and
// offset, and that the tensors tile the data section, without panicking or
// allocating much more than the file on hostile input (see the fuzz test).
// Entries decode to host tensors (Entry.Tensor) or, whatever their float
// format (F16 included), to float32 values (Entry.Float32s).
//
// The package imports only the tensor package: checkpoints (train), weight
// files of a sharded model (parallel/shard) and transformers model
// directories (hf) are built on it.
package safetensors
