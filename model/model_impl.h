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

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Parameters of a model are limited so that byte offsets stay far from
 * overflow everywhere (2^40 floats = 4 TiB). */
#define FB_MODEL_MAX_PARAMS ((uint64_t)1 << 40)

extern const fb_model_ops fb_model_mlp_ops;       /* "mlp" */
extern const fb_model_ops fb_model_logreg_ops;    /* "logreg" */
extern const fb_model_ops fb_model_synthetic_ops; /* "synthetic" */

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
