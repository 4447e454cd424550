/* The training output layer of the bundled seq2seq model on a CPU (float32): the logits
 * u @ w + b of a member's token rows, their cross-entropy, and its gradients with respect
 * to u, w and b, a block of rows at a time, so a block's logits are made, used and turned
 * into their gradient while they are in cache. One call each way replaces a dozen bmm calls
 * per chunk of tokens and their packing.
 *
 * Layout: K members; u (K, N, D) token rows, w (K, D, Vp) with its columns past V zero
 * (whole vectors per row; they make logits no row reads), b (K, Vp), target (K, N).
 * Rows whose target is `ignore` (the token list's padding) get ce 0 and zero gradients.
 * Every element's bits depend only on its own row (the logits, ce, du) or on the member's
 * rows in order (dw, db; padding rows add exact zeros), never on the bundle (mm.h).
 */
#include <stdint.h>
#include <stdlib.h>

#include "argmax.h"
#include "lse.h"
#include "mm.h"
#include "mm_bwd.h"

#define OB 16 /* token rows per block of the forward (their logits: 16 KB at Vp = 256) */
#define GB 32 /* token rows per block of the backward */

/* ce (K, N): cross-entropy of each row's logits b + u @ w against its target; e (K, N, V):
 * the softmax numerators exp(logits - max), and inv (K, N): 1 / their sum (left unwritten
 * on ignored rows), for out_bwd. Returns 0, or -1 where its scratch cannot be allocated. */
int out_fwd(int K, int N, int D, int V, int Vp, const float *u, const float *w, const float *b,
            const int64_t *target, int64_t ignore, float *ce, float *e, float *inv) {
    float *logits = malloc(sizeof(float) * OB * Vp); /* (OB, Vp) */
    if (!logits) return -1;
    for (int k = 0; k < K; k++) {
        const float *wk = w + (long)k * D * Vp, *bk = b + (long)k * Vp;
        for (int r0 = 0; r0 < N; r0 += OB) {
            int n = N - r0 < OB ? N - r0 : OB;
            long row0 = (long)k * N + r0;
            mm_block(n, Vp, bk, D, u + row0 * D, wk, 0, 0, 0, logits);
            for (int r = 0; r < n; r++) {
                long row = row0 + r;
                int64_t t = target[row];
                ce[row] = t == ignore ? 0.0f
                                      : row_softmax_ce(V, logits + (long)r * Vp, t, e + row * V,
                                                       inv + row);
            }
        }
    }
    free(logits);
    return 0;
}

/* Gradients of sum_r g[r] ce[r] (g (K, N)) from out_fwd's e and inv, which become the
 * logits' gradient in place: du (K, N, D) = dlogits @ w^T (wt (K, V, D): w transposed,
 * without its padding), and accumulated into dwt (K, V, D) (w's gradient, transposed) and
 * db (K, V), over each member's rows in order. */
void out_bwd(int K, int N, int D, int V, const float *u, const float *wt, const int64_t *target,
             int64_t ignore, const float *g, float *e, const float *inv, float *du, float *dwt,
             float *db) {
    for (int k = 0; k < K; k++) {
        const float *wtk = wt + (long)k * V * D;
        float *dwk = dwt + (long)k * V * D, *dbk = db + (long)k * V;
        for (int r0 = 0; r0 < N; r0 += GB) {
            int n = N - r0 < GB ? N - r0 : GB;
            long row0 = (long)k * N + r0;
            float *d = e + row0 * V; /* (n, V): numerators in, the logits' gradient out */
            for (int r = 0; r < n; r++) {
                long row = row0 + r;
                float *dr = d + (long)r * V;
                if (target[row] == ignore) {
                    for (int j = 0; j < V; j++) dr[j] = 0.0f;
                    continue;
                }
                row_ce_grad(V, dr, inv[row], target[row], g[row], dr); /* in place */
                for (int j = 0; j < V; j++) dbk[j] = dbk[j] + dr[j];
            }
            mm_back(n, V, D, d, wtk, du + row0 * D);
            mm_grad(n, V, D, d, u + row0 * D, dwk);
        }
    }
}
