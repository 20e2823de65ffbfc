package fetch

// SetPieceBytes cuts tensors into pieces of n bytes until the returned
// func puts the size back.
func SetPieceBytes(n int64) (restore func()) {
	old := pieceBytes
	pieceBytes = n
	return func() { pieceBytes = old }
}
