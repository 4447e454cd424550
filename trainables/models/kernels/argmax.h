/* torch's argmax of a row of floats in one vectorised pass (see logits.c), shared by the
 * logits kernels and the greedy decoder (decode.c): the first maximum, and a NaN counts as
 * the maximum (the first NaN wins). Lanes are combined in a fixed order, so a row's result
 * depends only on that row. */
#ifndef FINELINE_ARGMAX_H
#define FINELINE_ARGMAX_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fmath.h"

#define LANES 16 /* the fixed lanes of a row's sums (lse.h), whatever the vectors' width VW */

/* The lanes of v (VW floats). */
static inline void to_lanes(vf v, float *lanes) { memcpy(lanes, &v, sizeof v); }

/* Largest value of the row and the first index holding it; *odd = whether the row holds a
 * NaN or an infinity (then row_odd recomputes both exactly). One pass: each lane keeps its
 * maximum and where it first saw it, and the lowest such index among the lanes holding the
 * row's maximum wins (the same at every width VW). */
static inline float row_max(int V, const float *restrict x, int64_t *first, int *odd) {
    vf m = vsplat(-INFINITY), z = vsplat(0.0f);
    vi at = {0}, j_v;
    int32_t start[VW];
    for (int l = 0; l < VW; l++) start[l] = l;
    memcpy(&j_v, start, sizeof j_v);
    int j = 0;
    for (; j + VW <= V; j += VW, j_v += VW) {
        vf v = vload(x + j);
        vi gt = v > m;
        m = vselect(gt, v, m);
        at = (gt & j_v) | (~gt & at);
        z += v * 0.0f; /* stays 0 unless v is NaN or infinite */
    }
    float ml[VW], zl[VW];
    int32_t al[VW];
    to_lanes(m, ml);
    to_lanes(z, zl);
    memcpy(al, &at, sizeof al);
    for (int l = 0; j + l < V; l++) {
        float v = x[j + l];
        if (v > ml[l]) {
            ml[l] = v;
            al[l] = j + l;
        }
        zl[l] += v * 0.0f;
    }
    float best = ml[0], zero = zl[0];
    for (int l = 1; l < VW; l++) {
        best = ml[l] > best ? ml[l] : best;
        zero += zl[l];
    }
    int32_t lowest = V;
    for (int l = 0; l < VW; l++)
        if (ml[l] == best && al[l] < lowest) lowest = al[l];
    *first = lowest < V ? lowest : 0;
    *odd = zero != 0.0f;
    return best;
}

/* The first index of the row holding `best` (0 if none). */
static inline int64_t row_first(int V, const float *restrict x, float best) {
    for (int j = 0; j < V; j++)
        if (x[j] == best) return j;
    return 0;
}

/* A row with a NaN or an infinity: *best = its maximum ignoring NaNs (-inf if none), and
 * torch's argmax (the first NaN if there is one, else the first maximum). */
static int64_t row_odd(int V, const float *x, float *best) {
    float m = -INFINITY;
    int64_t first_nan = -1;
    for (int j = 0; j < V; j++) {
        if (x[j] != x[j]) {
            if (first_nan < 0) first_nan = j;
        } else if (x[j] > m) {
            m = x[j];
        }
    }
    *best = m;
    return first_nan >= 0 ? first_nan : row_first(V, x, m);
}

/* torch's argmax of a row; *best its maximum, *nan whether it holds a NaN. */
static inline int64_t row_argmax(int V, const float *x, float *best, int *nan) {
    int odd;
    int64_t first;
    *best = row_max(V, x, &first, &odd);
    *nan = 0;
    if (!odd) return first;
    int64_t i = row_odd(V, x, best);
    *nan = x[i] != x[i];
    return i;
}

#endif
