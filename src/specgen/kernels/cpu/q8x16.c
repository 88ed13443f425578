/* 8-bit-activation products in 16 lanes (AVX-512; vpdpbusd where the CPU has VNNI, else
 * vpmaddubsw + vpmaddwd): packed.h's arithmetic, every lane one output column.
 *
 * Why lanes across columns: an output's fp32 steps come once per block of 32 weights (its
 * scales), so with lanes along K every row would pay for summing lanes and for its scales
 * block by block, as many instructions as the integer products themselves. With one column
 * per lane, the block's 16 columns x 32 weights are turned once into 8 vectors of 4 bytes per
 * column (shared by every row), and a row then costs 8 integer dot products, one conversion
 * and two fp32 steps per 512 weights. The weights stay as the file keeps them: the turn is an
 * in-register transposition of 16 bytes per column (unpacks), not a copy in memory.
 *
 * 4-bit blocks: byte j of a column's 16 holds columns j (low nibble) and j + 16 (high), so
 * after the transposition vector t's low nibbles meet x's bytes 4t..4t+3 and its high
 * nibbles x's bytes 16 + 4t... 8-bit blocks: two halves of 16 bytes, transposed alike.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packed.h"

#if defined(WIDE)
#include <immintrin.h>

#define P 16 /* columns per panel, one per lane */
/* rows per register block: 8, so that a verify block of up to 8 rows turns each block of
 * weights once, in registers (with 4, rows 5-8 staged the weights in scratch and read them
 * twice: a 5-row block cost 1.5-1.6 decode steps against 1.3 now, 8 rows 1.9-2.1 against
 * 1.8; the accumulators of 8 rows still fit beside the weights' 8 vectors) */
#define RB 8
/* more rows than this: each panel's weights are turned once into scratch, then every block
 * of RB rows reads them from there (with fewer, the turn is redone per block of rows) */
#define DIRECT 8
/* at least this many rows with 4-bit weights: on the tiles where the build and CPU have them
 * (q8amx.c) */
#define AMX_ROWS 16
#if defined(__AVX512VNNI__)
#define VNNI 1
#else
#define VNNI 0
#endif

/* 16 bytes at p[c] + off for the 16 columns c, as 4 vectors: z[t] lane c = p[c]'s dword t */
static inline void transpose(const uint8_t *const *p, int64_t off, __m512i *z) {
    __m512i a[4];
    for (int i = 0; i < 4; i++) { /* 128-bit lane L of a[i]: column 4L + i */
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[i] + off)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[4 + i] + off)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[8 + i] + off)), 2);
        a[i] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p[12 + i] + off)), 3);
    }
    __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
    __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
    z[0] = _mm512_unpacklo_epi64(t0, t2);
    z[1] = _mm512_unpackhi_epi64(t0, t2);
    z[2] = _mm512_unpacklo_epi64(t1, t3);
    z[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* x's bytes 4t..4t+3 of a block, in every lane */
static inline __m512i xword(const int8_t *xb, int t) {
    int32_t v;
    memcpy(&v, xb + 4 * t, 4);
    return _mm512_set1_epi32(v);
}

/* block b's weights for the panel as 8 vectors: 4-bit, the low nibbles of transposed dwords
 * 0..3 then their high nibbles; 8-bit, bytes 0..15 then 16..31, made unsigned with VNNI (w +
 * 128: the row's sums take the 128 back out), signed without (signs8 splits them) */
static inline void block_weights(const uint8_t *const *p, int bits, int64_t b, __m512i *z) {
    if (bits == 4) {
        __m512i raw[4], low = _mm512_set1_epi8(15);
        transpose(p, 16 * b, raw);
        for (int t = 0; t < 4; t++) {
            z[t] = _mm512_and_si512(raw[t], low);
            z[4 + t] = _mm512_and_si512(_mm512_srli_epi16(raw[t], 4), low);
        }
        return;
    }
    transpose(p, 32 * b, z);
    transpose(p, 32 * b + 16, z + 4);
#if defined(__AVX512VNNI__)
    for (int t = 0; t < 8; t++) z[t] = _mm512_xor_si512(z[t], _mm512_set1_epi8((char)0x80));
#endif
}

/* A decode step waits on memory: a panel's 16 rows of W lie one after another, but read
 * block by block they are 16 streams the hardware did not follow (the products took twice
 * the fp32 kernel's time on a step). So each block asks for its share of the panel AHEAD
 * panels on: the same bytes as its own, 4 lines (4-bit) or 8 (8-bit), into L2 (into L1, a
 * burst of them was a step a third slower; 2, 4 and 8 panels ahead measured alike, 4 best). */
#define AHEAD 4
static inline void prefetch_next(const uint8_t *const *p, int bits, int64_t K, int64_t b) {
    int64_t share = bits == 4 ? 256 : 512; /* a block's bytes in a panel */
    const char *next = (const char *)p[0] + AHEAD * P * (bits == 4 ? K / 2 : K) + b * share;
    for (int64_t at = 0; at < share; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
}

/* 8-bit without VNNI: z's magnitudes (unsigned for vpmaddubsw) and its signs, which each row
 * moves onto x */
static inline void signs8(__m512i *z, __mmask64 *neg) {
    for (int t = 0; t < 8; t++) {
        neg[t] = _mm512_movepi8_mask(z[t]);
        z[t] = _mm512_abs_epi8(z[t]);
    }
}

/* a row's integer sum of block b, 4-bit: in two chains, so that the dot products of 4 rows
 * do not wait on each other (one chain each was 7% slower per row) */
static inline __m512i sums4(const __m512i *z, const int8_t *xb) {
#if defined(__AVX512VNNI__)
    __m512i a = _mm512_setzero_si512(), c = _mm512_setzero_si512();
    for (int t = 0; t < 4; t++) {
        a = _mm512_dpbusd_epi32(a, z[t], xword(xb, t));
        c = _mm512_dpbusd_epi32(c, z[4 + t], xword(xb, 4 + t));
    }
    return _mm512_add_epi32(a, c);
#else
    /* pairs of products in 16 bits: at most 2 * 15 * 127 each, 8 of them still fit */
    __m512i s = _mm512_maddubs_epi16(z[0], xword(xb, 0));
    for (int t = 1; t < 8; t++) s = _mm512_add_epi16(s, _mm512_maddubs_epi16(z[t], xword(xb, t)));
    return _mm512_madd_epi16(s, _mm512_set1_epi16(1));
#endif
}

/* 8-bit: the two halves' sums (s0, s1: the row's sums of q over each half) */
static inline void sums8(const __m512i *z, const __mmask64 *neg, const int8_t *xb, int32_t s0,
                         int32_t s1, __m512i *h0, __m512i *h1) {
#if defined(__AVX512VNNI__)
    (void)neg;
    __m512i a = _mm512_set1_epi32(-128 * s0), c = _mm512_set1_epi32(-128 * s1);
    for (int t = 0; t < 4; t++) {
        a = _mm512_dpbusd_epi32(a, z[t], xword(xb, t));
        c = _mm512_dpbusd_epi32(c, z[4 + t], xword(xb, 4 + t));
    }
    *h0 = a, *h1 = c;
#else
    (void)s0, (void)s1;
    /* |w| times x with w's sign: pairs at most 2 * 128 * 127, one pair sum per 16 bits */
    __m512i one = _mm512_set1_epi16(1), zero = _mm512_setzero_si512(), h[2];
    for (int half = 0; half < 2; half++) {
        __m512i acc = zero;
        for (int t = 4 * half; t < 4 * half + 4; t++) {
            __m512i x = xword(xb, t);
            x = _mm512_mask_sub_epi8(x, neg[t], zero, x);
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(z[t], x), one));
        }
        h[half] = acc;
    }
    *h0 = h[0], *h1 = h[1];
#endif
}

/* r[i] lane j -> r[j] lane i: 16 x 16 floats in 64 shuffles */
static inline void transpose_ps(__m512 *r) {
    __m512 t[16], u[16];
    for (int a = 0; a < 8; a++) { /* rows 2a, 2a + 1 interleaved */
        t[2 * a] = _mm512_unpacklo_ps(r[2 * a], r[2 * a + 1]);
        t[2 * a + 1] = _mm512_unpackhi_ps(r[2 * a], r[2 * a + 1]);
    }
    for (int b = 0; b < 4; b++) { /* u[4b + j], 128-bit lane L: column 4L + j of rows 4b.. */
        u[4 * b] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0x44);
        u[4 * b + 1] = _mm512_shuffle_ps(t[4 * b], t[4 * b + 2], 0xEE);
        u[4 * b + 2] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0x44);
        u[4 * b + 3] = _mm512_shuffle_ps(t[4 * b + 1], t[4 * b + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        __m512 v = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), w = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
        __m512 w2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
        r[j] = _mm512_shuffle_f32x4(v, v2, 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(v, v2, 0xDD);
        r[8 + j] = _mm512_shuffle_f32x4(w, w2, 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(w, w2, 0xDD);
    }
}

/* q8_panel_scales for a panel of 16: 16 groups of the 16 columns at a time, transposed in
 * registers (a scalar copy was most of a decode step's products) */
static void panel_scales(const void *table, int half, int64_t n0, int cols, int64_t G,
                         float *out) {
    for (int64_t g0 = 0; g0 < G; g0 += P) {
        int len = G - g0 < P ? (int)(G - g0) : P;
        __mmask16 k = (__mmask16)((1u << len) - 1);
        __m512 r[P];
        for (int c = 0; c < P; c++) {
            int64_t at = (n0 + (c < cols ? c : cols - 1)) * G + g0;
            r[c] = half ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, (const uint16_t *)table + at))
                        : _mm512_maskz_loadu_ps(k, (const float *)table + at);
        }
        transpose_ps(r);
        for (int g = 0; g < len; g++) _mm512_storeu_ps(out + (g0 + g) * P, r[g]);
    }
}

/* 16 of a panel's scales (or minimums) at element `at`: fp32, or fp16 widened here, once a
 * block for all its rows (widening a panel's tables into a buffer first was 4% of an
 * 8-client server's time) */
static inline __m512 scales16(const void *t, int64_t at, int half) {
    if (half) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)t + at)));
    return _mm512_loadu_ps((const float *)t + at);
}

/* R rows (compile-time, so accumulators stay in registers) against one panel: its weights
 * from p[c] (column c's row of W), or already turned, from `staged` (8 vectors a block);
 * s, m [G, P], fp32 or fp16 (`sh`); X [rows, G]. acc: R vectors out. */
#define KERNEL(NAME, R, BITS)                                                                  \
    static void NAME(const Q8Rows *x, int64_t r0, const uint8_t *const *p,                     \
                     const __m512i *staged, int64_t group, const void *s, const void *m,       \
                     int sh, const float *X, __m512 *out) {                                    \
        int64_t K = x->K, nb = K / 32, G = K / group;                                          \
        int per = 0; /* blocks per group: 1 << per (group 16: one block, two groups) */        \
        while (group > 32 && (32 << per) < group) per++;                                       \
        __m512 acc[R];                                                                         \
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                              \
        for (int64_t b = 0; b < nb; b++) {                                                     \
            __m512i z[8];                                                                      \
            __mmask64 neg[8];                                                                  \
            if (staged)                                                                        \
                for (int t = 0; t < 8; t++) z[t] = _mm512_load_si512(staged + 8 * b + t);      \
            else {                                                                             \
                prefetch_next(p, BITS, K, b);                                                  \
                block_weights(p, BITS, b, z);                                                  \
            }                                                                                  \
            if (BITS == 8 && !VNNI) signs8(z, neg);                                            \
            int64_t g = group == 16 ? 2 * b : b >> per;                                        \
            int last = ((b + 1) & ((1 << per) - 1)) == 0;                                      \
            __m512 s0 = scales16(s, g * P, sh), m0 = m ? scales16(m, g * P, sh) : s0, s1 = s0, m1 = m0; \
            if (BITS == 8 && group == 16) {                                                    \
                s1 = scales16(s, g * P + P, sh);                                               \
                if (m) m1 = scales16(m, g * P + P, sh);                                        \
            }                                                                                  \
            for (int r = 0; r < R; r++) {                                                      \
                int64_t row = r0 + r;                                                          \
                const int8_t *xb = x->q + row * K + 32 * b;                                    \
                __m512 d = _mm512_set1_ps(x->d[row * nb + b]);                                 \
                const float *Xr = m ? X + row * G : NULL;                                      \
                if (BITS == 4) {                                                               \
                    __m512i D = sums4(z, xb);                                          \
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(s0, d), _mm512_cvtepi32_ps(D), acc[r]); \
                    if (m && last) acc[r] = _mm512_fmadd_ps(m0, _mm512_set1_ps(Xr[g]), acc[r]); \
                    continue;                                                                  \
                }                                                                              \
                const int32_t *hs = x->sums + row * (K / 16) + 2 * b;                          \
                __m512i h0, h1;                                                                \
                sums8(z, neg, xb, hs[0], hs[1], &h0, &h1);                                     \
                if (group == 16) {                                                             \
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(s0, d), _mm512_cvtepi32_ps(h0), acc[r]); \
                    if (m) acc[r] = _mm512_fmadd_ps(m0, _mm512_set1_ps(Xr[g]), acc[r]);        \
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(s1, d), _mm512_cvtepi32_ps(h1), acc[r]); \
                    if (m) acc[r] = _mm512_fmadd_ps(m1, _mm512_set1_ps(Xr[g + 1]), acc[r]);    \
                    continue;                                                                  \
                }                                                                              \
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(s0, d),                                 \
                                         _mm512_cvtepi32_ps(_mm512_add_epi32(h0, h1)), acc[r]); \
                if (m && last) acc[r] = _mm512_fmadd_ps(m0, _mm512_set1_ps(Xr[g]), acc[r]);    \
            }                                                                                  \
        }                                                                                      \
        for (int r = 0; r < R; r++) out[r] = acc[r];                                           \
    }
KERNEL(rows1_4, 1, 4)
KERNEL(rows2_4, 2, 4)
KERNEL(rows3_4, 3, 4)
KERNEL(rows4_4, 4, 4)
KERNEL(rows5_4, 5, 4)
KERNEL(rows6_4, 6, 4)
KERNEL(rows7_4, 7, 4)
KERNEL(rows8_4, 8, 4)
KERNEL(rows1_8, 1, 8)
KERNEL(rows2_8, 2, 8)
KERNEL(rows3_8, 3, 8)
KERNEL(rows4_8, 4, 8)
KERNEL(rows5_8, 5, 8)
KERNEL(rows6_8, 6, 8)
KERNEL(rows7_8, 7, 8)
KERNEL(rows8_8, 8, 8)
typedef void (*Kernel)(const Q8Rows *, int64_t, const uint8_t *const *, const __m512i *, int64_t,
                       const void *, const void *, int, const float *, __m512 *);
static const Kernel BY[2][RB] = {
    {rows1_8, rows2_8, rows3_8, rows4_8, rows5_8, rows6_8, rows7_8, rows8_8},
    {rows1_4, rows2_4, rows3_4, rows4_4, rows5_4, rows6_4, rows7_4, rows8_4}};

int q8x16_columns(const Q8Rows *x, const void *w, int bits, const void *scale,
                  const void *mins, int half, int64_t group, int64_t n0, int64_t n1, float *y,
                  int64_t ldy, const Panels *panels) {
    int64_t K = x->K, G = K / group, row = bits == 4 ? K / 2 : K, nb = K / 32;
#if defined(AMX)
    int amx = bits == 4 && group >= 32 && x->M >= AMX_ROWS && packed_amx(-1) == 1;
#else
    int amx = 0;
#endif
    int staged = x->M > DIRECT || amx;
    float *buf = malloc(sizeof(float) * (2 * P * G + x->M * G));
    __m512i *stage = staged ? _mm_malloc(sizeof(__m512i) * 8 * nb, 64) : NULL;
    if (!buf || (staged && !stage)) {
        free(buf);
        _mm_free(stage);
        return -1;
    }
    float *s = buf, *m = mins ? buf + P * G : NULL, *X = mins ? buf + 2 * P * G : NULL;
    if (mins) q8_group_sums(x, group, X);
#if defined(AMX)
    AmxRows tiles;
    if (amx && q8amx_start(x, group, X, &tiles)) amx = 0; /* no memory for it: vectors */
#endif
    if (panels && (panels->width != P || n0 % P)) panels = NULL;
    for (int64_t c0 = n0; c0 < n1; c0 += P) {
        int cols = n1 - c0 < P ? (int)(n1 - c0) : P;
        const uint8_t *p[P]; /* a last panel of fewer columns repeats its last (not stored) */
        for (int c = 0; c < P; c++) p[c] = (const uint8_t *)w + (c0 + (c < cols ? c : cols - 1)) * row;
        const void *ps = s, *pm = m; /* the panel's scales and minimums, [G, P] */
        int sh = 0;                  /* fp16 tables, widened by the kernel */
        if (panels) {
            int64_t next = c0 + AHEAD * P < n1 ? c0 / P + AHEAD : -1;
            if (amx) { /* the tiles' kernel takes fp32 tables */
                const float *fs, *fm;
                panel_tables(panels, half, c0 / P, next, G, s, m, &fs, &fm);
                ps = fs, pm = fm;
            } else {
                panel_tables_raw(panels, half, c0 / P, next, G, &ps, &pm);
                sh = half;
            }
        } else {
            panel_scales(scale, half, c0, cols, G, s);
            if (mins) panel_scales(mins, half, c0, cols, G, m);
        }
        __mmask16 keep = (__mmask16)((1u << cols) - 1);
        if (stage)
            for (int64_t b = 0; b < nb; b++) {
                __m512i z[8];
                prefetch_next(p, bits, K, b);
                block_weights(p, bits, b, z);
                for (int t = 0; t < 8; t++) _mm512_store_si512(stage + 8 * b + t, z[t]);
            }
#if defined(AMX)
        if (amx) {
            q8amx_panel(&tiles, stage, group, ps, pm, y, ldy, c0, cols);
            continue;
        }
#endif
        for (int64_t r0 = 0; r0 < x->M; r0 += RB) {
            int R = x->M - r0 < RB ? (int)(x->M - r0) : RB;
            __m512 out[RB];
            BY[bits == 4][R - 1](x, r0, p, stage, group, ps, pm, sh, X, out);
            for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + c0, keep, out[r]);
        }
    }
#if defined(AMX)
    if (amx) q8amx_end(&tiles);
#endif
    free(buf);
    _mm_free(stage);
    return 0;
}
#endif
