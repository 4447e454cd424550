/* The backward's row-blocked float32 matmuls (fmath.h's vectors of VW lanes), shared by the
 * training LSTM layers (lstm_seq.c) and the training output layer (output.c): the input
 * gradient dh = dg @ w (mm_back) and the weight gradient dw += dg^T x accumulated over
 * rows in order (mm_grad). As in mm.h, every element accumulates over its inner index in
 * order with separate multiply and add, so its bits depend only on its own row (mm_back)
 * or on the rows in order (mm_grad), never on the blocking.
 */
#ifndef FINELINE_MM_BWD_H
#define FINELINE_MM_BWD_H
#include "fmath.h"
#include "mm.h"

/* Rows per tile in the backward's dh: 8 (AVX-512's 32 registers) or 4 rows x 2 vectors. */
#define BR (VW == 16 ? 8 : 4)
#define BT 2 /* vectors per column tile in the backward's dh */

/* dh[b + r][j0 + .] = sum_g dg[b + r][g] w[g][j0 + .] (g in order) for R rows and the
 * VW * nv columns from j0; w (G, H) row-major. */
static inline __attribute__((always_inline)) void back_tile(int R, int nv, int G, int H, int b,
                                                            int j0, const float *dg,
                                                            const float *w, float *dh) {
    vf acc[BR][BT];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = vsplat(0.0f);
    for (int g = 0; g < G; g++) {
        const float *wg = w + (long)g * H + j0;
        vf wv[BT];
        for (int v = 0; v < nv; v++) wv[v] = vload(wg + VW * v);
        for (int r = 0; r < R; r++) {
            vf d = vsplat(dg[(long)(b + r) * G + g]);
            for (int v = 0; v < nv; v++) acc[r][v] = acc[r][v] + d * wv[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++) vstore(dh + (long)(b + r) * H + j0 + VW * v, acc[r][v]);
}

/* back_tile over all columns of R rows from b: BT vectors at a time, then one, then the
 * scalar remainder (the same operations). */
static inline __attribute__((always_inline)) void back_rows(int R, int G, int H, int b,
                                                            const float *dg, const float *w,
                                                            float *dh) {
    int j0 = 0;
    for (; j0 + VW * BT <= H; j0 += VW * BT) back_tile(R, BT, G, H, b, j0, dg, w, dh);
    for (; j0 + VW <= H; j0 += VW) back_tile(R, 1, G, H, b, j0, dg, w, dh);
    for (int r = 0; r < R; r++)
        if (j0 < H)
            mm_tail(H, j0, 0, 0, 0, 0, G, dg + (long)(b + r) * G, w, dh + (long)(b + r) * H);
}

/* dh[b][j] = sum_g dg[b][g] w[g][j] (g in order) for rows b < n; w (G, H) row-major. Rows
 * in blocks of BR (then fours, pairs, one), BT vectors of j at a time. */
static void mm_back(int n, int G, int H, const float *dg, const float *w, float *dh) {
    int b = 0;
    for (; b + BR <= n; b += BR) back_rows(BR, G, H, b, dg, w, dh);
    if (b + 4 <= n) back_rows(4, G, H, b, dg, w, dh), b += 4;
    if (b + 2 <= n) back_rows(2, G, H, b, dg, w, dh), b += 2;
    if (b < n) back_rows(1, G, H, b, dg, w, dh);
}

/* Gate rows per tile of a weight gradient: 8 (AVX-512) or 4 rows x 2 vectors. */
#define WR (VW == 16 ? 8 : 4)
#define WT 2 /* vectors per column tile of a weight gradient */

/* dw[g0 + r][j0 + .] += sum_b dg[b][g0 + r] x[b][j0 + .] (b in order) for R gate rows and
 * the VW * nv columns from j0; dg (n, G), x (n, F) and dw (G, F) row-major. */
static inline __attribute__((always_inline)) void grad_tile(int R, int nv, int n, int G, int F,
                                                            int g0, int j0, const float *dg,
                                                            const float *x, float *dw) {
    vf acc[WR][WT];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = vload(dw + (long)(g0 + r) * F + j0 + VW * v);
    for (int b = 0; b < n; b++) {
        const float *xb = x + (long)b * F + j0, *db = dg + (long)b * G + g0;
        vf xv[WT];
        for (int v = 0; v < nv; v++) xv[v] = vload(xb + VW * v);
        for (int r = 0; r < R; r++) {
            vf d = vsplat(db[r]);
            for (int v = 0; v < nv; v++) acc[r][v] = acc[r][v] + d * xv[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < nv; v++) vstore(dw + (long)(g0 + r) * F + j0 + VW * v, acc[r][v]);
}

/* grad_tile over all F columns of R gate rows from g0: WT vectors at a time, then one, then
 * the scalar remainder (the same operations). */
static inline __attribute__((always_inline)) void grad_rows(int R, int n, int G, int F, int g0,
                                                            const float *dg, const float *x,
                                                            float *dw) {
    int j0 = 0;
    for (; j0 + VW * WT <= F; j0 += VW * WT) grad_tile(R, WT, n, G, F, g0, j0, dg, x, dw);
    for (; j0 + VW <= F; j0 += VW) grad_tile(R, 1, n, G, F, g0, j0, dg, x, dw);
    for (int r = 0; r < R; r++)
        for (int j = j0; j < F; j++) {
            float acc = dw[(long)(g0 + r) * F + j];
            for (int b = 0; b < n; b++) acc = acc + dg[(long)b * G + g0 + r] * x[(long)b * F + j];
            dw[(long)(g0 + r) * F + j] = acc;
        }
}

/* A weight's gradient over one step: dw (G, F) += dg^T x over rows b < n, each element
 * accumulating over the rows in order (so over a whole backward: steps from the last, rows
 * in order; a member's rows past the live ones have dg = 0 and add nothing). */
static void mm_grad(int n, int G, int F, const float *dg, const float *x, float *dw) {
    int g = 0;
    for (; g + WR <= G; g += WR) grad_rows(WR, n, G, F, g, dg, x, dw);
    for (; g < G; g++) grad_rows(1, n, G, F, g, dg, x, dw);
}

#endif
