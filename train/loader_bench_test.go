package train_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

// BenchmarkLoaderLargeFile writes a raw uint16 token file of
// $ASYNCTP_BENCH_DATA_BYTES bytes (default 1 GiB) into the temporary
// directory, then measures what a run on it costs: the time to open it and
// make its loader (open-s), the growth of the process's resident memory
// over the first 100 batches of 8 × 1024 tokens (rss-MB/100-batches), and
// the time per batch after those (ns/op). The file is removed at the end.
//
//	ASYNCTP_BENCH_DATA_BYTES=10737418240 go test ./train -run '^$' -bench LoaderLargeFile -benchtime 1000x
func BenchmarkLoaderLargeFile(b *testing.B) {
	size := int64(1 << 30)
	if s := os.Getenv("ASYNCTP_BENCH_DATA_BYTES"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 1<<20 || v%2 != 0 {
			b.Fatalf("ASYNCTP_BENCH_DATA_BYTES=%q: expected an even number of bytes, at least 1 MiB", s)
		}
		size = v
	}
	path := filepath.Join(os.TempDir(), "asynctp-bench-tokens.bin")
	writeTokens(b, path, size)
	defer os.Remove(path)

	const vocab = 50304
	rss0 := residentBytes(b)
	start := time.Now()
	ds, err := tokens.Open(path, tokens.Auto)
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	l, err := train.NewLoader(ds, train.LoaderConfig{Batch: 8, Seq: 1024, Vocab: vocab, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	open := time.Since(start)
	for range 100 {
		if _, _, err := l.Next(); err != nil {
			b.Fatal(err)
		}
	}
	grown := residentBytes(b) - rss0
	for b.Loop() {
		if _, _, err := l.Next(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(open.Seconds(), "open-s")
	b.ReportMetric(float64(grown)/(1<<20), "rss-MB/100-batches")
	b.ReportMetric(float64(size)/(1<<30), "file-GiB")
}

// writeTokens writes size bytes of pseudo-random uint16 ids below 50304.
func writeTokens(b *testing.B, path string, size int64) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 4<<20)
	chunk := make([]byte, 4<<20)
	x := uint32(1)
	for left := size; left > 0; left -= int64(len(chunk)) {
		for i := 0; i < len(chunk); i += 2 {
			x = x*1664525 + 1013904223
			binary.LittleEndian.PutUint16(chunk[i:], uint16((x>>16)%50304))
		}
		if _, err := w.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
			f.Close()
			os.Remove(path)
			b.Fatal(err)
		}
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		os.Remove(path)
		b.Fatal(err)
	}
}

// residentBytes is the process's resident set (VmRSS of /proc/self/status).
func residentBytes(b *testing.B) int64 {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status to read the resident memory from (%v): the benchmark measures it on Linux", err)
	}
	for _, line := range bytes.Split(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := bytes.Fields(v)
			kb, err := strconv.ParseInt(string(f[0]), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("/proc/self/status has no VmRSS line")
	return 0
}
