/* SPDX-License-Identifier: Apache-2.0 */
/*
 * accum_read.h -- reading an accumulator back in unit tests, through the
 * calls the coordinator itself makes: the chunk means its checks and
 * server step read (fb_accum_mean_chunk), and a plain SGD server step
 * (fb_server_opt_step), params -= lr * mean.
 */
#ifndef FB_TESTS_ACCUM_READ_H
#define FB_TESTS_ACCUM_READ_H

#include "aggregation/aggregation.h"
#include "tests/unit/harness.h"

/* accum_mean writes every chunk's weighted mean into out. */
static inline void
accum_mean(const fb_accum *a, float *out)
{
	uint64_t off = 0;
	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		assert_int_equal(fb_accum_mean_chunk(a, c, out + off), FB_OK);
		off += fb_accum_chunk_len(a, c);
	}
}

/* accum_sgd_step applies params -= lr * mean (lr > 0); chunks with no
 * weight stay as they were. */
static inline void
accum_sgd_step(const fb_accum *a, float *params, double lr)
{
	fb_server_opt_params op;
	fb_server_opt *opt = NULL;
	uint64_t count = 0;

	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		count += fb_accum_chunk_len(a, c);
	}
	fb_server_opt_params_default(&op, FB_SERVER_SGD);
	op.lr = lr;
	assert_int_equal(fb_server_opt_alloc(&op, count, &opt), FB_OK);
	assert_int_equal(fb_server_opt_step(opt, a, params, 1.0), FB_OK);
	fb_server_opt_free(opt);
}

#endif
