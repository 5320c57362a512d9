/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shamir.c -- Shamir t-of-n secret sharing of 32-byte secrets over
 * GF(p), p = 2^61 - 1 (see crypto.h, "Secure aggregation", for the limb
 * layout and the error contract).
 *
 * Constant time where secrets are touched: field add, subtract and multiply
 * are branch-free (the Mersenne reduction folds the high bits in and
 * subtracts p under a mask), no table lookups. The only branches depend on
 * public data: the evaluation points x (Lagrange coefficients, whose
 * inverses use Fermat's little theorem with the fixed public exponent
 * p - 2), counts, and the single validity verdict at the end of
 * fb_shamir_combine.
 */
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto_impl.h"

#define P61 ((UINT64_C(1) << 61) - 1)

__extension__ typedef unsigned __int128 u128;

/* fe_norm maps a < 2p to a mod p without branches. */
static inline uint64_t
fe_norm(uint64_t a)
{
	uint64_t r = a - P61;
	uint64_t m = (uint64_t)0 - (r >> 63); /* all ones when a < p */
	return r + (P61 & m);
}

static inline uint64_t
fe_add(uint64_t a, uint64_t b)
{
	return fe_norm(a + b);
}

static inline uint64_t
fe_sub(uint64_t a, uint64_t b)
{
	return fe_norm(a + P61 - b);
}

static inline uint64_t
fe_mul(uint64_t a, uint64_t b)
{
	u128 z = (u128)a * b; /* < 2^122 */
	uint64_t lo = (uint64_t)z & P61;
	uint64_t hi = (uint64_t)(z >> 61); /* 2^61 == 1 (mod p) */
	return fe_norm(lo + hi);           /* lo + hi < 2p: see p^2 < 2^122 */
}

/* fe_inv returns a^(p-2) = a^-1 for a != 0 (public exponent). */
static uint64_t
fe_inv(uint64_t a)
{
	uint64_t e = P61 - 2;
	uint64_t r = 1;

	while (e != 0) {
		if (e & 1) {
			r = fe_mul(r, a);
		}
		a = fe_mul(a, a);
		e >>= 1;
	}
	return r;
}

/* Limb l of a secret: bytes [7l, 7l + 7) little-endian; limb 4: 28..32. */
static void
secret_to_limbs(const uint8_t s[FB_SHAMIR_SECRET_LEN],
    uint64_t limbs[FB_SHAMIR_LIMBS])
{
	for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
		int nb = l < FB_SHAMIR_LIMBS - 1 ? 7 : 4;
		uint64_t v = 0;
		for (int b = 0; b < nb; b++) {
			v |= (uint64_t)s[7 * l + b] << (8 * b);
		}
		limbs[l] = v;
	}
}

static void
limbs_to_secret(const uint64_t limbs[FB_SHAMIR_LIMBS],
    uint8_t s[FB_SHAMIR_SECRET_LEN])
{
	for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
		int nb = l < FB_SHAMIR_LIMBS - 1 ? 7 : 4;
		for (int b = 0; b < nb; b++) {
			s[7 * l + b] = (uint8_t)(limbs[l] >> (8 * b));
		}
	}
}

static fb_err
check_points(const uint32_t *xs, uint32_t count, uint32_t n)
{
	for (uint32_t i = 0; i < count; i++) {
		if (xs[i] == 0 || xs[i] > n) {
			return FB_EPROTO;
		}
		for (uint32_t j = 0; j < i; j++) {
			if (xs[i] == xs[j]) {
				return FB_EPROTO;
			}
		}
	}
	return FB_OK;
}

fb_err
fb_shamir_split_coeffs(const uint8_t secret[FB_SHAMIR_SECRET_LEN],
    uint32_t t, const uint32_t *xs, uint32_t count, const uint64_t *coeffs,
    fb_shamir_share *out)
{
	fb_err rc = FB_OK;
	uint64_t limbs[FB_SHAMIR_LIMBS];

	if (count > 0) {
		memset(out, 0, (size_t)count * sizeof(*out));
	}
	if (t == 0 || t > count || count > FB_SHAMIR_X_MAX) {
		return FB_EINVAL;
	}
	if (check_points(xs, count, FB_SHAMIR_X_MAX) != FB_OK) {
		return FB_EINVAL;
	}
	for (uint64_t i = 0; i < (uint64_t)(t - 1) * FB_SHAMIR_LIMBS; i++) {
		if (coeffs[i] >= P61) {
			return FB_EINVAL;
		}
	}
	secret_to_limbs(secret, limbs);
	for (uint32_t s = 0; s < count; s++) {
		uint64_t x = xs[s];
		out[s].x = xs[s];
		for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
			/* Horner from the top coefficient down to the secret. */
			const uint64_t *c = coeffs + (size_t)l * (t - 1);
			uint64_t y = 0;
			for (uint32_t d = t - 1; d >= 1; d--) {
				y = fe_add(fe_mul(y, x), c[d - 1]);
			}
			y = fe_add(fe_mul(y, x), limbs[l]);
			out[s].y[l] = y;
		}
	}
	fb_wipe(limbs, sizeof(limbs));
	return rc;
}

fb_err
fb_shamir_split(const uint8_t secret[FB_SHAMIR_SECRET_LEN], uint32_t t,
    const uint32_t *xs, uint32_t count, fb_shamir_share *out)
{
	fb_err rc = FB_OK;
	uint64_t *coeffs = NULL;
	size_t ncoef;

	if (count > 0) {
		memset(out, 0, (size_t)count * sizeof(*out));
	}
	if (t == 0 || t > count || count > FB_SHAMIR_X_MAX) {
		return FB_EINVAL;
	}
	if ((rc = fb_crypto_init()) != FB_OK) {
		return rc;
	}
	ncoef = (size_t)(t - 1) * FB_SHAMIR_LIMBS;
	coeffs = fb_secmem_alloc(ncoef * sizeof(*coeffs) + 8);
	if (coeffs == NULL) {
		return FB_ENOMEM;
	}
	for (size_t i = 0; i < ncoef; i++) {
		/* Uniform in GF(p): 61 random bits, redrawn on the one value
		 * that is not reduced (probability 2^-61; the draw is fresh
		 * randomness, not a function of the secret). */
		do {
			randombytes_buf(&coeffs[i], sizeof(coeffs[i]));
			coeffs[i] &= P61;
		} while (coeffs[i] == P61);
	}
	rc = fb_shamir_split_coeffs(secret, t, xs, count, coeffs, out);
	fb_secmem_free(coeffs);
	return rc;
}

/*
 * batch_inv replaces each of a[0..count) (all nonzero) by its inverse with
 * one field inversion (Montgomery's trick); `tmp` holds count elements.
 */
static void
batch_inv(uint64_t *a, uint32_t count, uint64_t *tmp)
{
	uint64_t acc = 1, inv;

	for (uint32_t i = 0; i < count; i++) {
		tmp[i] = acc;
		acc = fe_mul(acc, a[i]);
	}
	inv = fe_inv(acc);
	for (uint32_t i = count; i-- > 0;) {
		uint64_t ai = a[i];
		a[i] = fe_mul(inv, tmp[i]);
		inv = fe_mul(inv, ai);
	}
}

/*
 * bary_weights sets w_j = 1 / prod_{m != j} (x_j - x_m) over the points
 * xs[0..t) (distinct, nonzero): the barycentric weights. All public.
 */
static void
bary_weights(const uint32_t *xs, uint32_t t, uint64_t *w, uint64_t *tmp)
{
	for (uint32_t j = 0; j < t; j++) {
		uint64_t den = 1;
		for (uint32_t m = 0; m < t; m++) {
			if (m != j) {
				den = fe_mul(den, fe_sub(xs[j], xs[m]));
			}
		}
		w[j] = den;
	}
	batch_inv(w, t, tmp);
}

/*
 * lagrange_at computes the Lagrange basis values L_j(at) = l(at) w_j /
 * (at - x_j), l(at) = prod_m (at - x_m), for `at` not among xs[0..t).
 */
static void
lagrange_at(const uint32_t *xs, uint32_t t, const uint64_t *w, uint64_t at,
    uint64_t *lam, uint64_t *tmp)
{
	uint64_t ell = 1;

	for (uint32_t j = 0; j < t; j++) {
		lam[j] = fe_sub(at, xs[j]);
		ell = fe_mul(ell, lam[j]);
	}
	batch_inv(lam, t, tmp);
	for (uint32_t j = 0; j < t; j++) {
		lam[j] = fe_mul(fe_mul(lam[j], w[j]), ell);
	}
}

fb_err
fb_shamir_combine(const fb_shamir_share *shares, uint32_t count, uint32_t t,
    uint32_t n, uint8_t secret[FB_SHAMIR_SECRET_LEN])
{
	fb_err rc = FB_OK;
	uint32_t *xs = NULL;
	uint64_t *lam = NULL, *w, *tmp;
	uint64_t limbs[FB_SHAMIR_LIMBS] = { 0 };
	uint64_t bad = 0;

	memset(secret, 0, FB_SHAMIR_SECRET_LEN);
	if (t == 0 || n == 0 || n > FB_SHAMIR_X_MAX) {
		return FB_EINVAL;
	}
	if (count < t) {
		return FB_ERANGE;
	}
	/* Points and Lagrange coefficients are public: plain malloc. */
	xs = malloc((size_t)count * sizeof(*xs));
	lam = malloc((size_t)t * 3 * sizeof(*lam));
	if (xs == NULL || lam == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < count; i++) {
		xs[i] = shares[i].x;
		for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
			if (shares[i].y[l] >= P61) {
				rc = FB_EPROTO;
				goto out;
			}
		}
	}
	if ((rc = check_points(xs, count, n)) != FB_OK) {
		goto out;
	}
	w = lam + t;
	tmp = lam + 2 * (size_t)t;
	/* The secret from the first t shares. */
	bary_weights(xs, t, w, tmp);
	lagrange_at(xs, t, w, 0, lam, tmp);
	for (uint32_t j = 0; j < t; j++) {
		for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
			limbs[l] = fe_add(limbs[l], fe_mul(lam[j], shares[j].y[l]));
		}
	}
	/* Every further share must lie on the same polynomial. */
	for (uint32_t e = t; e < count; e++) {
		lagrange_at(xs, t, w, xs[e], lam, tmp);
		for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
			uint64_t y = 0;
			for (uint32_t j = 0; j < t; j++) {
				y = fe_add(y, fe_mul(lam[j], shares[j].y[l]));
			}
			bad |= y ^ shares[e].y[l];
		}
	}
	/* A secret's limbs are below 2^56 (limb 4: 2^32); a wrong share
	 * turns a limb into a near-uniform field element. */
	for (int l = 0; l < FB_SHAMIR_LIMBS - 1; l++) {
		bad |= limbs[l] >> 56;
	}
	bad |= limbs[FB_SHAMIR_LIMBS - 1] >> 32;
	if (bad != 0) {
		rc = FB_EAUTH;
		goto out;
	}
	limbs_to_secret(limbs, secret);
out:
	fb_wipe(limbs, sizeof(limbs));
	free(xs);
	free(lam);
	return rc;
}

void
fb_shamir_share_pack(const fb_shamir_share *s, uint8_t out[FB_SHAMIR_SHARE_LEN])
{
	for (int b = 0; b < 4; b++) {
		out[b] = (uint8_t)(s->x >> (8 * b));
	}
	for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
		for (int b = 0; b < 8; b++) {
			out[4 + 8 * l + b] = (uint8_t)(s->y[l] >> (8 * b));
		}
	}
}

fb_err
fb_shamir_share_unpack(const uint8_t in[FB_SHAMIR_SHARE_LEN],
    fb_shamir_share *s)
{
	uint64_t over = 0;

	memset(s, 0, sizeof(*s));
	for (int b = 0; b < 4; b++) {
		s->x |= (uint32_t)in[b] << (8 * b);
	}
	for (int l = 0; l < FB_SHAMIR_LIMBS; l++) {
		uint64_t v = 0;
		for (int b = 0; b < 8; b++) {
			v |= (uint64_t)in[4 + 8 * l + b] << (8 * b);
		}
		s->y[l] = v;
		/* v >= p exactly when v + 1 carries past bit 60 or beyond. */
		over |= (v + 1) >> 61;
	}
	if (over != 0 || s->x == 0) {
		fb_wipe(s, sizeof(*s));
		return FB_EPROTO;
	}
	return FB_OK;
}
