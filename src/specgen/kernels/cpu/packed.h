/* The CPU kernels' shared declarations: the product driver (packed.c), its kernels (fp32
 * activations: f32x8.c, f32x16.c; 8-bit activations: q8.c, q8x8.c, q8x16.c), the helpers
 * they all use (common.c), and what the fused decoder pass (decoder.c) calls. */
#pragma once
#include <stdint.h>

/* Which kernels this build runs: 16 lanes where the compiler targets AVX-512 (unless
 * SPECGEN_NARROW asks for the 8-lane ones: how an AVX-512 machine tests the AVX-VNNI path),
 * else 8 lanes with AVX2, else portable C. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(SPECGEN_NARROW)
#define WIDE 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define SIMD8 1
#endif

/* ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): 8 lanes summed by one fixed tree */
static inline float lanes_sum8(const float *a) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* A weight's scales and minimums again, laid out panel by panel: [ceil(N / width), G, width]
 * (a last panel of fewer columns repeats its last), as a kernel of that width reads them. A
 * kernel otherwise transposes a panel's [width, G] scales on every call, which was a sixth of
 * a decode step; with these it reads them in one sweep. The same values: the same bits. */
typedef struct {
    const void *scale, *mins; /* the dtype of the weight's own tables (fp16 with `half`) */
    int64_t width;            /* 0: none */
} Panels;

/* ---- common.c ---- */
/* n fp16 values widened to fp32 (exact) */
void widen(const uint16_t *h, int64_t n, float *out);

/* rows [row, row + rows) of a [*, count] table of scales as fp32: `table` itself, or
 * widened from fp16 into buf; NULL for a NULL table */
const float *packed_scales(const void *table, int half, int64_t row, int64_t rows,
                           int64_t count, float *buf);

/* panel `at` (of width p->width) of panel-major tables as fp32 [G, width]: *s and *m (NULL
 * without minimums) point into the tables or, for fp16 ones, into sbuf and mbuf, widened;
 * panel `next`'s are asked for into L2 (none when next < 0) */
void panel_tables(const Panels *p, int half, int64_t at, int64_t next, int64_t G, float *sbuf,
                  float *mbuf, const float **s, const float **m);
/* the same panel's tables as the weight keeps them (fp16 with `half`), not widened */
void panel_tables_raw(const Panels *p, int half, int64_t at, int64_t next, int64_t G,
                      const void **s, const void **m);

/* the build's description ("avx512+vnni", "avx2", "portable"...) and the hash of the sources
 * it was built from (pip's libraries are checked against their sources: kernels/cpu_build.py) */
const char *packed_isa(void);
const char *packed_source_hash(void);

/* xs[r * K/group + g]: the sum of row r of x over group g, in one fixed order */
void group_sums(const float *x, int64_t M, int64_t K, int64_t group, float *xs);

/* ---- fp32 activations ---- */
/* columns [n0, n1) of y = x W^T on the calling thread (y[r * ldy + n]); scales and
 * minimums fp32, or fp16 when `half`; xs: x's group sums when W has minimums; -1: out of
 * memory. packed.c's: the build's own kernel below. */
int packed_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
/* 16 lanes (f32x16.c: AVX-512 builds only) */
int wide_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                 const void *scale, const void *mins, int half, int64_t group, const float *xs,
                 int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
/* 8 lanes or portable C (f32x8.c) */
int narrow_columns(const float *x, int64_t M, int64_t K, const void *w, int bits,
                   const void *scale, const void *mins, int half, int64_t group, const float *xs,
                   int64_t n0, int64_t n1, float *y, int64_t ldy, int64_t direct_rows);
/* sum_g mins[g] xs[g] in one fixed order (0 when mins is NULL) */
float packed_offsets(const float *mins, int64_t groups, const float *xs);

/* ---- 8-bit activations (q8.c, q8x16.c, q8x8.c) ----
 * packed_linear's `act`: fp32 activations as they are, or quantized to 8 bits */
enum { ACT_F32 = 0, ACT_Q8 = 1, ACT_Q8_PORTABLE = 2 /* q8 on the portable kernel: for tests */ };
/*
 * x quantized per row and block of 32 columns, as llama.cpp's Q8_0 does: q = round(x * 127 /
 * amax) (ties to even), d = amax / 127 (0 for a zero block; NaN, q 0, for a block holding a
 * NaN or an infinity). Output (r, n) is then, in this order and in fp32 whatever the build:
 *     acc = 0; for each unit u of min(group, 32) columns, in column order:
 *         acc = fma(s[n, g(u)] * d[r, b(u)], D(u), acc)   D: the exact integer sum of q_w q_x
 *         after a group's last unit: acc = fma(m[n, g], X[r, g], acc)
 *     with X[r, g] = sum over g's blocks b, in order, of fma(d[r, b], S(b), X), S: sum of q_x
 * so a row's result depends on nothing but the row (no lane tree, no tile, no thread), and
 * every build computes the same bits. */
typedef struct {
    const int8_t *q;     /* [M, K] */
    const float *d;      /* [M, K/32] */
    const int32_t *sums; /* [M, K/16]: sum of q over each half block */
    int64_t M, K;
} Q8Rows;

/* rows of x quantized into q [M, K], d [M, K/32], sums [M, K/16] */
void q8_quantize(const float *x, int64_t M, int64_t K, int8_t *q, float *d, int32_t *sums);

/* bytes of scratch q8_quantize's outputs take for M rows of K (each part 64-byte aligned) */
int64_t q8_bytes(int64_t M, int64_t K);
/* q8_quantize into `buf` (q8_bytes of it), described by *rows */
void q8_rows(const float *x, int64_t M, int64_t K, void *buf, Q8Rows *rows);
/* where q8_rows puts M rows of K in `buf`, without quantizing anything */
void q8_layout(int64_t M, int64_t K, void *buf, Q8Rows *rows);
/* row r of a layout, quantized from x[0..K) (the rows' owner may fill them in any order) */
void q8_row(const float *x, int64_t r, const Q8Rows *rows);

/* columns [n0, n1) of y = x W^T from quantized rows, on the calling thread; -1: out of
 * memory. The build's widest kernel (q8x16_columns, q8x8_columns), or the portable one
 * (always it with `reference`: the same bits, which tests check); `panels` (or NULL) is
 * read by a kernel of its width when n0 starts a panel */
int q8_columns(const Q8Rows *x, const void *w, int bits, const void *scale, const void *mins,
               int half, int64_t group, int64_t n0, int64_t n1, float *y, int64_t ldy,
               const Panels *panels, int reference);

/* the kernels q8_columns runs: 16 lanes (AVX-512), 8 (AVX2); each takes a panel of as many
 * columns at a time, its scales and minimums as fp32 [G, panel] (q8_panel_scales) */
int q8x16_columns(const Q8Rows *x, const void *w, int bits, const void *scale,
                  const void *mins, int half, int64_t group, int64_t n0, int64_t n1, float *y,
                  int64_t ldy, const Panels *panels);
int q8x8_columns(const Q8Rows *x, const void *w, int bits, const void *scale, const void *mins,
                 int half, int64_t group, int64_t n0, int64_t n1, float *y, int64_t ldy,
                 const Panels *panels);
/* X[r, g] of the rows for groups of `group` columns ([M, K/group]) */
void q8_group_sums(const Q8Rows *x, int64_t group, float *X);
/* a panel's scales (or minimums) as fp32 [G, P], columns past `cols` repeating the last */
void q8_panel_scales(const void *table, int half, int64_t n0, int cols, int P, int64_t G,
                     float *out);

/* ---- AMX tiles (q8amx.c: the amx build) ----
 * whether products of many rows with 4-bit weights run on the tiles: set 0 (off) or 1 (on,
 * where the CPU and Linux allow), or -1 to ask (first asked: on unless SPECGEN_CPU_AMX=0) */
int packed_amx(int set);
#if defined(WIDE) && defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define AMX 1
/* a product's rows as the tiles read them (the last tile's padded with q 0, its d and X 0),
 * and the scratch of a tile's block sums; q8amx_start loads the thread's tile shapes,
 * q8amx_end releases them */
typedef struct {
    int8_t *q;       /* [M rounded up to 16, K] as tiles: [M / 16, K / 32, 16, 32] */
    float *d;        /* [M rounded up to 16, K/32] */
    float *X;        /* [.., K/group], or NULL without minimums */
    int32_t *c;      /* [K/32, 16, 16] */
    int64_t M, K;
} AmxRows;
int q8amx_start(const Q8Rows *x, int64_t group, const float *X, AmxRows *a);
void q8amx_end(AmxRows *a);
/* the rows times one staged panel of 16 columns (its scales and minimums [G, 16]) into
 * y[r * ldy + c0 + c] for c < cols */
void q8amx_panel(const AmxRows *a, const void *staged, int64_t group, const float *s,
                 const float *m, float *y, int64_t ldy, int64_t c0, int cols);
#endif
