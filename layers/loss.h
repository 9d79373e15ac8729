/* Losses and padding helpers for time-major (T, B, F) batches with int32 lengths[B] on the CPU.
 *
 * Every loss of rnnlua is SUMMED over the valid frames of the batch (frames t < lengths[b]),
 * never averaged: a batch's loss and gradient scale with the number of frames in it, as in
 * RETURNN, and the learning rate is chosen accordingly. Padded frames contribute nothing to a
 * loss, an error count or a gradient, whatever their contents.
 *
 * All computations go through rl_op_* and work in the tensors' dtype (float32 or float64) on
 * their device. Host reads per call: the lengths (CPU tensors); rl_loss_ce additionally builds
 * a (T, B) padding mask on the host and copies it to the device once, and reads back three
 * scalars (a range check of the targets, the loss, the error count); rl_loss_mse reads back
 * one (the loss). A device target is copied to the host only to name an out-of-range class in
 * the error message.
 */
#ifndef RL_LOSS_H
#define RL_LOSS_H

#include <stdbool.h>

#include "../core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x (T, B, ...) set: x[t, b, ...] = value for every padded frame t >= lengths[b]. lengths:
 * CPU int32 (B) with values in 0..T. One fill per sequence that has padding. */
rl_status rl_fill_padding(rl_tensor *x, const rl_tensor *lengths, double value);

/* Sum of lengths (the number of valid frames); lengths CPU int32 (B). */
double rl_count_frames(const rl_tensor *lengths);

/* Mean squared error, summed: loss = sum over valid frames t < lengths[b] and all features f of
 * (out[t,b,f] - target[t,b,f])^2 (no 1/2, no averaging). out and target: (T, B, F) of one
 * float dtype and device; *n_frames = sum(lengths). grad: NULL, or set (T, B, F) like out to
 * receive d loss / d out = 2 (out - target) on valid frames and 0 on padded ones. With grad
 * NULL a temporary of out's shape is allocated for the difference; a training loop passes grad
 * and allocates nothing. Errors name "mse" and the shapes. */
rl_status rl_loss_mse(const rl_tensor *out, const rl_tensor *target, const rl_tensor *lengths,
                      double *loss, double *n_frames, rl_tensor *grad);

/* Frame-wise cross entropy on sparse targets, the state it keeps between the loss and its
 * gradient. All buffers are sized on the first batch of a shape and reused; they live on the
 * logits' device except pad_host and target_host. */
typedef struct rl_ce_work {
    rl_tensor pad_host; /* (T, B, 1) CPU, logits' dtype: 1 on padded frames, built from lengths */
    rl_tensor pad;      /* (T, B, 1) pad_host on the logits' device (unset on the CPU) */
    rl_tensor target_f; /* (T, B, 1) target as the logits' dtype, -1 on padded frames */
    rl_tensor classes;  /* (C) 0, 1, ..., C-1 */
    rl_tensor onehot;   /* (T, B, C) onehot of the target, all-zero rows on padded frames */
    rl_tensor tmp;      /* (T, B, C) scratch */
    rl_tensor rows;     /* (T, B, 1) onehot row sums plus pad, for the range check */
    rl_tensor maxv;     /* (T, B) row maxima (unused beyond the argmax) */
    rl_tensor argmax;   /* (T, B) int32 predicted class */
    rl_tensor wrong;    /* (T, B) int32: argmax != target on valid frames, else 0 */
    rl_tensor target_host; /* (T, B) int32 CPU copy of a device target, only to name a bad one */
    rl_tensor target_dev;  /* (T, B) int32 copy of a CPU target on the logits' device */
    double eps;            /* the label smoothing of the last rl_loss_ce, for its gradient */
} rl_ce_work;

/* logp: (T, B, C) log-probabilities (log softmax of the logits); target: (T, B) int32 0-based
 * class indices on the CPU or on logp's device (class indices stay on the host where the
 * network hands them over, since the layers read them there; a CPU target is copied to the
 * device once per call). Computes loss = -sum over valid frames of logp[t, b, target],
 * n_errors = the valid frames whose argmax over C differs from the target, n_frames =
 * sum(lengths), and keeps the onehot for rl_loss_ce_grad. A target outside 0..C-1 on a valid
 * frame is an RL_EINDEX error naming `layer`, the frame, the sequence and the value; targets
 * on padded frames are ignored. A NaN or Inf in logp gives a NaN/Inf loss, not an error.
 * Label smoothing eps in [0, 1) (PyTorch's CrossEntropyLoss(label_smoothing = eps)): the
 * target distribution is (1 - eps) onehot + eps / C, so the loss of a valid frame is
 * -(1 - eps) logp[target] - eps / C sum_c logp[c]; eps = 0 is the plain loss. */
rl_status rl_loss_ce(rl_ce_work *w, const char *layer, const char *cls, const rl_tensor *logp,
                     const rl_tensor *target, const rl_tensor *lengths, double eps, double *loss,
                     double *n_errors, double *n_frames);

/* After rl_loss_ce: the gradient of that loss with respect to the logits, p - (1 - eps) onehot
 * - eps / C on valid frames and 0 on padded ones, with p = exp(logp) (T, B, C). Written into
 * grad with `=`, or added to it when accumulate. */
rl_status rl_loss_ce_grad(rl_ce_work *w, const rl_tensor *p, const rl_tensor *lengths,
                          rl_tensor *grad, bool accumulate);

void rl_ce_work_release(rl_ce_work *w);

/* The argument checks of rl_loss_ce (target int32 (T, B) on the CPU or logp's device, CPU int32
 * lengths (B) in 0..T), for a fused CE that computes the rest itself. */
rl_status rl_ce_check_args(const char *layer, const char *cls, const rl_tensor *logp,
                           const rl_tensor *target, const rl_tensor *lengths);

/* The RL_EINDEX error of a target `value` outside 0..C-1 at frame t of sequence b (0-based). */
rl_status rl_ce_bad_target(const char *layer, const char *cls, int64_t t, int64_t b, double value,
                           int64_t C);

#ifdef __cplusplus
}
#endif

#endif
