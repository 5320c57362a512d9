/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask_host_check.cu -- the GPU mask kernel's block code (worker/cuda/
 * mask.cu, __host__ __device__), compiled for the host and run on machines
 * without a GPU, against crypto/'s fb_mask_apply (libsodium): 1, 2 and 9
 * terms of every role and both signs; offsets and counts on and off block
 * edges; block counters up to 2^32 - 1; the range cut into slices as
 * mask.c cuts it, each slice in a buffer laid out as a device slot (head
 * words before it, guard words around it that must stay untouched). On the
 * GPU the same code runs with byte-permute and funnel-shift rotations and
 * 16-byte loads of whole blocks: tests/gpu/mask_check covers those.
 * Prints PASS/FAIL lines and a count; exits 1 on any failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "worker/cuda/mask.cu"

#define _Noreturn [[noreturn]]
extern "C" {
#include "crypto/crypto.h"
}

/* mask.c's slices, smaller so that several fit a short range */
#define SLICE_WORDS 4096u
#define GUARD 0xdeadbeefu

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* crypto.h's key and nonce as the kernel reads them (mask.c's key_fill) */
static void
key_fill(fb_cuda_mask_key *k, const fb_mask_term *t, uint32_t round)
{
	for (int i = 0; i < 8; i++) {
		k->key[i] = le32(t->seed + 4 * i);
	}
	k->nonce[0] = (uint32_t)'f' | (uint32_t)'b' << 8 |
	              (uint32_t)'m' << 16 | (uint32_t)t->role << 24;
	k->nonce[1] = round;
	k->nonce[2] = 0;
	k->neg = t->sign < 0;
}

/* One case: 1 if the block code's words equal fb_mask_apply's and no
 * guard word moved. */
static int
one_case(uint64_t off, uint64_t cnt, uint32_t nt, uint32_t round)
{
	fb_mask_term terms[9];
	fb_cuda_mask_key keys[9];
	uint32_t *v = (uint32_t *)malloc((cnt + 1) * 4);
	uint32_t *ref = (uint32_t *)malloc((cnt + 1) * 4);
	uint32_t *d = (uint32_t *)aligned_alloc(64, (SLICE_WORDS + 32) * 4);
	uint64_t end = off + cnt;
	int ok = v != NULL && ref != NULL && d != NULL;

	for (uint32_t t = 0; ok && t < nt; t++) {
		randombytes_buf(terms[t].seed, sizeof(terms[t].seed));
		terms[t].role = (uint8_t)(FB_MASK_SELF + t % 3);
		terms[t].sign = (int8_t)(t % 2 ? -1 : 1);
		key_fill(&keys[t], &terms[t], round);
	}
	if (ok) {
		randombytes_buf(v, (cnt + 1) * 4);
		memcpy(ref, v, (cnt + 1) * 4);
		ok = fb_mask_apply(ref, off, cnt, terms, nt, round) == FB_OK;
	}
	for (uint64_t a = off; ok && a < end;) {
		uint64_t start = a & ~UINT64_C(15);
		uint64_t b = end - start < SLICE_WORDS ? end
		                                       : start + SLICE_WORDS;
		uint32_t head = (uint32_t)(a - start);
		uint64_t len = b - a, nb = (head + len + 15) / 16;

		for (uint32_t i = 0; i < SLICE_WORDS + 32; i++) {
			d[i] = GUARD;
		}
		memcpy(d + head, v + (a - off), len * 4);
		for (uint64_t j = 0; j < nb; j++) {
			mask_block(d, head, head + len, j,
			    (uint32_t)(start / 16), keys, nt);
		}
		for (uint64_t i = 0; i < SLICE_WORDS + 32; i++) {
			if ((i < head || i >= head + len) && d[i] != GUARD) {
				ok = 0;
			}
		}
		memcpy(v + (a - off), d + head, len * 4);
		a += len;
	}
	ok = ok && memcmp(v, ref, (cnt + 1) * 4) == 0;
	sodium_memzero(terms, sizeof(terms));
	sodium_memzero(keys, sizeof(keys));
	free(v);
	free(ref);
	free(d);
	return ok;
}

int
main(void)
{
	static const uint64_t offs[] = {
		0, 1, 15, 16, 17, 4093, 100003,
		(UINT64_C(1) << 28) * 16 - 9,  /* across block 2^28 */
		(UINT64_C(1) << 31) * 16 - 21, /* across block 2^31 */
		(UINT64_C(1) << 32) * 16 - 40, /* up to block 2^32 - 1 */
	};
	static const uint64_t cnts[] = { 0, 1, 5, 16, 17, 33, 4096, 9001 };
	static const uint32_t nts[] = { 1, 2, 9 };
	unsigned cases = 0, fails = 0;

	if (sodium_init() < 0) {
		printf("FAIL: sodium_init\n");
		return 1;
	}
	for (uint64_t off : offs) {
		for (uint64_t cnt : cnts) {
			for (uint32_t nt : nts) {
				uint32_t round = 0x9e3779b9u ^ (uint32_t)cnt;
				if (off + cnt > FB_MASK_MAX_ELEMS) {
					continue;
				}
				cases++;
				if (!one_case(off, cnt, nt, round)) {
					fails++;
					printf("FAIL: offset %llu count %llu, "
					       "%u terms\n",
					    (unsigned long long)off,
					    (unsigned long long)cnt, nt);
				}
			}
		}
	}
	printf("%s: the kernel's block code on the host equals fb_mask_apply "
	       "(%u cases, %u failed)\n",
	    fails == 0 ? "PASS" : "FAIL", cases, fails);
	return fails == 0 ? 0 : 1;
}
