/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_impl.h -- private to worker/cuda: the error-translation macros, the
 * launchers of our own kernels (kernels.cu, mask.cu), behind a plain C
 * interface so that the backend (backend.c) stays C11. C++-safe: the .cu
 * files include it.
 *
 * Every launcher enqueues on `s` and returns cudaGetLastError() of the
 * launch; none blocks. Pointers are device pointers of the current device.
 */
#ifndef FB_WORKER_CUDA_IMPL_H
#define FB_WORKER_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>


#ifdef __cplusplus
extern "C" {
#endif

/* E2: foreign errors are translated where they enter, with a log line. */
#define FB_CUDA_TRY(call, rc, label)                                     \
	do {                                                             \
		cudaError_t e_ = (call);                                 \
		if (e_ != cudaSuccess) {                                 \
			fb_log_error("cuda: %s: %s", #call,              \
			    cudaGetErrorString(e_));                     \
			(rc) = FB_ECUDA;                                 \
			goto label;                                      \
		}                                                        \
	} while (0)

#define FB_CUBLAS_TRY(call, rc, label)                                   \
	do {                                                             \
		cublasStatus_t s_ = (call);                              \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                       \
			fb_log_error("cublas: %s: %s", #call,            \
			    cublasGetStatusString(s_));                  \
			(rc) = FB_ECUDA;                                 \
			goto label;                                      \
		}                                                        \
	} while (0)

#define FB_NCCL_TRY(call, rc, label)                                     \
	do {                                                             \
		ncclResult_t n_ = (call);                                \
		if (n_ != ncclSuccess) {                                 \
			fb_log_error("nccl: %s: %s", #call,              \
			    ncclGetErrorString(n_));                     \
			(rc) = FB_ENCCL;                                 \
			goto label;                                      \
		}                                                        \
	} while (0)

/*
 * fb_cuda_gather copies `rows` examples into xo (rows x dim) and yo: row r
 * is example idx[base + off + r] of the shard (x: count x dim, y: the 4-byte
 * labels, fb_label, copied whatever their task), where base = *step *
 * stride when `step` is non-NULL (the device step counter, so that a
 * captured graph reads a fresh batch each replay), else 0.
 */
cudaError_t fb_cuda_gather(const float *x, const uint32_t *y,
    const uint32_t *idx, const uint32_t *step, uint32_t stride, uint32_t off,
    uint32_t rows, uint32_t dim, float *xo, uint32_t *yo, cudaStream_t s);

/* fb_cuda_bias_act adds b[c] to z[r][c] (rows x cols, row-major), then
 * applies ReLU when `relu` is non-zero. */
cudaError_t fb_cuda_bias_act(float *z, const float *b, uint32_t rows,
    uint32_t cols, int relu, cudaStream_t s);

/* fb_cuda_relu_bwd zeroes dz[i] where h[i] <= 0 (h = the ReLU's output,
 * as PyTorch's threshold_backward does). */
cudaError_t fb_cuda_relu_bwd(float *dz, const float *h, size_t count,
    cudaStream_t s);

/*
 * fb_cuda_softmax_xent: for each row, the numerically stable softmax cross
 * entropy of `logits` (rows x classes) against label y[r]: rowloss[r] =
 * logsumexp(z) - z[y], dlogits = (softmax(z) - onehot(y)) * scale.
 */
cudaError_t fb_cuda_softmax_xent(const float *logits, const int32_t *y,
    uint32_t rows, uint32_t classes, float scale, float *dlogits,
    float *rowloss, cudaStream_t s);

/*
 * fb_cuda_squared_error: regression's loss on one output per row, against
 * target t[r]: e = z[r] - t[r], rowloss[r] = e * e, dz[r] = 2 e * scale.
 */
cudaError_t fb_cuda_squared_error(const float *z, const float *t,
    uint32_t rows, float scale, float *dz, float *rowloss, cudaStream_t s);

/* fb_cuda_loss_reduce writes scale * sum(rowloss[0..rows)) to
 * losses[step ? *step : 0], in a fixed order (deterministic). */
cudaError_t fb_cuda_loss_reduce(const float *rowloss, uint32_t rows,
    float scale, const uint32_t *step, float *losses, cudaStream_t s);

/*
 * fb_cuda_sgd applies PyTorch's SGD to count elements, with FedProx's
 * proximal term when `anchor` is non-NULL (the CPU backend's order):
 * d = g + prox*(w - anchor); d += wd*w; v = mu*v + d (v untouched when
 * mu == 0, d used as is); w -= lr*v. When `step` is non-NULL, *step is
 * incremented once (the end of a training step).
 */
cudaError_t fb_cuda_sgd(float *w, const float *g, float *v,
    const float *anchor, size_t count, float lr, float mu, float wd,
    float prox, uint32_t *step, cudaStream_t s);

/* fb_cuda_checksum writes to *out a position-weighted sum of the bit
 * patterns of w[0..count); equal vectors give equal sums. *out must be
 * zeroed first (it is accumulated into). */
cudaError_t fb_cuda_checksum(const float *w, size_t count,
    unsigned long long *out, cudaStream_t s);

/*
 * fb_cuda_stamp writes the GPU's %globaltimer (nanoseconds) to
 * stamps[*step * stride + slot] when the stream reaches it: timing inside
 * a captured graph without a host synchronization per step.
 */
cudaError_t fb_cuda_stamp(unsigned long long *stamps, const uint32_t *step,
    uint32_t slot, uint32_t stride, cudaStream_t s);

/* fb_cuda_fill sets p[0..count) to v. */
cudaError_t fb_cuda_fill(float *p, size_t count, float v, cudaStream_t s);

/* ---- secure-aggregation masks (mask.cu; the state is mask_impl.h) ----- */

/* One mask term as the kernel reads it: ChaCha20's key and nonce words
 * (little-endian loads of the seed and of crypto.h's nonce bytes) and the
 * sign. Secret: wiped on the host and the device after each call. */
typedef struct fb_cuda_mask_key {
	uint32_t key[8];
	uint32_t nonce[3];
	uint32_t neg; /* 1: subtract the keystream, 0: add it */
} fb_cuda_mask_key;

/*
 * fb_cuda_mask_expand adds (or subtracts) the ChaCha20 keystream of each of
 * the nkeys terms at `keys` (device memory) into d[head .. head + count),
 * where d[head + i] is mask element 16 * block0 + head + i: ChaCha20 block
 * block0 + j covers d[16 j .. 16 j + 16). d is 16-byte aligned; head < 16;
 * block0 + (head + count - 1) / 16 < 2^32. Words of d outside the range are
 * neither read nor written. One pass over d whatever nkeys.
 */
cudaError_t fb_cuda_mask_expand(uint32_t *d, uint32_t head, uint64_t count,
    uint32_t block0, const fb_cuda_mask_key *keys, uint32_t nkeys,
    cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
