/* What every product kernel shares: scales widened from fp16, x's group sums, and what the
 * library says about itself (its build, the CPU it runs on). Every kernel file calls into
 * this one and none into another, so no two kernel files depend on each other. */
#include <stdint.h>
#include <string.h>

#include "packed.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* fp16 scales (formats whose scales are fp16 in the file: GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
 * widened to fp32, exactly: 2 bytes a group less to stream than fp32 */
#if !defined(__F16C__)
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else if (exp)
        bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (man) { /* subnormal: normalise */
        exp = 113;
        while (!(man & 1024)) man <<= 1, exp--;
        bits = sign | (exp << 23) | ((man & 1023) << 13);
    } else
        bits = sign;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif

void widen(const uint16_t *h, int64_t n, float *out) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
#if defined(__F16C__)
    for (; i < n; i++) out[i] = _cvtsh_ss(h[i]);
#else
    for (; i < n; i++) out[i] = half_to_float(h[i]);
#endif
}

/* rows [row, row + rows) of a [*, count] table of scales, as fp32: in place, or widened */
const float *packed_scales(const void *table, int half, int64_t row, int64_t rows,
                           int64_t count, float *buf) {
    if (!table) return NULL;
    if (!half) return (const float *)table + row * count;
    widen((const uint16_t *)table + row * count, rows * count, buf);
    return buf;
}

/* panel `at`'s scales and minimums from a weight's panel-major tables (packed.h's Panels):
 * fp32 ones read in place, fp16 ones widened into sbuf and mbuf; panel `next`'s asked for
 * into L2 (as the kernels do for its weights), none when next < 0 */
void panel_tables(const Panels *p, int half, int64_t at, int64_t next, int64_t G, float *sbuf,
                  float *mbuf, const float **s, const float **m) {
    const void *rs, *rm;
    int64_t count = G * p->width;
    panel_tables_raw(p, half, at, next, G, &rs, &rm);
    *s = packed_scales(rs, half, 0, 1, count, sbuf);
    *m = packed_scales(rm, half, 0, 1, count, mbuf);
}

void panel_tables_raw(const Panels *p, int half, int64_t at, int64_t next, int64_t G,
                      const void **s, const void **m) {
    int64_t count = G * p->width, size = (half ? 2 : 4) * count;
    if (next >= 0)
        for (int64_t b = 0; b < size; b += 64) {
            __builtin_prefetch((const char *)p->scale + next * size + b, 0, 2);
            if (p->mins) __builtin_prefetch((const char *)p->mins + next * size + b, 0, 2);
        }
    *s = (const char *)p->scale + at * size;
    *m = p->mins ? (const char *)p->mins + at * size : NULL;
}

/* sums of x over each group, xs[r * groups + g]: the same fixed order for every row */
void group_sums(const float *x, int64_t M, int64_t K, int64_t group, float *xs) {
    int64_t groups = K / group;
    for (int64_t r = 0; r < M; r++)
        for (int64_t g = 0; g < groups; g++) {
            float acc[8] = {0};
            const float *xg = x + r * K + g * group;
            for (int64_t k = 0; k < group; k += 8)
                for (int l = 0; l < 8; l++) acc[l] += xg[k + l];
            xs[r * groups + g] = lanes_sum8(acc);
        }
}

#ifndef SPECGEN_SOURCE_HASH
#define SPECGEN_SOURCE_HASH ""
#endif
const char *packed_source_hash(void) { return SPECGEN_SOURCE_HASH; }

const char *packed_isa(void) {
#if defined(WIDE) && defined(__AVX512VNNI__) && defined(__AMX_INT8__)
    return "avx512+vnni+amx";
#elif defined(WIDE) && defined(__AVX512VNNI__)
    return "avx512+vnni";
#elif defined(WIDE)
    return "avx512";
#elif defined(SIMD8) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    return "avx2+vnni";
#elif defined(SIMD8)
    return "avx2";
#else
    return "portable";
#endif
}
