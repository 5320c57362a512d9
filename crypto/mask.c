/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask.c -- secure-aggregation masks: ChaCha20 expansion of 32-byte seeds
 * into uint32 ring elements, added or subtracted in place chunk by chunk,
 * and the X25519 + BLAKE2b derivation of pairwise seeds (see crypto.h,
 * "masks", for the nonce layout and the element order).
 *
 * Speed: the keystream is made 16 KiB at a time into a stack buffer that
 * stays in L1 and is added into the caller's vector right away, so the
 * cost is one ChaCha20 pass (libcrypto's, bulk.c) plus one cheap
 * vectorised pass.
 */
#include <string.h>

#include <sodium.h>

#include "crypto/crypto_impl.h"

#define BLOCK_WORDS 16u                   /* uint32 per ChaCha20 block */
#define BUF_WORDS 4096u                   /* 16 KiB of keystream per call */
#define BUF_BLOCKS (BUF_WORDS / BLOCK_WORDS)

static const uint8_t pair_domain[] = "fedbox/secagg-pair/v1";

/* The all-zero input that xor_ic turns into raw keystream. */
static const unsigned char zeros[BUF_WORDS * 4];

static void
mask_nonce(uint8_t nonce[12], uint8_t role, uint32_t round)
{
	nonce[0] = 'f';
	nonce[1] = 'b';
	nonce[2] = 'm';
	nonce[3] = role;
	for (int i = 0; i < 4; i++) {
		nonce[4 + i] = (uint8_t)(round >> (8 * i));
		nonce[8 + i] = 0;
	}
}

/* keystream writes `blocks` blocks starting at block `ic` as words. */
static void
keystream(uint32_t *buf, uint32_t blocks, uint32_t ic, const uint8_t nonce[12],
    const uint8_t seed[FB_MASK_SEED_LEN])
{
	fb_chacha20_xor_ic((uint8_t *)buf, zeros, (size_t)blocks * 64, nonce,
	    ic, seed);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	for (uint32_t i = 0; i < blocks * BLOCK_WORDS; i++) {
		buf[i] = __builtin_bswap32(buf[i]);
	}
#endif
}

static void
add_words(uint32_t *restrict v, const uint32_t *restrict ks, uint32_t count)
{
	for (uint32_t i = 0; i < count; i++) {
		v[i] += ks[i];
	}
}

static void
sub_words(uint32_t *restrict v, const uint32_t *restrict ks, uint32_t count)
{
	for (uint32_t i = 0; i < count; i++) {
		v[i] -= ks[i];
	}
}

static fb_err
check_range(uint64_t offset, uint64_t count)
{
	if (offset > FB_MASK_MAX_ELEMS || count > FB_MASK_MAX_ELEMS - offset) {
		return FB_ERANGE;
	}
	return FB_OK;
}

/*
 * apply_span adds (sign > 0) or subtracts term's keystream elements
 * [offset, offset + count) into v; count <= BUF_WORDS - offset % 16, so
 * one keystream call covers it.
 */
static void
apply_span(uint32_t *v, uint64_t offset, uint32_t count,
    const uint8_t seed[FB_MASK_SEED_LEN], const uint8_t nonce[12], int sign,
    uint32_t *buf)
{
	uint32_t skip = (uint32_t)(offset % BLOCK_WORDS);
	uint32_t blocks = (skip + count + BLOCK_WORDS - 1) / BLOCK_WORDS;

	keystream(buf, blocks, (uint32_t)(offset / BLOCK_WORDS), nonce, seed);
	if (sign > 0) {
		add_words(v, buf + skip, count);
	} else {
		sub_words(v, buf + skip, count);
	}
}

fb_err
fb_mask_apply(uint32_t *v, uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms, uint32_t round)
{
	fb_err rc = FB_OK;
	uint32_t buf[BUF_WORDS] __attribute__((aligned(64)));
	uint8_t nonce[12];
	uint64_t done = 0;

	if ((rc = check_range(offset, count)) != FB_OK) {
		return rc;
	}
	for (uint32_t t = 0; t < nterms; t++) {
		if (terms[t].role < FB_MASK_SELF || terms[t].role > FB_MASK_GRAPH ||
		    (terms[t].sign != 1 && terms[t].sign != -1)) {
			return FB_EINVAL;
		}
	}
	if ((rc = fb_crypto_init()) != FB_OK) {
		return rc;
	}
	while (done < count) {
		uint64_t pos = offset + done;
		uint64_t left = count - done;
		uint32_t span = BUF_WORDS - (uint32_t)(pos % BLOCK_WORDS);
		if (span > left) {
			span = (uint32_t)left;
		}
		for (uint32_t t = 0; t < nterms; t++) {
			mask_nonce(nonce, terms[t].role, round);
			apply_span(v + done, pos, span, terms[t].seed, nonce,
			    terms[t].sign, buf);
		}
		done += span;
	}
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

static fb_err
mask_one(uint32_t *v, uint64_t offset, uint64_t count,
    const uint8_t seed[FB_MASK_SEED_LEN], fb_mask_role role, uint32_t round,
    int8_t sign)
{
	fb_err rc;
	fb_mask_term term;

	memcpy(term.seed, seed, FB_MASK_SEED_LEN);
	term.role = (uint8_t)role;
	term.sign = sign;
	rc = fb_mask_apply(v, offset, count, &term, 1, round);
	sodium_memzero(&term, sizeof(term));
	return rc;
}

fb_err
fb_mask_add(uint32_t *v, uint64_t offset, uint64_t count,
    const uint8_t seed[FB_MASK_SEED_LEN], fb_mask_role role, uint32_t round)
{
	return mask_one(v, offset, count, seed, role, round, 1);
}

fb_err
fb_mask_sub(uint32_t *v, uint64_t offset, uint64_t count,
    const uint8_t seed[FB_MASK_SEED_LEN], fb_mask_role role, uint32_t round)
{
	return mask_one(v, offset, count, seed, role, round, -1);
}

/*
 * The u-coordinates of the points of order 1, 2, 4 and 8 on Curve25519
 * and its twist (0, 1, p - 1 and the two of order 8), and the two
 * non-canonical encodings below 2^255 (p and p + 1, read as 0 and 1).
 * These are exactly the keys whose X25519 with every clamped scalar is
 * zero; crypto_test checks the table against crypto_scalarmult.
 */
static const uint8_t small_order_u[7][32] = {
	{ 0x00 },
	{ 0x01 },
	{ 0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3,
	    0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32,
	    0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00 },
	{ 0x5f, 0x9c, 0x95, 0xbc, 0xa3, 0x50, 0x8c, 0x24, 0xb1, 0xd0, 0xb1,
	    0x55, 0x9c, 0x83, 0xef, 0x5b, 0x04, 0x44, 0x5c, 0xc4, 0x58, 0x1c,
	    0x8e, 0x86, 0xd8, 0x22, 0x4e, 0xdd, 0xd0, 0x9f, 0x11, 0x57 },
	{ 0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
	{ 0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
	{ 0xee, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f },
};

int
fb_x25519_small_order(const uint8_t pk[32])
{
	int found = 0;

	/* X25519 ignores the top bit of the key's last byte (RFC 7748) */
	for (size_t i = 0; i < 7; i++) {
		uint8_t d = (uint8_t)((pk[31] & 0x7f) ^ small_order_u[i][31]);

		for (size_t j = 0; j < 31; j++) {
			d |= (uint8_t)(pk[j] ^ small_order_u[i][j]);
		}
		found |= d == 0;
	}
	return found;
}

fb_err
fb_mask_pair_seed(const uint8_t sk[32], const uint8_t self_pk[32],
    const uint8_t peer_pk[32], const fb_run_id *run, uint32_t round,
    uint8_t seed[FB_MASK_SEED_LEN])
{
	fb_err rc = FB_OK;
	crypto_generichash_state st;
	uint8_t shared[crypto_scalarmult_BYTES];
	uint8_t r[4];
	int cmp;

	memset(seed, 0, FB_MASK_SEED_LEN);
	if ((rc = fb_crypto_init()) != FB_OK) {
		return rc;
	}
	cmp = memcmp(self_pk, peer_pk, 32);
	if (cmp == 0) {
		return FB_EINVAL;
	}
	if (crypto_scalarmult(shared, sk, peer_pk) != 0) {
		rc = FB_EAUTH;
		goto out;
	}
	for (int i = 0; i < 4; i++) {
		r[i] = (uint8_t)(round >> (8 * i));
	}
	crypto_generichash_init(&st, NULL, 0, FB_MASK_SEED_LEN);
	crypto_generichash_update(&st, pair_domain, sizeof(pair_domain) - 1);
	crypto_generichash_update(&st, cmp < 0 ? self_pk : peer_pk, 32);
	crypto_generichash_update(&st, cmp < 0 ? peer_pk : self_pk, 32);
	crypto_generichash_update(&st, run->b, FB_RUN_ID_LEN);
	crypto_generichash_update(&st, r, sizeof(r));
	crypto_generichash_update(&st, shared, sizeof(shared));
	crypto_generichash_final(&st, seed, FB_MASK_SEED_LEN);
out:
	sodium_memzero(shared, sizeof(shared));
	sodium_memzero(&st, sizeof(st));
	return rc;
}
