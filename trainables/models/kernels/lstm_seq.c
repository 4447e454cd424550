/* Whole-sequence LSTM layers for the bundled seq2seq model on a CPU (float32): the input
 * projection and the recurrent matmul of every time step are done here, next to the cell
 * update, so a training layer over T steps is one call each way instead of a projection
 * bmm and T (baddbmm + cell kernel) pairs from Python.
 *
 * Built with the other kernels into one library (trainables/models/ckernels.py). Layout as
 * in lstm_cell.c: K members, each (T, B, .) contiguous; gates in the order o, i, f, g.
 * A member's weights (32 KB at E = H = 32) stay in cache while all its steps run.
 *
 * Matmuls accumulate each output element over the inner index in order, with separate
 * multiply and add (contraction off), in vectors of VW lanes whose remainder lanes are done by
 * scalar code of the same operations: an element's bits depend only on its own row, never
 * on the row's place in a block, a member's place in the bundle or the blocking (a bundle
 * member and its lone run stay bit-identical).
 */
#include "fmath.h"
#include "mm.h"
#include "mm_bwd.h"

/* The activations of one row in place: z (o, i, f, g pre-activations) -> act; then c, tanh(c), h. */
static inline void cell_row(int H, float *restrict a, const float *restrict cp,
                            float *restrict c_out, float *restrict tc_out, float *restrict h_out) {
    sigmoid_all(3 * H, a);
    tanh_all(H, a + 3 * H);
    int j = 0;
    for (; j + VW <= H; j += VW) { /* the scalar loop's operations, VW lanes at a time */
        vf c = vload(a + 2 * H + j) * vload(cp + j) + vload(a + H + j) * vload(a + 3 * H + j);
        vf tc = tanh_v(c);
        vstore(c_out + j, c);
        vstore(tc_out + j, tc);
        vstore(h_out + j, vload(a + j) * tc);
    }
    for (; j < H; j++) {
        float c = a[2 * H + j] * cp[j] + a[H + j] * a[3 * H + j];
        float tc = tanh_f(c);
        c_out[j] = c;
        tc_out[j] = tc;
        h_out[j] = a[j] * tc;
    }
}

static const float zeros[1024];

static inline void add_row(int n, const float *restrict x, float *restrict acc) {
    for (int j = 0; j < n; j++) acc[j] = acc[j] + x[j];
}

/* One row of the backward step (as lstm_cell.c's): dh, dc flow back from step t + 1 (dc is
 * left as the gradient of c_{t-1} through the forget gate); dho, dco are the outputs'
 * gradients at step t (zeros if none); writes the gate pre-activation gradients dg. */
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

/* Training forward of one layer over T steps. x (K, T, B, E) the layer's inputs, w_ih_t
 * (K, E, 4H) = W_ih transposed, bias (K, 4H) both biases summed (NULL: none), w_hh_t
 * (K, H, 4H) = W_hh transposed, h0, c0 (K, B, H); active: T row counts (each step computes
 * rows < active[t], the rows whose sequences go on; NULL: all). The input projection is
 * done here too, row by row, so padding rows cost nothing and no (K, T, B, 4H) projection
 * is written and read back. Writes act (K, T, B, 4H) gate activations and cs, tcs, hs
 * (K, T, B, H); past the live rows c and h are 0, act and tanh(c) unwritten. */
void lstm_fwd_seq(int K, int T, int B, int H, int E, const float *x, const float *w_ih_t,
                  const float *bias, const float *w_hh_t, const float *h0, const float *c0,
                  const int *active, float *act, float *cs, float *tcs, float *hs) {
    long G = 4L * H, sg = (long)B * G, sh = (long)B * H, sx = (long)B * E;
    for (int k = 0; k < K; k++) {
        const float *wx = w_ih_t + k * E * G, *wh = w_hh_t + k * H * G;
        const float *bk = bias ? bias + k * G : 0;
        const float *h = h0 + k * sh, *c = c0 + k * sh;
        for (int t = 0; t < T; t++) {
            long kt = (long)k * T + t, og = kt * sg, oh = kt * sh;
            int n = active ? active[t] : B;
            mm_block(n, G, bk, E, x + kt * sx, wx, H, h, wh, act + og);
            for (int b = 0; b < n; b++)
                cell_row(H, act + og + b * G, c + b * H, cs + oh + b * H, tcs + oh + b * H,
                         hs + oh + b * H);
            if (n < B) {
                memset(cs + oh + (long)n * H, 0, (sh - (long)n * H) * sizeof(float));
                memset(hs + oh + (long)n * H, 0, (sh - (long)n * H) * sizeof(float));
            }
            h = hs + oh;
            c = cs + oh;
        }
    }
}

/* Training backward of lstm_fwd_seq. dhs, dcs (K, T, B, H; NULL: none) are the outputs'
 * gradients; x, h0 and hs as in the forward; w_ih (K, 4H, E), w_hh (K, 4H, H). Writes
 * d_gates (K, T, B, 4H; 0 past the live rows), dx (K, T, B, E; 0 past the live rows): the
 * inputs' gradient, dh, dc (K, B, H): the gradients of h0 and c0, dw_ih (K, 4H, E) and dw_hh
 * (K, 4H, H): the weights' gradients (mm_grad), and (unless NULL) d_bias (K, 4H): d_gates
 * summed over the live rows. Every sum over steps and rows runs in a fixed order (steps from
 * the last, rows in order), so padding a member's batch with ended rows or steps adds
 * nothing to it. */
void lstm_bwd_seq(int K, int T, int B, int H, int E, const float *x, const float *h0,
                  const float *hs, const float *w_ih, const float *w_hh, const float *dhs,
                  const float *dcs, const float *act, const float *cs, const float *tcs,
                  const float *c0, const int *active, float *d_gates, float *dx, float *dh,
                  float *dc, float *dw_ih, float *dw_hh, float *d_bias) {
    long G = 4L * H, sg = (long)B * G, sh = (long)B * H, sx = (long)B * E;
    memset(dh, 0, K * sh * sizeof(float));
    memset(dc, 0, K * sh * sizeof(float));
    memset(dw_ih, 0, K * G * E * sizeof(float));
    memset(dw_hh, 0, K * G * H * sizeof(float));
    if (d_bias) memset(d_bias, 0, K * G * sizeof(float));
    for (int k = 0; k < K; k++) {
        const float *w = w_hh + k * G * H, *wi = w_ih + k * G * E;
        float *dhk = dh + k * sh, *dck = dc + k * sh;
        for (int t = T - 1; t >= 0; t--) {
            long og = ((long)k * T + t) * sg, oh = ((long)k * T + t) * sh;
            int n = active ? active[t] : B;
            const float *cp = t ? cs + oh - sh : c0 + k * sh;
            for (int b = 0; b < n; b++)
                bwd_row(H, dhk + b * H, dck + b * H, dhs ? dhs + oh + b * H : zeros,
                        dcs ? dcs + oh + b * H : zeros, act + og + b * G, tcs + oh + b * H,
                        cp + b * H, d_gates + og + b * G);
            if (d_bias)
                for (int b = 0; b < n; b++) add_row(G, d_gates + og + b * G, d_bias + k * G);
            if (n < B) memset(d_gates + og + n * G, 0, (sg - n * G) * sizeof(float));
            long ox = ((long)k * T + t) * sx;
            mm_grad(n, (int)G, E, d_gates + og, x + ox, dw_ih + k * G * E);
            mm_grad(n, (int)G, H, d_gates + og, t ? hs + oh - sh : h0 + k * sh, dw_hh + k * G * H);
            mm_back(n, G, E, d_gates + og, wi, dx + ox);
            if (n < B) memset(dx + ox + (long)n * E, 0, (sx - (long)n * E) * sizeof(float));
            mm_back(n, G, H, d_gates + og, w, dhk);
        }
    }
}
