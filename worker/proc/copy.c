/* SPDX-License-Identifier: Apache-2.0 */
/*
 * copy.c -- the parameters' copies across the boundary (into the shared
 * memory, and checked out of it) on several threads for large models: one
 * thread moves ~10-15 GB/s, a many-core box's memory several times that,
 * and a 7e9-parameter model is 28 GB each way.
 *
 * Each thread takes one contiguous slice (whole 64-byte lines); the caller
 * takes the first. A checked copy reports the first bad value of the whole
 * vector: the smallest index any slice reports.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "worker/proc/proc_impl.h"

#define MIN_SLICE_BYTES ((uint64_t)32 << 20) /* less is not worth a thread */
#define MAX_THREADS 16

typedef struct slice {
	float *dst;
	const float *src;
	uint64_t count;
	bool checked;
	uint64_t bad; /* checked: first bad index in the slice, or count */
} slice;

static void *
slice_main(void *arg)
{
	slice *s = arg;
	if (s->checked) {
		s->bad = fb_proc_copy_checked(s->dst, s->src, s->count);
	} else {
		memcpy(s->dst, s->src, s->count * sizeof(float));
		s->bad = s->count;
	}
	return NULL;
}

uint32_t
fb_proc_copy_threads(uint64_t count, uint32_t want)
{
	uint64_t by_size = count * sizeof(float) / MIN_SLICE_BYTES;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t n = want > 0 ? want : (cpus > 1 ? (uint64_t)cpus / 2 : 1);

	if (n > 8 && want == 0) {
		n = 8; /* auto: enough to fill a socket's memory channels */
	}
	if (n > by_size) {
		n = by_size;
	}
	if (n > MAX_THREADS) {
		n = MAX_THREADS;
	}
	return n < 1 ? 1 : (uint32_t)n;
}

uint64_t
fb_proc_copy_par(float *dst, const float *src, uint64_t count, bool checked,
    uint32_t threads)
{
	slice sl[MAX_THREADS];
	pthread_t th[MAX_THREADS];
	bool live[MAX_THREADS] = {false};
	uint64_t per, at = 0, bad = count;

	if (threads > MAX_THREADS) {
		threads = MAX_THREADS;
	}
	if (threads <= 1 || count < threads * 16u) {
		threads = 1;
	}
	per = (count / threads + 15) & ~(uint64_t)15; /* whole lines */
	for (uint32_t i = 0; i < threads; i++) {
		uint64_t n =
		    i + 1 == threads || at + per > count ? count - at : per;
		sl[i] = (slice){dst + at, src + at, n, checked, n};
		at += n;
	}
	for (uint32_t i = 1; i < threads; i++) {
		live[i] = pthread_create(&th[i], NULL, slice_main, &sl[i]) == 0;
	}
	for (uint32_t i = 0; i < threads; i++) {
		if (i == 0 || !live[i]) {
			slice_main(
			    &sl[i]); /* ours, or one that did not start */
		} else {
			pthread_join(th[i], NULL);
		}
	}
	at = 0;
	for (uint32_t i = 0; i < threads; i++) {
		if (sl[i].bad < sl[i].count && at + sl[i].bad < bad) {
			bad = at + sl[i].bad;
		}
		at += sl[i].count;
	}
	return bad;
}
