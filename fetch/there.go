package fetch

import "os"

// alreadyThere reports whether f holds, at off, the bytes check accepts: a
// piece fetched before (read into buf, which is len(piece) long). A
// range the file system reports as a hole reads as zeros without being
// read: a fetch into a fresh file (made at its full size, all holes)
// would otherwise read every piece's worth of zeros from the page cache
// before checking it, a quarter of a fetching node's CPU on loopback. (A
// piece of zeros, which some file systems keep as a hole, still passes.)
func alreadyThere(f *os.File, buf []byte, off int64, check func([]byte) error) bool {
	if hole(f, off, int64(len(buf))) {
		clear(buf)
	} else if _, err := f.ReadAt(buf, off); err != nil {
		return false
	}
	return check(buf) == nil
}
