/* SPDX-License-Identifier: Apache-2.0 */
/*
 * premask.c -- secure aggregation's masks made ahead
 * (security.secagg_masks_ahead).
 *
 * Once the relayed shares fix a round's masks (fb_secagg_worker_mask_begin),
 * the mask this worker adds to its input, PRG(b) + sum sigma_ij PRG(s_ij),
 * is known, while the update is not: the worker is still fetching the model
 * or training. A thread of ours then expands the whole mask into one vector
 * (4 bytes a parameter, kept from round to round) on the worker's pool,
 * chunk by chunk in the order the update will go up, so that the upload
 * adds it to the encoded input (fb_wk_sa_encode_chunk) instead of making
 * (k + 1) ChaCha20 keystreams per element on its critical path.
 *
 * The upload stops the thread when it begins (fb_wk_premask_stop waits for
 * the batch in progress): a chunk made by then is added, any other is
 * masked as before, as it goes. Both give the same words (mod 2^32), so
 * the masked input is bitwise the same whichever way a chunk was made.
 * The vector holds secret material (it is the mask that hides the input),
 * as secret as the plaintext update beside it in w->local: like that, it
 * is overwritten by the next round's and wiped when the worker ends
 * (fb_wk_premask_free); a round's end only forgets it (wiping 4 bytes a
 * parameter there would cost the loop a pass over the model each round).
 *
 * Threads: start, stop and drop run on the loop's thread; the premask
 * thread reads only what start gave it (the instance, which lives until
 * drop, and the chunk layout) and writes the vector and the chunks' done
 * flags; the loop reads a chunk only after seeing its flag (acquire).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/pool.h"
#include "common/util.h"
#include "worker/worker_impl.h"

/* The share of the memory available that auto lets the vector take. */
#define PREMASK_AUTO_SHARE 4

struct fb_wk_premask {
	pthread_t thread;
	bool live;                      /* the thread runs or is unjoined */
	atomic_bool stop;
	const fb_secagg_worker *sa;     /* the instance made for; NULL: none */
	uint32_t round;
	uint32_t *v;                    /* cap elements, fb_alloc'd */
	uint64_t cap;
	atomic_uchar *done;             /* per chunk, chunk_count + 1 */
	uint32_t chunks_cap;
	/* the layout, copied at start */
	struct fb_pool *pool;
	uint32_t first_chunk, chunk_count, chunk_bytes;
	uint64_t param_count;
	/* results, read after the join */
	fb_err rc;
	atomic_uint made;               /* chunks made, as they are */
	int64_t started_ms, ended_ms;
};

/* Where chunk k's elements lie (the extra chunk: past P). */
static void
premask_span(const struct fb_wk_premask *p, uint32_t k, uint64_t *off,
    uint64_t *count)
{
	uint64_t per = p->chunk_bytes / 4;

	if (k == p->chunk_count) {
		*off = p->param_count;
		*count = FB_SECAGG_EXTRA;
		return;
	}
	*off = (uint64_t)k * per;
	*count = p->param_count - *off < per ? p->param_count - *off : per;
}

typedef struct premask_batch {
	struct fb_wk_premask *p;
	uint32_t pos0; /* upload positions pos0 .. pos0 + n - 1 */
	atomic_int rc;
} premask_batch;

static void
premask_piece(void *arg, uint32_t i)
{
	premask_batch *b = arg;
	struct fb_wk_premask *p = b->p;
	uint32_t k = fb_upload_chunk(p->first_chunk, p->chunk_count,
	    b->pos0 + i);
	uint64_t off, count;
	fb_err rc;

	if (atomic_load_explicit(&p->done[k], memory_order_relaxed)) {
		return; /* made before it was stopped (resumed) */
	}
	premask_span(p, k, &off, &count);
	memset(p->v + off, 0, count * 4);
	rc = fb_secagg_worker_mask_chunk(p->sa, p->v + off, off, count);
	if (rc != FB_OK) {
		int ok = FB_OK;
		atomic_compare_exchange_strong(&b->rc, &ok, (int)rc);
		return;
	}
	atomic_store_explicit(&p->done[k], 1, memory_order_release);
	atomic_fetch_add(&p->made, 1);
}

static void *
premask_main(void *arg)
{
	struct fb_wk_premask *p = arg;
	uint32_t total = p->chunk_count + 1;
	uint32_t per = fb_pool_threads(p->pool) + 1;

	for (uint32_t pos = 0; pos < total; pos += per) {
		premask_batch b = {.p = p, .pos0 = pos};
		uint32_t n = total - pos < per ? total - pos : per;
		if (atomic_load(&p->stop)) {
			break;
		}
		if (atomic_load_explicit(&p->done[fb_upload_chunk(p->first_chunk,
		        p->chunk_count, pos)], memory_order_relaxed) &&
		    atomic_load_explicit(&p->done[fb_upload_chunk(p->first_chunk,
		        p->chunk_count, pos + n - 1)], memory_order_relaxed)) {
			continue; /* made before it was stopped (resumed) */
		}
		atomic_init(&b.rc, FB_OK);
		/* one batch at a time: the loop's own passes on the pool (the
		 * model's decryption) wait for one batch at most */
		fb_pool_for(p->pool, n, premask_piece, &b);
		if (atomic_load(&b.rc) != FB_OK) {
			p->rc = (fb_err)atomic_load(&b.rc);
			break;
		}
	}
	p->ended_ms = fb_now_ms();
	return NULL;
}

/* Whether this round's masks are made ahead: the config's answer, and for
 * auto, whether the vector fits and no GPU makes the masks anyway. */
static bool
premask_wanted(fb_wk *w, uint64_t bytes)
{
	uint64_t avail;

	switch (w->cfg->secagg_masks_ahead) {
	case FB_WORKER_MASKS_AHEAD_ON:
		return true;
	case FB_WORKER_MASKS_AHEAD_OFF:
		return false;
	default:
		break;
	}
	if (w->trainer != NULL && fb_trainer_has_mask(w->trainer)) {
		return false; /* the GPU makes them as the chunks go */
	}
	if (w->premask != NULL && w->premask->v != NULL) {
		return true; /* allocated already: it fitted */
	}
	avail = fb_mem_available_bytes();
	if (avail == 0 || bytes > avail / PREMASK_AUTO_SHARE) {
		if (!w->premask_noted) {
			fb_log_info("secure aggregation: masks made as the "
			            "update goes up, not ahead: the %.1f MiB they "
			            "take is over a quarter of the %.1f MiB "
			            "available (security.secagg_masks_ahead: on "
			            "makes them ahead anyway)",
			    (double)bytes / 1048576.0, (double)avail / 1048576.0);
			w->premask_noted = true;
		}
		return false;
	}
	return true;
}

/* Makes p's vector and flags fit w's model; false when out of memory. */
static bool
premask_fit(fb_wk *w, struct fb_wk_premask *p)
{
	uint64_t cap = w->param_count + FB_SECAGG_EXTRA;
	uint32_t chunks = w->chunk_count + 1;

	if (p->cap != cap) {
		fb_free(p->v);
		p->cap = 0;
		if ((p->v = fb_alloc(cap * 4)) == NULL) {
			fb_log_warn("round %u: no memory for the masks made "
			            "ahead (%.1f MiB); they are made as the update "
			            "goes up",
			    w->sa_round, (double)(cap * 4) / 1048576.0);
			return false;
		}
		p->cap = cap;
	}
	if (p->chunks_cap < chunks) {
		free(p->done);
		p->chunks_cap = 0;
		if ((p->done = malloc(chunks * sizeof(*p->done))) == NULL) {
			return false;
		}
		p->chunks_cap = chunks;
	}
	return true;
}

void
fb_wk_premask_start(fb_wk *w)
{
	struct fb_wk_premask *p;

	if (w->sa == NULL || w->sa_phase != FB_WK_SA_MASKING ||
	    !premask_wanted(w, (w->param_count + FB_SECAGG_EXTRA) * 4)) {
		return;
	}
	fb_wk_premask_stop(w); /* one at a time: another round's stops */
	if (w->premask == NULL &&
	    (w->premask = calloc(1, sizeof(*w->premask))) == NULL) {
		return; /* the masks are made as the update goes */
	}
	p = w->premask;
	if (p->sa != w->sa || p->round != w->sa_round || p->rc != FB_OK) {
		/* a new instance (else one stopped midway: the chunks not
		 * made yet are made now) */
		p->sa = NULL; /* (no reader while the flags reset) */
		if (!premask_fit(w, p)) {
			return;
		}
		for (uint32_t k = 0; k <= w->chunk_count; k++) {
			atomic_init(&p->done[k], 0);
		}
		p->sa = w->sa;
		p->round = w->sa_round;
		p->pool = w->pool;
		p->chunk_count = w->chunk_count;
		p->chunk_bytes = w->chunk_bytes;
		p->param_count = w->param_count;
		p->rc = FB_OK;
		atomic_init(&p->made, 0);
	}
	if (atomic_load(&p->made) == p->chunk_count + 1) {
		return; /* all made */
	}
	p->first_chunk = w->first_chunk;
	p->started_ms = fb_now_ms();
	p->ended_ms = 0;
	atomic_init(&p->stop, false);
	p->live = pthread_create(&p->thread, NULL, premask_main, p) == 0;
}

void
fb_wk_premask_stop(fb_wk *w)
{
	struct fb_wk_premask *p = w->premask;

	if (p == NULL || !p->live) {
		return;
	}
	atomic_store(&p->stop, true);
	pthread_join(p->thread, NULL);
	p->live = false;
	if (p->rc != FB_OK) {
		fb_log_warn("round %u: the masks made ahead failed (%s); the "
		            "rest are made as the update goes up",
		    p->round, fb_strerror(p->rc));
	}
	fb_log_debug("round %u: masks made ahead for %u of %u chunks in "
	             "%.3f s",
	    p->round, atomic_load(&p->made), p->chunk_count + 1,
	    (double)((p->ended_ms > 0 ? p->ended_ms : fb_now_ms()) -
	             p->started_ms) / 1000.0);
}

void
fb_wk_premask_drop_sa(fb_wk *w, const fb_secagg_worker *sa)
{
	struct fb_wk_premask *p = w->premask;

	if (p == NULL || p->sa == NULL || p->sa != sa) {
		return; /* another instance's (set up ahead): it stays */
	}
	fb_wk_premask_stop(w);
	p->sa = NULL;
}

void
fb_wk_premask_drop(fb_wk *w)
{
	fb_wk_premask_drop_sa(w, w->sa);
}

void
fb_wk_premask_free(fb_wk *w)
{
	if (w->premask == NULL) {
		return;
	}
	fb_wk_premask_stop(w);
	w->premask->sa = NULL;
	if (w->premask->v != NULL) {
		fb_wipe(w->premask->v, w->premask->cap * 4);
	}
	fb_free(w->premask->v);
	free(w->premask->done);
	free(w->premask);
	w->premask = NULL;
}

const uint32_t *
fb_wk_premask_get(const fb_wk *w, uint64_t off, uint64_t count)
{
	const struct fb_wk_premask *p = w->premask;
	uint64_t k_off, k_count;
	uint32_t k;

	if (p == NULL || p->sa == NULL || p->sa != w->sa ||
	    p->round != w->sa_round) {
		return NULL;
	}
	k = off >= p->param_count ? p->chunk_count
	                          : (uint32_t)(off / (p->chunk_bytes / 4));
	premask_span(p, k, &k_off, &k_count);
	if (k_off != off || k_count != count ||
	    !atomic_load_explicit(&p->done[k], memory_order_acquire)) {
		return NULL;
	}
	return p->v + off;
}

uint32_t
fb_wk_premask_made(const fb_wk *w)
{
	const struct fb_wk_premask *p = w->premask;

	return p == NULL || p->sa == NULL || p->sa != w->sa
	           ? 0
	           : atomic_load(&p->made);
}
