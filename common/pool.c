/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.c -- the data-parallel loop of pool.h.
 *
 * One batch at a time: fb_pool_for publishes (fn, arg, n) under the mutex
 * with a new generation number and wakes the threads; every thread and the
 * caller take indices from one atomic counter until they run out, and each
 * thread then counts itself out. The caller returns once every thread has
 * left the batch, so no thread can carry an old batch's fn or arg into a
 * newer one, and none skips a generation.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pool.h"

#define POOL_THREADS_MAX 256

struct fb_pool {
	pthread_mutex_t mu;
	pthread_cond_t work;  /* a new batch, or stop */
	pthread_cond_t idle;  /* the last thread left the batch */
	pthread_mutex_t busy; /* one fb_pool_for at a time */
	pthread_t *threads;
	uint32_t nthreads;
	bool stop;
	uint64_t gen;         /* batch number, under mu */
	uint32_t pending;     /* threads yet to finish the batch, under mu */
	/* the batch; written under mu before gen moves */
	void (*fn)(void *, uint32_t);
	void *arg;
	uint32_t n;
	atomic_uint_fast32_t next; /* next index to hand out */
};

uint32_t
fb_pool_cpus(void)
{
	cpu_set_t set;
	long n;

	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		n = CPU_COUNT(&set);
	} else {
		n = sysconf(_SC_NPROCESSORS_ONLN);
	}
	return n < 1 ? 1 : (uint32_t)n;
}

/* Takes indices of the current batch until none are left. */
static void
pool_work(void (*fn)(void *, uint32_t), void *arg, uint32_t n,
    atomic_uint_fast32_t *next)
{
	for (;;) {
		uint_fast32_t i = atomic_fetch_add_explicit(next, 1,
		    memory_order_relaxed);
		if (i >= n) {
			return;
		}
		fn(arg, (uint32_t)i);
	}
}

static void *
pool_main(void *p_)
{
	fb_pool *p = p_;
	uint64_t seen = 0;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->gen == seen) {
			pthread_cond_wait(&p->work, &p->mu);
		}
		if (p->stop) {
			break;
		}
		seen = p->gen;
		{
			void (*fn)(void *, uint32_t) = p->fn;
			void *arg = p->arg;
			uint32_t n = p->n;
			pthread_mutex_unlock(&p->mu);
			pool_work(fn, arg, n, &p->next);
			pthread_mutex_lock(&p->mu);
		}
		if (--p->pending == 0) {
			pthread_cond_signal(&p->idle);
		}
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

fb_err
fb_pool_alloc(uint32_t threads, fb_pool **out)
{
	fb_pool *p;

	*out = NULL;
	if (threads > POOL_THREADS_MAX) {
		return FB_EINVAL;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL) {
		return FB_ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_mutex_init(&p->busy, NULL);
	pthread_cond_init(&p->work, NULL);
	pthread_cond_init(&p->idle, NULL);
	atomic_init(&p->next, 0);
	if (threads > 0 &&
	    (p->threads = calloc(threads, sizeof(*p->threads))) == NULL) {
		fb_pool_free(p);
		return FB_ENOMEM;
	}
	for (uint32_t i = 0; i < threads; i++) {
		if (pthread_create(&p->threads[i], NULL, pool_main, p) != 0) {
			fb_log_error("cannot start a pool thread");
			fb_pool_free(p);
			return FB_EIO;
		}
		p->nthreads++;
	}
	*out = p;
	return FB_OK;
}

void
fb_pool_free(fb_pool *p)
{
	if (p == NULL) {
		return;
	}
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
	for (uint32_t i = 0; i < p->nthreads; i++) {
		pthread_join(p->threads[i], NULL);
	}
	free(p->threads);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->idle);
	pthread_mutex_destroy(&p->busy);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

uint32_t
fb_pool_threads(const fb_pool *p)
{
	return p == NULL ? 0 : p->nthreads;
}

void
fb_pool_for(void *p_, uint32_t n, void (*fn)(void *arg, uint32_t i),
    void *arg)
{
	fb_pool *p = p_;
	atomic_uint_fast32_t local;

	if (n == 0) {
		return;
	}
	if (p == NULL || p->nthreads == 0 || n == 1) {
		atomic_init(&local, 0);
		pool_work(fn, arg, n, &local);
		return;
	}
	pthread_mutex_lock(&p->busy);
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	p->pending = p->nthreads;
	p->gen++;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);

	pool_work(fn, arg, n, &p->next);

	/* Every index is taken; wait until each thread has left the batch. */
	pthread_mutex_lock(&p->mu);
	while (p->pending > 0) {
		pthread_cond_wait(&p->idle, &p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_unlock(&p->busy);
}
