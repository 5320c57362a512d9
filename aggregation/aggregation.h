/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aggregation.h -- streaming weighted sums in fixed point.
 *
 * The coordinator adds every update into ONE accumulator as its chunks
 * arrive, so its memory is O(model) whatever the number of workers. Values
 * are encoded in the ring Z_2^32 (the same ring secure aggregation masks
 * in): a coordinate x of an update with weight w becomes
 *     q = round_half_away(w_q * clamp(x, -clip, clip) * S),  S = 2^30 / clip,
 * where w_q is w rounded down to a multiple of 2^-32. Integer addition commutes,
 * so the sum (and the model) does not depend on the order in which updates
 * arrive.
 *
 * No overflow, by construction: the weights added into any chunk sum to at
 * most 1 (the accumulator refuses more, FB_ERANGE), so the exact sum is at
 * most 2^30 in magnitude, plus at most 1/2 per update from rounding; with
 * fewer than 2^29 updates this stays below 2^31.
 *
 * Quantisation bound: each added value is within 1/2 of its exact w_q*x*S,
 * which puts a chunk's mean (sum / (W_q*S)) within K * clip / (2^31 * W)
 * of the weighted mean under the truncated weights w_q; truncating each
 * weight by less than 2^-32 moves that mean by at most another
 * K * 2^-32 * 2 * clip / W. Together: the mean is within
 *     K * clip / (2^30 * W)
 * of the exact weighted mean of the clamped values, W the chunk's weight
 * sum and K the number of updates added (plus the float32 rounding of the
 * result). With clip 16, W = 1 and K = 8 that is 1.2e-7.
 *
 * An update interrupted mid-stream (worker lost, deadline, bad chunk) keeps
 * the chunks already added: each chunk remembers its own weight sum, and
 * each coordinate is averaged over the updates that contributed to it.
 */
#ifndef FB_AGGREGATION_AGGREGATION_H
#define FB_AGGREGATION_AGGREGATION_H

#include <stdint.h>

#include "common/err.h"

typedef struct fb_accum fb_accum;

/*
 * fb_accum_alloc makes an accumulator for vectors of `count` floats split in
 * chunks of `chunk_count_elems` elements (the last may be shorter), values
 * clamped to [-clip, clip] (1e-30 <= clip, finite). Errors: FB_EINVAL,
 * FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_accum_alloc(uint64_t count, uint64_t chunk_elems,
    double clip, fb_accum **out);

/* fb_accum_free releases it; NULL is a no-op. */
void fb_accum_free(fb_accum *a);

/* fb_accum_reset zeroes the sums and weights for a new round. */
void fb_accum_reset(fb_accum *a);

uint32_t fb_accum_chunk_count(const fb_accum *a);
/* fb_accum_chunk_len returns the number of elements in chunk `chunk`. */
uint64_t fb_accum_chunk_len(const fb_accum *a, uint32_t chunk);

/*
 * fb_accum_add adds weight * x, x being chunk `chunk` of one update
 * (fb_accum_chunk_len(a, chunk) floats). It checks the chunk first: a NaN
 * or infinity is FB_EINVAL and nothing is added; a weight that would bring
 * the chunk's weight sum above 1 is FB_ERANGE, nothing added. `weight` is
 * in (0, 1]; a weight below 2^-32 rounds to nothing and is FB_ERANGE.
 * *clipped (if non-NULL) is increased by the number of
 * coordinates that had to be clamped. Not thread-safe.
 */
FB_MUST_CHECK fb_err fb_accum_add(fb_accum *a, uint32_t chunk, const float *x,
    double weight, uint64_t *clipped);

/* fb_accum_chunk_weight returns the weight sum added into `chunk`. */
double fb_accum_chunk_weight(const fb_accum *a, uint32_t chunk);

/*
 * fb_accum_mean writes, for each coordinate, the weighted mean of what was
 * added (0 where a chunk received nothing) into `out` (count floats).
 */
void fb_accum_mean(const fb_accum *a, float *out);

/*
 * fb_accum_apply updates params in place: params -= lr * mean. Chunks with
 * no weight are left unchanged. It needs no buffer besides params.
 */
void fb_accum_apply(const fb_accum *a, float *params, double lr);

/* fb_accum_resolution returns 1/S, the value of one unit of the ring. */
double fb_accum_resolution(const fb_accum *a);

/*
 * fb_fedavg_weights fills w[i] = n[i] / sum(n) for `count` sample counts
 * (each > 0). Errors: FB_EINVAL (a zero count or count == 0).
 */
FB_MUST_CHECK fb_err fb_fedavg_weights(const uint64_t *n, uint32_t count,
    double *w);

#endif
