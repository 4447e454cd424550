/* Evaluation of the bundled seq2seq decoder on a CPU (float32): the teacher-forced losses and
 * greedy decoding of a whole batch in one call, instead of a dozen torch ops per step from
 * Python (seq2seq_stepper.FastStepper).
 *
 * A step of a set of rows (step_rows): layer 0's input projection is looked up by the
 * previous token, then per layer the recurrent matmul (mm.h) and the cell (cell.h, the
 * evaluation form: doubled g weights and cells), then the attention of the top state
 * (attend.h), the combine layer (doubled weights, tanh as 2 sigmoid(2x) - 1) and the output
 * layer. Rows go RB at a time through every step, so their states, gates, context and logits
 * stay in cache while a member's weights (about 60 KB for the paper's model) are read from
 * L1/L2 for each tile of rows. A row's result depends only on that row (its place in a set,
 * or its member's place in the bundle, changes no bit).
 *
 * Two passes per member share their work:
 * 1. teacher forcing (rows with gold targets): each row is fed its gold inputs BOS y_1 .. y_n
 *    and scores its n + 1 positions (cross-entropy and argmax, lse.h). As long as every
 *    argmax so far was the gold token, greedy decoding would have fed the same tokens and
 *    computed the same bits, so these argmaxes are also the row's greedy tokens;
 * 2. greedy decoding goes on from where a row's argmax first differs from its gold token (or
 *    its gold ends before its decoding steps do): from the states after that step, fed that
 *    argmax. Rows without gold start here from their initial states. The rows still to
 *    decode stream through RB slots: one that is done makes room for the next.
 * On a trained model most rows decode their gold, so greedy decoding costs next to nothing.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* mm.h's tile here (AVX-512): 6 rows x 4 vectors (24 accumulators). Each weight vector loaded serves
 * 6 rows; the paper's model evaluated about 5% faster than with the training's 2 x 8
 * (5 x 4 alike; 4 x 4, 3 x 8 and 8 x 2 slower). Tiling changes no bit (mm.h). */
#include "fmath.h"
#if VW == 16
#define FR 6
#else
#define FR 2 /* 16 vector registers below AVX-512: 2 x 4 accumulators (4 x 2 measured alike) */
#endif
#define FT 4

#include "argmax.h"
#include "attend.h"
#include "cell.h"
#include "lse.h"
#include "mm.h"

#define RB 16 /* rows computed together */

/* The evaluation weights of K members (see decode_batch). */
typedef struct {
    int K, N, L, Hd, He, S, Sp, V, Vp, Vt;
    const float *table, *w_ih_t, *bias, *w_hh_t, *keys_t, *mask, *enc, *comb_ctx_t, *comb_h_t,
        *out_t, *out_b;
} Net;

/* Scratch of one set of rows; logits (RB, Vp) is step_rows' output. */
typedef struct {
    float *z, *u, *ctx, *p, *logits;
} Scratch;

/* The states of up to RB rows, (L, RB, Hd) each, and per row its index among all K * N rows,
 * next step and previous token. */
typedef struct {
    float *h, *c2;
    long row[RB];
    int t[RB];
    int64_t prev[RB];
} Rows;

static inline void add_into(int n, const float *restrict x, float *restrict acc) {
    for (int j = 0; j < n; j++) acc[j] = acc[j] + x[j];
}

/* One step of the first n rows of `set` (member k): their states advance, fed set->prev, and
 * s->logits (n, Vp) gets the output layer. */
static void step_rows(const Net *w, const Scratch *s, int k, int n, Rows *set) {
    int Hd = w->Hd, G = 4 * Hd;
    const float *below = 0; /* the layer below's new states */
    for (int l = 0; l < w->L; l++) {
        float *hl = set->h + (long)l * RB * Hd, *cl = set->c2 + (long)l * RB * Hd;
        const float *whh = w->w_hh_t + ((long)l * w->K + k) * Hd * G;
        if (l == 0) {
            mm_block(n, G, 0, 0, 0, 0, Hd, hl, whh, s->z);
            for (int r = 0; r < n; r++)
                add_into(G, w->table + ((long)k * w->Vt + set->prev[r]) * G, s->z + (long)r * G);
        } else {
            long lk = (long)(l - 1) * w->K + k;
            mm_block(n, G, w->bias + lk * G, Hd, below, w->w_ih_t + lk * Hd * G, Hd, hl, whh,
                     s->z);
        }
        for (int r = 0; r < n; r++)
            eval_row(Hd, s->z + (long)r * G, cl + r * Hd, cl + r * Hd, hl + r * Hd);
        below = hl;
    }
    const float *x = below; /* (n, Hd): what the output layer reads */
    if (w->keys_t) {
        int S = w->S, Sp = w->Sp, He = w->He;
        for (int r = 0; r < n; r++) {
            long row = set->row[r];
            attend_row(S, Sp, Hd, He, w->keys_t + row * Hd * Sp, below + r * Hd,
                       w->mask + row * Sp, w->enc + row * S * He, s->ctx + (long)r * He, s->p);
        }
        mm_block(n, Hd, 0, He, s->ctx, w->comb_ctx_t + (long)k * He * Hd, Hd, below,
                 w->comb_h_t + (long)k * Hd * Hd, s->u);
        int i = 0;
        for (; i + VW <= n * Hd; i += VW) vstore(s->u + i, 2.0f * sigmoid_v(vload(s->u + i)) - 1.0f);
        for (; i < n * Hd; i++) s->u[i] = 2.0f * sigmoid_f(s->u[i]) - 1.0f;
        x = s->u;
    }
    mm_block(n, w->Vp, w->out_b + (long)k * w->Vp, Hd, x, w->out_t + (long)k * Hd * w->Vp, 0,
             0, 0, s->logits);
}

/* Copy the states of row i of (L, si, Hd) arrays h, c2 to row j of (L, sj, Hd) ones. */
static inline void copy_state(int L, int Hd, const float *h, const float *c2, long si, long i,
                              float *h_to, float *c2_to, long sj, long j) {
    for (int l = 0; l < L; l++) {
        memcpy(h_to + (l * sj + j) * Hd, h + (l * si + i) * Hd, Hd * sizeof(float));
        memcpy(c2_to + (l * sj + j) * Hd, c2 + (l * si + i) * Hd, Hd * sizeof(float));
    }
}

/* Rows left to decode greedily (pass 2): states (L, N, Hd) and each row's index, next step
 * and previous token. */
typedef struct {
    float *h, *c2;
    long *row;
    int *t;
    int64_t *prev;
    int n;
} Queue;

static void enqueue(const Net *w, Queue *q, const float *h, const float *c2, long stride, long i,
                    long row, int t, int64_t prev) {
    copy_state(w->L, w->Hd, h, c2, stride, i, q->h, q->c2, w->N, q->n);
    q->row[q->n] = row;
    q->t[q->n] = t;
    q->prev[q->n] = prev;
    q->n++;
}

/* Pass 2 for member k: greedy decoding of the queued rows, RB slots at a time. */
static void greedy_rows(const Net *w, const Scratch *s, int k, const Queue *q, Rows *slots,
                        const int *steps, int T, int64_t *tokens) {
    int n = 0, next = 0;
    for (;;) {
        for (; n < RB && next < q->n; n++, next++) {
            copy_state(w->L, w->Hd, q->h, q->c2, w->N, next, slots->h, slots->c2, RB, n);
            slots->row[n] = q->row[next];
            slots->t[n] = q->t[next];
            slots->prev[n] = q->prev[next];
        }
        if (n == 0) return;
        step_rows(w, s, k, n, slots);
        for (int r = 0; r < n; r++) {
            float best;
            int nan;
            slots->prev[r] = row_argmax(w->V, s->logits + (long)r * w->Vp, &best, &nan);
            tokens[slots->row[r] * T + slots->t[r]++] = slots->prev[r];
        }
        for (int r = n - 1; r >= 0; r--) { /* a finished row's slot takes the last row */
            if (slots->t[r] < steps[slots->row[r]]) continue;
            n--;
            if (r == n) continue;
            copy_state(w->L, w->Hd, slots->h, slots->c2, RB, n, slots->h, slots->c2, RB, r);
            slots->row[r] = slots->row[n];
            slots->t[r] = slots->t[n];
            slots->prev[r] = slots->prev[n];
        }
    }
}

/* Pass 1 for the n rows of member k from row b0: teacher forcing, and the greedy tokens its
 * argmaxes give; queues the rows greedy decoding must go on with (see the file comment). */
static void forced_rows(const Net *w, const Scratch *s, int k, int b0, int n, Rows *set,
                        Queue *q, const float *h0, const float *c20, const int *steps,
                        const int *glen, const int64_t *gold_in, const int64_t *gold_out, int Tg,
                        float *ce, uint8_t *hit, int T, int64_t *tokens, int64_t bos) {
    long row0 = (long)k * w->N + b0, all = (long)w->K * w->N; /* h0's rows per layer */
    int greedy[RB], t_end = 0;
    for (int r = 0; r < n; r++) {
        long row = row0 + r;
        set->row[r] = row;
        copy_state(w->L, w->Hd, h0, c20, all, row, set->h, set->c2, RB, r);
        int g = glen ? glen[row] : 0;
        greedy[r] = g > 0 && steps[row] > 0; /* its greedy tokens still follow the gold */
        if (g == 0 && steps[row] > 0) enqueue(w, q, h0, c20, all, row, row, 0, bos);
        t_end = g > t_end ? g : t_end;
    }
    for (int t = 0; t < t_end; t++) {
        for (int r = 0; r < n; r++) {
            long row = set->row[r];
            set->prev[r] = t < glen[row] ? gold_in[row * Tg + t] : 0;
        }
        step_rows(w, s, k, n, set);
        for (int r = 0; r < n; r++) {
            long row = set->row[r];
            if (t >= glen[row]) continue;
            int64_t gold = gold_out[row * Tg + t], am;
            ce[row * Tg + t] = row_ce(w->V, s->logits + (long)r * w->Vp, gold, &am);
            hit[row * Tg + t] = am == gold;
            if (!greedy[r]) continue;
            tokens[row * T + t] = am;
            if (t + 1 >= steps[row]) {
                greedy[r] = 0; /* decoded */
            } else if (am != gold || t + 1 == glen[row]) { /* greedy decoding takes over */
                enqueue(w, q, set->h, set->c2, RB, r, row, t + 1, am);
                greedy[r] = 0;
            }
        }
    }
}

/* K members of N rows, L decoder layers of Hd units, V output classes (out_t, out_b padded
 * with zeros to Vp >= V columns), Vt target tokens.
 * steps (K, N): each row's greedy steps (0: none); tokens (K, N, T), T >= every row's steps:
 *   its greedy tokens (positions past a row's steps are left as they were).
 * glen (K, N) or NULL (no teacher forcing): each row's gold positions n + 1 (0: none), with
 *   gold_in, gold_out (K, N, Tg) its decoder inputs (BOS y_1 .. y_n) and targets (y_1 .. y_n
 *   EOS); ce (K, N, Tg) gets the cross-entropy and hit (K, N, Tg) whether the argmax is the
 *   target at each gold position (others are left as they were).
 * table (K, Vt, 4Hd): layer 0's input projection of each token, biases included.
 * w_ih_t (L - 1, K, Hd, 4Hd), bias (L - 1, K, 4Hd): layers 1 .. L - 1 (unused if L == 1).
 * w_hh_t (L, K, Hd, 4Hd). h0, c20 (L, K, N, Hd): initial states and doubled cells.
 * keys_t (K, N, Hd, Sp), mask (K, N, Sp; -inf where masked), enc (K, N, S, He) (Sp >= S:
 *   attend.h), comb_ctx_t (K, He, Hd), comb_h_t (K, Hd, Hd): attention and the combine
 *   layer; keys_t NULL: none (the top state goes to the output layer).
 * out_t (K, Hd, Vp), out_b (K, Vp). Returns 0, or 1 if out of memory. */
int decode_batch(int K, int N, int L, int Hd, int He, int S, int Sp, int V, int Vp, int Vt, int T,
                 int Tg, int64_t bos, const int *steps, const int *glen, const int64_t *gold_in,
                 const int64_t *gold_out, const float *table, const float *w_ih_t,
                 const float *bias, const float *w_hh_t, const float *h0, const float *c20,
                 const float *keys_t, const float *mask, const float *enc,
                 const float *comb_ctx_t, const float *comb_h_t, const float *out_t,
                 const float *out_b, float *ce, uint8_t *hit, int64_t *tokens) {
    Net w = {K, N, L, Hd, He, S, Sp, V, Vp, Vt, table, w_ih_t, bias, w_hh_t, keys_t, mask, enc,
             comb_ctx_t, comb_h_t, out_t, out_b};
    long state = (long)L * RB * Hd, queued = (long)L * N * Hd;
    Scratch s = {malloc(RB * 4L * Hd * sizeof(float)), malloc(RB * (long)Hd * sizeof(float)),
                 malloc((RB * (long)He + 1) * sizeof(float)), malloc((Sp + 1) * sizeof(float)),
                 malloc(RB * (long)Vp * sizeof(float))};
    Rows set = {malloc(state * sizeof(float)), malloc(state * sizeof(float))};
    Rows slots = {malloc(state * sizeof(float)), malloc(state * sizeof(float))};
    Queue q = {malloc(queued * sizeof(float)), malloc(queued * sizeof(float)),
               malloc(N * sizeof(long)), malloc(N * sizeof(int)), malloc(N * sizeof(int64_t)), 0};
    int failed = !s.z || !s.u || !s.ctx || !s.p || !s.logits || !set.h || !set.c2 || !slots.h ||
                 !slots.c2 || !q.h || !q.c2 || !q.row || !q.t || !q.prev;
    for (int k = 0; k < K && !failed; k++) {
        q.n = 0;
        for (int b0 = 0; b0 < N; b0 += RB)
            forced_rows(&w, &s, k, b0, N - b0 < RB ? N - b0 : RB, &set, &q, h0, c20, steps, glen,
                        gold_in, gold_out, Tg, ce, hit, T, tokens, bos);
        greedy_rows(&w, &s, k, &q, &slots, steps, T, tokens);
    }
    void *all[] = {s.z, s.u, s.ctx, s.p, s.logits, set.h, set.c2, slots.h, slots.c2,
                   q.h, q.c2, q.row, q.t, q.prev};
    for (unsigned i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    return failed;
}
