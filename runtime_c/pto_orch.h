/* pto_orch.h - helpers that generated orchestration C uses: the scalar-expression semantics of
 * the IR (floor division and modulo, min/max) and the block functions of binary loop expansion.
 *
 * Plain C99, header-only (static inline), so a generated .c file plus pto_runtime.{h,c} and this
 * header build with any C99 compiler. The Python definitions these must agree with are in
 * pto/ir/expr.py (bx_blocks, bx_count, bx_start, bx_size); tests compare the two.
 */
#ifndef PTO_ORCH_H
#define PTO_ORCH_H

#include <stdint.h>

/* Python semantics: the quotient rounds toward minus infinity, the remainder has the sign of
 * the divisor. Division by zero yields 0 (the IR refuses constant zero divisors; a run-time
 * zero is a program bug that must not crash the graph build). A divisor of -1 is a negation:
 * C's INT64_MIN / -1 and INT64_MIN % -1 are undefined (x86 traps), so the one quotient that
 * does not fit, 2^63, wraps to INT64_MIN and the remainder is 0. */
static inline int64_t pto_fdiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0u - (uint64_t)a);
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

static inline int64_t pto_fmod(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static inline int64_t pto_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t pto_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Binary expansion of n base tiles into blocks: n / max_range full blocks of max_range, then
 * one block per set bit p of the remainder with min_range <= p < max_range (descending), then
 * one residual block of the remainder's low bits (< min_range), which runs with the base tile
 * height. max_range and min_range are powers of two. */
static inline int64_t pto_popcount64(int64_t v) {
    int64_t c = 0;
    uint64_t u = (uint64_t)v;
    while (u) {
        u &= u - 1;
        c++;
    }
    return c;
}

static inline int64_t pto_bx_count(int64_t n, int64_t max_range, int64_t min_range) {
    if (n <= 0 || max_range <= 0 || min_range <= 0) return 0;
    int64_t r = n % max_range;
    return n / max_range + pto_popcount64(r / min_range) + (r % min_range ? 1 : 0);
}

/* Start (in base tiles, from the loop's lower bound) and size of block k. */
static inline void pto_bx_block(int64_t n, int64_t k, int64_t max_range, int64_t min_range,
                                int64_t *start, int64_t *size) {
    int64_t nfull = n / max_range;
    if (k < nfull) {
        *start = k * max_range;
        *size = max_range;
        return;
    }
    int64_t pos = nfull * max_range;
    int64_t r = n % max_range;
    int64_t idx = nfull;
    for (int64_t p = max_range / 2; p >= min_range; p /= 2) {
        if (r & p) {
            if (idx == k) {
                *start = pos;
                *size = p;
                return;
            }
            pos += p;
            idx++;
        }
    }
    *start = pos;
    *size = r % min_range;
}

static inline int64_t pto_bx_start(int64_t n, int64_t k, int64_t max_range, int64_t min_range) {
    int64_t s, z;
    pto_bx_block(n, k, max_range, min_range, &s, &z);
    return s;
}

static inline int64_t pto_bx_size(int64_t n, int64_t k, int64_t max_range, int64_t min_range) {
    int64_t s, z;
    pto_bx_block(n, k, max_range, min_range, &s, &z);
    return z;
}

#endif /* PTO_ORCH_H */
