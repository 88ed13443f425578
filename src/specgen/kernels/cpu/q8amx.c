/* 4-bit weights times 8-bit activations on AMX tiles (the amx build: Xeons from Sapphire
 * Rapids on), for products of many rows: a prompt's chunk, a batch, a verify block.
 *
 * Why: with vpdpbusd, 16 rows x 16 columns x one block of 32 weights is 128 dot products
 * and the CPU's VNNI port was the limit of a 256-row prefill (half its time in rows8_4).
 * One tdpbssd does the same integer work; what stays is the block's fp32 steps, which
 * packed.h fixes per output: acc = fma(s * d, D, acc) per block, then the group's minimum.
 * What bounds it: each block's 16 x 16 sums leave the tile through memory (tilestored, 1
 * KB; no AMX here moves a tile row into a vector), about 20 ns a block on this Xeon against
 * 6 ns for the product itself, so a 256-row prefill of the default went 1.3x faster, not 3x.
 *
 * The tiles: A = 16 rows of x's block (signed bytes, as quantized); B = the panel's block as
 * q8x16.c stages it (8 vectors of 4 bytes per column: already the tile's layout, 4
 * consecutive k per column; the 4-bit values 0..15 read as signed bytes alike); C = A B by
 * tdpbssd, the exact integer D of every row and column. Each output then takes exactly the
 * vector kernel's fp32 steps, in the same order, so the same bits whichever kernel ran
 * (tests/test_packed_amx.py). The tile products run AHEAD_BLOCKS blocks before the steps
 * that read them (a ring of RING slots), so the steps do not wait on each block's store.
 *
 * The process must ask Linux for the tiles' state once (arch_prctl); each thread loads the
 * tiles' shapes at the start of a product and releases them at its end. SPECGEN_CPU_AMX=0,
 * or packed_amx(0), leaves every product to the vector kernel. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "packed.h"

#if defined(WIDE) && defined(__AMX_INT8__) && defined(__AMX_TILE__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define T 16 /* rows per tile */
#define AHEAD_BLOCKS 2 /* blocks whose products run ahead of the fp32 steps */
#define RING 4         /* slots of block sums: AHEAD_BLOCKS + 2 */

static int state = -1; /* -1: not asked yet; 0: off; 1: on */

static int permitted(void) {
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return granted;
}

int packed_amx(int set) {
    if (set >= 0) {
        __atomic_store_n(&state, set && permitted(), __ATOMIC_RELEASE);
    } else if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) < 0) {
        const char *env = getenv("SPECGEN_CPU_AMX");
        __atomic_store_n(&state, !(env && env[0] == '0') && permitted(), __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&state, __ATOMIC_ACQUIRE);
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileShapes;
/* two of each: C 16 rows x 16 int32; A 16 rows x one block; B 8 x (16 columns x 4 bytes). In
 * read-only memory: GCC 12 dropped the stores of one built on the stack before ldtilecfg */
static const TileShapes SHAPES = {.palette = 1, .colsb = {64, 32, 64, 64, 32, 64},
                                  .rows = {T, T, 8, T, T, 8}};

int q8amx_start(const Q8Rows *x, int64_t group, const float *X, AmxRows *a) {
    int64_t K = x->K, nb = K / 32, G = K / group, M = x->M, Mp = (M + T - 1) / T * T;
    a->M = M, a->K = K;
    a->q = aligned_alloc(64, (size_t)(Mp * K)); /* each tile's blocks, 512 bytes apiece */
    a->d = calloc((size_t)(Mp * nb), sizeof(float));
    a->X = X ? calloc((size_t)(Mp * G), sizeof(float)) : NULL;
    a->c = aligned_alloc(64, sizeof(int32_t) * RING * T * 16);
    if (!a->q || !a->d || (X && !a->X) || !a->c) {
        q8amx_end(a);
        return -1;
    }
    for (int64_t r = 0; r < Mp; r++) /* row r of tile r / T: block b at ((r/T) nb + b) 512 */
        for (int64_t b = 0; b < nb; b++) {
            int8_t *to = a->q + ((r / T) * nb + b) * T * 32 + (r % T) * 32;
            if (r < M)
                memcpy(to, x->q + r * K + 32 * b, 32);
            else
                memset(to, 0, 32);
        }
    memcpy(a->d, x->d, sizeof(float) * M * nb);
    if (X) memcpy(a->X, X, sizeof(float) * M * G);
    _tile_loadconfig(&SHAPES);
    return 0;
}

void q8amx_end(AmxRows *a) {
    free(a->q), free(a->d), free(a->X), free(a->c);
    a->q = NULL, a->d = NULL, a->X = NULL, a->c = NULL;
    _tile_release();
}

/* D of block b for a tile of rows into c (16 x 16 int32): tiles 0-2, or 3-5 for odd b */
static inline void block_sum(const int8_t *q, const __m512i *w, int64_t b, int32_t *c) {
    if (b & 1) {
        _tile_loadd(4, q + T * 32 * b, 32);
        _tile_loadd(5, w + 8 * b, 64);
        _tile_zero(3);
        _tile_dpbssd(3, 4, 5);
        _tile_stored(3, c, 64);
    } else {
        _tile_loadd(1, q + T * 32 * b, 32);
        _tile_loadd(2, w + 8 * b, 64);
        _tile_zero(0);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, c, 64);
    }
}


void q8amx_panel(const AmxRows *a, const void *staged, int64_t group, const float *s,
                 const float *m, float *y, int64_t ldy, int64_t c0, int cols) {
    int64_t K = a->K, nb = K / 32, G = K / group;
    int per = 0; /* blocks per group: 1 << per */
    while ((32 << per) < group) per++;
    __mmask16 keep = (__mmask16)((1u << cols) - 1);
    const __m512i *w = staged;
    int32_t *ring = a->c; /* RING x 16 x 16 */
    for (int64_t r0 = 0; r0 < a->M; r0 += T) {
        int R = a->M - r0 < T ? (int)(a->M - r0) : T;
        const int8_t *q = a->q + r0 * K;
        /* the tile products run AHEAD_BLOCKS blocks before the fp32 steps that read them:
         * their stores (the tiles' slow part) then overlap the steps instead of waiting */
        for (int64_t b = 0; b < AHEAD_BLOCKS && b < nb; b++) block_sum(q, w, b, ring + 256 * (b % RING));
        __m512 acc[T];
        for (int r = 0; r < T; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (b + AHEAD_BLOCKS < nb)
                block_sum(q, w, b + AHEAD_BLOCKS, ring + 256 * ((b + AHEAD_BLOCKS) % RING));
            int64_t g = b >> per;
            const int32_t *c = ring + 256 * (b % RING);
            __m512 sv = _mm512_loadu_ps(s + g * 16);
            const float *d = a->d + r0 * nb + b;
#pragma GCC unroll 16
            for (int r = 0; r < T; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sv, _mm512_set1_ps(d[r * nb])),
                                         _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * r)),
                                         acc[r]);
            if (m && ((b + 1) & ((1 << per) - 1)) == 0) { /* the group's last block */
                __m512 mv = _mm512_loadu_ps(m + g * 16);
                const float *X = a->X + r0 * G + g;
#pragma GCC unroll 16
                for (int r = 0; r < T; r++)
                    acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(X[r * G]), acc[r]);
            }
        }
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + (r0 + r) * ldy + c0, keep, acc[r]);
    }
}

#else
int packed_amx(int set) { /* a build without the tiles: never on */
    (void)set;
    return 0;
}
#endif
