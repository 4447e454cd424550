/* Greedy decoding of the bundled seq2seq model on a CPU (float32): all the steps of a batch
 * in one call, instead of a dozen torch ops per step from Python (seq2seq_fast.FastStepper).
 *
 * Rows are decoded RB at a time through every step, so their states, the step's gates,
 * context and logits stay in cache while a member's weights (about 60 KB for the paper's
 * model) are read from L1/L2 for each pair of rows. A step: layer 0's input projection is
 * looked up by the previous token, then per layer the recurrent matmul (mm.h) and the cell
 * (cell.h, the evaluation form: doubled g weights and cells), then the attention of the top
 * state (attend.h), the combine layer (doubled weights, tanh as 2 sigmoid(2x) - 1), the
 * output layer and its argmax (argmax.h). A row's result depends only on that row (its
 * place in a block or a member's place in the bundle changes no bit).
 */
#include <stdint.h>
#include <stdlib.h>

#include "argmax.h"
#include "attend.h"
#include "cell.h"
#include "mm.h"

#define RB 16 /* rows decoded together through all their steps */

static inline void add_into(int n, const float *restrict x, float *restrict acc) {
    for (int j = 0; j < n; j++) acc[j] = acc[j] + x[j];
}

/* K members of N rows, L decoder layers of Hd units, V output classes (out_t, out_b padded
 * with zeros to Vp >= V columns), Vt target tokens, T steps at most.
 * steps (K, N): each row's steps; a block of rows runs to its longest, and a row's tokens
 *   past its own steps are left as they were.
 * table (K, Vt, 4Hd): layer 0's input projection of each token, biases included.
 * w_ih_t (L - 1, K, Hd, 4Hd), bias (L - 1, K, 4Hd): layers 1 .. L - 1 (unused if L == 1).
 * w_hh_t (L, K, Hd, 4Hd). h, c2 (L, K, N, Hd): initial states and doubled cells, updated in
 *   place.
 * keys_t (K, N, Hd, S), mask (K, N, S; -inf where masked), enc (K, N, S, He), comb_ctx_t
 *   (K, He, Hd), comb_h_t (K, Hd, Hd): attention and the combine layer; keys_t NULL: none
 *   (the top state goes to the output layer).
 * out_t (K, Hd, Vp), out_b (K, Vp). Writes tokens (K, N, T): each step's argmax, the
 * previous one (first: bos) being the next step's input. Returns 0, or 1 if out of memory. */
int greedy_decode(int K, int N, int L, int Hd, int He, int S, int V, int Vp, int Vt, int T,
                  int64_t bos, const int *steps, const float *table, const float *w_ih_t,
                  const float *bias, const float *w_hh_t, float *h, float *c2,
                  const float *keys_t, const float *mask, const float *enc,
                  const float *comb_ctx_t, const float *comb_h_t, const float *out_t,
                  const float *out_b, int64_t *tokens) {
    long G = 4L * Hd, per_layer = (long)K * N * Hd;
    float *z = malloc(RB * G * sizeof(float)), *u = malloc(RB * Hd * sizeof(float));
    float *ctx = malloc((RB * (long)He + 1) * sizeof(float)), *p = malloc((S + 1) * sizeof(float));
    float *logits = malloc(RB * (long)Vp * sizeof(float));
    int64_t prev[RB];
    int failed = !z || !u || !ctx || !p || !logits;
    for (int k = 0; k < K && !failed; k++) {
        for (int b0 = 0; b0 < N; b0 += RB) {
            int n = N - b0 < RB ? N - b0 : RB, t_end = 0;
            long row0 = (long)k * N + b0; /* the block's first row among all K * N */
            for (int r = 0; r < n; r++) {
                prev[r] = bos;
                t_end = steps[row0 + r] > t_end ? steps[row0 + r] : t_end;
            }
            for (int t = 0; t < t_end && t < T; t++) {
                const float *below = 0; /* the layer below's new states */
                for (int l = 0; l < L; l++) {
                    float *hl = h + l * per_layer + row0 * Hd, *cl = c2 + l * per_layer + row0 * Hd;
                    const float *whh = w_hh_t + ((long)l * K + k) * Hd * G;
                    if (l == 0) {
                        mm_block(n, (int)G, 0, 0, 0, 0, Hd, hl, whh, z);
                        for (int r = 0; r < n; r++)
                            add_into((int)G, table + ((long)k * Vt + prev[r]) * G, z + r * G);
                    } else {
                        long lk = (long)(l - 1) * K + k;
                        mm_block(n, (int)G, bias + lk * G, Hd, below, w_ih_t + lk * Hd * G, Hd, hl,
                                 whh, z);
                    }
                    for (int r = 0; r < n; r++)
                        eval_row(Hd, z + r * G, cl + r * Hd, cl + r * Hd, hl + r * Hd);
                    below = hl;
                }
                const float *x = below; /* (n, Hd): what the output layer reads */
                if (keys_t) {
                    for (int r = 0; r < n; r++) {
                        long row = row0 + r;
                        attend_row(S, Hd, He, keys_t + row * Hd * S, below + r * Hd, mask + row * S,
                                   enc + row * S * He, ctx + r * He, p);
                    }
                    mm_block(n, Hd, 0, He, ctx, comb_ctx_t + (long)k * He * Hd, Hd, below,
                             comb_h_t + (long)k * Hd * Hd, u);
                    for (int i = 0; i < n * Hd; i++) u[i] = 2.0f * sigmoid_f(u[i]) - 1.0f;
                    x = u;
                }
                mm_block(n, Vp, out_b + (long)k * Vp, Hd, x, out_t + (long)k * Hd * Vp, 0, 0, 0,
                         logits);
                for (int r = 0; r < n; r++) {
                    float best;
                    int nan;
                    prev[r] = row_argmax(V, logits + (long)r * Vp, &best, &nan);
                    tokens[(row0 + r) * T + t] = prev[r];
                }
            }
        }
    }
    free(z);
    free(u);
    free(ctx);
    free(p);
    free(logits);
    return failed;
}
