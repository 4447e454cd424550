/* The attention of one query (see attention.c), shared by attend_one and the greedy decoder
 * (decode.c). */
#ifndef FINELINE_ATTEND_H
#define FINELINE_ATTEND_H
#include <math.h>

#include "fmath.h"

#define CTX_V 2 /* vectors of context accumulated in registers at a time */

/* One row: keys_t (D, S) (the row's keys transposed), q (D), bias (S; -inf where masked),
 * enc (S, E) -> ctx (E); p: S floats of scratch. The scores accumulate over d in order,
 * vectorised over s; masked positions get exactly 0. */
static inline void attend_row(int S, int D, int E, const float *restrict kr,
                              const float *restrict qr, const float *restrict br,
                              const float *restrict er, float *restrict out,
                              float *restrict sc) {
    for (int s = 0; s < S; s++) sc[s] = 0.0f;
    for (int d = 0; d < D; d++) {
        float qd = qr[d];
        const float *restrict kd = kr + (long)d * S;
        for (int s = 0; s < S; s++) sc[s] += kd[s] * qd;
    }
    float best = -INFINITY;
    for (int s = 0; s < S; s++) {
        sc[s] += br[s];
        best = sc[s] > best ? sc[s] : best;
    }
    float sum = 0.0f;
    for (int s = 0; s < S; s++) {
        sc[s] = sc[s] == -INFINITY ? 0.0f : exp_f(sc[s] - best);
        sum += sc[s];
    }
    float inv = 1.0f / sum;
    int e0 = 0;
    for (; e0 + 16 * CTX_V <= E; e0 += 16 * CTX_V) { /* the context in registers */
        vf16 acc[CTX_V];
        for (int v = 0; v < CTX_V; v++) acc[v] = vsplat(0.0f);
        for (int s = 0; s < S; s++) {
            vf16 w = vsplat(sc[s] * inv);
            const float *es = er + (long)s * E + e0;
            for (int v = 0; v < CTX_V; v++) acc[v] = acc[v] + w * vload(es + 16 * v);
        }
        for (int v = 0; v < CTX_V; v++) vstore(out + e0 + 16 * v, acc[v]);
    }
    for (int e = e0; e < E; e++) out[e] = 0.0f;
    for (int s = 0; s < S; s++) {
        float w = sc[s] * inv;
        const float *restrict es = er + (long)s * E;
        for (int e = e0; e < E; e++) out[e] += w * es[e];
    }
}

#endif
