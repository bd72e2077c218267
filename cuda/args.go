package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Kernel arguments.
//
// cuLaunchKernel takes an array of pointers, one per kernel parameter,
// each pointing at the parameter's value; the driver copies
// sizeof(parameter) bytes from each (it knows the sizes from the kernel's
// metadata). Launch packs the Go values into one byte blob, each at an
// offset aligned to its size, and atp_launch (C) copies the blob into C
// memory and builds the pointer array there, so no Go pointer is ever held
// by C beyond the call and the values are alive for its whole duration.

// RawArg passes arbitrary bytes as one kernel argument, e.g. a struct
// passed by value. The bytes must match the kernel parameter's layout
// exactly; they are placed at a 16-byte aligned offset.
type RawArg []byte

// argPack is the packed arguments: blob holds the values, offs[i] is where
// argument i starts.
type argPack struct {
	blob []byte
	offs []uint32
}

// maxArgBytes is the kernel parameter limit of CUDA before 12.1 (4 KiB);
// newer drivers allow 32 KiB on Volta and later, but the kernels of this
// project stay far below either.
const maxArgBytes = 32764

// packArgs lays out args; the supported types are DevicePtr, int32, uint32,
// int64, uint64, float32, float64 and RawArg. Go's int and uint are refused:
// their C counterparts have a different size, so say int32 or int64.
func packArgs(args []any) (argPack, error) {
	p := argPack{blob: make([]byte, 0, 8*len(args)+16), offs: make([]uint32, 0, len(args))}
	// at pads the blob to align and records where the next argument starts.
	at := func(align int) {
		for len(p.blob)%align != 0 {
			p.blob = append(p.blob, 0)
		}
		p.offs = append(p.offs, uint32(len(p.blob)))
	}
	le := binary.LittleEndian // every platform CUDA runs on
	for i, a := range args {
		switch v := a.(type) {
		case DevicePtr:
			at(8)
			p.blob = le.AppendUint64(p.blob, uint64(v))
		case int32:
			at(4)
			p.blob = le.AppendUint32(p.blob, uint32(v))
		case uint32:
			at(4)
			p.blob = le.AppendUint32(p.blob, v)
		case int64:
			at(8)
			p.blob = le.AppendUint64(p.blob, uint64(v))
		case uint64:
			at(8)
			p.blob = le.AppendUint64(p.blob, v)
		case float32:
			at(4)
			p.blob = le.AppendUint32(p.blob, math.Float32bits(v))
		case float64:
			at(8)
			p.blob = le.AppendUint64(p.blob, math.Float64bits(v))
		case RawArg:
			if len(v) == 0 {
				return argPack{}, fmt.Errorf("cuda: kernel argument %d: empty RawArg", i)
			}
			at(16)
			p.blob = append(p.blob, v...)
		case int, uint:
			return argPack{}, fmt.Errorf("cuda: kernel argument %d is a Go %T (%v): use int32 or int64 (uint32 or uint64) to say which C type the kernel takes", i, a, a)
		default:
			return argPack{}, fmt.Errorf("cuda: kernel argument %d has unsupported type %T (want DevicePtr, int32, uint32, int64, uint64, float32, float64 or RawArg)", i, a)
		}
	}
	if len(p.blob) > maxArgBytes {
		return argPack{}, fmt.Errorf("cuda: kernel arguments take %d bytes, more than the %d CUDA allows", len(p.blob), maxArgBytes)
	}
	return p, nil
}
