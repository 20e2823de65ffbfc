package kernels

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
