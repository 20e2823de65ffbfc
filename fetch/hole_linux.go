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
