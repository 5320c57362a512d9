/* SPDX-License-Identifier: Apache-2.0 */
/*
 * async.c -- round.mode: async, buffered asynchronous aggregation (FedBuff,
 * Nguyen et al. 2022) on the round's phase machine (round.c). Each round
 * is one server step and its buffer:
 *
 *   IDLE      the buffer opens (async_begin): the sum is reset and the
 *             weights' normaliser fixed; security on: PREPARE encrypts the
 *             model of this version once
 *   TRAIN     every worker that is free gets a task at once, trained from
 *             the model of the moment (async_open, async_step); each update
 *             that completes goes into the buffer, weighted by its sample
 *             count and 1/sqrt(1 + staleness) (fb_staleness_weight); an
 *             update more than round.max_staleness steps old is dropped
 *   OVERTIME  the buffer has round.buffer_size updates (or its deadline
 *             passed): uploads under way finish into it, new ones wait for
 *             the next buffer
 *   AGGREGATE the job steps the server rule with fb_fedbuff_weights' scale
 *   RECORD    one metrics line: the step, and each update's version and
 *             staleness
 * Workers still training keep their tasks across steps: nobody waits for
 * them, and one that dies is simply gone. Nothing here blocks or touches a
 * socket but through coord_send.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

static bool
async_on(const coord *c)
{
	return c->cfg->mode == FB_MODE_ASYNC;
}

/* A worker's messages belong to its task, whose round may be older than
 * the buffer's: its update stream, credits and cancel carry it. */
bool
round_open_to(const coord *c, const worker *w, uint32_t round)
{
	if (c->cfg->mode != FB_MODE_ASYNC) {
		return round_open_for(c, round);
	}
	if (cohorts_on(c)) {
		return cohort_open_to(c, w, round);
	}
	return round == w->task_round && (c->rd.phase == PHASE_TRAIN ||
	                                     c->rd.phase == PHASE_OVERTIME);
}

uint32_t
round_of(const coord *c, const worker *w)
{
	return c->cfg->mode == FB_MODE_ASYNC ? w->task_round : c->rd.number;
}

fb_err
async_alloc(coord *c)
{
	async_state *as = &c->as;
	uint32_t cap = c->reg.cap;

	if (!async_on(c)) {
		return FB_OK;
	}
	as->cap = (uint32_t)c->cfg->buffer_size + cap;
	as->buf = calloc(as->cap, sizeof(*as->buf));
	as->deferred = calloc(cap, sizeof(*as->deferred));
	as->deferred_id = calloc(cap, sizeof(*as->deferred_id));
	as->has_deferred = calloc(cap, sizeof(*as->has_deferred));
	if (as->buf == NULL || as->deferred == NULL ||
	    as->deferred_id == NULL || as->has_deferred == NULL) {
		return FB_ENOMEM;
	}
	return FB_OK;
}

void
async_fini(coord *c)
{
	async_state *as = &c->as;

	free(as->buf);
	free(as->deferred);
	free(as->deferred_id);
	free(as->has_deferred);
	memset(as, 0, sizeof(*as));
}

void
async_begin(coord *c, int64_t now)
{
	async_state *as = &c->as;
	round_state *rd = &c->rd;

	round_reset(c, now);
	as->count = 0;
	as->begun = 0;
	as->closing = false;
	as->dropped_stale = 0;
	as->superseded = 0;
	as->scale = NAN;
	as->n_max = 1;
	as->limit = (uint32_t)c->cfg->buffer_size;
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (w->used && w->num_samples > as->n_max) {
			as->n_max = w->num_samples;
		}
		as->limit += w->used;
	}
	/* Each weight is at most n_max / norm, and at most `limit` begin
	 * (async_on_begin holds back the rest): their sum stays within the
	 * accumulator's 1. A buffer ends with at most buffer_size - 1
	 * complete updates plus one upload per live worker, so `limit` is
	 * seldom reached, and the weights stay large enough for the sum's
	 * fixed point (its error grows as 1 / their sum). */
	as->limit = as->limit < as->cap ? as->limit : as->cap;
	as->norm = (double)as->limit * (double)as->n_max;
	rd->nsel = 0;
	rd->target_updates = UINT32_MAX; /* no over-selection */
	round_open_model(c, now);
}

/* round.seed, then a new stream of batches for every task (and for every
 * task of a resumed run: the version is in it too). */
uint64_t
async_task_seed(coord *c)
{
	return (uint64_t)c->cfg->seed +
	    (++c->as.tasks + ((uint64_t)c->rd.committed << 32)) *
	        0x9e3779b97f4a7c15ULL;
}

/* Gives worker w a task trained from the model of this moment. */
static void
dispatch(coord *c, worker *w)
{
	round_state *rd = &c->rd;
	wslot slot = registry_slot(c, w);

	round_task_reset(c, w, (uint32_t)((uint64_t)slot.v * c->chunk_count /
	    (c->reg.cap > 0 ? c->reg.cap : 1)));
	w->fail_reason = NULL;
	w->task_round = rd->number;
	w->task_version = rd->committed;
	w->staleness = 0;
	w->task_seed = async_task_seed(c);
	rd->r.selected++;
	round_send_start(c, w);
}

/* Gives every free worker a task. A worker whose task failed in this
 * buffer waits for the next one (a worker that cannot train is not asked
 * again and again within one step). So does every free worker once the
 * buffer's last updates are under way: the model is about to step, and a
 * task given now would train from the old one (or find it gone before
 * its fetch); the step takes milliseconds to seconds, then all go. */
static void
dispatch_free(coord *c)
{
	uint32_t pending = c->as.count;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		pending += w->used && w->state == W_UPLOADING;
	}
	if (pending >= (uint32_t)c->cfg->buffer_size) {
		return;
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		if (!w->used || c->as.has_deferred[i]) {
			continue;
		}
		if (w->state == W_IDLE ||
		    (w->state == W_FAILED && w->task_round != c->rd.number)) {
			dispatch(c, w);
		}
	}
}

void
async_open(coord *c, int64_t now)
{
	async_state *as = &c->as;

	c->rd.deadline_ms = now + c->cfg->deadline_ms;
	round_enter(c, PHASE_TRAIN, now);
	/* The begins held back while the last buffer closed go first. */
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		if (!as->has_deferred[i]) {
			continue;
		}
		as->has_deferred[i] = false;
		if (w->used && w->id == as->deferred_id[i]) {
			upload_on_begin(c, w, &as->deferred[i]);
		}
	}
	dispatch_free(c);
}

/* Ends w's task without its fault: it is free again at once. */
static void
task_cancel(coord *c, worker *w, const char *why)
{
	fb_msg m = {.type = FB_MSG_ROUND_CANCEL};

	m.u.round_cancel.round = w->task_round;
	snprintf(m.u.round_cancel.reason, sizeof(m.u.round_cancel.reason), "%s",
	    why);
	(void)coord_send(c, w, &m, NULL, 0, NULL);
	upload_credit_release(c, w);
	w->state = W_IDLE;
}

bool
async_on_begin(coord *c, worker *w, const fb_msg *m)
{
	async_state *as = &c->as;
	round_state *rd = &c->rd;
	wslot slot = registry_slot(c, w);
	uint32_t s;
	char why[160];

	if (!async_on(c) || cohorts_on(c) ||
	    m->u.update_begin.round != w->task_round ||
	    w->state != W_TRAINING) {
		return false; /* upload_on_begin's own checks */
	}
	if (rd->phase != PHASE_TRAIN || as->closing ||
	    w->num_samples > as->n_max || as->begun >= as->limit) {
		/* the next buffer takes it; the worker waits for credit */
		as->deferred[slot.v] = *m;
		as->deferred_id[slot.v] = w->id;
		as->has_deferred[slot.v] = true;
		return true;
	}
	s = rd->committed - w->task_version;
	if (s > (uint32_t)c->cfg->max_staleness) {
		as->dropped_stale++;
		snprintf(why, sizeof(why), "trained from model version %u, %u "
		    "steps old: past round.max_staleness (%lld)", w->task_version,
		    s, (long long)c->cfg->max_staleness);
		fb_log_info("round %u: update of %s dropped: %s", rd->number,
		    w->name, why);
		task_cancel(c, w, why);
		return true;
	}
	w->staleness = s;
	w->weight = (double)w->num_samples * fb_staleness_weight(s) /
	    as->norm;
	as->begun++;
	return false;
}

bool
async_fetch_ok(coord *c, worker *w)
{
	if (!async_on(c)) {
		return true;
	}
	if (cohorts_on(c)) {
		return cohort_fetch_ok(c, w);
	}
	if (w->task_round == c->rd.number && (c->rd.phase == PHASE_TRAIN ||
	                                        c->rd.phase == PHASE_OVERTIME)) {
		return true;
	}
	/* The server stepped between its task and its fetch: the model it
	 * was given is gone. */
	c->as.superseded++;
	task_cancel(c, w, "its model was superseded before it was fetched");
	return false;
}

/* Moves the complete updates into the buffer; their workers are free. */
static void
harvest(coord *c)
{
	async_state *as = &c->as;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		async_entry *e;
		if (!w->used || w->state != W_DONE) {
			continue;
		}
		w->state = W_IDLE;
		if (as->count == as->cap) {
			/* cannot be: at most `limit` <= cap begin per buffer */
			fb_log_error("round %u: buffer full; update of %s lost",
			    c->rd.number, w->name);
			continue;
		}
		e = &as->buf[as->count++];
		snprintf(e->name, sizeof(e->name), "%s", w->name);
		snprintf(e->backend, sizeof(e->backend), "%s", w->backend);
		e->n = w->num_samples;
		e->version = w->task_version;
		e->staleness = w->staleness;
		e->steps = w->steps;
		e->train_loss = w->train_loss;
		e->train_seconds = w->train_seconds;
		e->speed = w->round_speed;
		e->a_norm = w->a_norm;
	}
}

/* The buffer's results: participants, backend, train loss (weighted as in
 * the step), the scale, FedNova's tau_eff. */
static fb_err
buffer_tally(coord *c, double *scale)
{
	async_state *as = &c->as;
	round_result *r = &c->rd.r;
	uint64_t *n = calloc(as->count, sizeof(*n));
	uint64_t *s = calloc(as->count, sizeof(*s));
	double *w = calloc(as->count, sizeof(*w));
	double *a = calloc(as->count, sizeof(*a));
	double tau = 1.0, loss = 0;
	fb_err rc = FB_ENOMEM;

	if (n == NULL || s == NULL || w == NULL || a == NULL) {
		goto out;
	}
	for (uint32_t i = 0; i < as->count; i++) {
		const async_entry *e = &as->buf[i];
		n[i] = e->n;
		s[i] = e->staleness;
		a[i] = e->a_norm;
		if (r->backend[0] == '\0') {
			snprintf(r->backend, sizeof(r->backend), "%s", e->backend);
		} else if (strcmp(r->backend, e->backend) != 0) {
			r->mixed = true;
		}
	}
	r->participants = as->count;
	if ((rc = fb_fedbuff_weights(n, s, as->count, w, scale)) != FB_OK) {
		goto out;
	}
	for (uint32_t i = 0; i < as->count; i++) {
		loss += w[i] * as->buf[i].train_loss;
	}
	r->train_loss = loss;
	as->scale = *scale;
	if (fb_rule_is_fednova(c->cfg->rule)) {
		rc = fb_fednova_tau_eff(w, a, as->count, &tau);
		*scale *= tau;
	}
out:
	free(n);
	free(s);
	free(w);
	free(a);
	return rc;
}

/* The buffer is closed and its uploads are in: the server steps. */
static void
buffer_step(coord *c, int64_t now)
{
	round_state *rd = &c->rd;
	job *j = &c->job;
	double scale = 0;

	upload_settle(c);
	harvest(c);
	rd->clipped = fb_ingest_counter(c->ingest) - rd->clipped_base;
	if (c->as.count < (uint32_t)c->cfg->min_updates) {
		round_fail(c, ROUND_FAILED, now, "%u complete updates by the "
		    "deadline, %lld needed (round.min_updates)", c->as.count,
		    (long long)c->cfg->min_updates);
		return;
	}
	if (buffer_tally(c, &scale) != FB_OK) {
		round_fail(c, ROUND_FAILED, now, "the buffer's weights are "
		    "unusable");
		return;
	}
	/* late fetches of this buffer's model are superseded: none is
	 * sealed from the model the step writes */
	broadcast_freeze(c);
	if (model_writable(c, &c->params_lent, c->param_count * 4, true) !=
	    FB_OK) {
		round_fail(c, ROUND_FAILED, now, "out of memory for the model");
		return;
	}
	c->params = fb_lent_data(c->params_lent);
	j->eval_only = false;
	j->secure_sum = false;
	j->sa = NULL;
	j->accum = c->accum;
	j->sa_scale = 1.0;
	j->scale = scale;
	j->evaluate = c->evaluate && c->cfg->eval_every > 0 &&
	    (rd->number % c->cfg->eval_every == 0 ||
	        rd->number == (uint32_t)c->cfg->rounds);
	jobs_submit(c, JOB_AGGREGATE);
	round_enter(c, PHASE_AGGREGATE, now);
}

void
async_step(coord *c, int64_t now)
{
	async_state *as = &c->as;
	round_state *rd = &c->rd;

	harvest(c);
	if (!as->closing) {
		dispatch_free(c);
		if (as->count < (uint32_t)c->cfg->buffer_size &&
		    now < rd->deadline_ms) {
			return;
		}
		if (as->count < (uint32_t)c->cfg->buffer_size) {
			fb_log_warn("round %u: deadline (%.1fs) reached with %u of "
			    "%lld updates", rd->number,
			    (double)c->cfg->deadline_ms / 1000.0, as->count,
			    (long long)c->cfg->buffer_size);
		}
		as->closing = true;
		as->closing_ms = now;
		round_enter(c, PHASE_OVERTIME, now);
	}
	if (upload_any_in_flight(c)) {
		if (now - as->closing_ms < c->cfg->deadline_ms) {
			return; /* uploads under way finish into this buffer */
		}
		for (uint32_t i = 0; i < c->reg.cap; i++) {
			worker *w = &c->reg.workers[i];
			if (w->used && w->state == W_UPLOADING) {
				round_cancel(c, w, "upload too slow for the step");
			}
		}
	}
	buffer_step(c, now);
}
