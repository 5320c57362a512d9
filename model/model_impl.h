/* SPDX-License-Identifier: Apache-2.0 */
/*
 * model_impl.h -- private to model/: the built-in ops tables and the CPU
 * kernels they share.
 *
 * The kernels in model/cpu/ are compiled with -O3 (no -ffast-math), so their
 * inner loops vectorise across independent outputs while each output keeps
 * one fixed summation order: the same inputs give bitwise the same results.
 */
#ifndef FB_MODEL_MODEL_IMPL_H
#define FB_MODEL_MODEL_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Parameters of a model are limited so that byte offsets stay far from
 * overflow everywhere (2^40 floats = 4 TiB). */
#define FB_MODEL_MAX_PARAMS ((uint64_t)1 << 40)

/* An initial model's file (model.arch: init): at most this many tensors
 * and header bytes (the format allows 100 MB of header; a layout needs far
 * less: about 100 bytes a tensor). */
#define FB_MODEL_INIT_TENSORS_MAX 65536
#define FB_MODEL_INIT_HEADER_MAX (16u << 20)

extern const fb_model_ops fb_model_mlp_ops;       /* "mlp" */
extern const fb_model_ops fb_model_logreg_ops;    /* "logreg" */
extern const fb_model_ops fb_model_synthetic_ops; /* "synthetic" */
extern const fb_model_ops fb_model_init_ops;      /* "init" */

/*
 * fb_safetensors_read_init reads the safetensors file `path` as an initial
 * model: its F32, F16, BF16 and F64 tensors, in the order of their data,
 * become the layout (*tensors, *count of them, offsets contiguous from 0;
 * every value float32), and, when `values` is non-NULL, their values
 * (*values, converted to float32; each must be finite). Integer and BOOL
 * tensors (e.g. BatchNorm's num_batches_tracked) are checked and skipped:
 * they are not federated. Any other dtype, a rank outside 1..4, an empty
 * tensor, bytes that do not match a shape, overlapping or missing data,
 * more than FB_MODEL_INIT_TENSORS_MAX tensors or a header over
 * FB_MODEL_INIT_HEADER_MAX bytes is FB_EFORMAT, logged with the file and
 * the tensor at fault; FB_EIO when it cannot be read; FB_ENOMEM. On error
 * nothing is returned. The caller frees *tensors and *values (fb_free).
 */
FB_MUST_CHECK fb_err fb_safetensors_read_init(const char *path,
    bool with_values, fb_tensor_info **tensors, uint32_t *count,
    float **values);

/*
 * fb_model_open_state binds `ops` and an instance its create would have
 * made (`state`, owned by the model on FB_OK, destroyed on error) into a
 * model, with `spec`'s input_dim, classes and task, and checks its layout
 * as fb_model_open does. Errors: FB_EINVAL (bad layout, logged),
 * FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_model_open_state(const fb_model_ops *ops,
    void *state, const fb_model_spec *spec, fb_model **out);

/*
 * fb_gemm_nn accumulates C += A B with A [m, k], B [k, n], C [m, n], all
 * row-major with leading dimensions lda, ldb, ldc (in elements). Each C
 * element adds its k products in increasing k order after its initial
 * value. Single-threaded; never fails.
 */
void fb_gemm_nn(uint32_t m, uint32_t n, uint32_t k, const float *a, size_t lda,
    const float *b, size_t ldb, float *c, size_t ldc);

/* fb_transpose writes dst [cols, rows] = src [rows, cols]^T. */
void fb_transpose(uint32_t rows, uint32_t cols, const float *src, float *dst);

/*
 * fb_linear_forward computes Y [n, out] = X [n, in] W^T + b for an
 * nn.Linear weight W [out, in], using `wt` (in * out floats) as scratch.
 */
void fb_linear_forward(uint32_t n, uint32_t in, uint32_t out, const float *x,
    const float *w, const float *b, float *y, float *wt);

/*
 * fb_linear_backward computes dW [out, in] = dY^T X and db = column sums of
 * dY (both overwritten) and, when dx is non-NULL, dX [n, in] = dY W.
 * `dyt` (out * n floats) is scratch.
 */
void fb_linear_backward(uint32_t n, uint32_t in, uint32_t out, const float *x,
    const float *w, const float *dy, float *dw, float *db, float *dx,
    float *dyt);

#endif
