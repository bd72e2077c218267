package nccl

/*
#include "atp_nccl.h"
*/
import "C"

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// ncclDataType_t values (nccl.h 2.28.3; unchanged since bf16 arrived in 2.10).
const (
	ncclInt32    = 2
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBfloat16 = 9
)

// dataType maps a tensor dtype to NCCL's.
func dataType(dt tensor.DType) (int, error) {
	switch dt {
	case tensor.Float32:
		return ncclFloat32, nil
	case tensor.BFloat16:
		return ncclBfloat16, nil
	case tensor.Int32:
		return ncclInt32, nil
	case tensor.Float64:
		return ncclFloat64, nil
	}
	return 0, fmt.Errorf("dtype %v: expected f32, bf16, i32 or f64", dt)
}

// ncclRedOp_t values (nccl.h 2.28.3; ncclAvg since 2.10).
const (
	ncclSum = 0
	ncclMax = 2
	ncclAvg = 4
)

// redOp maps a reduction to NCCL's.
func redOp(op comm.ReduceOp) (int, error) {
	switch op {
	case comm.Sum:
		return ncclSum, nil
	case comm.Max:
		return ncclMax, nil
	case comm.Avg:
		return ncclAvg, nil
	}
	return 0, fmt.Errorf("reduction %v: expected sum, avg or max", op)
}

// ncclSplitNoColor is NCCL_SPLIT_NOCOLOR (nccl.h 2.28.3), comm.NoColor's
// counterpart.
const ncclSplitNoColor = -1

// uniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const uniqueIDBytes = C.ATP_NCCL_UNIQUE_ID_BYTES

// configFields names the fields of ncclConfig_t (2.28) after size, in order.
var configFields = []string{
	"magic", "version", "blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "netName",
	"splitShare", "trafficClass", "commName", "collnetEnable", "CTAPolicy", "shrinkShare",
	"nvlsCTAs", "nChannelsPerNetPeer", "nvlinkCentricSched",
}

// configLayout returns the size of the C config struct and the offset of
// each field of configFields, as the C compiler laid them out.
func configLayout() (size uintptr, offsets map[string]uintptr) {
	var out [17]C.size_t
	C.atp_nccl_config_layout(&out[0])
	offsets = make(map[string]uintptr, len(configFields))
	for i, f := range configFields {
		offsets[f] = uintptr(out[i+1])
	}
	return uintptr(out[0]), offsets
}

// configValue is a config as the C side fills it, for the tests.
type configValue struct {
	Size           uint64
	Magic, Version uint32
	Ints           map[string]int32
	NilPointers    bool // netName and commName are NULL
}

// defaultConfig returns the config the package passes to NCCL with the
// given blocking mode.
func defaultConfig(blocking int) configValue {
	var c C.atp_ncclConfig
	C.atp_nccl_config_init(&c, C.int(blocking))
	return configValue{
		Size: uint64(c.size), Magic: uint32(c.magic), Version: uint32(c.version),
		Ints: map[string]int32{
			"blocking": int32(c.blocking), "cgaClusterSize": int32(c.cgaClusterSize),
			"minCTAs": int32(c.minCTAs), "maxCTAs": int32(c.maxCTAs), "splitShare": int32(c.splitShare),
			"trafficClass": int32(c.trafficClass), "collnetEnable": int32(c.collnetEnable),
			"CTAPolicy": int32(c.CTAPolicy), "shrinkShare": int32(c.shrinkShare), "nvlsCTAs": int32(c.nvlsCTAs),
			"nChannelsPerNetPeer": int32(c.nChannelsPerNetPeer), "nvlinkCentricSched": int32(c.nvlinkCentricSched),
		},
		NilPointers: c.netName == nil && c.commName == nil,
	}
}

// busFactor is the ratio of bus bandwidth to algorithm bandwidth of an op on
// n ranks, as nccl-tests defines it: 2(n-1)/n for all-reduce, (n-1)/n for
// all-gather, reduce-scatter and all-to-all (whose size is that of the
// larger buffer), 1 for broadcast.
func busFactor(op string, n int) float64 {
	switch op {
	case comm.OpAllReduce:
		return 2 * float64(n-1) / float64(n)
	case comm.OpAllGather, comm.OpReduceScatter, comm.OpAllToAllV:
		return float64(n-1) / float64(n)
	}
	return 1
}
