package fetch

import "os"

// alreadyThere reports whether f holds, at off, the bytes check accepts: a
// piece fetched before (read into buf, which is len(piece) long). A
// range the file system reports as a hole holds no piece, so it is not
// read: a fetch into a fresh file (made at its full size, all holes)
// would otherwise read every piece's worth of zeros from the page cache
// and check them, a quarter of a fetching node's CPU on loopback.
func alreadyThere(f *os.File, buf []byte, off int64, check func([]byte) error) bool {
	if hole(f, off, int64(len(buf))) {
		return false
	}
	_, err := f.ReadAt(buf, off)
	return err == nil && check(buf) == nil
}
