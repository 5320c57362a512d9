/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broadcast.c -- the global model, as the round's workers fetch it.
 *
 * Plain mode serves chunks straight from the model's memory. Secure mode
 * encrypts the model ONCE per round, under a fresh round key, into one
 * ciphertext that every selected worker fetches; each gets the key sealed
 * to its own session in RoundStart, and checks the coordinator's signed
 * trailer after the last chunk. The encryption runs on the job thread,
 * its chunks sealed on every core (FULL streams seal chunks on their
 * own); the loop serves fetches meanwhile (of nothing: RoundStart, which
 * carries the trailer, goes out only when it is done).
 *
 * Chunks are sent without a copy. Model chunks may still be queued in
 * ZeroMQ for a worker that stopped reading: they keep the memory they were
 * sent from, and the next write goes to fresh memory (fb_lent_own).
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

fb_err
model_writable(coord *c, fb_lent **b, size_t len, bool keep)
{
	fb_err rc = fb_lent_own(b, len, keep);
	if (rc != FB_OK) {
		fb_log_error("round %u: out of memory for the model",
		    c->rd.number);
	}
	return rc;
}

fb_err
broadcast_alloc(coord *c)
{
	broadcast *b = &c->bc;

	b->stride = (uint64_t)c->chunk_elems * 4 + FB_STREAM_CHUNK_OVERHEAD;
	if ((b->len = calloc(c->chunk_count, sizeof(*b->len))) == NULL ||
	    (b->hash = calloc(c->chunk_count, sizeof(*b->hash))) == NULL ||
	    fb_lent_new(b->stride * c->chunk_count, &b->lent) != FB_OK) {
		return FB_ENOMEM;
	}
	b->data = fb_lent_data(b->lent);
	return FB_OK;
}

void
broadcast_fini(coord *c)
{
	broadcast *b = &c->bc;

	fb_lent_free(b->lent); /* after the link closed: none in flight */
	free(b->len);
	free(b->hash);
	fb_wipe(b->key, sizeof(b->key));
	memset(b, 0, sizeof(*b));
}

/* On the loop, before the job: the ciphertext goes to memory no queued
 * send still holds. */
fb_err
broadcast_prepare(coord *c)
{
	broadcast *b = &c->bc;
	fb_err rc = model_writable(c, &b->lent, b->stride * c->chunk_count,
	    false);
	if (rc == FB_OK) {
		b->data = fb_lent_data(b->lent);
	}
	return rc;
}

typedef struct seal_arg {
	coord *c;
	const fb_stream_push *p;
	atomic_int rc; /* the first error */
} seal_arg;

static void
seal_chunk(void *arg, uint32_t k)
{
	seal_arg *a = arg;
	coord *c = a->c;
	broadcast *b = &c->bc;
	uint64_t len = fb_accum_chunk_len(c->accum, k) * 4;
	size_t clen = 0;
	fb_err rc;

	rc = fb_stream_push_chunk_at(a->p, k,
	    (const uint8_t *)c->params + (uint64_t)k * c->chunk_elems * 4, len,
	    k + 1 == c->chunk_count, b->data + (uint64_t)k * b->stride,
	    b->stride, &clen, b->hash[k]);
	b->len[k] = (uint32_t)clen;
	if (rc != FB_OK) {
		int ok = FB_OK;
		atomic_compare_exchange_strong(&a->rc, &ok, (int)rc);
	}
}

/* The job: seal every chunk on the pool, then sign the trailer. */
fb_err
broadcast_encrypt(coord *c)
{
	broadcast *b = &c->bc;
	fb_stream_ctx ctx = {.run = c->run, .round = c->rd.number,
	    .sender = FB_SENDER_COORDINATOR};
	fb_stream_push *p = NULL;
	seal_arg a = {.c = c};
	fb_err rc;

	rc = fb_stream_push_alloc(&ctx, c->chunk_elems * 4,
	    FB_STREAM_DIGEST_FULL, b->key, b->header, &p);
	if (rc != FB_OK) {
		return rc;
	}
	a.p = p;
	atomic_init(&a.rc, FB_OK);
	fb_pool_for(c->pool, c->chunk_count, seal_chunk, &a);
	rc = (fb_err)atomic_load(&a.rc);
	if (rc == FB_OK) {
		rc = fb_stream_push_hashes(p, b->hash[0], c->chunk_count,
		    c->param_count * 4, 1);
	}
	if (rc == FB_OK) {
		rc = fb_stream_push_final(p, c->self, b->trailer);
	}
	fb_stream_push_free(p);
	return rc;
}

/* Fills RoundStart's round key, stream header and trailer. */
void
broadcast_round_start(const coord *c, fb_msg *m)
{
	const broadcast *b = &c->bc;

	memcpy(m->u.round_start.round_key.b, b->key, FB_STREAM_KEY_LEN);
	m->u.round_start.round_key.len = FB_STREAM_KEY_LEN;
	memcpy(m->u.round_start.stream_header.b, b->header,
	    FB_STREAM_HEADER_LEN);
	m->u.round_start.stream_header.len = FB_STREAM_HEADER_LEN;
	memcpy(m->u.round_start.stream_trailer.b, b->trailer,
	    FB_STREAM_TRAILER_LEN);
	m->u.round_start.stream_trailer.len = FB_STREAM_TRAILER_LEN;
}

void
broadcast_on_fetch(coord *c, worker *w, const fb_msg *m)
{
	fb_msg out = {.type = FB_MSG_MODEL_CHUNK};
	uint32_t k = m->u.model_fetch.chunk;
	fb_err rc;

	if (!round_open_to(c, w, m->u.model_fetch.round) &&
	    !(c->cfg->mode == FB_MODE_ASYNC &&
	        m->u.model_fetch.round == w->task_round)) {
		guard_drop(c, DROP_STALE_ROUND, "model_fetch for round %u from "
		    "%s (round %u is open)", m->u.model_fetch.round, w->name,
		    c->rd.number);
		return;
	}
	if (w->state != W_TRAINING) {
		guard_drop(c, DROP_UNEXPECTED, "model_fetch from %s, which is %s",
		    w->name, worker_state_names[w->state]);
		return;
	}
	if (!async_fetch_ok(c, w)) {
		return; /* round.mode async: its model has gone; a new task */
	}
	if (k >= c->chunk_count) {
		guard_drop(c, DROP_WRONG_SIZE, "model_fetch of chunk %u of %u "
		    "from %s", k, c->chunk_count, w->name);
		return;
	}
	out.u.model_chunk.round = round_of(c, w);
	out.u.model_chunk.chunk = k;
	if (c->secure) {
		rc = coord_send(c, w, &out, c->bc.data + (uint64_t)k * c->bc.stride,
		    c->bc.len[k], c->bc.lent);
	} else {
		rc = coord_send(c, w, &out,
		    c->params + (uint64_t)k * c->chunk_elems,
		    fb_accum_chunk_len(c->accum, k) * 4, c->params_lent);
	}
	if (rc != FB_OK) {
		round_worker_failed(c, w, "model download failed");
	}
}
