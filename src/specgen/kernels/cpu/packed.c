/* The packed product's entry point: y[M, N] = x[M, K] W^T shared out among OpenMP threads,
 * each running the build's own kernel over whole tiles of columns. Which kernel: fp32
 * activations in 16 lanes (f32x16.c, AVX-512) or 8 lanes / portable C (f32x8.c), or 8-bit
 * activations (q8.c). A result never depends on the split: each kernel computes an output
 * in one fixed order. */
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>

#include "packed.h"

#define COLS 4     /* columns per tile of the fp32 kernels: a thread's share is whole tiles */
#define Q8_COLS 16 /* and of the 8-bit ones (their widest panel) */

/* the vector width of this build's fp32 products: which code path runs (tests build each) */
int packed_lanes(void) {
#if defined(WIDE)
    return 16;
#elif defined(SIMD8)
    return 8;
#else
    return 1;
#endif
}

int packed_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows) {
#ifdef WIDE
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
 * K/group floats; direct_rows: up to this many rows take the direct path of the fp32
 * kernels (the caller's choice, so that both paths can be timed and tested on the same
 * input); act: ACT_F32 or ACT_Q8, x as it is or quantized per row (packed.h). Returns 0, or
 * -1 when scratch memory could not be had. */
int packed_linear(const float *x, int64_t M, int64_t K, const void *w, int bits,
                  const void *scale, const void *mins, int half, int64_t N, int64_t group,
                  float *y, float *xs, int nthreads, int64_t direct_rows, int act) {
    int failed = 0;
    Q8Rows q8;
    void *buf = NULL;
    if (act != ACT_F32) { /* each row quantized once, for every thread's columns */
        buf = malloc(q8_bytes(M, K));
        if (!buf) return -1;
        q8_rows(x, M, K, buf, &q8);
    } else if (mins)
        group_sums(x, M, K, group, xs);
    /* whole tiles per thread, in order: the split never changes a result */
    int64_t unit = act != ACT_F32 ? Q8_COLS : COLS, tiles = (N + unit - 1) / unit;
#pragma omp parallel num_threads(nthreads)
    {
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t per = (tiles + nt - 1) / nt, t0 = id * per, t1 = t0 + per < tiles ? t0 + per : tiles;
        int64_t a = t0 * unit, b = t1 * unit < N ? t1 * unit : N, bad = 0;
        if (t0 < t1)
            bad = act != ACT_F32
                      ? q8_columns(&q8, w, bits, scale, mins, half, group, a, b, y, N, NULL,
                                   act == ACT_Q8_PORTABLE)
                      : packed_columns(x, M, K, w, bits, scale, mins, half, group, xs, a, b, y,
                                       N, direct_rows);
        if (bad) {
#pragma omp atomic write
            failed = 1;
        }
    }
    free(buf);
    return failed ? -1 : 0;
}
