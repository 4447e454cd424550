/* Fused LSTM cell updates for the bundled seq2seq model on a CPU (float32).
 *
 * Built at first use by trainables/models/ckernels.py (gcc or cc, -O3 for this machine,
 * -ffp-contract=off) and called through ctypes. One call replaces the five to twelve
 * small torch ops of a time step (each ~3-10 us of dispatch at these sizes, and torch's
 * tanh costs ~6 sigmoids per element on a CPU core).
 *
 * Layout (see seq2seq_cells.py): K members, each a contiguous block of rows x H cells
 * (gates: rows x 4H, in the order o, i, f, g); blocks of member k start k * stride floats
 * after member 0. Only the first `rows` rows of each block are touched (the rows still
 * inside their sequence at this step).
 *
 * exp is a Cephes-style polynomial (about 1 ulp) written in plain arithmetic, with
 * contraction off: the vectorised loop body and its scalar remainder compute the same
 * IEEE operations, so an element's result depends only on its inputs, never on where it
 * sits in a block (a bundle member and its lone run stay bit-identical).
 */
#include "fmath.h"

/* One row of the forward step (H cells): act = (o, i, f, g), c, tanh(c), h. */
static inline void fwd_row(int H, const float *restrict z, const float *restrict cp,
                           float *restrict act, float *restrict c_out, float *restrict tc_out,
                           float *restrict h_out) {
    for (int j = 0; j < 3 * H; j++) act[j] = sigmoid_f(z[j]);
    for (int j = 3 * H; j < 4 * H; j++) act[j] = tanh_f(z[j]);
    for (int j = 0; j < H; j++) {
        float c = act[2 * H + j] * cp[j] + act[H + j] * act[3 * H + j];
        float tc = tanh_f(c);
        c_out[j] = c;
        tc_out[j] = tc;
        h_out[j] = act[j] * tc;
    }
}

/* Forward step: z (gate pre-activations), c_prev -> act (o, i, f, g activations), c, tanh(c), h
 * for the first `rows` rows of each member; rows `rows` .. `total` - 1 of c and h are set to
 * 0 (their sequences have ended; act and tanh(c) are left unwritten there). */
void lstm_fwd_step(int K, int rows, int total, int H,
                   const float *z, long z_ks,
                   const float *c_prev, long cp_ks,
                   float *act, long act_ks,
                   float *c_out, float *tc_out, float *h_out, long out_ks) {
    for (int k = 0; k < K; k++) {
        for (int b = 0; b < rows; b++) {
            long o = k * out_ks + (long)b * H;
            fwd_row(H, z + k * z_ks + (long)b * 4 * H, c_prev + k * cp_ks + (long)b * H,
                    act + k * act_ks + (long)b * 4 * H, c_out + o, tc_out + o, h_out + o);
        }
        long o = k * out_ks + (long)rows * H, n = (long)(total - rows) * H;
        if (n > 0) {
            memset(c_out + o, 0, n * sizeof(float));
            memset(h_out + o, 0, n * sizeof(float));
        }
    }
}

static const float zeros[1024];

/* One row of the backward step; dho, dco: the outputs' gradients (zeros if none). */
static inline void bwd_row(int H, const float *restrict dh, float *restrict dc,
                           const float *restrict dho, const float *restrict dco,
                           const float *restrict act, const float *restrict tc_t,
                           const float *restrict cp, float *restrict dg) {
    for (int j = 0; j < H; j++) {
        float o = act[j], i = act[H + j], f = act[2 * H + j], g = act[3 * H + j], tc = tc_t[j];
        float h_grad = dh[j] + dho[j];
        float c_grad = dc[j] + dco[j] + h_grad * (o * (1.0f - tc * tc));
        dg[j] = h_grad * (tc * o * (1.0f - o));
        dg[H + j] = c_grad * (g * i * (1.0f - i));
        dg[2 * H + j] = c_grad * (cp[j] * f * (1.0f - f));
        dg[3 * H + j] = c_grad * (i * (1.0f - g * g));
        dc[j] = c_grad * f;
    }
}

/* Backward step. dh, dc (K, B, H contiguous) hold the gradient flowing back from step t+1
 * into h_t, c_t; dhs, dcs (may be NULL) the gradient of the outputs at step t. Writes the
 * gate pre-activation gradients d_gates of the first `rows` rows (0 in rows `rows` ..
 * `total` - 1) and leaves dc = dL/dc_{t-1} through the forget gate (dh_{t-1} is
 * d_gates @ W_hh, done by the caller). H is at most 1024. */
void lstm_bwd_step(int K, int rows, int total, int H,
                   float *dh, float *dc, long st_ks,
                   const float *dhs, const float *dcs, long dout_ks,
                   const float *act, long act_ks,
                   const float *tc_t, long tc_ks,
                   const float *c_prev, long cp_ks,
                   float *d_gates, long dg_ks) {
    for (int k = 0; k < K; k++) {
        for (int b = 0; b < rows; b++) {
            long s = k * st_ks + (long)b * H, d = k * dout_ks + (long)b * H;
            bwd_row(H, dh + s, dc + s, dhs ? dhs + d : zeros, dcs ? dcs + d : zeros,
                    act + k * act_ks + (long)b * 4 * H, tc_t + k * tc_ks + (long)b * H,
                    c_prev + k * cp_ks + (long)b * H, d_gates + k * dg_ks + (long)b * 4 * H);
        }
        long n = (long)(total - rows) * 4 * H;
        if (n > 0) memset(d_gates + k * dg_ks + (long)rows * 4 * H, 0, n * sizeof(float));
    }
}

/* One row of the evaluation step (see lstm_eval_step). */
static inline void eval_row(int H, const float *restrict z, const float *restrict c2p,
                            float *restrict c2_out, float *restrict h_out) {
    for (int j = 0; j < H; j++) {
        float o = sigmoid_f(z[j]), i = sigmoid_f(z[H + j]), f = sigmoid_f(z[2 * H + j]);
        float s = sigmoid_f(z[3 * H + j]); /* sigmoid(2 x_g): tanh(x_g) = 2 s - 1 */
        float c2 = f * c2p[j] + 4.0f * i * s - 2.0f * i;
        c2_out[j] = c2;
        h_out[j] = o * (2.0f * sigmoid_f(c2) - 1.0f); /* tanh(c) = 2 sigmoid(2c) - 1 */
    }
}

/* Evaluation step (no gradients; the form of seq2seq_cells.lstm_sequence_eval): z holds the
 * gate pre-activations with the g block doubled, c2_prev the doubled cell 2c. Writes the new
 * doubled cell c2' = f c2 + 4 i sigmoid(z_g) - 2 i and h = o (2 sigmoid(c2') - 1). */
void lstm_eval_step(int K, int rows, int H,
                    const float *z, long z_ks,
                    const float *c2_prev, long cp_ks,
                    float *c2_out, float *h_out, long out_ks) {
    for (int k = 0; k < K; k++) {
        for (int b = 0; b < rows; b++) {
            long o = k * out_ks + (long)b * H;
            eval_row(H, z + k * z_ks + (long)b * 4 * H, c2_prev + k * cp_ks + (long)b * H,
                     c2_out + o, h_out + o);
        }
    }
}
