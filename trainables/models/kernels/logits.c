/* Row-wise cross-entropy and argmax of logits (M rows of V floats, row stride V), for the
 * seq2seq output layer on a CPU (float32). Built with lstm_cell.c into one library (see
 * trainables/models/ckernels.py).
 *
 * Reductions over a row run in 16 fixed lanes (fmath.h's vectors; the remainder of a row
 * folded into the lanes in scalar code doing the same operations) combined in a fixed order:
 * a row's result depends only on that row (a bundle member and its lone run stay
 * bit-identical). torch's argmax semantics: the first maximum,
 * and a NaN counts as the maximum (the first NaN wins).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fmath.h"

#define LANES VLANES

/* The lanes of v, then lanes of a scalar remainder (j .. V-1) folded into them. */
static inline void to_lanes(vf16 v, float *lanes) { memcpy(lanes, &v, sizeof v); }

/* Largest value of the row and the first index holding it; *odd = whether the row holds a
 * NaN or an infinity (then row_odd recomputes both exactly). One pass: each lane keeps its
 * maximum and where it first saw it, and the lowest such index among the lanes holding the
 * row's maximum wins. */
static inline float row_max(int V, const float *restrict x, int64_t *first, int *odd) {
    vf16 m = vsplat(-INFINITY), z = vsplat(0.0f);
    vi16 at = {0}, j_v = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    int j = 0;
    for (; j + LANES <= V; j += LANES, j_v += LANES) {
        vf16 v = vload(x + j);
        vi16 gt = v > m;
        m = vselect(gt, v, m);
        at = (gt & j_v) | (~gt & at);
        z += v * 0.0f; /* stays 0 unless v is NaN or infinite */
    }
    float ml[LANES], zl[LANES];
    int32_t al[LANES];
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
    for (int l = 1; l < LANES; l++) {
        best = ml[l] > best ? ml[l] : best;
        zero += zl[l];
    }
    int32_t lowest = V;
    for (int l = 0; l < LANES; l++)
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

/* sum(exp(x - best)) over the row, also written to e when e is not NULL. */
static inline float row_exp_sum(int V, const float *restrict x, float best, float *restrict e) {
    vf16 s = vsplat(0.0f);
    int j = 0;
    for (; j + LANES <= V; j += LANES) {
        vf16 v = exp_v(vload(x + j) - best);
        if (e) vstore(e + j, v);
        s += v;
    }
    float sl[LANES];
    to_lanes(s, sl);
    for (int l = 0; j + l < V; l++) {
        float v = exp_f(x[j + l] - best);
        if (e) e[j + l] = v;
        sl[l] += v;
    }
    float sum = 0.0f;
    for (int l = 0; l < LANES; l++) sum += sl[l];
    return sum;
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

/* argmax of each row into out (M int64). */
void logits_argmax(int M, int V, const float *x, int64_t *out) {
    for (int r = 0; r < M; r++) {
        float best;
        int nan;
        out[r] = row_argmax(V, x + (long)r * V, &best, &nan);
    }
}

/* Cross-entropy of each row against target (ce = log-sum-exp - x[target]; 0 where target ==
 * ignore) and whether target is the row's argmax (hit, may be NULL; 0 where ignored). */
void logits_ce(int M, int V, const float *x, const int64_t *target, int64_t ignore,
               float *ce, uint8_t *hit) {
    for (int r = 0; r < M; r++) {
        const float *row = x + (long)r * V;
        float best;
        int nan;
        int64_t i = row_argmax(V, row, &best, &nan);
        float lse = nan ? NAN : logf(row_exp_sum(V, row, best, NULL)) + best;
        int64_t t = target[r];
        ce[r] = t == ignore ? 0.0f : lse - row[t];
        if (hit) hit[r] = t != ignore && i == t;
    }
}

/* Training: cross-entropy of each row (as logits_ce) and its softmax as e = exp(x - max)
 * (M x V) and inv = 1 / sum(e) (M), so that the gradient needs no exp again (rows whose
 * target is ignored are left unwritten). */
void logits_softmax_ce(int M, int V, const float *x, const int64_t *target, int64_t ignore,
                       float *ce, float *p, float *inv) {
    for (int r = 0; r < M; r++) {
        const float *restrict row = x + (long)r * V;
        float *restrict pr = p + (long)r * V;
        int64_t t = target[r];
        if (t == ignore) {
            ce[r] = 0.0f;
            continue;
        }
        float best;
        int nan;
        row_argmax(V, row, &best, &nan);
        float sum = row_exp_sum(V, row, best, pr);
        if (nan) sum = NAN;
        inv[r] = 1.0f / sum;
        ce[r] = logf(sum) + best - row[t];
    }
}

/* Gradient of sum_r g[r] ce[r] with respect to the logits, from logits_softmax_ce's e and
 * inv: dx = g (e inv - onehot), 0 on ignored rows. */
void logits_ce_grad(int M, int V, const float *p, const float *inv, const int64_t *target,
                    int64_t ignore, const float *g, float *dx) {
    for (int r = 0; r < M; r++) {
        const float *restrict pr = p + (long)r * V;
        float *restrict d = dx + (long)r * V;
        int64_t t = target[r];
        if (t == ignore) {
            for (int j = 0; j < V; j++) d[j] = 0.0f;
            continue;
        }
        float gr = g[r], scale = g[r] * inv[r];
        for (int j = 0; j < V; j++) d[j] = scale * pr[j];
        d[t] -= gr;
    }
}
