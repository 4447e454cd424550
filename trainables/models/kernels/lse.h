/* The log-sum-exp of a row of logits and its cross-entropy (see logits.c), shared by the
 * logits kernels and the decoder's teacher-forced pass (decode.c). The sum runs in 16 fixed
 * lanes combined in a fixed order, so a row's result depends only on that row. */
#ifndef FINELINE_LSE_H
#define FINELINE_LSE_H
#include <math.h>

#include "argmax.h"

/* sum(exp(x - best)) over the row, also written to e when e is not NULL. Lane l of the
 * LANES = 16 sums x[j] for j = l mod 16 (LANES / VW vectors of VW lanes), then the remainder
 * and the lanes in order: the same operations in the same order at every width. */
static inline float row_exp_sum(int V, const float *restrict x, float best, float *restrict e) {
    vf s[LANES / VW];
    for (int q = 0; q < LANES / VW; q++) s[q] = vsplat(0.0f);
    int j = 0;
    for (; j + LANES <= V; j += LANES)
        for (int q = 0; q < LANES / VW; q++) {
            vf v = exp_v(vload(x + j + q * VW) - best);
            if (e) vstore(e + j + q * VW, v);
            s[q] += v;
        }
    float sl[LANES];
    for (int q = 0; q < LANES / VW; q++) to_lanes(s[q], sl + q * VW);
    for (int l = 0; j + l < V; l++) {
        float v = exp_f(x[j + l] - best);
        if (e) e[j + l] = v;
        sl[l] += v;
    }
    float sum = 0.0f;
    for (int l = 0; l < LANES; l++) sum += sl[l];
    return sum;
}

/* Cross-entropy of the row against target (log-sum-exp - x[target]; NaN if the row holds a
 * NaN) and the row's argmax (torch's semantics) in *argmax. */
static inline float row_ce(int V, const float *restrict x, int64_t target, int64_t *argmax) {
    float best;
    int nan;
    *argmax = row_argmax(V, x, &best, &nan);
    float lse = nan ? NAN : logf(row_exp_sum(V, x, best, NULL)) + best;
    return lse - x[target];
}

/* Training: the row's cross-entropy against target (as row_ce), its softmax numerators
 * e = exp(x - max) (V floats) and *inv = 1 / sum(e), so that the gradient (row_ce_grad)
 * needs no exp again. */
static inline float row_softmax_ce(int V, const float *restrict x, int64_t target,
                                   float *restrict e, float *inv) {
    float best;
    int nan;
    row_argmax(V, x, &best, &nan);
    float sum = row_exp_sum(V, x, best, e);
    if (nan) sum = NAN;
    *inv = 1.0f / sum;
    return logf(sum) + best - x[target];
}

/* The gradient of g * ce with respect to the row's logits, from row_softmax_ce's e and inv:
 * d = g (e inv - onehot). d may be e itself (the gradient then replaces the numerators). */
static inline void row_ce_grad(int V, const float *e, float inv, int64_t target, float g,
                               float *d) {
    float scale = g * inv;
    for (int j = 0; j < V; j++) d[j] = scale * e[j];
    d[target] -= g;
}

#endif
