// Package tensor defines tensors (shape, dtype, device, storage) and the
// Backend interface: the set of ops, forward and backward, that the layers of
// asynctp are written against.
//
// A Tensor is a contiguous row-major view of a typed Buffer. Host buffers keep
// their elements in plain Go slices (F32, F64, I32, BF16 accessors); device
// buffers belong to their backend. The CPU backend (package tensor/cpu) is
// the numerical reference; GPU backends must match it within stated
// tolerances (fp32: relative 1e-5, bf16: 1e-2, by relative norm).
//
// Backend ops report errors the way GPU runtimes do: the first failing op
// records a sticky error and later ops do nothing, so a layer issues its ops
// and checks Err once, instead of checking after every line. After a
// mistake the program can recover from (a wrong shape given to Upload),
// ClearErr makes the backend usable again; after a failure of the device
// it says so, and a new backend is needed.
package tensor
