/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cohort.c -- round.mode: async with secure aggregation. Each buffer is a
 * cohort (coordinator_impl.h): one SecAgg+ instance of round.buffer_size
 * slots with a sum of its own, among the workers given their tasks for it.
 *
 *   filling   a free worker gets a task in a cohort filling (below), and
 *             the next free slot of its SecAgg instance (its RoundStart
 *             says which); its key advert is taken at once
 *   running   full: sealed; the SecAgg setup (adverts relayed, shares
 *             relayed) runs among the members while they train, and each
 *             member's masked input streams into the cohort's own sum
 *   unmask    every member's input is in (or, at the cohort's deadline, at
 *             least the threshold of them): the included set is confirmed
 *             and the shares revealed, as in a sync secure round
 *   ready     waits for the job thread, which unmasks it and steps the
 *             model: one server step (one metrics line) per cohort, in the
 *             order they completed
 *
 * Several cohorts are in flight: a fast worker finishes its task, takes
 * one in a cohort filling, and answers its earlier cohorts' unmasking
 * alongside; a slow member holds back only its own cohort. The member
 * whose input completes a cohort waits for its step, and so does one
 * whose input is in while the others' are due soon (awaits_own_step).
 * A member of a cohort not yet sealed holds its trained update until the
 * seal (its masks need every member's keys), so it is not free either:
 * the cohorts filling must fill. A free worker's task goes to the cohort
 * filling that it is not in (a SecAgg identity signs for one slot) whose
 * members' expected upload begins are nearest its own (ties: the
 * fullest, then the oldest); only when there is none does it open a new
 * one, and while others fill only if the live workers outside the
 * filling cohorts can fill them all (open_safe); a long task opens its
 * own rather than join a cohort of long tasks only (cohort_place). Each
 * worker's expected begin is now plus its tasks' measured time,
 * RoundStart sent to UpdateBegin, smoothed (the live workers' mean until
 * it has one; a task cancelled after t ms raises it to t at least):
 * plain metadata the coordinator sees, not the speed the worker keeps.
 * A task expected to begin its upload past round.max_staleness (its age
 * plus the steps due by then, at the smoothed time between steps) is
 * doomed: no other worker joins its cohort, whose failure would take
 * their inputs with it, and a worker given such a task gets a cohort of
 * its own (doomed). At most one cohort per live worker is in flight (each
 * holds a model-sized sum), and a member whose task falls more than
 * round.max_staleness steps behind before its input is in is cancelled:
 * a dropout of its cohort (a cohort still filling that is left with no
 * member on its task is closed). A cohort with fewer inputs than its
 * threshold fails: nothing of it is applied, and its members are free.
 * Each cohort's fill deadline, setup end, input deadline and unmask end
 * set the loop's timeout (cohorts_next_timer).
 *
 * A member's weight is fixed before masking, so its share of the step
 * comes from its staleness when its upload begins, b (server steps since
 * its task's model; fixed then and sent with its credits,
 * UpdateCredit.staleness): the worker weighs its input n/n_max g(b),
 * g(s) = 1/sqrt(1 + s), and a stale member counts less inside its cohort,
 * as it would in a plain buffer. The step is then shrunk by
 * fb_fedbuff_weights' scale from the members' staleness at the step, a
 * (>= b: other cohorts may step in between). The coordinator does not
 * know a member's sample count under secure aggregation, so the scale
 * takes them equal: the mean of g(a) over the included members. So
 *     D = mean_i g(a_i) * sum_i n_i g(b_i) x_i / sum_i n_i g(b_i),
 * plain FedBuff's D = sum_i n_i g(a_i) x_i / sum_i n_i when the sample
 * counts are equal and the members began at the step they meet. The
 * coordinator learns nothing new: b is its own count, and the weights'
 * sum was in the clear before. (b is a lever on a member's weight, as
 * max_samples is: README, "Secure asynchronous rounds".)
 *
 * Nothing here blocks or touches a socket but through coord_send.
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

bool
cohorts_on(const coord *c)
{
	return c->cfg->mode == FB_MODE_ASYNC && c->cfg->sa_enabled;
}

fb_err
cohorts_alloc(coord *c)
{
	cohorts *cs = &c->cs;

	cs->applying = -1;
	cs->next_id = 1;
	if (!cohorts_on(c)) {
		return FB_OK;
	}
	cs->cap = c->reg.cap + 1;
	cs->co = calloc(cs->cap, sizeof(*cs->co));
	if (cs->co == NULL) {
		return FB_ENOMEM;
	}
	for (uint32_t i = 0; i < cs->cap; i++) {
		cs->co[i].m =
		    calloc((size_t)c->cfg->buffer_size, sizeof(*cs->co[i].m));
		if (cs->co[i].m == NULL) {
			return FB_ENOMEM;
		}
	}
	return FB_OK;
}

void
cohorts_fini(coord *c)
{
	cohorts *cs = &c->cs;

	for (uint32_t i = 0; cs->co != NULL && i < cs->cap; i++) {
		sa_free(&cs->co[i].sa);
		fb_accum_free(cs->co[i].accum);
		free(cs->co[i].m);
	}
	free(cs->co);
	memset(cs, 0, sizeof(*cs));
}

/* The index of cohort `id` in c->cs.co, or c->cs.cap when none. */
static uint32_t
cohort_index(const coord *c, uint32_t id)
{
	uint32_t i = 0;

	while (id != 0 && i < c->cs.cap &&
	    (c->cs.co[i].state == CO_FREE || c->cs.co[i].id != id)) {
		i++;
	}
	return id != 0 ? i : c->cs.cap;
}

cohort *
cohort_of(coord *c, uint32_t id)
{
	uint32_t i = cohort_index(c, id);

	return i < c->cs.cap ? &c->cs.co[i] : NULL;
}

/* The member index of worker w in co, or co->count when none. */
static uint32_t
member_of(const coord *c, const cohort *co, const worker *w)
{
	uint32_t ws = (uint32_t)(w - c->reg.workers);
	uint32_t s = 0;

	while (s < co->count && (co->m[s].slot != ws || co->m[s].id != w->id)) {
		s++;
	}
	return s;
}

sa_round *
cohort_enter(coord *c, cohort *co, worker *w)
{
	sa_round *prev = c->sa;

	c->sa = &co->sa;
	if (w != NULL && member_of(c, co, w) < co->count) {
		w->sa_slot = member_of(c, co, w);
	}
	return prev;
}

void
cohort_leave(coord *c, sa_round *prev, worker *w)
{
	c->sa = prev;
	if (w != NULL && prev != &c->sa_sync) {
		/* back to the slot of the instance we came from */
		for (uint32_t i = 0; i < c->cs.cap; i++) {
			cohort *co = &c->cs.co[i];
			if (&co->sa == prev &&
			    member_of(c, co, w) < co->count) {
				w->sa_slot = member_of(c, co, w);
			}
		}
	} else if (w != NULL) {
		cohort *co = cohort_of(c, w->task_round);
		if (co != NULL && member_of(c, co, w) < co->count) {
			w->sa_slot = member_of(c, co, w);
		}
	}
}

/* Whether worker w is on a task of cohort co now. */
static bool
on_task_of(const worker *w, const cohort *co)
{
	return w->used && w->task_round == co->id &&
	       (w->state == W_TRAINING || w->state == W_UPLOADING);
}

/* Whether member s of cohort co is the worker that joined and still on
 * its task. */
static bool
member_on_task(const coord *c, const cohort *co, uint32_t s)
{
	const worker *m = &c->reg.workers[co->m[s].slot];

	return m->id == co->m[s].id && on_task_of(m, co);
}

const sa_round *
round_sa(const coord *c)
{
	if (cohorts_on(c)) {
		return c->cs.applying >= 0 ? &c->cs.co[c->cs.applying].sa
		                           : &c->sa_sync;
	}
	return c->sa;
}

bool
cohort_open_to(const coord *c, const worker *w, uint32_t round)
{
	const cohort *co = NULL;

	for (uint32_t i = 0; round != 0 && i < c->cs.cap; i++) {
		if (c->cs.co[i].state != CO_FREE && c->cs.co[i].id == round) {
			co = &c->cs.co[i];
		}
	}
	return co != NULL && round == w->task_round &&
	       (co->state == CO_FILLING || co->state == CO_RUNNING);
}

/* Frees cohort co; its members still on its task are told so. */
static void
cohort_free(coord *c, cohort *co, const char *why)
{
	sa_round *prev = cohort_enter(c, co, NULL);

	for (uint32_t s = 0; s < co->count; s++) {
		worker *w = &c->reg.workers[co->m[s].slot];
		if (w->id == co->m[s].id && on_task_of(w, co)) {
			round_cancel(c, w, why);
		}
	}
	cohort_leave(c, prev, NULL);
	/* its streams' chunks still queued are added (or dropped) before
	 * the sum is used again (ingest_arg.cohort no longer matches) */
	upload_settle(c);
	sa_free(&co->sa);
	co->state = CO_FREE;
	co->count = 0;
	co->id = 0;
}

static void cohort_fail(coord *c, cohort *co, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The cohort cannot complete: nothing of it is applied. */
static void
cohort_fail(coord *c, cohort *co, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	fb_log_error(
	    "cohort %u failed: %s; nothing of it is applied", co->id, why);
	c->cs.failed++;
	c->cs.failed_total++;
	progress_cohort_failed(c);
	cohort_free(c, co, "its cohort failed");
}

/* Worker w's task, cut short now, ran this long: its tasks take at least
 * that (a lower bound; without it, a worker whose tasks never finish in
 * time would have no measured time, and would be expected as fast as
 * the others). */
static void
task_floor(worker *w, int64_t now)
{
	double t;

	if (w->task_sent_ms == 0 || now <= w->task_sent_ms) {
		return;
	}
	t = (double)(now - w->task_sent_ms);
	if (!w->has_task_ms || w->task_ms < t) {
		w->task_ms = t;
		w->has_task_ms = true;
	}
	w->task_sent_ms = 0;
}

/* Whether any member of cohort co is still on its task. */
static bool
any_on_task(const coord *c, const cohort *co)
{
	for (uint32_t s = 0; s < co->count; s++) {
		if (member_on_task(c, co, s)) {
			return true;
		}
	}
	return false;
}

/* A measured begin this soon after the shares were relayed may have
 * waited for them: its time is then an upper bound of the task's. */
#define CENSOR_MS 200

/* When worker w, given a task now, is expected to begin its masked
 * upload: now plus its tasks' measured time, or the live workers' mean
 * of theirs while it has none; 0 when no worker has one yet. */
static int64_t
expect_of(const coord *c, const worker *w, int64_t now)
{
	double sum = 0;
	uint32_t n = 0;

	if (w->has_task_ms) {
		return now + (int64_t)llround(w->task_ms);
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *o = &c->reg.workers[i];
		if (o->used && o->has_task_ms) {
			sum += o->task_ms;
			n++;
		}
	}
	return n == 0 ? 0 : now + (int64_t)llround(sum / n);
}

/* When filling cohort co's last upload is expected to begin: the latest
 * of its members' expectations (one already past is taken as due now);
 * 0 when none of theirs is known. */
static int64_t
cohort_expect(const cohort *co, int64_t now)
{
	int64_t e = 0;

	for (uint32_t s = 0; s < co->count; s++) {
		int64_t m = co->m[s].expect_ms;
		if (m != 0) {
			m = m < now ? now : m;
			e = m > e ? m : e;
		}
	}
	return e;
}

static bool has_doomed(const coord *c, const cohort *co, int64_t now);

/* Whether opening another cohort (its first member w's) while others
 * fill leaves every cohort filling fillable by the live workers outside
 * the filling cohorts: a member of a cohort not sealed holds its trained
 * update until the seal (the masks need every member's keys), so cohorts
 * left short would hold their members until round.deadline. A cohort
 * with a doomed task (doomed) is not to be filled: its members count,
 * its empty slots do not. */
static bool
open_safe(const coord *c, int64_t now)
{
	uint32_t n = (uint32_t)c->cfg->buffer_size;
	uint64_t need = n > 1 ? n - 1 : 0, members = 1;
	uint32_t live = registry_live_count(c);

	for (uint32_t i = 0; i < c->cs.cap; i++) {
		const cohort *co = &c->cs.co[i];
		if (co->state == CO_FILLING) {
			need += has_doomed(c, co, now) ? 0 : n - co->count;
			members += co->count;
		}
	}
	return members <= live && need <= live - members;
}

/* Opens a new cohort for the tasks to come; NULL at the bound. */
static cohort *
cohort_open(coord *c, int64_t now)
{
	cohorts *cs = &c->cs;
	uint32_t live = registry_live_count(c), inflight = 0;
	uint32_t n = (uint32_t)c->cfg->buffer_size;
	cohort *co = NULL;
	const char *why = NULL;
	sa_round *prev;

	for (uint32_t i = 0; i < cs->cap; i++) {
		if (cs->co[i].state != CO_FREE) {
			inflight++;
		} else if (co == NULL) {
			co = &cs->co[i];
		}
	}
	/* each holds a model-sized sum: one per live worker at most */
	if (co == NULL || inflight >= (live > 1 ? live : 1)) {
		return NULL;
	}
	if (co->accum == NULL && fb_accum_alloc(c->param_count, c->chunk_elems,
	                             c->cfg->clip, &co->accum) != FB_OK) {
		fb_log_error("no memory for another cohort's sum; the free "
		             "workers wait");
		return NULL;
	}
	fb_accum_set_parallel(co->accum, fb_ingest_parallel, c->ingest);
	fb_accum_reset(co->accum);
	co->id = cs->next_id++;
	prev = cohort_enter(c, co, NULL);
	if (sa_begin(c, co->id, NULL, n, &why) != FB_OK) {
		cohort_leave(c, prev, NULL);
		fb_log_error(
		    "cohort %u: cannot aggregate securely: %s", co->id, why);
		sa_free(&co->sa);
		co->id = 0;
		return NULL;
	}
	cohort_leave(c, prev, NULL);
	co->state = CO_FILLING;
	co->count = 0;
	co->opened_ms = now;
	co->input_ms = 0;
	co->deadline_ms = 0;
	co->closing_ms = 0;
	co->stale = 0;
	co->superseded = 0;
	fb_log_debug(
	    "cohort %u opened (%u slots, threshold %u)", co->id, n, co->sa.t);
	return co;
}

/* The membership is sealed: the setup runs among the members. */
static void
cohort_seal(coord *c, cohort *co, int64_t now)
{
	co->state = CO_RUNNING;
	co->sa.phase_end_ms = now + c->cfg->sa_setup_ms;
	co->deadline_ms = now + c->cfg->deadline_ms;
	fb_log_info("cohort %u sealed with %u members", co->id, co->count);
}

/* Gives worker w its task in cohort co. */
static void
cohort_dispatch(coord *c, cohort *co, worker *w, int64_t now)
{
	round_state *rd = &c->rd;
	wslot slot = registry_slot(c, w);
	uint32_t s = co->count++;
	sa_round *prev;

	co->m[s].slot = slot.v;
	co->m[s].id = w->id;
	co->m[s].version = rd->committed;
	co->m[s].staleness = 0;
	co->m[s].expect_ms = expect_of(c, w, now);
	snprintf(co->m[s].name, sizeof(co->m[s].name), "%s", w->name);
	round_task_reset(c, w,
	    (uint32_t)((uint64_t)s * c->chunk_count / co->sa.n));
	w->fail_reason = NULL;
	w->task_round = co->id;
	w->task_version = rd->committed;
	w->staleness = 0;
	w->task_seed = async_task_seed(c);
	w->task_sent_ms = now;
	rd->r.selected++;
	prev = cohort_enter(c, co, NULL);
	sa_assign(c, s, slot.v);
	round_send_start(c, w);
	cohort_leave(c, prev, w);
	if (co->count == co->sa.n) {
		cohort_seal(c, co, now);
	}
}

/* A member whose input is in waits for its cohort's step while the
 * inputs still out are due within this share of its own task time
 * (hold_end). */
#define PARTNER_WAIT 0.25

/*
 * Until when member w, whose input is in running cohort co, waits for
 * the members still on their tasks: the latest of their expected upload
 * begins plus PARTNER_WAIT of w's own task time, if every one of them is
 * due by then and no step was taken since w's task was given; 0 when w
 * does not wait (one is due later or not known, or the model moved).
 *
 * Why: a member given its next task at once trains it from the model
 * of the moment, which lacks its own update still in the cohort; with no
 * step since its last task, that is the very model it just trained
 * from. When the cohorts in flight complete together (workers of like
 * speed), the members that were in first all train again from that one
 * model, and their second updates meet in a later cohort whose step
 * pushes their data's way twice: on an H100 host, 4 workers of one
 * speed, buffer 2, test accuracy fell more than 5 points in 70 of 292
 * steps, and secure async took 2.18x plain's time to 84%
 * (bench/RESULTS.md, "Asynchronous rounds"). A partner due much later
 * (a slow worker) is not waited for.
 */
static int64_t
hold_end(const coord *c, const cohort *co, const worker *w, int64_t now)
{
	int64_t hold, latest = 0;
	uint32_t self = member_of(c, co, w);

	if (co->state != CO_RUNNING || !w->used || w->task_round != co->id ||
	    !w->has_task_ms || self >= co->count ||
	    !(co->sa.flags[self] & SA_F_INCLUDED) ||
	    c->rd.committed != w->task_version) {
		return 0; /* (a step since: its next task's model has moved) */
	}
	hold = (int64_t)llround(PARTNER_WAIT * w->task_ms);
	for (uint32_t s = 0; s < co->count; s++) {
		int64_t e = co->m[s].expect_ms;
		if (s == self || (co->sa.flags[s] & SA_F_INCLUDED) ||
		    !member_on_task(c, co, s)) {
			continue; /* in, or gone */
		}
		if (e == 0 || e > now + hold) {
			return 0;
		}
		latest = e > latest ? e : latest;
	}
	return latest == 0 ? 0 : latest + hold;
}

/*
 * Whether w's last task's input is in a cohort that has all its inputs
 * and waits for its step (confirmations, reveals, the job), or soon will
 * (hold_end). Its worker then waits for that step, so that its next task
 * trains from the model its own update is in, as plain async's buffer
 * does (async.c: a buffer's last worker gets its next task from the
 * step's model). Given a task at once, it would train from the model
 * before: one step staler, for the price of the unmask's time idle. A
 * member whose input was left out does not wait.
 */
static bool
awaits_own_step(const coord *c, const worker *w, int64_t now)
{
	uint32_t i = cohort_index(c, w->task_round), s;
	const cohort *co;

	if (i == c->cs.cap) {
		return false;
	}
	co = &c->cs.co[i];
	if (co->state == CO_RUNNING) {
		return now < hold_end(c, co, w, now);
	}
	if (co->state != CO_UNMASK && co->state != CO_READY &&
	    co->state != CO_APPLYING) {
		return false;
	}
	s = member_of(c, co, w);
	return s < co->count && (co->sa.flags[s] & SA_F_INCLUDED);
}

/* Whether w can take a task now. */
static bool
worker_free(const coord *c, const worker *w, int64_t now)
{
	return w->used && w->welcomed &&
	       (w->state == W_IDLE || w->state == W_DONE ||
	           w->state == W_FAILED) &&
	       !awaits_own_step(c, w, now);
}

/* A task is long when it takes at least this times the shortest live
 * worker's measured task: a short-task worker then gets a task that ends
 * about when the long one does. */
#define LONG_TASK 1.5

/* The shortest measured task of the live workers, in ms; 0 while none
 * has one. */
static double
shortest_task(const coord *c)
{
	double shortest = -1;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *o = &c->reg.workers[i];
		if (o->used && o->has_task_ms &&
		    (shortest < 0 || o->task_ms < shortest)) {
			shortest = o->task_ms;
		}
	}
	return shortest < 0 ? 0 : shortest;
}

/* Whether worker w's tasks are long (LONG_TASK) against the shortest
 * (shortest_task); false while w has no measured task time, and while
 * the shortest is under a millisecond (tasks that do no work: nothing
 * to mix). */
static bool
long_task(const worker *w, double shortest)
{
	return w->used && w->has_task_ms && shortest >= 1.0 &&
	       w->task_ms >= LONG_TASK * shortest;
}

/* Whether every member of filling cohort co is on a long task. */
static bool
all_long(const coord *c, const cohort *co, double shortest)
{
	for (uint32_t s = 0; s < co->count; s++) {
		const worker *m = &c->reg.workers[co->m[s].slot];
		if (m->id != co->m[s].id || !long_task(m, shortest)) {
			return false;
		}
	}
	return co->count > 0;
}

/*
 * Whether a task of model version `version`, its upload expected to begin
 * at `expect`, will be past round.max_staleness by then: its age now plus
 * the steps expected meanwhile (at the smoothed time between steps). Such
 * a task is cancelled before its input is in, and its cohort fails with
 * it when that leaves it below its threshold (with buffer_size 2, always):
 * a member that joined it would lose its own input. False while the step
 * time or the expected begin is not known.
 */
static bool
doomed(const coord *c, uint32_t version, int64_t expect, int64_t now)
{
	double age = (double)(c->rd.committed - version);

	if (c->cs.step_ms <= 0 || expect == 0) {
		return false;
	}
	if (expect > now) {
		age += (double)(expect - now) / c->cs.step_ms;
	}
	return age > (double)c->cfg->max_staleness;
}

/* Whether a member of filling cohort co still on its task is doomed. */
static bool
has_doomed(const coord *c, const cohort *co, int64_t now)
{
	for (uint32_t s = 0; s < co->count; s++) {
		if (member_on_task(c, co, s) &&
		    doomed(c, co->m[s].version, co->m[s].expect_ms, now)) {
			return true;
		}
	}
	return false;
}

/* The nearest of the cohorts filling that w may join (one slot each),
 * leaving out those of long tasks only (against `shortest`) unless
 * shortest is 0, and those with a doomed member. */
static cohort *
nearest_filling(coord *c, const worker *w, int64_t now, double shortest)
{
	int64_t f = expect_of(c, w, now), bd = 0;
	cohort *best = NULL;

	for (uint32_t i = 0; i < c->cs.cap; i++) {
		cohort *co = &c->cs.co[i];
		int64_t e, d;
		if (co->state != CO_FILLING ||
		    member_of(c, co, w) < co->count ||
		    (shortest > 0 && all_long(c, co, shortest)) ||
		    has_doomed(c, co, now)) {
			continue;
		}
		e = cohort_expect(co, now);
		d = e == 0 || f == 0 ? 0 : llabs(e - f);
		if (best == NULL || d < bd ||
		    (d == bd &&
		        (co->count > best->count ||
		            (co->count == best->count && co->id < best->id)))) {
			best = co;
			bd = d;
		}
	}
	return best;
}

/*
 * The cohort free worker w's task goes to: of the cohorts filling that
 * it is not in, the one whose members' expected begins are nearest its
 * own (ties: the fullest, sealed soonest, then the oldest); else a new
 * one, if the bound allows and (others filling) open_safe does. NULL:
 * it waits.
 *
 * Except that a long task (LONG_TASK) does not join a cohort of long
 * tasks only while it may open one of its own: the short tasks given out
 * meanwhile fill both. In plain async a slow worker's update lands in a
 * buffer among fresh ones, whose staleness weights shrink it against
 * them; a cohort's members weigh alike (their weights are fixed before
 * masking), and one of long tasks only is a step of stale updates from
 * the same few workers' data. Measured: bench/RESULTS.md, "Asynchronous
 * rounds".
 */
cohort *
cohort_place(coord *c, const worker *w, int64_t now)
{
	double shortest = shortest_task(c);
	bool mixed = long_task(w, shortest), filling = false;
	cohort *best, *co;

	if (doomed(c, c->rd.committed, expect_of(c, w, now), now)) {
		/* its task is expected past round.max_staleness: a cohort of
		 * its own, whose failure costs no other worker's input (the
		 * others keep away from it), or none: it waits */
		return cohort_open(c, now);
	}
	best = nearest_filling(c, w, now, mixed ? shortest : 0);
	if (best != NULL) {
		return best;
	}
	for (uint32_t i = 0; i < c->cs.cap; i++) {
		filling |= c->cs.co[i].state == CO_FILLING;
	}
	if (filling && !open_safe(c, now)) {
		return mixed ? nearest_filling(c, w, now, 0) : NULL;
	}
	co = cohort_open(c, now);
	return co == NULL && mixed ? nearest_filling(c, w, now, 0) : co;
}

/* Gives every free worker a task (cohort_place), while the step's model
 * is out. */
static void
dispatch_free(coord *c, int64_t now)
{
	cohorts *cs = &c->cs;

	if (c->rd.phase != PHASE_TRAIN || !cs->bc_ready) {
		return;
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		cohort *co;
		if (!worker_free(c, w, now)) {
			continue;
		}
		co = cohort_place(c, w, now);
		if (co != NULL) {
			cohort_dispatch(c, co, w, now);
			continue;
		}
		for (uint32_t k = 0; k < cs->cap; k++) {
			if (cs->co[k].state == CO_FILLING) {
				co = &cs->co[k];
				break;
			}
		}
		if (co == NULL) {
			return; /* none to join, none may open: the rest wait */
		}
	}
}

/* RUNNING: setup, inputs, and the close at all in or the deadline. */
static void
cohort_run(coord *c, cohort *co, int64_t now)
{
	bool waiting = false, uploading = false;
	uint32_t included;

	sa_advance(c, now);
	if (co->sa.phase == SA_INPUT && co->input_ms == 0) {
		co->input_ms = now;
	}
	for (uint32_t s = 0; s < co->count; s++) {
		worker *w = &c->reg.workers[co->m[s].slot];
		if (sa_member_pending(c, s) && w->id == co->m[s].id) {
			waiting = true;
			uploading |= w->state == W_UPLOADING;
		}
	}
	if (co->sa.phase != SA_INPUT && co->sa.phase != SA_OFF &&
	    now < co->deadline_ms) {
		return; /* setup under way */
	}
	if (waiting && now < co->deadline_ms) {
		return;
	}
	if (waiting && uploading) {
		/* a masked input arrives whole or not at all: uploads under
		 * way at the deadline may finish, up to unmask_timeout */
		if (co->closing_ms == 0) {
			co->closing_ms = now;
			fb_log_warn(
			    "cohort %u: deadline (%.1fs) passed; letting "
			    "the masked uploads under way finish",
			    co->id, (double)c->cfg->deadline_ms / 1000.0);
		}
		if (now - co->closing_ms < c->cfg->sa_unmask_ms) {
			return;
		}
	}
	for (uint32_t s = 0; s < co->count; s++) {
		worker *w = &c->reg.workers[co->m[s].slot];
		if (w->id == co->m[s].id && on_task_of(w, co) &&
		    !(co->sa.flags[s] & SA_F_INCLUDED)) {
			round_cancel(c, w,
			    w->state == W_UPLOADING
			        ? "cohort deadline passed during upload"
			        : "cohort deadline passed during training");
		}
	}
	upload_settle(c); /* (notes the inputs that completed meanwhile) */
	included = sa_count(&co->sa, SA_F_INCLUDED);
	if (co->sa.poisoned != NULL) {
		cohort_fail(c, co, "%s", co->sa.poisoned);
		return;
	}
	if (included < co->sa.t || included < 2) {
		cohort_fail(c, co,
		    "only %u masked inputs complete, below the "
		    "secure-aggregation threshold of %u",
		    included, co->sa.t);
		return;
	}
	sa_request_confirms(c, now);
	co->state = CO_UNMASK;
}

/* UNMASK: the confirmations, then the reveals (round.c's sync twin). */
static void
cohort_unmask(coord *c, cohort *co, int64_t now)
{
	sa_round *sa = &co->sa;

	if (sa->phase == SA_CONFIRM) {
		if (sa_confirms_pending(c) && now < sa->phase_end_ms) {
			return;
		}
		if (sa_request_reveals(c, now) != FB_OK) {
			cohort_fail(c, co,
			    "only %u of the %u included workers "
			    "confirmed the included set (%u refused), below "
			    "the "
			    "secure-aggregation threshold of %u",
			    sa_count(sa, SA_F_CONFIRMED),
			    sa_count(sa, SA_F_INCLUDED),
			    sa_count(sa, SA_F_REFUSED), sa->t);
		}
		return;
	}
	if (sa_reveals_hopeless(c)) {
		cohort_fail(c, co,
		    "only %u of the %u workers that confirmed the "
		    "included set revealed their shares (%u refused), below "
		    "the "
		    "secure-aggregation threshold",
		    sa_count(sa, SA_F_REVEALED), sa_count(sa, SA_F_CONFIRMED),
		    sa_count(sa, SA_F_REFUSED));
		return;
	}
	if (!sa_reveals_pending(c) || now >= sa->phase_end_ms) {
		co->state = CO_READY;
		co->ready_seq = ++c->cs.seq;
	}
}

/* The first cohort completed goes to the job: one server step. */
static void
cohort_apply(coord *c, cohort *co, int64_t now)
{
	async_state *as = &c->as;
	round_state *rd = &c->rd;
	job *j = &c->job;
	uint64_t *n = calloc(co->count, sizeof(*n));
	uint64_t *st = calloc(co->count, sizeof(*st));
	double *w = calloc(co->count, sizeof(*w));
	double scale = 1.0;
	uint32_t k = 0;

	if (n == NULL || st == NULL || w == NULL) {
		goto out; /* tried again on the next turn */
	}
	as->count = 0;
	for (uint32_t s = 0; s < co->count; s++) {
		async_entry *e;
		if (!(co->sa.flags[s] & SA_F_INCLUDED) ||
		    as->count == as->cap) {
			continue;
		}
		n[k] = 1; /* sample counts are the workers' own: taken equal */
		st[k] = rd->committed - co->m[s].version;
		e = &as->buf[as->count++];
		memset(e, 0, sizeof(*e));
		snprintf(e->name, sizeof(e->name), "%s", co->m[s].name);
		e->version = co->m[s].version;
		e->staleness = (uint32_t)st[k];
		e->input_staleness = co->m[s].staleness;
		k++;
	}
	if (fb_fedbuff_weights(n, st, k, w, &scale) != FB_OK) {
		scale = 1.0;
	}
	if (model_writable(c, &c->params_lent, c->param_count * 4, true) !=
	    FB_OK) {
		goto out;
	}
	c->params = fb_lent_data(c->params_lent);
	as->scale = scale;
	as->dropped_stale = co->stale;
	as->superseded = co->superseded;
	rd->r.selected = co->count;
	rd->clipped = 0; /* (masked inputs are clipped on the workers) */
	co->state = CO_APPLYING;
	c->cs.applying = (int32_t)(co - c->cs.co);
	j->eval_only = false;
	j->secure_sum = true;
	j->sa = &co->sa;
	j->accum = co->accum;
	j->sa_scale = scale;
	j->scale = 1.0;
	j->evaluate = c->evaluate && c->cfg->eval_every > 0 &&
	              (rd->number % c->cfg->eval_every == 0 ||
	                  rd->number == (uint32_t)c->cfg->rounds);
	fb_log_debug("step %u: applying cohort %u (%u inputs, scale %.4f)",
	    rd->number, co->id, k, scale);
	jobs_submit(c, JOB_AGGREGATE);
	round_enter(c, PHASE_AGGREGATE, now);
out:
	free(n);
	free(st);
	free(w);
}

void
cohorts_tick(coord *c, int64_t now)
{
	cohorts *cs = &c->cs;
	cohort *ready = NULL;

	if (c->rd.phase == PHASE_DONE) {
		return;
	}
	for (uint32_t i = 0; i < cs->cap; i++) {
		cohort *co = &cs->co[i];
		sa_round *prev;
		if (co->state == CO_FREE || co->state == CO_APPLYING) {
			continue;
		}
		prev = cohort_enter(c, co, NULL);
		if (co->state == CO_FILLING &&
		    now - co->opened_ms >= c->cfg->deadline_ms) {
			/* not enough free workers came: it runs with those it
			 * has (the empty slots are dropouts) */
			fb_log_warn("cohort %u: %u of %u members within "
			            "round.deadline; sealed as it is",
			    co->id, co->count, co->sa.n);
			cohort_seal(c, co, now);
		}
		if (co->state == CO_RUNNING) {
			cohort_run(c, co, now);
		}
		if (co->state == CO_UNMASK) {
			cohort_unmask(c, co, now);
		}
		cohort_leave(c, prev, NULL);
		if (co->state == CO_READY &&
		    (ready == NULL || co->ready_seq < ready->ready_seq)) {
			ready = co;
		}
	}
	if (c->rd.phase != PHASE_TRAIN) {
		return;
	}
	if (ready != NULL && !jobs_busy(c) && cs->applying < 0) {
		cohort_apply(c, ready, now);
		if (c->rd.phase != PHASE_TRAIN) {
			return;
		}
	}
	dispatch_free(c, now);
}

void
cohorts_begin(coord *c, int64_t now)
{
	round_state *rd = &c->rd;
	cohorts *cs = &c->cs;

	if (rd->ran == 0 && cs->bc_version == 0 && !cs->bc_ready) {
		/* the first step: the run's credits start here, once (uploads
		 * then run across steps) */
		upload_credits_reset(c);
	}
	round_reset_result(c, now);
	c->as.count = 0;
	c->as.scale = NAN;
	rd->nsel = 0;
	rd->target_updates = UINT32_MAX;
	rd->in_chunks = c->chunk_count + 1;
	cs->bc_ready = false;
	/* the tasks now past round.max_staleness are cancelled: each is a
	 * dropout of its cohort */
	for (uint32_t i = 0; i < cs->cap; i++) {
		cohort *co = &cs->co[i];
		sa_round *prev;
		if (co->state != CO_FILLING && co->state != CO_RUNNING) {
			continue;
		}
		prev = cohort_enter(c, co, NULL);
		for (uint32_t s = 0; s < co->count; s++) {
			worker *w = &c->reg.workers[co->m[s].slot];
			uint32_t age = rd->committed - co->m[s].version;
			char why[160];
			if (w->id != co->m[s].id || !on_task_of(w, co) ||
			    age <= (uint32_t)c->cfg->max_staleness) {
				continue;
			}
			snprintf(why, sizeof(why),
			    "trained from model version %u, "
			    "%u steps old: past round.max_staleness (%lld)",
			    co->m[s].version, age,
			    (long long)c->cfg->max_staleness);
			fb_log_info("cohort %u: task of %s cancelled: %s",
			    co->id, w->name, why);
			co->stale++;
			task_floor(w, now);
			round_cancel(c, w, why);
		}
		cohort_leave(c, prev, NULL);
		if (co->state == CO_FILLING && !any_on_task(c, co)) {
			/* no input can come: nothing of it is lost */
			fb_log_debug("cohort %u closed: no member left on its "
			             "task",
			    co->id);
			cohort_free(c, co, "its cohort closed");
		}
	}
	round_open_model(c, now);
}

void
cohorts_open(coord *c, int64_t now)
{
	c->cs.bc_version = c->rd.committed;
	c->cs.bc_ready = true;
	c->rd.deadline_ms = now + c->cfg->deadline_ms;
	round_enter(c, PHASE_TRAIN, now);
	cohorts_tick(c, now);
}

void
cohorts_applied(coord *c)
{
	cohorts *cs = &c->cs;

	if (cs->applying >= 0) {
		cohort_free(c, &cs->co[cs->applying], "its cohort was applied");
		cs->applying = -1;
		if (cs->last_step_ms != 0 && c->now > cs->last_step_ms) {
			double dt = (double)(c->now - cs->last_step_ms);
			cs->step_ms = cs->step_ms > 0 ? 0.75 * cs->step_ms + 0.25 * dt
			                              : dt;
		}
		cs->last_step_ms = c->now;
	}
	cs->failed = 0;
}

bool
cohort_fetch_ok(coord *c, worker *w)
{
	cohort *co = cohort_of(c, w->task_round);

	if (c->rd.phase != PHASE_PREPARE && c->cs.bc_ready &&
	    c->cs.bc_version == w->task_version) {
		return true;
	}
	/* The server stepped between its task and its fetch: the model it
	 * was given is gone, and its slot is a dropout of its cohort. */
	if (co != NULL) {
		co->superseded++;
	}
	round_cancel(c, w, "its model was superseded before it was fetched");
	return false;
}

void
cohort_on_secagg(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	cohort *co = cohort_of(c, m->u.secagg.round);
	bool setup = m->u.secagg.phase == FB_SA_ADVERT ||
	             m->u.secagg.phase == FB_SA_SHARES;
	sa_round *prev;

	if (co == NULL || member_of(c, co, w) == co->count) {
		guard_drop(c, DROP_STALE_ROUND,
		    "secure-aggregation message for "
		    "round %u from %s, of no cohort it is in",
		    m->u.secagg.round, w->name);
		return;
	}
	if (setup && !on_task_of(w, co)) {
		guard_drop(c, DROP_UNEXPECTED,
		    "secure-aggregation setup for "
		    "cohort %u from %s, which is not on its task",
		    co->id, w->name);
		return;
	}
	if (!setup && co->state != CO_UNMASK) {
		guard_drop(c, DROP_UNEXPECTED,
		    "secure-aggregation message for "
		    "cohort %u from %s before its unmasking",
		    co->id, w->name);
		return;
	}
	prev = cohort_enter(c, co, w);
	sa_handle(c, w, f);
	cohort_leave(c, prev, w);
	if (co->sa.phase == SA_INPUT && co->input_ms == 0) {
		co->input_ms = c->now;
	}
}

void
cohort_note_staleness(coord *c, cohort *co, worker *w)
{
	uint32_t s = member_of(c, co, w);

	if (s < co->count) {
		co->m[s].staleness = c->rd.committed - co->m[s].version;
		w->staleness = co->m[s].staleness;
	}
}

void
cohort_note_begin(coord *c, worker *w, int64_t now)
{
	cohort *co = cohort_of(c, w->task_round);
	double t;

	if (co == NULL || w->state != W_UPLOADING || w->task_sent_ms == 0 ||
	    now < w->task_sent_ms) {
		return;
	}
	t = (double)(now - w->task_sent_ms);
	w->task_sent_ms = 0;
	if (co->input_ms == 0 || now - co->input_ms < CENSOR_MS) {
		/* it may have waited for the shares: an upper bound, which
		 * says something only below the estimate */
		if (w->has_task_ms && t >= w->task_ms) {
			return;
		}
	}
	w->task_ms = w->has_task_ms ? 0.5 * w->task_ms + 0.5 * t : t;
	w->has_task_ms = true;
}

/* The earlier of next and t - now (t 0: none). */
static int64_t
sooner(int64_t next, int64_t t, int64_t now)
{
	return t != 0 && t - now < next ? t - now : next;
}

int64_t
cohorts_next_timer(const coord *c, int64_t now, int64_t next)
{
	const fb_coord_config *cfg = c->cfg;

	for (uint32_t i = 0; i < c->cs.cap; i++) {
		const cohort *co = &c->cs.co[i];
		switch (co->state) {
		case CO_FILLING:
			next = sooner(next, co->opened_ms + cfg->deadline_ms, now);
			break;
		case CO_RUNNING:
			if (co->sa.phase == SA_ADVERTS ||
			    co->sa.phase == SA_SHARES) {
				next = sooner(next, co->sa.phase_end_ms, now);
			}
			if (co->deadline_ms > now) {
				next = sooner(next, co->deadline_ms, now);
			}
			if (co->closing_ms != 0) { /* uploads finishing */
				next = sooner(next,
				    co->closing_ms + cfg->sa_unmask_ms, now);
			}
			for (uint32_t s = 0; s < co->count; s++) {
				/* a member waiting for the others */
				int64_t h = hold_end(c, co,
				    &c->reg.workers[co->m[s].slot], now);
				if (h > now) {
					next = sooner(next, h, now);
				}
			}
			break;
		case CO_UNMASK:
			next = sooner(next, co->sa.phase_end_ms, now);
			break;
		default:
			break;
		}
	}
	return next < 0 ? 0 : next;
}
