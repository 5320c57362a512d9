/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend.c -- a test aid standing in for the CUDA backend library
 * (tests/integration/secagg_mask_op.sh): the worker's own cpu backend for
 * training, plus a mask_apply op that computes fb_mask_apply on the host.
 * Loaded through FEDBOX_CUDA_LIB, it makes a worker on a machine without a
 * GPU take the path a CUDA worker takes for its masks. The first call logs
 * "mask op: first call", close logs how many calls and elements there
 * were. With FB_MASK_OP_FLIP=1 every call flips bit 31 of its first word
 * after masking: the test then sees whether the op's words are the ones
 * that go out. The symbols it uses come from the worker (-rdynamic).
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "crypto/crypto.h"
#include "worker/trainer.h"

const fb_trainer_backend *fb_trainer_cuda_backend_v1(void);

static atomic_uint_fast64_t calls, elems;

static fb_err
op_mask_apply(void *state, uint32_t *v, uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms, uint32_t round)
{
	const char *flip = getenv("FB_MASK_OP_FLIP");
	fb_err rc;

	if (atomic_fetch_add(&calls, 1) == 0) {
		fb_log_info("mask op: first call");
	}
	atomic_fetch_add(&elems, count);
	rc = fb_mask_apply(v, offset, count, terms, nterms, round);
	if (rc == FB_OK && count > 0 && flip != NULL && flip[0] == '1') {
		v[0] ^= UINT32_C(1) << 31;
	}
	return rc;
}

static void
op_close(void *state)
{
	fb_log_info("mask op: %" PRIu64 " calls, %" PRIu64 " elements",
	    (uint64_t)atomic_load(&calls), (uint64_t)atomic_load(&elems));
	fb_trainer_cpu_backend.close(state);
}

static void
op_describe(void *state, char *buf, size_t len)
{
	snprintf(buf, len, "mask-op test backend (cpu training)");
}

const fb_trainer_backend *
fb_trainer_cuda_backend_v1(void)
{
	static fb_trainer_backend be;

	be = fb_trainer_cpu_backend;
	be.name = "mask-op-test";
	be.close = op_close;
	be.describe = op_describe;
	be.mask_apply = op_mask_apply;
	return &be;
}
