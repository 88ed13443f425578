/* 8-bit-activation products in 8 lanes (AVX2; vpdpbusd where the CPU has AVX-VNNI, or the
 * AVX-512 VNNI encoding in a build that tests this path there; else vpmaddubsw + vpmaddwd):
 * q8x16.c's scheme at half the width, every lane one output column, so the same bits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packed.h"

#if defined(SIMD8) && !defined(WIDE)
#include <immintrin.h>

#define P 8  /* columns per panel, one per lane */
#define RB 4 /* rows per register block */
#define DIRECT 4 /* more rows: each panel's weights turned once into scratch (q8x16.c) */

#if defined(__AVXVNNI__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#endif
#ifdef DPBUSD
#define VNNI 1
#else
#define VNNI 0
#endif

/* 16 bytes at p[c] + off for the 8 columns c, as 4 vectors: z[t] lane c = p[c]'s dword t */
static inline void transpose(const uint8_t *const *p, int64_t off, __m256i *z) {
    __m256i a[4];
    for (int i = 0; i < 4; i++) /* 128-bit lane L of a[i]: column 4L + i */
        a[i] = _mm256_loadu2_m128i((const __m128i *)(p[4 + i] + off), (const __m128i *)(p[i] + off));
    __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    z[0] = _mm256_unpacklo_epi64(t0, t2);
    z[1] = _mm256_unpackhi_epi64(t0, t2);
    z[2] = _mm256_unpacklo_epi64(t1, t3);
    z[3] = _mm256_unpackhi_epi64(t1, t3);
}

static inline __m256i xword(const int8_t *xb, int t) {
    int32_t v;
    memcpy(&v, xb + 4 * t, 4);
    return _mm256_set1_epi32(v);
}

/* as q8x16.c: 4-bit low nibbles z[0..3], high z[4..7]; 8-bit bytes 0..15 and 16..31, made
 * unsigned with VNNI (w + 128), left signed without (vpsignb moves the sign onto x) */
static inline void block_weights(const uint8_t *const *p, int bits, int64_t b, __m256i *z) {
    if (bits == 4) {
        __m256i raw[4], low = _mm256_set1_epi8(15);
        transpose(p, 16 * b, raw);
        for (int t = 0; t < 4; t++) {
            z[t] = _mm256_and_si256(raw[t], low);
            z[4 + t] = _mm256_and_si256(_mm256_srli_epi16(raw[t], 4), low);
        }
        return;
    }
    transpose(p, 32 * b, z);
    transpose(p, 32 * b + 16, z + 4);
#ifdef DPBUSD
    for (int t = 0; t < 8; t++) z[t] = _mm256_xor_si256(z[t], _mm256_set1_epi8((char)0x80));
#endif
}

/* a block's share of the panel AHEAD panels on, asked for early (q8x16.c says why) */
#define AHEAD 4
static inline void prefetch_next(const uint8_t *const *p, int bits, int64_t K, int64_t b) {
    int64_t share = bits == 4 ? 128 : 256;
    const char *next = (const char *)p[0] + AHEAD * P * (bits == 4 ? K / 2 : K) + b * share;
    for (int64_t at = 0; at < share; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
}

static inline __m256i sums4(const __m256i *z, const int8_t *xb) { /* two chains: q8x16.c */
#ifdef DPBUSD
    __m256i a = _mm256_setzero_si256(), c = _mm256_setzero_si256();
    for (int t = 0; t < 4; t++) {
        a = DPBUSD(a, z[t], xword(xb, t));
        c = DPBUSD(c, z[4 + t], xword(xb, 4 + t));
    }
    return _mm256_add_epi32(a, c);
#else
    /* pairs of products in 16 bits: at most 2 * 15 * 127 each, 8 of them still fit */
    __m256i s = _mm256_maddubs_epi16(z[0], xword(xb, 0));
    for (int t = 1; t < 8; t++) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(z[t], xword(xb, t)));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
}

static inline void sums8(const __m256i *z, const __m256i *mag, const int8_t *xb, int32_t s0,
                         int32_t s1, __m256i *h0, __m256i *h1) {
#ifdef DPBUSD
    (void)mag;
    __m256i a = _mm256_set1_epi32(-128 * s0), c = _mm256_set1_epi32(-128 * s1);
    for (int t = 0; t < 4; t++) {
        a = DPBUSD(a, z[t], xword(xb, t));
        c = DPBUSD(c, z[4 + t], xword(xb, 4 + t));
    }
    *h0 = a, *h1 = c;
#else
    (void)s0, (void)s1;
    /* |w| times x with w's sign: pairs at most 2 * 128 * 127, one pair sum per 16 bits */
    __m256i one = _mm256_set1_epi16(1), h[2];
    for (int half = 0; half < 2; half++) {
        __m256i acc = _mm256_setzero_si256();
        for (int t = 4 * half; t < 4 * half + 4; t++) {
            __m256i x = _mm256_sign_epi8(xword(xb, t), z[t]);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(mag[t], x), one));
        }
        h[half] = acc;
    }
    *h0 = h[0], *h1 = h[1];
#endif
}

static inline __m256 step(__m256 acc, __m256 s, __m256 d, __m256i D) {
    return _mm256_fmadd_ps(_mm256_mul_ps(s, d), _mm256_cvtepi32_ps(D), acc);
}

static inline __m256 offset(__m256 acc, __m256 m, float X) {
    return _mm256_fmadd_ps(m, _mm256_set1_ps(X), acc);
}

/* 8 of a panel's scales (or minimums) at element `at`: fp32, or fp16 widened here, once a
 * block for all its rows (see q8x16.c's scales16) */
static inline __m256 scales8(const void *t, int64_t at, int half) {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)t + at)));
    return _mm256_loadu_ps((const float *)t + at);
}

/* r[i] lane j -> r[j] lane i: 8 x 8 floats in 24 shuffles */
static inline void transpose_ps(__m256 *r) {
    __m256 t[8], u[8];
    for (int a = 0; a < 4; a++) {
        t[2 * a] = _mm256_unpacklo_ps(r[2 * a], r[2 * a + 1]);
        t[2 * a + 1] = _mm256_unpackhi_ps(r[2 * a], r[2 * a + 1]);
    }
    for (int b = 0; b < 2; b++) { /* u[4b + j], 128-bit lane L: column 4L + j of rows 4b.. */
        u[4 * b] = _mm256_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44);
        u[4 * b + 1] = _mm256_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        u[4 * b + 2] = _mm256_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44);
        u[4 * b + 3] = _mm256_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* q8_panel_scales for a panel of 8: 8 groups of the 8 columns at a time, transposed */
static void panel_scales(const void *table, int half, int64_t n0, int cols, int64_t G,
                         float *out) {
    for (int64_t g0 = 0; g0 < G; g0 += P) {
        int len = G - g0 < P ? (int)(G - g0) : P;
        __m256 r[P];
        for (int c = 0; c < P; c++) {
            int64_t at = (n0 + (c < cols ? c : cols - 1)) * G + g0;
            if (len == P) {
                r[c] = half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)table + at)))
                            : _mm256_loadu_ps((const float *)table + at);
                continue;
            }
            float part[P] = {0};
            if (half)
                widen((const uint16_t *)table + at, len, part);
            else
                memcpy(part, (const float *)table + at, sizeof(float) * len);
            r[c] = _mm256_loadu_ps(part);
        }
        transpose_ps(r);
        for (int g = 0; g < len; g++) _mm256_storeu_ps(out + (g0 + g) * P, r[g]);
    }
}

/* R rows against one panel (see q8x16.c's KERNEL) */
#define KERNEL(NAME, R, BITS)                                                                  \
    static void NAME(const Q8Rows *x, int64_t r0, const uint8_t *const *p,                     \
                     const __m256i *staged, int64_t group, const void *s, const void *m,       \
                     int sh, const float *X, __m256 *out) {                                    \
        int64_t K = x->K, nb = K / 32, G = K / group;                                          \
        int per = 0; /* blocks per group: 1 << per (group 16: one block, two groups) */        \
        while (group > 32 && (32 << per) < group) per++;                                       \
        __m256 acc[R];                                                                         \
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                              \
        for (int64_t b = 0; b < nb; b++) {                                                     \
            __m256i z[8], mag[8];                                                              \
            if (staged)                                                                        \
                for (int t = 0; t < 8; t++) z[t] = _mm256_load_si256(staged + 8 * b + t);      \
            else {                                                                             \
                prefetch_next(p, BITS, K, b);                                                  \
                block_weights(p, BITS, b, z);                                                  \
            }                                                                                  \
            if (BITS == 8 && !VNNI)                                                            \
                for (int t = 0; t < 8; t++) mag[t] = _mm256_abs_epi8(z[t]);                    \
            int64_t g = group == 16 ? 2 * b : b >> per;                                        \
            int last = ((b + 1) & ((1 << per) - 1)) == 0;                                      \
            __m256 s0 = scales8(s, g * P, sh), m0 = m ? scales8(m, g * P, sh) : s0, s1 = s0, m1 = m0; \
            if (BITS == 8 && group == 16) {                                                    \
                s1 = scales8(s, g * P + P, sh);                                                \
                if (m) m1 = scales8(m, g * P + P, sh);                                         \
            }                                                                                  \
            for (int r = 0; r < R; r++) {                                                      \
                int64_t row = r0 + r;                                                          \
                const int8_t *xb = x->q + row * K + 32 * b;                                    \
                __m256 d = _mm256_set1_ps(x->d[row * nb + b]);                                 \
                const float *Xr = m ? X + row * G : NULL;                                      \
                if (BITS == 4) {                                                               \
                    acc[r] = step(acc[r], s0, d, sums4(z, xb));                                \
                    if (m && last) acc[r] = offset(acc[r], m0, Xr[g]);                         \
                    continue;                                                                  \
                }                                                                              \
                const int32_t *hs = x->sums + row * (K / 16) + 2 * b;                          \
                __m256i h0, h1;                                                                \
                sums8(z, mag, xb, hs[0], hs[1], &h0, &h1);                                     \
                if (group == 16) {                                                             \
                    acc[r] = step(acc[r], s0, d, h0);                                          \
                    if (m) acc[r] = offset(acc[r], m0, Xr[g]);                                 \
                    acc[r] = step(acc[r], s1, d, h1);                                          \
                    if (m) acc[r] = offset(acc[r], m1, Xr[g + 1]);                             \
                    continue;                                                                  \
                }                                                                              \
                acc[r] = step(acc[r], s0, d, _mm256_add_epi32(h0, h1));                        \
                if (m && last) acc[r] = offset(acc[r], m0, Xr[g]);                             \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < R; r++) out[r] = acc[r];                                           \
    }
KERNEL(rows1_4, 1, 4)
KERNEL(rows2_4, 2, 4)
KERNEL(rows3_4, 3, 4)
KERNEL(rows4_4, 4, 4)
KERNEL(rows1_8, 1, 8)
KERNEL(rows2_8, 2, 8)
KERNEL(rows3_8, 3, 8)
KERNEL(rows4_8, 4, 8)
typedef void (*Kernel)(const Q8Rows *, int64_t, const uint8_t *const *, const __m256i *, int64_t,
                       const void *, const void *, int, const float *, __m256 *);
static const Kernel BY[2][RB] = {{rows1_8, rows2_8, rows3_8, rows4_8},
                                 {rows1_4, rows2_4, rows3_4, rows4_4}};

int q8x8_columns(const Q8Rows *x, const void *w, int bits, const void *scale, const void *mins,
                 int half, int64_t group, int64_t n0, int64_t n1, float *y, int64_t ldy,
                 const Panels *panels) {
    int64_t K = x->K, G = K / group, row = bits == 4 ? K / 2 : K, nb = K / 32;
    float *buf = malloc(sizeof(float) * (2 * P * G + x->M * G));
    __m256i *stage = x->M > DIRECT ? _mm_malloc(sizeof(__m256i) * 8 * nb, 32) : NULL;
    if (!buf || (x->M > DIRECT && !stage)) {
        free(buf);
        _mm_free(stage);
        return -1;
    }
    float *s = buf, *m = mins ? buf + P * G : NULL, *X = mins ? buf + 2 * P * G : NULL;
    if (mins) q8_group_sums(x, group, X);
    if (panels && (panels->width != P || n0 % P)) panels = NULL;
    for (int64_t c0 = n0; c0 < n1; c0 += P) {
        int cols = n1 - c0 < P ? (int)(n1 - c0) : P;
        const uint8_t *p[P]; /* a last panel of fewer columns repeats its last (not stored) */
        for (int c = 0; c < P; c++) p[c] = (const uint8_t *)w + (c0 + (c < cols ? c : cols - 1)) * row;
        const void *ps = s, *pm = m; /* the panel's scales and minimums, [G, P] */
        int sh = 0;                  /* fp16 tables, widened by the kernel */
        if (panels) {
            int64_t next = c0 + AHEAD * P < n1 ? c0 / P + AHEAD : -1;
            panel_tables_raw(panels, half, c0 / P, next, G, &ps, &pm);
            sh = half;
        } else {
            panel_scales(scale, half, c0, cols, G, s);
            if (mins) panel_scales(mins, half, c0, cols, G, m);
        }
        if (stage)
            for (int64_t b = 0; b < nb; b++) {
                __m256i z[8];
                prefetch_next(p, bits, K, b);
                block_weights(p, bits, b, z);
                for (int t = 0; t < 8; t++) _mm256_store_si256(stage + 8 * b + t, z[t]);
            }
        for (int64_t r0 = 0; r0 < x->M; r0 += RB) {
            int R = x->M - r0 < RB ? (int)(x->M - r0) : RB;
            __m256 out[RB];
            float lanes[P];
            BY[bits == 4][R - 1](x, r0, p, stage, group, ps, pm, sh, X, out);
            for (int r = 0; r < R; r++) {
                _mm256_storeu_ps(lanes, out[r]);
                memcpy(y + (r0 + r) * ldy + c0, lanes, sizeof(float) * cols);
            }
        }
    }
    free(buf);
    _mm_free(stage);
    return 0;
}
#endif
