/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_test.c -- unit tests of secure aggregation's library half:
 * Shamir sharing against an independent big-integer reference
 * (tests/vectors/shamir.txt, written by tests/gen/shamir_vectors.py) and
 * its negative cases; the fixed-point encoding's edge values and overflow
 * check; mask expansion against raw ChaCha20; the neighbour graph; and
 * in-memory SecAgg+ rounds with dropouts, below-threshold refusals and a
 * uniformity check of what the coordinator receives.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "aggregation/aggregation.h"
#include "common/util.h"
#include "crypto/crypto.h"
#include "tests/unit/accum_read.h"
#include "tests/unit/harness.h"

#define VECTORS "tests/vectors/shamir.txt"
#define P61 ((UINT64_C(1) << 61) - 1)

/* ---- Shamir against the reference ------------------------------------- */

static void
hex_to_bytes(const char *hex, uint8_t *out, size_t len)
{
	assert_int_equal(strlen(hex), 2 * len);
	for (size_t i = 0; i < len; i++) {
		unsigned v;
		assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
		out[i] = (uint8_t)v;
	}
}

static uint32_t
parse_xs(char *list, uint32_t *xs, uint32_t cap)
{
	uint32_t c = 0;
	for (char *tok = strtok(list, ","); tok != NULL;
	     tok = strtok(NULL, ",")) {
		assert_true(c < cap);
		xs[c++] = (uint32_t)strtoul(tok, NULL, 10);
	}
	return c;
}

typedef struct vcase {
	uint32_t t, npts;
	uint8_t secret[32];
	uint32_t xs[64];
	uint64_t coefs[64 * FB_SHAMIR_LIMBS];
	uint32_t ncoefs;
	fb_shamir_share expect[64];
	uint32_t nshares;
} vcase;

/* pick_shares copies the expected shares at xs[0..c) into out. */
static void
pick_shares(const vcase *vc, const uint32_t *xs, uint32_t c,
    fb_shamir_share *out)
{
	for (uint32_t i = 0; i < c; i++) {
		uint32_t j;
		for (j = 0; j < vc->nshares; j++) {
			if (vc->expect[j].x == xs[i]) {
				break;
			}
		}
		assert_true(j < vc->nshares);
		out[i] = vc->expect[j];
	}
}

static void
test_shamir_vectors(void **state)
{
	FILE *f = fopen(VECTORS, "r");
	char line[4096];
	vcase vc;
	int cases = 0, combines = 0, corrupt_ok = 0, corrupt_auth = 0;

	(void)state;
	assert_non_null(f);
	memset(&vc, 0, sizeof(vc));
	while (fgets(line, sizeof(line), f) != NULL) {
		char *kw, *rest;
		line[strcspn(line, "\n")] = '\0';
		if (line[0] == '#' || line[0] == '\0') {
			continue;
		}
		kw = strtok_r(line, " ", &rest);
		if (strcmp(kw, "case") == 0) {
			memset(&vc, 0, sizeof(vc));
			vc.t = (uint32_t)strtoul(strtok_r(NULL, " ", &rest),
			    NULL, 10);
			hex_to_bytes(strtok_r(NULL, " ", &rest), vc.secret, 32);
		} else if (strcmp(kw, "points") == 0) {
			vc.npts = parse_xs(rest, vc.xs, 64);
		} else if (strcmp(kw, "coefs") == 0) {
			char *tok;
			while ((tok = strtok_r(NULL, " ", &rest)) != NULL) {
				vc.coefs[vc.ncoefs++] = strtoull(tok, NULL, 16);
			}
			assert_int_equal(vc.ncoefs,
			    (vc.t - 1) * FB_SHAMIR_LIMBS);
		} else if (strcmp(kw, "share") == 0) {
			fb_shamir_share *s = &vc.expect[vc.nshares++];
			s->x = (uint32_t)strtoul(strtok_r(NULL, " ", &rest),
			    NULL, 10);
			for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
				s->y[l] = strtoull(strtok_r(NULL, " ", &rest),
				    NULL, 16);
			}
			if (vc.nshares == vc.npts) {
				/* All shares read: split must give them. */
				fb_shamir_share got[64];
				assert_int_equal(fb_shamir_split_coeffs(vc.secret,
				    vc.t, vc.xs, vc.npts, vc.coefs, got), FB_OK);
				assert_memory_equal(got, vc.expect,
				    vc.npts * sizeof(got[0]));
			}
		} else if (strcmp(kw, "combine") == 0) {
			uint32_t xs[64], c;
			fb_shamir_share sh[64];
			uint8_t want[32], got[32];
			char *list = strtok_r(NULL, " ", &rest);
			hex_to_bytes(strtok_r(NULL, " ", &rest), want, 32);
			c = parse_xs(list, xs, 64);
			pick_shares(&vc, xs, c, sh);
			assert_int_equal(fb_shamir_combine(sh, c, vc.t, 64, got),
			    FB_OK);
			assert_memory_equal(got, want, 32);
			combines++;
		} else if (strcmp(kw, "corrupt") == 0) {
			uint32_t xs[64], c, xc;
			fb_shamir_share sh[64];
			uint8_t want[32], got[32];
			char *list = strtok_r(NULL, " ", &rest);
			char *verdict;
			xc = (uint32_t)strtoul(strtok_r(NULL, " ", &rest), NULL,
			    10);
			verdict = strtok_r(NULL, " ", &rest);
			c = parse_xs(list, xs, 64);
			pick_shares(&vc, xs, c, sh);
			for (uint32_t i = 0; i < c; i++) {
				if (sh[i].x == xc) {
					sh[i].y[0] = (sh[i].y[0] + 1) % P61;
				}
			}
			if (strcmp(verdict, "eauth") == 0) {
				/* Caught by the limb range check. */
				assert_int_equal(fb_shamir_combine(sh, c, vc.t,
				    64, got), FB_EAUTH);
				corrupt_auth++;
			} else {
				/* Undetectable among exactly t: a wrong secret,
				 * the one the reference predicts. */
				hex_to_bytes(strtok_r(NULL, " ", &rest), want,
				    32);
				assert_int_equal(fb_shamir_combine(sh, c, vc.t,
				    64, got), FB_OK);
				assert_memory_equal(got, want, 32);
				assert_memory_not_equal(got, vc.secret, 32);
				corrupt_ok++;
			}
		} else if (strcmp(kw, "end") == 0) {
			cases++;
		}
	}
	fclose(f);
	assert_true(cases >= 7);
	assert_true(combines >= 30);
	assert_true(corrupt_auth > 0);
	assert_true(corrupt_ok > 0);
}

static void
test_shamir_threshold(void **state)
{
	uint8_t secret[32], got[32];
	uint32_t xs[7] = { 1, 2, 3, 4, 5, 6, 7 };
	fb_shamir_share sh[7];

	(void)state;
	randombytes_buf(secret, sizeof(secret));
	assert_int_equal(fb_shamir_split(secret, 4, xs, 7, sh), FB_OK);
	/* Any 4 reconstruct (the last 4, then all 7). */
	assert_int_equal(fb_shamir_combine(sh + 3, 4, 4, 7, got), FB_OK);
	assert_memory_equal(got, secret, 32);
	assert_int_equal(fb_shamir_combine(sh, 7, 4, 7, got), FB_OK);
	assert_memory_equal(got, secret, 32);
	/* 3 are below the threshold: refused, output zeroed. */
	memset(got, 0xaa, sizeof(got));
	assert_int_equal(fb_shamir_combine(sh, 3, 4, 7, got), FB_ERANGE);
	assert_true(sodium_is_zero(got, sizeof(got)));
	/* And a sharing with t > count is refused at split. */
	assert_int_equal(fb_shamir_split(secret, 8, xs, 7, sh), FB_EINVAL);
	assert_int_equal(fb_shamir_split(secret, 0, xs, 7, sh), FB_EINVAL);
}

static void
test_shamir_bad_indices(void **state)
{
	uint8_t secret[32], got[32];
	uint32_t xs[5] = { 1, 2, 3, 4, 5 };
	uint32_t dup[3] = { 2, 4, 2 };
	fb_shamir_share sh[5], bad[3];
	uint8_t packed[FB_SHAMIR_SHARE_LEN];
	fb_shamir_share back;

	(void)state;
	randombytes_buf(secret, sizeof(secret));
	assert_int_equal(fb_shamir_split(secret, 3, dup, 3, sh), FB_EINVAL);
	assert_int_equal(fb_shamir_split(secret, 3, xs, 5, sh), FB_OK);
	/* Duplicate index. */
	bad[0] = sh[0];
	bad[1] = sh[1];
	bad[2] = sh[0];
	assert_int_equal(fb_shamir_combine(bad, 3, 3, 5, got), FB_EPROTO);
	/* x = 0 and x above n. */
	bad[2] = sh[2];
	bad[2].x = 0;
	assert_int_equal(fb_shamir_combine(bad, 3, 3, 5, got), FB_EPROTO);
	bad[2].x = 6;
	assert_int_equal(fb_shamir_combine(bad, 3, 3, 5, got), FB_EPROTO);
	/* Non-canonical y. */
	bad[2] = sh[2];
	bad[2].y[3] = P61;
	assert_int_equal(fb_shamir_combine(bad, 3, 3, 5, got), FB_EPROTO);
	/* Pack, unpack; a non-canonical packed y or x = 0 is refused. */
	fb_shamir_share_pack(&sh[4], packed);
	assert_int_equal(fb_shamir_share_unpack(packed, &back), FB_OK);
	assert_memory_equal(&back, &sh[4], sizeof(back));
	fb_shamir_share_pack(&bad[2], packed);
	assert_int_equal(fb_shamir_share_unpack(packed, &back), FB_EPROTO);
	memset(packed, 0, 4);
	assert_int_equal(fb_shamir_share_unpack(packed, &back), FB_EPROTO);
	/* A corrupted share among more than t is always caught. */
	for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
		memcpy(bad, sh, 3 * sizeof(bad[0]));
		fb_shamir_share more[4] = { sh[0], sh[1], sh[2], sh[3] };
		more[3].y[l] = (more[3].y[l] + 1) % P61;
		assert_int_equal(fb_shamir_combine(more, 4, 3, 5, got),
		    FB_EAUTH);
		more[3] = sh[3];
		more[0].y[l] ^= 1;
		assert_int_equal(fb_shamir_combine(more, 4, 3, 5, got),
		    FB_EAUTH);
	}
}

/* ---- encoding --------------------------------------------------------- */

static void
test_encoding_scale_and_overflow_check(void **state)
{
	fb_encoding e;

	(void)state;
	assert_int_equal(fb_encoding_init(&e, 32, 128, 16.0, 1.0), FB_OK);
	assert_true(e.scale == ldexp(1.0, 19));
	/* The next power of two could overflow: refused. */
	e.scale *= 2;
	assert_int_equal(fb_encoding_check(&e), FB_ERANGE);
	/* Exactly at the edge: K (w clip S + 1) = 2^31 is refused. */
	e = (fb_encoding){ .bits = 32, .max_workers = 1, .clip = 1,
		.w_max = 1, .scale = ldexp(1.0, 31) - 1 };
	assert_int_equal(fb_encoding_check(&e), FB_ERANGE);
	e.scale = ldexp(1.0, 30);
	assert_int_equal(fb_encoding_check(&e), FB_OK);
	/* 16-bit ring, more workers, bigger weights. */
	assert_int_equal(fb_encoding_init(&e, 16, 64, 2.0, 4.0), FB_OK);
	assert_true((double)e.max_workers *
	        (e.w_max * e.clip * e.scale + 1) < 32768.0);
	assert_true(2 * (double)e.max_workers *
	        (e.w_max * e.clip * e.scale) + e.max_workers >= 32768.0);
	/* No scale works with K_max >= 2^(bits-1). */
	assert_int_equal(fb_encoding_init(&e, 16, 32768, 1.0, 1.0), FB_ERANGE);
	assert_int_equal(fb_encoding_init(&e, 15, 4, 1.0, 1.0), FB_EINVAL);
	assert_int_equal(fb_encoding_init(&e, 33, 4, 1.0, 1.0), FB_EINVAL);
	assert_int_equal(fb_encoding_init(&e, 32, 0, 1.0, 1.0), FB_EINVAL);
	assert_int_equal(fb_encoding_init(&e, 32, 4, 0.0, 1.0), FB_EINVAL);
	assert_int_equal(fb_encoding_init(&e, 32, 4, NAN, 1.0), FB_EINVAL);
	assert_int_equal(fb_encoding_init(&e, 32, 4, 1.0, -1.0), FB_EINVAL);
}

/* edge_sum encodes K copies of x with weight w and checks the decoded sum
 * against K * w * clamp(x) within the bound. */
static void
edge_sum(const fb_encoding *e, float x, double w, uint32_t k)
{
	uint32_t acc = 0, q;
	double want = k * w * fmax(-e->clip, fmin(e->clip, (double)x));

	for (uint32_t i = 0; i < k; i++) {
		assert_int_equal(fb_encode_chunk(e, &x, 1, w, 0, 1000 + i, &q,
		    NULL), FB_OK);
		assert_true(e->bits == 32 || (q >> e->bits) == 0);
		acc += q;
	}
	assert_true(fabs(fb_decode_value(e, acc) - want) <=
	    fb_encoding_bound(e, k));
}

static void
test_encoding_edges(void **state)
{
	fb_encoding e;
	float xs[6] = { 16.0f, -16.0f, 17.5f, -1e30f, 0.0f, -3.25f };
	uint32_t q[6];
	uint64_t clipped = 0;
	uint32_t bits[3] = { 16, 24, 32 };

	(void)state;
	for (int b = 0; b < 3; b++) {
		assert_int_equal(fb_encoding_init(&e, bits[b], 100, 16.0, 1.0),
		    FB_OK);
		/* Max weight at both clip boundaries, K_max summands: the
		 * largest sums the ring must hold, both signs. */
		edge_sum(&e, 16.0f, 1.0, 100);
		edge_sum(&e, -16.0f, 1.0, 100);
		edge_sum(&e, 1e9f, 1.0, 100);  /* clipped to +16 */
		edge_sum(&e, -1e9f, 1.0, 100); /* clipped to -16 */
		edge_sum(&e, -0.37f, 0.25, 7);
		edge_sum(&e, 5.0f, 0.0, 10); /* weight 0 */
	}
	assert_int_equal(fb_encoding_init(&e, 32, 8, 16.0, 1.0), FB_OK);
	assert_int_equal(fb_encode_chunk(&e, xs, 6, 1.0, 0, 7, q, &clipped),
	    FB_OK);
	assert_int_equal(clipped, 2);
	assert_true(fabs(fb_decode_value(&e, q[0]) - 16.0) <= 1 / e.scale);
	assert_true(fabs(fb_decode_value(&e, q[1]) + 16.0) <= 1 / e.scale);
	assert_true(fabs(fb_decode_value(&e, q[2]) - 16.0) <= 1 / e.scale);
	assert_true(fabs(fb_decode_value(&e, q[3]) + 16.0) <= 1 / e.scale);
	assert_int_equal(q[4], 0); /* 0 + u, u < 1, rounds down to 0 */
	assert_true(fabs(fb_decode_value(&e, q[5]) + 3.25) <= 1 / e.scale);
	assert_true(q[5] > UINT32_C(0x80000000)); /* negative: wraps */
	/* Bad input: nothing written. */
	xs[2] = NAN;
	q[0] = 0x12345678;
	assert_int_equal(fb_encode_chunk(&e, xs, 6, 1.0, 0, 7, q, NULL),
	    FB_EINVAL);
	assert_int_equal(q[0], 0x12345678);
	xs[2] = INFINITY;
	assert_int_equal(fb_encode_chunk(&e, xs, 6, 1.0, 0, 7, q, NULL),
	    FB_EINVAL);
	xs[2] = 1.0f;
	assert_int_equal(fb_encode_chunk(&e, xs, 6, 1.0000001, 0, 7, q,
	    NULL), FB_ERANGE);
	assert_int_equal(fb_encode_chunk(&e, xs, 6, -0.1, 0, 7, q, NULL),
	    FB_ERANGE);
	assert_int_equal(fb_encode_chunk(&e, xs, 6, NAN, 0, 7, q, NULL),
	    FB_ERANGE);
	assert_int_equal(fb_encode_scalar(&e, NAN, 1.0, 9, 7, q), FB_EINVAL);
}

static void
test_encoding_ring_wraparound(void **state)
{
	/* Masked values wrap around Z_2^32 many times; the unmasked sum
	 * still decodes to the signed result. */
	fb_encoding e;
	uint32_t sum = 0, masks = 0, q;
	float x = -15.9f;

	(void)state;
	assert_int_equal(fb_encoding_init(&e, 16, 50, 16.0, 1.0), FB_OK);
	for (uint32_t i = 0; i < 50; i++) {
		uint32_t m = randombytes_random();
		assert_int_equal(fb_encode_chunk(&e, &x, 1, 1.0, 0, i, &q,
		    NULL), FB_OK);
		sum += q + m; /* mod 2^32 */
		masks += m;
	}
	assert_true(fabs(fb_decode_value(&e, sum - masks) - 50 * -15.9f) <=
	    fb_encoding_bound(&e, 50));
}

static void
test_encoding_stochastic_rounding_unbiased(void **state)
{
	/* w * x * S = 1000.3 units: rounding up 30% of the time, so the
	 * mean of 200k encodings is 1000.3 (5 sigma of the binomial is
	 * about 0.005 units); round-to-nearest would give 1000. */
	fb_encoding e;
	enum { N = 200000 };
	float *x = malloc(N * sizeof(*x));
	uint32_t *q = malloc(N * sizeof(*q));
	double mean = 0, w;

	(void)state;
	assert_int_equal(fb_encoding_init(&e, 32, 16, 1.0, 1.0), FB_OK);
	w = 1000.3 / (0.25 * e.scale);
	for (int i = 0; i < N; i++) {
		x[i] = 0.25f;
	}
	assert_int_equal(fb_encode_chunk(&e, x, N, w, 0, 99, q, NULL), FB_OK);
	for (int i = 0; i < N; i++) {
		mean += fb_decode_value(&e, q[i]);
	}
	mean /= N;
	assert_true(fabs(mean * e.scale - 1000.3) < 0.005);
	/* The same coordinates encode the same in any chunking. */
	assert_int_equal(fb_encode_chunk(&e, x + 1000, 10, w, 1000, 99,
	    q + N - 10, NULL), FB_OK);
	assert_memory_equal(q + 1000, q + N - 10, 10 * sizeof(*q));
	free(x);
	free(q);
}

/* The rounding noise's generator, written out again (encode.c's words). */
static uint64_t
ref_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

static uint32_t
ref_hash32(uint32_t x)
{
	x ^= x >> 16;
	x *= UINT32_C(0x7feb352d);
	x ^= x >> 15;
	x *= UINT32_C(0x846ca68b);
	return x ^ (x >> 16);
}

/* One coordinate by the formula of aggregation.h, with floor() and a
 * long double product (exact here), not the encoder's vector loop. */
static uint32_t
ref_encode(const fb_encoding *e, float x, double w, uint64_t index,
    uint64_t seed)
{
	uint64_t h = ref_mix64(seed ^ ref_mix64((index >> 32) +
	                                UINT64_C(0x9e3779b97f4a7c15)));
	uint32_t u32 = ref_hash32(ref_hash32((uint32_t)index ^ (uint32_t)h) +
	                          (uint32_t)(h >> 32));
	double u = (double)(u32 >> 1) * 0x1p-31;
	double c = x > e->clip ? e->clip : x < -e->clip ? -e->clip : x;
	double t = c * (w * e->scale) + u;
	int64_t q = (int64_t)floor(t);
	uint32_t mask = e->bits >= 32 ? UINT32_MAX
	                              : (UINT32_C(1) << e->bits) - 1;

	return (uint32_t)q & mask;
}

/*
 * The encoder's loop (vectorised, one of several builds picked at start)
 * gives, word for word, the formula one coordinate at a time: values
 * inside and beyond the clip, both signs, 32- and 20-bit rings, chunks
 * that cross a 2^32 boundary of indices (a new key), and the scalar
 * encoder of the extras at the same index.
 */
static void
test_encoding_matches_the_formula(void **state)
{
	enum { N = 4099 };
	static const uint64_t offsets[] = {0, 12345, (UINT64_C(1) << 32) - 2051,
	    (UINT64_C(5) << 32) + 7};
	static const uint32_t bits[] = {32, 20};
	float *x = malloc(N * sizeof(*x));
	uint32_t *q = malloc(N * sizeof(*q));
	fb_rng r;

	(void)state;
	assert_non_null(x);
	assert_non_null(q);
	fb_rng_init(&r, 11, 0);
	for (int i = 0; i < N; i++) {
		/* mostly within clip 4, some beyond, both signs */
		x[i] = (float)((fb_rng_uniform(&r) - 0.5) * 10.0);
	}
	x[7] = 4.0f;
	x[8] = -4.0f;
	x[9] = 0.0f;
	for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
		fb_encoding e;
		assert_int_equal(fb_encoding_init(&e, bits[b], 8, 4.0, 1.0),
		    FB_OK);
		for (size_t o = 0; o < sizeof(offsets) / sizeof(offsets[0]);
		     o++) {
			uint64_t clipped = 0, want_clipped = 0;
			uint64_t seed = 0x5eed0000u + o;
			double w = 0.37;
			assert_int_equal(fb_encode_chunk(&e, x, N, w, offsets[o],
			                     seed, q, &clipped),
			    FB_OK);
			for (int i = 0; i < N; i++) {
				uint32_t one = 0;
				assert_int_equal(q[i], ref_encode(&e, x[i], w,
				                           offsets[o] + i, seed));
				assert_int_equal(fb_encode_scalar(&e, x[i], w,
				                     offsets[o] + i, seed, &one),
				    FB_OK);
				assert_int_equal(one, q[i]);
				want_clipped += x[i] > 4.0f || x[i] < -4.0f;
			}
			assert_int_equal(clipped, want_clipped);
		}
	}
	free(x);
	free(q);
}

/* ---- masks and graph ---------------------------------------------------- */

static void
test_mask_matches_chacha20_and_streams(void **state)
{
	enum { N = 10000 };
	uint8_t seed[32], nonce[12] = { 'f', 'b', 'm', FB_MASK_PAIR, 5, 0, 0,
		0, 0, 0, 0, 0 };
	uint32_t *raw = calloc(N, sizeof(*raw));
	uint32_t *v = calloc(N, sizeof(*v));
	uint32_t *w = calloc(N, sizeof(*w));
	uint64_t cuts[] = { 0, 1, 17, 500, 4100, 8210, 9999, N };

	(void)state;
	randombytes_buf(seed, sizeof(seed));
	crypto_stream_chacha20_ietf((unsigned char *)raw, N * 4, nonce, seed);
	assert_int_equal(fb_mask_add(v, 0, N, seed, FB_MASK_PAIR, 5), FB_OK);
	assert_memory_equal(v, raw, N * 4);
	/* Chunk by chunk at odd offsets: the same words. */
	for (size_t c = 0; c + 1 < sizeof(cuts) / sizeof(cuts[0]); c++) {
		assert_int_equal(fb_mask_add(w + cuts[c], cuts[c],
		    cuts[c + 1] - cuts[c], seed, FB_MASK_PAIR, 5), FB_OK);
	}
	assert_memory_equal(w, raw, N * 4);
	/* Subtracting restores; other role or round differs. */
	assert_int_equal(fb_mask_sub(v, 0, N, seed, FB_MASK_PAIR, 5), FB_OK);
	assert_true(sodium_is_zero((unsigned char *)v, N * 4));
	assert_int_equal(fb_mask_add(v, 0, N, seed, FB_MASK_SELF, 5), FB_OK);
	assert_memory_not_equal(v, raw, N * 4);
	memset(v, 0, N * 4);
	assert_int_equal(fb_mask_add(v, 0, N, seed, FB_MASK_PAIR, 6), FB_OK);
	assert_memory_not_equal(v, raw, N * 4);
	/* Beyond the counter's reach. */
	assert_int_equal(fb_mask_add(v, FB_MASK_MAX_ELEMS - 5, 6, seed,
	    FB_MASK_PAIR, 5), FB_ERANGE);
	free(raw);
	free(v);
	free(w);
}

static void
test_pair_seeds_agree(void **state)
{
	uint8_t ask[32], apk[32], bsk[32], bpk[32], zero[32] = { 0 };
	uint8_t s1[32], s2[32], s3[32];
	fb_run_id run;

	(void)state;
	assert_int_equal(fb_run_id_random(&run), FB_OK);
	crypto_box_keypair(apk, ask);
	crypto_box_keypair(bpk, bsk);
	assert_int_equal(fb_mask_pair_seed(ask, apk, bpk, &run, 3, s1), FB_OK);
	assert_int_equal(fb_mask_pair_seed(bsk, bpk, apk, &run, 3, s2), FB_OK);
	assert_memory_equal(s1, s2, 32);
	assert_int_equal(fb_mask_pair_seed(ask, apk, bpk, &run, 4, s3), FB_OK);
	assert_memory_not_equal(s1, s3, 32);
	assert_int_equal(fb_mask_pair_seed(ask, apk, zero, &run, 3, s3),
	    FB_EAUTH);
	assert_int_equal(fb_mask_pair_seed(ask, apk, apk, &run, 3, s3),
	    FB_EINVAL);
}

static void
test_graph_symmetric_regular_deterministic(void **state)
{
	uint8_t seed[32];
	uint32_t ns[4] = { 5, 16, 100, 128 };
	uint32_t nbr[128];

	(void)state;
	randombytes_buf(seed, sizeof(seed));
	assert_int_equal(fb_secagg_degree_auto(5, 3), 4);
	assert_int_equal(fb_secagg_degree_auto(16, 7), 12);
	assert_int_equal(fb_secagg_degree_auto(64, 10), 18);
	assert_int_equal(fb_secagg_degree_auto(128, 12), 22);
	assert_int_equal(fb_secagg_degree_auto(128, 40), 40);
	assert_int_equal(fb_secagg_threshold_default(4), 3);
	for (int c = 0; c < 4; c++) {
		uint32_t n = ns[c];
		fb_secagg_graph *g, *h, *o;
		assert_int_equal(fb_secagg_graph_alloc(n, 0, 3, seed, 9, &g),
		    FB_OK);
		assert_int_equal(fb_secagg_graph_alloc(n, 0, 3, seed, 9, &h),
		    FB_OK);
		assert_int_equal(fb_secagg_graph_alloc(n, 0, 3, seed, 10, &o),
		    FB_OK);
		uint32_t k = fb_secagg_graph_degree(g);
		int differs = 0;
		assert_int_equal(k, fb_secagg_degree_auto(n, 3));
		for (uint32_t i = 0; i < n; i++) {
			uint32_t deg = 0;
			assert_int_equal(fb_secagg_graph_neighbours(g, i, nbr),
			    FB_OK);
			for (uint32_t q = 0; q < k; q++) {
				assert_true(nbr[q] != i);
				assert_true(q == 0 || nbr[q] > nbr[q - 1]);
				assert_true(fb_secagg_graph_adjacent(g, nbr[q],
				    i));
			}
			for (uint32_t j = 0; j < n; j++) {
				deg += fb_secagg_graph_adjacent(g, i, j);
				assert_int_equal(fb_secagg_graph_adjacent(g, i,
				    j), fb_secagg_graph_adjacent(h, i, j));
				differs |= fb_secagg_graph_adjacent(g, i, j) !=
				           fb_secagg_graph_adjacent(o, i, j);
			}
			assert_int_equal(deg, k);
		}
		/* A sparse graph depends on the round's randomness. */
		assert_true(k == n - 1 || differs);
		fb_secagg_graph_free(g);
		fb_secagg_graph_free(h);
		fb_secagg_graph_free(o);
	}
	{
		fb_secagg_graph *g;
		assert_int_equal(fb_secagg_graph_alloc(10, 3, 2, seed, 1, &g),
		    FB_OK);
		assert_int_equal(fb_secagg_graph_degree(g), 4); /* odd: up */
		fb_secagg_graph_free(g);
		assert_int_equal(fb_secagg_graph_alloc(10, 50, 2, seed, 1, &g),
		    FB_OK);
		assert_int_equal(fb_secagg_graph_degree(g), 9); /* complete */
		fb_secagg_graph_free(g);
		assert_int_equal(fb_secagg_graph_alloc(1, 0, 2, seed, 1, &g),
		    FB_EINVAL);
	}
}

/* ---- in-memory SecAgg+ rounds ------------------------------------------- */

enum { DROP_NONE = 0, DROP_BEFORE_INPUT, DROP_AFTER_INPUT, DROP_ADVERT };

typedef struct sim_cfg {
	uint32_t n, degree, t;
	uint64_t count;        /* model coordinates (+1 for the weight) */
	const uint8_t *drop;   /* n entries, DROP_*; NULL: none */
	fb_err expect_finish;  /* what the server's finish returns */
	uint32_t *masked_out;  /* if non-NULL: worker 0's masked vector */
	uint32_t *encoded_out; /* and its encoded input */
	/* Sessions across rounds (all NULL: each instance its own). */
	uint32_t round;            /* 0: 7 */
	const fb_run_id *run;      /* NULL: a fresh run */
	fb_secagg_keys **keys;     /* n workers' sessions */
	fb_secagg_keys *seen;      /* the server's cache */
	uint8_t (*adv_out)[FB_SECAGG_ADV_LEN]; /* n: the adverts made */
	fb_shamir_share *s_out;    /* the revealed s-shares of drop_owner */
	uint32_t s_out_count;      /* (out) how many */
	uint32_t drop_owner;
} sim_cfg;

static void
run_round(sim_cfg *cfg)
{
	uint32_t n = cfg->n;
	uint64_t len = cfg->count + 1;
	fb_secagg_params p;
	fb_identity **ids = calloc(n, sizeof(*ids));
	fb_pubkey *pks = calloc(n, sizeof(*pks));
	fb_secagg_worker **w = calloc(n, sizeof(*w));
	fb_secagg_server *srv;
	uint8_t (*adv)[FB_SECAGG_ADV_LEN] = calloc(n, sizeof(*adv));
	uint8_t *buf = malloc((size_t)n * FB_SECAGG_SHARE_MSG_LEN +
	    FB_SECAGG_REVEAL_HEADER_LEN);
	uint8_t *inc = calloc(n, 1);
	uint8_t *confirmed = calloc(n, 1);
	uint8_t(*conf)[FB_SECAGG_CONFIRM_LEN] = calloc(n, sizeof(*conf));
	float *x = malloc(cfg->count * sizeof(*x));
	double *want = calloc(len, sizeof(*want));
	double *got = calloc(len, sizeof(*got));
	uint32_t *y = malloc(len * sizeof(*y));
	uint32_t *sum = calloc(len, sizeof(*sum));
	uint32_t included = 0;
	fb_encoding ex, ew;
	fb_err rc;

	assert_int_equal(fb_encoding_init(&ex, 32, n, 2.0, 1.0), FB_OK);
	assert_int_equal(fb_encoding_init(&ew, 32, n, 1.0, 1.0), FB_OK);
	memset(&p, 0, sizeof(p));
	if (cfg->run != NULL) {
		p.run = *cfg->run;
	} else {
		assert_int_equal(fb_run_id_random(&p.run), FB_OK);
	}
	p.round = cfg->round != 0 ? cfg->round : 7;
	p.n = n;
	p.degree = cfg->degree;
	p.threshold = cfg->t;
	randombytes_buf(p.graph_seed, sizeof(p.graph_seed));
	assert_int_equal(fb_secagg_server_alloc_keys(&p, cfg->seen, &srv),
	    FB_OK);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t seed[32] = { (uint8_t)i, 0x5a };
		assert_int_equal(fb_identity_alloc_from_seed(seed, NULL, &ids[i]),
		    FB_OK);
		fb_identity_pubkey(ids[i], &pks[i]);
		assert_int_equal(fb_secagg_worker_alloc_keys(&p, i,
		    cfg->keys != NULL ? cfg->keys[i] : NULL, &w[i]), FB_OK);
	}
	/* 0: keys. */
	for (uint32_t i = 0; i < n; i++) {
		if (cfg->drop != NULL && cfg->drop[i] == DROP_ADVERT) {
			continue;
		}
		assert_int_equal(fb_secagg_worker_advertise(w[i], ids[i],
		    adv[i]), FB_OK);
		assert_int_equal(fb_secagg_server_add_advert(srv, i, &pks[i],
		    adv[i], FB_SECAGG_ADV_LEN), FB_OK);
		if (cfg->adv_out != NULL) {
			memcpy(cfg->adv_out[i], adv[i], FB_SECAGG_ADV_LEN);
		}
	}
	/* A forged advert (signed by someone else) is refused. */
	assert_int_equal(fb_secagg_server_add_advert(srv, 0, &pks[1], adv[0],
	    FB_SECAGG_ADV_LEN), FB_EAUTH);
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t j = 0; j < n; j++) {
			if (cfg->drop != NULL && (cfg->drop[j] == DROP_ADVERT ||
			        cfg->drop[i] == DROP_ADVERT)) {
				continue;
			}
			assert_int_equal(fb_secagg_worker_add_advert(w[i],
			    &pks[j], adv[j], FB_SECAGG_ADV_LEN), FB_OK);
		}
	}
	/* 1: shares, relayed by the server to their recipients. */
	for (uint32_t i = 0; i < n; i++) {
		size_t out_len;
		if (cfg->drop != NULL && cfg->drop[i] == DROP_ADVERT) {
			continue;
		}
		assert_int_equal(fb_secagg_worker_make_shares(w[i], buf,
		    (size_t)n * FB_SECAGG_SHARE_MSG_LEN, &out_len), FB_OK);
		assert_int_equal(fb_secagg_server_add_shares(srv, i, buf,
		    out_len), FB_OK);
		for (size_t o = 0; o < out_len; o += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from, to;
			assert_int_equal(fb_secagg_share_msg_peek(buf + o,
			    FB_SECAGG_SHARE_MSG_LEN, &from, &to), FB_OK);
			assert_int_equal(from, i);
			if (o == 0) {
				/* Replayed or tampered shares are refused. */
				uint8_t t2[FB_SECAGG_SHARE_MSG_LEN];
				memcpy(t2, buf, sizeof(t2));
				t2[60] ^= 1;
				assert_int_equal(fb_secagg_worker_add_share(
				    w[to], t2, sizeof(t2)), FB_EAUTH);
			}
			assert_int_equal(fb_secagg_worker_add_share(w[to],
			    buf + o, FB_SECAGG_SHARE_MSG_LEN), FB_OK);
			if (o == 0) {
				assert_int_equal(fb_secagg_worker_add_share(
				    w[to], buf + o, FB_SECAGG_SHARE_MSG_LEN),
				    FB_EPROTO);
			}
		}
	}
	/* 2: masked inputs, chunk by chunk, into the server's one sum. */
	for (uint32_t i = 0; i < n; i++) {
		double wi = (i + 1.0) / (n + 1.0);
		uint64_t half = len / 2 + 3;
		uint8_t d = cfg->drop != NULL ? cfg->drop[i] : DROP_NONE;
		if (d == DROP_ADVERT) {
			continue;
		}
		for (uint64_t c = 0; c < cfg->count; c++) {
			x[c] = (float)(2.5 * sin(0.37 * c + i) + 0.01 * i);
		}
		assert_int_equal(fb_encode_chunk(&ex, x, cfg->count, wi, 0,
		    1234 + i, y, NULL), FB_OK);
		assert_int_equal(fb_encode_scalar(&ew, 1.0, wi, cfg->count,
		    1234 + i, &y[cfg->count]), FB_OK);
		if (i == 0 && cfg->encoded_out != NULL) {
			memcpy(cfg->encoded_out, y, len * sizeof(*y));
		}
		assert_int_equal(fb_secagg_worker_mask_begin(w[i]), FB_OK);
		assert_int_equal(fb_secagg_worker_mask_chunk(w[i], y + half,
		    half, len - half), FB_OK);
		assert_int_equal(fb_secagg_worker_mask_chunk(w[i], y, 0, half),
		    FB_OK);
		if (i == 0 && cfg->masked_out != NULL) {
			memcpy(cfg->masked_out, y, len * sizeof(*y));
		}
		if (d == DROP_BEFORE_INPUT) {
			continue;
		}
		for (uint64_t c = 0; c < len; c++) {
			sum[c] += y[c];
		}
		for (uint64_t c = 0; c < cfg->count; c++) {
			want[c] += wi * fmax(-2.0, fmin(2.0, (double)x[c]));
		}
		want[cfg->count] += wi;
		assert_int_equal(fb_secagg_server_set_included(srv, i), FB_OK);
		included++;
	}
	/* 3a: the included set, confirmed; each survivor gets its
	 * neighbours' confirmations. */
	fb_secagg_server_included(srv, inc);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t d = cfg->drop != NULL ? cfg->drop[i] : DROP_NONE;
		if (d != DROP_NONE) {
			continue;
		}
		rc = fb_secagg_worker_confirm(w[i], ids[i], inc, n, conf[i]);
		if (included < cfg->t) {
			/* The worker itself refuses: too few included. */
			assert_int_equal(rc, FB_EPROTO);
			continue;
		}
		assert_int_equal(rc, FB_OK);
		assert_int_equal(fb_secagg_server_add_confirm(
		                     srv, i, conf[i], FB_SECAGG_CONFIRM_LEN),
		    FB_OK);
		confirmed[i] = 1;
	}
	if (included >= cfg->t) {
		/* no inclusion once the set is being confirmed */
		for (uint32_t i = 0; i < n; i++) {
			if (!inc[i] && cfg->drop != NULL &&
			    cfg->drop[i] == DROP_BEFORE_INPUT) {
				assert_int_equal(
				    fb_secagg_server_set_included(srv, i),
				    FB_EINVAL);
			}
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!confirmed[i]) {
			continue;
		}
		for (uint32_t j = 0; j < n; j++) {
			if (j != i && confirmed[j] &&
			    fb_secagg_graph_adjacent(
			        fb_secagg_worker_graph(w[i]), i, j)) {
				assert_int_equal(
				    fb_secagg_worker_add_confirm(
				        w[i], conf[j], FB_SECAGG_CONFIRM_LEN),
				    FB_OK);
			}
		}
	}
	/* 3b: unmasking. */
	for (uint32_t i = 0; i < n; i++) {
		size_t out_len;
		if (!confirmed[i]) {
			continue;
		}
		rc = fb_secagg_worker_reveal(
		    w[i], buf, (size_t)n * FB_SECAGG_SHARE_MSG_LEN, &out_len);
		if (fb_secagg_worker_confirmations(w[i]) < cfg->t) {
			/* too few of its neighbourhood confirmed the set
			 * (the others are gone): it does not reveal */
			assert_int_equal(rc, FB_ERANGE);
			continue;
		}
		assert_int_equal(rc, FB_OK);
		assert_int_equal(fb_secagg_server_add_reveal(srv, i, buf,
		    out_len), FB_OK);
		for (size_t o = FB_SECAGG_REVEAL_HEADER_LEN;
		     cfg->s_out != NULL && o < out_len;
		     o += FB_SECAGG_REVEAL_ENTRY_LEN) {
			const uint8_t *e = buf + o;
			uint32_t owner = (uint32_t)e[0] | (uint32_t)e[1] << 8 |
			                 (uint32_t)e[2] << 16 |
			                 (uint32_t)e[3] << 24;
			if (owner == cfg->drop_owner && e[4] == 2) {
				assert_int_equal(fb_shamir_share_unpack(e + 8,
				    &cfg->s_out[cfg->s_out_count++]), FB_OK);
			}
		}
		/* Asked to sign another set (an owner flipped to dropped):
		 * the worker refuses; it signs one set per round. */
		if (i == 0) {
			uint8_t *flip = malloc(n);
			uint8_t again[FB_SECAGG_CONFIRM_LEN];
			memcpy(flip, inc, n);
			flip[n - 1] = !flip[n - 1];
			flip[0] = 1;
			assert_int_equal(fb_secagg_worker_confirm(
			                     w[i], ids[i], flip, n, again),
			    FB_EPROTO);
			/* the same set again: the same confirmation */
			assert_int_equal(fb_secagg_worker_confirm(
			                     w[i], ids[i], inc, n, again),
			    FB_OK);
			assert_memory_equal(again, conf[i], sizeof(again));
			free(flip);
		}
	}
	assert_int_equal(fb_secagg_server_finish(srv), cfg->expect_finish);
	if (cfg->expect_finish == FB_OK) {
		uint64_t half = len / 3 + 1;
		assert_int_equal(fb_secagg_server_unmask_chunk(srv, sum, 0,
		    half), FB_OK);
		assert_int_equal(fb_secagg_server_unmask_chunk(srv, sum + half,
		    half, len - half), FB_OK);
		fb_decode_chunk(&ex, sum, cfg->count, got);
		got[cfg->count] = fb_decode_value(&ew, sum[cfg->count]);
		for (uint64_t c = 0; c < cfg->count; c++) {
			assert_true(fabs(got[c] - want[c]) <=
			    fb_encoding_bound(&ex, included));
		}
		assert_true(fabs(got[cfg->count] - want[cfg->count]) <=
		    fb_encoding_bound(&ew, included));
	} else {
		assert_int_equal(fb_secagg_server_unmask_chunk(srv, sum, 0,
		    len), FB_EINVAL);
	}
	for (uint32_t i = 0; i < n; i++) {
		fb_secagg_worker_free(w[i]);
		fb_identity_free(ids[i]);
	}
	fb_secagg_server_free(srv);
	free(ids);
	free(pks);
	free(w);
	free(adv);
	free(buf);
	free(inc);
	free(confirmed);
	free(conf);
	free(x);
	free(want);
	free(got);
	free(y);
	free(sum);
}

static void
test_round_complete_graph_two_dropouts(void **state)
{
	/* n = 5, t = 3, classic SecAgg: worker 1 drops after the shares,
	 * before its masked input; worker 3 after sending it. */
	uint8_t drop[5] = { 0, DROP_BEFORE_INPUT, 0, DROP_AFTER_INPUT, 0 };
	sim_cfg cfg = { .n = 5, .degree = 4, .t = 3, .count = 1000,
		.drop = drop, .expect_finish = FB_OK };

	(void)state;
	run_round(&cfg);
	cfg.drop = NULL; /* and with nobody dropping */
	run_round(&cfg);
}

static void
test_round_auto_graph_two_dropouts(void **state)
{
	/* With c = 3 the auto degree at n = 5 is the complete graph; a
	 * sparse auto graph (n = 40, k = 16) loses several workers. */
	uint8_t drop5[5] = { DROP_AFTER_INPUT, 0, 0, 0, DROP_BEFORE_INPUT };
	uint8_t drop40[40] = { 0 };
	sim_cfg cfg = { .n = 5, .degree = FB_SECAGG_DEGREE_AUTO, .t = 3,
		.count = 777, .drop = drop5, .expect_finish = FB_OK };

	(void)state;
	run_round(&cfg);
	drop40[3] = drop40[17] = DROP_BEFORE_INPUT;
	drop40[8] = drop40[30] = DROP_AFTER_INPUT;
	drop40[21] = DROP_ADVERT;
	cfg = (sim_cfg){ .n = 40, .degree = FB_SECAGG_DEGREE_AUTO, .t = 8,
		.count = 300, .drop = drop40, .expect_finish = FB_OK };
	run_round(&cfg);
}

static void
test_round_sparse_graph(void **state)
{
	/* k = 6, t = 4 of 7: each neighbourhood loses at most 3. */
	uint8_t drop[24] = { 0 };
	sim_cfg cfg = { .n = 24, .degree = 6, .t = 4, .count = 500,
		.drop = drop, .expect_finish = FB_OK };

	(void)state;
	drop[5] = DROP_BEFORE_INPUT;
	drop[11] = DROP_AFTER_INPUT;
	run_round(&cfg);
}

static void
test_round_below_threshold_refuses(void **state)
{
	/* Three included, one of them gone before unmasking: two
	 * confirmations each, fewer than t = 3, so nobody reveals. */
	uint8_t drop[5] = { 0, DROP_BEFORE_INPUT, DROP_BEFORE_INPUT,
		DROP_AFTER_INPUT, 0 };
	/* Two included: the workers refuse to reveal at all. */
	uint8_t drop2[5] = { 0, DROP_BEFORE_INPUT, DROP_BEFORE_INPUT,
		DROP_BEFORE_INPUT, 0 };
	sim_cfg cfg = { .n = 5, .degree = 4, .t = 3, .count = 100,
		.drop = drop, .expect_finish = FB_ERANGE };

	(void)state;
	run_round(&cfg);
	cfg.drop = drop2;
	run_round(&cfg);
}

/* chi_square of the 256 byte values of `len` bytes against uniform. */
static double
chi_square(const uint8_t *b, size_t len)
{
	double counts[256] = { 0 }, chi = 0, e = len / 256.0;

	for (size_t i = 0; i < len; i++) {
		counts[b[i]]++;
	}
	for (int v = 0; v < 256; v++) {
		chi += (counts[v] - e) * (counts[v] - e) / e;
	}
	return chi;
}

static void
test_masked_input_looks_uniform(void **state)
{
	/* Chi-square with 255 degrees of freedom: 377.2 is its 1 - 1e-6
	 * quantile (Wilson-Hilferty), so a uniform vector fails with
	 * probability 1e-6; the encoded input fails by far. */
	enum { COUNT = 65535 };
	uint32_t *masked = calloc(COUNT + 1, sizeof(uint32_t));
	uint32_t *encoded = calloc(COUNT + 1, sizeof(uint32_t));
	uint64_t same = 0;
	sim_cfg cfg = { .n = 5, .degree = 4, .t = 3, .count = COUNT,
		.expect_finish = FB_OK, .masked_out = masked,
		.encoded_out = encoded };
	double chi_m, chi_e;

	(void)state;
	run_round(&cfg);
	chi_m = chi_square((const uint8_t *)masked, (COUNT + 1) * 4);
	chi_e = chi_square((const uint8_t *)encoded, (COUNT + 1) * 4);
	for (uint64_t c = 0; c <= COUNT; c++) {
		same += masked[c] == encoded[c];
	}
	assert_true(chi_m < 377.2);
	assert_true(chi_e > 377.2);
	assert_true(same < 4);
	free(masked);
	free(encoded);
}

static void
test_steps_refuse_wrong_order_and_bad_input(void **state)
{
	fb_secagg_params p;
	fb_secagg_worker *w;
	fb_secagg_server *s;
	fb_identity *id;
	fb_pubkey pk;
	uint8_t adv[FB_SECAGG_ADV_LEN], out[4096], inc[5] = { 1, 1, 1, 1, 1 };
	uint8_t seed[32] = { 1 };
	size_t len;
	uint32_t v[4] = { 0 };

	(void)state;
	memset(&p, 0, sizeof(p));
	p.round = 2;
	p.n = 5;
	p.degree = 4;
	p.threshold = 6; /* above k + 1 */
	assert_int_equal(fb_secagg_worker_alloc(&p, 0, &w), FB_EINVAL);
	p.threshold = 1;
	assert_int_equal(fb_secagg_server_alloc(&p, &s), FB_EINVAL);
	p.threshold = 3;
	assert_int_equal(fb_secagg_worker_alloc(&p, 5, &w), FB_EINVAL);
	assert_int_equal(fb_secagg_worker_alloc(&p, 0, &w), FB_OK);
	assert_int_equal(fb_secagg_server_alloc(&p, &s), FB_OK);
	assert_int_equal(fb_identity_alloc_from_seed(seed, NULL, &id), FB_OK);
	fb_identity_pubkey(id, &pk);
	/* Masking or revealing before the shares: refused. */
	assert_int_equal(fb_secagg_worker_mask_chunk(w, v, 0, 4), FB_EINVAL);
	assert_int_equal(fb_secagg_worker_mask_begin(w), FB_EINVAL);
	assert_int_equal(
	    fb_secagg_worker_reveal(w, out, sizeof(out), &len), FB_EINVAL);
	assert_int_equal(
	    fb_secagg_worker_confirm(w, id, inc, 5, out), FB_EINVAL);
	/* Nobody else advertised: too few for t = 3. */
	assert_int_equal(fb_secagg_worker_make_shares(w, out, sizeof(out),
	    &len), FB_ERANGE);
	/* Adverts: wrong length, wrong round, tampered. */
	assert_int_equal(fb_secagg_worker_advertise(w, id, adv), FB_OK);
	assert_int_equal(fb_secagg_server_add_advert(s, 0, &pk, adv, 10),
	    FB_EPROTO);
	assert_int_equal(fb_secagg_server_add_advert(s, 1, &pk, adv,
	    sizeof(adv)), FB_EPROTO); /* index 0 claimed as 1 */
	adv[40] ^= 1; /* the session's c_pk: signed */
	assert_int_equal(fb_secagg_server_add_advert(s, 0, &pk, adv,
	    sizeof(adv)), FB_EAUTH);
	adv[40] ^= 1;
	adv[8] ^= 1; /* the run: signed */
	assert_int_equal(fb_secagg_server_add_advert(s, 0, &pk, adv,
	    sizeof(adv)), FB_EAUTH);
	adv[8] ^= 1;
	assert_int_equal(fb_secagg_server_add_advert(s, 0, &pk, adv,
	    sizeof(adv)), FB_OK);
	assert_int_equal(fb_secagg_server_add_advert(s, 0, &pk, adv,
	    sizeof(adv)), FB_EPROTO); /* twice */
	p.round = 3;
	{
		fb_secagg_server *s3;
		assert_int_equal(fb_secagg_server_alloc(&p, &s3), FB_OK);
		assert_int_equal(fb_secagg_server_add_advert(s3, 0, &pk, adv,
		    sizeof(adv)), FB_ESTALE);
		fb_secagg_server_free(s3);
	}
	/* Server: shares from a worker without an advert, inclusion of a
	 * worker without shares, finishing with nobody included. */
	assert_int_equal(fb_secagg_server_add_shares(s, 2, out, 0), FB_EPROTO);
	assert_int_equal(fb_secagg_server_set_included(s, 0), FB_EINVAL);
	assert_int_equal(fb_secagg_server_finish(s), FB_ERANGE);
	fb_identity_free(id);
	fb_secagg_worker_free(w);
	fb_secagg_server_free(s);
}

/* ---- a malicious coordinator ------------------------------------------- */

/* Five workers on the complete graph (t = 3) up to their masks: identity
 * i signs worker i's advert unless signer[i] names another; every advert
 * is offered to every worker; *srv gets the server's view. */
typedef struct mal_round {
	fb_secagg_params p;
	fb_identity *ids[5];
	fb_pubkey pks[5];
	fb_secagg_worker *w[5];
	fb_secagg_server *srv;
	uint8_t adv[5][FB_SECAGG_ADV_LEN];
} mal_round;

static void
mal_setup(mal_round *r, const int *signer, fb_err *server_rc)
{
	uint8_t buf[5 * FB_SECAGG_SHARE_MSG_LEN];

	memset(r, 0, sizeof(*r));
	assert_int_equal(fb_run_id_random(&r->p.run), FB_OK);
	r->p.round = 4;
	r->p.n = 5;
	r->p.degree = 4;
	r->p.threshold = 3;
	randombytes_buf(r->p.graph_seed, 32);
	assert_int_equal(fb_secagg_server_alloc(&r->p, &r->srv), FB_OK);
	for (uint32_t i = 0; i < 5; i++) {
		uint8_t seed[32] = {(uint8_t)(i + 40), 0x77};
		assert_int_equal(
		    fb_identity_alloc_from_seed(seed, NULL, &r->ids[i]), FB_OK);
		fb_identity_pubkey(r->ids[i], &r->pks[i]);
		assert_int_equal(
		    fb_secagg_worker_alloc(&r->p, i, &r->w[i]), FB_OK);
	}
	for (uint32_t i = 0; i < 5; i++) {
		int sg = signer != NULL ? signer[i] : (int)i;
		/* worker i's keys, signed by identity sg: the advert is made
		 * by i's state, the signature redone with sg's key */
		assert_int_equal(
		    fb_secagg_worker_advertise(r->w[i], r->ids[i], r->adv[i]),
		    FB_OK);
		if (sg != (int)i) {
			assert_int_equal(
			    fb_secagg_advert_sign(r->ids[sg], r->adv[i]),
			    FB_OK);
		}
		server_rc[i] = fb_secagg_server_add_advert(
		    r->srv, i, &r->pks[sg], r->adv[i], FB_SECAGG_ADV_LEN);
	}
	(void)buf;
}

static void
mal_free(mal_round *r)
{
	for (uint32_t i = 0; i < 5; i++) {
		fb_secagg_worker_free(r->w[i]);
		fb_identity_free(r->ids[i]);
	}
	fb_secagg_server_free(r->srv);
}

/*
 * Adverts whose c or s key has small order (u = 0, of order 2, and u = 1,
 * of order 4: every X25519 with them is zero), signed by their owner: the
 * server refuses them, and so does every neighbour, which then holds no
 * advert of that slot (the honest advert after them is taken); worker
 * 0's own slot is checked the same.
 */
static void
test_small_order_keys_are_refused(void **state)
{
	static const uint8_t bad[2][32] = { { 0 }, { 1 } };
	fb_err src[5];
	mal_round r;
	uint8_t adv[FB_SECAGG_ADV_LEN];

	(void)state;
	mal_setup(&r, NULL, src);
	for (int i = 0; i < 4; i++) {
		const uint8_t *key = bad[i % 2];
		size_t at = i < 2 ? 28 : 60; /* c_pk, then s_pk */
		fb_secagg_server *s;

		memcpy(adv, r.adv[1], sizeof(adv));
		memcpy(adv + at, key, 32);
		assert_int_equal(fb_secagg_advert_sign(r.ids[1], adv), FB_OK);
		assert_int_equal(fb_secagg_server_alloc(&r.p, &s), FB_OK);
		assert_int_equal(fb_secagg_server_add_advert(s, 1, &r.pks[1],
		    adv, sizeof(adv)), FB_EAUTH);
		fb_secagg_server_free(s);
		assert_int_equal(fb_secagg_worker_add_advert(r.w[0], &r.pks[1],
		    adv, sizeof(adv)), FB_EAUTH);
		/* worker 0's slot: at a neighbour, and at itself */
		memcpy(adv, r.adv[0], sizeof(adv));
		memcpy(adv + at, key, 32);
		assert_int_equal(fb_secagg_advert_sign(r.ids[0], adv), FB_OK);
		assert_int_equal(fb_secagg_worker_add_advert(r.w[2], &r.pks[0],
		    adv, sizeof(adv)), FB_EAUTH);
		assert_int_equal(fb_secagg_worker_add_advert(r.w[0], &r.pks[0],
		    adv, sizeof(adv)), FB_EAUTH);
	}
	/* the refused adverts left nothing behind: the honest one is taken */
	assert_int_equal(fb_secagg_worker_add_advert(r.w[0], &r.pks[1],
	    r.adv[1], FB_SECAGG_ADV_LEN), FB_OK);
	assert_int_equal(fb_secagg_worker_add_advert(r.w[0], &r.pks[1],
	    r.adv[1], FB_SECAGG_ADV_LEN), FB_EPROTO); /* now it is a twice */
	mal_free(&r);
}

/*
 * One identity key (the coordinator's accomplice, worker 4) signs the
 * adverts of slots 3 and 4: the server side refuses the second, and so
 * does each worker offered both, keeping the first; a worker is refused
 * its own key for a neighbour too. With two of its four neighbours so
 * refused, a worker still shares (t = 3 of 3); with three it cannot.
 */
static void
test_one_identity_signs_one_slot(void **state)
{
	const int signer[5] = {0, 1, 2, 4, 4};
	fb_err src[5];
	mal_round r;
	uint8_t out[5 * FB_SECAGG_SHARE_MSG_LEN];
	size_t len;

	(void)state;
	mal_setup(&r, signer, src);
	for (uint32_t i = 0; i < 4; i++) {
		assert_int_equal(src[i], FB_OK);
	}
	assert_int_equal(src[4], FB_EAUTH); /* key 4 already signs slot 3 */
	/* worker 0 takes 1, 2 and slot 3 under key 4, then refuses slot 4
	 * under the same key */
	for (uint32_t j = 1; j < 4; j++) {
		assert_int_equal(
		    fb_secagg_worker_add_advert(
		        r.w[0], &r.pks[signer[j]], r.adv[j], FB_SECAGG_ADV_LEN),
		    FB_OK);
	}
	assert_int_equal(fb_secagg_worker_add_advert(
	                     r.w[0], &r.pks[4], r.adv[4], FB_SECAGG_ADV_LEN),
	    FB_EAUTH);
	assert_int_equal(
	    fb_secagg_worker_make_shares(r.w[0], out, sizeof(out), &len),
	    FB_OK);
	assert_int_equal(len, 3 * FB_SECAGG_SHARE_MSG_LEN);
	/* worker 1 is offered a neighbour's advert under its own key (slot
	 * 2's keys re-signed by identity 1) and 3 and 4 under key 4 */
	assert_int_equal(fb_secagg_advert_sign(r.ids[1], r.adv[2]),
	    FB_OK);
	assert_int_equal(fb_secagg_worker_add_advert(
	                     r.w[1], &r.pks[1], r.adv[2], FB_SECAGG_ADV_LEN),
	    FB_EAUTH);
	assert_int_equal(fb_secagg_worker_add_advert(
	                     r.w[1], &r.pks[0], r.adv[0], FB_SECAGG_ADV_LEN),
	    FB_OK);
	assert_int_equal(fb_secagg_worker_add_advert(
	                     r.w[1], &r.pks[4], r.adv[3], FB_SECAGG_ADV_LEN),
	    FB_OK);
	assert_int_equal(fb_secagg_worker_add_advert(
	                     r.w[1], &r.pks[4], r.adv[4], FB_SECAGG_ADV_LEN),
	    FB_EAUTH);
	assert_int_equal(
	    fb_secagg_worker_make_shares(r.w[1], out, sizeof(out), &len),
	    FB_OK); /* itself, 0 and 3: three of t = 3 */
	mal_free(&r);
}

/*
 * Three rounds of five workers in one session each (and one cache on the
 * server side): the session's c key and advert signature are the same
 * every round, each peer's signature is verified once (the caches do not
 * grow after the first round), and each round's s key is new. Worker 2
 * drops before its input in round 7, so its s_sk of round 7 is revealed:
 * rebuilt here from the revealed shares, it is the key of round 7's
 * advert and of no later round's, and rounds 8 and 9 (2 back in, then 4
 * dropping) still sum right: the next round needs no new agreement.
 */
static void
test_session_keys_across_rounds(void **state)
{
	enum { N = 5 };
	fb_secagg_keys *keys[N], *seen;
	uint8_t adv[3][N][FB_SECAGG_ADV_LEN];
	uint8_t drop7[N] = {0, 0, DROP_BEFORE_INPUT, 0, 0};
	uint8_t drop9[N] = {0, 0, 0, 0, DROP_AFTER_INPUT};
	fb_shamir_share sh[N];
	uint8_t s_sk[32], s_pk[32];
	fb_run_id run;
	uint32_t seen_after[3][N + 1];

	(void)state;
	assert_int_equal(fb_run_id_random(&run), FB_OK);
	for (uint32_t i = 0; i < N; i++) {
		assert_int_equal(fb_secagg_keys_alloc(&keys[i]), FB_OK);
	}
	assert_int_equal(fb_secagg_keys_alloc(&seen), FB_OK);
	for (uint32_t r = 0; r < 3; r++) {
		sim_cfg cfg = {.n = N, .degree = 4, .t = 3, .count = 300,
		    .expect_finish = FB_OK, .round = 7 + r, .run = &run,
		    .keys = keys, .seen = seen, .adv_out = adv[r],
		    .drop = r == 0 ? drop7 : r == 2 ? drop9 : NULL,
		    .s_out = r == 0 ? sh : NULL, .drop_owner = 2};
		run_round(&cfg);
		if (r == 0) {
			assert_true(cfg.s_out_count >= 3);
			assert_int_equal(fb_shamir_combine(sh, cfg.s_out_count,
			    3, N, s_sk), FB_OK);
		}
		for (uint32_t i = 0; i < N; i++) {
			seen_after[r][i] = fb_secagg_keys_seen(keys[i]);
		}
		seen_after[r][N] = fb_secagg_keys_seen(seen);
	}
	for (uint32_t i = 0; i < N; i++) {
		/* every worker took every advert: all five signatures */
		assert_int_equal(seen_after[0][i], N);
		assert_int_equal(seen_after[2][i], N);
		for (uint32_t r = 1; r < 3; r++) {
			/* c and its signature: the session's */
			assert_memory_equal(adv[r][i] + 28, adv[0][i] + 28, 32);
			assert_memory_equal(adv[r][i] + 124, adv[0][i] + 124, 64);
			/* s: the round's */
			assert_memory_not_equal(adv[r][i] + 60, adv[0][i] + 60,
			    32);
		}
	}
	assert_int_equal(seen_after[0][N], N);
	assert_int_equal(seen_after[2][N], N);
	/* what round 7's reveal gave: 2's s key of round 7, not of 8 or 9 */
	assert_int_equal(crypto_scalarmult_base(s_pk, s_sk), 0);
	assert_memory_equal(s_pk, adv[0][2] + 60, 32);
	assert_memory_not_equal(s_pk, adv[1][2] + 60, 32);
	assert_memory_not_equal(s_pk, adv[2][2] + 60, 32);
	sodium_memzero(s_sk, sizeof(s_sk));
	for (uint32_t i = 0; i < N; i++) {
		fb_secagg_keys_free(keys[i]);
	}
	fb_secagg_keys_free(seen);
}

/*
 * The coordinator relays worker 1's advert to worker 0 with another s
 * key (its own: outside the session signature, so the advert is taken):
 * the shares between 0 and 1 then open at neither end, so neither holds
 * shares of the other nor masks with the pair's seed; the other pairs
 * are untouched.
 */
static void
test_replaced_s_key_shares_do_not_open(void **state)
{
	fb_err src[5];
	mal_round r;
	uint8_t fake[FB_SECAGG_ADV_LEN], sk[32];
	uint8_t out[5][5 * FB_SECAGG_SHARE_MSG_LEN];
	size_t len[5];

	(void)state;
	mal_setup(&r, NULL, src);
	memcpy(fake, r.adv[1], sizeof(fake));
	crypto_box_keypair(fake + 60, sk); /* the coordinator's s key */
	for (uint32_t i = 0; i < 5; i++) {
		for (uint32_t j = 0; j < 5; j++) {
			const uint8_t *a = i == 0 && j == 1 ? fake : r.adv[j];
			assert_int_equal(fb_secagg_worker_add_advert(r.w[i],
			    &r.pks[j], a, FB_SECAGG_ADV_LEN), FB_OK);
		}
	}
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(fb_secagg_worker_make_shares(r.w[i], out[i],
		    sizeof(out[i]), &len[i]), FB_OK);
		assert_int_equal(len[i], 4 * FB_SECAGG_SHARE_MSG_LEN);
	}
	for (uint32_t i = 0; i < 5; i++) {
		for (size_t o = 0; o < len[i]; o += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from, to;
			bool cut;
			assert_int_equal(fb_secagg_share_msg_peek(out[i] + o,
			    FB_SECAGG_SHARE_MSG_LEN, &from, &to), FB_OK);
			cut = (from == 0 && to == 1) || (from == 1 && to == 0);
			assert_int_equal(fb_secagg_worker_add_share(r.w[to],
			    out[i] + o, FB_SECAGG_SHARE_MSG_LEN),
			    cut ? FB_EAUTH : FB_OK);
		}
	}
	/* 0 and 1 each still hold 3 of 4 neighbours' shares: t = 3 holds */
	assert_int_equal(fb_secagg_worker_mask_begin(r.w[0]), FB_OK);
	assert_int_equal(fb_secagg_worker_mask_begin(r.w[1]), FB_OK);
	sodium_memzero(sk, sizeof(sk));
	mal_free(&r);
}

/*
 * The coordinator tells workers 0, 1 and 2 that all five inputs are in,
 * and workers 3 and 4 that worker 0's is not (so that 0's self-mask seed
 * and its mask key would both come out). Each signs what it was told; a
 * confirmation of the other set does not count; 3 and 4 hold two
 * confirmations of theirs, fewer than t = 3, and refuse to reveal. The
 * server side takes only confirmations of its own set.
 */
static void
test_conflicting_included_sets_are_caught(void **state)
{
	const uint8_t all[5] = {1, 1, 1, 1, 1};
	const uint8_t lie[5] = {0, 1, 1, 1, 1};
	uint8_t conf[5][FB_SECAGG_CONFIRM_LEN];
	uint8_t buf[5 * FB_SECAGG_SHARE_MSG_LEN];
	uint8_t
	    out[FB_SECAGG_REVEAL_HEADER_LEN + 5 * FB_SECAGG_REVEAL_ENTRY_LEN];
	fb_err src[5];
	mal_round r;
	size_t len;

	(void)state;
	mal_setup(&r, NULL, src);
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(src[i], FB_OK);
		for (uint32_t j = 0; j < 5; j++) {
			assert_int_equal(
			    fb_secagg_worker_add_advert(
			        r.w[i], &r.pks[j], r.adv[j], FB_SECAGG_ADV_LEN),
			    FB_OK);
		}
	}
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(fb_secagg_worker_make_shares(
		                     r.w[i], buf, sizeof(buf), &len),
		    FB_OK);
		assert_int_equal(
		    fb_secagg_server_add_shares(r.srv, i, buf, len), FB_OK);
		for (size_t o = 0; o < len; o += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from, to;
			assert_int_equal(
			    fb_secagg_share_msg_peek(
			        buf + o, FB_SECAGG_SHARE_MSG_LEN, &from, &to),
			    FB_OK);
			assert_int_equal(fb_secagg_worker_add_share(r.w[to],
			                     buf + o, FB_SECAGG_SHARE_MSG_LEN),
			    FB_OK);
		}
	}
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(fb_secagg_worker_mask_begin(r.w[i]), FB_OK);
		assert_int_equal(
		    fb_secagg_server_set_included(r.srv, i), FB_OK);
	}
	/* revealing before confirming: refused */
	assert_int_equal(
	    fb_secagg_worker_reveal(r.w[1], out, sizeof(out), &len), FB_EINVAL);
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(fb_secagg_worker_confirm(r.w[i], r.ids[i],
		                     i < 3 ? all : lie, 5, conf[i]),
		    FB_OK);
	}
	/* 0 is not in `lie`: it cannot have confirmed it, whoever relays */
	assert_int_equal(
	    fb_secagg_worker_confirm(r.w[0], r.ids[0], lie, 5, out), FB_EPROTO);
	/* server: the truthful set's confirmations count, the other's not,
	 * nor a confirmation under another slot's key or twice */
	assert_int_equal(fb_secagg_server_add_confirm(
	                     r.srv, 3, conf[3], FB_SECAGG_CONFIRM_LEN),
	    FB_EAUTH);
	assert_int_equal(fb_secagg_server_add_confirm(
	                     r.srv, 1, conf[2], FB_SECAGG_CONFIRM_LEN),
	    FB_EPROTO);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(fb_secagg_server_add_confirm(
		                     r.srv, i, conf[i], FB_SECAGG_CONFIRM_LEN),
		    FB_OK);
	}
	assert_int_equal(fb_secagg_server_add_confirm(
	                     r.srv, 1, conf[1], FB_SECAGG_CONFIRM_LEN),
	    FB_EPROTO);
	/* every worker is handed every other's confirmation */
	for (uint32_t i = 0; i < 5; i++) {
		for (uint32_t j = 0; j < 5; j++) {
			fb_err want = (i < 3) == (j < 3) ? FB_OK : FB_EAUTH;
			if (j == i) {
				continue;
			}
			if (i >= 3 && j == 0) {
				want = FB_EPROTO; /* not in the set it signed */
			}
			assert_int_equal(fb_secagg_worker_add_confirm(r.w[i],
			                     conf[j], FB_SECAGG_CONFIRM_LEN),
			    want);
		}
		assert_int_equal(
		    fb_secagg_worker_confirmations(r.w[i]), i < 3 ? 3 : 2);
	}
	/* a confirmation counts once */
	assert_int_equal(fb_secagg_worker_add_confirm(
	                     r.w[2], conf[1], FB_SECAGG_CONFIRM_LEN),
	    FB_EPROTO);
	/* 0, 1, 2 reveal for the set they signed; 3 and 4 refuse */
	for (uint32_t i = 0; i < 5; i++) {
		fb_err rc =
		    fb_secagg_worker_reveal(r.w[i], out, sizeof(out), &len);
		assert_int_equal(rc, i < 3 ? FB_OK : FB_ERANGE);
		if (rc == FB_OK) {
			assert_int_equal(
			    fb_secagg_server_add_reveal(r.srv, i, out, len),
			    FB_OK);
		} else {
			assert_int_equal(len, 0);
		}
	}
	/* the server refuses a reveal from a worker that did not confirm */
	assert_int_equal(fb_secagg_server_add_reveal(
	                     r.srv, 3, out, FB_SECAGG_REVEAL_HEADER_LEN),
	    FB_EPROTO);
	mal_free(&r);
}

/* A confirmation's bytes: wrong length, kind, run, round, n, a flipped
 * signature bit, and the signer outside the round are each refused. */
static void
test_confirmation_refuses_bad_bytes(void **state)
{
	const uint8_t all[5] = {1, 1, 1, 1, 1};
	uint8_t c0[FB_SECAGG_CONFIRM_LEN], bad[FB_SECAGG_CONFIRM_LEN];
	uint8_t buf[5 * FB_SECAGG_SHARE_MSG_LEN];
	static const struct {
		uint32_t off;
		uint8_t x;
		fb_err want;
	} flips[] = {
	    {1, 1, FB_EPROTO},  /* kind */
	    {2, 1, FB_EPROTO},  /* reserved */
	    {9, 1, FB_EAUTH},   /* run */
	    {20, 1, FB_ESTALE}, /* round */
	    {24, 7, FB_EPROTO}, /* signer 7 of 5 */
	    {28, 1, FB_EPROTO}, /* n */
	    {50, 1, FB_EAUTH},  /* the set's hash */
	    {100, 1, FB_EAUTH}, /* signature */
	};
	fb_err src[5];
	mal_round r;
	size_t len;

	(void)state;
	mal_setup(&r, NULL, src);
	for (uint32_t i = 0; i < 5; i++) {
		for (uint32_t j = 0; j < 5; j++) {
			assert_int_equal(
			    fb_secagg_worker_add_advert(
			        r.w[i], &r.pks[j], r.adv[j], FB_SECAGG_ADV_LEN),
			    FB_OK);
		}
	}
	for (uint32_t i = 0; i < 5; i++) {
		assert_int_equal(fb_secagg_worker_make_shares(
		                     r.w[i], buf, sizeof(buf), &len),
		    FB_OK);
		for (size_t o = 0; o < len; o += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from, to;
			assert_int_equal(
			    fb_secagg_share_msg_peek(
			        buf + o, FB_SECAGG_SHARE_MSG_LEN, &from, &to),
			    FB_OK);
			assert_int_equal(fb_secagg_worker_add_share(r.w[to],
			                     buf + o, FB_SECAGG_SHARE_MSG_LEN),
			    FB_OK);
		}
	}
	for (uint32_t i = 0; i < 2; i++) {
		assert_int_equal(fb_secagg_worker_mask_begin(r.w[i]), FB_OK);
	}
	assert_int_equal(
	    fb_secagg_worker_confirm(r.w[0], r.ids[0], all, 5, c0), FB_OK);
	assert_int_equal(
	    fb_secagg_worker_confirm(r.w[1], r.ids[1], all, 5, bad), FB_OK);
	assert_int_equal(
	    fb_secagg_worker_add_confirm(r.w[1], c0, 127), FB_EPROTO);
	for (size_t k = 0; k < sizeof(flips) / sizeof(flips[0]); k++) {
		memcpy(bad, c0, sizeof(bad));
		bad[flips[k].off] ^= flips[k].x;
		assert_int_equal(
		    fb_secagg_worker_add_confirm(r.w[1], bad, sizeof(bad)),
		    flips[k].want);
	}
	/* its own confirmation back: not a neighbour's */
	assert_int_equal(
	    fb_secagg_worker_confirm(r.w[1], r.ids[1], all, 5, bad), FB_OK);
	assert_int_equal(
	    fb_secagg_worker_add_confirm(r.w[1], bad, sizeof(bad)), FB_EPROTO);
	assert_int_equal(
	    fb_secagg_worker_add_confirm(r.w[1], c0, sizeof(c0)), FB_OK);
	assert_int_equal(fb_secagg_worker_confirmations(r.w[1]), 2);
	mal_free(&r);
}

/*
 * The coordinator's path: encoded inputs summed in an accumulator's ring
 * (mod 2^32, here in a 20-bit ring so that sign extension matters), then
 * fb_accum_set_secure_sum: the chunk means give the weighted mean within
 * the encoding's documented bound, negative values included, and a reset
 * returns the accumulator to plain use.
 */
static void
test_accum_reads_secure_sum(void **state)
{
	enum { N = 1000, K = 3 };
	static float x[K][N];
	static uint32_t q[N];
	const double w[K] = {0.25, 0.001, 0.7};
	fb_encoding e;
	fb_accum *a = NULL;
	uint32_t *ring;
	float mean[N];
	double W = 0, bound;

	(void)state;
	assert_int_equal(fb_encoding_init(&e, 20, K, 2.0, 1.0), FB_OK);
	assert_int_equal(fb_accum_alloc(N, 300, 16.0, &a), FB_OK);
	ring = fb_accum_ring(a);
	for (int k = 0; k < K; k++) {
		for (int j = 0; j < N; j++) {
			x[k][j] = (float)sin(0.01 * j * (k + 1)) * 1.9f - 0.3f;
		}
		assert_int_equal(fb_encode_chunk(&e, x[k], N, w[k], 0, 99 + k, q,
		                     NULL), FB_OK);
		for (int j = 0; j < N; j++) {
			/* plus a mask-like multiple of 2^20 that the ring drops */
			ring[j] += q[j] + ((uint32_t)(j * 2654435761u) << 20);
		}
		W += w[k];
	}
	assert_int_equal(fb_accum_set_secure_sum(a, &e, 0.0), FB_EINVAL);
	assert_int_equal(fb_accum_set_secure_sum(a, &e, W), FB_OK);
	accum_mean(a, mean);
	bound = fb_encoding_bound(&e, K) / W + 1e-6;
	for (int j = 0; j < N; j++) {
		double exact = 0;
		for (int k = 0; k < K; k++) {
			double v = x[k][j];
			exact += w[k] * (v < -2.0 ? -2.0 : v); /* clip 2 */
		}
		exact /= W;
		assert_true(fabs(mean[j] - exact) <= bound);
	}
	assert_true(mean[0] < 0); /* sign extension from 20 bits */
	fb_accum_reset(a);
	assert_int_equal(fb_accum_add(a, 0, x[0], 1.0, NULL), FB_OK);
	accum_mean(a, mean);
	assert_true(fabs(mean[5] - x[0][5]) < 1e-6);
	fb_accum_free(a);
}

/* ---- a round set up during the previous one ----------------------------- */

/*
 * One round's instances, stepped by hand so that two rounds interleave the
 * way a coordinator that sets round r + 1 up while round r runs would run
 * them: the setup (adverts and shares) of r + 1 between r's masked inputs
 * and r's confirmations and reveals.
 */
#define AH_N 5
#define AH_T 3
#define AH_COUNT 300

typedef struct ahead_round {
	fb_secagg_params p;
	fb_secagg_server *srv;
	fb_secagg_worker *w[AH_N];
	uint8_t adv[AH_N][FB_SECAGG_ADV_LEN];
	uint8_t inc[AH_N];
	uint32_t sum[AH_COUNT];
	double want[AH_COUNT];
	uint32_t included;
} ahead_round;

static void
ahead_setup(ahead_round *r, const fb_run_id *run, uint32_t round,
    fb_identity *const *ids, const fb_pubkey *pks, const ahead_round *prev)
{
	uint8_t buf[AH_N * FB_SECAGG_SHARE_MSG_LEN];

	memset(r, 0, sizeof(*r));
	r->p.run = *run;
	r->p.round = round;
	r->p.n = AH_N;
	r->p.degree = AH_N - 1;
	r->p.threshold = AH_T;
	randombytes_buf(r->p.graph_seed, sizeof(r->p.graph_seed));
	assert_int_equal(fb_secagg_server_alloc(&r->p, &r->srv), FB_OK);
	for (uint32_t i = 0; i < AH_N; i++) {
		assert_int_equal(fb_secagg_worker_alloc(&r->p, i, &r->w[i]),
		    FB_OK);
		assert_int_equal(fb_secagg_worker_advertise(r->w[i], ids[i],
		    r->adv[i]), FB_OK);
	}
	for (uint32_t i = 0; prev != NULL && i < AH_N; i++) {
		/* Fresh keys: no c_pk, s_pk or b commitment of the previous
		 * round comes back, for any worker. */
		for (uint32_t j = 0; j < AH_N; j++) {
			assert_memory_not_equal(r->adv[i] + 28,
			    prev->adv[j] + 28, 32);
			assert_memory_not_equal(r->adv[i] + 60,
			    prev->adv[j] + 60, 32);
			assert_memory_not_equal(r->adv[i] + 92,
			    prev->adv[j] + 92, 32);
		}
		/* The previous round's advert (whose s_sk that round may
		 * reveal) is refused for this one, by the server and the
		 * neighbours: nobody masks with the old key again. */
		assert_int_equal(fb_secagg_server_add_advert(r->srv, i, &pks[i],
		    prev->adv[i], FB_SECAGG_ADV_LEN), FB_ESTALE);
		for (uint32_t j = 0; j < AH_N; j++) {
			if (j != i) {
				assert_int_equal(fb_secagg_worker_add_advert(
				    r->w[j], &pks[i], prev->adv[i],
				    FB_SECAGG_ADV_LEN), FB_ESTALE);
			}
		}
	}
	for (uint32_t i = 0; i < AH_N; i++) {
		assert_int_equal(fb_secagg_server_add_advert(r->srv, i, &pks[i],
		    r->adv[i], FB_SECAGG_ADV_LEN), FB_OK);
		for (uint32_t j = 0; j < AH_N; j++) {
			assert_int_equal(fb_secagg_worker_add_advert(r->w[j],
			    &pks[i], r->adv[i], FB_SECAGG_ADV_LEN), FB_OK);
		}
	}
	for (uint32_t i = 0; i < AH_N; i++) {
		size_t out_len;
		assert_int_equal(fb_secagg_worker_make_shares(r->w[i], buf,
		    sizeof(buf), &out_len), FB_OK);
		assert_int_equal(fb_secagg_server_add_shares(r->srv, i, buf,
		    out_len), FB_OK);
		for (size_t o = 0; o < out_len; o += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from, to;
			assert_int_equal(fb_secagg_share_msg_peek(buf + o,
			    FB_SECAGG_SHARE_MSG_LEN, &from, &to), FB_OK);
			if (prev != NULL) {
				/* nor do this round's shares open in the
				 * previous round's instances */
				assert_int_not_equal(fb_secagg_worker_add_share(
				    prev->w[to], buf + o,
				    FB_SECAGG_SHARE_MSG_LEN), FB_OK);
			}
			assert_int_equal(fb_secagg_worker_add_share(r->w[to],
			    buf + o, FB_SECAGG_SHARE_MSG_LEN), FB_OK);
		}
	}
}

/* Masked inputs of the workers that do not drop (drop[i] != 0: dropped
 * after the shares, before its input went up). */
static void
ahead_inputs(ahead_round *r, const uint8_t *drop)
{
	fb_encoding ex;
	float x[AH_COUNT];
	uint32_t y[AH_COUNT];

	assert_int_equal(fb_encoding_init(&ex, 32, AH_N, 2.0, 1.0), FB_OK);
	for (uint32_t i = 0; i < AH_N; i++) {
		double wi = (i + 1.0) / (AH_N + 1.0);
		assert_int_equal(fb_secagg_worker_mask_begin(r->w[i]), FB_OK);
		if (drop[i]) {
			continue;
		}
		for (uint32_t c = 0; c < AH_COUNT; c++) {
			x[c] = (float)(1.5 * cos(0.11 * c * (i + 1) +
			    r->p.round));
		}
		assert_int_equal(fb_encode_chunk(&ex, x, AH_COUNT, wi, 0,
		    77 + i + r->p.round, y, NULL), FB_OK);
		assert_int_equal(fb_secagg_worker_mask_chunk(r->w[i], y, 0,
		    AH_COUNT), FB_OK);
		for (uint32_t c = 0; c < AH_COUNT; c++) {
			r->sum[c] += y[c];
			r->want[c] += wi * fmax(-2.0, fmin(2.0, (double)x[c]));
		}
		assert_int_equal(fb_secagg_server_set_included(r->srv, i),
		    FB_OK);
		r->included++;
	}
}

/* Confirmations, reveals, unmasking: the sum is the included inputs'. */
static void
ahead_finish(ahead_round *r, fb_identity *const *ids)
{
	uint8_t conf[AH_N][FB_SECAGG_CONFIRM_LEN];
	uint8_t buf[FB_SECAGG_REVEAL_HEADER_LEN +
	    AH_N * FB_SECAGG_REVEAL_ENTRY_LEN];
	double got[AH_COUNT];
	fb_encoding ex;

	assert_int_equal(fb_encoding_init(&ex, 32, AH_N, 2.0, 1.0), FB_OK);
	fb_secagg_server_included(r->srv, r->inc);
	for (uint32_t i = 0; i < AH_N; i++) {
		if (!r->inc[i]) {
			continue;
		}
		assert_int_equal(fb_secagg_worker_confirm(r->w[i], ids[i],
		    r->inc, AH_N, conf[i]), FB_OK);
		assert_int_equal(fb_secagg_server_add_confirm(r->srv, i,
		    conf[i], FB_SECAGG_CONFIRM_LEN), FB_OK);
	}
	for (uint32_t i = 0; i < AH_N; i++) {
		for (uint32_t j = 0; r->inc[i] && j < AH_N; j++) {
			if (j != i && r->inc[j]) {
				assert_int_equal(fb_secagg_worker_add_confirm(
				    r->w[i], conf[j], FB_SECAGG_CONFIRM_LEN),
				    FB_OK);
			}
		}
	}
	for (uint32_t i = 0; i < AH_N; i++) {
		size_t out_len;
		if (!r->inc[i]) {
			continue;
		}
		assert_int_equal(fb_secagg_worker_reveal(r->w[i], buf,
		    sizeof(buf), &out_len), FB_OK);
		assert_int_equal(fb_secagg_server_add_reveal(r->srv, i, buf,
		    out_len), FB_OK);
	}
	assert_int_equal(fb_secagg_server_finish(r->srv), FB_OK);
	assert_int_equal(fb_secagg_server_unmask_chunk(r->srv, r->sum, 0,
	    AH_COUNT), FB_OK);
	fb_decode_chunk(&ex, r->sum, AH_COUNT, got);
	for (uint32_t c = 0; c < AH_COUNT; c++) {
		assert_true(fabs(got[c] - r->want[c]) <=
		    fb_encoding_bound(&ex, r->included));
	}
}

static void
ahead_free(ahead_round *r)
{
	for (uint32_t i = 0; i < AH_N; i++) {
		fb_secagg_worker_free(r->w[i]);
	}
	fb_secagg_server_free(r->srv);
}

static void
test_round_set_up_during_the_previous_one(void **state)
{
	fb_identity *ids[AH_N];
	fb_pubkey pks[AH_N];
	fb_run_id run;
	ahead_round *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	const uint8_t drop_a[AH_N] = {0, 1, 0, 0, 0}, none[AH_N] = {0};

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(fb_run_id_random(&run), FB_OK);
	for (uint32_t i = 0; i < AH_N; i++) {
		uint8_t seed[32] = {(uint8_t)i, 0xa4};
		assert_int_equal(fb_identity_alloc_from_seed(seed, NULL,
		    &ids[i]), FB_OK);
		fb_identity_pubkey(ids[i], &pks[i]);
	}
	/* Round 7: worker 1 drops after its shares went out, so round 7's
	 * unmasking reconstructs its s_sk. */
	ahead_setup(a, &run, 7, ids, pks, NULL);
	ahead_inputs(a, drop_a);
	/* Round 8's whole setup, worker 1 back, while round 7 is still to
	 * be confirmed and unmasked. */
	ahead_setup(b, &run, 8, ids, pks, a);
	ahead_finish(a, ids);
	assert_int_equal(a->included, AH_N - 1);
	assert_int_equal(a->inc[1], 0);
	/* Round 8 starts with its masks fixed (no advert, no share step
	 * left) and worker 1, whose round-7 s_sk the coordinator now
	 * holds, masks under its round-8 keys only: the sum is right. */
	ahead_inputs(b, none);
	ahead_finish(b, ids);
	assert_int_equal(b->included, AH_N);
	ahead_free(a);
	ahead_free(b);
	for (uint32_t i = 0; i < AH_N; i++) {
		fb_identity_free(ids[i]);
	}
	free(a);
	free(b);
}

/* The terms digest, against crypto.h's layout computed here byte by
 * byte; and each term, and each round parameter it covers, changes it. */
static void
test_terms_digest(void **state)
{
	fb_secagg_params p, q;
	fb_secagg_terms t = {.ring_bits = 32, .clip = 4.5,
	    .max_samples = 60000, .a_bound = 250.0, .max_staleness = 8};
	fb_secagg_terms u;
	uint8_t in[76], want[32];
	const char dom[] = "fedbox/secagg-terms/v1";

	(void)state;
	memset(&p, 0, sizeof(p));
	p.n = 5;
	p.degree = 4;
	p.threshold = 3;
	for (int i = 0; i < 32; i++) {
		p.graph_seed[i] = (uint8_t)(i * 7 + 1);
	}
	memset(in, 0, sizeof(in));
	in[0] = 5;
	in[4] = 4;
	in[8] = 3;
	memcpy(in + 12, p.graph_seed, 32);
	in[44] = 32;
	/* clip 4.5 = 0x4012000000000000 */
	in[48 + 6] = 0x12;
	in[48 + 7] = 0x40;
	in[56] = 0x60; /* 60000 = 0xea60 */
	in[57] = 0xea;
	/* a_bound 250.0 = 0x406f400000000000 */
	in[64 + 5] = 0x40;
	in[64 + 6] = 0x6f;
	in[64 + 7] = 0x40;
	in[72] = 8;
	{
		crypto_generichash_state st;
		crypto_generichash_init(&st, NULL, 0, 32);
		crypto_generichash_update(&st, (const uint8_t *)dom,
		    sizeof(dom) - 1);
		crypto_generichash_update(&st, in, sizeof(in));
		crypto_generichash_final(&st, want, 32);
	}
	fb_secagg_bind_terms(&p, &t);
	assert_memory_equal(p.terms, want, 32);
	for (int k = 0; k < 9; k++) {
		q = p;
		u = t;
		switch (k) {
		case 0: u.ring_bits = 31; break;
		case 1: u.clip = 4.25; break;
		case 2: u.max_samples = 60001; break;
		case 3: u.a_bound = 251.0; break;
		case 4: u.max_staleness = 9; break;
		case 5: q.n = 6; break;
		case 6: q.degree = 3; break;
		case 7: q.threshold = 2; break;
		default: q.graph_seed[31] ^= 1; break;
		}
		fb_secagg_bind_terms(&q, &u);
		assert_memory_not_equal(q.terms, want, 32);
	}
}

FB_TESTS = {
    {"shamir shares and secrets match the independent reference",
        test_shamir_vectors},
    {"any t shares reconstruct and t - 1 are refused", test_shamir_threshold},
    {"the terms digest: its layout, and every term in it",
        test_terms_digest},
    {"duplicate, out-of-range, non-canonical and extra corrupt shares "
     "are rejected",
        test_shamir_bad_indices},
    {"encoding picks a safe scale and refuses configs that could "
     "overflow",
        test_encoding_scale_and_overflow_check},
    {"encoding edge values decode within the quantisation bound",
        test_encoding_edges},
    {"masked sums wrap around the ring and still decode",
        test_encoding_ring_wraparound},
    {"stochastic rounding is unbiased and independent of chunking",
        test_encoding_stochastic_rounding_unbiased},
    {"the encoder's loop gives the formula one coordinate at a time",
        test_encoding_matches_the_formula},
    {"masks are the ChaCha20 keystream, streamable chunk by chunk",
        test_mask_matches_chacha20_and_streams},
    {"both ends of a pair derive the same seed", test_pair_seeds_agree},
    {"the neighbour graph is symmetric, regular and deterministic",
        test_graph_symmetric_regular_deterministic},
    {"five workers on the complete graph survive two dropouts",
        test_round_complete_graph_two_dropouts},
    {"the auto graph survives dropouts at 5 and 40 workers",
        test_round_auto_graph_two_dropouts},
    {"a sparse graph of 24 workers unmasks the survivors' sum",
        test_round_sparse_graph},
    {"below threshold the round refuses to unmask",
        test_round_below_threshold_refuses},
    {"a masked input looks uniform and differs from the encoded input",
        test_masked_input_looks_uniform},
    {"steps refuse the wrong order and bad adverts",
        test_steps_refuse_wrong_order_and_bad_input},
    {"adverts with keys of small order are refused",
        test_small_order_keys_are_refused},
    {"the accumulator reads an unmasked secure sum as the weighted mean",
        test_accum_reads_secure_sum},
    {"one identity key signs for one slot, at the workers and the server",
        test_one_identity_signs_one_slot},
    {"session keys across rounds: c and its signature kept, s new each "
     "round, a reveal's key of no later round",
        test_session_keys_across_rounds},
    {"a replaced s key in a relayed advert: the pair's shares open at "
     "neither end",
        test_replaced_s_key_shares_do_not_open},
    {"conflicting included sets are caught: the workers refuse to reveal",
        test_conflicting_included_sets_are_caught},
    {"a confirmation with bad bytes is refused",
        test_confirmation_refuses_bad_bytes},
    {"a round set up during the previous one: fresh keys, the old "
     "advert refused, both sums right",
        test_round_set_up_during_the_previous_one},
    {NULL, NULL},
};

FB_TEST_MAIN("secagg")
