/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gemm.c -- the dense kernels of the CPU models: one register-blocked
 * C += A B kernel and the nn.Linear forward and backward built on it.
 *
 * Every product the MLP needs is phrased as C += A B with B walked along its
 * rows: Y = X W^T uses W^T (transposed once per call into scratch), dW =
 * dY^T X uses dY^T, dX = dY W uses W as it is. The micro-kernel keeps an
 * MR x NR tile of C in registers and, for each k, broadcasts MR values of A
 * against NR contiguous values of B. The vectorised loop runs across
 * independent outputs, never across a sum, so GCC vectorises it without
 * -ffast-math and every output keeps the summation order k = 0, 1, ...:
 * results are deterministic and do not depend on the blocking.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/model_impl.h"

#define MR 4
#define NR 8

/* tile_full: a whole MR x NR tile. */
static inline void
tile_full(uint32_t k, const float *a, size_t lda, const float *b, size_t ldb,
    float *c, size_t ldc)
{
	float acc[MR][NR];

	for (int r = 0; r < MR; r++) {
		for (int q = 0; q < NR; q++) {
			acc[r][q] = c[r * ldc + q];
		}
	}
	for (uint32_t p = 0; p < k; p++) {
		const float *bp = b + p * ldb;
		for (int r = 0; r < MR; r++) {
			float ar = a[r * lda + p];
			for (int q = 0; q < NR; q++) {
				acc[r][q] += ar * bp[q];
			}
		}
	}
	for (int r = 0; r < MR; r++) {
		for (int q = 0; q < NR; q++) {
			c[r * ldc + q] = acc[r][q];
		}
	}
}

/* row_full: one row of C, NR columns (the rows left below a multiple of
 * MR). */
static inline void
row_full(uint32_t k, const float *a, const float *b, size_t ldb, float *c)
{
	float acc[NR];

	for (int q = 0; q < NR; q++) {
		acc[q] = c[q];
	}
	for (uint32_t p = 0; p < k; p++) {
		const float *bp = b + p * ldb;
		float ar = a[p];
		for (int q = 0; q < NR; q++) {
			acc[q] += ar * bp[q];
		}
	}
	for (int q = 0; q < NR; q++) {
		c[q] = acc[q];
	}
}

/* edge: any rectangle (the columns left below a multiple of NR). */
static void
edge(uint32_t m, uint32_t n, uint32_t k, const float *a, size_t lda,
    const float *b, size_t ldb, float *c, size_t ldc)
{
	for (uint32_t i = 0; i < m; i++) {
		for (uint32_t j = 0; j < n; j++) {
			float s = c[i * ldc + j];
			for (uint32_t p = 0; p < k; p++) {
				s += a[i * lda + p] * b[p * ldb + j];
			}
			c[i * ldc + j] = s;
		}
	}
}

void
fb_gemm_nn(uint32_t m, uint32_t n, uint32_t k, const float *a, size_t lda,
    const float *b, size_t ldb, float *c, size_t ldc)
{
	uint32_t n_full = n - n % NR;
	uint32_t m_full = m - m % MR;

	/* Column panels outside, so that a k x NR panel of B stays in L1
	 * while the rows of A stream past it. */
	for (uint32_t j = 0; j < n_full; j += NR) {
		uint32_t i = 0;
		for (; i < m_full; i += MR) {
			tile_full(k, a + i * lda, lda, b + j, ldb,
			    c + i * ldc + j, ldc);
		}
		for (; i < m; i++) {
			row_full(k, a + i * lda, b + j, ldb, c + i * ldc + j);
		}
	}
	if (n_full < n) {
		edge(
		    m, n - n_full, k, a, lda, b + n_full, ldb, c + n_full, ldc);
	}
}

void
fb_transpose(uint32_t rows, uint32_t cols, const float *src, float *dst)
{
	/* Blocks of 16 x 16 keep both sides in cache lines. */
	for (uint32_t i0 = 0; i0 < rows; i0 += 16) {
		uint32_t i1 = i0 + 16 < rows ? i0 + 16 : rows;
		for (uint32_t j0 = 0; j0 < cols; j0 += 16) {
			uint32_t j1 = j0 + 16 < cols ? j0 + 16 : cols;
			for (uint32_t i = i0; i < i1; i++) {
				for (uint32_t j = j0; j < j1; j++) {
					dst[(size_t)j * rows + i] =
					    src[(size_t)i * cols + j];
				}
			}
		}
	}
}

void
fb_linear_forward(uint32_t n, uint32_t in, uint32_t out, const float *x,
    const float *w, const float *b, float *y, float *wt)
{
	for (uint32_t i = 0; i < n; i++) {
		memcpy(y + (size_t)i * out, b, (size_t)out * sizeof(float));
	}
	fb_transpose(out, in, w, wt);
	fb_gemm_nn(n, out, in, x, in, wt, out, y, out);
}

void
fb_linear_backward(uint32_t n, uint32_t in, uint32_t out, const float *x,
    const float *w, const float *dy, float *dw, float *db, float *dx,
    float *dyt)
{
	memset(db, 0, (size_t)out * sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		const float *row = dy + (size_t)i * out;
		for (uint32_t j = 0; j < out; j++) {
			db[j] += row[j];
		}
	}
	memset(dw, 0, (size_t)out * in * sizeof(float));
	fb_transpose(n, out, dy, dyt);
	fb_gemm_nn(out, in, n, dyt, n, x, in, dw, in);
	if (dx != NULL) {
		memset(dx, 0, (size_t)n * in * sizeof(float));
		fb_gemm_nn(n, in, out, dy, out, w, in, dx, in);
	}
}
