/* SPDX-License-Identifier: Apache-2.0 */
/*
 * progress.c -- what the coordinator tells those watching: the Prometheus
 * endpoint's values (metrics_http.h, when metrics.listen is set) and, when
 * stdout is a terminal, a status line within the round (phase, updates in
 * of those selected, bytes, an estimate of the time left) that the round
 * line replaces at the round's end. Called from the loop thread only.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "coordinator/coordinator_impl.h"
#include "coordinator/metrics_http.h"

#define TTY_EVERY_MS 250

fb_err
progress_start(coord *c)
{
	fb_err rc;

	c->tty = isatty(STDOUT_FILENO) == 1;
	if (c->cfg->metrics_listen[0] == '\0') {
		return FB_OK;
	}
	if ((rc = fb_metrics_alloc(c->cfg->metrics_listen, c->reg.cap,
	         &c->prom)) != FB_OK) {
		return rc;
	}
	for (int i = 0; i < DROP_REASON_COUNT_; i++) {
		(void)fb_metrics_add_rejected(c->prom, drop_names[i], 0);
	}
	if (c->cfg->mode == FB_MODE_ASYNC) {
		fb_metrics_async_start(c->prom, cohorts_on(c));
	}
	return FB_OK;
}

void
progress_stop(coord *c)
{
	fb_metrics_free(c->prom);
	c->prom = NULL;
}

static void
tty_clear(coord *c)
{
	if (c->tty && c->tty_shown) {
		fputs("\r\033[K", stdout);
		c->tty_shown = false;
	}
}

void
progress_phase(coord *c)
{
	if (c->prom != NULL) {
		(void)fb_metrics_set_round(c->prom, c->rd.number,
		    (uint32_t)c->cfg->rounds, round_phase_names[c->rd.phase]);
	}
}

/* Workers by state, for the endpoint. */
static void
workers_by_state(coord *c)
{
	uint32_t n[W_STATE_COUNT_] = {0}, live = 0;

	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (w->used) {
			n[w->state]++;
			live++;
		}
	}
	(void)fb_metrics_set_workers(c->prom, "live", live);
	for (int s = 0; s < W_STATE_COUNT_; s++) {
		(void)fb_metrics_set_workers(c->prom, worker_state_names[s], n[s]);
	}
}

/* round.mode async: the step just recorded (its metrics line is next,
 * from the same buffer): the updates it applied, with their staleness,
 * and those dropped or superseded since the step before. In secure async
 * the buffer is the cohort applied, if any. */
static void
async_step_done(coord *c)
{
	const async_state *as = &c->as;
	uint32_t small[64], *st = small, n = 0;
	/* secure async: the buffer is the cohort being applied; with none,
	 * as holds the last one's, counted already */
	bool ours = !cohorts_on(c) || c->cs.applying >= 0;
	bool applied = ours && c->rd.r.status == ROUND_OK;

	if (applied && as->count > sizeof(small) / sizeof(small[0]) &&
	    (st = malloc(as->count * sizeof(*st))) == NULL) {
		fb_log_warn("round %u: out of memory for the step's staleness "
		            "on the metrics endpoint; its applied updates are "
		            "left out of the endpoint's counts",
		    c->rd.number);
		st = small;
		applied = false;
	}
	for (uint32_t i = 0; applied && i < as->count; i++) {
		st[n++] = as->buf[i].staleness;
	}
	/* one call: a scrape sees the whole step or none of it */
	fb_metrics_async_step(c->prom, c->rd.committed, st, n,
	    ours ? as->dropped_stale : 0, ours ? as->superseded : 0);
	if (st != small) {
		free(st);
	}
}

void
progress_cohort_failed(coord *c)
{
	if (c->prom != NULL) {
		fb_metrics_cohort_failed(c->prom);
	}
}

/* The round was recorded: its outcome to the endpoint. `rejected` are the
 * drops counted in its metrics line. */
void
progress_round_done(coord *c, const uint64_t *rejected)
{
	const round_state *rd = &c->rd;

	tty_clear(c);
	if (c->prom == NULL) {
		return;
	}
	(void)fb_metrics_round_done(c->prom, round_status_names[rd->r.status],
	    rd->r.seconds);
	if (c->cfg->mode == FB_MODE_ASYNC && !rd->final) {
		async_step_done(c);
	}
	if (rd->r.status == ROUND_OK) {
		fb_metrics_set_test(c->prom, rd->r.test_accuracy, rd->r.test_loss);
	}
	if (rd->r.fed_eval.reports > 0) {
		/* the federated evaluation of the round's starting model */
		fb_metrics_set_federated(c->prom, rd->r.fed_eval.accuracy,
		    rd->r.fed_eval.loss);
	}
	fb_metrics_add_bytes(c->prom, rd->up_bytes, rd->down_bytes);
	for (int i = 0; i < DROP_REASON_COUNT_; i++) {
		(void)fb_metrics_add_rejected(c->prom, drop_names[i], rejected[i]);
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (!w->used || w->state == W_IDLE) {
			continue;
		}
		/* speeds and steps only where the worker reported them: secure
		 * rounds keep a worker's work its own */
		if (w->round_speed > 0) {
			(void)fb_metrics_set_worker(c->prom, i, w->name,
			    w->round_speed);
		}
		if (c->sa->phase == SA_OFF && w->steps > 0 &&
		    w->round_speed > 0) {
			(void)fb_metrics_add_worker_steps(c->prom, i, w->steps);
		}
	}
	workers_by_state(c);
}

void
progress_worker_left(coord *c, const worker *w)
{
	if (c->prom != NULL) {
		fb_metrics_forget_worker(c->prom, registry_slot(c, w).v);
	}
}

/* The status line on a terminal, at most every TTY_EVERY_MS. */
void
progress_tick(coord *c, int64_t now)
{
	const round_state *rd = &c->rd;
	uint32_t done = 0, sel = 0;
	double est;

	if (c->prom != NULL && now - c->prom_ms >= 1000) {
		workers_by_state(c);
		c->prom_ms = now;
	}
	if (!c->tty || now - c->tty_ms < TTY_EVERY_MS ||
	    rd->phase == PHASE_DONE) {
		return;
	}
	c->tty_ms = now;
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		sel += w->used && w->state != W_IDLE;
		done += w->used && w->state == W_DONE;
	}
	printf("\r\033[Kround %3u/%lld  %-9s  updates %u/%u  up %.1f MB",
	    rd->number, (long long)c->cfg->rounds, round_phase_names[rd->phase],
	    done, sel,
	    (double)(c->io.bytes_received(c) - rd->recv0) / 1e6);
	if (rd->phase != PHASE_IDLE) {
		/* what is left of the round: the mean of the rounds before
		 * (the deadline for the first) less what passed */
		est = rd->ran > 0 ? rd->seconds_sum / rd->ran
		                  : (double)c->cfg->deadline_ms / 1000.0;
		est -= (double)(now - rd->started_ms) / 1000.0;
		printf("  %5.1fs in, ~%.0fs left",
		    (double)(now - rd->started_ms) / 1000.0, est > 0 ? est : 0.0);
	}
	fflush(stdout);
	c->tty_shown = true;
}
