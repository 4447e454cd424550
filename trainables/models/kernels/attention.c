/* Attention of one query per row, for the seq2seq decoder's decoding steps on a CPU
 * (float32). Built with lstm_cell.c into one library (see trainables/models/ckernels.py).
 *
 * For each of R rows (hypotheses): scores_s = keys_s . q + bias_s over S source positions
 * (bias -inf where masked), p = softmax(scores) (masked positions get exactly 0), and
 * ctx = sum_s p_s enc_s. torch does this as a multiply-and-sum over (R, S, D) tensors, four
 * softmax ops and another multiply-and-sum, each a pass over memory; here a row is done in
 * cache. Every sum runs in a fixed order, so a row's result depends only on that row (a
 * bundle member and its lone run stay bit-identical).
 */
#include <math.h>
#include <string.h>

#include "fmath.h"

/* keys_t (R, D, S) (each row's keys transposed), q (R, D), bias (R, S), enc (R, S, E) -> ctx
 * (R, E); all contiguous. A row's scores accumulate over d in order, vectorised over s. */
void attend_one(int R, int S, int D, int E, const float *keys_t, const float *q,
                const float *bias, const float *enc, float *ctx) {
    float p[S];
    for (int r = 0; r < R; r++) {
        const float *restrict kr = keys_t + (long)r * D * S, *restrict qr = q + (long)r * D;
        const float *restrict br = bias + (long)r * S, *restrict er = enc + (long)r * S * E;
        float *restrict out = ctx + (long)r * E;
        float *restrict sc = p;
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
        for (int e = 0; e < E; e++) out[e] = 0.0f;
        for (int s = 0; s < S; s++) {
            float w = sc[s] * inv;
            const float *restrict es = er + (long)s * E;
            for (int e = 0; e < E; e++) out[e] += w * es[e];
        }
    }
}
