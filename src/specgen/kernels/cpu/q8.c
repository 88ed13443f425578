/* Products with 8-bit activations: x quantized once per product, per row and block of 32
 * columns (packed.h says how), then integer block sums against the packed weights, scaled
 * in fp32. Why: a decode step waits on memory, but each extra row of a verify block (or a
 * batch, or a drafter's block) costs multiply-adds, and an 8-bit dot product instruction
 * does four times the multiply-adds of an fp32 one (vpdpbusd: 64 per AVX-512 instruction).
 *
 * This file: the quantizer, the sums and scales every kernel takes, the portable kernel (the
 * arithmetic of packed.h, written out once per output) and q8_columns, which runs the
 * build's widest kernel: 16 lanes (q8x16.c), 8 (q8x8.c) or this one. All three compute the
 * same bits: integer sums are exact in any order and the fp32 steps are the same per output.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packed.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* below this a block counts as zero: 127 / amax stays finite, d a normal number */
#define TINY 7.88860905e-31f /* 2^-100 */

/* one block's d and whether it is finite: the largest |x| and a NaN/infinity check */
static inline float block_scale(float amax, int finite, float *inv) {
    if (!finite) {
        *inv = 0.0f;
        return NAN;
    }
    if (amax < TINY) {
        *inv = 0.0f;
        return 0.0f;
    }
    *inv = 127.0f / amax;
    return amax / 127.0f;
}

static void quantize_block(const float *x, int8_t *q, float *d, int32_t *sums) {
#if defined(WIDE)
    __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    /* NaN or infinity anywhere: not (|v| <= FLT_MAX) */
    __mmask16 bad = _mm512_cmp_ps_mask(_mm512_abs_ps(a), _mm512_set1_ps(3.40282347e38f), _CMP_NLE_UQ) |
                    _mm512_cmp_ps_mask(_mm512_abs_ps(b), _mm512_set1_ps(3.40282347e38f), _CMP_NLE_UQ);
    float inv, amax = _mm512_reduce_max_ps(m);
    *d = block_scale(amax, !bad, &inv);
    __m512 iv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    __m512i qa = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(a, iv), lo), hi));
    __m512i qb = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(b, iv), lo), hi));
    if (bad) qa = qb = _mm512_setzero_si512();
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qb));
    sums[0] = _mm512_reduce_add_epi32(qa);
    sums[1] = _mm512_reduce_add_epi32(qb);
#else
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < 32; j++) {
        float v = fabsf(x[j]);
        finite &= v <= 3.40282347e38f;
        amax = v > amax ? v : amax;
    }
    float inv;
    *d = block_scale(amax, finite, &inv);
    sums[0] = sums[1] = 0;
    for (int j = 0; j < 32; j++) {
        /* the vector builds' order: product, clamp (a NaN product -> -127, as max_ps), round */
        float v = x[j] * inv;
        v = v > -127.0f ? v : -127.0f;
        v = v < 127.0f ? v : 127.0f;
        int32_t r = finite ? (int32_t)nearbyintf(v) : 0;
        q[j] = (int8_t)r;
        sums[j >> 4] += r;
    }
#endif
}

void q8_quantize(const float *x, int64_t M, int64_t K, int8_t *q, float *d, int32_t *sums) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t b = 0; b < K / 32; b++)
            quantize_block(x + r * K + 32 * b, q + r * K + 32 * b, d + r * (K / 32) + b,
                           sums + r * (K / 16) + 2 * b);
}

static int64_t up64(int64_t n) { return (n + 63) & ~(int64_t)63; }

int64_t q8_bytes(int64_t M, int64_t K) {
    return up64(M * K) + up64(4 * M * (K / 32)) + up64(4 * M * (K / 16));
}

void q8_layout(int64_t M, int64_t K, void *buf, Q8Rows *rows) {
    uint8_t *at = buf;
    *rows = (Q8Rows){(int8_t *)at, (float *)(at + up64(M * K)),
                     (int32_t *)(at + up64(M * K) + up64(4 * M * (K / 32))), M, K};
}

void q8_rows(const float *x, int64_t M, int64_t K, void *buf, Q8Rows *rows) {
    q8_layout(M, K, buf, rows);
    q8_quantize(x, M, K, (int8_t *)rows->q, (float *)rows->d, (int32_t *)rows->sums);
}

void q8_row(const float *x, int64_t r, const Q8Rows *rows) {
    int64_t K = rows->K;
    q8_quantize(x, 1, K, (int8_t *)rows->q + r * K, (float *)rows->d + r * (K / 32),
                (int32_t *)rows->sums + r * (K / 16));
}

void q8_group_sums(const Q8Rows *x, int64_t group, float *X) {
    int64_t K = x->K, G = K / group;
    for (int64_t r = 0; r < x->M; r++) {
        const float *d = x->d + r * (K / 32);
        const int32_t *s = x->sums + r * (K / 16);
        for (int64_t g = 0; g < G; g++) {
            float acc = 0.0f;
            if (group == 16)
                acc = fmaf(d[g >> 1], (float)s[g], acc);
            else
                for (int64_t b = g * group / 32; b < (g + 1) * group / 32; b++)
                    acc = fmaf(d[b], (float)(s[2 * b] + s[2 * b + 1]), acc);
            X[r * G + g] = acc;
        }
    }
}

void q8_panel_scales(const void *table, int half, int64_t n0, int cols, int P, int64_t G,
                     float *out) {
    float chunk[16];
    for (int c = 0; c < P; c++) {
        int64_t n = n0 + (c < cols ? c : cols - 1);
        for (int64_t g0 = 0; g0 < G; g0 += 16) {
            int64_t len = G - g0 < 16 ? G - g0 : 16;
            const float *src = chunk;
            if (half)
                widen((const uint16_t *)table + n * G + g0, len, chunk);
            else
                src = (const float *)table + n * G + g0;
            for (int64_t g = 0; g < len; g++) out[(g0 + g) * P + c] = src[g];
        }
    }
}

/* ---- the portable kernel: packed.h's arithmetic, one output at a time ------------------ */
/* block b of column n against row r: the integer sums of its two halves */
static void block_sums(const uint8_t *w, int bits, const int8_t *q, int32_t *d0, int32_t *d1) {
    int32_t a = 0, c = 0;
    if (bits == 4)
        for (int j = 0; j < 16; j++) {
            a += (int32_t)(w[j] & 15) * q[j];
            c += (int32_t)(w[j] >> 4) * q[16 + j];
        }
    else
        for (int j = 0; j < 16; j++) {
            a += (int32_t)(int8_t)w[j] * q[j];
            c += (int32_t)(int8_t)w[16 + j] * q[16 + j];
        }
    *d0 = a, *d1 = c;
}

static void portable_columns(const Q8Rows *x, const uint8_t *w, int bits, const float *s,
                             const float *m, const float *X, int64_t group, int64_t n0,
                             int cols, float *y, int64_t ldy) {
    int64_t K = x->K, nb = K / 32, G = K / group, row = bits == 4 ? K / 2 : K;
    for (int c = 0; c < cols; c++) {
        const uint8_t *wn = w + (n0 + c) * row;
        for (int64_t r = 0; r < x->M; r++) {
            const float *d = x->d + r * nb, *Xr = X ? X + r * G : NULL;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t d0, d1;
                block_sums(wn + b * (row / nb), bits, x->q + r * K + 32 * b, &d0, &d1);
                if (group == 16) {
                    for (int h = 0; h < 2; h++) {
                        int64_t g = 2 * b + h;
                        acc = fmaf(s[g * 16 + c] * d[b], (float)(h ? d1 : d0), acc);
                        if (m) acc = fmaf(m[g * 16 + c], Xr[g], acc);
                    }
                    continue;
                }
                int64_t g = 32 * b / group;
                acc = fmaf(s[g * 16 + c] * d[b], (float)(d0 + d1), acc);
                if (m && (32 * (b + 1)) % group == 0) acc = fmaf(m[g * 16 + c], Xr[g], acc);
            }
            y[r * ldy + n0 + c] = acc;
        }
    }
}

static int portable(const Q8Rows *x, const void *w, int bits, const void *scale,
                    const void *mins, int half, int64_t group, int64_t n0, int64_t n1, float *y,
                    int64_t ldy) {
    int64_t G = x->K / group;
    float *buf = malloc(sizeof(float) * (2 * 16 * G + x->M * G));
    if (!buf) return -1;
    float *s = buf, *m = mins ? buf + 16 * G : NULL, *X = mins ? buf + 32 * G : NULL;
    if (mins) q8_group_sums(x, group, X);
    for (int64_t c0 = n0; c0 < n1; c0 += 16) {
        int cols = n1 - c0 < 16 ? (int)(n1 - c0) : 16;
        q8_panel_scales(scale, half, c0, cols, 16, G, s);
        if (mins) q8_panel_scales(mins, half, c0, cols, 16, G, m);
        portable_columns(x, w, bits, s, m, X, group, c0, cols, y, ldy);
    }
    free(buf);
    return 0;
}

int q8_columns(const Q8Rows *x, const void *w, int bits, const void *scale, const void *mins,
               int half, int64_t group, int64_t n0, int64_t n1, float *y, int64_t ldy,
               const Panels *panels, int reference) {
    (void)panels; /* (the portable kernel transposes its own) */
    if (n0 >= n1) return 0;
    if (reference) return portable(x, w, bits, scale, mins, half, group, n0, n1, y, ldy);
#if defined(WIDE)
    return q8x16_columns(x, w, bits, scale, mins, half, group, n0, n1, y, ldy, panels);
#elif defined(SIMD8)
    return q8x8_columns(x, w, bits, scale, mins, half, group, n0, n1, y, ldy, panels);
#else
    return portable(x, w, bits, scale, mins, half, group, n0, n1, y, ldy);
#endif
}

/* the lanes of this build's 8-bit-activation products (16, 8 or 1) */
int q8_lanes(void) {
#if defined(WIDE)
    return 16;
#elif defined(SIMD8)
    return 8;
#else
    return 1;
#endif
}
