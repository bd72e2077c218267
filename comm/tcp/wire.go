package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The wire. Every pair of ranks shares one TCP connection that carries
// frames both ways: a 4-byte big-endian body length, then the body, whose
// first byte is the kind:
//
//	hello:       kind | prefix (str) | rank (u32) | size (u32)
//	data:        kind | group (str) | seq (u64) | header | payload (the rest)
//	abort:       kind | causes (u8) | message (str32)
//	close group: kind | group (str)
//	bye:         kind
//	ping:        kind (a heartbeat: the link and the peer are alive)
//
//	header:      flags (u8) | sig (str) | count (u16) | count × i64 | label (str)
//	str:         length (u16) | bytes;   str32: length (u32) | bytes
//
// The dialling rank (the higher one) sends hello first; the listening rank
// answers with its own. Tensor elements travel little-endian.
const (
	kindHello byte = iota + 1
	kindData
	kindAbort
	kindCloseGroup
	kindBye
	kindPing
)

// maxFrame bounds a frame's body, so a corrupt length cannot make a reader
// allocate without limit. One op moves at most this much to one peer.
const maxFrame = 1<<31 - 1

// maxHelloFrame bounds a frame before the peer is known.
const maxHelloFrame = 64 << 10

// Causes carried by an abort frame, so that the receiving side's error
// wraps the same sentinels (errors.Is) as the sender's.
const (
	causeTimeout byte = 1 << iota
	causeGone
	causeClosed
	causeMismatch
)

// header is what a rank tells its peers about its side of an op: what it
// called (sig, compared across ranks), the op's integers (counts, color,
// key) and a label (Split). failed marks a call that failed its local
// checks: sig then holds the error.
type header struct {
	failed bool
	sig    string
	ints   []int64
	label  string
}

// message is a peer's data frame for one op.
type message struct {
	h       header
	payload []byte
}

// enc appends wire fields to a byte slice.
type enc []byte

func (e enc) u8(v byte) enc    { return append(e, v) }
func (e enc) u16(v int) enc    { return binary.BigEndian.AppendUint16(e, uint16(v)) }
func (e enc) u32(v int) enc    { return binary.BigEndian.AppendUint32(e, uint32(v)) }
func (e enc) u64(v uint64) enc { return binary.BigEndian.AppendUint64(e, v) }

func (e enc) str(s string) enc {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	return append(e.u16(len(s)), s...)
}

func (e enc) str32(s string) enc { return append(e.u32(len(s)), s...) }

func (e enc) header(h header) enc {
	var flags byte
	if h.failed {
		flags = 1
	}
	e = e.u8(flags).str(h.sig).u16(len(h.ints))
	for _, v := range h.ints {
		e = e.u64(uint64(v))
	}
	return e.str(h.label)
}

// frame returns e with its 4-byte length prefix filled in, for a body of
// len(e)-4 bytes followed by extra more bytes sent separately.
func (e enc) frame(extra int) []byte {
	binary.BigEndian.PutUint32(e, uint32(len(e)-4+extra))
	return e
}

// newFrame starts a frame of kind (the length prefix is filled by frame).
func newFrame(kind byte) enc { return enc(make([]byte, 4, 64)).u8(kind) }

// dec reads wire fields; the first short read sets err and zeroes the rest.
type dec struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated frame")

func (d *dec) take(n int) []byte {
	if d.err != nil || n > len(d.b) {
		d.err = errShort
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() byte {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u16() int {
	if b := d.take(2); b != nil {
		return int(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (d *dec) u32() int {
	if b := d.take(4); b != nil {
		return int(binary.BigEndian.Uint32(b))
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *dec) str() string   { return string(d.take(d.u16())) }
func (d *dec) str32() string { return string(d.take(d.u32())) }

func (d *dec) header() header {
	h := header{failed: d.u8()&1 != 0, sig: d.str()}
	n := d.u16()
	if d.err == nil && n*8 <= len(d.b) {
		h.ints = make([]int64, n)
		for i := range h.ints {
			h.ints[i] = int64(d.u64())
		}
	} else {
		d.err = errShort
	}
	h.label = d.str()
	return h
}

// readFrame reads one frame body, refusing lengths over limit before
// allocating.
func readFrame(r *bufio.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n < 1 || n > limit {
		return nil, fmt.Errorf("frame of %d bytes: expected 1 to %d", n, limit)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// hello is the first frame each side of a connection sends.
func helloFrame(prefix string, rank, size int) []byte {
	return newFrame(kindHello).str(prefix).u32(rank).u32(size).frame(0)
}

// readHello reads the peer's hello before deadline and checks that it is a
// rank of this world (prefix and size).
func readHello(conn net.Conn, r *bufio.Reader, prefix string, size int, deadline time.Time) (rank int, err error) {
	conn.SetReadDeadline(deadline)
	defer conn.SetReadDeadline(time.Time{})
	body, err := readFrame(r, maxHelloFrame)
	if err != nil {
		return 0, err
	}
	d := dec{b: body}
	kind, p, rank, n := d.u8(), d.str(), d.u32(), d.u32()
	switch {
	case d.err != nil || kind != kindHello:
		return 0, errors.New("not an asynctp tcp hello")
	case p != prefix:
		return 0, fmt.Errorf("a rank of world %q, not of this world %q", p, prefix)
	case n != size || rank >= size:
		return 0, fmt.Errorf("rank %d of a world of %d, expected a world of %d", rank, n, size)
	}
	return rank, nil
}
