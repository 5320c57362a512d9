/* SPDX-License-Identifier: Apache-2.0 */
/*
 * round.c -- the round's phase machine (coordinator_impl.h, round_phase).
 *
 *   IDLE      waits for round.min_workers, then selects the round's workers
 *             (all, or a sample plus over-selection), gives each its local
 *             work (fixed, or what its measured speed fits in the time
 *             budget) and its FedAvg weight (fb_fedavg_weights)
 *   PREPARE   (security on) the job thread encrypts the model once
 *   TRAIN     RoundStart to each; the SecAgg setup runs alongside; closes
 *             when every selected worker is done or gone, or at the
 *             deadline
 *   OVERTIME  past the deadline: stragglers are waited for
 *             (round.stragglers: wait), or masked uploads under way are let
 *             finish, up to secure_aggregation.unmask_timeout
 *   UNMASK    the included set confirmed by the included workers, then
 *             their reveals, each up to unmask_timeout
 *   AGGREGATE the job thread unmasks, checks, steps the server rule
 *             (FedNova's tau_eff from fb_fednova_tau_eff), evaluates and
 *             writes the model
 *   RECORD    the job thread appends the round's metrics line
 * Every function takes `now`; nothing here touches a socket or sleeps.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

const char *const round_phase_names[PHASE_COUNT_] = {"idle", "prepare",
    "train", "overtime", "unmask", "aggregate", "record", "done"};
const char *const round_status_names[ROUND_STATUS_COUNT_] = {"ok", "failed",
    "aborted"};

void
round_enter(coord *c, round_phase p, int64_t now)
{
	fb_log_debug("round %u: %s -> %s", c->rd.number,
	    round_phase_names[c->rd.phase], round_phase_names[p]);
	c->rd.phase = p;
	c->rd.phase_ms = now;
	progress_phase(c);
}

bool
round_open_for(const coord *c, uint32_t round)
{
	return round == c->rd.number && c->rd.phase != PHASE_IDLE &&
	    c->rd.phase != PHASE_DONE;
}

void
round_worker_failed(coord *c, worker *w, const char *why)
{
	upload_credit_release(c, w);
	if (w->state != W_TRAINING && w->state != W_UPLOADING) {
		return;
	}
	if (w->state == W_UPLOADING) {
		/* Chunks already queued are still added, as they were when
		 * each was added on arrival. */
		fb_ingest_abort(c->ingest, registry_slot(c, w).v);
	}
	fb_log_warn("round %u: %s leaves the round: %s", c->rd.number, w->name,
	    why);
	w->state = W_FAILED;
	w->fail_reason = why;
}

void
round_on_failed(coord *c, worker *w, const fb_msg *m)
{
	if (m->u.round_failed.round == 0) {
		/* Round 0 is none: the worker refuses the run at its welcome
		 * (its model's layout differs) and is leaving. */
		char why[FB_TEXT_MAX + 32];
		fb_log_error("worker %s refuses this run: %s", w->name,
		    m->u.round_failed.reason);
		snprintf(why, sizeof(why), "refused the run: %s",
		    m->u.round_failed.reason);
		registry_forget(c, w, why);
		return;
	}
	/* async: its task's failure counts in any phase (a worker left
	 * training would not be given another task) */
	if (c->cfg->mode == FB_MODE_ASYNC
	        ? m->u.round_failed.round != w->task_round
	        : !round_open_for(c, m->u.round_failed.round)) {
		guard_drop(c, DROP_STALE_ROUND, "round_failed for round %u from "
		    "%s (round %u is open)", m->u.round_failed.round, w->name,
		    c->rd.number);
		return;
	}
	if (w->state != W_TRAINING && w->state != W_UPLOADING) {
		guard_drop(c, DROP_UNEXPECTED, "round_failed from %s, which is "
		    "%s", w->name, worker_state_names[w->state]);
		return;
	}
	snprintf(w->fail_text, sizeof(w->fail_text), "failed on the worker: %s",
	    m->u.round_failed.reason);
	round_worker_failed(c, w, w->fail_text);
	if (c->rd.r.worker_failed++ == 0) {
		snprintf(c->rd.r.failed_first, sizeof(c->rd.r.failed_first),
		    "%s %s", w->name, w->fail_text);
	}
}

/* Takes worker w out of the round, telling it why. */
void
round_cancel(coord *c, worker *w, const char *why)
{
	fb_msg m = {.type = FB_MSG_ROUND_CANCEL};

	m.u.round_cancel.round = round_of(c, w);
	snprintf(m.u.round_cancel.reason, sizeof(m.u.round_cancel.reason), "%s",
	    why);
	(void)coord_send(c, w, &m, NULL, 0, NULL);
	round_worker_failed(c, w, why);
}

/* Stops the workers still training (and uploading, unless keep_uploads). */
static void
cancel_stragglers(coord *c, bool deadline, bool keep_uploads)
{
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		if (!w->used || !(w->state == W_TRAINING ||
		                    (w->state == W_UPLOADING && !keep_uploads))) {
			continue;
		}
		round_cancel(c, w, !deadline ? "not needed (over-selected)"
		        : w->state == W_UPLOADING ? "deadline passed during upload"
		                                  : "deadline passed during "
		                                    "training");
	}
}

/* ---- selection and schedule ----------------------------------------------- */

/* The local steps worker w is asked for (0: it derives them from
 * local_epochs itself, keeping its sample count private). Under secure
 * aggregation no speed is known here (workers report none): a time
 * budget goes to the workers as such (send_round_starts), and this is
 * the fixed work a worker does until it has measured its speed. */
void
round_task_reset(coord *c, worker *w, uint32_t first_chunk)
{
	w->assigned_steps = round_schedule_steps(c, w);
	w->weight = 0;
	w->round_speed = 0;
	w->a_norm = 0;
	w->done_ms = 0;
	w->next_chunk = 0;
	w->steps = 0;
	w->train_loss = 0;
	w->train_seconds = 0;
	fedeval_clear(w);
	w->first_chunk = first_chunk;
}

uint64_t
round_schedule_steps(const coord *c, const worker *w)
{
	const fb_coord_config *cfg = c->cfg;
	uint64_t steps = (uint64_t)cfg->local_steps;

	if (steps == 0 && w->num_samples > 0) {
		double st = ceil(cfg->local_epochs * (double)w->num_samples /
		    (double)cfg->batch_size);
		steps = st < 1 ? 1 : (uint64_t)st;
	}
	if (cfg->local_work == FB_WORK_TIME_BUDGET && w->has_speed) {
		/* as many steps as fit in the budget at the worker's measured
		 * speed (the first round, without one, uses the fixed work) */
		double fit = floor(w->speed * (double)cfg->time_budget_ms / 1000.0);
		fit = fit < (double)cfg->min_steps ? (double)cfg->min_steps : fit;
		fit = fit > (double)cfg->max_steps ? (double)cfg->max_steps : fit;
		steps = (uint64_t)fit;
	}
	return steps;
}

/* Plain mode: each selected worker's FedAvg weight n_i / sum n. */
static fb_err
select_weights(coord *c)
{
	round_state *rd = &c->rd;
	uint64_t *n = calloc(rd->nsel, sizeof(*n));
	double *w = calloc(rd->nsel, sizeof(*w));
	fb_err rc = FB_ENOMEM;

	if (n != NULL && w != NULL) {
		for (uint32_t s = 0; s < rd->nsel; s++) {
			n[s] = c->reg.workers[rd->sel[s]].num_samples;
		}
		rc = fb_fedavg_weights(n, rd->nsel, w);
		for (uint32_t s = 0; rc == FB_OK && s < rd->nsel; s++) {
			c->reg.workers[rd->sel[s]].weight = w[s];
			/* kept for a worker that rejoins */
			rd->sel_weight[s] = w[s];
		}
	}
	free(n);
	free(w);
	return rc;
}

/* Picks the round's workers into rd->sel (returns how many). */
static uint32_t
select_workers(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	round_state *rd = &c->rd;
	uint32_t ncand = 0, nsel;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		w->state = W_IDLE;
		w->fail_reason = NULL;
		if (w->used) {
			rd->sel[ncand++] = i;
		}
	}
	nsel = ncand;
	rd->target_updates = ncand;
	if (cfg->workers_per_round > 0 &&
	    (uint32_t)cfg->workers_per_round < ncand) {
		rd->target_updates = (uint32_t)cfg->workers_per_round;
		nsel = rd->target_updates + (uint32_t)cfg->over_select;
		nsel = nsel < ncand ? nsel : ncand;
		fb_rng_shuffle_u32(&c->rng, rd->sel, ncand);
	}
	for (uint32_t s = 0; s < nsel; s++) {
		worker *w = &c->reg.workers[rd->sel[s]];
		rd->sel_id[s] = w->id;
		round_task_reset(c, w,
		    (uint32_t)((uint64_t)s * c->chunk_count / nsel));
	}
	rd->nsel = nsel;
	return nsel;
}

/* The round's results start empty; the round's clock starts. */
void
round_reset_result(coord *c, int64_t now)
{
	round_state *rd = &c->rd;

	memset(&rd->r, 0, sizeof(rd->r));
	rd->r.status = ROUND_OK;
	rd->r.test_accuracy = NAN;
	rd->r.test_loss = NAN;
	rd->r.train_loss = NAN;
	rd->why[0] = '\0';
	rd->waiting_logged = false;
	rd->first_begin_s = 0;
	rd->sum_restarts = 0;
	rd->restart_ms = 0;
	rd->set_up_ahead = false;
	rd->started_ms = now;
	rd->sent0 = c->io.bytes_sent(c);
	rd->recv0 = c->io.bytes_received(c);
	rd->clipped_base = fb_ingest_counter(c->ingest);
	rd->in_chunks = c->chunk_count;
}

/* A new round: its results, and the sum and the credits, start empty. */
void
round_reset(coord *c, int64_t now)
{
	round_reset_result(c, now);
	upload_credits_reset(c);
	fb_accum_reset(c->accum);
	/* a stream of an earlier round that ends now is no cut of this one */
	atomic_fetch_add_explicit(&c->part.epoch, 1, memory_order_relaxed);
	atomic_store_explicit(&c->part.cut, false, memory_order_relaxed);
	sa_free(c->sa);
}

/* Ends the round without a commit: the model stays as it was. */
void
round_fail(coord *c, round_status st, int64_t now, const char *fmt, ...)
{
	va_list ap;

	c->rd.r.status = st;
	if (fmt != NULL && c->rd.why[0] == '\0') {
		va_start(ap, fmt);
		vsnprintf(c->rd.why, sizeof(c->rd.why), fmt, ap);
		va_end(ap);
	}
	fb_log_error("round %u %s: %s; the model is unchanged", c->rd.number,
	    st == ROUND_ABORTED ? "aborted" : "failed", c->rd.why);
	round_record(c, now);
}

/* The workers' lr of schedule step t (1-based): round.lr on
 * round.lr_decay, by the server lr's own schedule function. */
static double
worker_lr_at(const fb_coord_config *cfg, uint64_t t)
{
	fb_server_opt_params p;

	fb_server_opt_params_default(&p, FB_SERVER_SGD);
	p.lr = cfg->lr;
	p.decay = (fb_server_lr_decay)cfg->lr_decay;
	p.lr_final = cfg->lr_final;
	p.rounds = (uint64_t)cfg->rounds;
	return fb_server_lr_at(&p, t);
}

/* Sends worker w its RoundStart and puts it in training. */
void
round_send_start(coord *c, worker *w)
{
	const fb_coord_config *cfg = c->cfg;
	round_state *rd = &c->rd;
	fb_msg m = {.type = FB_MSG_ROUND_START};

	m.u.round_start.round = rd->number;
	m.u.round_start.param_count = c->param_count;
	m.u.round_start.chunk_count = c->chunk_count;
	m.u.round_start.chunk_bytes = c->chunk_elems * 4;
	m.u.round_start.local_steps = w->assigned_steps;
	if (w->assigned_steps == 0) {
		/* The sample count is the worker's secret: it turns
		 * local_epochs into steps itself. */
		m.u.round_start.local_epochs = (float)cfg->local_epochs;
	}
	m.u.round_start.batch_size = (uint32_t)cfg->batch_size;
	/* sync: this round's; async: the step the task's update goes
	 * towards, from its model version (round.lr_decay) */
	m.u.round_start.lr = (float)worker_lr_at(cfg,
	    cfg->mode == FB_MODE_ASYNC ? (uint64_t)w->task_version + 1
	                               : rd->number);
	m.u.round_start.momentum = (float)cfg->momentum;
	m.u.round_start.weight_decay = (float)cfg->weight_decay;
	m.u.round_start.seed = (uint64_t)cfg->seed;
	if (cfg->mode == FB_MODE_ASYNC) {
		/* a task of its own: two tasks from one model version do not
		 * repeat each other's batches */
		m.u.round_start.seed = w->task_seed;
	}
	m.u.round_start.deadline_ms = (uint32_t)cfg->deadline_ms;
	m.u.round_start.prox_mu = (float)cfg->prox_mu;
	m.u.round_start.fednova = fb_rule_is_fednova(cfg->rule);
	m.u.round_start.synthetic =
	    strcmp(cfg->model_arch, "synthetic") == 0;
	m.u.round_start.first_chunk = w->first_chunk;
	if (rd->final) {
		m.u.round_start.evaluate_only = true;
		m.u.round_start.local_steps = 1; /* (none done) */
		m.u.round_start.local_epochs = 0;
	}
	if (c->sa->phase != SA_OFF) {
		sa_round_start(c, w, &m);
	}
	if (c->sa->phase != SA_OFF && cfg->local_work == FB_WORK_TIME_BUDGET) {
		/* the private form: the worker fits its own steps to the
		 * budget, and its speed stays its own */
		m.u.round_start.time_budget_ms = (uint32_t)cfg->time_budget_ms;
		m.u.round_start.min_steps = (uint64_t)cfg->min_steps;
		m.u.round_start.max_steps = (uint64_t)cfg->max_steps;
	}
	if (c->secure) {
		broadcast_round_start(c, &m);
	}
	if (cohorts_on(c)) {
		/* the task's round is its cohort's; its model is the step's */
		m.u.round_start.round = w->task_round;
		m.u.round_start.model_round = rd->number;
	}
	w->state = W_TRAINING;
	if (coord_send(c, w, &m, NULL, 0, NULL) != FB_OK) {
		round_worker_failed(c, w, "round start could not be sent");
	}
	fb_wipe(&m.u.round_start.round_key,
	    sizeof(m.u.round_start.round_key));
}

/* Sends RoundStart to each selected worker still here. */
static void
send_round_starts(coord *c, int64_t now)
{
	const fb_coord_config *cfg = c->cfg;
	round_state *rd = &c->rd;

	rd->deadline_ms = now + cfg->deadline_ms;
	if (c->sa->phase != SA_OFF) {
		c->sa->phase_end_ms = now + cfg->sa_setup_ms;
	}
	for (uint32_t s = 0; s < rd->nsel; s++) {
		worker *w = &c->reg.workers[rd->sel[s]];
		if (!w->used || w->id != rd->sel_id[s]) {
			continue; /* gone since the selection */
		}
		rd->r.selected++;
		round_send_start(c, w);
	}
	round_enter(c, PHASE_TRAIN, now);
}

/*
 * round_rejoin: worker w was just (re)admitted. If it was selected for the
 * round under way and can still contribute, it gets its RoundStart again:
 * the round trains (before the deadline), its update was not begun this
 * round (nothing of it is in the sum), and under secure aggregation its
 * key advert can still be taken (the adverts phase, none from it yet).
 */
void
round_rejoin(coord *c, worker *w, int64_t now)
{
	round_state *rd = &c->rd;
	wslot slot = registry_slot(c, w);
	uint32_t s;

	if (c->cfg->mode == FB_MODE_ASYNC) {
		return; /* free again: the next task is its way back */
	}
	if (rd->phase != PHASE_TRAIN || now >= rd->deadline_ms ||
	    rd->upload_round[slot.v] == rd->number ||
	    w->state == W_TRAINING || w->state == W_UPLOADING ||
	    w->state == W_DONE) {
		return;
	}
	for (s = 0; s < rd->nsel; s++) {
		if (rd->sel[s] == slot.v && rd->sel_id[s] == w->id) {
			break;
		}
	}
	if (s == rd->nsel) {
		return; /* not selected for this round */
	}
	if (c->sa->phase != SA_OFF) {
		uint32_t q = 0;
		while (q < c->sa->n && c->sa->slot_worker[q] != slot.v) {
			q++;
		}
		if (c->sa->phase != SA_ADVERTS || q == c->sa->n ||
		    (c->sa->flags[q] & SA_F_ADV)) {
			return; /* its neighbours have its old keys, or none */
		}
		w->sa_slot = q;
	}
	if (w->state == W_IDLE) {
		rd->r.selected++; /* not sent its RoundStart before */
	}
	/* what the selection gave it (a slot forgotten meanwhile lost it) */
	w->weight = rd->sel_weight[s];
	w->assigned_steps = round_schedule_steps(c, w);
	w->first_chunk = (uint32_t)((uint64_t)s * c->chunk_count / rd->nsel);
	w->next_chunk = 0;
	w->steps = 0;
	w->fail_reason = NULL;
	fb_log_info("round %u: %s rejoins the round (%.1fs left)", rd->number,
	    w->name, (double)(rd->deadline_ms - now) / 1000.0);
	round_send_start(c, w);
}

/* IDLE -> PREPARE or TRAIN: selects, schedules, sets up SecAgg. */
static void
round_begin(coord *c, int64_t now)
{
	const fb_coord_config *cfg = c->cfg;
	round_state *rd = &c->rd;
	uint32_t nsel;

	round_reset(c, now);
	if (cfg->sa_enabled && sa_ahead_adopt(c, now)) {
		/* its keys and shares went during the round before */
		rd->in_chunks = c->chunk_count + 1;
		round_open_model(c, now);
		return;
	}
	nsel = select_workers(c);
	if (!cfg->sa_enabled && select_weights(c) != FB_OK) {
		round_fail(c, ROUND_FAILED, now, "no usable sample counts");
		return;
	}
	if (cfg->sa_enabled) {
		const char *why = NULL;
		if (sa_begin(c, rd->number, rd->sel, nsel, &why) != FB_OK) {
			sa_free(c->sa);
			round_fail(c, ROUND_FAILED, now, "cannot aggregate securely: "
			    "%s", why);
			return;
		}
		rd->in_chunks = c->chunk_count + 1;
	}
	round_open_model(c, now);
}

/* ---- closing ---------------------------------------------------------------- */

static bool
round_finished(const coord *c)
{
	uint32_t done = 0;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		done += w->used && w->state == W_DONE;
	}
	if (done >= c->rd.target_updates) {
		return true;
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (w->used && (w->state == W_TRAINING ||
		                   w->state == W_UPLOADING)) {
			return false;
		}
	}
	return true;
}

/* Counts the round's updates and the plain weighted train loss. */
static void
tally(coord *c)
{
	round_result *r = &c->rd.r;
	double wloss = 0, wsum = 0;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (w->used && w->state == W_DONE) {
			r->participants++;
			if (r->backend[0] == '\0') {
				snprintf(r->backend, sizeof(r->backend), "%s",
				    w->backend);
			} else if (strcmp(r->backend, w->backend) != 0) {
				r->mixed = true;
			}
			wloss += w->weight * w->train_loss;
			wsum += w->weight;
		} else if (w->state == W_FAILED && w->next_chunk > 0) {
			r->partial++;
		}
	}
	r->train_loss = wsum > 0 ? wloss / wsum : NAN;
	fedeval_tally(c);
}

/* Plain FedNova: tau_eff = sum p_i ||a_i||_1 / sum p_i over the updates
 * included (their weights p_i are the sample shares). */
static fb_err
plain_tau_eff(coord *c, double *tau)
{
	uint32_t n = c->rd.r.participants, k = 0;
	double *p = calloc(n, sizeof(*p)), *a = calloc(n, sizeof(*a));
	fb_err rc = FB_ENOMEM;

	if (p != NULL && a != NULL) {
		for (uint32_t i = 0; i < c->reg.cap && k < n; i++) {
			const worker *w = &c->reg.workers[i];
			if (w->used && w->state == W_DONE) {
				p[k] = w->weight;
				a[k] = w->a_norm;
				k++;
			}
		}
		rc = fb_fednova_tau_eff(p, a, k, tau);
	}
	free(p);
	free(a);
	return rc;
}

/* The updates are in: the job thread unmasks, steps, evaluates, saves. */
static void
start_aggregate(coord *c, int64_t now)
{
	job *j = &c->job;
	double scale = 1.0;

	broadcast_freeze(c); /* no chunk sealed from the model being stepped */
	j->eval_only = c->rd.final;
	if (c->rd.final) {
		/* the final evaluation: the sums, and no step */
		j->secure_sum = c->sa->phase != SA_OFF;
		j->sa = c->sa;
		j->accum = c->accum;
		j->sa_scale = 1.0;
		j->scale = 1.0;
		j->evaluate = false;
		jobs_submit(c, JOB_AGGREGATE);
		round_enter(c, PHASE_AGGREGATE, now);
		return;
	}
	if (c->sa->phase == SA_OFF && fb_rule_is_fednova(c->cfg->rule) &&
	    plain_tau_eff(c, &scale) != FB_OK) {
		round_fail(c, ROUND_FAILED, now, "FedNova normalisers unusable");
		return;
	}
	if (model_writable(c, &c->params_lent, c->param_count * 4, true) !=
	    FB_OK) {
		round_fail(c, ROUND_FAILED, now, "out of memory for the model");
		return;
	}
	c->params = fb_lent_data(c->params_lent);
	j->secure_sum = c->sa->phase != SA_OFF;
	j->sa = c->sa;
	j->accum = c->accum;
	j->sa_scale = 1.0;
	j->scale = scale;
	j->evaluate = c->evaluate && c->cfg->eval_every > 0 &&
	    (c->rd.number % c->cfg->eval_every == 0 ||
	        c->rd.number == (uint32_t)c->cfg->rounds);
	jobs_submit(c, JOB_AGGREGATE);
	round_enter(c, PHASE_AGGREGATE, now);
}

/* TRAIN/OVERTIME -> UNMASK, AGGREGATE or (too few updates) RECORD. */
static void
round_close(coord *c, int64_t now)
{
	round_state *rd = &c->rd;

	/* Over-selection: the round has its updates; stop the others. */
	cancel_stragglers(c, false, false);
	/* Every chunk received is added before the round commits. */
	upload_settle(c);
	if (upload_sum_check(c, now)) {
		return; /* the masked inputs come again */
	}
	rd->clipped = fb_ingest_counter(c->ingest) - rd->clipped_base;
	tally(c);
	if (rd->r.participants < (uint32_t)c->cfg->min_updates) {
		round_fail(c, ROUND_FAILED, now, "%u complete updates, %lld needed "
		    "(round.min_updates)", rd->r.participants,
		    (long long)c->cfg->min_updates);
		return;
	}
	if (c->sa->phase != SA_OFF) {
		if (c->sa->poisoned != NULL) {
			round_fail(c, ROUND_ABORTED, now, "%s", c->sa->poisoned);
			return;
		}
		if (sa_count(c->sa, SA_F_INCLUDED) < c->sa->t) {
			round_fail(c, ROUND_ABORTED, now, "only %u masked inputs "
			    "complete, below the secure-aggregation threshold of %u",
			    sa_count(c->sa, SA_F_INCLUDED), c->sa->t);
			return;
		}
		sa_request_confirms(c, now);
		round_enter(c, PHASE_UNMASK, now);
		return;
	}
	start_aggregate(c, now);
}

/* TRAIN and OVERTIME: the deadline and its policies. */
static void
round_train_step(coord *c, int64_t now)
{
	round_state *rd = &c->rd;
	const fb_coord_config *cfg = c->cfg;
	int64_t over = now - rd->deadline_ms;

	sa_advance(c, now);
	if (upload_sum_check(c, now)) {
		return;
	}
	if (round_finished(c)) {
		round_close(c, now);
		return;
	}
	if (over < 0) {
		return;
	}
	if (cfg->stragglers == FB_STRAGGLERS_WAIT) {
		if (rd->phase == PHASE_TRAIN) {
			fb_log_warn("round %u: deadline (%.1fs) passed; waiting for "
			            "the stragglers (round.stragglers: wait)",
			    rd->number, (double)cfg->deadline_ms / 1000.0);
			round_enter(c, PHASE_OVERTIME, now);
		}
		return;
	}
	if (c->sa->phase == SA_INPUT && upload_any_in_flight(c) &&
	    (over < cfg->sa_unmask_ms ||
	        (rd->restart_ms > 0 &&
	            now - rd->restart_ms < cfg->sa_unmask_ms))) {
		/* A masked input must arrive whole or not at all: uploads under
		 * way at the deadline may finish. */
		if (rd->phase == PHASE_TRAIN) {
			fb_log_warn("round %u: deadline (%.1fs) passed; letting the "
			            "masked uploads under way finish",
			    rd->number, (double)cfg->deadline_ms / 1000.0);
			cancel_stragglers(c, true, true);
			round_enter(c, PHASE_OVERTIME, now);
		}
		return;
	}
	/* Updates whose last chunks the pool holds are in. */
	upload_settle(c);
	if (!round_finished(c)) {
		fb_log_warn("round %u: deadline (%.1fs) reached", rd->number,
		    (double)cfg->deadline_ms / 1000.0);
		cancel_stragglers(c, true, false);
	}
	round_close(c, now);
}

/* ---- the commit and the record ---------------------------------------------- */

/* Builds the metrics line (on the loop: it reads the roster) and has the
 * job thread append it. */
void
round_record(coord *c, int64_t now)
{
	round_state *rd = &c->rd;
	job *j = &c->job;

	rd->up_bytes = c->io.bytes_received(c) - rd->recv0;
	rd->down_bytes = c->io.bytes_sent(c) - rd->sent0;
	rd->r.seconds = (double)(now - rd->started_ms) / 1000.0;
	free(j->line);
	j->line = NULL;
	if (outputs_metrics_line(c, &j->line, &j->line_len) != FB_OK) {
		rd->exit_rc = FB_ENOMEM;
		round_enter(c, PHASE_DONE, now);
		return;
	}
	jobs_submit(c, JOB_RECORD);
	round_enter(c, PHASE_RECORD, now);
}

/* AGGREGATE is done: the round committed, or it did not and why. */
static void
aggregate_done(coord *c, int64_t now)
{
	job *j = &c->job;
	round_state *rd = &c->rd;

	if (j->fatal) {
		/* the model could not be evaluated: the run stops */
		fb_log_error("round %u: %s; stopping", rd->number, j->why);
		rd->exit_rc = j->rc;
		round_enter(c, PHASE_DONE, now);
		return;
	}
	if (j->rc != FB_OK) {
		snprintf(rd->why, sizeof(rd->why), "%s", j->why);
		round_fail(c, j->secure_sum ? ROUND_ABORTED : ROUND_FAILED, now,
		    NULL);
		return;
	}
	if (j->secure_sum) {
		rd->r.train_loss = j->loss;
		rd->r.sa_a = j->a;
		rd->r.fed_eval = j->fed_eval;
		/* included inputs, also of workers lost since */
		rd->r.participants = sa_count(j->sa, SA_F_INCLUDED);
	}
	if (rd->final) {
		rd->r.train_loss = NAN; /* nobody trained */
		round_record(c, now);
		return;
	}
	rd->tau_eff = j->secure_sum && fb_rule_is_fednova(c->cfg->rule)
	    ? j->a : j->scale;
	rd->r.test_accuracy = j->test_accuracy;
	rd->r.test_loss = j->test_loss;
	rd->committed++;
	round_record(c, now);
}

/* RECORD is done: the round line, then the next round or the end. */
static void
record_done(coord *c, int64_t now)
{
	round_state *rd = &c->rd;

	if (c->job.rc != FB_OK) {
		fb_log_error("round %u: %s; stopping", rd->number, c->job.why);
		rd->exit_rc = c->job.rc;
		round_enter(c, PHASE_DONE, now);
		return;
	}
	rd->ran++;
	rd->seconds_sum += rd->r.seconds;
	progress_round_done(c, rd->rejected);
	outputs_round_line(c);
	if (cohorts_on(c)) {
		cohorts_applied(c);
	}
	sa_free(c->sa);
	if (rd->final || (rd->number >= (uint32_t)c->cfg->rounds &&
	                     !c->cfg->fed_final)) {
		rd->exit_rc = FB_OK;
		round_enter(c, PHASE_DONE, now);
		return;
	}
	if (rd->number >= (uint32_t)c->cfg->rounds) {
		/* evaluation.federated_final: the workers evaluate the final
		 * model in one more round that does not train */
		rd->final = true;
	}
	rd->number++;
	rd->idle_since_ms = now;
	rd->last_note_ms = now;
	round_enter(c, PHASE_IDLE, now);
}

/* The model is ready to go out: the workers get their tasks. */
static void
train_open(coord *c, int64_t now)
{
	if (cohorts_on(c)) {
		cohorts_open(c, now);
	} else if (c->cfg->mode == FB_MODE_ASYNC) {
		async_open(c, now);
	} else {
		send_round_starts(c, now);
	}
}

void
round_open_model(coord *c, int64_t now)
{
	if (!c->secure) {
		train_open(c, now);
		return;
	}
	if (broadcast_prepare(c) != FB_OK) {
		round_fail(c, ROUND_FAILED, now, "out of memory for the model");
		return;
	}
	jobs_submit(c, JOB_ENCRYPT);
	round_enter(c, PHASE_PREPARE, now);
}

void
round_job_done(coord *c, job_kind kind, int64_t now)
{
	switch (kind) {
	case JOB_ENCRYPT:
		if (c->job.rc != FB_OK) {
			round_fail(c, ROUND_FAILED, now, "cannot encrypt the model: "
			    "%s", fb_strerror(c->job.rc));
			return;
		}
		broadcast_open(c);
		train_open(c, now);
		return;
	case JOB_AGGREGATE:
		aggregate_done(c, now);
		return;
	case JOB_RECORD:
		record_done(c, now);
		return;
	default:
		return;
	}
}

/* ---- the step -------------------------------------------------------------- */

/*
 * UNMASK: first the included set's confirmations (sa CONFIRM), then the
 * reveals (sa UNMASK), each up to unmask_timeout; aborted as soon as too
 * few confirm, or too few can still reveal.
 */
static void
round_unmask_step(coord *c, int64_t now)
{
	sa_round *sa = c->sa;

	if (sa->phase == SA_CONFIRM) {
		if (sa_confirms_pending(c) && now < sa->phase_end_ms) {
			return;
		}
		if (sa_request_reveals(c, now) != FB_OK) {
			round_fail(c, ROUND_ABORTED, now, "only %u of the %u "
			    "included workers confirmed the included set (%u "
			    "refused), below the secure-aggregation "
			    "threshold of %u", sa_count(sa, SA_F_CONFIRMED),
			    sa_count(sa, SA_F_INCLUDED),
			    sa_count(sa, SA_F_REFUSED), sa->t);
		}
		return;
	}
	if (sa_reveals_hopeless(c)) {
		round_fail(c, ROUND_ABORTED, now, "only %u of the %u workers "
		    "that confirmed the included set revealed their shares "
		    "(%u refused: fewer than %u of their neighbourhood "
		    "confirmed the set they were sent), below the "
		    "secure-aggregation threshold", sa_count(sa, SA_F_REVEALED),
		    sa_count(sa, SA_F_CONFIRMED), sa_count(sa, SA_F_REFUSED),
		    sa->t);
		return;
	}
	if (!sa_reveals_pending(c) || now >= sa->phase_end_ms) {
		start_aggregate(c, now);
	}
}

static void
round_idle_step(coord *c, int64_t now)
{
	const fb_coord_config *cfg = c->cfg;
	round_state *rd = &c->rd;
	uint32_t live = registry_live_count(c);
	/* async: min_workers before the first step; then the buffers go on
	 * with whoever is live (nobody waits for a worker that left) */
	uint32_t need = cfg->mode == FB_MODE_ASYNC && rd->ran > 0
	    ? 1 : (uint32_t)cfg->min_workers;

	if (live >= need && cohorts_on(c)) {
		cohorts_begin(c, now);
		return;
	}
	if (live >= need && cfg->mode == FB_MODE_ASYNC) {
		async_begin(c, now);
		return;
	}
	if (live >= (uint32_t)cfg->min_workers) {
		if (sa_ahead_pending(c)) {
			/* its setup is under way: no slower to finish than one
			 * started now, and bounded by its phase timers */
			return;
		}
		round_begin(c, now);
		return;
	}
	if (now - rd->idle_since_ms > cfg->wait_for_workers_ms) {
		fb_log_error("only %u of the %lld workers needed "
		             "(round.min_workers) connected within %.0fs "
		             "(round.wait_for_workers)",
		    live, (long long)cfg->min_workers,
		    (double)cfg->wait_for_workers_ms / 1000.0);
		rd->exit_rc = FB_ETIMEDOUT;
		round_enter(c, PHASE_DONE, now);
		return;
	}
	if (now - rd->last_note_ms > 10000) {
		fb_log_info("waiting for workers: %u of %lld connected", live,
		    (long long)cfg->min_workers);
		rd->last_note_ms = now;
	}
}

static void
round_phase_step(coord *c, int64_t now)
{
	switch (c->rd.phase) {
	case PHASE_IDLE:
		round_idle_step(c, now);
		return;
	case PHASE_TRAIN:
	case PHASE_OVERTIME:
		if (c->cfg->mode == FB_MODE_ASYNC) {
			async_step(c, now);
			return;
		}
		round_train_step(c, now);
		return;
	case PHASE_UNMASK:
		round_unmask_step(c, now);
		return;
	default:
		return; /* PREPARE, AGGREGATE, RECORD: the job's completion */
	}
}

void
round_step(coord *c, int64_t now)
{
	if (cohorts_on(c)) {
		/* the cohorts go on whatever the step is doing */
		if (c->rd.phase == PHASE_IDLE) {
			round_idle_step(c, now);
		}
		cohorts_tick(c, now);
		return;
	}
	round_phase_step(c, now);
	/* the next round's setup goes on whatever this one is doing (and
	 * starts as soon as this round's own is done) */
	sa_ahead_step(c, now);
	if (c->rd.phase == PHASE_IDLE && c->sa_ahead.phase == SA_INPUT &&
	    c->sa_ahead.p.round == c->rd.number) {
		round_phase_step(c, now); /* it was waited for: begin now */
	}
}

/* Milliseconds until the round has something to do on its own. */
int64_t
round_next_timer(const coord *c, int64_t now)
{
	int64_t next = 100; /* the broadcast wakes the loop itself */

	if (c->rd.phase == PHASE_TRAIN && !cohorts_on(c) &&
	    c->rd.deadline_ms - now < next) {
		next = c->rd.deadline_ms - now;
	}
	if ((c->sa->phase == SA_ADVERTS || c->sa->phase == SA_SHARES ||
	        c->sa->phase == SA_CONFIRM || c->sa->phase == SA_UNMASK) &&
	    c->sa->phase_end_ms - now < next) {
		next = c->sa->phase_end_ms - now;
	}
	if (cohorts_on(c)) {
		/* each cohort's deadline and phases on their own timer */
		next = cohorts_next_timer(c, now, next);
	}
	next = sa_ahead_next_timer(c, now, next);
	return next < 0 ? 0 : next;
}

/* The coordinator stops (signal): the round ends where it is. */
void
round_stop(coord *c, int64_t now)
{
	if (c->rd.phase == PHASE_TRAIN || c->rd.phase == PHASE_OVERTIME) {
		cancel_stragglers(c, true, false);
	}
	c->rd.exit_rc = FB_ECLOSED;
	round_enter(c, PHASE_DONE, now);
}
