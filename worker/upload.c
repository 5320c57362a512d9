/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upload.c -- the worker's update, streamed to the coordinator without
 * ever waiting on the link: UpdateBegin, then the chunks from the round's
 * first_chunk on (wrapping around; the SecAgg extra coordinates last),
 * then in secure mode UpdateEnd with the stream's signed trailer.
 *
 * fb_wk_upload_pump sends what the link takes and the coordinator's credit
 * allows (UpdateCredit: it grants chunks from one budget for all its
 * workers) and returns; the loop calls it again when the link has room or
 * a credit came, and meanwhile receives and answers the coordinator
 * (heartbeats, a RoundCancel, SecAgg reveals). In secure mode the chunks
 * are made a batch at a time (one chunk per core) on the pool: masked
 * (with secure aggregation) and sealed (an INDEXED_TAGS stream, whose
 * chunks seal on their own) in the same task, into slots of one of two
 * buffers used in turn (w->send_ct), from which they are sent without a
 * copy; the masker thread makes the next batch while the loop sends the
 * current one, so the loop thread only sends. Plaintext
 * updates go from w->local itself, without a copy.
 *
 * debug.dump_updates (tests only) writes each round's update as sent:
 * plain, encoded and masked, in element order.
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

/* Test hook (debug.dump_updates): one file of this round's update. */
static FILE *
dump_open(const fb_wk *w, const char *what)
{
	char path[4096];
	FILE *f;

	if (w->cfg->dump_updates == NULL || w->cfg->dump_updates[0] == '\0') {
		return NULL;
	}
	snprintf(path, sizeof(path), "%s/round-%u.%s", w->cfg->dump_updates,
	    w->round, what);
	if ((f = fopen(path, "wb")) == NULL) {
		fb_log_warn("debug.dump_updates: cannot write %s", path);
	}
	return f;
}

static void
dump_close(FILE *f)
{
	if (f != NULL && fclose(f) != 0) {
		fb_log_warn("debug.dump_updates: write failed");
	}
}

/* The update's facts: with SecAgg once its weight is fixed (its first
 * credit), else at its begin. */
static void
dump_facts(fb_wk *w)
{
	bool sa = w->sa != NULL;
	FILE *f;

	if ((f = dump_open(w, "json")) != NULL) {
		fprintf(f,
		    "{\"samples\": %" PRIu64 ", \"weight\": %.17g, "
		    "\"staleness\": %u, \"loss\": %.17g, \"a_norm\": %.17g, "
		    "\"secure\": %s}\n",
		    fb_wk_samples(w), sa ? w->sa_weight : 0.0, w->up.staleness,
		    w->up.loss, w->a_norm, sa ? "true" : "false");
		dump_close(f);
	}
}

/* The plain update, before anything is sent; the encoded and masked
 * files are filled chunk by chunk. */
static void
dump_begin(fb_wk *w)
{
	bool sa = w->sa != NULL;
	FILE *f;

	if ((f = dump_open(w, "update.f32")) == NULL) {
		return;
	}
	fwrite(w->local, 4, w->param_count, f);
	dump_close(f);
	if (sa) {
		w->up.enc_dump = dump_open(w, "encoded.u32");
		w->up.mask_dump = dump_open(w, "masked.u32");
	} else {
		dump_facts(w);
	}
}

void
fb_wk_upload_drop(fb_wk *w)
{
	fb_wk_upload *u = &w->up;

	fb_wk_mask_wait(w); /* a batch made ahead reads w->local, w->sa */
	dump_close(u->enc_dump);
	dump_close(u->mask_dump);
	if (u->clipped > 0) {
		fb_log_info("round %u: %" PRIu64 " coordinates clipped to +-%g "
		            "(secure_aggregation.clip)",
		    w->round, u->clipped, w->enc.x.clip);
	}
	fb_stream_push_free(u->push);
	fb_wipe(&u->begin, sizeof(u->begin)); /* the stream key */
	{
		/* the batch buffer stays for the next round (fb_wk_fini frees
		 * it): made anew, its pages, up to 2 x 16 chunks, faulted in
		 * again every round, the worst of a secure round's CPU on a
		 * small model (bench/RESULTS.md) */
		uint32_t *batch = u->batch;
		size_t bytes = u->batch_bytes;
		memset(u, 0, sizeof(*u));
		u->batch = batch;
		u->batch_bytes = bytes;
	}
	if (w->phase == FB_WK_UPLOADING) {
		w->phase = FB_WK_IDLE;
	}
}

fb_err
fb_wk_upload_start(fb_wk *w, double seconds, double loss, uint64_t steps)
{
	fb_wk_upload *u = &w->up;
	fb_msg *m = &u->begin;
	bool sa = w->sa != NULL;
	fb_err rc;

	fb_wk_premask_stop(w); /* what it made goes up; the rest is made now */
	fb_wk_upload_drop(w);
	m->type = FB_MSG_UPDATE_BEGIN;
	m->u.update_begin.round = w->round;
	m->u.update_begin.param_count = w->param_count;
	u->chunks = w->chunk_count + (sa ? 1 : 0);
	u->loss = loss;
	m->u.update_begin.chunk_count = u->chunks;
	if (!sa) {
		/* With secure aggregation these stay here: the coordinator
		 * learns only the weighted sums (extra coordinates) of the
		 * sample counts, losses and normalisers, and nothing of a
		 * worker's speed or steps. */
		m->u.update_begin.steps_per_second =
		    seconds > 0 ? (double)steps / seconds : 0;
		m->u.update_begin.num_samples = fb_wk_samples(w);
		m->u.update_begin.steps = steps;
		m->u.update_begin.train_loss = loss;
		m->u.update_begin.train_seconds = seconds;
		m->u.update_begin.a_norm = w->a_norm;
		fb_wk_eval_to_begin(w, m);
	}
	snprintf(m->u.update_begin.backend, sizeof(m->u.update_begin.backend),
	    "%s", w->backend);
	if (w->secure) {
		fb_stream_ctx ctx = {
		    .round = w->round, .sender = fb_session_worker_id(w->sess)};
		fb_session_run_id(w->sess, &ctx.run);
		rc = fb_stream_push_alloc(&ctx, w->chunk_bytes,
		    FB_STREAM_DIGEST_INDEXED_TAGS, m->u.update_begin.stream_key.b,
		    m->u.update_begin.stream_header.b, &u->push);
		if (rc != FB_OK) {
			fb_wk_upload_drop(w);
			return rc;
		}
		m->u.update_begin.stream_key.len = FB_STREAM_KEY_LEN;
		m->u.update_begin.stream_header.len = FB_STREAM_HEADER_LEN;
	}
	dump_begin(w);
	w->phase = FB_WK_UPLOADING;
	return FB_OK;
}

/* Where chunk k lies and how long it is (the extra chunk: past P). */
static void
chunk_span(const fb_wk *w, uint32_t k, uint64_t *off, uint64_t *len)
{
	uint64_t total = w->param_count * 4;

	*off = (uint64_t)k * w->chunk_bytes;
	*len = k == w->chunk_count             ? 4 * FB_SECAGG_EXTRA
	       : total - *off < w->chunk_bytes ? total - *off
	                                       : w->chunk_bytes;
}

/*
 * A batch: positions first .. first + n - 1, masked (SecAgg) into out
 * and sealed into the slots of ct, each chunk in one task; its digest
 * entries (hash) go into the stream in order once the batch is done
 * (batch_take).
 */
typedef struct batch_arg {
	fb_wk *w;
	uint32_t first;
	uint32_t *out; /* SecAgg: the masked inputs; else NULL */
	uint8_t *ct;   /* slot slot0 of send_ct[which] */
	uint32_t which, slot0;
	uint64_t clipped[FB_WK_BATCH_MAX];
	size_t m_len[FB_WK_BATCH_MAX], ct_len[FB_WK_BATCH_MAX];
	uint8_t hash[FB_WK_BATCH_MAX][FB_STREAM_HASH_LEN];
	atomic_int rc;
} batch_arg;

static void
batch_fail(batch_arg *a, fb_err rc)
{
	int ok = FB_OK;

	atomic_compare_exchange_strong(&a->rc, &ok, (int)rc);
}

/* Seals piece i of the batch from `src` into its slot (any thread: the
 * stream is only read). */
static void
batch_seal(batch_arg *a, uint32_t i, const uint8_t *src, uint64_t len)
{
	fb_wk *w = a->w;
	uint32_t pos = a->first + i;
	fb_err rc;

	a->m_len[i] = (size_t)len;
	rc = fb_stream_push_chunk_at(w->up.push, pos, src, (size_t)len,
	    pos + 1 == w->up.chunks, a->ct + (size_t)i * fb_wk_ct_stride(w),
	    fb_wk_ct_stride(w), &a->ct_len[i], a->hash[i]);
	if (rc != FB_OK) {
		batch_fail(a, rc);
	}
}

static void
batch_piece(void *arg, uint32_t i)
{
	batch_arg *a = arg;
	fb_wk *w = a->w;
	uint32_t k = fb_upload_chunk(w->first_chunk, w->chunk_count,
	    a->first + i);
	uint32_t *out;
	uint64_t off, len;
	fb_err rc;

	chunk_span(w, k, &off, &len);
	if (w->sa == NULL) {
		batch_seal(a, i, (const uint8_t *)w->local + off, len);
		return;
	}
	out = a->out + (size_t)i * (w->chunk_bytes / 4);
	rc = fb_wk_sa_encode_chunk(w, w->local,
	    k == w->chunk_count ? w->param_count : off / 4, len / 4,
	    w->up.loss, &a->clipped[i], NULL, NULL, out);
	if (rc != FB_OK) {
		batch_fail(a, rc);
		return;
	}
	batch_seal(a, i, (const uint8_t *)out, len);
}

static void
batch_arg_init(batch_arg *a, fb_wk *w, uint32_t first, uint32_t *out)
{
	memset(a->clipped, 0, sizeof(a->clipped));
	a->w = w;
	a->first = first;
	a->out = out;
	atomic_init(&a->rc, FB_OK);
}

/*
 * The masker: one thread that makes (masks and seals) the next batch on
 * the pool while the loop thread sends the current one. The loop hands it
 * one job at a time and waits for it before it uses the batch, and before
 * anything the job reads changes (fb_wk_mask_wait: the update's end, the
 * stream's digest, w->sa's).
 */
struct fb_wk_masker {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool job;  /* under mu: a batch is being made */
	bool quit; /* under mu */
	uint32_t n;
	batch_arg a; /* the job's; the thread's while `job` */
};

static void *
masker_main(void *arg)
{
	struct fb_wk_masker *mk = arg;

	pthread_mutex_lock(&mk->mu);
	for (;;) {
		while (!mk->job && !mk->quit) {
			pthread_cond_wait(&mk->cv, &mk->mu);
		}
		if (!mk->job) {
			break; /* quit, with nothing left to make */
		}
		pthread_mutex_unlock(&mk->mu);
		fb_pool_for(mk->a.w->pool, mk->n, batch_piece, &mk->a);
		pthread_mutex_lock(&mk->mu);
		mk->job = false;
		pthread_cond_broadcast(&mk->cv);
	}
	pthread_mutex_unlock(&mk->mu);
	return NULL;
}

static fb_err
masker_start(fb_wk *w)
{
	struct fb_wk_masker *mk = calloc(1, sizeof(*mk));

	if (mk == NULL) {
		return FB_ENOMEM;
	}
	pthread_mutex_init(&mk->mu, NULL);
	pthread_cond_init(&mk->cv, NULL);
	if (pthread_create(&mk->thread, NULL, masker_main, mk) != 0) {
		pthread_cond_destroy(&mk->cv);
		pthread_mutex_destroy(&mk->mu);
		free(mk);
		return FB_ENOMEM;
	}
	w->mk = mk;
	return FB_OK;
}

void
fb_wk_mask_wait(fb_wk *w)
{
	struct fb_wk_masker *mk = w->mk;

	if (mk == NULL) {
		return;
	}
	pthread_mutex_lock(&mk->mu);
	while (mk->job) {
		pthread_cond_wait(&mk->cv, &mk->mu);
	}
	pthread_mutex_unlock(&mk->mu);
}

void
fb_wk_mask_stop(fb_wk *w)
{
	struct fb_wk_masker *mk = w->mk;

	if (mk == NULL) {
		return;
	}
	pthread_mutex_lock(&mk->mu);
	mk->quit = true;
	pthread_cond_broadcast(&mk->cv);
	pthread_mutex_unlock(&mk->mu);
	pthread_join(mk->thread, NULL);
	pthread_cond_destroy(&mk->cv);
	pthread_mutex_destroy(&mk->mu);
	free(mk);
	w->mk = NULL;
}

/* Half h of the batch buffer (SecAgg; NULL without). */
static uint32_t *
batch_half(const fb_wk *w, uint32_t h)
{
	const fb_wk_upload *u = &w->up;

	if (u->batch == NULL) {
		return NULL;
	}
	return u->batch + (size_t)h * u->batch_cap * (w->chunk_bytes / 4);
}

/*
 * The slots for batch a's n chunks: in the ct window in use if they fit
 * there, else in the other one, made writable (when messages of its last
 * use still hold it, fb_lent_own gives fresh memory and leaves the old to
 * them). Slots are written only where no message holds one yet: the
 * window's slots are taken in position order, each once. Errors: FB_ENOMEM.
 */
static fb_err
batch_ct(fb_wk *w, batch_arg *a, uint32_t n)
{
	fb_wk_upload *u = &w->up;
	size_t len = fb_wk_ct_stride(w) * FB_WK_BATCH_MAX;
	uint32_t next;
	fb_err rc;

	if (!u->ct_live || a->first < u->ct_first ||
	    a->first + n > u->ct_first + FB_WK_BATCH_MAX) {
		next = u->ct_live ? 1 - u->ct_which : u->ct_which;
		rc = w->send_ct[next] == NULL
		         ? fb_lent_new(len, &w->send_ct[next])
		         : fb_lent_own(&w->send_ct[next], len, false);
		if (rc != FB_OK) {
			fb_log_error("round %u: out of memory for the update's "
			             "encrypted chunks",
			    w->round);
			return rc;
		}
		u->ct_which = next;
		u->ct_first = a->first;
		u->ct_live = true;
	}
	a->which = u->ct_which;
	a->slot0 = a->first - u->ct_first;
	a->ct = (uint8_t *)fb_lent_data(w->send_ct[a->which]) +
	        (size_t)a->slot0 * fb_wk_ct_stride(w);
	return FB_OK;
}

/*
 * A batch made (a, n chunks), now the one in use: on the loop thread, in
 * position order, its chunks' slots and lengths are kept for their sends
 * and their digest entries go into the stream.
 */
static fb_err
batch_take(fb_wk *w, const batch_arg *a, uint32_t n)
{
	fb_wk_upload *u = &w->up;
	fb_err rc = (fb_err)atomic_load(&a->rc);
	uint64_t payload = 0;

	for (uint32_t i = 0; i < n; i++) {
		u->clipped += a->clipped[i];
	}
	if (rc != FB_OK) {
		return rc;
	}
	u->batch_which = a->which;
	u->batch_slot0 = a->slot0;
	for (uint32_t i = 0; i < n; i++) {
		u->ct_len[a->which][a->slot0 + i] = a->ct_len[i];
		payload += a->m_len[i];
	}
	return fb_stream_push_hashes(u->push, a->hash[0], n, payload,
	    a->first + n == u->chunks);
}

/* Hands the masker the batch after the one in use, into the other half;
 * false: none to make, or no masker (the loop makes it when due). */
static bool
batch_ahead(fb_wk *w)
{
	fb_wk_upload *u = &w->up;
	uint32_t next = u->batch_first + u->batch_n;
	struct fb_wk_masker *mk;
	uint32_t n;

	if (next >= u->chunks || w->pool == NULL || u->enc_dump != NULL ||
	    u->mask_dump != NULL || (w->mk == NULL && masker_start(w) != FB_OK)) {
		return false;
	}
	n = u->chunks - next < u->batch_cap ? u->chunks - next : u->batch_cap;
	mk = w->mk;
	pthread_mutex_lock(&mk->mu);
	batch_arg_init(&mk->a, w, next, batch_half(w, 1 - u->half));
	if (batch_ct(w, &mk->a, n) != FB_OK) {
		pthread_mutex_unlock(&mk->mu);
		return false; /* the loop makes it when due */
	}
	mk->n = n;
	mk->job = true;
	pthread_cond_broadcast(&mk->cv);
	pthread_mutex_unlock(&mk->mu);
	u->ahead = true;
	u->ahead_first = next;
	u->ahead_n = mk->n;
	return true;
}

/* The batch made ahead, now in use: its result. */
static fb_err
batch_take_ahead(fb_wk *w)
{
	fb_wk_upload *u = &w->up;

	fb_wk_mask_wait(w);
	u->ahead = false;
	u->half = 1 - u->half;
	u->batch_first = u->ahead_first;
	u->batch_n = u->ahead_n;
	return batch_take(w, &w->mk->a, u->batch_n);
}

/*
 * The chunks of the positions from u->pos on, a batch of them at once on
 * the pool (one per core, up to FB_WK_BATCH_MAX), made here. With the
 * debug dumps open, one at a time, in order (they are written as made).
 */
static fb_err
batch_make(fb_wk *w)
{
	fb_wk_upload *u = &w->up;
	uint32_t n = fb_pool_threads(w->pool) + 1;
	batch_arg *a;
	fb_err rc;

	n = n > FB_WK_BATCH_MAX ? FB_WK_BATCH_MAX : n;
	if (u->enc_dump != NULL || u->mask_dump != NULL) {
		n = 1;
	}
	if (w->sa != NULL &&
	    (u->batch == NULL || u->batch_bytes < 2 * (size_t)n * w->chunk_bytes)) {
		fb_free(u->batch);
		u->batch_bytes = 0;
		if ((u->batch = fb_alloc(2 * (size_t)n * w->chunk_bytes)) ==
		    NULL) {
			return FB_ENOMEM;
		}
		u->batch_bytes = 2 * (size_t)n * w->chunk_bytes;
	}
	if (u->batch_cap < n) {
		u->batch_cap = n;
	}
	if ((a = malloc(sizeof(*a))) == NULL) {
		return FB_ENOMEM;
	}
	u->batch_first = u->pos;
	u->batch_n = u->chunks - u->pos < n ? u->chunks - u->pos : n;
	batch_arg_init(a, w, u->pos, batch_half(w, u->half));
	if ((rc = batch_ct(w, a, u->batch_n)) != FB_OK) {
		free(a);
		return rc;
	}
	if (u->batch_n == 1 && w->sa != NULL) {
		/* here, with the dumps if open */
		uint32_t k = fb_upload_chunk(w->first_chunk, w->chunk_count,
		    u->pos);
		uint64_t off, len;
		chunk_span(w, k, &off, &len);
		rc = fb_wk_sa_encode_chunk(w, w->local,
		    k == w->chunk_count ? w->param_count : off / 4, len / 4,
		    u->loss, &a->clipped[0], u->enc_dump, u->mask_dump, a->out);
		if (rc != FB_OK) {
			batch_fail(a, rc);
		} else {
			batch_seal(a, 0, (const uint8_t *)a->out, len);
		}
	} else {
		fb_pool_for(w->pool, u->batch_n, batch_piece, a);
	}
	rc = batch_take(w, a, u->batch_n);
	free(a);
	return rc;
}

/*
 * Makes sure the batch in use holds position u->pos: the one made ahead if
 * it starts there, else one made now; then the next goes to the masker.
 */
static fb_err
batch_ready(fb_wk *w)
{
	fb_wk_upload *u = &w->up;
	fb_err rc;

	if (u->batch_n > 0 && u->pos >= u->batch_first &&
	    u->pos < u->batch_first + u->batch_n) {
		return FB_OK;
	}
	if (u->failed != FB_OK) {
		return u->failed; /* a batch failed: the stream has a gap */
	}
	if (u->ahead && u->ahead_first == u->pos) {
		rc = batch_take_ahead(w);
	} else {
		fb_wk_mask_wait(w);
		u->ahead = false;
		rc = batch_make(w);
	}
	if (rc != FB_OK) {
		u->batch_n = 0;
		u->failed = rc;
		return rc;
	}
	(void)batch_ahead(w);
	return FB_OK;
}

/*
 * Secure mode: the chunk at position u->pos, masked (SecAgg) and sealed
 * in its batch, once: its slot and length.
 */
static fb_err
chunk_stage(fb_wk *w, const uint8_t **ct, size_t *ct_len)
{
	fb_wk_upload *u = &w->up;
	uint32_t i;
	fb_err rc;

	if ((rc = batch_ready(w)) != FB_OK) {
		fb_log_error("round %u: cannot %s the update: %s", w->round,
		    w->sa != NULL ? "mask" : "seal", fb_strerror(rc));
		return rc;
	}
	i = u->batch_slot0 + (u->pos - u->batch_first);
	*ct = (const uint8_t *)fb_lent_data(w->send_ct[u->batch_which]) +
	      (size_t)i * fb_wk_ct_stride(w);
	*ct_len = u->ct_len[u->batch_which][i];
	return FB_OK;
}

/* Sends the chunk at position u->pos: FB_OK (taken), FB_EAGAIN, or an
 * error. */
static fb_err
chunk_send(fb_wk *w)
{
	fb_wk_upload *u = &w->up;
	uint32_t k = fb_upload_chunk(w->first_chunk, w->chunk_count, u->pos);
	fb_msg c = {.type = FB_MSG_UPDATE_CHUNK};
	const uint8_t *ct = NULL;
	size_t ct_len = 0;
	uint64_t off, len;
	fb_err rc;

	chunk_span(w, k, &off, &len);
	c.u.update_chunk.round = w->round;
	c.u.update_chunk.chunk = k;
	if (!w->secure) {
		/* from w->local itself, without a copy */
		return fb_wk_send_now(
		    w, &c, (const uint8_t *)w->local + off, len, w->local_lent);
	}
	if ((rc = chunk_stage(w, &ct, &ct_len)) != FB_OK) {
		return rc;
	}
	/* from its ct slot, without a copy */
	return fb_wk_send_now(w, &c, ct, ct_len, w->send_ct[u->batch_which]);
}

/* Secure mode: the signed trailer, made once. */
static fb_err
end_send(fb_wk *w)
{
	fb_wk_upload *u = &w->up;
	fb_err rc;

	if (!u->ended) {
		u->end.type = FB_MSG_UPDATE_END;
		u->end.u.update_end.round = w->round;
		rc = fb_stream_push_final(
		    u->push, w->self, u->end.u.update_end.stream_trailer.b);
		if (rc != FB_OK) {
			return rc;
		}
		u->end.u.update_end.stream_trailer.len = FB_STREAM_TRAILER_LEN;
		u->ended = true;
	}
	return fb_wk_send_now(w, &u->end, NULL, 0, NULL);
}

bool
fb_wk_upload_wants(const fb_wk *w)
{
	const fb_wk_upload *u = &w->up;

	return w->phase == FB_WK_UPLOADING &&
	       (!u->begun || u->pos == u->chunks || u->credit > 0);
}

void
fb_wk_on_credit(fb_wk *w, const fb_msg *m)
{
	fb_wk_upload *u = &w->up;
	uint32_t left;

	if (w->phase != FB_WK_UPLOADING || !u->begun ||
	    m->u.update_credit.round != w->round) {
		fb_log_debug("credit for round %u ignored",
		    m->u.update_credit.round);
		return;
	}
	if (w->sa != NULL && !u->weighed) {
		/* No chunk is masked before its credit: the weight is fixed
		 * here, from the staleness the coordinator counted at the
		 * begin (0 in synchronous rounds). g(s) <= 1: the coordinator
		 * can only shrink the weight, and no further than the round's
		 * max_staleness allows, which every neighbour was told too
		 * (fb_secagg_bind_terms; README, "Secure asynchronous
		 * rounds"). */
		if (m->u.update_credit.staleness > w->sa_max_staleness) {
			char why[200];
			snprintf(why, sizeof(why), "the coordinator counts the "
			    "update %u steps stale, past the round's "
			    "max_staleness (%u): it would weigh it below the "
			    "bound its neighbours were told",
			    m->u.update_credit.staleness, w->sa_max_staleness);
			fb_log_error("round %u: %s; not sending it", w->round,
			    why);
			fb_wk_round_fail(w, w->round, why);
			return;
		}
		u->weighed = true;
		u->staleness = m->u.update_credit.staleness;
		w->sa_weight = (double)fb_wk_samples(w) /
		               (double)w->sa_max_samples *
		               fb_staleness_weight(u->staleness);
		if (u->staleness > 0) {
			fb_log_debug("round %u: update %u steps stale, weighted "
			             "%.4f",
			    w->round, u->staleness, w->sa_weight);
		}
		dump_facts(w); /* (debug.dump_updates only) */
	}
	/* chunks not yet sent nor credited */
	left = u->chunks - u->pos > u->credit ? u->chunks - u->pos - u->credit
	                                      : 0;
	u->credit += m->u.update_credit.chunks < left
	    ? m->u.update_credit.chunks
	    : left;
	fb_wk_upload_pump(w, FB_WK_CHUNKS_PER_PUMP);
}

void
fb_wk_upload_pump(fb_wk *w, uint32_t budget)
{
	fb_wk_upload *u = &w->up;
	fb_err rc = FB_OK;

	if (w->phase != FB_WK_UPLOADING || w->out_count > 0) {
		return; /* control messages go first */
	}
	if (!u->begun) {
		if ((rc = fb_wk_send_now(w, &u->begin, NULL, 0, NULL)) !=
		    FB_OK) {
			goto out;
		}
		fb_wipe(&u->begin.u.update_begin.stream_key,
		    sizeof(u->begin.u.update_begin.stream_key));
		u->begun = true;
	}
	while (u->pos < u->chunks && budget > 0 && u->credit > 0) {
		if ((rc = chunk_send(w)) != FB_OK) {
			goto out;
		}
		u->pos++;
		u->credit--;
		budget--;
	}
	if (u->pos < u->chunks) {
		return; /* the loop comes back */
	}
	if (w->secure && (rc = end_send(w)) != FB_OK) {
		goto out;
	}
	fb_log_debug("round %u: update sent (%u chunks)", w->round, u->chunks);
	fb_wk_upload_drop(w);
	fb_wk_sa_ahead_premask(w); /* the next round's mask, if set up */
out:
	if (rc != FB_OK && rc != FB_EAGAIN) {
		char why[128];
		snprintf(why, sizeof(why), "update not delivered: %s",
		    fb_strerror(rc));
		fb_log_warn("round %u: %s", w->round, why);
		fb_wk_round_fail(w, w->round, why);
	}
}
