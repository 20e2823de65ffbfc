package fetch

import "time"

// SetPieceBytes cuts tensors into pieces of n bytes until the returned
// func puts the size back.
func SetPieceBytes(n int64) (restore func()) {
	old := pieceBytes
	pieceBytes = n
	return func() { pieceBytes = old }
}

// SetOfflineWait sets how long a node with a complete directory waits
// for a manifest until the returned func puts it back.
func SetOfflineWait(d time.Duration) (restore func()) {
	old := offlineWait
	offlineWait = d
	return func() { offlineWait = old }
}

// SetHoldWait sets how long a node filling its directory holds a request
// for a chunk to come until the returned func puts it back.
func SetHoldWait(d time.Duration) (restore func()) {
	old := holdWait
	holdWait = d
	return func() { holdWait = old }
}
