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
#include "argmax.h"
#include "lse.h"

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
        int64_t t = target[r], i;
        float c = row_ce(V, x + (long)r * V, t == ignore ? 0 : t, &i);
        ce[r] = t == ignore ? 0.0f : c;
        if (hit) hit[r] = t != ignore && i == t;
    }
}

/* Training: cross-entropy of each row (as logits_ce) and its softmax as e = exp(x - max)
 * (M x V) and inv = 1 / sum(e) (M), so that the gradient needs no exp again (rows whose
 * target is ignored are left unwritten). */
void logits_softmax_ce(int M, int V, const float *x, const int64_t *target, int64_t ignore,
                       float *ce, float *p, float *inv) {
    for (int r = 0; r < M; r++) {
        int64_t t = target[r];
        ce[r] = t == ignore ? 0.0f
                            : row_softmax_ce(V, x + (long)r * V, t, p + (long)r * V, inv + r);
    }
}

/* Gradient of sum_r g[r] ce[r] with respect to the logits, from logits_softmax_ce's e and
 * inv: dx = g (e inv - onehot), 0 on ignored rows. */
void logits_ce_grad(int M, int V, const float *p, const float *inv, const int64_t *target,
                    int64_t ignore, const float *g, float *dx) {
    for (int r = 0; r < M; r++) {
        float *d = dx + (long)r * V;
        if (target[r] == ignore)
            for (int j = 0; j < V; j++) d[j] = 0.0f;
        else
            row_ce_grad(V, p + (long)r * V, inv[r], target[r], g[r], d);
    }
}
