package fetch

import (
	"os"

	"golang.org/x/sys/unix"
)

// hole reports whether f's bytes [off, off+n) are known to be a hole:
// no data at or after off before off+n (lseek SEEK_DATA). Where the file
// system cannot tell, or the call fails, it reports false (read it).
func hole(f *os.File, off, n int64) bool {
	if n <= 0 {
		return false
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var next int64
	var serr error
	if err := rc.Control(func(fd uintptr) { next, serr = unix.Seek(int(fd), off, unix.SEEK_DATA) }); err != nil {
		return false
	}
	switch {
	case serr == unix.ENXIO: // no data at or after off: off is in a hole reaching the end
		return true
	case serr != nil:
		return false
	}
	return next >= off+n
}

// noReadahead tells the kernel that f is read at random (the chunk a
// peer asks for, the chunk a fill checks): a read then pages in what it
// asks for alone. Readahead of a file filling piece by piece would page
// in, and zero, the holes around each piece read (a quarter of a rig's
// CPU while workers filled their shares). Advice only: an error is
// ignored.
func noReadahead(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.Fadvise(int(fd), 0, 0, unix.FADV_RANDOM) })
	}
}
