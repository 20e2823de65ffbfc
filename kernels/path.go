package kernels

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
)

//go:generate go run ./internal/asmgen

// A path is one implementation of the hot kernels: the pure-Go reference
// ("go") or an assembly one ("avx2", "avx512", "neon"). Every path computes
// exactly the arithmetic of the package doc, so which one runs changes
// speed only, never a bit of any result; tests compare every available
// path with "go".
type path struct {
	name string

	rowKernels
	dotF32 func(a, b []float32) float32
	sum    func(x []float32) float32

	// matMulRows computes rows [r0, r1) of w for all n vectors of x;
	// matMulRoute says how, for a matrix of dt with cols columns.
	matMulRows  func(out []float32, w Matrix, x []float32, n, r0, r1 int)
	matMulRoute func(dt DType, cols, n int) string

	// dotRows: out[j] = Dot(x, row j of w), rows stride floats apart;
	// axpyRows: dst += a[j] * (row j of x), j in order (Attend).
	dotRows  func(out, x, w []float32, stride int)
	axpyRows func(dst, a, x []float32, stride int)

	// Elementwise kernels (lengths already checked).
	axpy func(dst []float32, a float32, x []float32)
	add  func(dst, x []float32)
	// scaleMul is RMSNorm's last step: out[i] = weight[i] * float32(x[i]*r).
	scaleMul func(out, x, weight []float32, r float32)
	// expShift is Softmax's exponentials: x[i] = Exp(x[i] - m); siluMul
	// SwiGLU's: out[i] = SiLU(gate[i]) * up[i].
	expShift func(x []float32, m float32)
	siluMul  func(out, gate, up []float32)
	// clampedSwiGLU is ClampedSwiGLU's (lengths checked).
	clampedSwiGLU func(out, gateUp []float32, limit, alpha float32)
	// packedNative: this path computes BF16P in assembly
	packedNative bool
	// expWork is what an element of SwiGLU costs, in ParallelChunks'
	// unit: where it is worth splitting over the thread team (Softmax's
	// rows are split by the attention's heads instead).
	expWork int
}

// rowKernels compute out[r] = Dot(row r of w, x) for r < len(out), where
// w holds len(out) rows of len(x) elements (Q8 and NF4: len(out) rows of
// RowBytes(len(x)) bytes). They must not keep w or x.
type rowKernels struct {
	matVecF32  func(out, w, x []float32)
	matVecBF16 func(out []float32, w []uint16, x []float32)
	matVecF16  func(out []float32, w []uint16, x []float32)
	matVecQ8   func(out []float32, w []byte, x []float32)
	matVecNF4  func(out []float32, w []byte, x []float32)
	// MXFP4: len(out) rows of codes and of scales (Matrix.Scales)
	matVecMXFP4 func(out []float32, codes, scales []byte, x []float32)
	// F8E4M3: len(out) rows of codes from row r0 on, and the matrix's
	// whole Matrix.Scales
	matVecF8 func(out []float32, codes, scales []byte, x []float32, r0 int)
	// BF16P: len(out) rows of blocks and the matrix's code table (its
	// exception rows are redone by matVecRows)
	matVecBF16P func(out []float32, data []byte, table *[packedTableBytes]byte, x []float32)
	// unpackBF16P widens len(dst)/64 blocks (a tile of MatMul)
	unpackBF16P func(dst []float32, src []byte, table *[packedTableBytes]byte)
}

var goRows = rowKernels{matVecF32Go, matVecBF16Go, matVecF16Go, matVecQ8Go, matVecNF4Go, matVecMXFP4Go, matVecF8Go, matVecBF16PGo, widenBlocksGo}

// goPath is the pure-Go reference: the definition itself.
var goPath = &path{
	name:       "go",
	rowKernels: goRows,
	dotF32:     dotF32Go,
	sum:        sumGo,
	matMulRows: matMulRowsGo,
	matMulRoute: func(DType, int, int) string {
		return "go: each vector's Dot with each row"
	},
	dotRows:  dotRowsGo,
	axpyRows: axpyRowsGo,
	axpy:     axpyGo,
	add:      addGo,
	scaleMul: scaleMulGo,
	expShift: expShiftGo,
	siluMul:  swiGLU,
	expWork:  expWorkGo,

	clampedSwiGLU: clampedSwiGLUGo,
}

var active atomic.Pointer[path]

// pathEnv names the environment variable that forces a path at start-up.
const pathEnv = "ODMOE_KERNELS"

func init() {
	if SetPath("") != nil {
		// ODMOE_KERNELS names a path this CPU lacks: keep the fastest one.
		// The package cannot report it; odmoe's commands call SetPath("")
		// themselves and refuse the value with this error.
		active.Store(defaultPath())
	}
}

func defaultPath() *path {
	if len(simdPaths) > 0 {
		return simdPaths[0]
	}
	return goPath
}

// cur returns the active path.
func cur() *path { return active.Load() }

// Path returns the name of the implementation the kernels run on: "go"
// (the pure-Go reference), "avx2", "avx512" or "neon".
func Path() string { return cur().name }

// MatMulRoute says how MatMul on the active path applies a matrix of dt
// with cols columns to n vectors: its path, and which of its ways (the
// row kernel once per vector, the weights widened in registers for a few
// vectors at once, or a tile of them widened to float32 first), so that
// figures from two machines cannot be confused.
func MatMulRoute(dt DType, cols, n int) string { return cur().matMulRoute(dt, cols, n) }

// Paths lists the implementations this CPU can run, fastest first; "go" is
// always last.
func Paths() []string {
	names := make([]string, 0, len(simdPaths)+1)
	for _, p := range simdPaths {
		names = append(names, p.name)
	}
	return append(names, goPath.name)
}

// SetPath makes the kernels run on the named implementation (one of
// Paths()). The empty name selects the default: the value of the
// ODMOE_KERNELS environment variable if it is set, else the fastest path.
// It is an error to name a path this CPU cannot run. Results never depend
// on the path, only speed does; SetPath is safe to call at any time, and a
// kernel call already running finishes on the path it started with.
func SetPath(name string) error {
	src := "kernels"
	if name == "" {
		name, src = strings.TrimSpace(os.Getenv(pathEnv)), pathEnv
	}
	if name == "" {
		active.Store(defaultPath())
		return nil
	}
	for _, p := range append(simdPaths, goPath) {
		if p.name == name {
			active.Store(p)
			return nil
		}
	}
	return fmt.Errorf("%s: path %q is not available on this CPU (available: %s)", src, name, strings.Join(Paths(), ", "))
}
