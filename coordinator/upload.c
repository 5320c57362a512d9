/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upload.c -- workers' updates as they stream in.
 *
 * UpdateBegin, then the chunks in the order RoundStart gave (from the
 * worker's first_chunk on, wrapping; with SecAgg the extra coordinates
 * last), then (secure mode) UpdateEnd with the signed trailer. Each
 * message is checked here, on the loop: round, the worker's state, order,
 * size. Its payload is then queued to the ingest pool (ingest.h), whose
 * threads decrypt it and add it into the one fixed-point accumulator
 * (upload_add_cb); what the pool made of each stream (complete, or refused
 * and why) comes back in upload_results.
 *
 * Chunks go up on credit (coordinator_impl.h, credits): UpdateBegin puts
 * the worker in the queue for credit, each chunk received gives one back
 * to the budget, and a worker down to half its credits queues again. A
 * chunk without a credit is a protocol error: the worker leaves the round.
 *
 * A masked input (secure aggregation) is kept apart until it is whole
 * (coordinator_impl.h, partials): its first credit waits for a free
 * buffer, its chunks are decrypted straight there, and the pool's end
 * callback adds it into the sum once its stream is complete and signed.
 * One cut off midway is dropped with its buffer: nothing of it is in the
 * sum, and its masks are recovered like any dropout's.
 *
 * With secure_aggregation.max_uploads 0 nothing is kept apart: each masked
 * chunk goes into the sum as it arrives, so the coordinator holds no more
 * than in plain mode. A stream that then ends incomplete leaves part of an
 * input in the sum that can never be unmasked, so the sum starts again
 * (upload_sum_check): every other masked input, complete or under way, is
 * asked for again (FB_SA_AGAIN) and its worker sends it anew, the same
 * bytes (its encoding and masks are fixed for the round), in a new
 * stream; the cut worker is a dropout. Each restart takes one worker out
 * of the round, so there are at most as many as workers, and each costs
 * the others one more upload: the price of the memory.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

#define PARTIAL_AUTO_BYTES (256ull << 20) /* max_uploads auto: this much */
#define PARTIAL_AUTO_MIN 2
#define PARTIAL_AUTO_MAX 64

/* Updates complete or streaming in: over-selection keeps the first. */
static uint32_t
updates_claimed(const coord *c)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		n += w->used && (w->state == W_DONE || w->state == W_UPLOADING);
	}
	return n;
}

bool
upload_any_in_flight(const coord *c)
{
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (w->used && w->state == W_UPLOADING) {
			return true;
		}
	}
	return false;
}

/* ---- credits ---------------------------------------------------------- */

fb_err
upload_credits_alloc(coord *c)
{
	credits *cr = &c->cr;
	uint64_t b = c->cfg->upload_window / c->cfg->chunk_size;

	cr->budget = b < 1 ? 1 : b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
	cr->per_worker = c->cfg->upload_credits < 1 ? 1
	    : c->cfg->upload_credits > UINT32_MAX ? UINT32_MAX
	    : (uint32_t)c->cfg->upload_credits;
	cr->cap = c->reg.cap;
	if ((cr->queue = calloc(cr->cap, sizeof(*cr->queue))) == NULL) {
		return FB_ENOMEM;
	}
	return FB_OK;
}

void
upload_credits_fini(coord *c)
{
	free(c->cr.queue);
	c->cr.queue = NULL;
}

/* ---- masked uploads kept apart -------------------------------------- */

fb_err
upload_partials_alloc(coord *c)
{
	partials *pt = &c->part;
	uint64_t each = (c->param_count + SA_EXTRA) * 4;
	uint64_t n = (uint64_t)c->cfg->sa_max_uploads;

	if (c->cfg->sa_max_uploads < 0) {
		/* a model too large for two buffers in the budget goes
		 * straight into the sum: its memory is what matters */
		n = PARTIAL_AUTO_BYTES / each;
		n = n < PARTIAL_AUTO_MIN ? 0
		    : n > PARTIAL_AUTO_MAX ? PARTIAL_AUTO_MAX : n;
	}
	pt->count = (uint32_t)n;
	atomic_init(&pt->epoch, 0);
	atomic_init(&pt->cut, false);
	if (n == 0) {
		fb_log_info("secure aggregation: masked uploads go straight "
		            "into the sum (secure_aggregation.max_uploads 0): "
		            "one cut off midway makes the others send theirs "
		            "again");
		return FB_OK;
	}
	fb_log_info("secure aggregation: up to %" PRIu64 " masked upload%s at "
	            "once, each kept apart until whole (%.0f MiB each, "
	            "secure_aggregation.max_uploads)",
	    n, n == 1 ? "" : "s", (double)each / 1048576.0);
	if ((pt->buf = calloc(n, sizeof(*pt->buf))) == NULL ||
	    (pt->busy = calloc(n, sizeof(*pt->busy))) == NULL) {
		return FB_ENOMEM;
	}
	for (uint32_t i = 0; i < pt->count; i++) {
		atomic_init(&pt->busy[i].v, false);
	}
	return FB_OK;
}

void
upload_partials_fini(coord *c)
{
	partials *pt = &c->part;

	for (uint32_t i = 0; pt->buf != NULL && i < pt->count; i++) {
		fb_free(pt->buf[i]);
	}
	free(pt->buf);
	free(pt->busy);
	memset(pt, 0, sizeof(*pt));
}

/* A free buffer for a masked upload (its index), or -1: all are held by
 * uploads under way (or memory ran out). */
static int32_t
partial_take(coord *c)
{
	partials *pt = &c->part;

	for (uint32_t i = 0; i < pt->count; i++) {
		atomic_bool *busy = &pt->busy[i].v;
		if (atomic_load_explicit(busy, memory_order_acquire)) {
			continue;
		}
		if (pt->buf[i] == NULL &&
		    (pt->buf[i] = fb_alloc((c->param_count + SA_EXTRA) * 4)) ==
		        NULL) {
			if (!pt->warned) {
				fb_log_warn("out of memory for a masked "
				            "upload's buffer: %u under way at "
				            "most", i);
				pt->warned = true;
			}
			return -1;
		}
		atomic_store_explicit(busy, true, memory_order_relaxed);
		return (int32_t)i;
	}
	return -1;
}

/* Puts w in the queue for credit (once). */
static void
credit_want(coord *c, worker *w)
{
	credits *cr = &c->cr;

	if (w->credit_queued || cr->count == cr->cap) {
		return;
	}
	cr->queue[(cr->head + cr->count) % cr->cap] = registry_slot(c, w).v;
	cr->count++;
	w->credit_queued = true;
}

void
upload_credit_release(coord *c, worker *w)
{
	FB_ASSERT(c->cr.out >= w->credit);
	c->cr.out -= w->credit;
	w->credit = 0;
}

void
upload_credits_reset(coord *c)
{
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		c->reg.workers[i].credit = 0;
		c->reg.workers[i].credited = 0;
		c->reg.workers[i].credit_queued = false;
	}
	c->cr.out = 0;
	c->cr.count = 0;
	c->cr.head = 0;
}

/*
 * Grants credits to the workers waiting, in turn, while the budget lasts:
 * one pass over the queue. A worker whose grant could not be sent (its
 * queue full) waits for the next pass.
 */
void
upload_credit_pump(coord *c)
{
	credits *cr = &c->cr;
	uint32_t n = cr->count;

	while (n-- > 0 && cr->out < cr->budget) {
		uint32_t slot = cr->queue[cr->head];
		worker *w = &c->reg.workers[slot];
		fb_msg m = {.type = FB_MSG_UPDATE_CREDIT};
		uint32_t give;

		cr->head = (cr->head + 1) % cr->cap;
		cr->count--;
		w->credit_queued = false;
		if (!w->used || w->state != W_UPLOADING || w->again ||
		    w->credited >= c->rd.in_chunks ||
		    w->credit >= cr->per_worker) {
			continue;
		}
		give = cr->per_worker - w->credit;
		give = give < c->rd.in_chunks - w->credited
		    ? give : c->rd.in_chunks - w->credited;
		give = give < cr->budget - cr->out ? give
		                                   : cr->budget - cr->out;
		if (c->stream_arg[slot].masked && c->part.count > 0 &&
		    c->stream_arg[slot].partial < 0 &&
		    (c->stream_arg[slot].partial = partial_take(c)) < 0) {
			credit_want(c, w); /* when a masked upload is whole */
			continue;
		}
		m.u.update_credit.round = round_of(c, w);
		m.u.update_credit.chunks = give;
		/* (the same on every credit of an upload: fixed at its begin) */
		m.u.update_credit.staleness = cohorts_on(c) ? w->staleness : 0;
#ifdef FB_TEST_LIAR
		static bool lied;
		if (cohorts_on(c) && !lied && liar_tells("staleness")) {
			lied = true;
			m.u.update_credit.staleness =
			    (uint32_t)c->cfg->max_staleness + 1;
			fb_log_warn("test liar: %s's upload is credited %u steps "
			            "stale", w->name, m.u.update_credit.staleness);
		}
#endif
		if (coord_send(c, w, &m, NULL, 0, NULL) != FB_OK) {
			credit_want(c, w); /* again on the next pass */
			continue;
		}
		w->credit += give;
		w->credited += give;
		cr->out += give;
		cr->peak = cr->out > cr->peak ? cr->out : cr->peak;
	}
}

/* Plain mode: what an update claims must be what the worker declared,
 * and FedNova needs its normaliser. */
static bool
begin_plain_ok(coord *c, worker *w, const fb_msg *m)
{
	if (m->u.update_begin.num_samples != w->num_samples) {
		guard_drop(c, DROP_UNEXPECTED, "update from %s claims %" PRIu64
		    " samples, it declared %" PRIu64, w->name,
		    m->u.update_begin.num_samples, w->num_samples);
		round_worker_failed(c, w, "sample count changed");
		return false;
	}
	if (fb_rule_is_fednova(c->cfg->rule) &&
	    !(m->u.update_begin.a_norm > 0 &&
	        isfinite(m->u.update_begin.a_norm))) {
		guard_drop(c, DROP_MALFORMED, "FedNova update from %s without a "
		    "normaliser", w->name);
		round_worker_failed(c, w, "FedNova update without a normaliser");
		return false;
	}
	if (fb_rule_is_fednova(c->cfg->rule) &&
	    m->u.update_begin.a_norm > sa_a_bound(c)) {
		/* more than the round's most local steps can give: it would
		 * scale the whole round's step (tau_eff) */
		guard_drop(c, DROP_MALFORMED, "FedNova update from %s with a "
		    "normaliser of %g, above the round's bound %g", w->name,
		    m->u.update_begin.a_norm, sa_a_bound(c));
		round_worker_failed(c, w, "FedNova normaliser out of range");
		return false;
	}
	return true;
}

/* Secure mode: the decryptor of the update's stream, or NULL (dropped). */
static fb_stream_pull *
begin_stream(coord *c, worker *w, const fb_msg *m)
{
	fb_stream_ctx ctx = {.run = c->run, .round = round_of(c, w),
	    .sender = w->id};
	fb_reject why = FB_REJECT_NONE;
	fb_stream_pull *pull = NULL;

	if (m->u.update_begin.stream_key.len != FB_STREAM_KEY_LEN) {
		guard_drop(c, DROP_MALFORMED, "update from %s without a stream "
		    "key", w->name);
		round_worker_failed(c, w, "update without a stream key");
		return NULL;
	}
	if (m->u.update_begin.stream_header.len == FB_STREAM_HEADER_LEN &&
	    m->u.update_begin.stream_header.b[2] !=
	        FB_STREAM_DIGEST_INDEXED_TAGS) {
		/* one version on both ends: no negotiation, no downgrade */
		guard_drop(c, DROP_MALFORMED, "update stream from %s in digest "
		    "mode %u; this coordinator takes only mode %u (indexed "
		    "tags): the worker runs another fedbox version", w->name,
		    (unsigned)m->u.update_begin.stream_header.b[2],
		    (unsigned)FB_STREAM_DIGEST_INDEXED_TAGS);
		round_worker_failed(c, w, "update stream in another digest mode "
		    "(another fedbox version)");
		return NULL;
	}
	if (fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_INDEXED_TAGS,
	        m->u.update_begin.stream_key.b,
	        m->u.update_begin.stream_header.b,
	        m->u.update_begin.stream_header.len, c->chunk_elems * 4, &pull,
	        &why) != FB_OK) {
		guard_drop(c, guard_reason_of_reject(why), "update stream header "
		    "from %s: %s", w->name, fb_reject_name(why));
		round_worker_failed(c, w, "bad update stream header");
		return NULL;
	}
	return pull;
}

/* The round has its updates: a later one is told so and left out. */
static bool
begin_needed(coord *c, worker *w)
{
	fb_msg cm = {.type = FB_MSG_ROUND_CANCEL};

	if (w->again || updates_claimed(c) < c->rd.target_updates) {
		return true; /* (asked again: its claim is counted already) */
	}
	cm.u.round_cancel.round = round_of(c, w);
	snprintf(cm.u.round_cancel.reason, sizeof(cm.u.round_cancel.reason),
	    "the round has its %u updates (over-selection)",
	    c->rd.target_updates);
	(void)coord_send(c, w, &cm, NULL, 0, NULL);
	round_worker_failed(c, w, "not needed: over-selected and later");
	return false;
}

/* Records what UpdateBegin says about the worker's training: nothing of
 * it under secure aggregation, where an honest worker says nothing (and
 * what another says is not kept, nor shown). */
static void
begin_record(coord *c, worker *w, const fb_msg *m)
{
	double sp = m->u.update_begin.steps_per_second;
	bool plain = c->sa->phase == SA_OFF;

	w->a_norm = plain ? m->u.update_begin.a_norm : 0;
	if (plain && sp > 0 && isfinite(sp)) {
		w->round_speed = sp;
		w->speed = w->has_speed ? 0.5 * w->speed + 0.5 * sp : sp;
		w->has_speed = true;
	}
	w->state = W_UPLOADING;
	w->again = false;
	w->next_chunk = 0;
	w->final_seen = false;
	c->rd.upload_round[registry_slot(c, w).v] = c->rd.number;
	w->begin_s = fb_now_s();
	if (c->rd.first_begin_s == 0) {
		c->rd.first_begin_s = w->begin_s;
	}
	w->steps = plain ? m->u.update_begin.steps : 0;
	w->train_loss = plain ? m->u.update_begin.train_loss : 0;
	w->train_seconds = plain ? m->u.update_begin.train_seconds : 0;
	if (plain) {
		fedeval_record(w, m);
	} else {
		fedeval_clear(w); /* under SecAgg it is in the masked sum */
	}
	if (m->u.update_begin.backend[0] != '\0') {
		snprintf(w->backend, sizeof(w->backend), "%s",
		    m->u.update_begin.backend);
	}
}

static void begin_in(coord *c, worker *w, const fb_msg *m);

void
upload_on_begin(coord *c, worker *w, const fb_msg *m)
{
	cohort *co;
	sa_round *prev;

	if (!cohorts_on(c)) {
		begin_in(c, w, m);
		return;
	}
	/* secure async: the masked input goes into its cohort's sum */
	co = cohort_of(c, m->u.update_begin.round);
	if (co == NULL || !round_open_to(c, w, m->u.update_begin.round)) {
		guard_drop(c, DROP_STALE_ROUND, "update for round %u from %s, "
		    "of no cohort running its task", m->u.update_begin.round,
		    w->name);
		return;
	}
	prev = cohort_enter(c, co, w);
	cohort_note_staleness(c, co, w);
	begin_in(c, w, m);
	cohort_leave(c, prev, w);
	cohort_note_begin(c, w, c->now);
}

static void
begin_in(coord *c, worker *w, const fb_msg *m)
{
	wslot slot = registry_slot(c, w);
	fb_stream_pull *pull = NULL;
	bool masked = c->sa->phase != SA_OFF;

	if (async_on_begin(c, w, m)) {
		return; /* round.mode async: held back, or too stale */
	}
	if (!round_open_to(c, w, m->u.update_begin.round)) {
		guard_drop(c, DROP_STALE_ROUND, "update for round %u from %s "
		    "(round %u is open)", m->u.update_begin.round, w->name,
		    c->rd.number);
		return;
	}
	if (w->state != W_TRAINING && !(w->state == W_UPLOADING && w->again)) {
		guard_drop(c, DROP_UNEXPECTED, "update_begin from %s, which is %s",
		    w->name, worker_state_names[w->state]);
		return;
	}
	if (m->u.update_begin.param_count != c->param_count ||
	    m->u.update_begin.chunk_count != c->rd.in_chunks) {
		guard_drop(c, DROP_WRONG_SIZE, "update from %s has %" PRIu64
		    " params in %u chunks; the model has %" PRIu64 " in %u",
		    w->name, m->u.update_begin.param_count,
		    m->u.update_begin.chunk_count, c->param_count,
		    c->rd.in_chunks);
		round_worker_failed(c, w, "update of the wrong size");
		return;
	}
	if (masked && (c->sa->phase != SA_INPUT ||
	                  !(c->sa->flags[w->sa_slot] & SA_F_SHARED))) {
		guard_drop(c, DROP_UNEXPECTED, "masked update from %s before its "
		    "shares were relayed (%s phase)", w->name,
		    sa_phase_names[c->sa->phase]);
		round_worker_failed(c, w, "update before secure-aggregation "
		                          "setup");
		return;
	}
	if (!masked && !begin_plain_ok(c, w, m)) {
		return;
	}
	if (c->secure && (pull = begin_stream(c, w, m)) == NULL) {
		return;
	}
	if (!begin_needed(c, w)) {
		fb_stream_pull_free(pull);
		return;
	}
	/* The pool takes the decryptor (plain mode: none). */
	c->stream_arg[slot.v].weight = w->weight;
	c->stream_arg[slot.v].masked = masked;
	c->stream_arg[slot.v].partial = -1;
	c->stream_arg[slot.v].first_chunk = w->first_chunk;
	c->stream_arg[slot.v].sa_slot = w->sa_slot;
	c->stream_arg[slot.v].cohort = cohorts_on(c) ? c->sa->p.round : 0;
	c->stream_arg[slot.v].accum = cohorts_on(c)
	    ? cohort_of(c, c->sa->p.round)->accum
	    : c->accum;
	c->stream_arg[slot.v].extra = c->sa->extra;
	c->stream_arg[slot.v].epoch =
	    atomic_load_explicit(&c->part.epoch, memory_order_relaxed);
	atomic_store_explicit(&c->stream_arg[slot.v].added, 0,
	    memory_order_relaxed);
	if (fb_ingest_begin(c->ingest, slot.v, pull, &c->stream_arg[slot.v],
	        &w->ingest_gen) != FB_OK) {
		round_worker_failed(c, w, "out of memory");
		return;
	}
	c->stream_arg[slot.v].gen = w->ingest_gen;
	begin_record(c, w, m);
	w->credit = 0;
	w->credited = 0;
	credit_want(c, w);
	upload_credit_pump(c);
}

void
upload_on_chunk(coord *c, worker *w, const fb_msg *m, fb_buf *buf)
{
	uint32_t k = m->u.update_chunk.chunk, expect;
	size_t len = fb_buf_len(buf);
	uint64_t elems;

	if (!round_open_to(c, w, m->u.update_chunk.round)) {
		guard_drop(c, DROP_STALE_ROUND, "update chunk for round %u from "
		    "%s (round %u is open)", m->u.update_chunk.round, w->name,
		    c->rd.number);
		goto drop;
	}
	if (w->state == W_UPLOADING && w->again) {
		/* of the stream it was asked to send again: sent before it
		 * heard, and of no use now */
		goto drop;
	}
	if (w->state != W_UPLOADING || w->next_chunk == c->rd.in_chunks) {
		/* (all chunks in: the update is done or being finished) */
		guard_drop(c, DROP_UNEXPECTED, "update chunk from %s, which is %s",
		    w->name, w->state != W_UPLOADING
		        ? worker_state_names[w->state] : "done");
		goto drop;
	}
	expect = fb_upload_chunk(w->first_chunk, c->chunk_count,
	    w->next_chunk);
	if (k != expect) {
		guard_drop(c, DROP_OUT_OF_ORDER, "update chunk %u from %s, "
		    "expected %u", k, w->name, expect);
		round_worker_failed(c, w, "update chunks out of order");
		goto drop;
	}
	if (k >= c->rd.in_chunks) {
		guard_drop(c, DROP_WRONG_SIZE, "update chunk %u from %s: the "
		    "update has %u chunks", k, w->name, c->rd.in_chunks);
		round_worker_failed(c, w, "update chunk out of range");
		goto drop;
	}
	elems = k < c->chunk_count ? fb_accum_chunk_len(c->accum, k)
	                           : SA_EXTRA;
	if (len != elems * 4 + (c->secure ? FB_STREAM_CHUNK_OVERHEAD : 0)) {
		guard_drop(c, DROP_WRONG_SIZE, "update chunk %u from %s has %zu "
		    "bytes, expected %" PRIu64, k, w->name, len, elems * 4);
		round_worker_failed(c, w, "update chunk of the wrong size");
		goto drop;
	}
	if (w->credit == 0) {
		guard_drop(c, DROP_UNEXPECTED, "update chunk %u from %s "
		    "without a credit", k, w->name);
		round_worker_failed(c, w, "update chunks sent without credit");
		goto drop;
	}
	if (w->next_chunk == 0) {
		/* (bench/transfer times an upload from here) */
		fb_log_debug("round %u: first update chunk from %s",
		    c->rd.number, w->name);
	}
	/* its credit goes back to the budget: the chunk is here */
	w->credit--;
	c->cr.out--;
	if (w->credited < c->rd.in_chunks &&
	    w->credit <= c->cr.per_worker / 2) {
		credit_want(c, w);
	}
	/* Decrypted (secure mode), checked and added by the ingest pool;
	 * what it refuses comes back in upload_results(). It takes buf. */
	if (fb_ingest_chunk(c->ingest, registry_slot(c, w).v, k, buf,
	        w->next_chunk + 1 == c->rd.in_chunks) != FB_OK) {
		round_worker_failed(c, w, "out of memory");
		return;
	}
	w->next_chunk++;
	upload_credit_pump(c);
	return;
drop:
	fb_buf_free(buf);
}

void
upload_on_end(coord *c, worker *w, const fb_msg *m)
{
	fb_pubkey pk;

	if (!round_open_to(c, w, m->u.update_end.round)) {
		guard_drop(c, DROP_STALE_ROUND, "update end for round %u from %s",
		    m->u.update_end.round, w->name);
		return;
	}
	if (!c->secure) {
		return; /* plain updates are complete at their last chunk */
	}
	if (w->state == W_UPLOADING && w->again) {
		return; /* the end of the stream it is sending again */
	}
	if (w->state != W_UPLOADING || w->next_chunk != c->rd.in_chunks ||
	    w->final_seen) {
		guard_drop(c, DROP_TRUNCATED, "update end from %s after %u of %u "
		    "chunks", w->name, w->next_chunk, c->rd.in_chunks);
		round_worker_failed(c, w, "update truncated");
		return;
	}
	/* Checked by the pool after the last chunk: see upload_results(). */
	pk = c->reg.allow[w->id];
	if (fb_ingest_end(c->ingest, registry_slot(c, w).v, &pk,
	        m->u.update_end.stream_trailer.b,
	        m->u.update_end.stream_trailer.len) != FB_OK) {
		round_worker_failed(c, w, "out of memory");
		return;
	}
	w->final_seen = true;
}

/* A complete update: the worker is done (and included, with SecAgg). */
static void
result_done(coord *c, worker *w)
{
	double now;

	if (w->state != W_UPLOADING) {
		return;
	}
	w->state = W_DONE;
	w->done_ms = c->now;
	now = fb_now_s();
	fb_log_debug("round %u: %supdate from %s complete (%.6fs after the "
	             "first update began; it took %.6fs)",
	    c->rd.number, c->secure ? "signed " : "", w->name,
	    now - c->rd.first_begin_s, now - w->begin_s);
}

/* A refused stream: dropped and counted, and its worker leaves. */
static void
result_failed(coord *c, worker *w, const fb_ingest_result *r,
    const char *name)
{
	const char *why;

	if (r->stage == FB_INGEST_AT_TRAILER) {
		guard_drop(c, guard_reason_of_reject(r->reject), "update trailer "
		    "from %s: %s", name, fb_reject_name(r->reject));
		why = "update signature rejected";
	} else if (r->stage == FB_INGEST_AT_DECRYPT) {
		guard_drop(c, guard_reason_of_reject(r->reject), "update chunk %u "
		    "from %s: %s", r->chunk, name, fb_reject_name(r->reject));
		why = "update stream rejected";
	} else if (r->stage == FB_INGEST_AT_FINAL_MARK) {
		guard_drop(c, DROP_TRUNCATED, "update chunk %u from %s: final "
		    "mark on the wrong chunk", r->chunk, name);
		why = "update stream rejected";
	} else if (r->err == FB_EINVAL) {
		guard_drop(c, DROP_NONFINITE, "update chunk %u from %s holds NaN "
		    "or infinity", r->chunk, name);
		why = "non-finite values in the update";
	} else {
		guard_drop(c, DROP_UNEXPECTED, "update chunk %u from %s: %s",
		    r->chunk, name, fb_strerror(r->err));
		why = "update could not be added";
	}
	if (w != NULL) {
		round_worker_failed(c, w, why);
	}
}

void
upload_results(coord *c)
{
	fb_ingest_result r;

	while (fb_ingest_result_next(c->ingest, &r)) {
		worker *w = &c->reg.workers[r.slot];
		bool cur = w->used && w->ingest_gen == r.gen;

		c->g.cur_peer = cur ? &w->peer : NULL;
		if (cur) {
			w->next_chunk = r.consumed;
		}
		if (r.status == FB_INGEST_DONE && cohorts_on(c)) {
			const ingest_arg *a = &c->stream_arg[r.slot];
			cohort *co = cohort_of(c, a->cohort);
			if (a->masked && a->gen == r.gen && co != NULL &&
			    co->state == CO_RUNNING) {
				/* whole, in its cohort's sum */
				sa_round *prev = cohort_enter(c, co, NULL);
				sa_note_included(c, a->sa_slot);
				cohort_leave(c, prev, NULL);
			}
			if (cur) {
				result_done(c, w);
			}
		} else if (r.status == FB_INGEST_DONE) {
			const ingest_arg *a = &c->stream_arg[r.slot];
			if (a->masked && a->gen == r.gen &&
			    c->sa->phase != SA_OFF &&
			    (c->part.count > 0 ||
			        a->epoch == atomic_load_explicit(&c->part.epoch,
			                        memory_order_relaxed))) {
				/* whole, and in the sum: included, even if its
				 * worker has been cut off or left since */
				sa_note_included(c, a->sa_slot);
			}
			if (cur) {
				result_done(c, w);
			}
		} else {
			result_failed(c, cur ? w : NULL, &r,
			    cur ? w->name : "a departed worker");
		}
		c->g.cur_peer = NULL;
	}
}

void
upload_settle(coord *c)
{
	fb_ingest_drain(c->ingest);
	upload_results(c);
}

/*
 * max_uploads 0: a masked stream ended incomplete with some of its chunks
 * in the sum (upload_end_cb). The sum starts again in a new epoch, empty,
 * and every worker whose masked input was in it or under way is asked to
 * send it again; what comes of their old streams is dropped. The loop
 * waits for the pool's queued chunks (a few, bounded by its queue) and
 * resets the accumulator, O(chunks): nothing here is a pass over the
 * model.
 */
bool
upload_sum_check(coord *c, int64_t now)
{
	partials *pt = &c->part;
	uint32_t asked = 0;

	if (pt->count > 0 ||
	    !atomic_load_explicit(&pt->cut, memory_order_acquire)) {
		return false;
	}
	/* what the old streams still do no longer counts as a cut */
	atomic_fetch_add_explicit(&pt->epoch, 1, memory_order_relaxed);
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		if (w->used && w->state == W_UPLOADING && !w->again) {
			fb_ingest_abort(c->ingest, i);
		}
	}
	upload_settle(c);
	atomic_store_explicit(&pt->cut, false, memory_order_relaxed);
	if (c->sa->phase != SA_INPUT) {
		return false; /* no masked input streams in now */
	}
	fb_accum_reset(c->accum);
	sa_inputs_again(c);
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		if (!w->used || w->again ||
		    !(w->state == W_DONE || w->state == W_UPLOADING)) {
			continue; /* (asked already: nothing of it in the sum) */
		}
		upload_credit_release(c, w);
		w->credited = 0;
		w->next_chunk = 0;
		w->final_seen = false;
		w->state = W_UPLOADING;
		w->again = true;
		if (sa_ask_again(c, w) != FB_OK) {
			round_worker_failed(c, w, "could not be asked for its "
			                          "masked input again");
			continue;
		}
		asked++;
	}
	c->rd.sum_restarts++;
	c->rd.restart_ms = now;
	fb_log_warn("round %u: a masked upload cut off midway was partly in the "
	            "sum (secure_aggregation.max_uploads: 0): the sum starts "
	            "again, and %u worker%s send%s their masked input again",
	    c->rd.number, asked, asked == 1 ? "" : "s", asked == 1 ? "s" : "");
	return true;
}

/*
 * The ingest pool's callback: adds one decrypted chunk with the update's
 * weight, or (secure aggregation) its masked ring elements. Calls for the
 * same chunk may run at once (cb_concurrent): the accumulator locks parts
 * of a chunk, so several updates are added into one chunk in parallel,
 * and the pool's idle threads take parts of each add
 * (fb_accum_set_parallel); the few SecAgg extras have a lock of their own.
 */
fb_err
upload_add_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	coord *c = arg;
	ingest_arg *a = stream_arg;

	if (a->masked && c->part.count == 0) {
		fb_err rc = FB_EPROTO;
		if (chunk < c->chunk_count) {
			rc = fb_accum_ring_add(a->accum, chunk, data, len / 4);
		} else if (chunk == c->chunk_count && len == SA_EXTRA * 4) {
			pthread_mutex_lock(&c->extra_mu);
			fb_ring_add(a->extra, data, SA_EXTRA);
			pthread_mutex_unlock(&c->extra_mu);
			rc = FB_OK;
		}
		if (rc == FB_OK) {
			atomic_fetch_add_explicit(&a->added, 1,
			    memory_order_relaxed);
		}
		return rc;
	}
	if (a->masked) {
		/* kept apart: into the sum once whole (upload_end_cb); a
		 * decrypted chunk is there already (upload_dst_cb) */
		uint32_t *dst;
		if (a->partial < 0 || (uint32_t)a->partial >= c->part.count) {
			return FB_EPROTO;
		}
		if (chunk < c->chunk_count &&
		    len == fb_accum_chunk_len(a->accum, chunk) * 4) {
			dst = c->part.buf[a->partial] +
			      (uint64_t)chunk * c->chunk_elems;
		} else if (chunk == c->chunk_count && len == SA_EXTRA * 4) {
			dst = c->part.buf[a->partial] + c->param_count;
		} else {
			return FB_EPROTO;
		}
		if ((void *)dst != data) {
			memcpy(dst, data, len);
		}
		return FB_OK;
	}
	if (chunk >= c->chunk_count ||
	    len != fb_accum_chunk_len(a->accum, chunk) * 4) {
		return FB_EPROTO;
	}
	return fb_accum_add(a->accum, chunk, data, a->weight, counter);
}

/*
 * The ingest pool's destination callback: a masked chunk is decrypted
 * straight into its place in the upload's buffer (no copy from the
 * scratch). A chunk that fails leaves bytes there: the buffer reaches the
 * sum only when the whole stream is complete and signed.
 */
void *
upload_dst_cb(void *arg, void *stream_arg, uint32_t chunk, size_t *cap)
{
	coord *c = arg;
	const ingest_arg *a = stream_arg;

	*cap = 0;
	if (!a->masked || a->partial < 0 ||
	    (uint32_t)a->partial >= c->part.count) {
		return NULL;
	}
	if (chunk < c->chunk_count) {
		*cap = fb_accum_chunk_len(a->accum, chunk) * 4;
		return c->part.buf[a->partial] +
		       (uint64_t)chunk * c->chunk_elems;
	}
	if (chunk == c->chunk_count) {
		*cap = SA_EXTRA * 4;
		return c->part.buf[a->partial] + c->param_count;
	}
	return NULL;
}

/*
 * The ingest pool's end callback: a masked input that is whole (its
 * trailer verified) goes into the sum, chunk by chunk from where its
 * upload started (so that streams finishing together add into different
 * chunks), then the extras; whole or not, its buffer is free again.
 */
fb_err
upload_end_cb(void *arg, void *stream_arg, bool complete)
{
	coord *c = arg;
	ingest_arg *a = stream_arg;
	fb_err rc = FB_OK;
	const uint32_t *src;

	if (a->masked && c->part.count == 0) {
		/* straight into the sum: a part of it there is a cut */
		if (!complete &&
		    atomic_load_explicit(&a->added, memory_order_relaxed) > 0 &&
		    a->epoch == atomic_load_explicit(&c->part.epoch,
		                    memory_order_relaxed)) {
			atomic_store_explicit(&c->part.cut, true,
			    memory_order_release);
		}
		return FB_OK;
	}
	if (!a->masked || a->partial < 0 ||
	    (uint32_t)a->partial >= c->part.count) {
		return FB_OK;
	}
	src = c->part.buf[a->partial];
	for (uint32_t i = 0; complete && rc == FB_OK && i < c->chunk_count;
	     i++) {
		uint32_t k = (a->first_chunk + i) % c->chunk_count;
		rc = fb_accum_ring_add(a->accum, k,
		    src + (uint64_t)k * c->chunk_elems,
		    fb_accum_chunk_len(a->accum, k));
	}
	if (complete && rc == FB_OK) {
		pthread_mutex_lock(&c->extra_mu);
		fb_ring_add(a->extra, src + c->param_count, SA_EXTRA);
		pthread_mutex_unlock(&c->extra_mu);
	}
	atomic_store_explicit(&c->part.busy[a->partial].v, false,
	    memory_order_release);
	return rc;
}
