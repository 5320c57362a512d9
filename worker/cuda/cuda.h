/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda.h -- the CUDA trainer backend (build/libfedbox-cuda.so).
 *
 * The worker finds the backend with dlsym(FB_TRAINER_CUDA_SYMBOL) and uses
 * only the fb_trainer_backend table. The other functions here are for the
 * GPU tests and benchmarks (tests/gpu, bench/gpu), which link the library
 * directly; those named fb_cuda_trainer_* take the `state` that the
 * backend's open() returned.
 *
 * Plain C; no CUDA, cuBLAS or NCCL type appears here (L3).
 */
#ifndef FB_WORKER_CUDA_CUDA_H
#define FB_WORKER_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "worker/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fb_trainer_cuda_backend_v1 returns the backend table (static storage). */
const fb_trainer_backend *fb_trainer_cuda_backend_v1(void);

/*
 * fb_cuda_device_count returns how many CUDA devices are visible; when
 * none (no driver, no device), 0 with the reason written to `why`.
 */
int fb_cuda_device_count(char *why, size_t len);

/*
 * fb_cuda_trainer_gradient computes, with the current parameters, the
 * gradient of the mean loss over the `batch` shard examples listed in
 * `idx`, split across the GPUs and all-reduced exactly as in a training
 * step, and copies it (param_count floats) from the first GPU to `grad`;
 * *loss gets the mean loss. Blocks. Errors: FB_EINVAL (batch > max_batch,
 * batch < GPUs, index out of range), FB_ECUDA, FB_ENCCL.
 */
FB_MUST_CHECK fb_err fb_cuda_trainer_gradient(void *state,
    const uint32_t *idx, uint32_t batch, float *grad, float *loss);

/*
 * In-step all-reduce timing, summed over profiled steps. A GPU's time for
 * a step is the sum over buckets of (timestamp after the all-reduce -
 * timestamp before it), on its own stream; it includes waiting for the
 * slowest GPU to arrive. `allreduce_ms` averages it over GPUs;
 * `allreduce_last_ms` takes, each step, the GPU that waited least (the
 * last to arrive), which is the collective's own duration once every GPU
 * is in it.
 */
typedef struct fb_cuda_profile {
	uint32_t ranks;           /* GPUs */
	uint64_t steps;           /* profiled steps */
	uint64_t calls;           /* all-reduce calls per GPU */
	uint64_t bytes;           /* bytes all-reduced per GPU */
	double allreduce_ms;      /* mean over GPUs */
	double allreduce_last_ms; /* the GPU that waited least, each step */
	double busbw_gbs;         /* 2(n-1)/n * bytes / time, GB/s (1e9) */
	double busbw_last_gbs;    /* the same from allreduce_last_ms */
} fb_cuda_profile;

/*
 * fb_cuda_trainer_set_profile turns profiling on (non-zero) or off. While
 * on, each training step writes the GPU's %globaltimer before and after
 * each gradient all-reduce (inside the captured graph when graphs are on;
 * no host synchronization per step), read after each chunk of steps, so
 * that the counters below fill; turning it on resets them. Not
 * thread-safe against a concurrent train().
 */
void fb_cuda_trainer_set_profile(void *state, int on);
void fb_cuda_trainer_get_profile(void *state, fb_cuda_profile *out);

/*
 * fb_cuda_trainer_bare_allreduce times `iters` in-place ncclAllReduce calls
 * of `count` floats (<= param_count) on the trainer's own communicators
 * and streams (after 5 warm-up calls); *ms gets the mean time of a call
 * (CUDA events, mean over GPUs) and *busbw_gbs the bus bandwidth. It
 * overwrites the gradient buffer. Errors: FB_ENOTSUP (one GPU: no NCCL),
 * FB_EINVAL, FB_ECUDA, FB_ENCCL.
 */
FB_MUST_CHECK fb_err fb_cuda_trainer_bare_allreduce(void *state,
    uint64_t count, uint32_t iters, double *ms, double *busbw_gbs);

/* ---- secure-aggregation masks (the backend's mask_apply) -------------- */

/* Slices of the vector the mask op has moved since open, by the host
 * memory they came from. */
typedef struct fb_cuda_mask_stats {
	uint64_t direct_slices; /* page-locked v: DMA to and from v itself */
	uint64_t staged_slices; /* pageable v: through pinned stage buffers */
} fb_cuda_mask_stats;

/* fb_cuda_trainer_mask_stats copies the mask op's counters (zeros before
 * its first call). */
void fb_cuda_trainer_mask_stats(void *state, fb_cuda_mask_stats *out);

/*
 * fb_cuda_trainer_mask_kernel times the mask kernel alone, no copies:
 * `count` elements in device memory allocated for the call, `nterms`
 * made-up terms, one warm-up launch then `iters` launches timed by CUDA
 * events; *seconds gets the mean time of one launch (nterms * count * 4
 * bytes of keystream). Blocks. Errors: FB_EINVAL (count 0 or above
 * FB_MASK_MAX_ELEMS, nterms or iters 0), FB_ENOMEM, FB_ECUDA.
 */
FB_MUST_CHECK fb_err fb_cuda_trainer_mask_kernel(void *state, uint64_t count,
    uint32_t nterms, uint32_t iters, double *seconds);

/*
 * fb_cuda_host_register page-locks [p, p + len) for the CUDA runtime
 * (cudaHostRegister), after which the mask op copies such a vector to and
 * from the GPU directly; fb_cuda_host_unregister(p) undoes it, and must
 * come before the memory is freed. Errors: FB_ECUDA (logged).
 */
FB_MUST_CHECK fb_err fb_cuda_host_register(void *p, size_t len);
void fb_cuda_host_unregister(void *p);

#ifdef __cplusplus
}
#endif

#endif
