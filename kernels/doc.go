// Package kernels owns the arithmetic on tensors that odmoe computes with:
// matrix-vector products over weights stored as F32, F16 or BF16, BF16
// packed losslessly into 13 bits a weight (BF16P, packed.go), or
// quantized as Q8 or NF4 (the shadow node's lossy copies), RMSNorm,
// rotary embeddings, softmax, SiLU/SwiGLU, exp, the conversions between
// float32 and the 16-bit formats, and quantization. It does not own
// tensors' storage, shapes beyond a matrix, or any model structure.
//
// # One arithmetic per kernel
//
// A swarm may mix amd64 and arm64 nodes (and later GPUs), and its output
// must equal a single-process run bit for bit. So each kernel below is
// defined exactly — lanes, summation order, rounding of every operation —
// and the pure-Go code in this package is the reference implementation of
// that definition. Any faster path (AVX2, AVX-512, NEON assembly, CUDA)
// must produce the same bits, and its tests compare it with the pure-Go
// path for equality, not closeness.
//
// Everywhere: IEEE 754 binary32 (float32) or binary64 (float64) add,
// subtract, multiply, divide and square root, rounded to nearest, ties to
// even; subnormals are honoured on input and output (no flush-to-zero, no
// denormals-are-zero: GPU code must be compiled with -ftz=false and
// without fast-math); multiply and add are never fused. In Go source a
// product that feeds an add is written float32(a*b) or float64(a*b): the
// explicit conversion forbids the compiler to fuse it (otherwise Go may
// fuse x*y+z, and does on arm64 and on amd64 with GOAMD64=v3). NaN
// results are NaN, but their payload and sign are not part of any
// definition below (hardware differs in which payload it propagates).
//
// # Dot, MatVec, MatMul
//
// A row of n elements w[i] times a vector x[i] (Dot, one MatVec row, one
// MatMul output element) is:
//
//  1. Widen each weight exactly to float32: F32 as is; BF16 by bits<<16
//     (BF16P: the BF16 it was packed from);
//     F16 by the exact IEEE conversion (F16ToF32); Q8 and NF4 by their
//     dequantization (below), one float32 multiply; MXFP4 to its exact
//     value and F8E4M3 to its code's times its block's scale (below).
//  2. Keep 16 float32 lane accumulators acc[0..15], all starting at +0.
//  3. For i = 0, 1, ..., n-1 in increasing order:
//     acc[i%16] = acc[i%16] + float32(w[i]*x[i])
//     (the product rounded to float32, then the add rounded to float32).
//     This covers the tail too: when n is not a multiple of 16, the last
//     n%16 elements go to lanes 0..n%16-1 and the other lanes are not
//     touched.
//  4. Fold pairwise: acc[l] += acc[l+8] for l < 8; then acc[l] += acc[l+4]
//     for l < 4; then acc[l] += acc[l+2] for l < 2; then acc[0] += acc[1].
//     The result is acc[0].
//
// This maps onto one AVX-512 register of 16 lanes, two AVX2 ymm registers
// (lanes 0-7 and 8-15), or four NEON q registers (lanes 4j..4j+3), each
// element block loaded, multiplied (vmulps / fmul) and added (vaddps /
// fadd) lane by lane. The fold is "high half onto low half" four times;
// pairwise-adjacent horizontal adds (HADDPS, NEON FADDP) add lanes 0+1,
// 2+3, ... and do NOT implement it.
//
// On the tail: the definition touches only the tail's own lanes, but
// padding the unused lanes with zero products gives the same bits. A lane
// starts at +0, and under round-to-nearest without flushing a sum is -0
// only when both addends are -0, so a lane is never -0; adding ±0 to
// anything that is not -0 leaves it unchanged (a NaN stays a NaN). Masked
// loads that zero BOTH w and x in the unused lanes are therefore fine;
// multiplying a zero-padded weight by a real or stale x element is not
// (0 * Inf = NaN), nor is reading stale weights.
//
// MatVec computes every row with this definition; MatMul computes every
// output element with it, so MatMul on n vectors equals n MatVecs bit for
// bit. Neither result depends on Threads(), on how rows are split over
// goroutines, or on blocking.
//
// Sum(x) is the same definition with the product float32(w[i]*x[i])
// replaced by x[i].
//
// # Native low-precision weights: MXFP4
//
// MXFP4 (OCP Microscaling Formats v1.0; gpt-oss's experts) is read as
// checkpoints ship it: a matrix's Data holds each row's n/2 bytes of
// E2M1 codes, weight 2j in the low nibble of byte j and weight 2j+1 in
// its high nibble, and its Scales each row's n/32 E8M0 scale bytes (n a
// multiple of 32). Weight i of a row is
//
//	float32(e2m1[q[i]] * 2^(s[i/32] - 127))
//	e2m1 = 0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6
//
// which is exact (at most two significant bits, and float32 holds every
// power of two down to 2^-149) except past float32's range: scale byte
// 255 makes ±0.5 ±2^127 and larger codes ±Inf, as torch.ldexp gives
// them in transformers' dequantization. The exact weights then enter the
// Dot definition above, so an MXFP4 MatVec or MatMul is, bit for bit, the
// same product on the float32 matrix of its values, on every path.
//
// F8E4M3 (OFP8 E4M3FN with 128x128 block scales; DeepSeek-V3's weights)
// is read as checkpoints ship it too: Data holds one code a byte, row by
// row, and Scales the float32 weight_scale_inv of every block of 128 rows
// and 128 columns (ceil(rows/128) rows of ceil(cols/128)). Weight (r, c)
// is
//
//	float32(e4m3[q] * scale[r/128][c/128])    one float32 multiply, rounded
//
// with e4m3[q] the code's exact value (sign, 4 exponent bits of bias 7, 3
// mantissa bits, exponent 0 subnormal, S.1111.111 NaN, no infinity); the
// weights then enter the Dot definition.
//
// # Quantized weights: Q8 and NF4
//
// Q8 and NF4 matrices are row-major and every row is self-contained, so
// that rows split over goroutines as the float dtypes' do. A row of n
// weights is (DType.RowBytes, all little-endian):
//
//	Q8:  ceil(n/32) float32 scales, then n int8 codes
//	NF4: ceil(n/64) float32 absmax values, then ceil(n/2) bytes of 4-bit
//	     codes, weight 2j in the low nibble of byte j and weight 2j+1 in its
//	     high nibble (the high nibble after an odd row's last weight is 0)
//
// Weight i of a row is dequantized to float32 as
//
//	Q8:  float32(q[i]) * scale[i/32]       (q[i] an int8: the conversion is exact)
//	NF4: code[q[i]] * absmax[i/64]
//
// each a single float32 multiply, rounded, and then enters the Dot
// definition above like any widened weight: MatVec and MatMul on Q8 and
// NF4 are the float definitions on the dequantized weights, bit for bit
// on every path and architecture. code is the table of the 16 NormalFloat4
// values of QLoRA (Dettmers et al., 2023), as float32, as bitsandbytes
// dequantizes with: -1, -0.6961928009986877, -0.5250730514526367,
// -0.39491748809814453, -0.28444138169288635, -0.18477343022823334,
// -0.09105003625154495, 0, 0.07958029955625534, 0.16093020141124725,
// 0.24611230194568634, 0.33791524171829224, 0.44070982933044434,
// 0.5626170039176941, 0.7229568362236023, 1.
//
// Quantize makes these rows from F32, F16 or BF16 weights w (widened
// exactly to float32), per group of 32 (Q8) or block of 64 (NF4) along
// the row, the last one possibly shorter, absmax = max |w| of the group:
//
//	Q8:  scale = absmax / 127 (a float32 division);
//	     q = RoundToEven(float64(w) / float64(scale)) clamped to [-127, 127],
//	     or 0 where scale is 0. Then |w - dequantized| <= scale/2 plus half
//	     an ulp of the dequantized weight.
//	NF4: the block's absmax is stored as it is; q = the index of the code
//	     nearest to float64(w) / float64(absmax), ties to the lower index,
//	     or 7 (the code 0) where absmax is 0.
//
// F16 from Quantize is each weight rounded to nearest, ties to even
// (F32ToF16). Quantize refuses NaN and infinite weights, and weights that
// overflow F16. Its output bytes are part of the golden test: every node
// that quantizes the same weights gets the same bytes.
//
// # Elementwise
//
//	Axpy:   dst[i] = dst[i] + float32(a*x[i])
//	Add:    dst[i] = dst[i] + x[i]
//	SiLU:   x / (1 + Exp(-x))                  (float32 add, then float32 divide)
//	SwiGLU: out[i] = float32(SiLU(gate[i]) * up[i])
//	AddBias: dst[t*c+j] = dst[t*c+j] + b[j]    (b widened exactly)
//	ClampedSwiGLU (gpt-oss; g = gateUp[2i], u = gateUp[2i+1]):
//	        g' = min(g, limit), u' = max(min(u, limit), -limit)
//	        out[i] = float32(u'+1) * float32(g' / float32(1 + Exp(-float32(alpha*g'))))
//
// # Exp
//
// Exp(x) for a float32 x is computed in float64, every operation rounded
// to float64, and rounded to float32 once at the end:
//
//	NaN -> NaN (the input); x > 88.8 -> +Inf; x < -104 -> +0
//	    (these two cutoffs change no result: there exp(x) already rounds
//	    to +Inf, resp. +0; they only keep k small)
//	d = float64(x)
//	k = RoundToEven(d * log2e)                     log2e  = 0x3FF71547652B82FE
//	r = (d - k*ln2hi) - k*ln2lo                    ln2hi  = 0x3FE62E42FEE00000
//	                                               ln2lo  = 0x3DEA39EF35793C76
//	p = c9; p = c8 + p*r; ...; p = c2 + p*r; p = 1 + p*r; p = 1 + p*r
//	    with cj = 1/j! rounded to the nearest float64 (Horner, degree 9)
//	result = float32(p * 2^k)    (2^k built from its exponent bits; the
//	    product is exact in float64, the conversion rounds to nearest even
//	    and produces float32 subnormals and +Inf as they come)
//
// Every product above is rounded before the following add or subtract.
// The result is within 1 ulp of float32(math.Exp(float64(x))) for every x
// (the tests check it); the polynomial's relative error is below 1e-11.
// Exp must not call math.Exp, whose bits differ between architectures.
// On amd64 SwiGLU and Softmax take their exponentials eight (AVX-512) or
// four (AVX2) at a time through exactly these operations (VRNDSCALEPD or
// VROUNDPD to nearest even, unfused VMULPD and VADDPD, 2^k from its bits,
// VCVTPD2PS), the cutoffs blended in after; the tests hold them to the Go
// definition bit for bit over a million float32 patterns.
//
// # RMSNorm
//
//	ms  = Dot(x, x) / float32(n)
//	r   = 1 / sqrt(ms + eps)   (float32 add; square root correctly rounded
//	                            to float32; float32 division)
//	out = weight[i] * float32(x[i]*r)
//
// # Softmax
//
//	m = the maximum of x (NaN anywhere makes the whole output NaN)
//	e_i = Exp(x_i - m)          (float32 subtraction)
//	s = Sum(e)                  (16 lanes and fold, as Dot)
//	x_i = e_i / s               (a float32 division, not a multiply by 1/s)
//
// SoftmaxSink is Softmax over x and one more logit, the sink, which takes
// its share and is dropped (gpt-oss's learned attention sinks):
//
//	m = the maximum of x and sink
//	e_i = Exp(x_i - m), e_sink = Exp(sink - m)
//	s = Sum(e) + e_sink         (Sum as above, then one float32 add)
//	x_i = e_i / s
//
// With sink = -Inf it is Softmax, bit for bit.
//
// # RoPE
//
// RoPE's rotation is portable float32 arithmetic with HF's rotate_half
// convention; for head h and i < half = headDim/2:
//
//	x[h+i]      = float32(x1*c) - float32(x2*s)
//	x[h+i+half] = float32(x2*c) + float32(x1*s)
//
// Its tables (RoPEFreqs, RoPETable) use math.Pow, math.Cos and math.Sin,
// which are deterministic within one architecture's build but not across
// architectures.
//
// # Which kernels must agree across architectures
//
// The expert path runs on workers of any architecture and its results are
// summed on the main node, so these must be bit-identical everywhere:
// MatVec, MatMul, Dot, Sum, Exp, SiLU, SwiGLU, ClampedSwiGLU, Axpy, Add,
// AddBias, and the conversions. Quantize and the Q8 and NF4 products are portable too,
// although only the shadow node, whose results change speed and never
// output, uses them. RMSNorm and Softmax run on the main node only but are
// defined portably anyway. The RoPE tables run on the main node only and
// need only be deterministic within a process; the swarm equals local mode
// as long as both run their main node on the same architecture.
//
// # Host requirements
//
// Weight bytes are little-endian. On amd64 and arm64 they are reinterpreted
// in place (unaligned is fine); other architectures decode a copy on every
// call (correct, slow). MatVec and MatMul only read w and x, which must not
// overlap out.
//
// # Paths
//
// The kernels run on one of several implementations ("paths"): "go", the
// pure-Go reference that is the definition above, and assembly generated
// by internal/asmgen: "avx512" (AVX-512F, one zmm register per 16 lanes)
// and "avx2" (AVX2 and F16C, two ymm registers) on amd64, "neon" (four q
// registers) on arm64. The fastest path the CPU supports
// (golang.org/x/sys/cpu) runs by default; the environment variable
// ODMOE_KERNELS or SetPath forces one, Paths lists them. A path changes
// speed, never a bit: the assembly multiplies with vmulps/FMUL and adds
// with vaddps/FADD (never a fused vfmadd/FMLA), widens BF16 by a shift
// or a zip with zeros and F16 with VCVTPH2PS/FCVTL (both exact), folds
// high half onto low half, and leaves each row's last n%16 elements (and
// the elementwise kernels' last n%16) to the same Go code as the
// reference. MatVec takes four rows at a time past each load of x, rows
// i, i+q, i+2q and i+3q of q = rows/4, so that memory is read as four long
// sequential streams; MatMul widens a tile of rows once into float32
// scratch and applies it to several vectors at a time with one accumulator
// set per output element in registers. The assembly covers MatVec, MatMul, Dot, Sum, Axpy, Add and
// RMSNorm's scaling; the rest is Go on every path.
//
// No path uses VDPBF16PS (AVX512_BF16), though llama.cpp's prefill does:
// it multiplies BF16 by BF16, so a float32 activation would have to be
// cut into three BF16 parts to stay exact, three instructions for 32
// products, and it sums two products a lane in its own order. Measured
// on a Zen 4 (kernels/internal/isaprobe, docs/BENCHMARKS.md): 114-116
// products/ns with BF16 activations, so 38.7 when exact, against 50-54
// for the multiply-and-add defined here (58 fused): an exact definition
// built on it would be slower than this one, and none can be faster than
// 1.07x it. The widened tile already runs at 0.83-0.90 of that peak.
//
// # Testing a new path
//
// The tests hold every path to these definitions: specDot in the tests is
// the plain, non-unrolled form of the Dot definition, and MatVec, MatMul,
// Dot and Sum must equal it bit for bit; testdata/golden.json records
// hashes of the exact output bits of every portable kernel on fixed
// inputs, and must match on every architecture (run the test binary of
// GOARCH=arm64 under qemu-aarch64 on an amd64 machine, for example:
// make test-arm64). The definition tests and the golden test run once per
// path in Paths(), and path_test.go compares every path with "go" bit for
// bit on awkward shapes and special values (±0, subnormals, Inf, NaN); a
// new path added to the list is covered by them.
package kernels
