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
#include <stdint.h>
#include <string.h>

static inline float exp_f(float x) {
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    float t = x * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

static inline float tanh_f(float x) { return 2.0f / (1.0f + exp_f(-2.0f * x)) - 1.0f; }

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

/* Forward step: z (gate pre-activations), c_prev -> act (o, i, f, g activations), c, tanh(c), h. */
void lstm_fwd_step(int K, int rows, int H,
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
 * gate pre-activation gradients d_gates and leaves dc = dL/dc_{t-1} through the forget gate
 * (dh_{t-1} is d_gates @ W_hh, done by the caller). H is at most 1024. */
void lstm_bwd_step(int K, int rows, int H,
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
    }
}
