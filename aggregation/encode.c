/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encode.c -- the fixed-point encoding of secure aggregation: clip, weight,
 * stochastic rounding into Z_2^bits, and the decoding of sums (see
 * aggregation.h, "Secure-aggregation encoding", for the overflow argument
 * and the quantisation bound).
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "aggregation/aggregation_impl.h"

/* Relative slack for the double arithmetic of w * x * S + u. */
#define FP_MARGIN 0x1p-40

static uint64_t
mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/*
 * The rounding noise: u in [0, 1), a multiple of 2^-31, for coordinate
 * `index` under `seed`, from a counter-based generator, so any chunking
 * gives the same u: a key from (seed, index / 2^32) by SplitMix64's
 * finaliser, then two rounds of a 32-bit integer hash (lowbias32, an
 * invertible multiply-xorshift mix) over the index's low word. 32-bit
 * words so that the encoder's loop vectorises (the old 64-bit generator
 * held it to one coordinate at a time: 0.36 GB/s of floats a core, where
 * the masked upload seals 1.4). The noise only has to be unbiased and
 * independent of the data.
 */
typedef struct round_key {
	uint32_t k0, k1;
} round_key;

static round_key
rounding_key(uint64_t seed, uint64_t index)
{
	uint64_t h = mix64(seed ^ mix64((index >> 32) +
	                               UINT64_C(0x9e3779b97f4a7c15)));
	return (round_key){(uint32_t)h, (uint32_t)(h >> 32)};
}

static inline uint32_t
hash32(uint32_t x)
{
	x ^= x >> 16;
	x *= UINT32_C(0x7feb352d);
	x ^= x >> 15;
	x *= UINT32_C(0x846ca68b);
	return x ^ (x >> 16);
}

static inline double
rounding_u(round_key k, uint32_t lo)
{
	uint32_t h = hash32(hash32(lo ^ k.k0) + k.k1);
	return (double)(int32_t)(h >> 1) * 0x1p-31;
}

static int
encoding_ok(const fb_encoding *e)
{
	return e != NULL && e->bits >= FB_ENCODE_BITS_MIN &&
	       e->bits <= FB_ENCODE_BITS_MAX && e->max_workers >= 1 &&
	       isfinite(e->clip) && e->clip > 0 && isfinite(e->w_max) &&
	       e->w_max > 0 && isfinite(e->scale) && e->scale > 0;
}

fb_err
fb_encoding_check(const fb_encoding *e)
{
	double top, lhs;

	if (!encoding_ok(e)) {
		return FB_EINVAL;
	}
	top = ldexp(1.0, (int)e->bits - 1);
	lhs = (double)e->max_workers * (e->w_max * e->clip * e->scale + 1.0) *
	      (1.0 + FP_MARGIN);
	if (!(lhs < top)) {
		return FB_ERANGE;
	}
	return FB_OK;
}

fb_err
fb_encoding_init(fb_encoding *e, uint32_t bits, uint32_t max_workers,
    double clip, double w_max)
{
	fb_err rc = FB_OK;
	double s0;
	int ex;

	memset(e, 0, sizeof(*e));
	e->bits = bits;
	e->max_workers = max_workers;
	e->clip = clip;
	e->w_max = w_max;
	e->scale = 1.0;
	if (!encoding_ok(e)) {
		rc = FB_EINVAL;
		goto out;
	}
	/* The real solution of K (w_max clip S + 1)(1 + m) = 2^(bits-1). */
	s0 = (ldexp(1.0, (int)bits - 1) / (max_workers * (1.0 + FP_MARGIN)) -
	         1.0) /
	     (w_max * clip);
	if (!(s0 > 0) || !isfinite(s0)) {
		rc = s0 > 0 ? FB_EINVAL : FB_ERANGE;
		goto out;
	}
	(void)frexp(s0, &ex); /* s0 in [2^(ex-1), 2^ex) */
	e->scale = ldexp(1.0, ex);
	while (fb_encoding_check(e) != FB_OK && e->scale > 0) {
		e->scale *= 0.5;
	}
	rc = fb_encoding_check(e);
out:
	if (rc != FB_OK) {
		memset(e, 0, sizeof(*e));
	}
	return rc;
}

double
fb_encoding_bound(const fb_encoding *e, uint32_t k)
{
	return (double)k * (1.0 + 0x1p-20) / e->scale;
}

static uint32_t
ring_mask(const fb_encoding *e)
{
	return e->bits >= 32 ? UINT32_MAX : (UINT32_C(1) << e->bits) - 1;
}

/*
 * The encoder's loop: on x86-64 also built for AVX-512F and AVX2, the best
 * picked at start (glibc's ifunc), as accum.c's. ISO C does not contract
 * c * ws + u into an FMA, and every step is exact or correctly rounded,
 * so every build gives the same words (tests/unit/secagg_test.c checks
 * them against one coordinate at a time).
 */

/*
 * encode_one clamps c, and rounds c * ws stochastically: t = c * ws + u
 * has |t| < 2^31 (fb_encoding_check), so its truncation fits an int32 and
 * floor(t) is that, less one where it was above t; the uint32 of the
 * result is its residue mod 2^32. Branch-free, so that the loop
 * vectorises.
 */
static inline uint32_t
encode_one(double c, double clip, double ws, double u, uint32_t mask)
{
	double t, f;

	c = c > clip ? clip : c;
	c = c < -clip ? -clip : c;
	t = c * ws + u;
	f = (double)(int32_t)t;
	f -= f > t ? 1.0 : 0.0;
	return (uint32_t)(int32_t)f & mask;
}

/* Whether x[0..count) holds no NaN or infinity (one pass without a
 * branch per element, so that it vectorises). */
FB_KERNEL_CLONES static bool
all_finite(const float *x, uint64_t count)
{
	uint32_t bad = 0;

	for (uint64_t i = 0; i < count; i++) {
		bad |= !(fabsf(x[i]) <= FLT_MAX);
	}
	return bad == 0;
}

/* Coordinates lo0 .. lo0 + n - 1 of one 2^32 block (key k); returns how
 * many were clamped. */
FB_KERNEL_CLONES static uint64_t
encode_run(const float *x, uint32_t n, double clip, double ws, round_key k,
    uint32_t lo0, uint32_t mask, uint32_t *out)
{
	uint32_t nclip = 0;

	for (uint32_t i = 0; i < n; i++) {
		double c = x[i];
		nclip += (uint32_t)(c > clip) + (uint32_t)(c < -clip);
		out[i] = encode_one(c, clip, ws, rounding_u(k, lo0 + i), mask);
	}
	return nclip;
}

fb_err
fb_encode_chunk(const fb_encoding *e, const float *x, uint64_t count,
    double w, uint64_t offset, uint64_t seed, uint32_t *out,
    uint64_t *clipped)
{
	uint32_t mask;
	uint64_t nclip = 0;
	double ws;

	if (!encoding_ok(e)) {
		return FB_EINVAL;
	}
	if (!(w >= 0 && w <= e->w_max)) {
		return FB_ERANGE;
	}
	if (!all_finite(x, count)) {
		return FB_EINVAL;
	}
	mask = ring_mask(e);
	ws = w * e->scale;
	for (uint64_t i = 0; i < count;) {
		/* runs that stay inside one 2^32 block of indices (one key),
		 * at most 2^31 long */
		uint64_t at = offset + i;
		uint64_t room = (UINT64_C(1) << 32) - (at & UINT32_MAX);
		uint64_t n = count - i < room ? count - i : room;
		n = n > (UINT64_C(1) << 31) ? UINT64_C(1) << 31 : n;
		nclip += encode_run(x + i, (uint32_t)n, e->clip, ws,
		    rounding_key(seed, at), (uint32_t)at, mask, out + i);
		i += n;
	}
	if (clipped != NULL) {
		*clipped += nclip;
	}
	return FB_OK;
}

fb_err
fb_encode_scalar(const fb_encoding *e, double v, double w, uint64_t index,
    uint64_t seed, uint32_t *out)
{
	uint64_t nclip = 0;

	*out = 0;
	if (!encoding_ok(e) || !isfinite(v)) {
		return FB_EINVAL;
	}
	if (!(w >= 0 && w <= e->w_max)) {
		return FB_ERANGE;
	}
	(void)nclip;
	*out = encode_one(v, e->clip, w * e->scale,
	    rounding_u(rounding_key(seed, index), (uint32_t)index),
	    ring_mask(e));
	return FB_OK;
}

double
fb_decode_value(const fb_encoding *e, uint32_t sum)
{
	uint32_t v = sum & ring_mask(e);
	int64_t s = (int64_t)v;

	if (v >> (e->bits - 1)) {
		s -= (int64_t)1 << e->bits;
	}
	return (double)s / e->scale;
}

void
fb_decode_chunk(const fb_encoding *e, const uint32_t *sum, uint64_t count,
    double *out)
{
	for (uint64_t i = 0; i < count; i++) {
		out[i] = fb_decode_value(e, sum[i]);
	}
}

fb_err
fb_secagg_encodings_init(fb_secagg_encodings *e, uint32_t bits, uint32_t n,
    double clip, double a_bound)
{
	fb_err rc;

	if ((rc = fb_encoding_init(&e->x, bits, n, clip, 1.0)) != FB_OK ||
	    (rc = fb_encoding_init(&e->w, bits, n, 1.0, 1.0)) != FB_OK ||
	    (rc = fb_encoding_init(&e->loss, bits, n, FB_SECAGG_LOSS_BOUND,
	         1.0)) != FB_OK) {
		return rc;
	}
	if ((rc = fb_encoding_init(&e->a, bits, n, a_bound, 1.0)) != FB_OK ||
	    (rc = fb_encoding_init(&e->ev_w, bits, n, 1.0, 1.0)) != FB_OK ||
	    (rc = fb_encoding_init(&e->ev_loss, bits, n,
	         FB_SECAGG_LOSS_BOUND, 1.0)) != FB_OK) {
		return rc;
	}
	return fb_encoding_init(&e->ev_acc, bits, n, 1.0, 1.0);
}

fb_err
fb_secagg_encode_extras(const fb_secagg_encodings *e, double w, double loss,
    double a_norm, const fb_secagg_eval *ev, uint64_t first, uint64_t seed,
    uint32_t out[FB_SECAGG_EXTRA])
{
	double v = 0, vloss = 0, vacc = 0;
	fb_err rc;

	if (!isfinite(loss)) {
		loss = FB_SECAGG_LOSS_BOUND;
	}
	if (ev != NULL && ev->v != 0) {
		v = ev->v;
		/* an unknown loss counts as the bound, as the train loss */
		vloss = isfinite(ev->loss) ? ev->loss : FB_SECAGG_LOSS_BOUND;
		vacc = isfinite(ev->accuracy) ? ev->accuracy : 0;
	}
	if ((rc = fb_encode_scalar(&e->w, 1.0, w, first, seed, &out[0])) !=
	        FB_OK ||
	    (rc = fb_encode_scalar(&e->loss, loss, w, first + 1, seed,
	         &out[1])) != FB_OK ||
	    (rc = fb_encode_scalar(&e->a, a_norm, w, first + 2, seed,
	         &out[2])) != FB_OK ||
	    (rc = fb_encode_scalar(&e->ev_w, 1.0, v, first + 3, seed,
	         &out[3])) != FB_OK ||
	    (rc = fb_encode_scalar(&e->ev_loss, vloss, v, first + 4, seed,
	         &out[4])) != FB_OK) {
		return rc;
	}
	return fb_encode_scalar(&e->ev_acc, vacc, v, first + 5, seed, &out[5]);
}

fb_err
fb_secagg_decode_extras(const fb_secagg_encodings *e,
    const uint32_t sum[FB_SECAGG_EXTRA], double *W, double *loss,
    double *a_norm)
{
	*W = fb_decode_value(&e->w, sum[0]);
	if (!(*W > 0)) {
		*W = *loss = *a_norm = 0;
		return FB_ERANGE;
	}
	*loss = fb_decode_value(&e->loss, sum[1]) / *W;
	*a_norm = fb_decode_value(&e->a, sum[2]) / *W;
	return FB_OK;
}

fb_err
fb_secagg_decode_eval(const fb_secagg_encodings *e,
    const uint32_t sum[FB_SECAGG_EXTRA], uint64_t max_samples,
    uint32_t included, fb_eval_mean *out)
{
	const uint32_t *ev = sum + FB_SECAGG_EVAL_FIRST;
	double V = fb_decode_value(&e->ev_w, ev[0]);
	double n = V * (double)max_samples;
	/* slack: each input's three values are within one unit each */
	double slack = (double)included * (1 + 0x1p-20);

	memset(out, 0, sizeof(*out));
	out->loss = out->accuracy = NAN;
	if (!(V >= -slack / e->ev_w.scale) || max_samples == 0) {
		return FB_ERANGE;
	}
	if (!(n >= 0.5)) {
		return FB_OK; /* no worker had validation data */
	}
	out->reports = included;
	out->examples = round(n);
	out->loss = fb_decode_value(&e->ev_loss, ev[1]) / V;
	out->accuracy = fb_decode_value(&e->ev_acc, ev[2]) / V;
	if (!isfinite(out->loss) || !isfinite(out->accuracy) ||
	    out->accuracy < -0.01 || out->accuracy > 1.01) {
		memset(out, 0, sizeof(*out));
		out->loss = out->accuracy = NAN;
		return FB_ERANGE;
	}
	out->accuracy = out->accuracy < 0 ? 0
	              : out->accuracy > 1 ? 1 : out->accuracy;
	return FB_OK;
}
