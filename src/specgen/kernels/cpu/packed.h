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
