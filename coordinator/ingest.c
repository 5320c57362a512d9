/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ingest.c -- the update ingest pool (see ingest.h).
 *
 * One mutex guards the queues: each slot has a FIFO of jobs and sits on the
 * ready list while it has jobs and no thread runs it, so a slot's jobs run
 * in order on one thread at a time. A thread takes one job of the first
 * ready slot and puts the slot back at the tail, which shares the threads
 * fairly between streams. The stream state of a slot (decryptor, stream
 * number, failed or not) is touched only by the thread running its job,
 * and the mutex hand-over orders those runs. Chunk indices map onto a set
 * of lock stripes: the callback runs under its chunk's stripe, unless it
 * locks for itself (cb_concurrent).
 *
 * A callback may split its work in independent pieces with
 * fb_ingest_parallel: the pieces go on a task list, and threads with no
 * job to run take pieces of the first task (its caller takes pieces too,
 * and waits for the last). So one stream, whose jobs run one at a time,
 * still gets the idle threads' help with the add of each chunk (one
 * thread adds only ~3 GB/s on the device host's Xeon, less than one
 * ZeroMQ connection delivers) once its chunks queue up (HELP_BACKLOG).
 * Jobs come first: a thread helps only when no slot is ready.
 *
 * With threads == 0 every job runs at once in the caller, in the same
 * code, so that mode is today's single-threaded coordinator.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/ingest.h"

#define STRIPES_MAX 256
#define THREADS_AUTO_MAX 16
/* A stream gets the idle threads' help with its adds only while this many
 * of its jobs wait behind the running one: it is falling behind what it
 * receives. A stream that keeps up on one thread (many workers, each
 * bringing less than a thread adds) leaves the other CPUs alone. */
#define HELP_BACKLOG 2

/* Jobs waiting behind the job this pool thread runs (fb_ingest_parallel). */
static _Thread_local uint32_t backlog;

typedef enum job_kind {
	JOB_BEGIN = 0,
	JOB_CHUNK,
	JOB_END,
	JOB_ABORT,
} job_kind;

typedef struct job {
	struct job *next;
	job_kind kind;
	uint32_t chunk;
	bool last;
	fb_buf *buf;             /* CHUNK */
	fb_stream_pull *pull;    /* BEGIN */
	void *stream_arg;        /* BEGIN */
	uint64_t gen;            /* BEGIN */
	fb_pubkey signer;        /* END */
	uint8_t trailer[FB_STREAM_TRAILER_LEN];
	size_t trailer_len;
} job;

typedef struct slot {
	/* under g->mu */
	job *head, *tail;
	bool scheduled;          /* on the ready list or running */
	uint32_t waiting;        /* jobs queued, not yet running */
	struct slot *next_ready;
	/* the stream: only the thread running this slot's job */
	fb_stream_pull *pull;
	void *stream_arg;
	uint64_t gen;
	bool live;               /* begun, not failed, ended or aborted */
	uint32_t consumed;
} slot;

/* A callback's pieces of work (fb_ingest_parallel), on its stack. */
typedef struct par_task {
	struct par_task *next;   /* under g->mu: the task list */
	void (*fn)(void *arg, uint32_t i);
	void *arg;
	uint32_t n;
	_Atomic uint32_t next_i; /* the next piece to take */
	uint32_t done;           /* under g->mu: pieces finished */
	uint32_t helpers;        /* under g->mu: threads inside the task */
} par_task;

typedef struct result_node {
	struct result_node *next;
	fb_ingest_result r;
} result_node;

struct fb_ingest {
	fb_ingest_opts o;
	slot *slots;
	pthread_mutex_t *stripes;
	uint32_t nstripes;
	pthread_t *threads;
	uint32_t nthreads;       /* started */
	int efd;
	uint64_t next_gen;       /* event loop only */
	_Atomic uint64_t counter;
	uint8_t *inline_scratch; /* threads == 0 */
	pthread_mutex_t mu;
	pthread_cond_t work;     /* a slot became ready, or stopping */
	pthread_cond_t room;     /* a chunk left the queue, or all idle */
	pthread_cond_t pdone;    /* a task's pieces are all finished */
	par_task *tasks;         /* tasks with pieces left to take */
	slot *ready_head, *ready_tail;
	uint32_t queued;         /* chunk jobs queued or running */
	uint32_t busy;           /* jobs queued or running */
	bool stopping;
	result_node *res_head, *res_tail;
	bool mu_live, work_live, room_live, pdone_live;
};

/* The CPUs this process may run on. */
static long
cpus_usable(void)
{
	cpu_set_t set;
	long n = 0;

	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		n = CPU_COUNT(&set);
	}
	if (n <= 0) {
		n = sysconf(_SC_NPROCESSORS_ONLN);
	}
	return n;
}

uint32_t
fb_io_threads_for(long cpus)
{
	/* One ZeroMQ I/O thread moved 4.6-4.9 GB/s of K = 4-8 uploads on
	 * the 32-CPU device host while a bare ZeroMQ receiver took 5-8;
	 * with two, every cell of bench/round_overhead there was at or
	 * above 70% of that receiver in that call (36 of 36, K = 2-8; later
	 * calls on other instances missed 1-2 K = 2 cells). On 2 CPUs a
	 * second one only competes with the workers and the adds (K = 4,
	 * N = 1e8: 1.1 GB/s against 1.9 with one). Four gained nothing
	 * more for small models (bench/RESULTS.md). */
	return cpus >= 8 ? 2 : 1;
}

uint32_t
fb_io_threads_auto(void)
{
	return fb_io_threads_for(cpus_usable());
}

uint32_t
fb_ingest_threads_auto(void)
{
	long n = cpus_usable();

	/* With 2 CPUs or fewer, ZeroMQ's I/O thread and the event loop
	 * already fill them: a third busy thread only adds switches (K = 8,
	 * N = 1e8 plain on 2 CPUs: 1.6 GB/s with one pool thread, 1.9
	 * inline). */
	if (n <= 2) {
		return 0;
	}
	n -= 1;
	return n > THREADS_AUTO_MAX ? THREADS_AUTO_MAX : (uint32_t)n;
}

/* Appends a result and signals the event fd. Under g->mu (or inline). */
static void
post_result(fb_ingest *g, const fb_ingest_result *r)
{
	result_node *n = malloc(sizeof(*n));
	uint64_t one = 1;

	if (n == NULL) {
		/* Without memory the result is lost: the event loop then sees
		 * the worker time out, as it would a lost one. */
		fb_log_error("ingest: out of memory for a stream result");
		return;
	}
	n->next = NULL;
	n->r = *r;
	if (g->res_tail != NULL) {
		g->res_tail->next = n;
	} else {
		g->res_head = n;
	}
	g->res_tail = n;
	if (write(g->efd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
		/* EAGAIN: the counter is saturated, so it is readable anyway. */
	}
}

static void
lock(fb_ingest *g)
{
	if (g->nthreads > 0) {
		pthread_mutex_lock(&g->mu);
	}
}

static void
unlock(fb_ingest *g)
{
	if (g->nthreads > 0) {
		pthread_mutex_unlock(&g->mu);
	}
}

/* Ends stream `s` without completing it (failed, aborted, replaced or the
 * pool going): end_cb hears of it once. */
static void
stream_close(fb_ingest *g, slot *s)
{
	if (s->live && g->o.end_cb != NULL) {
		(void)g->o.end_cb(g->o.cb_arg, s->stream_arg, false);
	}
	fb_stream_pull_free(s->pull);
	s->pull = NULL;
	s->live = false;
}

/* Closes stream `s` and reports how it ended (r: status and details). */
static void
stream_end(fb_ingest *g, slot *s, fb_ingest_result r)
{
	r.slot = (uint32_t)(s - g->slots);
	r.gen = s->gen;
	r.consumed = s->consumed;
	stream_close(g, s);
	lock(g);
	post_result(g, &r);
	unlock(g);
}

static void
stream_fail(fb_ingest *g, slot *s, fb_ingest_stage stage, fb_err err,
    fb_reject why, uint32_t chunk)
{
	stream_end(g, s, (fb_ingest_result){.status = FB_INGEST_FAILED,
	                     .stage = stage, .err = err, .reject = why,
	                     .chunk = chunk});
}

static void
stream_done(fb_ingest *g, slot *s)
{
	fb_err rc = FB_OK;

	if (g->o.end_cb != NULL) {
		rc = g->o.end_cb(g->o.cb_arg, s->stream_arg, true);
		s->live = false; /* heard of it: not again on close */
	}
	if (rc != FB_OK) {
		stream_end(g, s, (fb_ingest_result){.status = FB_INGEST_FAILED,
		                     .stage = FB_INGEST_AT_CONSUME, .err = rc,
		                     .chunk = s->consumed});
		return;
	}
	stream_end(g, s, (fb_ingest_result){.status = FB_INGEST_DONE});
}

static void
run_chunk(fb_ingest *g, slot *s, job *j, uint8_t *scratch)
{
	uint8_t *data = fb_buf_data(j->buf);
	size_t len = fb_buf_len(j->buf);
	uint8_t *plain = data;
	pthread_mutex_t *stripe;
	uint64_t counter = 0;
	fb_err rc;

	if (!s->live) {
		return; /* failed or aborted: later chunks are discarded */
	}
	if (s->pull != NULL) {
		fb_reject why = FB_REJECT_NONE;
		size_t mlen = 0, cap = g->o.max_chunk_len;
		int final = 0;
		uint8_t *dst = g->o.dst_cb == NULL ? NULL
		    : g->o.dst_cb(g->o.cb_arg, s->stream_arg, j->chunk, &cap);
		if (dst == NULL) {
			dst = scratch;
			cap = g->o.max_chunk_len;
		}
		/* the MAC first, then the decryption in parts that idle
		 * threads help with when this stream falls behind, as with
		 * the adds: one thread decrypts about what one connection
		 * delivers */
		rc = fb_stream_pull_chunk_par(s->pull, data, len, dst, cap,
		    &mlen, &final, &why, fb_ingest_parallel, g);
		if (rc != FB_OK) {
			stream_fail(g, s, FB_INGEST_AT_DECRYPT, rc, why, j->chunk);
			return;
		}
		if ((final != 0) != j->last) {
			stream_fail(g, s, FB_INGEST_AT_FINAL_MARK, FB_EPROTO,
			    FB_REJECT_TRUNCATED, j->chunk);
			return;
		}
		plain = dst;
		len = mlen;
	} else if (((uintptr_t)data & 3) != 0 || len > g->o.max_chunk_len) {
		if (len > g->o.max_chunk_len) {
			stream_fail(g, s, FB_INGEST_AT_CONSUME, FB_EINVAL,
			    FB_REJECT_TOO_LARGE, j->chunk);
			return;
		}
		memcpy(scratch, data, len);
		plain = scratch;
	}
	stripe = g->o.cb_concurrent ? NULL
	                            : &g->stripes[j->chunk % g->nstripes];
	if (stripe != NULL) {
		pthread_mutex_lock(stripe);
	}
	rc = g->o.chunk_cb(g->o.cb_arg, s->stream_arg, j->chunk, plain, len,
	    &counter);
	if (stripe != NULL) {
		pthread_mutex_unlock(stripe);
	}
	if (counter != 0) {
		atomic_fetch_add_explicit(&g->counter, counter,
		    memory_order_relaxed);
	}
	if (rc != FB_OK) {
		stream_fail(g, s, FB_INGEST_AT_CONSUME, rc, FB_REJECT_NONE,
		    j->chunk);
		return;
	}
	s->consumed++;
	if (s->pull == NULL && j->last) {
		stream_done(g, s);
	}
}

static void
run_end(fb_ingest *g, slot *s, job *j)
{
	fb_reject why = FB_REJECT_NONE;

	if (!s->live) {
		return;
	}
	if (s->pull == NULL) {
		/* A plaintext stream is done at its last chunk. */
		return;
	}
	if (fb_stream_pull_final(s->pull, &j->signer, j->trailer,
	        j->trailer_len, NULL, &why) != FB_OK) {
		stream_fail(g, s, FB_INGEST_AT_TRAILER, FB_EAUTH, why,
		    s->consumed);
		return;
	}
	stream_done(g, s);
}

/* Runs one job of slot `s` and frees it. */
static void
run_job(fb_ingest *g, slot *s, job *j, uint8_t *scratch)
{
	switch (j->kind) {
	case JOB_BEGIN:
		stream_close(g, s);
		s->pull = j->pull;
		s->stream_arg = j->stream_arg;
		s->gen = j->gen;
		s->consumed = 0;
		s->live = true;
		j->pull = NULL;
		break;
	case JOB_CHUNK:
		run_chunk(g, s, j, scratch);
		break;
	case JOB_END:
		run_end(g, s, j);
		break;
	case JOB_ABORT:
		stream_close(g, s);
		break;
	}
	fb_buf_free(j->buf);
	fb_stream_pull_free(j->pull);
	fb_wipe(j->trailer, sizeof(j->trailer));
	free(j);
}

/* Runs pieces of task t until none is left; returns how many it ran. */
static uint32_t
run_pieces(par_task *t)
{
	uint32_t ran = 0;
	for (;;) {
		uint32_t i = atomic_fetch_add_explicit(&t->next_i, 1,
		    memory_order_relaxed);
		if (i >= t->n) {
			return ran;
		}
		t->fn(t->arg, i);
		ran++;
	}
}

/* Takes pieces of the first task that has some left. Called and returns
 * with g->mu held; drops it while it runs the pieces. */
static void
help(fb_ingest *g)
{
	par_task *t = g->tasks;
	uint32_t ran;

	/* The owner unlinks its task once every piece is taken; this thread
	 * may find one whose last piece was just taken: it runs none. */
	t->helpers++;
	pthread_mutex_unlock(&g->mu);
	ran = run_pieces(t);
	pthread_mutex_lock(&g->mu);
	if (g->tasks == t) {
		g->tasks = t->next; /* nothing left to take in it */
	}
	t->done += ran;
	t->helpers--;
	if (t->done == t->n && t->helpers == 0) {
		pthread_cond_broadcast(&g->pdone);
	}
}

void
fb_ingest_parallel(void *pool, uint32_t n, void (*fn)(void *arg, uint32_t i),
    void *arg)
{
	fb_ingest *g = pool;
	par_task t = {.fn = fn, .arg = arg, .n = n};
	par_task **pp;
	uint32_t ran;

	if (g->nthreads < 2 || n < 2 || backlog < HELP_BACKLOG) {
		for (uint32_t i = 0; i < n; i++) {
			fn(arg, i);
		}
		return;
	}
	pthread_mutex_lock(&g->mu);
	t.next = NULL;
	for (pp = &g->tasks; *pp != NULL; pp = &(*pp)->next) {
	}
	*pp = &t;
	pthread_cond_broadcast(&g->work);
	pthread_mutex_unlock(&g->mu);
	ran = run_pieces(&t);
	pthread_mutex_lock(&g->mu);
	for (pp = &g->tasks; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == &t) {
			*pp = t.next; /* (a helper may have done it) */
			break;
		}
	}
	t.done += ran;
	while (t.done < t.n || t.helpers > 0) {
		pthread_cond_wait(&g->pdone, &g->mu);
	}
	pthread_mutex_unlock(&g->mu);
}

static void *
thread_main(void *arg)
{
	fb_ingest *g = arg;
	uint8_t *scratch = fb_alloc(g->o.max_chunk_len);

	pthread_mutex_lock(&g->mu);
	for (;;) {
		slot *s;
		job *j;
		bool chunk;

		while (g->ready_head == NULL && g->tasks == NULL &&
		    !g->stopping) {
			pthread_cond_wait(&g->work, &g->mu);
		}
		if (g->ready_head == NULL && g->tasks != NULL) {
			help(g); /* returns with g->mu held */
			continue;
		}
		if (g->ready_head == NULL) {
			break; /* stopping and nothing left */
		}
		s = g->ready_head;
		g->ready_head = s->next_ready;
		if (g->ready_head == NULL) {
			g->ready_tail = NULL;
		}
		s->next_ready = NULL;
		j = s->head;
		s->head = j->next;
		if (s->head == NULL) {
			s->tail = NULL;
		}
		chunk = j->kind == JOB_CHUNK;
		s->waiting--;
		backlog = s->waiting;
		pthread_mutex_unlock(&g->mu);

		if (scratch == NULL && chunk) {
			/* No scratch: refuse the chunk rather than crash. */
			fb_ingest_result r = {.slot = (uint32_t)(s - g->slots),
			    .gen = s->gen, .status = FB_INGEST_FAILED,
			    .stage = FB_INGEST_AT_CONSUME, .err = FB_ENOMEM,
			    .chunk = j->chunk, .consumed = s->consumed};
			if (s->live) {
				stream_close(g, s);
				pthread_mutex_lock(&g->mu);
				post_result(g, &r);
				pthread_mutex_unlock(&g->mu);
			}
			j->kind = JOB_ABORT;
		}
		run_job(g, s, j, scratch);

		pthread_mutex_lock(&g->mu);
		if (chunk) {
			g->queued--;
		}
		g->busy--;
		if (s->head != NULL) {
			if (g->ready_tail != NULL) {
				g->ready_tail->next_ready = s;
			} else {
				g->ready_head = s;
			}
			g->ready_tail = s;
		} else {
			s->scheduled = false;
		}
		if (chunk || g->busy == 0) {
			pthread_cond_broadcast(&g->room);
		}
	}
	pthread_mutex_unlock(&g->mu);
	if (scratch != NULL) {
		fb_wipe(scratch, g->o.max_chunk_len);
		fb_free(scratch);
	}
	return NULL;
}

/* Queues job `j` on slot `slot` (or runs it now without threads). */
static void
submit(fb_ingest *g, uint32_t slot_i, job *j)
{
	slot *s = &g->slots[slot_i];

	if (g->nthreads == 0) {
		run_job(g, s, j, g->inline_scratch);
		return;
	}
	pthread_mutex_lock(&g->mu);
	if (j->kind == JOB_CHUNK) {
		while (g->queued >= g->o.queue_max) {
			pthread_cond_wait(&g->room, &g->mu);
		}
		g->queued++;
	}
	g->busy++;
	s->waiting++;
	j->next = NULL;
	if (s->tail != NULL) {
		s->tail->next = j;
	} else {
		s->head = j;
	}
	s->tail = j;
	if (!s->scheduled) {
		s->scheduled = true;
		if (g->ready_tail != NULL) {
			g->ready_tail->next_ready = s;
		} else {
			g->ready_head = s;
		}
		g->ready_tail = s;
		pthread_cond_signal(&g->work);
	}
	pthread_mutex_unlock(&g->mu);
}

static job *
job_new(job_kind kind)
{
	job *j = calloc(1, sizeof(*j));
	if (j != NULL) {
		j->kind = kind;
	}
	return j;
}

fb_err
fb_ingest_alloc(const fb_ingest_opts *opts, fb_ingest **out)
{
	fb_ingest *g;
	fb_err rc = FB_OK;

	*out = NULL;
	if (opts->slots == 0 || opts->chunk_count == 0 ||
	    opts->max_chunk_len == 0 || opts->chunk_cb == NULL) {
		return FB_EINVAL;
	}
	if ((g = calloc(1, sizeof(*g))) == NULL) {
		return FB_ENOMEM;
	}
	g->o = *opts;
	g->efd = -1;
	if (g->o.queue_max == 0) {
		g->o.queue_max = 4 * (g->o.threads > 0 ? g->o.threads : 1);
	}
	g->nstripes = opts->chunk_count < STRIPES_MAX ? opts->chunk_count
	                                              : STRIPES_MAX;
	g->slots = calloc(opts->slots, sizeof(*g->slots));
	g->stripes = calloc(g->nstripes, sizeof(*g->stripes));
	g->threads = calloc(opts->threads > 0 ? opts->threads : 1,
	    sizeof(*g->threads));
	if (g->slots == NULL || g->stripes == NULL || g->threads == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < g->nstripes; i++) {
		pthread_mutex_init(&g->stripes[i], NULL);
	}
	if ((g->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		fb_log_error("eventfd: %s", strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	g->mu_live = pthread_mutex_init(&g->mu, NULL) == 0;
	g->work_live = pthread_cond_init(&g->work, NULL) == 0;
	g->room_live = pthread_cond_init(&g->room, NULL) == 0;
	g->pdone_live = pthread_cond_init(&g->pdone, NULL) == 0;
	if (!g->mu_live || !g->work_live || !g->room_live ||
	    !g->pdone_live) {
		rc = FB_EIO;
		goto out;
	}
	if (opts->threads == 0) {
		if ((g->inline_scratch = fb_alloc(opts->max_chunk_len)) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
	}
	for (uint32_t i = 0; i < opts->threads; i++) {
		int e = pthread_create(&g->threads[i], NULL, thread_main, g);
		if (e != 0) {
			fb_log_error("ingest: cannot start thread %u of %u: %s",
			    i + 1, opts->threads, strerror(e));
			rc = FB_EIO;
			goto out;
		}
		g->nthreads++;
	}
	*out = g;
	g = NULL;
out:
	fb_ingest_free(g);
	return rc;
}

void
fb_ingest_free(fb_ingest *g)
{
	fb_ingest_result r;

	if (g == NULL) {
		return;
	}
	if (g->nthreads > 0) {
		pthread_mutex_lock(&g->mu);
		g->stopping = true;
		pthread_cond_broadcast(&g->work);
		pthread_mutex_unlock(&g->mu);
		for (uint32_t i = 0; i < g->nthreads; i++) {
			pthread_join(g->threads[i], NULL);
		}
	}
	g->nthreads = 0;
	for (uint32_t i = 0; g->slots != NULL && i < g->o.slots; i++) {
		slot *s = &g->slots[i];
		while (s->head != NULL) {
			job *j = s->head;
			s->head = j->next;
			j->kind = JOB_ABORT;
			run_job(g, s, j, NULL);
		}
		stream_close(g, s);
	}
	while (fb_ingest_result_next(g, &r)) {
	}
	for (uint32_t i = 0; g->stripes != NULL && i < g->nstripes; i++) {
		pthread_mutex_destroy(&g->stripes[i]);
	}
	if (g->mu_live) {
		pthread_mutex_destroy(&g->mu);
	}
	if (g->work_live) {
		pthread_cond_destroy(&g->work);
	}
	if (g->room_live) {
		pthread_cond_destroy(&g->room);
	}
	if (g->pdone_live) {
		pthread_cond_destroy(&g->pdone);
	}
	if (g->efd >= 0) {
		close(g->efd);
	}
	if (g->inline_scratch != NULL) {
		fb_wipe(g->inline_scratch, g->o.max_chunk_len);
		fb_free(g->inline_scratch);
	}
	free(g->slots);
	free(g->stripes);
	free(g->threads);
	free(g);
}

int
fb_ingest_wake_fd(const fb_ingest *g)
{
	return g->efd;
}

fb_err
fb_ingest_begin(fb_ingest *g, uint32_t slot_i, fb_stream_pull *pull,
    void *stream_arg, uint64_t *gen)
{
	job *j;

	*gen = 0;
	if (slot_i >= g->o.slots) {
		fb_stream_pull_free(pull);
		return FB_EINVAL;
	}
	if ((j = job_new(JOB_BEGIN)) == NULL) {
		fb_stream_pull_free(pull);
		return FB_ENOMEM;
	}
	j->pull = pull;
	j->stream_arg = stream_arg;
	j->gen = ++g->next_gen;
	*gen = j->gen;
	submit(g, slot_i, j);
	return FB_OK;
}

fb_err
fb_ingest_chunk(fb_ingest *g, uint32_t slot_i, uint32_t chunk, fb_buf *buf,
    bool last)
{
	job *j;

	if (slot_i >= g->o.slots || chunk >= g->o.chunk_count || buf == NULL) {
		fb_buf_free(buf);
		return FB_EINVAL;
	}
	if ((j = job_new(JOB_CHUNK)) == NULL) {
		fb_buf_free(buf);
		return FB_ENOMEM;
	}
	j->chunk = chunk;
	j->last = last;
	j->buf = buf;
	submit(g, slot_i, j);
	return FB_OK;
}

fb_err
fb_ingest_end(fb_ingest *g, uint32_t slot_i, const fb_pubkey *signer,
    const uint8_t *trailer, size_t trailer_len)
{
	job *j;

	if (slot_i >= g->o.slots || trailer_len > sizeof(j->trailer)) {
		return FB_EINVAL;
	}
	if ((j = job_new(JOB_END)) == NULL) {
		return FB_ENOMEM;
	}
	j->signer = *signer;
	memcpy(j->trailer, trailer, trailer_len);
	j->trailer_len = trailer_len;
	submit(g, slot_i, j);
	return FB_OK;
}

void
fb_ingest_abort(fb_ingest *g, uint32_t slot_i)
{
	job *j;

	if (slot_i >= g->o.slots) {
		return;
	}
	if ((j = job_new(JOB_ABORT)) == NULL) {
		/* Nothing of the slot runs once the pool is idle. */
		fb_ingest_drain(g);
		stream_close(g, &g->slots[slot_i]);
		return;
	}
	submit(g, slot_i, j);
}

void
fb_ingest_drain(fb_ingest *g)
{
	if (g->nthreads == 0) {
		return;
	}
	pthread_mutex_lock(&g->mu);
	while (g->busy > 0) {
		pthread_cond_wait(&g->room, &g->mu);
	}
	pthread_mutex_unlock(&g->mu);
}

bool
fb_ingest_result_next(fb_ingest *g, fb_ingest_result *r)
{
	result_node *n;
	uint64_t v;

	memset(r, 0, sizeof(*r));
	lock(g);
	n = g->res_head;
	if (n != NULL) {
		g->res_head = n->next;
		if (g->res_head == NULL) {
			g->res_tail = NULL;
		}
	}
	if (g->res_head == NULL && g->efd >= 0) {
		/* Reset the fd while holding the lock: a result posted after
		 * this write()s it again. */
		if (read(g->efd, &v, sizeof(v)) < 0) {
			/* EAGAIN: already reset */
		}
	}
	unlock(g);
	if (n == NULL) {
		return false;
	}
	*r = n->r;
	free(n);
	return true;
}

uint64_t
fb_ingest_counter(const fb_ingest *g)
{
	return atomic_load_explicit(&((fb_ingest *)(uintptr_t)g)->counter,
	    memory_order_relaxed);
}
