/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aggregation_impl.h -- private to aggregation/: the layout of fb_accum, so
 * that the server rules (rules.c) can read a chunk's fixed-point sums
 * directly and apply a step chunk by chunk without a full-size temporary.
 * Include only from files in aggregation/.
 */
#ifndef FB_AGGREGATION_AGGREGATION_IMPL_H
#define FB_AGGREGATION_AGGREGATION_IMPL_H

#include <stdint.h>

#include "aggregation/aggregation.h"

struct fb_accum {
	uint64_t count;
	uint64_t chunk_elems;
	uint32_t chunks;
	double clip;
	double scale;        /* S = 2^30 / clip */
	uint32_t *sum;       /* count ring elements (int32 two's complement) */
	uint64_t *weight_q;  /* per chunk, weight sum in units of 2^-32 */
};

#endif
