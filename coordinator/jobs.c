/* SPDX-License-Identifier: Apache-2.0 */
/*
 * jobs.c -- the coordinator's long work, off the event loop.
 *
 * One job thread runs one job at a time (the round is sequential): the
 * model's encryption for a round, the commit (unmask, checks, server step,
 * evaluation, model file), and the metrics line's append. The long passes
 * inside a job run on the pool (common/pool.h), every core of the host.
 * The loop submits a job and learns of its end through an eventfd it
 * polls with the socket, so heartbeats and handshakes are answered all the
 * while. What a job may touch is listed at job_kind (coordinator_impl.h);
 * the loop leaves those alone until the job is done (the round's phase
 * says so). The mutex hands the job's inputs over and its results back.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

/* The server step over chunk ranges, on the pool. */
typedef struct step_arg {
	coord *c;
	fb_accum *accum;
	double scale;
	uint32_t per;     /* chunks per piece */
	atomic_int rc;
} step_arg;

static void
step_piece(void *arg, uint32_t i)
{
	step_arg *a = arg;
	coord *c = a->c;
	uint32_t first = i * a->per;
	uint32_t n = c->chunk_count - first < a->per ? c->chunk_count - first
	                                             : a->per;
	fb_err rc = fb_server_opt_step_chunks(c->opt, a->accum, c->params,
	    a->scale, first, n);

	if (rc != FB_OK) {
		int ok = FB_OK;
		atomic_compare_exchange_strong(&a->rc, &ok, (int)rc);
	}
}

static fb_err
server_step(coord *c, job *j)
{
	step_arg a = {.c = c, .accum = j->accum, .scale = j->scale};
	uint32_t pieces = (fb_pool_threads(c->pool) + 1) * 4;

	if (!(j->scale > 0) || !isfinite(j->scale)) {
		snprintf(j->why, sizeof(j->why), "the server step's scale %.6g is "
		    "not a positive number", j->scale);
		return FB_ERANGE;
	}
	/* the schedule's lr for this round (aggregation.server_lr_decay) */
	fb_server_opt_set_round(c->opt, c->rd.number);
	a.per = (c->chunk_count + pieces - 1) / pieces;
	atomic_init(&a.rc, FB_OK);
	fb_pool_for(c->pool, (c->chunk_count + a.per - 1) / a.per, step_piece,
	    &a);
	if (atomic_load(&a.rc) != FB_OK) {
		snprintf(j->why, sizeof(j->why), "server step failed: %s",
		    fb_strerror((fb_err)atomic_load(&a.rc)));
		return (fb_err)atomic_load(&a.rc);
	}
	return FB_OK;
}

static void
job_aggregate(coord *c, job *j)
{
	double t = fb_now_s();

	j->test_accuracy = NAN;
	j->test_loss = NAN;
	memset(j->seconds, 0, sizeof(j->seconds));
	/* the loop froze the fetches (broadcast_freeze): the seals under way
	 * finish before the step writes the model they read */
	broadcast_quiesce(c);
	if (j->secure_sum) {
		if ((j->rc = sa_unmask(c, j)) != FB_OK) {
			return;
		}
		j->scale = (fb_rule_is_fednova(c->cfg->rule) ? j->a : 1.0) *
		    j->sa_scale;
	}
	j->seconds[0] = fb_now_s() - t;
	if (j->eval_only) {
		return; /* the final evaluation: the model stays */
	}
	t = fb_now_s();
	if ((j->rc = server_step(c, j)) != FB_OK) {
		return;
	}
	j->seconds[1] = fb_now_s() - t;
	t = fb_now_s();
	if (j->evaluate) {
		j->rc = fb_model_evaluate(c->model, c->params, c->test.x,
		    c->test.y, c->test.count, &j->test_loss, &j->test_accuracy);
		if (j->rc != FB_OK) {
			snprintf(j->why, sizeof(j->why), "evaluation failed: %s",
			    fb_strerror(j->rc));
			j->fatal = true;
			return;
		}
	}
	j->seconds[2] = fb_now_s() - t;
}

/* The round's record: its checkpoint, then its metrics line. */
static void
job_record(coord *c, job *j)
{
	double t = fb_now_s();

	/* The final evaluation changed no model: no checkpoint, no export,
	 * only its line. */
	j->rc = c->rd.final ? FB_OK
	                    : checkpoint_write(c, c->rd.r.status == ROUND_OK,
	                          j->line, j->line_len);
	if (j->rc != FB_OK) {
		snprintf(j->why, sizeof(j->why), "cannot write the checkpoint: %s",
		    fb_strerror(j->rc));
		j->fatal = true;
		return;
	}
	j->seconds[0] = fb_now_s() - t;
	if ((j->rc = outputs_append_line(c, j->line, j->line_len)) != FB_OK) {
		snprintf(j->why, sizeof(j->why), "cannot append the metrics "
		    "line: %s", fb_strerror(j->rc));
		j->fatal = true;
	}
}

static void
job_run(coord *c, job *j)
{
	double t = fb_now_s();

	j->rc = FB_OK;
	j->fatal = false;
	j->why[0] = '\0';
	switch (j->kind) {
	case JOB_ENCRYPT:
		j->rc = broadcast_encrypt(c);
		fb_log_debug("round %u: model encrypted in %.3fs", c->rd.number,
		    fb_now_s() - t);
		break;
	case JOB_AGGREGATE:
		job_aggregate(c, j);
		fb_log_debug("round %u: unmask %.3fs, step %.3fs, evaluation "
		             "%.3fs",
		    c->rd.number, j->seconds[0], j->seconds[1], j->seconds[2]);
		break;
	case JOB_RECORD:
		job_record(c, j);
		fb_log_debug("round %u: checkpoint %.3fs, in all %.3fs",
		    c->rd.number, j->seconds[0], fb_now_s() - t);
		break;
	default:
		break;
	}
}

static void
job_finish(job *j)
{
	uint64_t one = 1;

	pthread_mutex_lock(&j->mu);
	j->done = true;
	pthread_mutex_unlock(&j->mu);
	if (j->efd >= 0 && write(j->efd, &one, sizeof(one)) != sizeof(one)) {
		fb_log_error("job eventfd: %s", strerror(errno));
	}
}

static void *
job_main(void *arg)
{
	coord *c = arg;
	job *j = &c->job;

	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (!j->stop && (j->kind == JOB_NONE || j->done)) {
			pthread_cond_wait(&j->cv, &j->mu);
		}
		if (j->stop) {
			break;
		}
		pthread_mutex_unlock(&j->mu);
		job_run(c, j);
		job_finish(j);
		pthread_mutex_lock(&j->mu);
	}
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

fb_err
jobs_start(coord *c, bool inline_only)
{
	job *j = &c->job;

	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->started = true;
	j->inline_only = inline_only;
	if ((j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		fb_log_error("eventfd: %s", strerror(errno));
		return FB_EIO;
	}
	if (!inline_only) {
		if (pthread_create(&j->thread, NULL, job_main, c) != 0) {
			fb_log_error("cannot start the job thread");
			return FB_EIO;
		}
		j->thread_live = true;
	}
	return FB_OK;
}

/* Waits for the job under way, then stops the thread. */
void
jobs_stop(coord *c)
{
	job *j = &c->job;

	if (!j->started) {
		return;
	}
	if (j->thread_live) {
		pthread_mutex_lock(&j->mu);
		while (j->kind != JOB_NONE && !j->done) {
			pthread_mutex_unlock(&j->mu);
			fb_sleep_ms(5);
			pthread_mutex_lock(&j->mu);
		}
		j->stop = true;
		pthread_cond_signal(&j->cv);
		pthread_mutex_unlock(&j->mu);
		pthread_join(j->thread, NULL);
		j->thread_live = false;
	}
	if (j->efd >= 0) {
		close(j->efd);
		j->efd = -1;
	}
	free(j->line);
	j->line = NULL;
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	j->started = false;
}

void
jobs_submit(coord *c, job_kind kind)
{
	job *j = &c->job;

	FB_ASSERT(!jobs_busy(c));
	pthread_mutex_lock(&j->mu);
	j->kind = kind;
	j->done = false;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (j->inline_only) {
		job_run(c, j);
		job_finish(j);
	}
}

/*
 * jobs_take_done returns the kind of the job submitted last once it is
 * done (JOB_NONE while none is), and frees the slot for the next submit.
 * Its results (rc, why, outputs) stay in c->job for the loop to read.
 */
job_kind
jobs_take_done(coord *c)
{
	job *j = &c->job;
	job_kind kind = JOB_NONE;
	uint64_t v;

	pthread_mutex_lock(&j->mu);
	if (j->kind != JOB_NONE && j->done) {
		kind = j->kind;
		j->kind = JOB_NONE;
		j->done = false;
	}
	pthread_mutex_unlock(&j->mu);
	if (kind != JOB_NONE && read(j->efd, &v, sizeof(v)) < 0) {
		/* drained already: fine */
	}
	return kind;
}

bool
jobs_busy(coord *c)
{
	job *j = &c->job;
	bool busy;

	pthread_mutex_lock(&j->mu);
	busy = j->kind != JOB_NONE;
	pthread_mutex_unlock(&j->mu);
	return busy;
}
