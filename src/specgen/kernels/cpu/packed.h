/* The CPU kernels' shared declarations: the product driver (packed.c), its kernels (fp32
 * activations: f32x8.c, f32x16.c; 8-bit activations: q8.c, q8x8.c, q8x16.c), the helpers
 * they all use (common.c), and what the fused decoder pass (decoder.c) calls. */
#pragma once
#include <stdint.h>

/* ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): 8 lanes summed by one fixed tree */
static inline float lanes_sum8(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* ---- common.c ---- */
/* n fp16 values widened to fp32 (exact) */
void widen(const uint16_t *h, int64_t n, float *out);

/* rows [row, row + rows) of a [*, count] table of scales as fp32: `table` itself, or
 * widened from fp16 into buf; NULL for a NULL table */
const float *packed_scales(const void *table, int half, int64_t row, int64_t rows,
                           int64_t count, float *buf);

/* xs[r * K/group + g]: the sum of row r of x over group g, in one fixed order */
void group_sums(const float *x, int64_t M, int64_t K, int64_t group, float *xs);

/* ---- fp32 activations ---- */
/* columns [n0, n1) of y = x W^T on the calling thread (y[r * ldy + n]); scales and
 * minimums fp32, or fp16 when `half`; xs: x's group sums when W has minimums; -1: out of
 * memory. packed.c's: the build's own kernel below. */
int packed_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
/* 16 lanes (f32x16.c: AVX-512 builds only) */
int wide_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                 const void *scale, const void *mins, int half, int64_t group, const float *xs,
                 int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
/* 8 lanes or portable C (f32x8.c) */
int narrow_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
/* sum_g mins[g] xs[g] in one fixed order (0 when mins is NULL) */
float packed_offsets(const float *mins, int64_t groups, const float *xs);
