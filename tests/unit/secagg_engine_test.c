/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_engine_test.c -- unit tests of a SecAgg+ worker's masks made by
 * another engine (fb_secagg_worker_mask_chunk_on, what a CUDA worker uses
 * to expand them on its GPU): an engine that computes fb_mask_apply gives
 * the words of fb_secagg_worker_mask_chunk; it receives the worker's self
 * term and one term per neighbour, of both signs, and the round; calls
 * that mask_chunk refuses never reach it; its errors come back.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto.h"
#include "tests/unit/harness.h"

#define N 4
#define LEN 1000

typedef struct engine_log {
	uint32_t calls;
	uint64_t offset, count;
	uint32_t nterms, round, self, plus, minus;
	fb_err fail; /* FB_OK: compute; else return this */
} engine_log;

static fb_err
host_engine(void *ctx, uint32_t *v, uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms, uint32_t round)
{
	engine_log *l = ctx;

	l->calls++;
	l->offset = offset;
	l->count = count;
	l->nterms = nterms;
	l->round = round;
	l->self = l->plus = l->minus = 0;
	for (uint32_t i = 0; i < nterms; i++) {
		int pair = terms[i].role == FB_MASK_PAIR;
		l->self += terms[i].role == FB_MASK_SELF;
		l->plus += pair && terms[i].sign == 1;
		l->minus += pair && terms[i].sign == -1;
	}
	if (l->fail != FB_OK) {
		return l->fail;
	}
	return fb_mask_apply(v, offset, count, terms, nterms, round);
}

/* N workers of a complete graph, adverts and shares exchanged; with
 * `begin`, each has fixed its masks. */
static void
round_setup(fb_secagg_worker **w, fb_identity **ids, bool begin)
{
	fb_secagg_params p;
	fb_pubkey pks[N];
	uint8_t adv[N][FB_SECAGG_ADV_LEN];
	uint8_t buf[N * FB_SECAGG_SHARE_MSG_LEN];

	memset(&p, 0, sizeof(p));
	assert_int_equal(fb_run_id_random(&p.run), FB_OK);
	p.round = 11;
	p.n = N;
	p.degree = N - 1;
	p.threshold = 3;
	randombytes_buf(p.graph_seed, sizeof(p.graph_seed));
	for (uint32_t i = 0; i < N; i++) {
		uint8_t seed[32] = { (uint8_t)i, 0x6b };
		assert_int_equal(fb_identity_alloc_from_seed(seed, NULL,
		    &ids[i]), FB_OK);
		fb_identity_pubkey(ids[i], &pks[i]);
		assert_int_equal(fb_secagg_worker_alloc(&p, i, &w[i]), FB_OK);
		assert_int_equal(fb_secagg_worker_advertise(w[i], ids[i],
		    adv[i]), FB_OK);
	}
	for (uint32_t i = 0; i < N; i++) {
		for (uint32_t j = 0; j < N; j++) {
			assert_int_equal(fb_secagg_worker_add_advert(w[i],
			    &pks[j], adv[j], FB_SECAGG_ADV_LEN), FB_OK);
		}
	}
	for (uint32_t i = 0; i < N; i++) {
		size_t len;
		assert_int_equal(fb_secagg_worker_make_shares(w[i], buf,
		    sizeof(buf), &len), FB_OK);
		for (size_t o = 0; o < len; o += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from, to;
			assert_int_equal(fb_secagg_share_msg_peek(buf + o,
			    FB_SECAGG_SHARE_MSG_LEN, &from, &to), FB_OK);
			assert_int_equal(fb_secagg_worker_add_share(w[to],
			    buf + o, FB_SECAGG_SHARE_MSG_LEN), FB_OK);
		}
	}
	for (uint32_t i = 0; begin && i < N; i++) {
		assert_int_equal(fb_secagg_worker_mask_begin(w[i]), FB_OK);
	}
}

static void
round_free(fb_secagg_worker **w, fb_identity **ids)
{
	for (uint32_t i = 0; i < N; i++) {
		fb_secagg_worker_free(w[i]);
		fb_identity_free(ids[i]);
	}
}

static void
test_engine_gives_mask_chunk_words(void **state)
{
	fb_secagg_worker *w[N];
	fb_identity *ids[N];
	uint32_t *a = malloc(LEN * sizeof(*a));
	uint32_t *b = malloc(LEN * sizeof(*b));
	uint32_t *c = malloc(LEN * sizeof(*c));
	uint32_t plus = 0, minus = 0;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	assert_non_null(c);
	round_setup(w, ids, true);
	for (uint32_t i = 0; i < N; i++) {
		engine_log l = { 0 };
		for (uint32_t e = 0; e < LEN; e++) {
			a[e] = b[e] = c[e] = e * 2654435761u + i;
		}
		/* whole, and in two pieces at a ragged offset (37) */
		assert_int_equal(fb_secagg_worker_mask_chunk(w[i], a, 0, LEN),
		    FB_OK);
		assert_int_equal(fb_secagg_worker_mask_chunk_on(w[i], b, 0,
		    37, host_engine, &l), FB_OK);
		assert_int_equal(l.offset, 0);
		assert_int_equal(l.count, 37);
		assert_int_equal(fb_secagg_worker_mask_chunk_on(w[i], b + 37,
		    37, LEN - 37, host_engine, &l), FB_OK);
		assert_int_equal(l.calls, 2);
		assert_int_equal(l.offset, 37);
		assert_int_equal(l.count, LEN - 37);
		assert_memory_equal(a, b, LEN * sizeof(*a));
		assert_memory_not_equal(a, c, LEN * sizeof(*a));
		/* its own term and one per neighbour, for the round */
		assert_int_equal(l.nterms, N);
		assert_int_equal(l.self, 1);
		assert_int_equal(l.plus + l.minus, N - 1);
		assert_int_equal(l.round, 11);
		plus += l.plus;
		minus += l.minus;
	}
	/* each pair adds its mask at one end and subtracts it at the other */
	assert_int_equal(plus, N * (N - 1) / 2);
	assert_int_equal(minus, N * (N - 1) / 2);
	round_free(w, ids);
	free(a);
	free(b);
	free(c);
}

static void
test_engine_refusals(void **state)
{
	fb_secagg_worker *w[N];
	fb_identity *ids[N];
	uint32_t v[16] = { 0 }, zero[16] = { 0 };
	engine_log l = { 0 };

	(void)state;
	round_setup(w, ids, false);
	/* before mask_begin: refused as mask_chunk refuses, engine not run */
	assert_int_equal(fb_secagg_worker_mask_chunk_on(w[0], v, 0, 16,
	    host_engine, &l), FB_EINVAL);
	assert_int_equal(fb_secagg_worker_mask_chunk(w[0], v, 0, 16),
	    FB_EINVAL);
	assert_int_equal(fb_secagg_worker_mask_begin(w[0]), FB_OK);
	/* past the masks' range */
	assert_int_equal(fb_secagg_worker_mask_chunk_on(w[0], v,
	    FB_MASK_MAX_ELEMS - 8, 16, host_engine, &l), FB_ERANGE);
	assert_int_equal(fb_secagg_worker_mask_chunk(w[0], v,
	    FB_MASK_MAX_ELEMS - 8, 16), FB_ERANGE);
	assert_int_equal(fb_secagg_worker_mask_chunk_on(w[0], v,
	    FB_MASK_MAX_ELEMS + 1, 0, host_engine, &l), FB_ERANGE);
	assert_int_equal(l.calls, 0);
	assert_memory_equal(v, zero, sizeof(v));
	/* the last 16 elements are in range */
	assert_int_equal(fb_secagg_worker_mask_chunk_on(w[0], v,
	    FB_MASK_MAX_ELEMS - 16, 16, host_engine, &l), FB_OK);
	assert_int_equal(l.calls, 1);
	/* the engine's error comes back as it is */
	l.fail = FB_ECUDA;
	assert_int_equal(fb_secagg_worker_mask_chunk_on(w[0], v, 0, 16,
	    host_engine, &l), FB_ECUDA);
	assert_int_equal(l.calls, 2);
	round_free(w, ids);
}

FB_TESTS = {
	{ "an engine computing fb_mask_apply gives mask_chunk's words",
	    test_engine_gives_mask_chunk_words },
	{ "calls mask_chunk refuses never reach the engine",
	    test_engine_refusals },
	{ NULL, NULL },
};
FB_TEST_MAIN("secagg_engine")
