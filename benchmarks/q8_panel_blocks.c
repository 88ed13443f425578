/* The 16-lane 8-bit-activation kernel (q8x16.c) alone, on matrices of the default's MLP
 * shape (1536 x 576, Q4_1 with its scales laid out panel by panel as the fused pass keeps
 * them): nanoseconds per block of 16 columns x 32 weights, by rows multiplied at once, with
 * the weights hot in L2 (one matrix) or read from memory (64 of them, 28 MB). What a row
 * adds on top of the first is the kernel's own arithmetic; one row from memory is what a
 * decode step's products cost. Build and run (one thread, best of 200):
 *
 *   S=src/specgen/kernels/cpu
 *   gcc -O3 -fopenmp -ffp-contract=fast -march=x86-64-v4 -mavx512vnni -I$S \
 *       benchmarks/q8_panel_blocks.c $S/q8x16.c $S/q8.c $S/q8x8.c $S/common.c $S/packed.c \
 *       $S/f32x16.c $S/f32x8.c -lm -o /tmp/q8_panel_blocks && /tmp/q8_panel_blocks
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "packed.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void run(int nmat) {
    const int64_t K = 576, N = 1536, G = K / 32, P = 16;
    uint8_t **w = malloc(nmat * sizeof *w);
    Panels *pan = malloc(nmat * sizeof *pan);
    for (int i = 0; i < nmat; i++) {
        w[i] = aligned_alloc(64, N * K / 2);
        for (int64_t j = 0; j < N * K / 2; j++) w[i][j] = (uint8_t)rand();
        float *s = malloc(N * G * sizeof *s), *m = malloc(N * G * sizeof *m);
        for (int64_t j = 0; j < N * G; j++) s[j] = 0.01f * (rand() % 100), m[j] = -0.1f;
        pan[i] = (Panels){s, m, P}; /* panel-major [N / P, G, P]: the values don't matter */
    }
    float *x = malloc(16 * K * sizeof *x), *y = malloc(16 * N * sizeof *y);
    for (int64_t j = 0; j < 16 * K; j++) x[j] = (rand() % 2000 - 1000) * 1e-3f;
    void *buf = aligned_alloc(64, (q8_bytes(16, K) + 63) / 64 * 64);
    const int rows[] = {1, 2, 4, 8, 16};
    double first = 0;
    printf("%s:\n", nmat == 1 ? "one matrix, hot in L2" : "64 matrices, from memory");
    for (int ri = 0; ri < 5; ri++) {
        Q8Rows q;
        q8_rows(x, rows[ri], K, buf, &q);
        double best = 1e9;
        for (int rep = 0; rep < 200; rep++) {
            double t = now();
            for (int i = 0; i < nmat; i++)
                q8x16_columns(&q, w[i], 4, pan[i].scale, pan[i].mins, 0, 32, 0, N, y, N, &pan[i]);
            t = now() - t;
            if (t < best) best = t;
        }
        double ns = best / nmat * 1e9 / ((double)N / P * G);
        if (ri == 0) first = ns;
        printf("  %2d rows: %6.2f ns a panel-block, %5.2f a row beyond the first\n", rows[ri], ns,
               ri ? (ns - first) / (rows[ri] - 1) : 0.0);
    }
}

int main(void) {
    run(1);
    run(64);
    return 0;
}
