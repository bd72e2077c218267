package cuda

/*
#include "atp_cuda.h"
*/
import "C"

import "fmt"

// fail builds the error of a failed call; call it only when r != Success,
// so that the formatting costs nothing on the fast path.
func fail(r Result, format string, args ...any) error {
	return newError(fmt.Sprintf(format, args...), r)
}

// DriverVersion returns the CUDA version the driver supports, as
// 1000*major + 10*minor (13000 for CUDA 13.0). It loads the driver library
// but needs no GPU.
func DriverVersion() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var v C.int
	if r := Result(C.atp_cuDriverGetVersion(&v)); r != Success {
		return 0, fail(r, "cuDriverGetVersion")
	}
	return int(v), nil
}

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var n C.int
	if r := Result(C.atp_cuDeviceGetCount(&n)); r != Success {
		return 0, fail(r, "cuDeviceGetCount")
	}
	return int(n), nil
}

// Device is a CUDA device (cuDeviceGet).
type Device struct {
	ordinal int
	h       C.CUdevice
}

// GetDevice returns the device of the given ordinal (0-based).
func GetDevice(ordinal int) (Device, error) {
	if err := Init(); err != nil {
		return Device{}, err
	}
	var h C.CUdevice
	if r := Result(C.atp_cuDeviceGet(&h, C.int(ordinal))); r != Success {
		return Device{}, fail(r, "cuDeviceGet(%d)", ordinal)
	}
	return Device{ordinal: ordinal, h: h}, nil
}

// Ordinal is the device's index.
func (d Device) Ordinal() int { return d.ordinal }

// String is "cuda:<ordinal>", the project's spelling of a GPU device.
func (d Device) String() string { return fmt.Sprintf("cuda:%d", d.ordinal) }

// Name is the device's product name, e.g. "NVIDIA H200".
func (d Device) Name() (string, error) {
	var buf [256]C.char
	if r := Result(C.atp_cuDeviceGetName(&buf[0], C.int(len(buf)), d.h)); r != Success {
		return "", fail(r, "cuDeviceGetName(%v)", d)
	}
	return C.GoString(&buf[0]), nil
}

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int

// A few CUdevice_attribute values (cuda.h).
const (
	AttrMaxThreadsPerBlock           DeviceAttribute = 1
	AttrClockRateKHz                 DeviceAttribute = 13
	AttrMultiprocessorCount          DeviceAttribute = 16
	AttrPCIBusID                     DeviceAttribute = 33
	AttrMemoryClockRateKHz           DeviceAttribute = 36
	AttrGlobalMemoryBusWidth         DeviceAttribute = 37
	AttrL2CacheSize                  DeviceAttribute = 38
	AttrComputeCapabilityMajor       DeviceAttribute = 75
	AttrComputeCapabilityMinor       DeviceAttribute = 76
	AttrMaxSharedMemoryPerSM         DeviceAttribute = 81
	AttrMaxSharedMemoryPerBlockOptin DeviceAttribute = 97
	AttrCanUse64BitStreamMemOps      DeviceAttribute = 93
)

// Attribute reads one device attribute (cuDeviceGetAttribute).
func (d Device) Attribute(a DeviceAttribute) (int, error) {
	var v C.int
	if r := Result(C.atp_cuDeviceGetAttribute(&v, C.int(a), d.h)); r != Success {
		return 0, fail(r, "cuDeviceGetAttribute(%d) on %v", int(a), d)
	}
	return int(v), nil
}

// ComputeCapability returns the SM version, e.g. 9, 0 for an H100/H200.
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = d.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// SMCount is the number of streaming multiprocessors.
func (d Device) SMCount() (int, error) { return d.Attribute(AttrMultiprocessorCount) }

// TotalMem is the device's memory in bytes.
func (d Device) TotalMem() (int64, error) {
	var n C.size_t
	if r := Result(C.atp_cuDeviceTotalMem(&n, d.h)); r != Success {
		return 0, fail(r, "cuDeviceTotalMem(%v)", d)
	}
	return int64(n), nil
}

// ContextSMCount returns the number of SMs the current context may use
// (cuCtxGetExecAffinity's SM count): under MPS with
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the client's share as the driver
// grants it (its granularity is the driver's, not the percentage's
// arithmetic); otherwise the device's SMs. A driver without the call
// (before CUDA 11.4) gives an error for ErrNotFound.
func ContextSMCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var n C.unsigned
	if r := Result(C.atp_ctx_sm_count(&n)); r != Success {
		return 0, fail(r, "cuCtxGetExecAffinity(CU_EXEC_AFFINITY_TYPE_SM_COUNT) on %s", currentDeviceName())
	}
	return int(n), nil
}

// CurrentDevice returns the device of the context current on the calling
// OS thread.
func CurrentDevice() (Device, error) {
	if err := Init(); err != nil {
		return Device{}, err
	}
	var h C.CUdevice
	if r := Result(C.atp_cuCtxGetDevice(&h)); r != Success {
		return Device{}, fail(r, "cuCtxGetDevice")
	}
	// CUdevice handles are the ordinals.
	return Device{ordinal: int(h), h: h}, nil
}

// currentDeviceName names the current device for an error message, or says
// that there is none.
func currentDeviceName() string {
	var h C.CUdevice
	if Result(C.atp_cuCtxGetDevice(&h)) != Success {
		return "no current context"
	}
	return fmt.Sprintf("cuda:%d", int(h))
}

// MemInfo returns the free and total memory of the current context's
// device, in bytes (cuMemGetInfo).
func MemInfo() (free, total int64, err error) {
	if err := Init(); err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	if r := Result(C.atp_cuMemGetInfo(&f, &t)); r != Success {
		return 0, 0, fail(r, "cuMemGetInfo on %s", currentDeviceName())
	}
	return int64(f), int64(t), nil
}
