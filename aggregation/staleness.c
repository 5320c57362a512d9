/* SPDX-License-Identifier: Apache-2.0 */
/*
 * staleness.c -- the weights of asynchronous buffered aggregation (FedBuff,
 * Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous
 * Aggregation"): an update trained from a model s server steps old counts
 * g(s) = 1 / sqrt(1 + s) of a fresh one, and a buffer of K updates makes
 * the step D = sum_i n_i g(s_i) update_i / sum_i n_i (aggregation.h).
 */
#include <math.h>

#include "aggregation/aggregation.h"

double
fb_staleness_weight(uint64_t staleness)
{
	return 1.0 / sqrt(1.0 + (double)staleness);
}

fb_err
fb_fedbuff_weights(const uint64_t *n, const uint64_t *staleness,
    uint32_t count, double *w, double *scale)
{
	double nsum = 0, wsum = 0;

	*scale = 0;
	if (count == 0) {
		return FB_EINVAL;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (n[i] == 0) {
			return FB_EINVAL;
		}
		nsum += (double)n[i];
	}
	for (uint32_t i = 0; i < count; i++) {
		w[i] = (double)n[i] * fb_staleness_weight(staleness[i]);
		wsum += w[i];
	}
	for (uint32_t i = 0; i < count; i++) {
		w[i] /= wsum;
	}
	*scale = wsum / nsum;
	return FB_OK;
}
