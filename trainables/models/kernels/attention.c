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
#include "attend.h"

/* keys_t (R, D, Sp) (each row's keys transposed; Sp >= S, positions past S ignored), q (R, D),
 * bias (R, Sp), enc (R, S, E) -> ctx (R, E); all contiguous. */
void attend_one(int R, int S, int Sp, int D, int E, const float *keys_t, const float *q,
                const float *bias, const float *enc, float *ctx) {
    float p[Sp];
    for (int r = 0; r < R; r++)
        attend_row(S, Sp, D, E, keys_t + (long)r * D * Sp, q + (long)r * D, bias + (long)r * Sp,
                   enc + (long)r * S * E, ctx + (long)r * E, p);
}
