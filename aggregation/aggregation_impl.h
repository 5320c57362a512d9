/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aggregation_impl.h -- private to aggregation/: the layout of fb_accum, so
 * that the server rules (rules.c) can read a chunk's fixed-point sums
 * directly and apply a step chunk by chunk without a full-size temporary.
 * Include only from files in aggregation/.
 */
#ifndef FB_AGGREGATION_AGGREGATION_IMPL_H
#define FB_AGGREGATION_AGGREGATION_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "aggregation/aggregation.h"

/*
 * FB_KERNEL_CLONES: the loops every update goes through (accum.c's adds,
 * encode.c's encoder) are also built for AVX-512F and AVX2 on x86-64, the
 * best picked when the program starts (glibc's ifunc). Not under
 * ThreadSanitizer: its runtime is not up yet when the dynamic loader runs
 * the resolvers.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define FB_KERNEL_CLONES \
	__attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FB_KERNEL_CLONES
#endif

struct fb_accum {
	uint64_t count;
	uint64_t chunk_elems;
	uint32_t chunks;
	double clip;
	float clip_f;        /* the largest float not above clip */
	double scale;        /* S = 2^30 / clip */
	uint32_t *sum;       /* count ring elements (int32 two's complement) */
	_Atomic uint64_t *weight_q; /* per chunk, weight sum in units of 2^-32 */
	/* Concurrent adds: a chunk's sum is cut in parts of part_elems
	 * elements (at most 64 per chunk), each under one of the locks. */
	uint64_t part_elems;
	uint32_t chunk_parts; /* parts of a full chunk */
	pthread_mutex_t *locks;
	uint32_t nlocks;
	_Atomic uint32_t ticket; /* spreads concurrent adds' first parts */
	/* A round's reset does not clear the sum: it starts a new epoch. A
	 * part whose part_epoch is not `epoch` holds an older round's sums and
	 * reads as zero; the first add into it in a round stores instead of
	 * adding (part_piece). Part p of chunk c is part_epoch[c * chunk_parts
	 * + p], read and written under that part's lock while adds run. A
	 * chunk with weight has all its parts current (an add that counts
	 * goes into every part), so readers of weighted chunks read sum as
	 * is; fb_accum_mean_chunk zeroes stale parts of the others, and
	 * fb_accum_ring and fb_accum_set_secure_sum zero every stale part
	 * first (accum_settle). */
	uint32_t epoch;
	uint32_t *part_epoch;
	bool stale;          /* some part may be stale (since a reset) */
	fb_par_run par;      /* runs an add's parts at once, or NULL */
	void *par_ctx;
};

/* accum_part_span gives part p's offset and length in a chunk of n
 * elements (p * part_elems < n). */
static inline uint64_t
accum_part_span(const struct fb_accum *a, uint64_t n, uint32_t p,
    uint64_t *len)
{
	uint64_t off = (uint64_t)p * a->part_elems;
	*len = n - off < a->part_elems ? n - off : a->part_elems;
	return off;
}

/* accum_part_stale says whether part p of chunk c reads as zero. */
static inline int
accum_part_stale(const struct fb_accum *a, uint32_t c, uint32_t p)
{
	return a->part_epoch[(uint64_t)c * a->chunk_parts + p] != a->epoch;
}

#endif
