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
