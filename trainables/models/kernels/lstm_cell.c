/* The LSTM cell update of one evaluation step (greedy decoding) for the bundled seq2seq
 * model on a CPU (float32); training runs whole layers in lstm_seq.c.
 *
 * Built at first use by trainables/models/ckernels.py (gcc or cc, -O3 for this machine,
 * -ffp-contract=off) and called through ctypes. One call replaces the five to twelve
 * small torch ops of a time step (each ~3-10 us of dispatch at these sizes, and torch's
 * tanh costs ~6 sigmoids per element on a CPU core).
 *
 * Layout (see seq2seq_cells.py): K members, each a contiguous block of rows x H cells
 * (gates: rows x 4H, in the order o, i, f, g); blocks of member k start k * stride floats
 * after member 0.
 *
 * exp is a Cephes-style polynomial (about 1 ulp) written in plain arithmetic, with
 * contraction off: the vectorised loop body and its scalar remainder compute the same
 * IEEE operations, so an element's result depends only on its inputs, never on where it
 * sits in a block (a bundle member and its lone run stay bit-identical).
 */
#include "cell.h"

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
