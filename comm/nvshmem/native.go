package nvshmem

/*
#include "atp_loader.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// The Go side of the library's entry points. Each takes a fresh error
// buffer; the library writes what failed into it. The trampolines may only
// be called once Load has installed a library.

type errbuf [C.ATP_NV_ERRLEN]C.char

func (b *errbuf) c() *C.char { return &b[0] }

func (b *errbuf) err() error { return errors.New(C.GoString(&b[0])) }

func check(rc C.int, b *errbuf) error {
	if rc != 0 {
		return b.err()
	}
	return nil
}

func cDeviceCount() (int, error) {
	var b errbuf
	var n C.int
	err := check(C.atpg_device_count(&n, b.c()), &b)
	return int(n), err
}

func cDeviceInfo(dev int) (name, pci string, err error) {
	var b errbuf
	var nb [256]C.char
	var pb [64]C.char
	if err := check(C.atpg_device_info(C.int(dev), &nb[0], C.int(len(nb)), &pb[0], C.int(len(pb)), b.c()), &b); err != nil {
		return "", "", err
	}
	return C.GoString(&nb[0]), C.GoString(&pb[0]), nil
}

func cStreamCreate(dev int) (uint64, error) {
	var b errbuf
	var s C.uint64_t
	err := check(C.atpg_stream_create(C.int(dev), &s, b.c()), &b)
	return uint64(s), err
}

func cStreamDestroy(dev int, s uint64) error {
	var b errbuf
	return check(C.atpg_stream_destroy(C.int(dev), C.uint64_t(s), b.c()), &b)
}

func cStreamSync(dev int, s uint64) error {
	var b errbuf
	return check(C.atpg_stream_sync(C.int(dev), C.uint64_t(s), b.c()), &b)
}

func cEventCreate(dev int) (uint64, error) {
	var b errbuf
	var e C.uint64_t
	err := check(C.atpg_event_create(C.int(dev), &e, b.c()), &b)
	return uint64(e), err
}

func cEventDestroy(dev int, e uint64) error {
	var b errbuf
	return check(C.atpg_event_destroy(C.int(dev), C.uint64_t(e), b.c()), &b)
}

func cEventRecord(dev int, e, s uint64) error {
	var b errbuf
	return check(C.atpg_event_record(C.int(dev), C.uint64_t(e), C.uint64_t(s), b.c()), &b)
}

// cEventQuery reports whether the work recorded by e has completed.
func cEventQuery(dev int, e uint64) (bool, error) {
	var b errbuf
	switch C.atpg_event_query(C.int(dev), C.uint64_t(e), b.c()) {
	case 0:
		return true, nil
	case 1:
		return false, nil
	}
	return false, b.err()
}

func cStreamWaitEvent(dev int, s, e uint64) error {
	var b errbuf
	return check(C.atpg_stream_wait_event(C.int(dev), C.uint64_t(s), C.uint64_t(e), b.c()), &b)
}

func cMemcpyAsync(dev int, dst, src uint64, bytes int64, s uint64) error {
	var b errbuf
	return check(C.atpg_memcpy_async(C.int(dev), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(bytes), C.uint64_t(s), b.c()), &b)
}

func cMemsetAsync(dev int, dst uint64, v byte, bytes int64, s uint64) error {
	var b errbuf
	return check(C.atpg_memset_async(C.int(dev), C.uint64_t(dst), C.int(v), C.uint64_t(bytes), C.uint64_t(s), b.c()), &b)
}

func cDevAlloc(dev int, bytes int64) (uint64, error) {
	var b errbuf
	var p C.uint64_t
	err := check(C.atpg_dev_alloc(C.int(dev), C.uint64_t(bytes), &p, b.c()), &b)
	return uint64(p), err
}

func cDevFree(dev int, p uint64) error {
	var b errbuf
	return check(C.atpg_dev_free(C.int(dev), C.uint64_t(p), b.c()), &b)
}

// cHtoD copies bytes from host memory at src (Go memory without pointers)
// to the device, synchronously.
func cHtoD(dev int, dst uint64, src unsafe.Pointer, bytes int64) error {
	var b errbuf
	return check(C.atpg_htod(C.int(dev), C.uint64_t(dst), src, C.uint64_t(bytes), b.c()), &b)
}

// cDtoH copies bytes from the device to host memory at dst, synchronously.
func cDtoH(dev int, dst unsafe.Pointer, src uint64, bytes int64) error {
	var b errbuf
	return check(C.atpg_dtoh(C.int(dev), dst, C.uint64_t(src), C.uint64_t(bytes), b.c()), &b)
}

func cHostAlloc(dev int, bytes int64) (host, devp uint64, err error) {
	var b errbuf
	var h, d C.uint64_t
	err = check(C.atpg_host_alloc(C.int(dev), C.uint64_t(bytes), &h, &d, b.c()), &b)
	return uint64(h), uint64(d), err
}

func cHostFree(dev int, host uint64) error {
	var b errbuf
	return check(C.atpg_host_free(C.int(dev), C.uint64_t(host), b.c()), &b)
}

func cUniqueID(dev, n int) ([]byte, error) {
	var b errbuf
	id := make([]byte, n)
	if err := check(C.atpg_get_uniqueid(C.int(dev), unsafe.Pointer(&id[0]), C.int(n), b.c()), &b); err != nil {
		return nil, err
	}
	return id, nil
}

// cInit initialises NVSHMEM and returns nvshmemx_init_status().
func cInit(dev, rank, size int, uid []byte) (int, error) {
	var b errbuf
	var status C.int
	err := check(C.atpg_init(C.int(dev), C.int(rank), C.int(size), unsafe.Pointer(&uid[0]), C.int(len(uid)), &status, b.c()), &b)
	return int(status), err
}

func cFinalize() error {
	var b errbuf
	return check(C.atpg_finalize(b.c()), &b)
}

func cCalloc(bytes int64) (uint64, error) {
	var b errbuf
	var p C.uint64_t
	err := check(C.atpg_calloc(C.uint64_t(bytes), &p, b.c()), &b)
	return uint64(p), err
}

func cFree(p uint64) error {
	var b errbuf
	return check(C.atpg_free(C.uint64_t(p), b.c()), &b)
}

// cPtr is nvshmem_ptr: the address of pe's copy of the symmetric p for
// loads and stores from this PE, or 0.
func cPtr(p uint64, pe int) uint64 { return uint64(C.atpg_ptr(C.uint64_t(p), C.int(pe))) }

func cTeamWorld() int { return int(C.atpg_team_world()) }

func cTeamSplit(parent, start, stride, size int) (int, error) {
	var b errbuf
	var t C.int
	err := check(C.atpg_team_split_strided(C.int(parent), C.int(start), C.int(stride), C.int(size), &t, b.c()), &b)
	return int(t), err
}

func cTeamDestroy(team int) error {
	var b errbuf
	return check(C.atpg_team_destroy(C.int(team), b.c()), &b)
}

// CUModuleInit runs nvshmemx_cumodule_init on a CUDA module loaded with the
// driver API (a CUmodule, e.g. cuda.Module.Handle()), so that its kernels
// can call NVSHMEM device functions: for the fused kernels' image. NVSHMEM
// must be initialised (New).
func CUModuleInit(module uintptr) error {
	if !installed.Load() {
		return errors.New("nvshmem: CUModuleInit: the library is not loaded (call New first)")
	}
	var b errbuf
	return check(C.atpg_cumodule_init(C.uint64_t(module), b.c()), &b)
}

// errRecord is what a kernel that gave up wrote (atp_nv_errrec).
type errRecord struct {
	code, peer, op, block int
	waitedNs              uint64
}

func cReadRecord(host uint64, idx int) errRecord {
	var r C.atp_nv_errrec
	C.atpg_read_rec(C.uint64_t(host), C.int(idx), &r)
	return errRecord{code: int(r.code), peer: int(r.peer), op: int(r.op), block: int(r.block), waitedNs: uint64(r.waited_ns)}
}

func cClearRecord(host uint64, idx int) { C.atpg_clear_rec(C.uint64_t(host), C.int(idx)) }

// Kernel failure codes (atp_nvshmem.h).
const (
	errDataTimeout    = C.ATP_NV_ERR_DATA_TIMEOUT
	errAckTimeout     = C.ATP_NV_ERR_ACK_TIMEOUT
	errBarrierTimeout = C.ATP_NV_ERR_BARRIER_TIMEOUT
	errNoP2P          = C.ATP_NV_ERR_NO_P2P
)

// recordBytes is sizeof(atp_nv_errrec).
const recordBytes = int64(unsafe.Sizeof(C.atp_nv_errrec{}))

// ---- the team path ----------------------------------------------------------

func cTeamAllGather(team, npes int, dst, src uint64, bytes int64, direct bool, scratch uint64, scratchBytes int64, st uint64) error {
	var b errbuf
	return check(C.atpg_allgather(C.int(team), C.int(npes), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(bytes), cbool(direct),
		C.uint64_t(scratch), C.uint64_t(scratchBytes), C.uint64_t(st), b.c()), &b)
}

func cTeamReduceScatter(team, npes int, dst, src uint64, n int64, dt, op int, direct bool, scratch uint64, scratchBytes int64, st uint64) error {
	var b errbuf
	return check(C.atpg_reducescatter(C.int(team), C.int(npes), C.uint64_t(dst), C.uint64_t(src), C.uint64_t(n), C.int(dt), C.int(op),
		cbool(direct), C.uint64_t(scratch), C.uint64_t(scratchBytes), C.uint64_t(st), b.c()), &b)
}

func cTeamAllReduce(team, npes int, buf uint64, n int64, dt, op int, scratch uint64, scratchBytes int64, st uint64) error {
	var b errbuf
	return check(C.atpg_allreduce(C.int(team), C.int(npes), C.uint64_t(buf), C.uint64_t(n), C.int(dt), C.int(op),
		C.uint64_t(scratch), C.uint64_t(scratchBytes), C.uint64_t(st), b.c()), &b)
}

func cTeamBroadcast(team, me, root int, buf uint64, bytes int64, scratch uint64, scratchBytes int64, st uint64) error {
	var b errbuf
	return check(C.atpg_broadcast(C.int(team), C.int(me), C.int(root), C.uint64_t(buf), C.uint64_t(bytes),
		C.uint64_t(scratch), C.uint64_t(scratchBytes), C.uint64_t(st), b.c()), &b)
}

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

// ---- the P2P path -------------------------------------------------------------

// cExchange launches the exchange kernel of plan x on the group's stream st:
// src and dst are device addresses; dt and op matter in modeReduce.
func (c *Comm) cExchange(x xplan, src, dst uint64, dt, op int, seq, st uint64) error {
	var p C.atp_nv_xparams
	stage, _ := c.staging()
	base := c.slotBase()
	l := c.w.layout
	p.npes = C.int32_t(c.size)
	p.me = C.int32_t(c.rank)
	p.mode = C.int32_t(x.mode)
	p.dtype = C.int32_t(dt)
	p.redop = C.int32_t(op)
	p.nsend = C.int32_t(c.geom.nsend)
	p.nrecv = C.int32_t(c.geom.nrecv)
	p.depth = C.int32_t(c.geom.depth)
	p.cap = C.int64_t(c.geom.cap)
	p.stage = C.uint64_t(stage)
	p.flags = C.uint64_t(base + uint64(l.flags))
	p.acks = C.uint64_t(base + uint64(l.acks))
	p.send_rounds = C.uint64_t(c.counters + sendRoundsOff)
	p.recv_rounds = C.uint64_t(c.counters + recvRoundsOff)
	p.errdev = C.uint64_t(c.counters + errWordOff)
	p.errhost = C.uint64_t(c.w.recsD + uint64(int64(c.slot)*recordBytes))
	p.src = C.uint64_t(src)
	p.dst = C.uint64_t(dst)
	p.self_src_off = C.int64_t(x.selfSrcOff)
	p.self_dst_off = C.int64_t(x.selfDstOff)
	p.self_bytes = C.int64_t(x.selfBytes)
	p.timeout_ns = C.int64_t(c.w.opts.timeout.Nanoseconds())
	p.op_id = C.int32_t(int32(seq))
	for i := range c.size {
		p.pe[i] = C.int32_t(c.members[i])
		p.send_off[i] = C.int64_t(x.sendOff[i])
		p.send_bytes[i] = C.int64_t(x.sendBytes[i])
		p.recv_off[i] = C.int64_t(x.recvOff[i])
		p.recv_bytes[i] = C.int64_t(x.recvBytes[i])
	}
	var b errbuf
	return check(C.atpg_exchange(&p, C.uint64_t(st), b.c()), &b)
}

// cBarrier launches the barrier kernel of generation gen on st.
func (c *Comm) cBarrier(gen, seq, st uint64) error {
	var p C.atp_nv_bparams
	p.npes = C.int32_t(c.size)
	p.me = C.int32_t(c.rank)
	p.op_id = C.int32_t(int32(seq))
	p.bar = C.uint64_t(c.slotBase() + uint64(c.w.layout.bar))
	p.errdev = C.uint64_t(c.counters + errWordOff)
	p.errhost = C.uint64_t(c.w.recsD + uint64(int64(c.slot)*recordBytes))
	p.gen = C.uint64_t(gen)
	p.timeout_ns = C.int64_t(c.w.opts.timeout.Nanoseconds())
	for i := range c.size {
		p.pe[i] = C.int32_t(c.members[i])
	}
	var b errbuf
	return check(C.atpg_barrier(&p, C.uint64_t(st), b.c()), &b)
}

// ---- smoke test -------------------------------------------------------------------

func cSmokePut(buf, src, sig uint64, nints, value, pe int, sigval, st uint64) error {
	var b errbuf
	return check(C.atpg_smoke_put(C.uint64_t(buf), C.uint64_t(src), C.uint64_t(sig), C.int(nints), C.int(value), C.int(pe),
		C.uint64_t(sigval), C.uint64_t(st), b.c()), &b)
}

func cSmokeWait(buf, sig uint64, nints, value int, sigval, bad, st uint64) error {
	var b errbuf
	return check(C.atpg_smoke_wait(C.uint64_t(buf), C.uint64_t(sig), C.int(nints), C.int(value), C.uint64_t(sigval),
		C.uint64_t(bad), C.uint64_t(st), b.c()), &b)
}
