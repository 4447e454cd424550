/* The attention of one query (see attention.c), shared by attend_one and the decoder
 * (decode.c). */
#ifndef FINELINE_ATTEND_H
#define FINELINE_ATTEND_H
#include <math.h>

#include "fmath.h"

#define CTX_V 2 /* vectors of context accumulated in registers at a time */

/* One row: keys_t (D, Sp) (the row's keys transposed, Sp >= S positions per key row), q (D),
 * bias (Sp; -inf where masked), enc (S, E) -> ctx (E); sc: Sp floats of scratch. Positions
 * S .. Sp - 1 (padding, e.g. to whole 16-lane vectors (any VW divides 16), which is what makes the scores one
 * vector op per d) are ignored. The scores accumulate over d in order; masked positions get
 * exactly 0; the softmax sum and the context run over s in order. */
static inline void attend_row(int S, int Sp, int D, int E, const float *restrict kr,
                              const float *restrict qr, const float *restrict br,
                              const float *restrict er, float *restrict out,
                              float *restrict sc) {
    int s0 = 0;
    for (; s0 < S && s0 + VW <= Sp; s0 += VW) { /* VW positions at a time */
        vf acc = vsplat(0.0f);
        for (int d = 0; d < D; d++) acc = acc + vload(kr + (long)d * Sp + s0) * vsplat(qr[d]);
        vstore(sc + s0, acc + vload(br + s0));
    }
    for (int s = s0; s < S; s++) {
        float acc = 0.0f;
        for (int d = 0; d < D; d++) acc = acc + kr[(long)d * Sp + s] * qr[d];
        sc[s] = acc + br[s];
    }
    float best = -INFINITY;
    for (int s = 0; s < S; s++) best = sc[s] > best ? sc[s] : best;
    s0 = 0;
    for (; s0 < S && s0 + VW <= Sp; s0 += VW) {
        vf x = vload(sc + s0);
        vstore(sc + s0, vselect(x == -INFINITY, vsplat(0.0f), exp_v(x - best)));
    }
    for (int s = s0; s < S; s++) sc[s] = sc[s] == -INFINITY ? 0.0f : exp_f(sc[s] - best);
    float sum = 0.0f;
    for (int s = 0; s < S; s++) sum += sc[s];
    float inv = 1.0f / sum;
    int e0 = 0;
    for (; e0 + VW * CTX_V <= E; e0 += VW * CTX_V) { /* the context in registers */
        vf acc[CTX_V];
        for (int v = 0; v < CTX_V; v++) acc[v] = vsplat(0.0f);
        for (int s = 0; s < S; s++) {
            vf w = vsplat(sc[s] * inv);
            const float *es = er + (long)s * E + e0;
            for (int v = 0; v < CTX_V; v++) acc[v] = acc[v] + w * vload(es + VW * v);
        }
        for (int v = 0; v < CTX_V; v++) vstore(out + e0 + VW * v, acc[v]);
    }
    for (int e = e0; e < E; e++) out[e] = 0.0f;
    for (int s = 0; s < S; s++) {
        float w = sc[s] * inv;
        const float *restrict es = er + (long)s * E;
        for (int e = e0; e < E; e++) out[e] += w * es[e];
    }
}

#endif
