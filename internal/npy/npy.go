// Package npy writes NumPy .npy files (format 1.0, little-endian float32,
// C order) row by row, so that logits can be dumped while decoding and read
// by anyone with NumPy: numpy.load("logits.npy").
package npy

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"os"
)

// headerLen is fixed so the row count can be patched in at Close; 128
// bytes hold any shape of two 20-digit dimensions.
const headerLen = 128

// Writer appends rows of a [rows, cols] float32 matrix.
type Writer struct {
	f    *os.File
	w    *bufio.Writer
	cols int
	rows int
	buf  []byte
}

// Create starts path for rows of cols floats.
func Create(path string, cols int) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("npy: %w", err)
	}
	w := &Writer{f: f, w: bufio.NewWriter(f), cols: cols, buf: make([]byte, 4*cols)}
	if _, err := w.w.Write(header(0, cols)); err != nil {
		f.Close()
		return nil, fmt.Errorf("npy: %w", err)
	}
	return w, nil
}

func header(rows, cols int) []byte {
	dict := fmt.Sprintf("{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols)
	h := make([]byte, 0, headerLen)
	h = append(h, "\x93NUMPY\x01\x00"...)
	h = binary.LittleEndian.AppendUint16(h, uint16(headerLen-10))
	h = append(h, dict...)
	for len(h) < headerLen-1 {
		h = append(h, ' ')
	}
	return append(h, '\n')
}

// Append writes one row; it must have exactly cols values.
func (w *Writer) Append(row []float32) error {
	if len(row) != w.cols {
		return fmt.Errorf("npy: row of %d values, want %d", len(row), w.cols)
	}
	for i, v := range row {
		binary.LittleEndian.PutUint32(w.buf[4*i:], math.Float32bits(v))
	}
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("npy: %w", err)
	}
	w.rows++
	return nil
}

// Close writes the final shape into the header and closes the file.
func (w *Writer) Close() error {
	err := w.w.Flush()
	if err == nil {
		_, err = w.f.WriteAt(header(w.rows, w.cols), 0)
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("npy: %w", err)
	}
	return nil
}
