/* One forward pass of a Llama-shaped decoder with packed weights, whole, in one call: a
 * decode step (1 token), a verify block (a few) or a prefill (many).
 *
 * Why: in eager torch a layer is some twenty small ops, each a few microseconds of
 * dispatch, and every packed product is a ctypes call that wakes the OpenMP threads; on a
 * 135M model that overhead was a third of the step. Here the threads are woken once per
 * pass and meet at a spinning barrier between the phases of each layer.
 *
 * What it computes is models/layers/decoder.py's layer (RMSNorm, fused q/k/v with optional
 * bias and per-head q/k RMSNorm, HF "rotate half" RoPE from the model's tables, grouped-
 * query causal attention over the static KV cache, fused gate/up SwiGLU), then the final
 * norm and the LM head, in fp32. Products are packed.c's (with fp32 or 8-bit activations,
 * as the model says), so they are batch-invariant;
 * everything else here is computed per row in a fixed order that does not depend on how
 * many rows the pass has, or on the thread count. A verify block's rows therefore equal
 * decode steps bit for bit, which is what keeps every method greedy-identical to AR.
 */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "packed.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SIMD 1
#endif

typedef struct {          /* rows [row0, row0 + rows) of a weight */
    int64_t row0, rows;
    int32_t bits, group;  /* bits 0: dense fp32, q is float [rows, K] */
    int32_t half, unused; /* scales and minimums fp16 (else fp32) */
    const void *q;
    const void *scale, *mins; /* mins NULL for symmetric formats */
    Panels panels;            /* the same scales and mins panel by panel (width 0: none) */
} Seg;

typedef struct {
    const Seg *segs;
    int64_t nsegs;
    const float *bias; /* [N] or NULL */
    int64_t N, K;
} Lin;

typedef struct {
    Lin qkv, o, gate_up, down;
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm; /* q/k norms NULL when absent */
} Layer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, vocab, capacity, direct_rows;
    int64_t act; /* ACT_F32 or ACT_Q8: what the products multiply (packed.h) */
    double eps, attn_scale;
    const Layer *layer;
    const float *norm; /* the final norm */
    Lin head;
    const float *cos, *sin; /* RoPE tables [capacity, head_dim] */
    void *k, *v;            /* the cache: [layers, kv_heads, capacity, head_dim] each */
    int64_t kv_half;        /* keys and values are kept as IEEE halves (else fp32): see KV */
} Model;

/* ---- a barrier that spins briefly, then sleeps ---------------------------------------
 * Phases last tens of microseconds in a decode step; sleeping in the kernel between them
 * (libgomp's barrier after its short spin) cost more than a phase. A wait longer than the
 * spin (a prefill's long phases, a partner thread preempted on a busy machine) sleeps on a
 * futex: yielding instead handed the core to any runnable process for a whole time slice,
 * which made 2-thread prefills beside niced jobs slower than one thread. */
#define SPINS 4000
typedef struct {
    atomic_int count, sense, sleepers;
    int n;
} Barrier;

#ifdef __linux__
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static void barrier_wait(Barrier *b, int *mine) {
    int s = !*mine;
    *mine = s;
    if (atomic_fetch_add(&b->count, 1) == b->n - 1) {
        atomic_store(&b->count, 0);
        atomic_store(&b->sense, s);
#ifdef __linux__
        if (atomic_load(&b->sleepers))
            syscall(SYS_futex, (int *)&b->sense, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
        return;
    }
    for (long i = 0; atomic_load_explicit(&b->sense, memory_order_acquire) != s; i++) {
#ifdef SIMD
        if (i < SPINS) {
            _mm_pause();
            continue;
        }
#endif
#ifdef __linux__
        atomic_fetch_add(&b->sleepers, 1);
        if (atomic_load(&b->sense) != s) /* the releaser sees us, or we see its release */
            syscall(SYS_futex, (int *)&b->sense, FUTEX_WAIT_PRIVATE, !s, NULL, NULL, 0);
        atomic_fetch_sub(&b->sleepers, 1);
#else
        sched_yield();
#endif
    }
}

/* [a, b): this thread's share of n items, in units of `unit` (contiguous, in order) */
static void share(int64_t n, int64_t unit, int id, int nt, int64_t *a, int64_t *b) {
    int64_t units = (n + unit - 1) / unit, per = units / nt, extra = units % nt;
    int64_t u0 = id * per + (id < extra ? id : extra), u1 = u0 + per + (id < extra);
    *a = u0 * unit < n ? u0 * unit : n;
    *b = u1 * unit < n ? u1 * unit : n;
}

/* the first of n items whose running cost (prefix[i]: items [0, i)) reaches `at` */
static int64_t reach_cost(const int64_t *prefix, int64_t n, int64_t at) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (prefix[mid] < at) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* thread id's items of n by cost, not count: [a, b), about 1 / nt of prefix[n] each */
static void share_cost(const int64_t *prefix, int64_t n, int id, int nt, int64_t *a, int64_t *b) {
    *a = id == 0 ? 0 : reach_cost(prefix, n, prefix[n] * id / nt);
    *b = id == nt - 1 ? n : reach_cost(prefix, n, prefix[n] * (id + 1) / nt);
}

/* ---- keys and values as halves (KV) -----------------------------------------------
 * A decode step at a long context, and a pass of several answers, read every position's
 * keys and values from memory (46 KB a position for the default in fp32: at 8 answers of
 * 500 positions, twice its weights). Kept as IEEE halves (llama.cpp's default) they are
 * half that. Rounding is to nearest even, as F16C's instruction and torch's conversion do,
 * so the eager layers writing the same cache store the same bits. */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, nan (quiet, payload kept in part) */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (a < 0x38800000u) {                                  /* below 2^-14: a subnormal half */
        if (a < 0x33000000u) return (uint16_t)sign;         /* below half the least: zero */
        /* a = 1.m * 2^(E - 127) = mant * 2^(E - 150) = (mant >> (126 - E)) * 2^-24 */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);
        uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        q += rest > half || (rest == half && (q & 1));
        return (uint16_t)(sign | q);
    }
    uint32_t q = (a >> 13) - (112u << 10), rest = a & 0x1fffu; /* rebias 127 -> 15 */
    q += rest > 0x1000u || (rest == 0x1000u && (q & 1));
    return (uint16_t)(sign | q);
}

static float from_half(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 31) x = sign | 0x7f800000u | (m << 13);
    else if (e) x = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) x = sign;
    else { /* subnormal: normalise */
        e = 113;
        while (!(m & 0x400u)) m <<= 1, e--;
        x = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* n floats into the cache at `to` (fp32, or halves when `half`) */
static void kv_store(void *to, const float *from, int64_t n, int half) {
    if (!half) {
        memcpy(to, from, sizeof(float) * n);
        return;
    }
    uint16_t *h = to;
    int64_t i = 0;
#ifdef SIMD
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) h[i] = to_half(from[i]);
}

/* n halves widened into floats (exactly) */
static void kv_widen(float *to, const uint16_t *from, int64_t n) {
    int64_t i = 0;
#ifdef SIMD
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(to + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(from + i))));
#endif
    for (; i < n; i++) to[i] = from_half(from[i]);
}

/* kv_store's rounding, exported for its test: `portable` takes the scalar path on a SIMD
 * build too (a portable build has only that one) */
void decoder_kv_round(const float *x, uint16_t *out, int64_t n, int portable) {
    if (portable)
        for (int64_t i = 0; i < n; i++) out[i] = to_half(x[i]);
    else
        kv_store(out, x, n, 1);
}

/* ---- per-row pieces, each in one fixed order --------------------------------------- */
static float dot(const float *a, const float *b, int64_t n) {
#ifdef SIMD
    if (n % 8 == 0) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b));
        for (int64_t i = 8; i < n; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        float l[8];
        _mm256_storeu_ps(l, acc);
        return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
#endif
    float l[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) l[j] = fmaf(a[i + j], b[i + j], l[j]);
    float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* out = w * x / sqrt(mean(x^2) + eps); the squares summed in double, in a fixed order
 * (8 lanes' partial sums when n is whole vectors: one chain of n additions waited on each
 * one's latency, a tenth of a prefill with every thread norming every row) */
static void rms_norm(const float *x, const float *w, int64_t n, double eps, float *out) {
    double ss = 0.0;
#ifdef SIMD
    if (n % 8 == 0) {
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        for (int64_t i = 0; i < n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
            __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            lo = _mm256_fmadd_pd(a, a, lo); /* a float's square is exact in double */
            hi = _mm256_fmadd_pd(b, b, hi);
        }
        double l[4], h[4];
        _mm256_storeu_pd(l, lo);
        _mm256_storeu_pd(h, hi);
        ss = ((l[0] + l[2]) + (l[1] + l[3])) + ((h[0] + h[2]) + (h[1] + h[3]));
        float r = (float)(1.0 / sqrt(ss / (double)n + eps));
        __m256 rv = _mm256_set1_ps(r);
        for (int64_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i),
                                                    _mm256_mul_ps(_mm256_loadu_ps(x + i), rv)));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* HF "rotate half": (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in place */
static void rope(float *x, const float *cos, const float *sin, int64_t d) {
    int64_t h = d / 2;
    for (int64_t i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}


/* ---- products ------------------------------------------------------------------------ */
/* columns [a, b) of y[M, ldy] = x[M, K] W^T (+ bias); xq: x quantized (the packed segments'
 * input when the model's products take 8-bit activations), else NULL */
static int lin_columns(const Lin *w, const float *x, const Q8Rows *xq, int64_t M, int64_t a,
                       int64_t b, float *y, int64_t ldy, int64_t direct_rows, float *xs) {
    for (int64_t s = 0; s < w->nsegs; s++) {
        const Seg *g = &w->segs[s];
        int64_t lo = a > g->row0 ? a : g->row0, hi = b < g->row0 + g->rows ? b : g->row0 + g->rows;
        if (lo >= hi) continue;
        if (g->bits == 0) {
            const float *d = (const float *)g->q;
            for (int64_t r = 0; r < M; r++)
                for (int64_t n = lo; n < hi; n++)
                    y[r * ldy + n] = dot(x + r * w->K, d + (n - g->row0) * w->K, w->K);
            continue;
        }
        if (xq) {
            if (q8_columns(xq, g->q, g->bits, g->scale, g->mins, g->half, g->group,
                           lo - g->row0, hi - g->row0, y + g->row0, ldy, &g->panels, 0))
                return -1;
            continue;
        }
        if (g->mins) group_sums(x, M, w->K, g->group, xs);
        if (packed_columns(x, M, w->K, g->q, g->bits, g->scale, g->mins, g->half, g->group, xs,
                           lo - g->row0, hi - g->row0, y + g->row0, ldy, direct_rows))
            return -1;
    }
    if (w->bias)
        for (int64_t r = 0; r < M; r++)
            for (int64_t n = a; n < b; n++) y[r * ldy + n] += w->bias[n];
    return 0;
}

/* Several queries over one KV head's keys and values: a row's query heads sharing it, a
 * block's rows. They go through the keys a tile (TILE_BYTES) at a time, every query its
 * part of the tile before the next tile, and then so through the values: a tile comes
 * from memory or L2 once and from L1 for the others. Query after query over the whole
 * head, each read all of it from L2 again: 8 extra rows at context 1500 cost 1.2 ms each,
 * twice their multiply-adds. Each query's arithmetic is the same either way, in the same
 * order: the tiles only interleave independent queries' work. */
typedef struct {
    const float *q; /* d floats */
    float *out;     /* d floats */
    int64_t n;      /* keys it sees: 0 .. n - 1 */
} Query;

#define TILE_BYTES (16 << 10)
#define RUN_QUERIES 24 /* queries in one run at most (each keeps its scores: RUN_QUERIES rows) */
#define QUERY_COST 16 /* a query's work besides its keys (its softmax, its output), in keys */

#ifdef SIMD
/* e^x for 8 lanes, x <= 0 here: Cephes' single-precision polynomial after reducing by
 * ln 2 (within 2 ulp of expf). glibc's scalar expf was most of a long context's step. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* A long context's keys and values come from memory (a decode step at context 2000 read
 * 92 MB of them, more than the weights), one thread's stream at ~11 GB/s: each group of 8
 * keys asks for the group KEYS_AHEAD on, each value for the one VALUES_AHEAD on, into L2
 * (the first head of each KV head went ~10% faster); in a run, the first query to reach a
 * tile asks for what lies ahead of it */
#define KEYS_AHEAD 4
#define VALUES_AHEAD 32
/* 8 sums of 8 lanes each: s[i] = ((a_i0 + a_i1) + (a_i2 + a_i3)) + ((a_i4 + a_i5) + (a_i6 + a_i7)) */
static inline __m256 sums8(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* 8 of the cache's values at element `at` of `base` as floats: fp32, or halves widened
 * (exactly); `half` is a constant where this is inlined, so each kind has its own loop */
static inline __attribute__((always_inline)) __m256 kv8(const void *base, int64_t at, int half) {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + at)));
    return _mm256_loadu_ps((const float *)base + at);
}

/* one query's scores for key groups [g0, g1) of 8 keys (the last group repeats key n - 1,
 * which the softmax then drops, so every key's score is the same arithmetic whatever the
 * number of keys around it), the running maximum in `top`; `ahead`: ask for the keys
 * KEYS_AHEAD groups on, up to key `reach` */
static inline __attribute__((always_inline)) void scores8(
    const float *q, const void *ks, int64_t n, int64_t d, __m256 sc, int64_t g0, int64_t g1,
    float *scores, __m256 *top, int half, int ahead, int64_t reach) {
    const int64_t es = half ? 2 : 4;
    for (int64_t g = g0; g < g1; g++) {
        /* the 8 keys' dot products side by side, each in its own chain (one key after
         * another waited on every multiply-add's latency: most of a long context's step);
         * each key's sum is the same sequence of operations either way */
        int64_t k[8]; /* each key's first element */
        if (ahead && 8 * (g + KEYS_AHEAD) < reach) {
            const char *next = (const char *)ks + 8 * (g + KEYS_AHEAD) * d * es;
            for (int64_t at = 0; at < 8 * d * es; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
        }
        __m256 acc[8], q0 = _mm256_loadu_ps(q);
        for (int i = 0; i < 8; i++) {
            k[i] = (8 * g + i < n ? 8 * g + i : n - 1) * d;
            acc[i] = _mm256_mul_ps(q0, kv8(ks, k[i], half));
        }
        for (int64_t c = 8; c < d; c += 8) {
            __m256 qc = _mm256_loadu_ps(q + c);
            for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(qc, kv8(ks, k[i] + c, half), acc[i]);
        }
        __m256 s = _mm256_mul_ps(sums8(acc), sc);
        _mm256_storeu_ps(scores + 8 * g, s);
        *top = _mm256_max_ps(*top, s); /* the repeated key changes no maximum */
    }
}

/* scores (n of them, groups of 8) -> e^(s - max), the repeated keys' zero; 1 / their sum */
static inline float softmax8(float *scores, int64_t n, __m256 top) {
    float lanes[8], m;
    _mm256_storeu_ps(lanes, top);
    m = lanes[0];
    for (int i = 1; i < 8; i++) m = lanes[i] > m ? lanes[i] : m;
    __m256 mv = _mm256_set1_ps(m), total = _mm256_setzero_ps();
    for (int64_t g = 0; g < (n + 7) / 8; g++) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + 8 * g), mv));
        if (8 * g + 8 > n) { /* the repeated keys weigh nothing */
            __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - 8 * g)), lane);
            e = _mm256_and_ps(e, _mm256_castsi256_ps(live));
        }
        _mm256_storeu_ps(scores + 8 * g, e);
        total = _mm256_add_ps(total, e);
    }
    _mm256_storeu_ps(lanes, total);
    return 1.0f / (((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7])));
}

/* out[0 .. 8 vecs) += sum over keys j in [j0, j1), in order, of e[j] * v_j (v_j at element
 * j d of vs); `fresh`: out starts at zero. `vecs` is a constant where this is inlined, so
 * the accumulators stay in registers */
static inline __attribute__((always_inline)) void weigh8(const float *e, const void *vs,
                                                          int64_t j0, int64_t j1, int64_t d,
                                                          int vecs, float *out, int fresh,
                                                          int half, int ahead, int64_t reach) {
    const int64_t es = half ? 2 : 4; /* bytes an element */
    __m256 o[8];
    for (int v = 0; v < vecs; v++) o[v] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8 * v);
    for (int64_t j = j0; j < j1; j++) {
        __m256 s = _mm256_broadcast_ss(e + j);
        if (ahead && j + VALUES_AHEAD < reach) { /* d = 64 here: a value is 2 or 4 lines */
            const char *next = (const char *)vs + (j + VALUES_AHEAD) * d * es;
            for (int64_t at = 0; at < vecs * 8 * es; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
        }
        for (int v = 0; v < vecs; v++) o[v] = _mm256_fmadd_ps(s, kv8(vs, j * d + 8 * v, half), o[v]);
    }
    for (int v = 0; v < vecs; v++) _mm256_storeu_ps(out + 8 * v, o[v]);
}

#ifdef __AVX512VL__
/* 32 vector registers: two queries' accumulators at once, each key or value vector loaded
 * once for both (loads, not multiply-adds, were what a query's tile waited on) */
#define PAIRED 1
#else
#define PAIRED 0 /* 16: two queries' 16 accumulators would spill */
#endif

/* scores8 for two queries at once over groups [g0, g1), whose keys both see whole (no
 * repeated key): each query's arithmetic is scores8's */
static inline __attribute__((always_inline)) void scores8x2(
    const float *qa, const float *qb, const void *ks, int64_t d, __m256 sc, int64_t g0,
    int64_t g1, float *sa, float *sb, __m256 *ta, __m256 *tb, int half, int ahead,
    int64_t reach) {
    const int64_t es = half ? 2 : 4;
    for (int64_t g = g0; g < g1; g++) {
        if (ahead && 8 * (g + KEYS_AHEAD) < reach) {
            const char *next = (const char *)ks + 8 * (g + KEYS_AHEAD) * d * es;
            for (int64_t at = 0; at < 8 * d * es; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
        }
        __m256 a[8], b[8], qa0 = _mm256_loadu_ps(qa), qb0 = _mm256_loadu_ps(qb);
        for (int i = 0; i < 8; i++) {
            __m256 k = kv8(ks, (8 * g + i) * d, half);
            a[i] = _mm256_mul_ps(qa0, k), b[i] = _mm256_mul_ps(qb0, k);
        }
        for (int64_t c = 8; c < d; c += 8) {
            __m256 qac = _mm256_loadu_ps(qa + c), qbc = _mm256_loadu_ps(qb + c);
            for (int i = 0; i < 8; i++) {
                __m256 k = kv8(ks, (8 * g + i) * d + c, half);
                a[i] = _mm256_fmadd_ps(qac, k, a[i]), b[i] = _mm256_fmadd_ps(qbc, k, b[i]);
            }
        }
        __m256 s = _mm256_mul_ps(sums8(a), sc), t = _mm256_mul_ps(sums8(b), sc);
        _mm256_storeu_ps(sa + 8 * g, s), _mm256_storeu_ps(sb + 8 * g, t);
        *ta = _mm256_max_ps(*ta, s), *tb = _mm256_max_ps(*tb, t);
    }
}

/* weigh8 of 8 vectors for two queries at once over keys [j0, j1), both seeing them */
static inline __attribute__((always_inline)) void weigh8x2(
    const float *ea, const float *eb, const void *vs, int64_t j0, int64_t j1, int64_t d,
    float *outa, float *outb, int fresh, int half, int ahead, int64_t reach) {
    const int64_t es = half ? 2 : 4;
    __m256 oa[8], ob[8];
    for (int v = 0; v < 8; v++) {
        oa[v] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(outa + 8 * v);
        ob[v] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(outb + 8 * v);
    }
    for (int64_t j = j0; j < j1; j++) {
        __m256 sa = _mm256_broadcast_ss(ea + j), sb = _mm256_broadcast_ss(eb + j);
        if (ahead && j + VALUES_AHEAD < reach) {
            const char *next = (const char *)vs + (j + VALUES_AHEAD) * d * es;
            for (int64_t at = 0; at < 64 * es; at += 64) _mm_prefetch(next + at, _MM_HINT_T1);
        }
        for (int v = 0; v < 8; v++) {
            __m256 x = kv8(vs, j * d + 8 * v, half);
            oa[v] = _mm256_fmadd_ps(sa, x, oa[v]), ob[v] = _mm256_fmadd_ps(sb, x, ob[v]);
        }
    }
    for (int v = 0; v < 8; v++) _mm256_storeu_ps(outa + 8 * v, oa[v]), _mm256_storeu_ps(outb + 8 * v, ob[v]);
}

/* softmax(q k^T * scale) v for each of `count` queries sharing keys ks and values vs, head
 * size d a whole number of vectors (see Query); `scores`: `stride` floats per query. With
 * PAIRED, neighbouring queries go two at a time over the keys both see whole. */
static inline __attribute__((always_inline)) void attend_run8(
    const Query *qs, int64_t count, const void *ks, const void *vs, int64_t d, float scale,
    float *scores, int64_t stride, int half, int ahead) {
    const int64_t es = half ? 2 : 4;
    int64_t tile = TILE_BYTES / (d * es) / 8 * 8, reach = 0;
    if (tile < 8) tile = 8;
    __m256 top[RUN_QUERIES], sc = _mm256_set1_ps(scale);
    float inv[RUN_QUERIES];
    for (int64_t i = 0; i < count; i++) {
        top[i] = _mm256_set1_ps(-INFINITY);
        reach = qs[i].n > reach ? qs[i].n : reach;
    }
    const int pairs = PAIRED && d % 64 == 0;
    for (int64_t j0 = 0; j0 < reach; j0 += tile) {
        int led = 0;
        for (int64_t i = 0, step; i < count; i += step) {
            int64_t g0 = j0 / 8, fc = g0; /* groups [g0, fc): the pair's together */
            int go = ahead && !led;
            step = pairs && i + 1 < count ? 2 : 1;
            if (step == 2) {
                int64_t na = qs[i].n, nb = qs[i + 1].n;
                int64_t fa = j0 < na ? (na < j0 + tile ? na : j0 + tile) / 8 : g0; /* whole */
                int64_t fb = j0 < nb ? (nb < j0 + tile ? nb : j0 + tile) / 8 : g0; /* groups */
                fc = fa < fb ? fa : fb;
                if (fc > g0) {
                    scores8x2(qs[i].q, qs[i + 1].q, ks, d, sc, g0, fc, scores + i * stride,
                              scores + (i + 1) * stride, &top[i], &top[i + 1], half, go, reach);
                    led = 1;
                }
            }
            for (int64_t k = i; k < i + step; k++) { /* each query's own groups of the tile */
                int64_t n = qs[k].n, j1 = n < j0 + tile ? n : j0 + tile;
                if (j0 >= n) continue;
                scores8(qs[k].q, ks, n, d, sc, fc, (j1 + 7) / 8, scores + k * stride, &top[k],
                        half, go && k == i && fc == g0, reach);
                led = 1;
            }
        }
    }
    for (int64_t i = 0; i < count; i++) inv[i] = softmax8(scores + i * stride, qs[i].n, top[i]);
    for (int64_t j0 = 0; j0 < reach; j0 += tile) {
        int led = 0;
        for (int64_t i = 0, step; i < count; i += step) {
            int64_t jc = j0; /* keys [j0, jc): the pair's together */
            int go = ahead && !led;
            step = pairs && i + 1 < count ? 2 : 1;
            if (step == 2) {
                int64_t na = qs[i].n, nb = qs[i + 1].n;
                int64_t ja = j0 < na ? (na < j0 + tile ? na : j0 + tile) : j0;
                int64_t jb = j0 < nb ? (nb < j0 + tile ? nb : j0 + tile) : j0;
                jc = ja < jb ? ja : jb;
                if (jc > j0) {
                    for (int64_t c0 = 0; c0 < d; c0 += 64)
                        weigh8x2(scores + i * stride, scores + (i + 1) * stride,
                                 (const char *)vs + c0 * es, j0, jc, d, qs[i].out + c0,
                                 qs[i + 1].out + c0, j0 == 0, half, go, reach);
                    led = 1;
                }
            }
            for (int64_t k = i; k < i + step; k++) { /* each query's own keys of the tile */
                int64_t n = qs[k].n, j1 = n < j0 + tile ? n : j0 + tile;
                if (j1 <= jc) continue;
                for (int64_t c0 = 0; c0 < d; c0 += 64) { /* up to 8 vectors of the output */
                    const void *vc = (const char *)vs + c0 * es;
                    int fresh = jc == 0, lead = go && k == i && jc == j0;
                    if ((d - c0) / 8 >= 8) /* a count the compiler knows keeps them in registers */
                        weigh8(scores + k * stride, vc, jc, j1, d, 8, qs[k].out + c0, fresh, half,
                               lead, reach);
                    else
                        weigh8(scores + k * stride, vc, jc, j1, d, (int)((d - c0) / 8),
                               qs[k].out + c0, fresh, half, lead, reach);
                }
                led = 1;
            }
        }
    }
    for (int64_t i = 0; i < count; i++) {
        __m256 iv = _mm256_set1_ps(inv[i]);
        for (int64_t c = 0; c < d; c += 8)
            _mm256_storeu_ps(qs[i].out + c, _mm256_mul_ps(_mm256_loadu_ps(qs[i].out + c), iv));
    }
}

static void attend_run8_f32(const Query *qs, int64_t count, const void *ks, const void *vs,
                            int64_t d, float scale, float *scores, int64_t stride, int ahead) {
    attend_run8(qs, count, ks, vs, d, scale, scores, stride, 0, ahead);
}

static void attend_run8_f16(const Query *qs, int64_t count, const void *ks, const void *vs,
                            int64_t d, float scale, float *scores, int64_t stride, int ahead) {
    attend_run8(qs, count, ks, vs, d, scale, scores, stride, 1, ahead);
}
#endif

/* row j of a head's keys or values as floats: the cache's own (fp32), or widened into
 * `buf` (halves) */
static const float *kv_row(const void *base, int64_t j, int64_t d, int half, float *buf) {
    if (!half) return (const float *)base + j * d;
    kv_widen(buf, (const uint16_t *)base + j * d, d);
    return buf;
}

/* one query over n keys: softmax(q k^T * scale) v, in key order; keys and values as the
 * cache keeps them (`half`), the arithmetic on their values the same either way (a head
 * size of whole vectors goes to attend_run8 instead) */
static void attend(const float *q, const void *ks, const void *vs, int64_t n, int64_t d,
                   float scale, float *scores, float *out, int half) {
    float top = -INFINITY, total = 0.0f, o[512], row[512];
    for (int64_t j = 0; j < n; j++) {
        scores[j] = dot(q, kv_row(ks, j, d, half, row), d) * scale;
        top = scores[j] > top ? scores[j] : top;
    }
    for (int64_t j = 0; j < n; j++) total += scores[j] = expf(scores[j] - top);
    for (int64_t c = 0; c < d; c++) o[c] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float *vj = kv_row(vs, j, d, half, row);
        float s = scores[j];
        for (int64_t c = 0; c < d; c++) o[c] = fmaf(s, vj[c], o[c]);
    }
    for (int64_t c = 0; c < d; c++) out[c] = o[c] / total;
}

/* `count` (<= RUN_QUERIES) queries over one KV head; `scores`: `stride` floats per query;
 * `ahead`: the first to read these keys and values (ask for them ahead) */
static void attend_run(const Query *qs, int64_t count, const void *ks, const void *vs,
                       int64_t d, float scale, float *scores, int64_t stride, int half,
                       int ahead) {
#ifdef SIMD
    if (d % 8 == 0) {
        (half ? attend_run8_f16 : attend_run8_f32)(qs, count, ks, vs, d, scale, scores, stride,
                                                   ahead);
        return;
    }
#endif
    (void)ahead, (void)stride;
    for (int64_t i = 0; i < count; i++) attend(qs[i].q, ks, vs, qs[i].n, d, scale, scores, qs[i].out, half);
}

/* ---- e^x as libm computes it, 8 lanes at a time ------------------------------------
 * The MLP's gate takes e^x of every channel of every row (46k a row for the default): one
 * call of libm's expf each was a tenth of a prompt chunk's time. An 8-lane polynomial exp
 * of its own was faster but moved the default's answers off llama.cpp's and fp32's on near
 * ties (e.g. "Why is the sky blue?"). So this one computes what glibc's expf (2.28 on,
 * the FMA build x86-64 CPUs with AVX2 run) computes, operation for operation: in double,
 * k = x 32/ln2 rounded by adding 1.5 2^52 (fused), r = x 32/ln2 - k (fused), 2^(k/32) as a
 * table entry with k's upper bits added to its exponent, 2^(r/32) by a cubic whose three
 * multiply-adds are fused, the product rounded to float. Checked equal to glibc's expf
 * for all 2^32 inputs, scalar and vector (tests/test_fused_cpu.py checks a sample against
 * this machine's libm). Inputs outside (-103.28, 88.72) (under- and overflow, NaN) go to
 * libm itself, as do a portable build's. */
#ifdef SIMD
static const uint64_t EXP_TAB[32] = { /* bits of 2^(i/32), less i << 47 */
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
#define EXP_K 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define EXP_SHIFT 0x1.8p+52
#define EXP_C0 (0x1.c6af84b912394p-5 / 32 / 32 / 32)
#define EXP_C1 (0x1.ebfce50fac4f3p-3 / 32 / 32)
#define EXP_C2 (0x1.62e42ff0c52d6p-1 / 32)
#define EXP_LOW -0x1.9d1d9ep6f /* below: libm's underflow path */
#define EXP_HIGH 0x1.62e42ep6f /* above: its overflow path */

static float exp_libm(float x) {
    if (!(x > EXP_LOW && x < EXP_HIGH)) return expf(x);
    double kd = fma(EXP_K, (double)x, EXP_SHIFT), r;
    uint64_t ki, t;
    memcpy(&ki, &kd, 8);
    kd -= EXP_SHIFT;
    r = fma(EXP_K, (double)x, -kd);
    t = EXP_TAB[ki % 32] + (ki << 47);
    double s, p = fma(EXP_C0, r, EXP_C1), y = fma(EXP_C2, r, 1.0);
    memcpy(&s, &t, 8);
    return (float)(fma(p, r * r, y) * s);
}

static inline __m128 exp4_libm(__m128 x) { /* exp_libm's steps in four double lanes */
    __m256d xd = _mm256_cvtps_pd(x), k = _mm256_set1_pd(EXP_K);
    __m256d kd = _mm256_fmadd_pd(k, xd, _mm256_set1_pd(EXP_SHIFT));
    __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, _mm256_set1_pd(EXP_SHIFT));
    __m256d r = _mm256_fmsub_pd(k, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)EXP_TAB,
                                       _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    __m256d p = _mm256_fmadd_pd(_mm256_set1_pd(EXP_C0), r, _mm256_set1_pd(EXP_C1));
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(EXP_C2), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(p, _mm256_mul_pd(r, r), y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}

static inline __m256 exp8_libm(__m256 x) { /* a lane out of range: all 8 one by one */
    __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(EXP_LOW), _CMP_GT_OQ),
                              _mm256_cmp_ps(x, _mm256_set1_ps(EXP_HIGH), _CMP_LT_OQ));
    if (_mm256_movemask_ps(in) != 0xff) {
        float v[8];
        _mm256_storeu_ps(v, x);
        for (int i = 0; i < 8; i++) v[i] = exp_libm(v[i]);
        return _mm256_loadu_ps(v);
    }
    return _mm256_set_m128(exp4_libm(_mm256_extractf128_ps(x, 1)),
                           exp4_libm(_mm256_castps256_ps128(x)));
}
#else
#define exp_libm expf
#endif

/* exp_libm's values, exported for its test: n of them, 8 lanes at a time where the
 * build has them (the last n % 8 one by one) */
void decoder_exp(const float *x, float *out, int64_t n) {
    int64_t i = 0;
#ifdef SIMD
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8_libm(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) out[i] = exp_libm(x[i]);
}

/* the MLP's gate for channels [a, b) of one row: row[n] = silu(row[n]) * row[I + n], e^x as
 * libm computes it (above), the rest exactly rounded: the same bits 8 lanes or one */
static void gate(float *row, int64_t I, int64_t a, int64_t b) {
    int64_t n = a;
#ifdef SIMD
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; n + 8 <= b; n += 8) {
        __m256 g = _mm256_loadu_ps(row + n);
        __m256 e = exp8_libm(_mm256_xor_ps(g, sign));
        __m256 silu8 = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(row + n, _mm256_mul_ps(silu8, _mm256_loadu_ps(row + I + n)));
    }
#endif
    for (; n < b; n++) {
        float g = row[n];
        row[n] = g / (1.0f + exp_libm(-g)) * row[I + n];
    }
}

/* ---- a product's input rows ---------------------------------------------------------- */
#define SHARED_ROWS 16 /* rows from which the threads quantize an input between them */
typedef struct {
    int shared;          /* the threads share the quantized rows (then meet) */
    Barrier *bar;
    int *sense;
    int id, nt;
    double eps;
    void *buf;           /* the quantized rows' buffer: the pass's one, or this thread's */
    Q8Rows *rows;        /* NULL: the products take fp32 rows (h) */
} Input;

/* rows [0, T) of src (stride apart; K wide) as a product's input: normed by w into h when w
 * is given, then with 8-bit activations quantized into in->rows. Each row's bits are the
 * same either way; who computes them differs: with few rows (a decode step, a verify block)
 * every thread does all of them itself, cheaper than meeting; with many (a prefill) each
 * does its share into the pass's buffer and they meet before the product reads them. */
static void input(const Input *in, const float *src, int64_t stride, const float *w, int64_t T,
                  int64_t K, float *h) {
    int64_t a = 0, b = T;
    if (in->shared) share(T, 1, in->id, in->nt, &a, &b);
    if (in->rows) q8_layout(T, K, in->buf, in->rows);
    for (int64_t t = a; t < b; t++) {
        const float *row = src + t * stride;
        if (w) {
            rms_norm(row, w, K, in->eps, h + t * K);
            row = h + t * K;
        }
        if (in->rows) q8_row(row, t, in->rows);
    }
    if (in->shared) barrier_wait(in->bar, in->sense);
}

/* ---- the pass ------------------------------------------------------------------------ */
/* One answer's part of a shared pass: its rows [row0, row0 + rows) of the pass, at its
 * positions [start, start + rows) of its own cache (k, v: [layers, kv_heads, capacity,
 * head_dim] each), and logits for its last num_logits rows. */
typedef struct {
    void *k, *v; /* fp32 or fp16, as m->kv_half says */
    int64_t capacity, start, rows, num_logits;
} Seq;

/* x_in [T, H]: the embedded tokens of every answer's rows, answer after answer (T = the sum
 * of their rows; each answer's K/V are written at its positions, the caller checks each
 * capacity and commits). Every weight is read once for all T rows, and a row's result is
 * the same whatever else is in the pass: products are batch-invariant and everything else
 * is per row, each attending over its own answer's cache only. taps: ntaps layer ids,
 * whose outputs go to tap_out [ntaps, T, H]. logits [sum of num_logits, V]: each answer's
 * last num_logits rows, answer after answer. Returns 0, or -1 when memory could not be had. */
int decoder_forward_many(const Model *m, const Seq *seqs, int64_t nseq, const float *x_in,
                         const int64_t *taps, int64_t ntaps, float *tap_out, float *logits,
                         int nthreads) {
    const int64_t H = m->hidden, nq = m->heads, nkv = m->kv_heads, d = m->head_dim;
    const int half = m->kv_half != 0;
    const int64_t es = half ? 2 : 4; /* bytes a cached key or value element */
    const int64_t I = m->inter, rep = nq / nkv;
    const int64_t nqkv = (nq + 2 * nkv) * d, widest = I > H ? I : H;
    const int64_t natt = nq * d > H ? nq * d : H;
    int64_t T = 0, P = 0, L = 0;
    for (int64_t s = 0; s < nseq; s++) {
        T += seqs[s].rows, L += seqs[s].num_logits;
        if (seqs[s].start + seqs[s].rows > P) P = seqs[s].start + seqs[s].rows;
    }
    if (nthreads < 1) nthreads = 1;
    /* shared: the residual stream, q/k/v, attention outputs, MLP channels; then each
     * thread's own: normed rows, x's group sums (groups of 16 at the smallest), scores */
    const int64_t stride = (P + 15) / 8 * 8; /* a query's scores (whole groups of 8 keys) */
    const int64_t own = T * widest + T * (widest / 16 + 1) + RUN_QUERIES * stride;
    /* 8-bit activations: each thread quantizes a product's input rows once, into its own
     * buffer (the same rows on every thread: cheaper than a barrier to share them) */
    const int q8 = m->act != ACT_F32;
    const int64_t qown = q8 ? (q8_bytes(T, natt > widest ? natt : widest) + 63) / 64 * 64 : 0;
    /* with rows enough, the threads quantize a product's input once between them, each its
     * share of the rows into one buffer, and meet before the product (see `input`) */
    const int shared_q = q8 && nthreads > 1 && T >= SHARED_ROWS;
    /* share units: columns of the 8-bit products go by whole panels of 16 */
    const int64_t unit = q8 ? 16 : 4;
    float *x = malloc(sizeof(float) * T * H), *qkv = malloc(sizeof(float) * T * nqkv);
    float *att = malloc(sizeof(float) * T * natt), *act = malloc(sizeof(float) * T * 2 * I);
    float *mine = malloc(sizeof(float) * own * nthreads);
    uint8_t *qmine = q8 ? malloc(qown * (shared_q ? 1 : nthreads)) : NULL;
    /* each row's answer and position; the rows the head reads */
    int64_t *seq_of = malloc(sizeof(int64_t) * (T + 1)), *pos = malloc(sizeof(int64_t) * (T + 1));
    int64_t *heads = malloc(sizeof(int64_t) * (L + 1));
    /* the attention's (row, query head) items, running cost: a row's keys, plus a query's
     * own work. Shared by count, the rows of a pass whose answers sit at different
     * contexts (a server's slots, a prompt chunk beside decode rows) left one thread
     * waiting on the other at every layer (8 answers at 100-1500 positions: 4% slower) */
    int64_t *acost = malloc(sizeof(int64_t) * (T * nq + 1));
    int failed = !x || !qkv || !att || !act || !mine || (q8 && !qmine) || !seq_of || !pos || !heads
                 || !acost;
    if (!failed) {
        for (int64_t s = 0, t = 0, j = 0; s < nseq; s++) {
            for (int64_t r = 0; r < seqs[s].rows; r++, t++) seq_of[t] = s, pos[t] = seqs[s].start + r;
            for (int64_t r = seqs[s].rows - seqs[s].num_logits; r < seqs[s].rows; r++)
                heads[j++] = t - seqs[s].rows + r;
        }
        acost[0] = 0;
        for (int64_t i = 0; i < T * nq; i++) /* item i: KV head i / (T rep), row i % (T rep) / rep */
            acost[i + 1] = acost[i] + pos[i % (T * rep) / rep] + 1 + QUERY_COST;
        memcpy(x, x_in, sizeof(float) * T * H);
        Barrier bar = {0, 0, 0, 1};
#pragma omp parallel num_threads(nthreads)
        {
            int id = omp_get_thread_num(), nt = omp_get_num_threads(), sense = 0, bad = 0;
#pragma omp single
            bar.n = nt;
            float *h = mine + id * own, *xs = h + T * widest, *scores = xs + T * (widest / 16 + 1);
            Q8Rows rows, *xq = q8 ? &rows : NULL;
            void *qbuf = q8 ? qmine + (shared_q ? 0 : id * qown) : NULL;
            Input in = {shared_q, &bar, &sense, id, nt, m->eps, qbuf, xq};
            for (int64_t l = 0; l < m->layers; l++) {
                const Layer *Ly = &m->layer[l];
                int64_t a, b;
                /* q/k/v */
                input(&in, x, H, Ly->attn_norm, T, H, h);
                share(nqkv, unit, id, nt, &a, &b);
                bad |= lin_columns(&Ly->qkv, h, xq, T, a, b, qkv, nqkv, m->direct_rows, xs);
                barrier_wait(&bar, &sense);
                /* per head: q/k norms, RoPE; keys and values into the row's own cache */
                share(T * (nq + nkv), 1, id, nt, &a, &b);
                for (int64_t i = a; i < b; i++) {
                    int64_t t = i / (nq + nkv), j = i % (nq + nkv), p = pos[t];
                    const Seq *q = &seqs[seq_of[t]];
                    float *hd = qkv + t * nqkv + j * d;
                    const float *w = j < nq ? Ly->q_norm : Ly->k_norm;
                    if (w) rms_norm(hd, w, d, m->eps, hd);
                    rope(hd, m->cos + p * d, m->sin + p * d, d);
                    if (j >= nq) {
                        int64_t g = j - nq, at = ((l * nkv + g) * q->capacity + p) * d * es;
                        kv_store((char *)q->k + at, hd, d, half);
                        kv_store((char *)q->v + at, qkv + t * nqkv + (nq + nkv + g) * d, d, half);
                    }
                }
                barrier_wait(&bar, &sense);
                /* attention: each (row, query head) over its cache's keys up to its position,
                 * taken KV head by KV head (then row, then the query heads that share it), in
                 * runs of the queries that share a KV head (attend_run: tile by tile): a KV
                 * head's keys and values are read from memory once. Row by row, every row read
                 * all of them again, from memory once they outgrew L2 (8 rows at context 2000
                 * took 4x a decode step's attention). Each (row, head) is the same arithmetic
                 * either way. */
                share_cost(acost, T * nq, id, nt, &a, &b);
                const char *last = NULL; /* the keys this thread read last */
                for (int64_t i = a, e; i < b; i = e) {
                    int64_t g = i / (T * rep), s0 = seq_of[i % (T * rep) / rep];
                    const Seq *q = &seqs[s0];
                    int64_t at = (l * nkv + g) * q->capacity * d * es;
                    const char *kc = (const char *)q->k + at, *vc = (const char *)q->v + at;
                    Query run[RUN_QUERIES];
                    for (e = i; e < b && e - i < RUN_QUERIES; e++) { /* the run: one KV head */
                        int64_t t = e % (T * rep) / rep, hq = g * rep + e % rep;
                        if (e / (T * rep) != g || seq_of[t] != s0) break;
                        /* out: rows of nq * d, the o product's K */
                        run[e - i] = (Query){qkv + t * nqkv + hq * d, att + t * nq * d + hq * d, pos[t] + 1};
                    }
                    /* only the first to read them asks for them ahead: the others find them
                     * in L2, where asking cost 10-15% of an 8-row block's step. Halves are
                     * widened as they are read, tile by tile (a block's KV head widened once
                     * into a buffer of floats first was 10-19% slower at contexts 1000-2000) */
                    int ahead = kc != last;
                    last = kc;
                    attend_run(run, e - i, kc, vc, d, (float)m->attn_scale, scores, stride, half,
                               ahead);
                }
                barrier_wait(&bar, &sense);
                /* output projection and the residual: this thread's columns of x */
                if (q8) input(&in, att, Ly->o.K, NULL, T, Ly->o.K, NULL);
                share(H, unit, id, nt, &a, &b);
                bad |= lin_columns(&Ly->o, att, xq, T, a, b, act, H, m->direct_rows, xs);
                for (int64_t t = 0; t < T; t++)
                    for (int64_t n = a; n < b; n++) x[t * H + n] += act[t * H + n];
                barrier_wait(&bar, &sense);
                /* the MLP: gate and up columns of the same channels in one share */
                input(&in, x, H, Ly->ffn_norm, T, H, h);
                share(I, unit, id, nt, &a, &b);
                bad |= lin_columns(&Ly->gate_up, h, xq, T, a, b, act, 2 * I, m->direct_rows, xs);
                bad |= lin_columns(&Ly->gate_up, h, xq, T, I + a, I + b, act, 2 * I,
                                   m->direct_rows, xs);
                for (int64_t t = 0; t < T; t++) gate(act + t * 2 * I, I, a, b);
                barrier_wait(&bar, &sense);
                /* down, and the residual */
                share(H, unit, id, nt, &a, &b);
                if (q8)
                    input(&in, act, 2 * I, NULL, T, I, NULL); /* the gated half of each row */
                else
                    for (int64_t t = 0; t < T; t++) memcpy(h + t * I, act + t * 2 * I, sizeof(float) * I);
                bad |= lin_columns(&Ly->down, h, xq, T, a, b, att, H, m->direct_rows, xs);
                for (int64_t t = 0; t < T; t++)
                    for (int64_t n = a; n < b; n++) x[t * H + n] += att[t * H + n];
                for (int64_t k = 0; k < ntaps; k++)
                    if (taps[k] == l)
                        for (int64_t t = 0; t < T; t++)
                            memcpy(tap_out + (k * T + t) * H + a, x + t * H + a,
                                   sizeof(float) * (b - a));
                barrier_wait(&bar, &sense);
            }
            /* the final norm and the head, for each answer's last num_logits rows */
            int64_t a = 0, b = L;
            if (in.shared) share(L, 1, id, nt, &a, &b);
            if (q8) q8_layout(L, H, qbuf, xq);
            for (int64_t j = a; j < b; j++) {
                rms_norm(x + heads[j] * H, m->norm, H, m->eps, h + j * H);
                if (q8) q8_row(h + j * H, j, xq);
            }
            if (in.shared) barrier_wait(&bar, &sense);
            share(m->vocab, unit, id, nt, &a, &b);
            bad |= lin_columns(&m->head, h, xq, L, a, b, logits, m->vocab, m->direct_rows, xs);
            if (bad) {
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    free(x), free(qkv), free(att), free(act), free(mine), free(qmine);
    free(seq_of), free(pos), free(heads), free(acost);
    return failed ? -1 : 0;
}

/* One answer's pass: x_in [T, H] at positions [start, start + T) of the model's cache
 * (m->k, m->v, m->capacity); logits [num_logits, V] of its last num_logits rows. */
int decoder_forward(const Model *m, const float *x_in, int64_t T, int64_t start,
                    const int64_t *taps, int64_t ntaps, float *tap_out, int64_t num_logits,
                    float *logits, int nthreads) {
    Seq one = {m->k, m->v, m->capacity, start, T, num_logits};
    return decoder_forward_many(m, &one, 1, x_in, taps, ntaps, tap_out, logits, nthreads);
}
