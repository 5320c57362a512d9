/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broadcast.c -- the global model, as the round's workers fetch it.
 *
 * Plain mode serves chunks straight from the model's memory. Secure mode
 * seals the model under a fresh round key per round; every selected
 * worker gets the key sealed to its own session in RoundStart, and checks
 * the coordinator's signed trailer (over the chunks' hashes) after the
 * last chunk. The encryption runs on the job thread, its chunks sealed on
 * every core (FULL streams seal chunks on their own); the loop serves
 * fetches meanwhile (of nothing: RoundStart, which carries the trailer,
 * goes out only when it is done). transport.model_cache picks what the
 * coordinator keeps of it:
 *
 *   keep           the ciphertext, one more model's worth of memory, that
 *                  every fetch is served from;
 *   seal_on_fetch  nothing: the encryption hashes each chunk and drops
 *                  it, and each fetch seals its chunk again (the same key,
 *                  nonce and index: the same bytes) from the model's
 *                  memory into a small buffer, on the seal threads, sent
 *                  from there without a copy. The buffers are
 *                  transport.fetch_memory in all; a worker holds at most
 *                  its share of them (sealing, sealed or queued in
 *                  ZeroMQ), so one that stops reading pins no more, and K
 *                  workers fetching at once do not grow it. A worker's
 *                  chunks go out in the order it asked for them.
 *
 * The model and the key must not change while a chunk may be sealed from
 * them: broadcast_freeze (the loop, before a server step or a new key)
 * stops new seals and drops queued ones, broadcast_quiesce (the job
 * thread) waits for those under way, and broadcast_open lets fetches in
 * again once the next round's key is signed. A chunk sealed for an older
 * round is dropped, never sent.
 *
 * Chunks are sent without a copy. Model chunks may still be queued in
 * ZeroMQ for a worker that stopped reading: they keep the memory they were
 * sent from, and the next write goes to fresh memory (fb_lent_own).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

/* model_cache auto: keep the ciphertext of a model up to this size */
#define KEEP_AUTO_BYTES (128ull << 20)
#define SEAL_BUFS_MAX 1024
#define SEAL_THREADS_MAX 8
/* chunks one worker may ask for ahead of those sealed for it (its
 * transport.fetch_window is at most this) */
#define FETCH_AHEAD_MAX FB_FETCH_WINDOW_MAX

fb_err
model_writable(coord *c, fb_lent **b, size_t len, bool keep)
{
	fb_err rc = fb_lent_own(b, len, keep);
	if (rc != FB_OK) {
		fb_log_error("round %u: out of memory for the model",
		    c->rd.number);
	}
	return rc;
}

static bool
cache_on_fetch(const coord *c)
{
	switch (c->cfg->model_cache) {
	case FB_MODEL_CACHE_KEEP:
		return false;
	case FB_MODEL_CACHE_SEAL:
		return true;
	default:
		return c->param_count * 4 > KEEP_AUTO_BYTES;
	}
}

/* ---- the seal threads ---------------------------------------------------- */

static void
list_push(seal_buf *bufs, uint32_t *head, uint32_t *tail, uint32_t i)
{
	bufs[i].next = SEAL_NONE;
	if (*tail == SEAL_NONE) {
		*head = i;
	} else {
		bufs[*tail].next = i;
	}
	*tail = i;
}

static uint32_t
list_pop(seal_buf *bufs, uint32_t *head, uint32_t *tail)
{
	uint32_t i = *head;

	if (i != SEAL_NONE) {
		*head = bufs[i].next;
		if (*head == SEAL_NONE) {
			*tail = SEAL_NONE;
		}
	}
	return i;
}

/* Seals buffer i's chunk from the model of the key's round. A seal thread
 * (or the loop, without threads): b->push and b->src stay as they are
 * while a seal may run (broadcast_freeze, broadcast_quiesce). */
static void
seal_one(coord *c, seal_buf *sb)
{
	broadcast *b = &c->bc;
	uint64_t len = fb_accum_chunk_len(c->accum, sb->chunk) * 4;
	size_t clen = 0;

	sb->rc = fb_stream_push_chunk_at(b->push, sb->chunk,
	    (const uint8_t *)b->src + (uint64_t)sb->chunk * c->chunk_elems * 4,
	    len, sb->chunk + 1 == c->chunk_count, fb_lent_data(sb->lent),
	    b->stride, &clen, NULL);
	sb->len = (uint32_t)clen;
}

static void *
seal_main(void *arg)
{
	coord *c = arg;
	broadcast *b = &c->bc;
	uint64_t one = 1;

	pthread_mutex_lock(&b->mu);
	for (;;) {
		uint32_t i;
		while (!b->stop && b->todo_head == SEAL_NONE) {
			pthread_cond_wait(&b->cv, &b->mu);
		}
		if (b->stop) {
			break;
		}
		i = list_pop(b->bufs, &b->todo_head, &b->todo_tail);
		b->running++;
		pthread_mutex_unlock(&b->mu);
		seal_one(c, &b->bufs[i]);
		pthread_mutex_lock(&b->mu);
		b->running--;
		list_push(b->bufs, &b->done_head, &b->done_tail, i);
		pthread_cond_broadcast(&b->idle_cv);
		if (write(b->efd, &one, sizeof(one)) != sizeof(one) &&
		    errno != EAGAIN) {
			fb_log_error("seal eventfd: %s", strerror(errno));
		}
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

static fb_err
seal_start(coord *c, bool inline_seal)
{
	broadcast *b = &c->bc;
	uint32_t cpus = fb_pool_cpus();
	uint64_t n = c->cfg->fetch_memory / b->stride;

	b->nbufs = n < 1 ? 1 : n > SEAL_BUFS_MAX ? SEAL_BUFS_MAX : (uint32_t)n;
	b->todo_head = b->todo_tail = SEAL_NONE;
	b->done_head = b->done_tail = SEAL_NONE;
	b->free_head = SEAL_NONE;
	b->frozen = true; /* until the first round's key */
	b->efd = -1;
	if ((b->bufs = calloc(b->nbufs, sizeof(*b->bufs))) == NULL ||
	    (b->fw = calloc(c->reg.cap, sizeof(*b->fw))) == NULL ||
	    (b->ready = calloc(c->reg.cap, sizeof(*b->ready))) == NULL) {
		return FB_ENOMEM;
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		b->fw[i].q_head = b->fw[i].q_tail = SEAL_NONE;
		b->fw[i].s_head = b->fw[i].s_tail = SEAL_NONE;
	}
	for (uint32_t i = b->nbufs; i-- > 0;) {
		if (fb_lent_new(b->stride, &b->bufs[i].lent) != FB_OK) {
			return FB_ENOMEM;
		}
		b->bufs[i].next = b->free_head;
		b->free_head = i;
	}
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	pthread_cond_init(&b->idle_cv, NULL);
	b->mu_init = true;
	if ((b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		fb_log_error("eventfd: %s", strerror(errno));
		return FB_EIO;
	}
	/* a buffer ZeroMQ lets go of wakes the loop (broadcast_pump) */
	for (uint32_t i = 0; i < b->nbufs; i++) {
		fb_lent_notify(b->bufs[i].lent, b->efd);
	}
	n = inline_seal ? 0 : cpus > 1 ? cpus - 1 : 1;
	n = n > SEAL_THREADS_MAX ? SEAL_THREADS_MAX : n;
	if (n > 0 && (b->threads = calloc(n, sizeof(*b->threads))) == NULL) {
		return FB_ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (pthread_create(&b->threads[i], NULL, seal_main, c) != 0) {
			fb_log_error("cannot start a seal thread");
			return FB_EIO;
		}
		b->nthreads++;
	}
	fb_log_info("model: each chunk sealed when it is fetched "
	            "(transport.model_cache), %u buffers of %llu bytes, %s",
	    b->nbufs, (unsigned long long)b->stride,
	    b->nthreads > 0 ? "on the seal threads" : "on the event loop");
	return FB_OK;
}

fb_err
broadcast_alloc(coord *c, bool inline_seal)
{
	broadcast *b = &c->bc;

	b->stride = (uint64_t)c->chunk_elems * 4 + FB_STREAM_CHUNK_OVERHEAD;
	b->efd = -1;
	if ((b->len = calloc(c->chunk_count, sizeof(*b->len))) == NULL ||
	    (b->hash = calloc(c->chunk_count, sizeof(*b->hash))) == NULL) {
		return FB_ENOMEM;
	}
	if ((b->on_fetch = cache_on_fetch(c))) {
		return seal_start(c, inline_seal);
	}
	if (fb_lent_new(b->stride * c->chunk_count, &b->lent) != FB_OK) {
		return FB_ENOMEM;
	}
	b->data = fb_lent_data(b->lent);
	return FB_OK;
}

void
broadcast_stop(coord *c)
{
	broadcast *b = &c->bc;

	if (!b->mu_init) {
		return;
	}
	pthread_mutex_lock(&b->mu);
	b->stop = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	for (uint32_t i = 0; i < b->nthreads; i++) {
		pthread_join(b->threads[i], NULL);
	}
	b->nthreads = 0;
}

void
broadcast_fini(coord *c)
{
	broadcast *b = &c->bc;

	broadcast_stop(c);
	fb_lent_free(b->lent); /* after the link closed: none in flight */
	for (uint32_t i = 0; b->bufs != NULL && i < b->nbufs; i++) {
		fb_lent_free(b->bufs[i].lent);
	}
	if (b->mu_init) {
		pthread_mutex_destroy(&b->mu);
		pthread_cond_destroy(&b->cv);
		pthread_cond_destroy(&b->idle_cv);
	}
	if (b->on_fetch && b->efd >= 0) {
		close(b->efd);
	}
	fb_stream_push_free(b->push);
	free(b->threads);
	free(b->bufs);
	free(b->fw);
	free(b->ready);
	free(b->len);
	free(b->hash);
	fb_wipe(b->key, sizeof(b->key));
	memset(b, 0, sizeof(*b));
	b->efd = -1;
}

int
broadcast_wake_fd(const coord *c)
{
	return c->bc.on_fetch ? c->bc.efd : -1;
}

/* ---- the fetches (loop) -------------------------------------------------- */

static void
ready_push(broadcast *b, uint32_t wi, uint32_t cap)
{
	if (b->fw[wi].ready) {
		return;
	}
	b->fw[wi].ready = true;
	b->ready[(b->ready_head + b->ready_count) % cap] = wi;
	b->ready_count++;
}

/* Worker wi's run of requested chunks can be sealed now. */
static bool
fetch_live(const coord *c, uint32_t wi)
{
	const broadcast *b = &c->bc;
	const worker *w = &c->reg.workers[wi];

	return !b->frozen && w->used && w->state == W_TRAINING &&
	       b->fw[wi].round == b->round && round_of(c, w) == b->round;
}

static void
buf_free(coord *c, uint32_t i)
{
	broadcast *b = &c->bc;
	seal_buf *sb = &b->bufs[i];
	fetcher *f = &b->fw[sb->worker];

	sb->state = SEAL_FREE;
	sb->sealed = false;
	sb->next = b->free_head;
	b->free_head = i;
	f->held--;
	if (f->want < f->want_end && f->held < b->share &&
	    fetch_live(c, sb->worker)) {
		ready_push(b, sb->worker, c->reg.cap);
	}
}

/* Worker wi's sent chunks that ZeroMQ let go of are free again: in
 * order, as its connection writes them. */
static void
reclaim(coord *c, uint32_t wi)
{
	broadcast *b = &c->bc;
	fetcher *f = &b->fw[wi];

	while (f->s_head != SEAL_NONE &&
	    fb_lent_idle(b->bufs[f->s_head].lent)) {
		uint32_t i = f->s_head;
		f->s_head = b->bufs[i].wnext;
		if (f->s_head == SEAL_NONE) {
			f->s_tail = SEAL_NONE;
		}
		buf_free(c, i);
	}
}

/* Sends buffer i's sealed chunk to its worker if it still wants it. */
static void
send_sealed(coord *c, uint32_t i)
{
	broadcast *b = &c->bc;
	seal_buf *sb = &b->bufs[i];
	worker *w = &c->reg.workers[sb->worker];
	fetcher *f = &b->fw[sb->worker];
	fb_msg out = {.type = FB_MSG_MODEL_CHUNK};
	fb_err rc;

	if (b->frozen || sb->epoch != b->epoch || sb->rc == FB_ESTALE ||
	    !w->used || w->state != W_TRAINING || round_of(c, w) != sb->round) {
		buf_free(c, i); /* the key, the round or the task moved on */
		return;
	}
	if (sb->rc != FB_OK) {
		fb_log_error("round %u: cannot seal model chunk %u: %s",
		    sb->round, sb->chunk, fb_strerror((fb_err)sb->rc));
		buf_free(c, i);
		round_worker_failed(c, w, "model download failed");
		return;
	}
	out.u.model_chunk.round = sb->round;
	out.u.model_chunk.chunk = sb->chunk;
	rc = coord_send(c, w, &out, fb_lent_data(sb->lent), sb->len, sb->lent);
	if (rc != FB_OK) {
		buf_free(c, i);
		round_worker_failed(c, w, "model download failed");
		return;
	}
	sb->state = SEAL_SENT;
	sb->wnext = SEAL_NONE;
	if (fb_lent_idle(sb->lent)) {
		/* no message holds it (the send copied it, or it is out
		 * already), so no release may come to wake the loop:
		 * broadcast_pump looks at the sent lists before it returns */
		b->released = true;
	}
	if (f->s_tail == SEAL_NONE) {
		f->s_head = i;
	} else {
		b->bufs[f->s_tail].wnext = i;
	}
	f->s_tail = i;
}

/* Worker wi's sealed chunks go out, in the order it asked for them. */
static void
deliver(coord *c, uint32_t wi)
{
	broadcast *b = &c->bc;
	fetcher *f = &b->fw[wi];

	while (f->q_head != SEAL_NONE && b->bufs[f->q_head].sealed) {
		uint32_t i = f->q_head;
		f->q_head = b->bufs[i].wnext;
		if (f->q_head == SEAL_NONE) {
			f->q_tail = SEAL_NONE;
		}
		send_sealed(c, i);
	}
}

/* Worker wi's next requested chunk goes to a free buffer and a seal
 * thread (or is sealed here, without threads). */
static void
submit(coord *c, uint32_t wi)
{
	broadcast *b = &c->bc;
	fetcher *f = &b->fw[wi];
	uint32_t i = b->free_head;
	seal_buf *sb = &b->bufs[i];

	b->free_head = sb->next;
	sb->worker = wi;
	sb->round = b->round;
	sb->epoch = b->epoch;
	sb->chunk = f->want++;
	sb->len = 0;
	sb->rc = FB_OK;
	sb->state = SEAL_SEALING;
	sb->sealed = false;
	sb->wnext = SEAL_NONE;
	f->held++;
	if (f->q_tail == SEAL_NONE) {
		f->q_head = i;
	} else {
		b->bufs[f->q_tail].wnext = i;
	}
	f->q_tail = i;
	if (b->nthreads == 0) {
		seal_one(c, sb);
		sb->sealed = true;
		deliver(c, wi);
		return;
	}
	pthread_mutex_lock(&b->mu);
	list_push(b->bufs, &b->todo_head, &b->todo_tail, i);
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

/* Free buffers go to the workers waiting, one chunk each in turn. A
 * worker at its share stays on the ring: it waits for ZeroMQ to let go
 * of one of its chunks, whose release wakes broadcast_pump. */
static void
serve(coord *c)
{
	broadcast *b = &c->bc;
	bool more = true;

	while (more && b->free_head != SEAL_NONE && b->ready_count > 0) {
		uint32_t n = b->ready_count;
		more = false;
		while (n-- > 0 && b->free_head != SEAL_NONE) {
			uint32_t wi = b->ready[b->ready_head];
			fetcher *f = &b->fw[wi];
			b->ready_head = (b->ready_head + 1) % c->reg.cap;
			b->ready_count--;
			f->ready = false;
			if (!fetch_live(c, wi)) {
				f->want = f->want_end; /* its task is gone */
				continue;
			}
			if (f->want >= f->want_end) {
				continue;
			}
			if (f->held < b->share) {
				submit(c, wi);
				more = true;
			}
			if (f->want < f->want_end) {
				ready_push(b, wi, c->reg.cap);
			}
		}
	}
}

void
broadcast_pump(coord *c)
{
	broadcast *b = &c->bc;
	uint32_t i;
	uint64_t n;

	if (!b->on_fetch) {
		return;
	}
	/* written by the seal threads (a chunk sealed) and by the release
	 * of a sent buffer (fb_lent_notify) */
	if (read(b->efd, &n, sizeof(n)) == (ssize_t)sizeof(n)) {
		b->released = true;
	} else if (errno != EAGAIN) {
		fb_log_error("seal eventfd: %s", strerror(errno));
	}
	if (b->nthreads > 0) {
		pthread_mutex_lock(&b->mu);
		i = b->done_head;
		b->done_head = b->done_tail = SEAL_NONE;
		for (uint32_t j = i; j != SEAL_NONE; j = b->bufs[j].next) {
			b->bufs[j].sealed = true;
		}
		pthread_mutex_unlock(&b->mu);
		while (i != SEAL_NONE) {
			uint32_t next = b->bufs[i].next;
			deliver(c, b->bufs[i].worker);
			i = next;
		}
	}
	do {
		if (b->ready_count > 0 && b->released) {
			b->released = false;
			for (uint32_t wi = 0; wi < c->reg.cap; wi++) {
				reclaim(c, wi);
			}
		}
		serve(c); /* (a send may find its buffer idle at once) */
	} while (b->ready_count > 0 && b->released);
}

void
broadcast_freeze(coord *c)
{
	broadcast *b = &c->bc;
	uint32_t i;

	if (!b->on_fetch) {
		return;
	}
	b->frozen = true;
	pthread_mutex_lock(&b->mu);
	i = b->todo_head; /* not started: dropped */
	b->todo_head = b->todo_tail = SEAL_NONE;
	for (uint32_t j = i; j != SEAL_NONE; j = b->bufs[j].next) {
		b->bufs[j].rc = FB_ESTALE;
		b->bufs[j].sealed = true;
	}
	pthread_mutex_unlock(&b->mu);
	b->ready_count = 0;
	for (uint32_t wi = 0; wi < c->reg.cap; wi++) {
		b->fw[wi].ready = false;
		b->fw[wi].want = b->fw[wi].want_end;
		deliver(c, wi); /* drops what is sealed or dropped */
	}
}

void
broadcast_quiesce(coord *c)
{
	broadcast *b = &c->bc;

	if (!b->on_fetch || !b->mu_init) {
		return;
	}
	pthread_mutex_lock(&b->mu);
	while (b->running > 0 || b->todo_head != SEAL_NONE) {
		pthread_cond_wait(&b->idle_cv, &b->mu);
	}
	pthread_mutex_unlock(&b->mu);
}

/* On the loop, before the job: keep writes the ciphertext to memory no
 * queued send still holds; seal_on_fetch stops sealing under the old
 * key. */
fb_err
broadcast_prepare(coord *c)
{
	broadcast *b = &c->bc;
	fb_err rc;

	if (b->on_fetch) {
		broadcast_freeze(c);
		return FB_OK;
	}
	rc = model_writable(c, &b->lent, b->stride * c->chunk_count, false);
	if (rc == FB_OK) {
		b->data = fb_lent_data(b->lent);
	}
	return rc;
}

void
broadcast_open(coord *c)
{
	broadcast *b = &c->bc;
	uint32_t live = registry_live_count(c);

	if (!b->on_fetch) {
		return;
	}
	b->round = c->rd.number;
	b->epoch++;
	b->src = c->params;
	b->share = b->nbufs / (live > 0 ? live : 1);
	b->share = b->share > 0 ? b->share : 1;
	b->frozen = false;
}

/* ---- the encryption (job thread) ----------------------------------------- */

typedef struct seal_arg {
	coord *c;
	const fb_stream_push *p;
	uint32_t per;      /* chunks per piece */
	atomic_int rc;     /* the first error */
} seal_arg;

/* Seals chunks [i * per, ...) for their hashes: into the kept ciphertext,
 * or (seal_on_fetch) into a scratch buffer of this piece, then dropped. */
static void
seal_piece(void *arg, uint32_t i)
{
	seal_arg *a = arg;
	coord *c = a->c;
	broadcast *b = &c->bc;
	uint32_t first = i * a->per;
	uint32_t end = c->chunk_count - first < a->per ? c->chunk_count
	                                               : first + a->per;
	const uint8_t *params = (const uint8_t *)c->params;
	uint8_t *scratch = NULL;
	fb_err rc = FB_OK;

	if (b->on_fetch && (scratch = malloc(b->stride)) == NULL) {
		rc = FB_ENOMEM;
	}
	for (uint32_t k = first; k < end && rc == FB_OK; k++) {
		uint64_t len = fb_accum_chunk_len(c->accum, k) * 4;
		size_t clen = 0;
		uint8_t *dst = scratch != NULL
		                   ? scratch
		                   : b->data + (uint64_t)k * b->stride;
		rc = fb_stream_push_chunk_at(a->p, k,
		    params + (uint64_t)k * c->chunk_elems * 4, len,
		    k + 1 == c->chunk_count, dst, b->stride, &clen, b->hash[k]);
		b->len[k] = (uint32_t)clen;
	}
	free(scratch);
	if (rc != FB_OK) {
		int ok = FB_OK;
		atomic_compare_exchange_strong(&a->rc, &ok, (int)rc);
	}
}

/* The job: seal every chunk on the pool, then sign the trailer. */
fb_err
broadcast_encrypt(coord *c)
{
	broadcast *b = &c->bc;
	fb_stream_ctx ctx = {.run = c->run, .round = c->rd.number,
	    .sender = FB_SENDER_COORDINATOR};
	fb_stream_push *p = NULL;
	seal_arg a = {.c = c};
	uint32_t pieces = (fb_pool_threads(c->pool) + 1) * 4;
	fb_err rc;

	/* seal_on_fetch: no seal under the old key runs any more */
	broadcast_quiesce(c);
	fb_stream_push_free(b->push);
	b->push = NULL;
	rc = fb_stream_push_alloc(&ctx, c->chunk_elems * 4,
	    FB_STREAM_DIGEST_FULL, b->key, b->header, &p);
	if (rc != FB_OK) {
		return rc;
	}
	a.p = p;
	/* keep: a chunk a piece is as balanced as it gets; seal_on_fetch:
	 * a scratch buffer per piece, a few pieces per thread */
	a.per = b->on_fetch ? (c->chunk_count + pieces - 1) / pieces : 1;
	atomic_init(&a.rc, FB_OK);
	fb_pool_for(c->pool, (c->chunk_count + a.per - 1) / a.per, seal_piece,
	    &a);
	rc = (fb_err)atomic_load(&a.rc);
	if (rc == FB_OK) {
		rc = fb_stream_push_hashes(p, b->hash[0], c->chunk_count,
		    c->param_count * 4, 1);
	}
	if (rc == FB_OK) {
		rc = fb_stream_push_final(p, c->self, b->trailer);
	}
	if (rc == FB_OK && b->on_fetch) {
		b->push = p; /* kept: each fetch seals its chunk again */
		return FB_OK;
	}
	fb_stream_push_free(p);
	return rc;
}

/* Fills RoundStart's round key, stream header and trailer. */
void
broadcast_round_start(const coord *c, fb_msg *m)
{
	const broadcast *b = &c->bc;

	memcpy(m->u.round_start.round_key.b, b->key, FB_STREAM_KEY_LEN);
	m->u.round_start.round_key.len = FB_STREAM_KEY_LEN;
	memcpy(m->u.round_start.stream_header.b, b->header,
	    FB_STREAM_HEADER_LEN);
	m->u.round_start.stream_header.len = FB_STREAM_HEADER_LEN;
	memcpy(m->u.round_start.stream_trailer.b, b->trailer,
	    FB_STREAM_TRAILER_LEN);
	m->u.round_start.stream_trailer.len = FB_STREAM_TRAILER_LEN;
}

/* seal_on_fetch: chunk k joins w's run of requested chunks (a new run
 * when it does not follow it: the worker started again), sealed as
 * buffers come free. */
static void
fetch_queue(coord *c, worker *w, uint32_t k)
{
	broadcast *b = &c->bc;
	uint32_t wi = registry_slot(c, w).v;
	fetcher *f = &b->fw[wi];
	uint32_t r = round_of(c, w);

	if (b->frozen || r != b->round) {
		fb_log_debug("model_fetch of chunk %u for round %u from %s: "
		             "the model of round %u is not open",
		    k, r, w->name, b->round);
		return;
	}
	reclaim(c, wi); /* it asks: what it was sent before is out */
	if (f->round == r && k == f->want_end) {
		if (f->want_end - f->want >= FETCH_AHEAD_MAX) {
			guard_drop(c, DROP_UNEXPECTED, "model_fetch of "
			    "chunk %u from %s: more than %u chunks asked for "
			    "ahead", k, w->name, FETCH_AHEAD_MAX);
			return;
		}
		f->want_end++;
	} else {
		f->round = r;
		f->want = k;
		f->want_end = k + 1;
	}
	ready_push(b, wi, c->reg.cap);
	broadcast_pump(c);
}

void
broadcast_on_fetch(coord *c, worker *w, const fb_msg *m)
{
	fb_msg out = {.type = FB_MSG_MODEL_CHUNK};
	uint32_t k = m->u.model_fetch.chunk;
	fb_err rc;

	if (!round_open_to(c, w, m->u.model_fetch.round) &&
	    !(c->cfg->mode == FB_MODE_ASYNC &&
	        m->u.model_fetch.round == w->task_round)) {
		guard_drop(c, DROP_STALE_ROUND, "model_fetch for round %u from "
		    "%s (round %u is open)", m->u.model_fetch.round, w->name,
		    c->rd.number);
		return;
	}
	if (w->state != W_TRAINING) {
		guard_drop(c, DROP_UNEXPECTED, "model_fetch from %s, which is %s",
		    w->name, worker_state_names[w->state]);
		return;
	}
	if (!async_fetch_ok(c, w)) {
		return; /* round.mode async: its model has gone; a new task */
	}
	if (k >= c->chunk_count) {
		guard_drop(c, DROP_WRONG_SIZE, "model_fetch of chunk %u of %u "
		    "from %s", k, c->chunk_count, w->name);
		return;
	}
	if (c->secure && c->bc.on_fetch) {
		fetch_queue(c, w, k);
		return;
	}
	out.u.model_chunk.round = round_of(c, w);
	out.u.model_chunk.chunk = k;
	if (c->secure) {
		rc = coord_send(c, w, &out, c->bc.data + (uint64_t)k * c->bc.stride,
		    c->bc.len[k], c->bc.lent);
	} else {
		rc = coord_send(c, w, &out,
		    c->params + (uint64_t)k * c->chunk_elems,
		    fb_accum_chunk_len(c->accum, k) * 4, c->params_lent);
	}
	if (rc != FB_OK) {
		round_worker_failed(c, w, "model download failed");
	}
}
