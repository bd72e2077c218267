package rendezvous

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Size limits of the protocol. A frame longer than maxFrame is rejected
// before its body is read, so garbage on the socket cannot make either side
// allocate more than this.
const (
	MaxValueSize = 64 << 20 // bytes in one value
	MaxKeySize   = 4 << 10  // bytes in one key
	maxFrame     = MaxValueSize + 64<<10
	maxFields    = 1 << 16  // fields in one frame (keys of one wait)
	maxHello     = 64 << 10 // a frame before the handshake is done
)

const (
	protoMagic   = "asynctp-rendezvous"
	protoVersion = "1"
)

// Request ops.
const (
	opHello byte = iota + 1
	opSet
	opGet
	opWait
	opAdd
	opCheck
	opCancel
)

// Response statuses.
const (
	statusOK byte = iota
	statusError
	statusJobMismatch
)

var opNames = map[byte]string{opHello: "hello", opSet: "set", opGet: "get", opWait: "wait",
	opAdd: "add", opCheck: "check", opCancel: "cancel"}

// frame is a decoded request or response: a kind (op or status), the request
// id and the fields.
type frame struct {
	kind   byte
	id     uint64
	fields [][]byte
}

// encode appends the length prefix and body of f to buf.
func (f frame) encode(buf []byte) ([]byte, error) {
	if len(f.fields) > maxFields {
		return nil, fmt.Errorf("message of %d fields exceeds the limit of %d", len(f.fields), maxFields)
	}
	size := 1 + 8
	for _, fl := range f.fields {
		size += 4 + len(fl)
	}
	if size > maxFrame {
		return nil, fmt.Errorf("message of %d bytes exceeds the limit of %d", size, maxFrame)
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(size))
	buf = append(buf, f.kind)
	buf = binary.BigEndian.AppendUint64(buf, f.id)
	for _, fl := range f.fields {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(fl)))
		buf = append(buf, fl...)
	}
	return buf, nil
}

// errFrameTooLarge marks a length prefix over the limit.
var errFrameTooLarge = errors.New("frame exceeds the size limit")

// readFrame reads one frame, refusing lengths over limit before allocating.
// The fields alias one buffer owned by the returned frame.
func readFrame(r io.Reader, limit uint32) (frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size > limit {
		return frame{}, fmt.Errorf("%w: length prefix %d > %d", errFrameTooLarge, size, limit)
	}
	if size < 9 {
		return frame{}, fmt.Errorf("malformed frame: length %d is shorter than its header", size)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	f := frame{kind: body[0], id: binary.BigEndian.Uint64(body[1:9])}
	rest := body[9:]
	for len(rest) > 0 {
		if len(rest) < 4 || len(f.fields) == maxFields {
			return frame{}, fmt.Errorf("malformed frame: %d trailing bytes after %d fields", len(rest), len(f.fields))
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return frame{}, fmt.Errorf("malformed frame: field of %d bytes with %d left", n, len(rest))
		}
		f.fields = append(f.fields, rest[:n:n])
		rest = rest[n:]
	}
	return f, nil
}

func int64Field(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

func parseInt64Field(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("malformed integer field of %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// checkKey validates a key against the protocol's limits.
func checkKey(key string) error {
	if key == "" {
		return errors.New("empty key")
	}
	if len(key) > MaxKeySize {
		return fmt.Errorf("key of %d bytes exceeds the limit of %d", len(key), MaxKeySize)
	}
	return nil
}
