/* SPDX-License-Identifier: Apache-2.0 */
/*
 * encode.c -- the fixed-point encoding of secure aggregation: clip, weight,
 * stochastic rounding into Z_2^bits, and the decoding of sums (see
 * aggregation.h, "Secure-aggregation encoding", for the overflow argument
 * and the quantisation bound).
 */
#include <math.h>
#include <string.h>

#include "aggregation/aggregation.h"

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
 * rounding_u returns u in [0, 1), a multiple of 2^-53, for coordinate
 * `index` under `seed`: two SplitMix64 finalisers over (seed, index), a
 * counter-based generator, so any chunking gives the same u.
 */
static double
rounding_u(uint64_t seed, uint64_t index)
{
	uint64_t h = mix64(seed + UINT64_C(0x9e3779b97f4a7c15) * (index + 1));
	h = mix64(h ^ (seed >> 32 | seed << 32));
	return (double)(h >> 11) * 0x1p-53;
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

/* encode_one clamps c, counts a clamp, and rounds c * ws stochastically. */
static inline uint32_t
encode_one(const fb_encoding *e, double c, double ws, double u,
    uint32_t mask, uint64_t *nclip)
{
	double q;

	if (c > e->clip) {
		c = e->clip;
		(*nclip)++;
	} else if (c < -e->clip) {
		c = -e->clip;
		(*nclip)++;
	}
	q = floor(c * ws + u);
	/* |q| < 2^31: the int64 conversion is exact, the uint32 one is
	 * reduction mod 2^32. */
	return (uint32_t)(int64_t)q & mask;
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
	for (uint64_t i = 0; i < count; i++) {
		if (!isfinite(x[i])) {
			return FB_EINVAL;
		}
	}
	mask = ring_mask(e);
	ws = w * e->scale;
	for (uint64_t i = 0; i < count; i++) {
		out[i] = encode_one(e, x[i], ws, rounding_u(seed, offset + i),
		    mask, &nclip);
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
	*out = encode_one(e, v, w * e->scale, rounding_u(seed, index),
	    ring_mask(e), &nclip);
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
