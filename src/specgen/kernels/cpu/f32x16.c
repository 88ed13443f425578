/* Packed-weight products with fp32 activations in 16-lane (AVX-512) vectors: f32x8.c's
 * contract, a different arithmetic. Compiled only where the compiler targets AVX-512;
 * elsewhere this file is empty and f32x8.c's code runs.
 *
 * Why a second kernel: a verify block's extra rows are bound by multiply-adds, not by
 * memory. f32x8.c spends five 8-lane operations per row on 32 weights (a product per
 * block, then its scale); here each weight is scaled once, when it is unpacked, and shared
 * by every row: two 16-lane multiply-adds per row per 32 weights, with up to 4 rows x 4
 * columns of accumulators held in registers.
 *
 * Exactness: w = s q is the dequantized weight as models/formats/packed_matrix.py computes it (fp32
 * product of the widened scale and the integer); output (r, n) is the sum over k of
 * x[r, k] w[n, k], accumulated in 16 lanes (lane l takes k = l mod 16) by fused
 * multiply-adds in k order, in chunks of WCH columns added up in order (join), then the
 * offsets sum_g m_g xs_g multiplied into the same lanes, then a fixed tree over the lanes
 * (finish_tile). Neither the number of rows, nor the path (registers or scratch), nor the
 * tiling or the thread changes that, so verify rows equal decode steps bit for bit.
 */
#include <stdint.h>
#include <stdlib.h>

#include "packed.h"

#if defined(WIDE)
#include <immintrin.h>

#define WL 16  /* lanes */
#define WC 4   /* output columns per tile */
#define WR 4   /* rows per register block */
#define WKC 512 /* columns of K unpacked at a time into scratch (a multiple of WCH) */

/* Four accumulators' sums, each over its own 16 lanes by one fixed tree (halves, then
 * quarters, then within a quarter), whichever slot it sits in: lane 4c holds v[c]'s sum. */
static inline __m512 sum4(const __m512 *v) {
    __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44),
                               _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
    __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44),
                               _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
    __m512 y = _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88),
                             _mm512_shuffle_f32x4(x01, x23, 0xDD));
    y = _mm512_add_ps(y, _mm512_permute_ps(y, 0x4E));
    return _mm512_add_ps(y, _mm512_permute_ps(y, 0xB1));
}

/* block k's scales: s0 for columns k..k+15, s1 for k+16..k+31 (groups of 16 or of 32+) */
static inline void block_scales(const float *sc, int64_t k, int64_t group, int shift, __m512 *s0,
                                __m512 *s1) {
    if (group == 16) {
        *s0 = _mm512_set1_ps(sc[k >> 4]);
        *s1 = _mm512_set1_ps(sc[(k >> 4) + 1]);
    } else
        *s0 = *s1 = _mm512_set1_ps(sc[k >> shift]);
}

/* W's row n, columns [k, k + 32), dequantized: o[0] the first 16, o[1] the next 16. A 4-bit
 * block's 16 bytes hold columns j (low nibble) and j + 16 (high nibble) of byte j. */
static inline void scaled32(const void *w, int bits, int64_t K, int64_t n, int64_t k, __m512 s0,
                            __m512 s1, __m512 *o) {
    if (bits == 4) {
        /* 16 levels: s * 0..15 in one register, each weight picked from it by its nibble
         * (a permute reads only an index's low 4 bits, so the low nibbles need no mask):
         * the same fp32 products as scaling each converted q, in fewer instructions */
        const uint8_t *b = (const uint8_t *)w + n * (K / 2) + k / 2;
        __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
        const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 t0 = _mm512_mul_ps(levels, s0), t1 = _mm512_mul_ps(levels, s1);
        o[0] = _mm512_permutexvar_ps(a, t0);
        o[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), t1);
    } else {
        const int8_t *q = (const int8_t *)w + n * K + k;
        __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
        __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
        o[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), s0);
        o[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), s1);
    }
}

/* A decode step waits on memory more than it computes: the block AHEAD tiles of columns
 * further on (rows of W lie one after another) is asked for early. Distances of 1 to 8
 * tiles did about equally well; without it a step took a third longer (docs/results.md). */
#define AHEAD 2
static inline void prefetch_ahead(const void *w, int bits, int64_t K, int64_t n, int64_t k) {
    int64_t bytes = bits == 4 ? K / 2 : K, at = bits == 4 ? k / 2 : k;
    _mm_prefetch((const char *)w + (n + AHEAD * WC) * bytes + at, _MM_HINT_T0);
    if (bits == 8) /* 32 bytes may cross a line */
        _mm_prefetch((const char *)w + (n + AHEAD * WC) * bytes + at + 31, _MM_HINT_T0);
}

/* Lanes are summed in registers over WCH columns of K at a time, then added to the running
 * total in acc (the first chunk is the total): 16 lanes over all of K alone were a chain of
 * K/16 additions per lane, a quarter less accurate than the 8-lane build's block sums;
 * chunks of 256 make them more accurate than it, for one load, add and store a chunk. */
#define WCH 256
static inline void join(float *acc, int first, __m512 a) {
    _mm512_storeu_ps(acc, first ? a : _mm512_add_ps(_mm512_loadu_ps(acc), a));
}

/* R rows x WC columns, weights unpacked into registers and used at once (few rows: decode
 * steps and verify blocks). sc[c], n[c]: column c's scales and row of W. acc: R * WC * WL. */
#define DIRECT(NAME, R, BITS)                                                                  \
    static void NAME(const float *x, int64_t K, const void *w, const float *const *sc,         \
                     int64_t group, int shift, const int64_t *n, float *acc) {                 \
        for (int64_t k0 = 0; k0 < K; k0 += WCH) {                                              \
            int64_t k1 = k0 + WCH < K ? k0 + WCH : K;                                          \
            __m512 a[R][WC];                                                                   \
            for (int r = 0; r < R; r++)                                                        \
                for (int c = 0; c < WC; c++) a[r][c] = _mm512_setzero_ps();                    \
            for (int64_t k = k0; k < k1; k += 32) {                                            \
                __m512 wv[WC][2];                                                              \
                for (int c = 0; c < WC; c++) {                                                 \
                    __m512 s0, s1;                                                             \
                    prefetch_ahead(w, BITS, K, n[c], k);                                       \
                    block_scales(sc[c], k, group, shift, &s0, &s1);                            \
                    scaled32(w, BITS, K, n[c], k, s0, s1, wv[c]);                              \
                }                                                                              \
                for (int r = 0; r < R; r++) {                                                  \
                    __m512 x0 = _mm512_loadu_ps(x + r * K + k);                                \
                    __m512 x1 = _mm512_loadu_ps(x + r * K + k + 16);                           \
                    for (int c = 0; c < WC; c++) {                                             \
                        a[r][c] = _mm512_fmadd_ps(x0, wv[c][0], a[r][c]);                      \
                        a[r][c] = _mm512_fmadd_ps(x1, wv[c][1], a[r][c]);                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            for (int r = 0; r < R; r++)                                                        \
                for (int c = 0; c < WC; c++) join(acc + (r * WC + c) * WL, k0 == 0, a[r][c]);  \
        }                                                                                      \
    }
DIRECT(direct1_4, 1, 4)
DIRECT(direct2_4, 2, 4)
DIRECT(direct3_4, 3, 4)
DIRECT(direct4_4, 4, 4)
DIRECT(direct1_8, 1, 8)
DIRECT(direct2_8, 2, 8)
DIRECT(direct3_8, 3, 8)
DIRECT(direct4_8, 4, 8)

/* R rows over WC columns of dequantized weights in scratch (wb[c * WKC + k], len of them),
 * continuing the accumulators in acc: the same multiply-adds in the same order as DIRECT */
#define ROWS(NAME, R)                                                                          \
    static void NAME(const float *x, int64_t K, const float *wb, int64_t len, int64_t at,      \
                     float *acc) {                                                             \
        for (int64_t j0 = 0; j0 < len; j0 += WCH) {                                            \
            int64_t j1 = j0 + WCH < len ? j0 + WCH : len;                                      \
            __m512 a[R][WC];                                                                   \
            for (int r = 0; r < R; r++)                                                        \
                for (int c = 0; c < WC; c++) a[r][c] = _mm512_setzero_ps();                    \
            for (int64_t k = j0; k < j1; k += WL) {                                            \
                __m512 wv[WC];                                                                 \
                for (int c = 0; c < WC; c++) wv[c] = _mm512_loadu_ps(wb + c * WKC + k);        \
                for (int r = 0; r < R; r++) {                                                  \
                    __m512 xv = _mm512_loadu_ps(x + r * K + k);                                \
                    for (int c = 0; c < WC; c++) a[r][c] = _mm512_fmadd_ps(xv, wv[c], a[r][c]); \
                }                                                                              \
            }                                                                                  \
            for (int r = 0; r < R; r++)                                                        \
                for (int c = 0; c < WC; c++)                                                   \
                    join(acc + (r * WC + c) * WL, at + j0 == 0, a[r][c]);                      \
        }                                                                                      \
    }
ROWS(rows1, 1)
ROWS(rows2, 2)
ROWS(rows3, 3)
ROWS(rows4, 4)
typedef void (*Rows)(const float *, int64_t, const float *, int64_t, int64_t, float *);
static const Rows ROWS_BY[WR] = {rows1, rows2, rows3, rows4};

typedef void (*Direct)(const float *, int64_t, const void *, const float *const *, int64_t, int,
                       const int64_t *, float *);
static const Direct DIRECT_BY[2][WR] = {{direct1_8, direct2_8, direct3_8, direct4_8},
                                        {direct1_4, direct2_4, direct3_4, direct4_4}};

/* Many rows (prefill): each chunk of WC columns is dequantized into scratch once, then every
 * row runs over it. */
static void scratch_tile(const float *x, int64_t M, int64_t K, const void *w, int bits,
                         const float *const *sc, int64_t group, int shift, const int64_t *n,
                         float *acc, float *wb) {
    for (int64_t k0 = 0; k0 < K; k0 += WKC) {
        int64_t len = K - k0 < WKC ? K - k0 : WKC;
        for (int c = 0; c < WC; c++)
            for (int64_t k = 0; k < len; k += 32) {
                __m512 s0, s1, o[2];
                block_scales(sc[c], k0 + k, group, shift, &s0, &s1);
                scaled32(w, bits, K, n[c], k0 + k, s0, s1, o);
                _mm512_storeu_ps(wb + c * WKC + k, o[0]);
                _mm512_storeu_ps(wb + c * WKC + k + 16, o[1]);
            }
        for (int64_t r0 = 0; r0 < M; r0 += WR) {
            const float *xr = x + r0 * K + k0;
            float *ar = acc + r0 * WC * WL;
            ROWS_BY[(M - r0 < WR ? M - r0 : WR) - 1](xr, K, wb, len, k0, ar);
        }
    }
}

/* Outputs (r, c0 + c) of a tile from its accumulators: the offsets sum_g m_g xs_g first
 * multiplied into the lanes (16 groups at a time, lane l taking groups g = l mod 16), then
 * sum4. One function for both paths. mn: the tile's minimums (column c's at c * groups) */
static void finish_tile(const float *acc, int64_t M, int cols, const float *mn, int64_t groups,
                        const float *xs, float *y, int64_t ldy, int64_t c0) {
    for (int64_t r = 0; r < M; r++) {
        __m512 v[WC];
        float out[WL];
        for (int c = 0; c < WC; c++) {
            v[c] = _mm512_loadu_ps(acc + (r * WC + c) * WL);
            if (mn && c < cols)
                for (int64_t g = 0; g < groups; g += WL) {
                    __mmask16 m = groups - g >= WL ? 0xFFFF : (__mmask16)((1u << (groups - g)) - 1);
                    v[c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, mn + c * groups + g),
                                           _mm512_maskz_loadu_ps(m, xs + r * groups + g), v[c]);
                }
        }
        _mm512_storeu_ps(out, sum4(v));
        for (int c = 0; c < cols; c++) y[r * ldy + c0 + c] = out[4 * c];
    }
}

int wide_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                 const void *scale, const void *mins, int half, int64_t group, const float *xs,
                 int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows_max) {
    int64_t groups = K / group;
    int shift = 0; /* group is a power of two: k >> shift is k's group */
    while (((int64_t)1 << shift) < group) shift++;
    int direct = M <= direct_rows_max;
    float stack[16 * WC * WL];
    float *wide = half ? malloc(sizeof(float) * 2 * WC * groups) : NULL;
    float *acc = M <= 16 ? stack : malloc(sizeof(float) * M * WC * WL);
    float *wb = direct ? NULL : malloc(sizeof(float) * WC * WKC);
    int failed = (half && !wide) || !acc || (!direct && !wb);
    float *ws = wide, *wm = wide ? wide + WC * groups : NULL;
    for (int64_t c0 = n0; c0 < n1 && !failed; c0 += WC) {
        int cols = n1 - c0 < WC ? (int)(n1 - c0) : WC;
        const float *sc = packed_scales(scale, half, c0, cols, groups, ws);
        const float *mn = packed_scales(mins, half, c0, cols, groups, wm);
        /* a last tile of fewer columns repeats its last column (computed, not stored) */
        const float *scs[WC];
        int64_t ns[WC];
        for (int c = 0; c < WC; c++) {
            int cc = c < cols ? c : cols - 1;
            scs[c] = sc + cc * groups;
            ns[c] = c0 + cc;
        }
        if (direct)
            for (int64_t r0 = 0; r0 < M; r0 += WR)
                DIRECT_BY[bits == 4][(M - r0 < WR ? M - r0 : WR) - 1](x + r0 * K, K, w, scs, group,
                                                                     shift, ns, acc + r0 * WC * WL);
        else
            scratch_tile(x, M, K, w, bits, scs, group, shift, ns, acc, wb);
        finish_tile(acc, M, cols, mn, groups, xs, y, ldy, c0);
    }
    if (acc != stack) free(acc);
    free(wb);
    free(wide);
    return failed ? -1 : 0;
}
#endif
