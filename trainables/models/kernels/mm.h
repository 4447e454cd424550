/* Row-blocked float32 matmuls for the kernels (fmath.h's vectors of VW lanes): out = bias + x @
 * wx + h @ wh for rows of one member, with wx (E, G) and wh (H, G) row-major (G columns).
 *
 * Each output element accumulates over the inner index in order, with separate multiply and
 * add (contraction off), in vectors whose remainder columns are done by scalar code
 * of the same operations: an element's bits depend only on its own row, never on the row's
 * place in a block, a member's place in the bundle or the blocking (a bundle member and its
 * lone run stay bit-identical).
 */
#ifndef FINELINE_MM_H
#define FINELINE_MM_H
#include "fmath.h"

/* The tile (rows x vectors of columns), sized to the target's vector registers; a file may
 * set its own before including this one (decode.c does). Tiling changes no bit. */
#ifndef FR
#if VW == 16
#define FR 2 /* 2 rows x 8 vectors = 16 accumulators (+ 8 weight vectors) of 32 registers */
#define FT 8
#else
#define FR 2 /* 2 rows x 4 vectors = 8 accumulators (+ 4 weight vectors) of 16 registers */
#define FT 4
#endif
#endif

/* acc[r] += sum_j a[r][j] w[j][g0 + .] over the VW * nv columns from g0, j in order. */
static inline __attribute__((always_inline)) void mm_term(
    int R, int nv, int J, int G, int g0, const float *const *a, const float *restrict w,
    vf acc[FR][FT]) {
    for (int j = 0; j < J; j++) {
        const float *wj = w + (long)j * G + g0;
        vf wv[FT];
        for (int v = 0; v < nv; v++) wv[v] = vload(wj + VW * v);
        for (int r = 0; r < R; r++) {
            vf aj = vsplat(a[r][j]);
            for (int v = 0; v < nv; v++) acc[r][v] = acc[r][v] + aj * wv[v];
        }
    }
}

/* out[r][g] = (bias[g] + sum_j x[r][j] wx[j][g]) + sum_j h[r][j] wh[j][g] for R rows and
 * the VW * nv columns from g0 (e.g. an LSTM step's input projection and recurrent matmul).
 * bias may be NULL (0); wx (E, G) and wh (H, G) row-major. */
static inline __attribute__((always_inline)) void mm_tile(
    int R, int nv, int G, int g0, const float *bias, int E, const float *const *x,
    const float *restrict wx, int H, const float *const *h, const float *restrict wh,
    float *const *out) {
    vf acc[FR][FT];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = bias ? vload(bias + g0 + VW * v) : vsplat(0.0f);
    mm_term(R, nv, E, G, g0, x, wx, acc);
    mm_term(R, nv, H, G, g0, h, wh, acc);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++) vstore(out[r] + g0 + VW * v, acc[r][v]);
}

/* The same for one row and the scalar columns g0 .. G - 1 (fewer than VW); bias, x may be
 * NULL (0; no input term, E = 0). */
static void mm_tail(int G, int g0, const float *bias, int E, const float *x, const float *wx,
                    int H, const float *h, const float *wh, float *out) {
    for (int g = g0; g < G; g++) {
        float acc = bias ? bias[g] : 0.0f;
        for (int j = 0; j < E; j++) acc = acc + x[j] * wx[(long)j * G + g];
        for (int j = 0; j < H; j++) acc = acc + h[j] * wh[(long)j * G + g];
        out[g] = acc;
    }
}

/* mm_tile over all G columns of the R rows from b: FT vectors at a time, then one, then
 * the scalar remainder (the same operations). */
static inline __attribute__((always_inline)) void mm_rows(
    int R, int b, int G, const float *bias, int E, const float *x, const float *wx, int H,
    const float *h, const float *wh, float *out) {
    const float *xs[FR], *hs[FR];
    float *os[FR];
    for (int r = 0; r < R; r++) {
        xs[r] = x + (long)(b + r) * E;
        hs[r] = h + (long)(b + r) * H;
        os[r] = out + (long)(b + r) * G;
    }
    int g0 = 0;
    for (; g0 + VW * FT <= G; g0 += VW * FT) mm_tile(R, FT, G, g0, bias, E, xs, wx, H, hs, wh, os);
    for (; g0 + VW <= G; g0 += VW) mm_tile(R, 1, G, g0, bias, E, xs, wx, H, hs, wh, os);
    for (int r = 0; r < R; r++)
        if (g0 < G) mm_tail(G, g0, bias, E, xs[r], wx, H, hs[r], wh, os[r]);
}

/* out[b] = bias + x[b] @ wx + h[b] @ wh for rows b < n (row strides: the widths; bias NULL:
 * none). Rows FR at a time, then one; FT vectors of columns at a time. x may be NULL when
 * E is 0, h when H is 0. */
static void mm_block(int n, int G, const float *bias, int E, const float *x, const float *wx,
                     int H, const float *h, const float *wh, float *out) {
    int b = 0;
    for (; b + FR <= n; b += FR) mm_rows(FR, b, G, bias, E, x, wx, H, h, wh, out);
    for (; b < n; b++) mm_rows(1, b, G, bias, E, x, wx, H, h, wh, out);
}

#endif
