/* What packed.c shares with the fused decoder step (decoder.c). */
#pragma once
#include <stdint.h>

/* xs[r * K/group + g]: the sum of row r of x over group g, in one fixed order */
void group_sums(const float *x, int64_t M, int64_t K, int64_t group, float *xs);

/* columns [n0, n1) of y = x W^T on the calling thread (y[r * ldy + n]); scales and
 * minimums fp32, or fp16 when `half`; -1: out of memory */
int packed_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);

/* sum_g mins[g] xs[g] in one fixed order (0 when mins is NULL) */
float packed_offsets(const float *mins, int64_t groups, const float *xs);

/* rows [row, row + rows) of a [*, count] table of scales as fp32: `table` itself, or
 * widened from fp16 into buf; NULL for a NULL table */
const float *packed_scales(const void *table, int half, int64_t row, int64_t rows,
                           int64_t count, float *buf);

/* packed_columns with 16-lane vectors (packed_wide.c): what it runs where the compiler
 * targets AVX-512 */
int wide_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                 const void *scale, const void *mins, int half, int64_t group, const float *xs,
                 int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
