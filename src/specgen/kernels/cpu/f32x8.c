/* Packed-weight products with fp32 activations in 8 lanes (AVX2) or portable C: what
 * packed_columns runs in a build without AVX-512. y[M, N] = x[M, K] W^T with W held as 4-
 * or 8-bit integers in groups, never dequantized into memory as a whole.
 *
 * Each weight is w = s_g q + m_g for the scale s_g and offset m_g of its group (m_g = 0 for
 * symmetric formats). The product is computed blockwise:
 *     y = sum_blocks s_b * (sum_{k in b} q_k x_k)  +  sum_g m_g * (sum of x over group g)
 * with blocks of 32 columns (16 when the group is 16), which is the dequantized matrix's
 * product up to fp32 summation order.
 *
 * Batch invariance: output (r, n) is always the same arithmetic: 8 lanes; per block, one
 * product and then fused multiply-adds in column order into a block sum t, then acc =
 * fma(t, s_b, acc); at the end a fixed tree over the lanes, then the offsets in group order.
 * Neither M, nor the tiling, nor the thread changes it, so a verify block's rows equal
 * one-row decode steps bit for bit. The AVX2 and portable paths compute exactly this; no
 * -ffast-math (the compiler may not reorder sums).
 *
 * Q4 layout (GGUF's Q4_0/Q4_1): per 32 columns, 16 bytes; column j < 16 is the low nibble of
 * byte j, column j + 16 its high nibble. Q8: one int8 per column.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packed.h"

#define LANES 8
#define COLS 4 /* output columns per tile */
#define KC 512 /* columns of K unpacked at a time by the many-row path */

#if defined(__AVX2__) && defined(__FMA__)
#define SIMD 1
#endif
#if defined(SIMD) || defined(__F16C__)
#include <immintrin.h>
#endif

/* W's row n, columns [k, k + 32), as floats q (unscaled, exact) */
#ifdef SIMD
static inline void unpack_regs(const void *w, int bits, int64_t K, int64_t n, int64_t k,
                               __m256 *o);
#endif
static inline void unpack32(const void *w, int bits, int64_t K, int64_t n, int64_t k,
                            float *o) {
#ifdef SIMD
    __m256 v[4];
    unpack_regs(w, bits, K, n, k, v);
    for (int j = 0; j < 4; j++) _mm256_storeu_ps(o + 8 * j, v[j]);
#else
    if (bits == 4) {
        const uint8_t *b = (const uint8_t *)w + n * (K / 2) + k / 2;
        for (int j = 0; j < 16; j++) {
            o[j] = (float)(b[j] & 15);
            o[j + 16] = (float)(b[j] >> 4);
        }
    } else {
        const int8_t *q = (const int8_t *)w + n * K + k;
        for (int j = 0; j < 32; j++) o[j] = (float)q[j];
    }
#endif
}

/* acc[lane] = fma(sum over the block's vectors of x * w, s, acc): `vecs` vectors of 8 */
#ifdef SIMD
static inline __m256 block_dot(const float *x, const float *w, int vecs, __m256 s, __m256 acc) {
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(w));
    for (int v = 1; v < vecs; v++)
        t = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8 * v), _mm256_loadu_ps(w + 8 * v), t);
    return _mm256_fmadd_ps(t, s, acc);
}
#endif
static inline void block_dot_scalar(const float *x, const float *w, int vecs, float s,
                                    float *acc) {
    for (int l = 0; l < LANES; l++) {
        float t = x[l] * w[l];
        for (int v = 1; v < vecs; v++) t = fmaf(x[8 * v + l], w[8 * v + l], t);
        acc[l] = fmaf(t, s, acc[l]);
    }
}

#ifdef SIMD
/* one row against COLS unpacked columns: the row's block once in registers (VECS vectors) */
#define ROW_BLOCKS(NAME, VECS)                                                                \
    static inline void NAME(const float *xr, const float *wb, int64_t len, const float *sc,  \
                            int64_t groups, int64_t k0, int shift, int64_t cols, __m256 *a) { \
        for (int64_t k = 0; k < len; k += 8 * VECS) {                                         \
            __m256 xv[VECS];                                                                  \
            for (int v = 0; v < VECS; v++) xv[v] = _mm256_loadu_ps(xr + k + 8 * v);         \
            int64_t g = (k0 + k) >> shift;                                                    \
            for (int c = 0; c < COLS; c++) {                                                  \
                const float *wc = wb + c * KC + k;                                            \
                __m256 t = _mm256_mul_ps(xv[0], _mm256_loadu_ps(wc));                         \
                for (int v = 1; v < VECS; v++)                                                \
                    t = _mm256_fmadd_ps(xv[v], _mm256_loadu_ps(wc + 8 * v), t);               \
                float sv = c < cols ? sc[c * groups + g] : 0.0f;                              \
                a[c] = _mm256_fmadd_ps(t, _mm256_set1_ps(sv), a[c]);                          \
            }                                                                                 \
        }                                                                                     \
    }
ROW_BLOCKS(row_blocks4, 4)
ROW_BLOCKS(row_blocks2, 2)
#endif

/* One tile of COLS output columns, all M rows. `scale`: the tile's own rows of scales
 * (cols * K/group); `wb`: scratch of COLS * KC floats. */
static void tile(const float *x, int64_t M, int64_t K, const void *w, int bits,
                 const float *scale, int64_t group, int64_t n0, int64_t cols, float *acc,
                 float *wb) {
    int64_t sb = group == 16 ? 16 : 32, vecs = sb / 8, groups = K / group;
    int shift = 0; /* group is a power of two: k >> shift is k's group (no division per block) */
    while (((int64_t)1 << shift) < group) shift++;
    memset(acc, 0, sizeof(float) * M * COLS * LANES);
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t len = K - k0 < KC ? K - k0 : KC;
        for (int c = 0; c < COLS; c++)
            if (c < cols)
                for (int64_t k = 0; k < len; k += 32) unpack32(w, bits, K, n0 + c, k0 + k, wb + c * KC + k);
            else
                memset(wb + c * KC, 0, sizeof(float) * len);
        for (int64_t r = 0; r < M; r++) {
            const float *xr = x + r * K + k0;
#ifdef SIMD
            __m256 a[COLS];
            for (int c = 0; c < COLS; c++) a[c] = _mm256_loadu_ps(acc + (r * COLS + c) * LANES);
            const float *sc = scale;
            if (vecs == 4)
                row_blocks4(xr, wb, len, sc, groups, k0, shift, cols, a);
            else
                row_blocks2(xr, wb, len, sc, groups, k0, shift, cols, a);
            for (int c = 0; c < COLS; c++) _mm256_storeu_ps(acc + (r * COLS + c) * LANES, a[c]);
#else
            for (int64_t k = 0; k < len; k += sb)
                for (int c = 0; c < COLS; c++) {
                    float s = c < cols ? scale[c * groups + ((k0 + k) >> shift)] : 0.0f;
                    block_dot_scalar(xr + k, wb + c * KC + k, (int)vecs, s, acc + (r * COLS + c) * LANES);
                }
#endif
        }
    }
}

#ifdef SIMD
/* W's row n, columns [k, k + 32), as 4 vectors of floats (the same values unpack32 stores).
 * Each group of 8 bytes is zero- or sign-extended straight from memory, and a 4-bit row's
 * nibbles are split in 32-bit lanes: two shuffles a block instead of six (shuffles were
 * what bounded a decode step; benchmarks/packed_kernel_rows.py). */
static inline void unpack_regs(const void *w, int bits, int64_t K, int64_t n, int64_t k,
                               __m256 *o) {
    if (bits == 4) {
        const uint8_t *b = (const uint8_t *)w + n * (K / 2) + k / 2;
        __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b));
        __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8)));
        __m256i low = _mm256_set1_epi32(15);
        o[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, low));
        o[1] = _mm256_cvtepi32_ps(_mm256_and_si256(c, low));
        o[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
        o[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4));
    } else {
        const int8_t *q = (const int8_t *)w + n * K + k;
        for (int j = 0; j < 4; j++)
            o[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * j))));
    }
}

/* The same block of the column AHEAD columns on, asked for early: a decode step waits on
 * memory more than it computes (docs/results.md) */
#define AHEAD 8
static inline void prefetch_ahead(const void *w, int bits, int64_t K, int64_t n, int64_t k) {
    int64_t bytes = bits == 4 ? K / 2 : K, at = bits == 4 ? k / 2 : k;
    _mm_prefetch((const char *)w + (n + AHEAD) * bytes + at, _MM_HINT_T0);
}

/* R rows (a compile-time count, so the accumulators stay in registers) against W's column
 * n, columns unpacked into registers and used at once: no scratch round trip. */
#define DIRECT(NAME, R, BITS)                                                                    \
    static inline void NAME(const float *x, int64_t K, const void *w,                        \
                            const float *sc, int64_t group, int shift, int64_t n,            \
                            float *acc) {                                                    \
        __m256 a[R];                                                                         \
        for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();                              \
        if (group == 16)                                                                     \
            for (int64_t k = 0; k < K; k += 32) {                                            \
                __m256 wv[4];                                                                \
                prefetch_ahead(w, BITS, K, n, k);                                            \
                unpack_regs(w, BITS, K, n, k, wv);                                           \
                __m256 s0 = _mm256_set1_ps(sc[k >> 4]), s1 = _mm256_set1_ps(sc[(k >> 4) + 1]); \
                for (int r = 0; r < R; r++) {                                                \
                    const float *xr = x + r * K + k;                                         \
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xr), wv[0]);                    \
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), wv[1], t);                  \
                    a[r] = _mm256_fmadd_ps(t, s0, a[r]);                                     \
                    t = _mm256_mul_ps(_mm256_loadu_ps(xr + 16), wv[2]);                      \
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), wv[3], t);                 \
                    a[r] = _mm256_fmadd_ps(t, s1, a[r]);                                     \
                }                                                                            \
            }                                                                                \
        else                                                                                 \
            for (int64_t k = 0; k < K; k += 32) {                                            \
                __m256 wv[4];                                                                \
                prefetch_ahead(w, BITS, K, n, k);                                            \
                unpack_regs(w, BITS, K, n, k, wv);                                           \
                __m256 s = _mm256_set1_ps(sc[k >> shift]);                                   \
                for (int r = 0; r < R; r++) {                                                \
                    const float *xr = x + r * K + k;                                         \
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xr), wv[0]);                    \
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), wv[1], t);                  \
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 16), wv[2], t);                 \
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), wv[3], t);                 \
                    a[r] = _mm256_fmadd_ps(t, s, a[r]);                                      \
                }                                                                            \
            }                                                                                \
        for (int r = 0; r < R; r++) _mm256_storeu_ps(acc + r * LANES, a[r]);                 \
    }
DIRECT(direct1_4, 1, 4)
DIRECT(direct2_4, 2, 4)
DIRECT(direct3_4, 3, 4)
DIRECT(direct4_4, 4, 4)
DIRECT(direct1_8, 1, 8)
DIRECT(direct2_8, 2, 8)
DIRECT(direct3_8, 3, 8)
DIRECT(direct4_8, 4, 8)
typedef void (*Direct)(const float *, int64_t, const void *, const float *, int64_t, int, int64_t,
                       float *);
static const Direct DIRECT_BY[2][4] = {{direct1_8, direct2_8, direct3_8, direct4_8},
                                       {direct1_4, direct2_4, direct3_4, direct4_4}};

/* Few rows: the per-row arithmetic is tile()'s exactly (same blocks, same order), so which
 * path ran never shows in the result. acc: M * LANES floats. */
static void direct_column(const float *x, int64_t M, int64_t K, const void *w, int bits,
                          const float *sc, int64_t group, int64_t n, float *acc) {
    int shift = 0; /* sc: column n's own scales */
    while (((int64_t)1 << shift) < group) shift++;
    for (int64_t r0 = 0; r0 < M; r0 += 4) {
        const float *xr = x + r0 * K;
        float *ar = acc + r0 * LANES;
        int rows = M - r0 < 4 ? (int)(M - r0) : 4;
        DIRECT_BY[bits == 4][rows - 1](xr, K, w, sc, group, shift, n, ar);
    }
}
#endif

/* sum_g m_g xs_g, the offsets of output (r, n) (8 lanes of groups, then the rest in order;
 * 0 without minimums): one function for every path and both kernels. A serial sum here was
 * a chain of a few dozen dependent multiply-adds per output, as long as the column's
 * products themselves. */
float packed_offsets(const float *mins, int64_t groups, const float *xs) {
    float off = 0.0f;
    if (mins) {
        int64_t g = 0;
#ifdef SIMD
        if (groups >= 8) {
            __m256 o = _mm256_mul_ps(_mm256_loadu_ps(mins), _mm256_loadu_ps(xs));
            for (g = 8; g + 8 <= groups; g += 8)
                o = _mm256_fmadd_ps(_mm256_loadu_ps(mins + g), _mm256_loadu_ps(xs + g), o);
            float l[8];
            _mm256_storeu_ps(l, o);
            off = lanes_sum8(l);
        }
#else
        if (groups >= 8) {
            float l[8];
            for (int j = 0; j < 8; j++) l[j] = mins[j] * xs[j];
            for (g = 8; g + 8 <= groups; g += 8)
                for (int j = 0; j < 8; j++) l[j] = fmaf(mins[g + j], xs[g + j], l[j]);
            off = lanes_sum8(l);
        }
#endif
        for (; g < groups; g++) off = fmaf(mins[g], xs[g], off);
    }
    return off;
}

/* output (r, n) from its lanes and its offsets: one function for every path, so the
 * compiler contracts the sums the same way whichever path ran */
static float column_out(const float *lanes, const float *mins, int64_t groups, const float *xs) {
    return lanes_sum8(lanes) + packed_offsets(mins, groups, xs);
}

/* packed_columns for builds without AVX-512: 8 lanes (AVX2) or portable C */
int narrow_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows) {
    int64_t groups = K / group;
    /* widened scales and minimums: a column's (direct path) or a tile's */
    float *wide = half ? malloc(sizeof(float) * 2 * COLS * groups) : NULL;
    if (half && !wide) return -1;
    float *ws = wide, *wm = wide ? wide + COLS * groups : NULL;
#ifdef SIMD
    if (M <= direct_rows) {
        float stack[16 * LANES];
        float *acc = M <= 16 ? stack : malloc(sizeof(float) * M * LANES);
        if (!acc) {
            free(wide);
            return -1;
        }
        for (int64_t n = n0; n < n1; n++) {
            const float *sc = packed_scales(scale, half, n, 1, groups, ws);
            const float *mn = packed_scales(mins, half, n, 1, groups, wm);
            direct_column(x, M, K, w, bits, sc, group, n, acc);
            for (int64_t r = 0; r < M; r++)
                y[r * ldy + n] = column_out(acc + r * LANES, mn, groups, mins ? xs + r * groups : xs);
        }
        if (acc != stack) free(acc);
        free(wide);
        return 0;
    }
#endif
    float *wb = malloc(sizeof(float) * COLS * KC);
    float *acc = malloc(sizeof(float) * M * COLS * LANES);
    int failed = !wb || !acc;
    if (!failed)
        for (int64_t c0 = n0; c0 < n1; c0 += COLS) {
            int64_t cols = n1 - c0 < COLS ? n1 - c0 : COLS;
            const float *sc = packed_scales(scale, half, c0, cols, groups, ws);
            const float *mn = packed_scales(mins, half, c0, cols, groups, wm);
            tile(x, M, K, w, bits, sc, group, c0, cols, acc, wb);
            for (int64_t r = 0; r < M; r++)
                for (int c = 0; c < cols; c++)
                    y[r * ldy + c0 + c] =
                        column_out(acc + (r * COLS + c) * LANES, mn ? mn + c * groups : NULL,
                                   groups, mins ? xs + r * groups : xs);
        }
    free(wb);
    free(acc);
    free(wide);
    return failed ? -1 : 0;
}
