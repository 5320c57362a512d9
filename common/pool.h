/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.h -- a fixed set of threads for data-parallel loops.
 *
 * Long passes over a model (unmasking a secure sum, encrypting the global
 * model, a server step) split into independent pieces; fb_pool_for runs
 * the pieces on the pool's threads and on the calling thread, and returns
 * when every piece is done. The pieces are handed out one at a time from a
 * shared counter, so uneven pieces balance themselves. A pool without
 * threads runs every piece on the caller, in order.
 */
#ifndef FB_COMMON_POOL_H
#define FB_COMMON_POOL_H

#include <stdint.h>

#include "common/err.h"

typedef struct fb_pool fb_pool;

/*
 * fb_pool_cpus is the number of CPUs this process may run on (its affinity
 * mask), at least 1.
 */
uint32_t fb_pool_cpus(void);

/*
 * fb_pool_alloc starts `threads` threads (0..256; 0: the caller does all
 * the work). On FB_OK the caller owns *out (fb_pool_free). Errors:
 * FB_EINVAL (threads), FB_ENOMEM, FB_EIO (a thread could not start).
 */
FB_MUST_CHECK fb_err fb_pool_alloc(uint32_t threads, fb_pool **out);

/* fb_pool_free stops the threads (after any fb_pool_for in progress) and
 * frees the pool; NULL is a no-op. */
void fb_pool_free(fb_pool *p);

/* fb_pool_threads is the number of threads the pool started. */
uint32_t fb_pool_threads(const fb_pool *p);

/*
 * fb_pool_for runs fn(arg, i) for every i in [0, n), on the pool's threads
 * and the calling thread, pieces possibly at the same time, and returns
 * when all are done. fn must not fail (record errors in arg) and must not
 * call fb_pool_for on the same pool. Calls from several threads at once
 * are served one after the other. `p` may be NULL (all on the caller).
 * The signature is aggregation.h's fb_par_run, so a pool can drive the
 * accumulator's parallel adds too.
 */
void fb_pool_for(void *p, uint32_t n, void (*fn)(void *arg, uint32_t i),
    void *arg);

#endif
