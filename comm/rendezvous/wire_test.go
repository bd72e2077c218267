package rendezvous

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func TestFrameRoundTrip(t *testing.T) {
	in := frame{kind: opSet, id: 1<<40 + 7, fields: [][]byte{[]byte("key"), {}, {0, 1, 2}}}
	buf, err := in.encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := readFrame(bytes.NewReader(buf), maxFrame)
	if err != nil {
		t.Fatal(err)
	}
	if out.kind != in.kind || out.id != in.id || len(out.fields) != 3 ||
		string(out.fields[0]) != "key" || len(out.fields[1]) != 0 || !bytes.Equal(out.fields[2], in.fields[2]) {
		t.Fatalf("round trip of %+v gave %+v", in, out)
	}
}

func TestReadFrameRejectsGarbage(t *testing.T) {
	be := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	hdr := make([]byte, 9)
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"huge length", u32(1 << 31)},
		{"just over the limit", u32(maxFrame + 1)},
		{"shorter than header", be(u32(3), []byte{1, 2, 3})},
		{"truncated body", be(u32(100), hdr)},
		{"field longer than body", be(u32(9+4+1), hdr, u32(1000), []byte{1})},
		{"trailing bytes", be(u32(9+2), hdr, []byte{0, 0})},
		{"http", []byte("GET / HTTP/1.1\r\n\r\n")},
	} {
		_, err := readFrame(bytes.NewReader(tc.in), maxFrame)
		if err == nil {
			t.Errorf("%s: readFrame accepted %q", tc.name, tc.in)
		}
	}
	_, err := readFrame(bytes.NewReader(u32(maxHello+1)), maxHello)
	if !errors.Is(err, errFrameTooLarge) {
		t.Errorf("huge length: %v, want errFrameTooLarge", err)
	}
}

func TestServerSurvivesGarbageConnections(t *testing.T) {
	srv := startServer(t, "job")
	good := dialT(t, srv.Addr(), "job", 0)
	ctx := testCtx(t, 5*time.Second)
	for _, garbage := range [][]byte{
		binary.BigEndian.AppendUint32(nil, 0xffffffff), // length over the limit
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),    // another protocol
		func() []byte { // a well-formed frame that is not a hello
			b, _ := frame{kind: opSet, fields: [][]byte{[]byte("k"), []byte("v")}}.encode(nil)
			return b
		}(),
	} {
		conn, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(garbage)
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		// The server answers at most an error and hangs up.
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Errorf("garbage %q: connection not closed by the server: %v", garbage, err)
		}
		conn.Close()
	}
	if _, err := good.Get(testCtx(t, 100*time.Millisecond), "k"); err == nil {
		t.Fatal("a frame sent without hello was applied to the store")
	}
	if _, err := good.Add(ctx, "n", 1); err != nil {
		t.Fatalf("well-behaved client after garbage: %v", err)
	}
}

func TestProtocolVersionMismatch(t *testing.T) {
	srv := startServer(t, "job")
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, _ := frame{kind: opHello, fields: [][]byte{[]byte(protoMagic), []byte("99"), []byte("job"), []byte("0")}}.encode(nil)
	conn.Write(hello)
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	f, err := readFrame(conn, maxFrame)
	if err != nil || f.kind != statusError || len(f.fields) != 1 || !bytes.Contains(f.fields[0], []byte(`protocol version "99"`)) {
		t.Fatalf("answer to a version-99 hello: %+v, %v", f, err)
	}
}
