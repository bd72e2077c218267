package cuda

/*
#include <stdlib.h>
#include "atp_cuda.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// Module is a loaded image of kernels (cuModuleLoadDataEx) in the current
// context.
type Module struct {
	h    C.CUmodule
	name string
}

// jitLogLen is the size of the buffer the PTX JIT writes its errors to.
const jitLogLen = 8192

// LoadModule loads an image from memory: a cubin, a fatbin, or PTX text
// (which the driver JIT-compiles for the current GPU). name only labels the
// module in errors.
func LoadModule(name string, image []byte) (*Module, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: loading module %s: empty image", name)
	}
	var h C.CUmodule
	logBuf := (*C.char)(C.malloc(jitLogLen))
	defer C.free(unsafe.Pointer(logBuf))
	r := Result(C.atp_module_load(&h, unsafe.Pointer(&image[0]), C.size_t(len(image)), logBuf, jitLogLen))
	if r != Success {
		e := &Error{Op: fmt.Sprintf("loading module %s (%d bytes) on %s", name, len(image), currentDeviceName()), Result: r}
		if log := strings.TrimSpace(C.GoString(logBuf)); log != "" {
			e.Hint = "JIT log: " + log
		} else if r == ErrNoBinaryForGPU {
			e.Hint = "the image has no code for this GPU's architecture and no PTX to JIT-compile"
		}
		return nil, e
	}
	return &Module{h: h, name: name}, nil
}

// LoadModuleFile reads a cubin, fatbin or PTX file and loads it.
func LoadModuleFile(path string) (*Module, error) {
	image, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cuda: loading module: %w", err)
	}
	return LoadModule(path, image)
}

// Name is the label given when loading.
func (m *Module) Name() string { return m.name }

// Handle is the CUmodule (e.g. for nvshmemx_cumodule_init).
func (m *Module) Handle() uintptr { return uintptr(m.h) }

// Function looks up a kernel by its (extern "C", so unmangled) name.
func (m *Module) Function(name string) (*Function, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var f C.CUfunction
	if r := Result(C.atp_cuModuleGetFunction(&f, m.h, cn)); r != Success {
		e := &Error{Op: fmt.Sprintf("kernel %q in module %s", name, m.name), Result: r}
		if r == ErrNotFound {
			e.Hint = "no such kernel in the image; is it declared extern \"C\" __global__?"
		}
		return nil, e
	}
	return &Function{h: f, name: name, module: m.name}, nil
}

// Global returns the address and size of a __device__ or __constant__
// variable of the module (cuModuleGetGlobal_v2).
func (m *Module) Global(name string) (DevicePtr, int, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var p C.CUdeviceptr
	var n C.size_t
	if r := Result(C.atp_cuModuleGetGlobal(&p, &n, m.h, cn)); r != Success {
		return 0, 0, fail(r, "global %q in module %s", name, m.name)
	}
	return DevicePtr(p), int(n), nil
}

// Unload unloads the module; its Functions become invalid.
func (m *Module) Unload() error {
	if m == nil || m.h == 0 {
		return nil
	}
	if r := Result(C.atp_cuModuleUnload(m.h)); r != Success {
		return fail(r, "cuModuleUnload(%s)", m.name)
	}
	m.h = 0
	return nil
}

// Function is a kernel of a loaded module.
type Function struct {
	h      C.CUfunction
	name   string
	module string
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

// Handle is the CUfunction.
func (f *Function) Handle() uintptr { return uintptr(f.h) }

// FuncAttribute is a CUfunction_attribute (cuda.h).
type FuncAttribute int

const (
	FuncMaxThreadsPerBlock      FuncAttribute = 0
	FuncSharedSizeBytes         FuncAttribute = 1 // static shared memory
	FuncConstSizeBytes          FuncAttribute = 2
	FuncLocalSizeBytes          FuncAttribute = 3 // per-thread local memory (spills)
	FuncNumRegs                 FuncAttribute = 4
	FuncPTXVersion              FuncAttribute = 5
	FuncBinaryVersion           FuncAttribute = 6
	FuncMaxDynamicSharedSize    FuncAttribute = 8
	FuncPreferredSharedCarveout FuncAttribute = 9
)

// Attribute reads a function attribute (cuFuncGetAttribute).
func (f *Function) Attribute(a FuncAttribute) (int, error) {
	var v C.int
	if r := Result(C.atp_cuFuncGetAttribute(&v, C.int(a), f.h)); r != Success {
		return 0, fail(r, "cuFuncGetAttribute(%s, %d)", f.name, int(a))
	}
	return int(v), nil
}

// SetAttribute sets a function attribute (cuFuncSetAttribute).
func (f *Function) SetAttribute(a FuncAttribute, v int) error {
	if r := Result(C.atp_cuFuncSetAttribute(f.h, C.int(a), C.int(v))); r != Success {
		return fail(r, "cuFuncSetAttribute(%s, %d, %d)", f.name, int(a), v)
	}
	return nil
}

// SetMaxDynamicSharedMemory allows launches of f with up to bytes of dynamic
// shared memory (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Launches
// asking for more than 48 KiB fail without it; the device's limit is
// AttrMaxSharedMemoryPerBlockOptin minus the kernel's static shared memory.
func (f *Function) SetMaxDynamicSharedMemory(bytes int) error {
	return f.SetAttribute(FuncMaxDynamicSharedSize, bytes)
}

// Launch queues kernel f on stream s (nil: the legacy default stream) with
// the given grid and block sizes (x, y, z; zeros are an error) and dynamic
// shared memory in bytes. args are the kernel's parameters in order, each a
// DevicePtr (any pointer parameter), int32, uint32, int64, uint64, float32,
// float64, or RawArg (a struct passed by value); Go's int and uint are
// refused because their C size is ambiguous. The values are copied, so they
// may change as soon as Launch returns.
func Launch(f *Function, grid, block [3]uint32, sharedMem uint32, s *Stream, args ...any) error {
	p, err := packArgs(args)
	if err != nil {
		return fmt.Errorf("cuda: launching %s: %w", f.name, err)
	}
	for i := 0; i < 3; i++ {
		if grid[i] == 0 || block[i] == 0 {
			return fmt.Errorf("cuda: launching %s: grid %v and block %v must be positive in x, y and z", f.name, grid, block)
		}
	}
	var blob unsafe.Pointer
	var offs *C.uint32_t
	if len(p.blob) > 0 {
		blob = unsafe.Pointer(&p.blob[0])
		offs = (*C.uint32_t)(unsafe.Pointer(&p.offs[0]))
	}
	r := Result(C.atp_launch(f.h,
		C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block[0]), C.uint(block[1]), C.uint(block[2]),
		C.uint(sharedMem), s.handle(), blob, C.size_t(len(p.blob)), offs, C.int(len(p.offs))))
	if r != Success {
		return fail(r, "cuLaunchKernel(%s, grid %v, block %v, shared %d, %d args) on %s",
			f.name, grid, block, sharedMem, len(args), currentDeviceName())
	}
	return nil
}
