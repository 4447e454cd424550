/* The LSTM cell update of one evaluation row (see lstm_cell.c), shared by the evaluation
 * step and the greedy decoder (decode.c). */
#ifndef FINELINE_CELL_H
#define FINELINE_CELL_H
#include "fmath.h"

/* One row of the evaluation step (see lstm_cell.c's lstm_eval_step). c2_out may be c2p (the
 * decoder updates its cells in place, decode.c): so neither is `restrict` (passing one object
 * to two restrict parameters that one of them writes is undefined behaviour); element j is
 * read before it is written, so in place computes the same bits. */
static inline void eval_row(int H, const float *restrict z, const float *c2p, float *c2_out,
                            float *restrict h_out) {
    int j = 0;
    for (; j + VW <= H; j += VW) { /* the scalar loop's operations, VW lanes at a time */
        vf o = sigmoid_v(vload(z + j)), i = sigmoid_v(vload(z + H + j));
        vf f = sigmoid_v(vload(z + 2 * H + j)), s = sigmoid_v(vload(z + 3 * H + j));
        vf c2 = f * vload(c2p + j) + 4.0f * i * s - 2.0f * i;
        vstore(c2_out + j, c2);
        vstore(h_out + j, o * (2.0f * sigmoid_v(c2) - 1.0f));
    }
    for (; j < H; j++) {
        float o = sigmoid_f(z[j]), i = sigmoid_f(z[H + j]), f = sigmoid_f(z[2 * H + j]);
        float s = sigmoid_f(z[3 * H + j]); /* sigmoid(2 x_g): tanh(x_g) = 2 s - 1 */
        float c2 = f * c2p[j] + 4.0f * i * s - 2.0f * i;
        c2_out[j] = c2;
        h_out[j] = o * (2.0f * sigmoid_f(c2) - 1.0f); /* tanh(c) = 2 sigmoid(2c) - 1 */
    }
}

#endif
