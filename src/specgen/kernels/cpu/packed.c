/* The packed product's entry point: y[M, N] = x[M, K] W^T shared out among OpenMP threads,
 * each running the build's own kernel over whole tiles of columns. Which kernel: fp32
 * activations in 16 lanes (f32x16.c, AVX-512) or 8 lanes / portable C (f32x8.c). A result
 * never depends on the split: each kernel computes an output in one fixed order. */
#include <stdint.h>
#include <omp.h>

#include "packed.h"

#define COLS 4 /* columns per tile: every kernel's share is whole tiles */

/* the vector width of this build's fp32 products: which code path runs (tests build each) */
int packed_lanes(void) {
#if defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__) && defined(__FMA__)
    return 8;
#else
    return 1;
#endif
}

int packed_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows) {
#ifdef __AVX512F__
    return wide_columns(x, M, K, w, bits, scale, mins, half, group, xs, n0, n1, y, ldy,
                        direct_rows);
#else
    return narrow_columns(x, M, K, w, bits, scale, mins, half, group, xs, n0, n1, y, ldy,
                          direct_rows);
#endif
}

/* y[M, N] = x[M, K] W^T. bits 4 (w: uint8 [N, K/2]) or 8 (w: int8 [N, K]); scale and mins:
 * [N, K/group] of fp32, or fp16 when `half`, mins NULL for symmetric formats; group: 16 (8
 * bits only) or a multiple of 32; K a multiple of 32 and of group; xs: scratch of M *
 * K/group floats; direct_rows: up to this many rows take the direct path (the caller's
 * choice, so that both paths can be timed and tested on the same input). Returns 0, or -1
 * when scratch memory could not be had. */
int packed_linear(const float *x, int64_t M, int64_t K, const void *w, int bits,
                  const void *scale, const void *mins, int half, int64_t N, int64_t group,
                  float *y, float *xs, int nthreads, int64_t direct_rows) {
    int failed = 0;
    if (mins) group_sums(x, M, K, group, xs);
    /* whole tiles of COLS columns per thread, in order: the split never changes a result */
    int64_t tiles = (N + COLS - 1) / COLS;
#pragma omp parallel num_threads(nthreads)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t per = (tiles + nt - 1) / nt, t0 = id * per, t1 = t0 + per < tiles ? t0 + per : tiles;
        if (t0 < t1 && packed_columns(x, M, K, w, bits, scale, mins, half, group, xs, t0 * COLS,
                                      t1 * COLS < N ? t1 * COLS : N, y, N, direct_rows)) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed ? -1 : 0;
}
