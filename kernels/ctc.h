/* Connectionist Temporal Classification: the loss and its gradient for a batch of sequences,
 * fused with the log-softmax, on the CPU or CUDA (formulas: kernels/ctc_step.h).
 *
 * Shapes: logits (T, B, V) contiguous, unnormalised (the log-softmax is taken inside);
 * labels (B, S) int32 with any strides (a transposed (S, B) batch target works as it is),
 * 0-based labels l in 0..V-1 other than the blank, read up to label_len[b]; input_len and
 * label_len (B) int32 on the CPU. Frames t >= input_len[b] and labels s >= label_len[b] are
 * padding: never read, whatever they hold (NaN included), and their gradient is exactly 0.
 * loss (B): -log P(labels_b | logits_b). grad (T, B, V) = d (sum_b loss_b) / d logits
 * = softmax - posteriors on valid frames.
 *
 * A sequence whose labels cannot fit its frames (S labels plus one blank between each pair of
 * equal neighbours need more than input_len frames) has no path: loss +inf, or 0 with
 * zero_infinity (PyTorch's option); its gradient is 0 either way, never NaN. */
#ifndef RL_KERNELS_CTC_H
#define RL_KERNELS_CTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What rl_ctc_loss keeps between calls (sized on the first batch of a shape, then reused):
 * the CPU kernel's per-thread scratch, and on CUDA the labels and lengths on the device plus
 * the alphas and betas. */
typedef struct rl_ctc_work {
    rl_tensor scratch;     /* CPU: per-thread rows; CUDA: alphas and betas (device) */
    rl_tensor labels_host; /* (B, S) int32 CPU copy of device labels (for the checks) */
    rl_tensor dev_int;     /* CUDA: labels (B, S), input_len (B), label_len (B) int32 */
} rl_ctc_work;

/* The checked entry point. `who` names the caller in errors ("rl.ctc_loss", "layer 'out'").
 * blank in 0..V-1. loss: unset (allocated) or set (B) in the logits' dtype and device; grad:
 * NULL (loss only), unset or set (T, B, V) like the logits, written with `=`.
 * Errors (RL_EARG/RL_ESHAPE/RL_EDTYPE/RL_EINDEX), each naming `who` and, where it applies, the
 * sequence (1-based, as in Lua): wrong dtypes or shapes of any argument, lengths outside
 * 0..T or 0..S, a label outside 0..V-1 or equal to the blank, label_len[b] > input_len[b]. */
rl_status rl_ctc_loss(rl_ctc_work *w, const char *who, const rl_tensor *logits,
                      const rl_tensor *labels, const rl_tensor *input_len,
                      const rl_tensor *label_len, int64_t blank, bool zero_infinity,
                      rl_tensor *loss, rl_tensor *grad);
void rl_ctc_work_release(rl_ctc_work *w);

/* The CPU kernel (kernels/cpu/ctc.c), arguments already checked. Sequences are spread over
 * `threads` threads (the caller's plus threads - 1 started for the call), longest first.
 * work: rl_ctc_cpu_work_bytes(...) bytes, 64-byte aligned. logits (T, B, V), loss (B) contiguous
 * and grad (T, B, V) contiguous or NULL, all float64 with f64, else float32. */
size_t rl_ctc_cpu_work_bytes(size_t elem, int64_t T, int64_t B, int64_t V, int64_t S, int threads);
void rl_ctc_cpu(bool f64, int64_t T, int64_t B, int64_t V, const void *logits,
                const int32_t *labels, int64_t lab_stride_b, int64_t lab_stride_s,
                const int32_t *input_len, const int32_t *label_len, int32_t blank,
                bool zero_infinity, void *loss, void *grad, void *work, int threads);

/* Decoding and error counting (kernels/ctc_decode.c), host memory.
 * rl_ctc_collapse: the labels of a frame-wise path path[t * stride], t < n: repeats merged, then
 * blanks removed; writes them to out (at most n) and returns their count.
 * rl_edit_distance: Levenshtein distance (substitutions, insertions, deletions, cost 1 each)
 * between a (na labels) and b (nb labels); row: nb + 1 entries of scratch. */
int64_t rl_ctc_collapse(const int32_t *path, int64_t n, int64_t stride, int32_t blank,
                        int32_t *out);
int64_t rl_edit_distance(const int32_t *a, int64_t na, const int32_t *b, int64_t nb, int64_t *row);

/* CTC prefix beam search (kernels/cpu/ctc_beam.c, the algorithm at its top): logp (T, B, V)
 * contiguous float64 log-probabilities (log-softmax already taken); lengths (B), each in 0..T;
 * frames t >= lengths[b] are never read. The labels of sequence b (0-based classes, blank
 * removed, at most lengths[b]) go to out[b T ...], their count to out_len[b]. Sequences are spread
 * over `threads` threads (the caller's plus threads - 1). Errors (rl.ctc_decode named): RL_EARG
 * for a bad beam/blank, a length outside 0..T or a NaN in a valid frame (naming the sequence
 * and frame), RL_ENOMEM. */
/* Shallow fusion of an n-gram LM (kernels/ngram.h) into the search: a prefix ranks by
 *   log p_ctc(prefix) + weight * log p_lm(tokens) + bonus * (number of LM tokens),
 * and after the last frame the end of the sentence (</s>, and a pending word) is added before the
 * best is chosen. Char-level (boundary < 0): every emitted label c is the LM word token[c].
 * Word-level (boundary = the word-boundary label): the labels between two boundaries, their
 * text[] joined, are one LM word (outside the vocabulary: <unk>), scored when the boundary is
 * emitted and at the end; the boundary itself and an empty word are not scored. */
typedef struct rl_ctc_lm {
    const struct rl_ngram *ngram; /* NULL: a neural LM, through step */
    double weight, bonus;
    const int32_t *token;    /* (V) char-level: each label's LM word id (the blank's unused) */
    int32_t boundary;        /* word-level: the boundary label; -1: char-level */
    const char *const *text; /* (V) word-level: each label's text */
    /* A neural char LM (ngram NULL, char-level, one thread): step(ctx, n, from, token, to, logp)
     * runs the LM one token for n histories at once: history from[i] (a state id the caller
     * gave out before; -1: the start of a sentence, token[i] unused) extended by LM token
     * token[i]; it writes the new histories' state ids to to[i] and their log p of each label
     * then of the end of the sentence to logp[i (V + 1) ...]. Returns RL_OK or an error (message
     * set). The search calls it once per frame with the new prefixes of the beam. */
    rl_status (*step)(void *ctx, int64_t n, const int32_t *from, const int32_t *token, int32_t *to,
                      double *logp);
    void *ctx;
} rl_ctc_lm;

/* lm: NULL for none. */
rl_status rl_ctc_beam_search_cpu(int64_t T, int64_t B, int64_t V, const double *logp,
                                 const int32_t *lengths, int32_t blank, int64_t beam,
                                 const rl_ctc_lm *lm, int32_t *out, int64_t *out_len, int threads);

#ifdef __cplusplus
}
#endif

#endif
