//go:build !linux

package fetch

import "os"

// hole reports false where lseek's SEEK_DATA is not used: every range
// is read.
func hole(*os.File, int64, int64) bool { return false }

func noReadahead(*os.File) {}
