/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask_impl.h -- private to worker/cuda: the secure-aggregation mask state
 * of the backend (mask.c), behind the mask_apply op (worker/trainer.h).
 * C only (backend.c, mask.c); the kernel's launcher is in cuda_impl.h.
 */
#ifndef FB_WORKER_CUDA_MASK_IMPL_H
#define FB_WORKER_CUDA_MASK_IMPL_H

#include <stdint.h>

#include "common/err.h"
#include "crypto/crypto.h"
#include "worker/cuda/cuda.h"

/* The mask state of a backend: device and pinned buffers kept between
 * calls (mask.c). */
typedef struct fb_cuda_mask fb_cuda_mask;

/*
 * fb_cuda_mask_alloc makes a mask state on device `dev`; buffers come at
 * the first fb_cuda_mask_apply. Errors: FB_ENOMEM, FB_ECUDA (logged).
 */
fb_err fb_cuda_mask_alloc(int dev, fb_cuda_mask **out);

/* fb_cuda_mask_free synchronizes, frees, and wipes; NULL is a no-op. */
void fb_cuda_mask_free(fb_cuda_mask *m);

/*
 * fb_cuda_mask_check makes fb_mask_apply's argument checks in its order:
 * FB_ERANGE (offset + count above FB_MASK_MAX_ELEMS), then FB_EINVAL (a
 * role or sign out of range; terms NULL with nterms > 0). No CUDA call.
 */
fb_err fb_cuda_mask_check(uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms);

/*
 * fb_cuda_mask_apply is the backend's mask_apply (trainer.h) on m's
 * device, checks included. Not thread-safe: one call at a time per state.
 */
fb_err fb_cuda_mask_apply(fb_cuda_mask *m, uint32_t *v, uint64_t offset,
    uint64_t count, const fb_mask_term *terms, uint32_t nterms,
    uint32_t round);

/* fb_cuda_mask_get_stats copies m's counters (zeros for NULL). */
void fb_cuda_mask_get_stats(const fb_cuda_mask *m, fb_cuda_mask_stats *out);

/*
 * fb_cuda_mask_time_kernel runs fb_cuda_mask_expand alone on `count`
 * elements of device memory allocated for the call, with `nterms` made-up
 * (not secret) terms: one launch to warm up, then `iters` timed by CUDA
 * events; *seconds gets the mean time of one launch. Errors: FB_EINVAL
 * (count 0 or above FB_MASK_MAX_ELEMS, nterms or iters 0), FB_ENOMEM,
 * FB_ECUDA.
 */
fb_err fb_cuda_mask_time_kernel(fb_cuda_mask *m, uint64_t count,
    uint32_t nterms, uint32_t iters, double *seconds);

#endif
