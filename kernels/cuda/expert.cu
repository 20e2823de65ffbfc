// Expert kernels of odmoe's CUDA workers: the arithmetic of kernels/doc.go,
// exactly, so that a GPU worker's results equal the CPU's bit for bit.
//
//  - every product and sum is rounded on its own (__fmul_rn, __fadd_rn,
//    __dmul_rn, __dadd_rn, __fdiv_rn): never contracted to a fused
//    multiply-add; the file is also compiled with -fmad=false;
//  - subnormals are honoured (-ftz=false);
//  - a row's dot product keeps 16 float32 lane accumulators: lane l adds
//    elements l, l+16, l+32, ... in increasing order, and the lanes fold
//    high half onto low half (8, 4, 2, 1). Here the 16 lanes are 16
//    threads of a half-warp, and the fold is four shuffles.
//
// Rebuild expert.ptx with `go generate -tags cuda ./kernels/cuda` (needs nvcc).

#include <cuda_fp16.h>

// Weight formats, as kernels.DType numbers them are not: the Go side maps
// kernels.F32/F16/BF16 to these.
#define WF32 0
#define WF16 1
#define WBF16 2
#define WMXFP4 3

// mxfp4_value is an MXFP4 weight: E2M1 code q (sign, two exponent bits,
// one mantissa bit) times 2^(s-127), worked out in float64 (exact there)
// and rounded once to float32 (exact too, but past float32's range: scale
// byte 255 with |q| > 0.5 is +-Inf), as kernels' mxfp4Values table holds
// it; code 8 is -0.
__device__ __forceinline__ float mxfp4_value(unsigned q, unsigned s) {
    unsigned m = q & 7u, e = m >> 1;
    double v = e == 0 ? 0.5 * (double)(m & 1u) : (double)(2u + (m & 1u)) * (double)(1u << (e - 1)) * 0.5;
    if (q & 8u) v = -v;
    double scale = __longlong_as_double((long long)(s - 127 + 1023) << 52); // 2^(s-127): a normal float64
    return __double2float_rn(__dmul_rn(v, scale));
}

// widen is weight i of w (i counts from w's first row) as float32,
// exactly: kernels/doc.go's step 1. sc are an MXFP4 matrix's scales, a
// byte for each 32 weights (its rows are whole blocks of 32, so weight i
// is code byte i/2's nibble and scale byte i/32 whatever its row); the
// other formats have none.
template <int DT>
__device__ __forceinline__ float widen(const void *w, const unsigned char *sc, long long i) {
    if (DT == WF32) return ((const float *)w)[i];
    if (DT == WF16) return __half2float(((const __half *)w)[i]); // exact
    if (DT == WMXFP4) {
        unsigned b = ((const unsigned char *)w)[i >> 1];
        return mxfp4_value((i & 1) ? b >> 4 : b & 15u, sc[i >> 5]);
    }
    return __uint_as_float(((unsigned int)((const unsigned short *)w)[i]) << 16);
}

// fold16 is the definition's pairwise fold across the 16 lanes of a
// half-warp; lane 0 of the half ends with the row's result.
__device__ __forceinline__ float fold16(float acc, unsigned mask) {
    acc = __fadd_rn(acc, __shfl_down_sync(mask, acc, 8, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(mask, acc, 4, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(mask, acc, 2, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(mask, acc, 1, 16));
    return acc;
}

// odmoe_exp is kernels.Exp: float64 arithmetic rounded once to float32.
__device__ __forceinline__ float odmoe_exp(float x) {
    if (x != x) return x;
    if (x > 88.8f) return __int_as_float(0x7f800000);
    if (x < -104.0f) return 0.0f;
    const double log2e = __longlong_as_double(0x3FF71547652B82FEll);
    const double ln2hi = __longlong_as_double(0x3FE62E42FEE00000ll);
    const double ln2lo = __longlong_as_double(0x3DEA39EF35793C76ll);
    double d = (double)x;
    double k = rint(__dmul_rn(d, log2e));
    double r = __dsub_rn(__dsub_rn(d, __dmul_rn(k, ln2hi)), __dmul_rn(k, ln2lo));
    double p = 1.0 / 362880;
    p = __dadd_rn(1.0 / 40320, __dmul_rn(p, r));
    p = __dadd_rn(1.0 / 5040, __dmul_rn(p, r));
    p = __dadd_rn(1.0 / 720, __dmul_rn(p, r));
    p = __dadd_rn(1.0 / 120, __dmul_rn(p, r));
    p = __dadd_rn(1.0 / 24, __dmul_rn(p, r));
    p = __dadd_rn(1.0 / 6, __dmul_rn(p, r));
    p = __dadd_rn(1.0 / 2, __dmul_rn(p, r));
    p = __dadd_rn(1.0, __dmul_rn(p, r));
    p = __dadd_rn(1.0, __dmul_rn(p, r));
    double scale = __longlong_as_double((long long)((int)k + 1023) << 52);
    return __double2float_rn(__dmul_rn(p, scale));
}

// swiglu is kernels.SwiGLU of one element: SiLU(g) * u, SiLU(g) being
// g / (1 + Exp(-g)).
__device__ __forceinline__ float swiglu(float g, float u) {
    float silu = __fdiv_rn(g, __fadd_rn(1.0f, odmoe_exp(-g)));
    return __fmul_rn(silu, u);
}

// A half-warp takes a row: lane l (its 16 threads) adds elements l, l+16,
// l+32, ... of the row in increasing order, the definition's lane l. Each
// lane loads U of its elements ahead (their adds stay in order), so that a
// lane has U loads in flight rather than one: small experts' grids are
// too few threads to hide memory latency otherwise. T tokens share each
// weight a lane loads (T accumulators a lane); rows past n are clamped to
// row n-1, computed and discarded.

// gate_up computes act[t][r] = SwiGLU(gate row r . x[t], up row r . x[t])
// for every token t < n: an expert's gate and up products and its
// activation, in one pass over both matrices.
template <int DT, int T, int U>
__device__ void gate_up(float *act, const void *gate, const void *up,
                        const float *x, int rows, int cols, int n) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    int row = tid >> 4, lane = threadIdx.x & 15;
    if (row >= rows) return; // whole half-warps leave together
    unsigned mask = 0xffffu << (threadIdx.x & 16);
    const long long base = (long long)row * cols;
    for (int t0 = 0; t0 < n; t0 += T) {
        float ag[T], au[T];
        const float *xt[T];
#pragma unroll
        for (int t = 0; t < T; t++) {
            ag[t] = 0.0f;
            au[t] = 0.0f;
            xt[t] = x + (long long)min(t0 + t, n - 1) * cols;
        }
        int i = lane;
        for (; i + 16 * (U - 1) < cols; i += 16 * U) {
            float wg[U], wu[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                wg[u] = widen<DT>(gate, nullptr, base + i + 16 * u);
                wu[u] = widen<DT>(up, nullptr, base + i + 16 * u);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int t = 0; t < T; t++) {
                    float xv = xt[t][i + 16 * u];
                    ag[t] = __fadd_rn(ag[t], __fmul_rn(wg[u], xv));
                    au[t] = __fadd_rn(au[t], __fmul_rn(wu[u], xv));
                }
            }
        }
        for (; i < cols; i += 16) {
            float wg = widen<DT>(gate, nullptr, base + i), wu = widen<DT>(up, nullptr, base + i);
#pragma unroll
            for (int t = 0; t < T; t++) {
                float xv = xt[t][i];
                ag[t] = __fadd_rn(ag[t], __fmul_rn(wg, xv));
                au[t] = __fadd_rn(au[t], __fmul_rn(wu, xv));
            }
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            float g = fold16(ag[t], mask), u = fold16(au[t], mask);
            if (lane == 0 && t0 + t < n) act[(long long)(t0 + t) * rows + row] = swiglu(g, u);
        }
    }
}

// mat_mul computes out[t][r] = w row r . x[t] for every token t < n:
// kernels.MatMul.
template <int DT, int T, int U>
__device__ void mat_mul(float *out, const void *w, const unsigned char *sc, const float *x, int rows, int cols, int n) {
    int tid = blockIdx.x * blockDim.x + threadIdx.x;
    int row = tid >> 4, lane = threadIdx.x & 15;
    if (row >= rows) return;
    unsigned mask = 0xffffu << (threadIdx.x & 16);
    const long long base = (long long)row * cols;
    for (int t0 = 0; t0 < n; t0 += T) {
        float acc[T];
        const float *xt[T];
#pragma unroll
        for (int t = 0; t < T; t++) {
            acc[t] = 0.0f;
            xt[t] = x + (long long)min(t0 + t, n - 1) * cols;
        }
        int i = lane;
        for (; i + 16 * (U - 1) < cols; i += 16 * U) {
            float wv[U];
#pragma unroll
            for (int u = 0; u < U; u++) wv[u] = widen<DT>(w, sc, base + i + 16 * u);
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int t = 0; t < T; t++) acc[t] = __fadd_rn(acc[t], __fmul_rn(wv[u], xt[t][i + 16 * u]));
            }
        }
        for (; i < cols; i += 16) {
            float wv = widen<DT>(w, sc, base + i);
#pragma unroll
            for (int t = 0; t < T; t++) acc[t] = __fadd_rn(acc[t], __fmul_rn(wv, xt[t][i]));
        }
#pragma unroll
        for (int t = 0; t < T; t++) {
            float s = fold16(acc[t], mask);
            if (lane == 0 && t0 + t < n) out[(long long)(t0 + t) * rows + row] = s;
        }
    }
}

// add_bias is kernels.AddBias: every row of n rows of c floats in dst
// gets the bias row b added, element by element (one rounded add).
template <int DT>
__device__ void add_bias(float *dst, const void *b, int c, int n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)c * n) dst[i] = __fadd_rn(dst[i], widen<DT>(b, nullptr, i % c));
}
// go_min and go_max are Go's min and max of two float32s: NaN if either
// is, and -0 below +0.
__device__ __forceinline__ float go_min(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return signbit(a) ? a : b;
    return a < b ? a : b;
}
__device__ __forceinline__ float go_max(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a == b) return signbit(a) ? b : a;
    return a > b ? a : b;
}

extern "C" {

// Entry points: odmoe_gate_up_<format>_t<T> and odmoe_mat_mul_<format>_t<T>,
// T tokens a pass: 1 (decode), 4 and 8 (batches; the Go side picks the
// smallest T >= n, or 8).
__global__ void odmoe_gate_up_f32_t1(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WF32, 1, 8>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_f32_t4(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WF32, 4, 4>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_f32_t8(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WF32, 8, 4>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_f16_t1(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WF16, 1, 8>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_f16_t4(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WF16, 4, 4>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_f16_t8(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WF16, 8, 4>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_bf16_t1(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WBF16, 1, 8>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_bf16_t4(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WBF16, 4, 4>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_gate_up_bf16_t8(float *act, const void *gate, const void *up, const float *x, int rows, int cols, int n) {
    gate_up<WBF16, 8, 4>(act, gate, up, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_f32_t1(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WF32, 1, 8>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_f32_t4(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WF32, 4, 4>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_f32_t8(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WF32, 8, 4>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_f16_t1(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WF16, 1, 8>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_f16_t4(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WF16, 4, 4>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_f16_t8(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WF16, 8, 4>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_bf16_t1(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WBF16, 1, 8>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_bf16_t4(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WBF16, 4, 4>(out, w, nullptr, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_bf16_t8(float *out, const void *w, const float *x, int rows, int cols, int n) {
    mat_mul<WBF16, 8, 4>(out, w, nullptr, x, rows, cols, n);
}

// MXFP4 products (gpt-oss's experts as published): the scales are an
// argument of their own.
__global__ void odmoe_mat_mul_mxfp4_t1(float *out, const void *w, const unsigned char *sc, const float *x, int rows, int cols, int n) {
    mat_mul<WMXFP4, 1, 8>(out, w, sc, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_mxfp4_t4(float *out, const void *w, const unsigned char *sc, const float *x, int rows, int cols, int n) {
    mat_mul<WMXFP4, 4, 4>(out, w, sc, x, rows, cols, n);
}
__global__ void odmoe_mat_mul_mxfp4_t8(float *out, const void *w, const unsigned char *sc, const float *x, int rows, int cols, int n) {
    mat_mul<WMXFP4, 8, 4>(out, w, sc, x, rows, cols, n);
}

__global__ void odmoe_add_bias_f32(float *dst, const void *b, int c, int n) { add_bias<WF32>(dst, b, c, n); }
__global__ void odmoe_add_bias_f16(float *dst, const void *b, int c, int n) { add_bias<WF16>(dst, b, c, n); }
__global__ void odmoe_add_bias_bf16(float *dst, const void *b, int c, int n) { add_bias<WBF16>(dst, b, c, n); }

// odmoe_clamped_swiglu is kernels.ClampedSwiGLU (gpt-oss's activation)
// over n outputs: gate gu[2i] and up gu[2i+1] clamped to limit (up from
// below too), out[i] = (up + 1) * gate / (1 + Exp(-(alpha * gate))).
// out must not overlap gu.
__global__ void odmoe_clamped_swiglu(float *out, const float *gu, int n, float limit, float alpha) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = go_min(gu[2 * i], limit);
    float u = go_max(go_min(gu[2 * i + 1], limit), -limit);
    float glu = __fdiv_rn(g, __fadd_rn(1.0f, odmoe_exp(-__fmul_rn(alpha, g))));
    out[i] = __fmul_rn(__fadd_rn(u, 1.0f), glu);
}

// odmoe_swiglu is kernels.SwiGLU over n elements: the tests hold Exp and
// SiLU to the CPU's bits on inputs no product would reach.
__global__ void odmoe_swiglu(float *out, const float *gate, const float *up, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = swiglu(gate[i], up[i]);
}

} // extern "C"
