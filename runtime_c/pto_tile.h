/* pto_tile.h - the arithmetic of InCore functions rendered to C (pto/codegen/c_incore.py).
 *
 * Header-only (static inline), included by generated InCore C next to pto_orch.h. It holds
 * what the generated code would otherwise repeat: conversions between f32 and the half
 * storage types, the transcendental functions, reductions and matrix products. The numbers
 * follow the reference evaluator (pto/evaluator/machine.py):
 *
 *  - tiles hold f32 values, each rounded to its tile's dtype when written (pto_r_bf16,
 *    pto_r_f16: round to nearest even, as torch's conversions), so reading a tile is a plain
 *    f32 read;
 *  - exp, exp2 and silu are computed in double and rounded to f32 (the evaluator rounds
 *    float64 results; pto_exp_d is accurate to about 2 ulp of a double, so its f32 rounding
 *    agrees with a correctly rounded one except within 2^-50 of a rounding boundary); log
 *    calls the C library's double log;
 *  - max and min propagate NaN (torch.maximum, torch.minimum); relu keeps -0 and NaN;
 *  - sums and products round in another order than torch's (rounding-bounded, not bit-equal);
 *  - a block-quantized load runs its format's dequantization routine (generated beside the
 *    kernels: pto/codegen/c_quant.py) on the fields read here (pto_ld_u16, pto_e4m3_f32).
 *
 * Matrix products: register-blocked kernels written with GCC's vector extensions where the
 * compiler has them (GCC, Clang), so that the accumulators stay in registers and the
 * compiler picks the machine's vector width (AVX-512, AVX2, NEON); plain C loops elsewhere.
 * Only these kernels and the double-precision polynomials multiply then add in one
 * expression, so compiling with -ffp-contract=fast changes no elementwise result (each
 * elementwise op is one operation per element, rounded and stored before the next).
 */
#ifndef PTO_TILE_H
#define PTO_TILE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "pto_orch.h"
#include "pto_runtime.h"

/* ---------------------------------------------------------------------------------------
 * bits and the half storage types
 * ------------------------------------------------------------------------------------- */

static inline uint32_t pto_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float pto_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f32 -> bf16 bits, round to nearest even; a NaN stays a (quiet) NaN of the same sign. */
static inline uint16_t pto_bf16_of(float f)
{
    const uint32_t u = pto_f32_bits(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

static inline float pto_bf16_f32(uint16_t h)
{
    return pto_bits_f32((uint32_t)h << 16);
}

/* f32 -> f16 bits, round to nearest even (subnormals, overflow to infinity, NaN kept). */
static inline uint16_t pto_f16_of(float f)
{
    const uint32_t u = pto_f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
    const uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t h, rem, half, shift;
    if (ax > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u | (ax >> 13));
    }
    if (ax >= 0x47800000u) { /* 2^16 and above (infinity included): beyond the largest half */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (e >= 113) { /* a normal half: 10 of the 23 mantissa bits, the rest rounds */
        h = ((e - 112) << 10) | ((ax >> 13) & 0x3ffu);
        rem = ax & 0x1fffu;
        h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
        return (uint16_t)(sign | h); /* a carry out of the mantissa bumps the exponent (to inf at the top) */
    }
    if (e < 102) { /* below 2^-25: rounds to zero */
        return (uint16_t)sign;
    }
    shift = 126 - e; /* the value in units of 2^-24 (the smallest half) is mant >> shift */
    h = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    h += rem > half || (rem == half && (h & 1u));
    return (uint16_t)(sign | h);
}

static inline float pto_f16_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) {
        return pto_bits_f32(sign | 0x7f800000u | (m << 13));
    }
    if (e == 0) { /* zero or a subnormal: m units of 2^-24, exact in f32 */
        const float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return pto_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* fp8 E4M3 (the "fn" variant: no infinities; 0x7f and 0xff are NaN) -> f32, exact */
static inline float pto_e4m3_f32(uint8_t b)
{
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 0xfu && m == 7u) {
        return pto_bits_f32(sign | 0x7fc00000u);
    }
    if (e == 0) { /* zero or a subnormal: m units of 2^-9 */
        const float v = (float)m * 0.001953125f;
        return sign ? -v : v;
    }
    return pto_bits_f32(sign | ((e + 120) << 23) | (m << 20));
}

/* little-endian fields of a quantized row, read at any alignment */
static inline uint16_t pto_ld_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

/* a quantized row's f16 scale as f32 (exact): the F16C instruction where the machine has it
 * (a quarter of a Q4 dot product's time went to the portable conversion) */
static inline float pto_ld_f16(const uint8_t *p)
{
#ifdef __F16C__
    return _cvtsh_ss(pto_ld_u16(p));
#else
    return pto_f16_f32(pto_ld_u16(p));
#endif
}

static inline float pto_ld_f32(const uint8_t *p)
{
    return pto_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* An f32 value rounded to the half types (the value a tile of that dtype holds). */
static inline float pto_r_bf16(float x)
{
    return pto_bf16_f32(pto_bf16_of(x));
}

static inline float pto_r_f16(float x)
{
    return pto_f16_f32(pto_f16_of(x));
}

/* ---------------------------------------------------------------------------------------
 * scalars
 * ------------------------------------------------------------------------------------- */

/* The trip count of `for (v = lb; v < ub; v += st)` as the evaluator counts it (a step of
 * 0 runs nothing). */
static inline int64_t pto_trips(int64_t lb, int64_t ub, int64_t st)
{
    const int64_t n = pto_fdiv(ub - lb + st - 1, st);
    return n > 0 ? n : 0;
}

/* An f32 holding an integer as int64_t (truncated; NaN 0, beyond the range saturated: C
 * leaves those conversions undefined). */
static inline int64_t pto_f32_int64(float v)
{
    if (v != v) {
        return 0;
    }
    if (v >= 9.2233720368547758e18f) {
        return INT64_MAX;
    }
    if (v <= -9.2233720368547758e18f) {
        return INT64_MIN;
    }
    return (int64_t)v;
}

/* The element (r, c) of a region, as an offset from its origin, clamped into the tensor
 * (row-major, rows ld apart) as the evaluator clamps a scalar load. */
static inline int64_t pto_clamp_flat(const pto_region *m, int64_t r, int64_t c)
{
    const int64_t at = (m->row0 + r) * m->ld + m->col0 + c, last = (m->trows - 1) * m->ld + m->tcols - 1;
    return (at < 0 ? 0 : at > last ? last : at) - (m->row0 * m->ld + m->col0);
}

/* ---------------------------------------------------------------------------------------
 * elementwise functions
 * ------------------------------------------------------------------------------------- */

#ifdef FP_FAST_FMA
#define PTO_FMA(a, b, c) fma(a, b, c)
#else
#define PTO_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* e^r 2^k in double for |r| <= ln2 / 2 and k in [-1022, 1024] (1024: infinity), k given as k + 1.5 * 2^52 (the
 * integer in the low mantissa bits), branch-free so that loops over it vectorize: e^r by its
 * Taylor series to r^13 (truncation below 2^-57), 2^k built in the exponent bits (the low 12
 * bits of kshift's bits are k's: the 1.5 * 2^52 adds none there). */
static inline double pto_exp_scaled(double r, double kshift)
{
    double p = 1.0 / 6227020800.0, scale;
    uint64_t kb;
    p = PTO_FMA(p, r, 1.0 / 479001600.0);
    p = PTO_FMA(p, r, 1.0 / 39916800.0);
    p = PTO_FMA(p, r, 1.0 / 3628800.0);
    p = PTO_FMA(p, r, 1.0 / 362880.0);
    p = PTO_FMA(p, r, 1.0 / 40320.0);
    p = PTO_FMA(p, r, 1.0 / 5040.0);
    p = PTO_FMA(p, r, 1.0 / 720.0);
    p = PTO_FMA(p, r, 1.0 / 120.0);
    p = PTO_FMA(p, r, 1.0 / 24.0);
    p = PTO_FMA(p, r, 1.0 / 6.0);
    p = PTO_FMA(p, r, 0.5);
    p = PTO_FMA(p, r, 1.0);
    p = PTO_FMA(p, r, 1.0);
    memcpy(&kb, &kshift, sizeof kb);
    kb = (kb + 1023u) << 52;
    memcpy(&scale, &kb, sizeof scale);
    return p * scale;
}

/* adding 1.5 * 2^52 rounds a double of magnitude below 2^51 to an integer */
#define PTO_ROUND_SHIFT 6755399441055744.0

/* e^x in double for x in [-708, 709] (beyond, a meaningless value: callers clamp or replace
 * it); x = k ln2 + r, ln2 in two parts so that r is exact to about 2^-60; NaN stays NaN. */
static inline double pto_exp_core(double x)
{
    const double kd = x * 1.4426950408889634 + PTO_ROUND_SHIFT;
    double r = x - (kd - PTO_ROUND_SHIFT) * 6.93147180369123816490e-01; /* ln2's high part: exact product */
    r = r - (kd - PTO_ROUND_SHIFT) * 1.90821492927058770002e-10;
    return pto_exp_scaled(r, kd);
}

/* e^x in double, x clamped to [-708, 710] (below, e^x leaves 1 + e^x at 1 in silu; at 710,
 * k = 1024 makes the scale infinite, as e^x overflows from 709.79 on, so silu(-inf) is
 * -inf / inf = NaN as in torch). Comparisons with NaN are false: the clamps keep it. */
static inline double pto_exp_d(double x)
{
    x = x < -708.0 ? -708.0 : x;
    x = x > 710.0 ? 710.0 : x;
    return pto_exp_core(x);
}

#ifdef FP_FAST_FMAF
#define PTO_FMAF(a, b, c) fmaf(a, b, c)
#else
#define PTO_FMAF(a, b, c) ((a) * (b) + (c))
#endif

/* 2^k for an integer k in [-252, 254] as two normal factors (the second multiplication rounds
 * a subnormal result once) applied to p */
static inline float pto_scale2f(float p, int32_t k)
{
    const int32_t k1 = k / 2, k2 = k - k1;
    return (p * pto_bits_f32((uint32_t)(k1 + 127) << 23)) * pto_bits_f32((uint32_t)(k2 + 127) << 23);
}

/* e^r for |r| <= ln2 / 2 in f32 as 1 + (r + r^2 q(r)), q the Taylor series to r^5 / 720 (the
 * term after, r^8 / 8!, is below 0.1 ulp): the only rounding that matters is the last addition,
 * so the result is within about 0.6 ulp */
static inline float pto_expm_r(float r)
{
    float q = 1.0f / 5040.0f;
    q = PTO_FMAF(q, r, 1.0f / 720.0f);
    q = PTO_FMAF(q, r, 1.0f / 120.0f);
    q = PTO_FMAF(q, r, 1.0f / 24.0f);
    q = PTO_FMAF(q, r, 1.0f / 6.0f);
    q = PTO_FMAF(q, r, 0.5f);
    return 1.0f + PTO_FMAF(r * r, q, r);
}

/* adding 1.5 * 2^23 rounds an f32 of magnitude below 2^22 to an integer */
#define PTO_ROUND_SHIFTF 12582912.0f

/* e^x of an f32 in f32, within about 0.6 ulp of the correctly rounded value (the evaluator
 * rounds a double-precision exp): x = k ln2 + r, ln2 in two parts (k times the first is exact);
 * x clamped to [-104, 89], where e^x is already 0 or infinity in f32. Branch-free (loops over
 * it vectorize), NaN stays NaN. */
static inline float pto_expf(float x)
{
    float kf, r;
    x = x < -104.0f ? -104.0f : x;
    x = x > 89.0f ? 89.0f : x;
    kf = (x * 1.44269504088896341f + PTO_ROUND_SHIFTF) - PTO_ROUND_SHIFTF;
    r = PTO_FMAF(kf, -0.693145751953125f, x);
    r = PTO_FMAF(kf, -1.42860682030941723e-06f, r);
    return pto_scale2f(pto_expm_r(r), (int32_t)kf);
}

/* 2^x = 2^k e^((x - k) ln2) with k = round(x) (x - k is exact; its product with ln2 rounds
 * by 0.2 ulp of the result at most) */
static inline float pto_exp2f(float x)
{
    float kf;
    x = x < -151.0f ? -151.0f : x;
    x = x > 129.0f ? 129.0f : x;
    kf = (x + PTO_ROUND_SHIFTF) - PTO_ROUND_SHIFTF;
    return pto_scale2f(pto_expm_r((x - kf) * 0.693147180559945309f), (int32_t)kf);
}

static inline float pto_logf(float x)
{
    return (float)log((double)x);
}

/* torch's silu in double: x / (1 + e^-x) */
static inline float pto_siluf(float x)
{
    const double d = (double)x;
    return (float)(d / (1.0 + pto_exp_d(-d)));
}

static inline float pto_rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}

/* NaN-propagating maximum and minimum (torch.maximum / minimum); a tie (+0 and -0) gives b */
static inline float pto_maxf(float a, float b)
{
    return ((a > b) | (a != a)) ? a : b;
}

static inline float pto_minf(float a, float b)
{
    return ((a < b) | (a != a)) ? a : b;
}

/* torch.relu: negative numbers become +0; -0 and NaN stay */
static inline float pto_reluf(float x)
{
    return x < 0.0f ? 0.0f : x;
}

/* ---------------------------------------------------------------------------------------
 * vectors: GCC's vector extensions (GCC, Clang) at the machine's width, one lane elsewhere
 * ------------------------------------------------------------------------------------- */

#if (defined(__GNUC__) || defined(__clang__)) && !defined(PTO_NO_VECTOR_EXTENSIONS)
#define PTO_VECTORS 1
#if defined(__AVX512F__)
#define PTO_VW 16 /* floats per vector */
#define PTO_MR 8  /* rows of a matrix product's register block */
#elif defined(__AVX__)
#define PTO_VW 8
#define PTO_MR 4
#else
#define PTO_VW 4
#define PTO_MR 4
#endif
typedef float pto_vf __attribute__((vector_size(PTO_VW * 4)));
typedef int32_t pto_vi __attribute__((vector_size(PTO_VW * 4)));

static inline pto_vf pto_vload(const float *p)
{
    pto_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void pto_vstore(float *p, pto_vf v)
{
    memcpy(p, &v, sizeof v);
}

static inline pto_vf pto_vsplat(float x)
{
    pto_vf v = {0};
    return v + x;
}

/* lane-wise pto_maxf / pto_minf: a compare mask selects the bits */
static inline pto_vf pto_vmax(pto_vf a, pto_vf b)
{
    const pto_vi m = (a > b) | (a != a);
    return (pto_vf)((m & (pto_vi)a) | (~m & (pto_vi)b));
}

static inline pto_vf pto_vmin(pto_vf a, pto_vf b)
{
    const pto_vi m = (a < b) | (a != a);
    return (pto_vf)((m & (pto_vi)a) | (~m & (pto_vi)b));
}

/* Across a vector's lanes: folded in halves, lane l with lane l ^ w for w = VW/2 .. 1, with
 * the compilers' lane shuffle where they have it (clang, GCC 12), through memory elsewhere. */
#if defined(__clang__) || __GNUC__ >= 12
#if PTO_VW == 16
#define PTO_XOR8(v) __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)
#define PTO_XOR4(v) __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11)
#define PTO_XOR2(v) __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13)
#define PTO_XOR1(v) __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14)
#define PTO_FOLD(v, op) (v = op(v, PTO_XOR8(v)), v = op(v, PTO_XOR4(v)), v = op(v, PTO_XOR2(v)), op(v, PTO_XOR1(v))[0])
#elif PTO_VW == 8
#define PTO_XOR4(v) __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3)
#define PTO_XOR2(v) __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5)
#define PTO_XOR1(v) __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6)
#define PTO_FOLD(v, op) (v = op(v, PTO_XOR4(v)), v = op(v, PTO_XOR2(v)), op(v, PTO_XOR1(v))[0])
#else
#define PTO_XOR2(v) __builtin_shufflevector(v, v, 2, 3, 0, 1)
#define PTO_XOR1(v) __builtin_shufflevector(v, v, 1, 0, 3, 2)
#define PTO_FOLD(v, op) (v = op(v, PTO_XOR2(v)), op(v, PTO_XOR1(v))[0])
#endif
#endif

static inline pto_vf pto_vadd(pto_vf a, pto_vf b)
{
    return a + b;
}

static inline float pto_vsum(pto_vf v)
{
#ifdef PTO_FOLD
    return PTO_FOLD(v, pto_vadd);
#else
    float lanes[PTO_VW];
    int l, w;
    memcpy(lanes, &v, sizeof lanes);
    for (w = PTO_VW / 2; w >= 1; w /= 2) {
        for (l = 0; l < w; l++) {
            lanes[l] += lanes[l + w];
        }
    }
    return lanes[0];
#endif
}

/* PTO_VW bytes widened to int32 lanes, unsigned or signed: the vector form of a quantized
 * format's dot product (pto/codegen/c_quant.py; its int -> float conversion needs
 * __builtin_convertvector). A loop the compilers vectorize (one widening load): GCC 12 makes
 * __builtin_convertvector of a byte vector a lane-by-lane insert, three times slower. */
#if defined(__clang__) || __GNUC__ >= 9
#define PTO_DQ_VECTORS 1
#endif

static inline pto_vi pto_vwiden_u8(const uint8_t *p)
{
    int32_t lanes[PTO_VW];
    pto_vi v;
    int l;
    for (l = 0; l < PTO_VW; l++) {
        lanes[l] = p[l];
    }
    memcpy(&v, lanes, sizeof v);
    return v;
}

static inline pto_vi pto_vwiden_i8(const uint8_t *p)
{
    int32_t lanes[PTO_VW];
    pto_vi v;
    int l;
    for (l = 0; l < PTO_VW; l++) {
        lanes[l] = (int8_t)p[l];
    }
    memcpy(&v, lanes, sizeof v);
    return v;
}

/* the largest (smallest) lane, NaN if one is */
static inline float pto_vfold_extreme(pto_vf v, int largest)
{
#ifdef PTO_FOLD
    return largest ? PTO_FOLD(v, pto_vmax) : PTO_FOLD(v, pto_vmin);
#else
    float lanes[PTO_VW], m;
    int l;
    memcpy(lanes, &v, sizeof lanes);
    for (m = lanes[0], l = 1; l < PTO_VW; l++) {
        m = largest ? pto_maxf(lanes[l], m) : pto_minf(lanes[l], m);
    }
    return m;
#endif
}
#else
#define PTO_VW 1
#define PTO_MR 1
#endif

/* ---------------------------------------------------------------------------------------
 * reductions along a row (n contiguous values); columns reduce lane-wise in generated loops
 * ------------------------------------------------------------------------------------- */

/* lane partial sums (vectors where the compiler has them), folded in halves */
static inline float pto_row_sum(const float *x, int64_t n)
{
    const int64_t nb = n - n % PTO_VW;
    float s;
    int64_t j;
#ifdef PTO_VECTORS
    pto_vf acc = pto_vsplat(0.0f);
    for (j = 0; j < nb; j += PTO_VW) {
        acc += pto_vload(x + j);
    }
    s = pto_vsum(acc);
#else
    for (s = 0.0f, j = 0; j < nb; j++) {
        s += x[j];
    }
#endif
    for (j = nb; j < n; j++) {
        s += x[j];
    }
    return s;
}

/* the row's largest (`largest`) or smallest value, NaN if it holds one: vector lanes, then
 * across them (the flag is a constant where it is inlined) */
static inline float pto_row_extreme(const float *x, int64_t n, int largest)
{
    const int64_t nb = n - n % PTO_VW;
    float m = largest ? -INFINITY : INFINITY;
    int64_t j;
#ifdef PTO_VECTORS
    pto_vf acc = pto_vsplat(m);
    for (j = 0; j < nb; j += PTO_VW) {
        acc = largest ? pto_vmax(pto_vload(x + j), acc) : pto_vmin(pto_vload(x + j), acc);
    }
    m = pto_vfold_extreme(acc, largest);
#else
    for (j = 0; j < nb; j++) {
        m = largest ? pto_maxf(x[j], m) : pto_minf(x[j], m);
    }
#endif
    for (j = nb; j < n; j++) {
        m = largest ? pto_maxf(x[j], m) : pto_minf(x[j], m);
    }
    return m;
}

static inline float pto_row_max(const float *x, int64_t n)
{
    return pto_row_extreme(x, n, 1);
}

static inline float pto_row_min(const float *x, int64_t n)
{
    return pto_row_extreme(x, n, 0);
}

/* The column of the row's largest value, the first of equal ones; a NaN counts as the
 * largest (torch.argmax). */
static inline int64_t pto_row_argmax(const float *x, int64_t n)
{
    int64_t j, at = 0;
    float best = x[0];
    for (j = 1; j < n && best == best; j++) {
        if (x[j] > best || x[j] != x[j]) {
            best = x[j];
            at = j;
        }
    }
    return at;
}

/* ---------------------------------------------------------------------------------------
 * matrix products: c[M x N] (row stride ldc) += a @ b, a(i, k) = a[i*sai + k*sak],
 * b(k, j) = b[k*sbk + j*sbn]; f32 products summed in f32
 * ------------------------------------------------------------------------------------- */

#ifdef PTO_VECTORS
/* PTO_MR rows x 2 vectors of c, b's rows contiguous: the accumulators stay in registers */
static inline void pto_mm_block(int64_t K, const float *a, int64_t sai, int64_t sak, const float *b, int64_t sbk,
                                float *c, int64_t ldc)
{
    pto_vf acc[PTO_MR][2];
    int64_t k;
    int r;
    for (r = 0; r < PTO_MR; r++) {
        acc[r][0] = pto_vload(c + r * ldc);
        acc[r][1] = pto_vload(c + r * ldc + PTO_VW);
    }
    for (k = 0; k < K; k++) {
        const pto_vf b0 = pto_vload(b + k * sbk), b1 = pto_vload(b + k * sbk + PTO_VW);
        for (r = 0; r < PTO_MR; r++) {
            const float av = a[r * sai + k * sak];
            acc[r][0] += av * b0;
            acc[r][1] += av * b1;
        }
    }
    for (r = 0; r < PTO_MR; r++) {
        pto_vstore(c + r * ldc, acc[r][0]);
        pto_vstore(c + r * ldc + PTO_VW, acc[r][1]);
    }
}

/* one row x 2 vectors */
static inline void pto_mm_row(int64_t K, const float *a, int64_t sak, const float *b, int64_t sbk, float *c)
{
    pto_vf acc0 = pto_vload(c), acc1 = pto_vload(c + PTO_VW);
    int64_t k;
    for (k = 0; k < K; k++) {
        const float av = a[k * sak];
        acc0 += av * pto_vload(b + k * sbk);
        acc1 += av * pto_vload(b + k * sbk + PTO_VW);
    }
    pto_vstore(c, acc0);
    pto_vstore(c + PTO_VW, acc1);
}

/* c[0], c[sc], c[2 sc], c[3 sc] += a . b_j for four rows b_j, ldb apart, of contiguous k (a dot
 * product per output: a row against a weight stored output-major) */
static inline void pto_dot4(int64_t K, const float *a, const float *b, int64_t ldb, float *c, int64_t sc)
{
    const int64_t kb = K - K % PTO_VW;
    pto_vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t k;
    float t0, t1, t2, t3;
    for (k = 0; k < kb; k += PTO_VW) {
        const pto_vf av = pto_vload(a + k);
        s0 += av * pto_vload(b + k);
        s1 += av * pto_vload(b + ldb + k);
        s2 += av * pto_vload(b + 2 * ldb + k);
        s3 += av * pto_vload(b + 3 * ldb + k);
    }
    t0 = pto_vsum(s0);
    t1 = pto_vsum(s1);
    t2 = pto_vsum(s2);
    t3 = pto_vsum(s3);
    for (k = kb; k < K; k++) {
        t0 += a[k] * b[k];
        t1 += a[k] * b[ldb + k];
        t2 += a[k] * b[2 * ldb + k];
        t3 += a[k] * b[3 * ldb + k];
    }
    c[0] += t0;
    c[sc] += t1;
    c[2 * sc] += t2;
    c[3 * sc] += t3;
}

static inline float pto_dot(int64_t K, const float *a, const float *b)
{
    const int64_t kb = K - K % PTO_VW;
    pto_vf s = {0};
    int64_t k;
    float t;
    for (k = 0; k < kb; k += PTO_VW) {
        s += pto_vload(a + k) * pto_vload(b + k);
    }
    for (t = pto_vsum(s), k = kb; k < K; k++) {
        t += a[k] * b[k];
    }
    return t;
}
#else
static inline void pto_mm_block(int64_t K, const float *a, int64_t sai, int64_t sak, const float *b, int64_t sbk,
                                float *c, int64_t ldc)
{
    int64_t k;
    (void)sai;
    (void)ldc;
    for (k = 0; k < K; k++) {
        c[0] += a[k * sak] * b[k * sbk];
        c[1] += a[k * sak] * b[k * sbk + 1];
    }
}

static inline void pto_mm_row(int64_t K, const float *a, int64_t sak, const float *b, int64_t sbk, float *c)
{
    pto_mm_block(K, a, 0, sak, b, sbk, c, 0);
}

static inline float pto_dot(int64_t K, const float *a, const float *b)
{
    int64_t k;
    float t = 0.0f;
    for (k = 0; k < K; k++) {
        t += a[k] * b[k];
    }
    return t;
}

static inline void pto_dot4(int64_t K, const float *a, const float *b, int64_t ldb, float *c, int64_t sc)
{
    c[0] += pto_dot(K, a, b);
    c[sc] += pto_dot(K, a, b + ldb);
    c[2 * sc] += pto_dot(K, a, b + 2 * ldb);
    c[3 * sc] += pto_dot(K, a, b + 3 * ldb);
}
#endif

/* b's rows contiguous (sbn == 1): register blocks of PTO_MR rows x 2 vectors, the edges
 * by plain loops */
static inline void pto_mm_nn(int64_t M, int64_t N, int64_t K, const float *a, int64_t sai, int64_t sak,
                             const float *b, int64_t sbk, float *c, int64_t ldc)
{
    const int64_t nb = N - N % (2 * PTO_VW), mb = M - M % PTO_MR;
    int64_t i, j, k;
    for (i = 0; i < mb; i += PTO_MR) {
        for (j = 0; j < nb; j += 2 * PTO_VW) {
            pto_mm_block(K, a + i * sai, sai, sak, b + j, sbk, c + i * ldc + j, ldc);
        }
    }
    for (i = mb; i < M; i++) {
        for (j = 0; j < nb; j += 2 * PTO_VW) {
            pto_mm_row(K, a + i * sai, sak, b + j, sbk, c + i * ldc + j);
        }
    }
    if (nb < N) {
        for (i = 0; i < M; i++) {
            for (k = 0; k < K; k++) {
                const float av = a[i * sai + k * sak];
                for (j = nb; j < N; j++) {
                    c[i * ldc + j] += av * b[k * sbk + j];
                }
            }
        }
    }
}

/* a's rows and b's columns contiguous (sak == 1, sbk == 1): c(i, j) += a_i . b_j, a row at a
 * time over every b_j (the row's vectors stay in registers, b comes from cache after the first
 * row: faster than blocks of rows by columns up to 4 rows, within 10% at 16) */
static inline void pto_mm_dot(int64_t M, int64_t N, int64_t K, const float *a, int64_t sai, const float *b,
                              int64_t sbn, float *c, int64_t ldc)
{
    int64_t i, j;
    const int64_t nb = N - N % 4;
    for (i = 0; i < M; i++) {
        for (j = 0; j < nb; j += 4) {
            pto_dot4(K, a + i * sai, b + j * sbn, sbn, c + i * ldc + j, 1);
        }
        for (j = nb; j < N; j++) {
            c[i * ldc + j] += pto_dot(K, a + i * sai, b + j * sbn);
        }
    }
}

/* x[0 .. k) of a GEMV against quantized weights prepared for their dot products
 * (pto_dqdot_<format>, pto/codegen/c_quant.py): within each group of g elements, read in units
 * of u, lane-major (xp[l g/u + v] = x[v u + l]: a lane's elements contiguous) */
static inline void pto_dq_prep(const float *x, int64_t k, int64_t g, int64_t u, float *xp)
{
    const int64_t units = g / u;
    int64_t g0, l, v;
    for (g0 = 0; g0 < k; g0 += g) {
        for (l = 0; l < u; l++) {
            for (v = 0; v < units; v++) {
                xp[g0 + l * units + v] = x[g0 + v * u + l];
            }
        }
    }
}

/* up to this many rows a product against a transposed b takes dot products (a GEMV's: each row of
 * b read once for all of them; packing b costs more than their products); from more, b is packed
 * row-major and the blocks run (pto/ir/analysis.py's DOT_ROWS) */
enum { PTO_DOT_ROWS = 16 };

/* c += a @ b for any strides (`pack`: room for K * N floats where b is transposed and M >
 * PTO_DOT_ROWS, M * K where a is too and M <= PTO_DOT_ROWS: pto/codegen/c_tileops.py reserves it).
 * b's rows contiguous: register blocks; b transposed (its columns contiguous): packed row-major
 * first, or for a few rows dot products (a's rows gathered contiguous first where a is transposed
 * too). */
static inline void pto_matmul(int64_t M, int64_t N, int64_t K, const float *a, int64_t sai, int64_t sak,
                              const float *b, int64_t sbk, int64_t sbn, float *c, int64_t ldc, float *pack)
{
    int64_t i, j, k;
    if (sbn == 1) {
        pto_mm_nn(M, N, K, a, sai, sak, b, sbk, c, ldc);
        return;
    }
    if (sbk == 1 && M > PTO_DOT_ROWS) {
        for (j = 0; j < N; j++) {
            for (k = 0; k < K; k++) {
                pack[k * N + j] = b[j * sbn + k];
            }
        }
        pto_mm_nn(M, N, K, a, sai, sak, pack, N, c, ldc);
        return;
    }
    if (sbk == 1) {
        if (sak != 1) {
            for (i = 0; i < M; i++) {
                for (k = 0; k < K; k++) {
                    pack[i * K + k] = a[i * sai + k * sak];
                }
            }
            a = pack;
            sai = K;
        }
        pto_mm_dot(M, N, K, a, sai, b, sbn, c, ldc);
        return;
    }
    for (i = 0; i < M; i++) { /* no operand contiguous (no tile of pto's is so): plain loops */
        for (j = 0; j < N; j++) {
            float s = 0.0f;
            for (k = 0; k < K; k++) {
                s += a[i * sai + k * sak] * b[k * sbk + j * sbn];
            }
            c[i * ldc + j] += s;
        }
    }
}

#endif /* PTO_TILE_H */
