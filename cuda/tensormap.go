package cuda

/*
#include "atp_cuda.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// TensorMap is a CUtensorMap: the 128-byte descriptor of a tiled tensor
// that TMA instructions (cp.async.bulk.tensor) copy boxes of. A kernel takes
// it by value (a `const __grid_constant__` parameter, 64-byte aligned in the
// kernel's parameter space): pass TensorMap.Arg() to Launch.
type TensorMap [128]byte

// Arg is the map as a kernel argument (its bytes, copied by value).
func (m *TensorMap) Arg() RawArg { return RawArg(m[:]) }

// TensorMapDataType is a CUtensorMapDataType (cuda.h, CUDA 12.0 and later).
type TensorMapDataType int

const (
	TensorMapUint8    TensorMapDataType = 0
	TensorMapUint16   TensorMapDataType = 1
	TensorMapUint32   TensorMapDataType = 2
	TensorMapInt32    TensorMapDataType = 3
	TensorMapUint64   TensorMapDataType = 4
	TensorMapInt64    TensorMapDataType = 5
	TensorMapFloat16  TensorMapDataType = 6
	TensorMapFloat32  TensorMapDataType = 7
	TensorMapFloat64  TensorMapDataType = 8
	TensorMapBFloat16 TensorMapDataType = 9
)

// elemBytes is the size of one element of t.
func (t TensorMapDataType) elemBytes() int {
	switch t {
	case TensorMapUint8:
		return 1
	case TensorMapUint16, TensorMapFloat16, TensorMapBFloat16:
		return 2
	case TensorMapUint32, TensorMapInt32, TensorMapFloat32:
		return 4
	case TensorMapUint64, TensorMapInt64, TensorMapFloat64:
		return 8
	}
	return 0
}

// TensorMapSwizzle is a CUtensorMapSwizzle: how TMA permutes the 16-byte
// chunks of each box row in shared memory.
type TensorMapSwizzle int

const (
	SwizzleNone TensorMapSwizzle = 0
	Swizzle32B  TensorMapSwizzle = 1
	Swizzle64B  TensorMapSwizzle = 2
	Swizzle128B TensorMapSwizzle = 3
)

// bytes is the span of the swizzle pattern (0 for none).
func (s TensorMapSwizzle) bytes() int {
	switch s {
	case Swizzle32B:
		return 32
	case Swizzle64B:
		return 64
	case Swizzle128B:
		return 128
	}
	return 0
}

// TensorMapL2Promotion is a CUtensorMapL2promotion.
type TensorMapL2Promotion int

const (
	L2PromotionNone TensorMapL2Promotion = 0
	L2Promotion64B  TensorMapL2Promotion = 1
	L2Promotion128B TensorMapL2Promotion = 2
	L2Promotion256B TensorMapL2Promotion = 3
)

// TiledTensorMap describes a tiled tensor map (cuTensorMapEncodeTiled).
// Dimensions run from the innermost (contiguous) outwards. Interleave is
// always none and out-of-bounds elements of a box read as zeros
// (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE).
type TiledTensorMap struct {
	DType TensorMapDataType
	Addr  DevicePtr // 16-byte aligned
	Dims  []uint64  // elements per dimension, innermost first (1 to 5 dims)
	// Strides are the byte strides of dimensions 1.. (len(Dims)-1 values),
	// multiples of 16.
	Strides []uint64
	Box     []uint32 // the box copied per instruction, ≤ 256 per dimension
	Swizzle TensorMapSwizzle
	L2      TensorMapL2Promotion
}

// HasTensorMaps reports whether the driver has cuTensorMapEncodeTiled
// (drivers of CUDA 12.0 and later). It loads the driver if needed.
func HasTensorMaps() bool {
	if loadDriver() != nil {
		return false
	}
	return C.atp_has_tensormap() != 0
}

// EncodeTiled encodes p into a TensorMap. The checks the driver makes are
// made first, so that an error names the field, the value found and the
// value expected; the driver's own refusal is reported with the whole
// description.
func EncodeTiled(p TiledTensorMap) (TensorMap, error) {
	var m TensorMap
	if err := loadDriver(); err != nil {
		return m, err
	}
	if C.atp_has_tensormap() == 0 {
		return m, fmt.Errorf("cuda: the driver %s has no cuTensorMapEncodeTiled (it needs a driver of CUDA 12.0 or later; set %s to a newer libcuda.so.1)",
			driver.lib.Path, EnvLibCUDA)
	}
	if err := p.check(); err != nil {
		return m, err
	}
	rank := len(p.Dims)
	es := make([]uint32, rank)
	for i := range es {
		es[i] = 1
	}
	// The driver wants at least one stride slot even at rank 1.
	strides := append([]uint64(nil), p.Strides...)
	if len(strides) == 0 {
		strides = []uint64{0}
	}
	r := Result(C.atp_tensormap_encode_tiled(unsafe.Pointer(&m[0]), C.int(p.DType), C.uint32_t(rank),
		C.CUdeviceptr(p.Addr),
		(*C.uint64_t)(unsafe.Pointer(&p.Dims[0])), (*C.uint64_t)(unsafe.Pointer(&strides[0])),
		(*C.uint32_t)(unsafe.Pointer(&p.Box[0])), (*C.uint32_t)(unsafe.Pointer(&es[0])),
		0, C.int(p.Swizzle), C.int(p.L2), 0))
	if r != Success {
		return m, fail(r, "cuTensorMapEncodeTiled(%+v)", p)
	}
	return m, nil
}

// check is what cuTensorMapEncodeTiled requires of a tiled, non-interleaved
// map (CUDA driver API documentation).
func (p TiledTensorMap) check() error {
	rank := len(p.Dims)
	eb := p.DType.elemBytes()
	switch {
	case eb == 0:
		return fmt.Errorf("cuda: tensor map: data type %d is not one of the supported ones", p.DType)
	case rank < 1 || rank > 5:
		return fmt.Errorf("cuda: tensor map: %d dimensions, expected 1 to 5", rank)
	case len(p.Strides) != rank-1:
		return fmt.Errorf("cuda: tensor map: %d strides for %d dimensions, expected %d", len(p.Strides), rank, rank-1)
	case len(p.Box) != rank:
		return fmt.Errorf("cuda: tensor map: box of %d dimensions for a tensor of %d", len(p.Box), rank)
	case p.Addr%16 != 0:
		return fmt.Errorf("cuda: tensor map: address %#x is not 16-byte aligned", uint64(p.Addr))
	}
	for i, d := range p.Dims {
		if d == 0 || d > 1<<32 {
			return fmt.Errorf("cuda: tensor map: dimension %d is %d, expected 1 to 2^32", i, d)
		}
	}
	for i, s := range p.Strides {
		if s%16 != 0 || s >= 1<<40 {
			return fmt.Errorf("cuda: tensor map: stride %d is %d bytes, expected a multiple of 16 below 2^40", i+1, s)
		}
	}
	for i, b := range p.Box {
		if b == 0 || b > 256 {
			return fmt.Errorf("cuda: tensor map: box dimension %d is %d, expected 1 to 256", i, b)
		}
	}
	if inner := int(p.Box[0]) * eb; inner%16 != 0 {
		return fmt.Errorf("cuda: tensor map: the box's inner dimension is %d bytes, expected a multiple of 16", inner)
	} else if sw := p.Swizzle.bytes(); sw != 0 && inner > sw {
		return fmt.Errorf("cuda: tensor map: the box's inner dimension is %d bytes, more than the %d-byte swizzle span", inner, sw)
	}
	return nil
}
