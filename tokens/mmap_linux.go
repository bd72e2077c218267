//go:build linux

package tokens

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// canMap reports whether this system's files are memory-mapped (here) or
// read whole (readWhole, elsewhere).
const canMap = true

// faultWindow is the span that release drops: a read fault maps more than
// the page it touches (64 KiB of fault-around, or a whole large folio of
// the page cache, up to one 2 MiB page-table entry), and so release drops
// whole aligned 2 MiB spans, so that those neighbours go too.
const faultWindow = 2 << 20

// mapFile maps the first size bytes of f read-only. The pages are read
// from the file (through the page cache) as they are touched.
func mapFile(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || size != int64(int(size)) {
		return nil, fmt.Errorf("cannot map %d bytes", size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	// Windows are read in a random order: no read-ahead beyond the page
	// that is touched.
	_ = syscall.Madvise(b, syscall.MADV_RANDOM)
	return b, nil
}

// unmap releases a mapping of mapFile.
func unmap(b []byte) error { return syscall.Munmap(b) }

// release drops the pages of m that cover m[lo:hi] from the process (they
// stay in the page cache, shared with other processes, and are read again
// from there when touched), rounded out to whole faultWindow spans, so
// that reading a window leaves the process's resident memory where it was.
func release(m []byte, lo, hi int) {
	if len(m) == 0 || hi <= lo {
		return
	}
	base := uintptr(unsafe.Pointer(&m[0]))
	a := int((base+uintptr(lo))&^(faultWindow-1)) - int(base)
	z := int((base+uintptr(hi)+faultWindow-1)&^(faultWindow-1)) - int(base)
	a, z = max(a, 0), min(z, len(m))
	_ = syscall.Madvise(m[a:z], syscall.MADV_DONTNEED)
}
