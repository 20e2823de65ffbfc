package kernels

import "fmt"

// Axpy computes dst[i] = dst[i] + float32(a*x[i]): the product is rounded
// to float32 before the add (never fused). It panics if the lengths differ.
func Axpy(dst []float32, a float32, x []float32) {
	if len(dst) != len(x) {
		panic("kernels.Axpy: length mismatch")
	}
	cur().axpy(dst, a, x)
}

func axpyGo(dst []float32, a float32, x []float32) {
	for i, v := range x[:len(dst)] {
		dst[i] += float32(a * v)
	}
}

// Add computes dst[i] += x[i]. It panics if the lengths differ.
func Add(dst, x []float32) {
	if len(dst) != len(x) {
		panic("kernels.Add: length mismatch")
	}
	cur().add(dst, x)
}

func addGo(dst, x []float32) {
	for i, v := range x[:len(dst)] {
		dst[i] += v
	}
}

// AddBias adds the bias row b ([1, c] of a float dtype, widened exactly)
// to each of the n rows of c elements of dst: dst[t*c+j] += b[j], one
// float32 add each. It panics unless len(dst) == n*c.
func AddBias(dst []float32, n int, b Matrix) {
	c := b.Cols
	if b.Rows != 1 || b.DType.Size() == 0 || len(b.Data) != c*b.DType.Size() || len(dst) != n*c {
		panic(fmt.Sprintf("kernels.AddBias: a %dx%d %v bias on %d rows of %d floats", b.Rows, b.Cols, b.DType, n, len(dst)))
	}
	for t := range n {
		row := dst[t*c : (t+1)*c]
		switch b.DType {
		case F32:
			for j, v := range f32View(b.Data)[:c] {
				row[j] += v
			}
		case BF16:
			for j, h := range u16View(b.Data)[:c] {
				row[j] += BF16ToF32(h)
			}
		case F16:
			for j, h := range u16View(b.Data)[:c] {
				row[j] += F16ToF32(h)
			}
		}
	}
}
