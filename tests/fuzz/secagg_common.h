/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_common.h -- shared fixture of the secure-aggregation fuzz targets
 * (tests/fuzz/targets/secagg_*.c) and of their seed-corpus generator: one
 * SecAgg+ round of SA_N workers on the complete graph, run once through
 * every step with the deterministic RNG of fuzz_common.h, keeping each
 * worker's advert, share batch, confirmation of the included set and
 * reveal, and the sums of their masked and of their plain inputs.
 *
 * A target rebuilds the state it needs for each input from these (the
 * server side up to a step, or worker 0 with the very keys it had: the
 * RNG is reset to where worker 0's keys were drawn), so every input runs
 * on the same state. Static functions only: include it once.
 */
#ifndef FB_TESTS_SECAGG_COMMON_H
#define FB_TESTS_SECAGG_COMMON_H

#include "tests/fuzz/fuzz_common.h"

#define SA_N 4 /* workers: complete graph, k = 3 */
#define SA_T 3 /* threshold: a majority of 4 */
#define SA_ROUND 9u
#define SA_LEN 8 /* elements of each input */
#define SA_BATCH ((SA_N - 1) * FB_SECAGG_SHARE_MSG_LEN)
#define SA_REVEAL                                                              \
	(FB_SECAGG_REVEAL_HEADER_LEN + SA_N * FB_SECAGG_REVEAL_ENTRY_LEN)

typedef struct sa_fixture {
	fb_secagg_params p;
	fb_identity *ids[SA_N];
	fb_pubkey pks[SA_N];
	uint64_t rng0; /* the RNG state worker 0's keys were drawn from */
	uint8_t adv[SA_N][FB_SECAGG_ADV_LEN];
	uint8_t batch[SA_N][SA_BATCH]; /* shares each worker sent */
	uint8_t included[SA_N];        /* all of them */
	uint8_t confirm[SA_N][FB_SECAGG_CONFIRM_LEN];
	uint8_t reveal[SA_N][SA_REVEAL];
	size_t reveal_len[SA_N];
	uint32_t masked[SA_LEN]; /* sum of the masked inputs (mod 2^32) */
	uint32_t plain[SA_LEN];  /* sum of the inputs themselves */
} sa_fixture;

static sa_fixture sa;

static void
sa_check(fb_err rc, const char *what)
{
	if (rc != FB_OK) {
		fz_die(what);
	}
}

/*
 * sa_worker_to makes worker i (its keys drawn from RNG state `rng` when
 * nonzero, else from where the RNG is) and takes it to `stage`: 0 keys and
 * the others' adverts, 1 shares made, 2 the others' shares in and masks
 * fixed, 3 the full included set signed. *w is the caller's.
 */
static void
sa_worker_to(uint32_t i, uint64_t rng, int stage, fb_secagg_worker **w)
{
	uint8_t out[SA_BATCH], conf[FB_SECAGG_CONFIRM_LEN],
	    adv[FB_SECAGG_ADV_LEN];
	size_t len;

	if (rng != 0) {
		fz_rng_state = rng;
	}
	sa_check(fb_secagg_worker_alloc(&sa.p, i, w), "worker");
	sa_check(fb_secagg_worker_advertise(*w, sa.ids[i], adv), "advertise");
	for (uint32_t j = 0; j < SA_N; j++) {
		if (j != i) {
			sa_check(fb_secagg_worker_add_advert(*w, &sa.pks[j],
			             sa.adv[j], FB_SECAGG_ADV_LEN),
			    "advert");
		}
	}
	if (stage < 1) {
		return;
	}
	sa_check(
	    fb_secagg_worker_make_shares(*w, out, sizeof(out), &len), "shares");
	if (stage < 2) {
		return;
	}
	for (uint32_t j = 0; j < SA_N; j++) {
		for (uint32_t q = 0; j != i && q < SA_N - 1; q++) {
			const uint8_t *m =
			    sa.batch[j] + q * FB_SECAGG_SHARE_MSG_LEN;
			uint32_t from, to;
			sa_check(fb_secagg_share_msg_peek(
			             m, FB_SECAGG_SHARE_MSG_LEN, &from, &to),
			    "peek");
			if (to == i) {
				sa_check(fb_secagg_worker_add_share(
				             *w, m, FB_SECAGG_SHARE_MSG_LEN),
				    "share");
			}
		}
	}
	sa_check(fb_secagg_worker_mask_begin(*w), "mask");
	if (stage < 3) {
		return;
	}
	sa_check(
	    fb_secagg_worker_confirm(*w, sa.ids[i], sa.included, SA_N, conf),
	    "confirm");
}

/*
 * sa_server_to makes a server and takes it to `stage`: 0 every advert, 1
 * every share batch, 2 every input included, 3 every confirmation in.
 */
static void
sa_server_to(int stage, fb_secagg_server **s)
{
	sa_check(fb_secagg_server_alloc(&sa.p, s), "server");
	for (uint32_t i = 0; i < SA_N; i++) {
		sa_check(fb_secagg_server_add_advert(
		             *s, i, &sa.pks[i], sa.adv[i], FB_SECAGG_ADV_LEN),
		    "server advert");
	}
	for (uint32_t i = 0; stage >= 1 && i < SA_N; i++) {
		sa_check(
		    fb_secagg_server_add_shares(*s, i, sa.batch[i], SA_BATCH),
		    "server shares");
	}
	for (uint32_t i = 0; stage >= 2 && i < SA_N; i++) {
		sa_check(fb_secagg_server_set_included(*s, i), "included");
	}
	for (uint32_t i = 0; stage >= 3 && i < SA_N; i++) {
		sa_check(fb_secagg_server_add_confirm(
		             *s, i, sa.confirm[i], FB_SECAGG_CONFIRM_LEN),
		    "server confirm");
	}
}

/* sa_setup runs the round once, always the same way. */
static const sa_fixture *
sa_setup(void)
{
	static int done;
	fb_secagg_worker *w[SA_N] = {NULL};
	size_t len;

	if (done) {
		return &sa;
	}
	done = 1;
	(void)fz_setup(); /* the RNG and libsodium */
	fz_rng_state = 7;
	memcpy(sa.p.run.b, fz.run.b, FB_RUN_ID_LEN);
	sa.p.round = SA_ROUND;
	sa.p.n = SA_N;
	sa.p.degree = SA_N - 1;
	sa.p.threshold = SA_T;
	memset(sa.p.graph_seed, 0x2b, sizeof(sa.p.graph_seed));
	for (uint32_t i = 0; i < SA_N; i++) {
		uint8_t seed[32];
		memset(seed, 0x90 + (int)i, sizeof(seed));
		sa_check(fb_identity_alloc_from_seed(seed, NULL, &sa.ids[i]),
		    "identity");
		fb_identity_pubkey(sa.ids[i], &sa.pks[i]);
		sa.included[i] = 1;
	}
	for (uint32_t i = 0; i < SA_N; i++) {
		if (i == 0) {
			sa.rng0 = fz_rng_state;
		}
		sa_check(fb_secagg_worker_alloc(&sa.p, i, &w[i]), "worker");
		sa_check(fb_secagg_worker_advertise(w[i], sa.ids[i], sa.adv[i]),
		    "advertise");
	}
	for (uint32_t i = 0; i < SA_N; i++) {
		for (uint32_t j = 0; j < SA_N; j++) {
			sa_check(fb_secagg_worker_add_advert(w[i], &sa.pks[j],
			             sa.adv[j], FB_SECAGG_ADV_LEN),
			    "advert");
		}
		sa_check(fb_secagg_worker_make_shares(
		             w[i], sa.batch[i], SA_BATCH, &len),
		    "shares");
	}
	for (uint32_t j = 0; j < SA_N; j++) {
		for (uint32_t q = 0; q < SA_N - 1; q++) {
			const uint8_t *m =
			    sa.batch[j] + q * FB_SECAGG_SHARE_MSG_LEN;
			uint32_t from, to;
			sa_check(fb_secagg_share_msg_peek(
			             m, FB_SECAGG_SHARE_MSG_LEN, &from, &to),
			    "peek");
			sa_check(fb_secagg_worker_add_share(
			             w[to], m, FB_SECAGG_SHARE_MSG_LEN),
			    "share");
		}
	}
	for (uint32_t i = 0; i < SA_N; i++) {
		uint32_t y[SA_LEN];
		sa_check(fb_secagg_worker_mask_begin(w[i]), "mask");
		for (uint32_t e = 0; e < SA_LEN; e++) {
			y[e] = 1000u * (i + 1) + e;
			sa.plain[e] += y[e];
		}
		sa_check(
		    fb_secagg_worker_mask_chunk(w[i], y, 0, SA_LEN), "chunk");
		for (uint32_t e = 0; e < SA_LEN; e++) {
			sa.masked[e] += y[e];
		}
		sa_check(fb_secagg_worker_confirm(
		             w[i], sa.ids[i], sa.included, SA_N, sa.confirm[i]),
		    "confirm");
	}
	for (uint32_t i = 0; i < SA_N; i++) {
		for (uint32_t j = 0; j < SA_N; j++) {
			if (j != i) {
				sa_check(
				    fb_secagg_worker_add_confirm(w[i],
				        sa.confirm[j], FB_SECAGG_CONFIRM_LEN),
				    "add confirm");
			}
		}
		sa_check(fb_secagg_worker_reveal(
		             w[i], sa.reveal[i], SA_REVEAL, &sa.reveal_len[i]),
		    "reveal");
	}
	for (uint32_t i = 0; i < SA_N; i++) {
		fb_secagg_worker_free(w[i]);
	}
	return &sa;
}

/* sa_index is the little-endian index at `off` of a message, or `dflt`
 * when the message is too short or the index out of range. */
static uint32_t
sa_index(const uint8_t *m, size_t len, size_t off, uint32_t dflt)
{
	uint32_t v;

	if (len < off + 4) {
		return dflt;
	}
	v = (uint32_t)m[off] | (uint32_t)m[off + 1] << 8 |
	    (uint32_t)m[off + 2] << 16 | (uint32_t)m[off + 3] << 24;
	return v < SA_N ? v : dflt;
}

/* sa_copy gives an exact-size heap copy (ASan sees any overread). */
static uint8_t *
sa_copy(const uint8_t *data, size_t size)
{
	uint8_t *c = malloc(size > 0 ? size : 1);
	if (c != NULL && size > 0) {
		memcpy(c, data, size);
	}
	return c;
}

#endif
