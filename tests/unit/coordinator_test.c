/* SPDX-License-Identifier: Apache-2.0 */
/*
 * coordinator_test.c -- the ingest pool (coordinator/ingest.h): per-stream
 * order, sums independent of the thread count, and streams that fail
 * mid-way (bad MAC, missing FINAL mark, callback refusal, bad trailer,
 * abort) keep exactly the chunks before the failure; calls for one chunk
 * overlap only when the callback says it locks for itself; a callback's
 * pieces of work (fb_ingest_parallel) run once each, on idle threads too,
 * and the accumulator's adds through them stay exact; chunks decrypted
 * into the memory a destination callback names; the automatic ZeroMQ I/O
 * thread count.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "aggregation/aggregation.h"
#include "coordinator/ingest.h"
#include "crypto/crypto.h"
#include "harness.h"
#include "proto/proto.h"

#define CHUNK_ELEMS 1024
#define CHUNK_LEN (CHUNK_ELEMS * 4)
#define CHUNKS 24
#define STREAMS 6

/* What one stream's callback sees. Touched by one thread at a time. */
typedef struct stream_log {
	uint32_t id;
	uint32_t seen[CHUNKS];
	uint32_t count;
	int32_t refuse_at; /* chunk the callback refuses; -1 none */
} stream_log;

typedef struct sink {
	uint32_t sum[CHUNKS * CHUNK_ELEMS]; /* ring Z_2^32, like SecAgg */
} sink;

static fb_err
add_cb(void *arg, void *stream_arg, uint32_t chunk, void *data, size_t len,
    uint64_t *counter)
{
	sink *s = arg;
	stream_log *l = stream_arg;
	const uint32_t *x = data;

	if (len != CHUNK_LEN) {
		return FB_EPROTO;
	}
	if ((int32_t)chunk == l->refuse_at) {
		return FB_EINVAL;
	}
	for (uint32_t i = 0; i < CHUNK_ELEMS; i++) {
		s->sum[(size_t)chunk * CHUNK_ELEMS + i] += x[i];
	}
	l->seen[l->count++] = chunk;
	(*counter)++;
	return FB_OK;
}

/* Element i of chunk k of stream s: a fixed pseudo-random word. */
static uint32_t
value(uint32_t s, uint32_t k, uint32_t i)
{
	uint64_t z = ((uint64_t)s << 40) ^ ((uint64_t)k << 20) ^ i;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return (uint32_t)(z ^ (z >> 31));
}

static void
fill_plain(uint32_t s, uint32_t k, uint32_t *out)
{
	for (uint32_t i = 0; i < CHUNK_ELEMS; i++) {
		out[i] = value(s, k, i);
	}
}

/* A pool of STREAMS slots and CHUNKS chunks of CHUNK_LEN bytes. */
static fb_ingest *
pool_with(uint32_t threads, uint32_t queue_max, fb_ingest_chunk_cb cb,
    void *arg, bool concurrent)
{
	fb_ingest *g = NULL;
	fb_ingest_opts o = {
	    .threads = threads,
	    .slots = STREAMS,
	    .chunk_count = CHUNKS,
	    .max_chunk_len = CHUNK_LEN,
	    .queue_max = queue_max,
	    .chunk_cb = cb,
	    .cb_arg = arg,
	    .cb_concurrent = concurrent,
	};
	assert_int_equal(fb_ingest_alloc(&o, &g), FB_OK);
	return g;
}

static fb_ingest *
pool(uint32_t threads, sink *snk)
{
	/* a small queue exercises the wait */
	return pool_with(threads, threads > 0 ? 3 : 0, add_cb, snk, false);
}

static fb_buf *
plain_buf(uint32_t s, uint32_t k)
{
	fb_buf *b = NULL;
	assert_int_equal(fb_buf_alloc(CHUNK_LEN, &b), FB_OK);
	fill_plain(s, k, (uint32_t *)(void *)fb_buf_data(b));
	return b;
}

/* The reference: chunks [0, upto[s]) of every stream s, added in order. */
static void
expected(const uint32_t *upto, uint32_t *sum)
{
	memset(sum, 0, sizeof(uint32_t) * CHUNKS * CHUNK_ELEMS);
	for (uint32_t s = 0; s < STREAMS; s++) {
		for (uint32_t k = 0; k < upto[s]; k++) {
			for (uint32_t i = 0; i < CHUNK_ELEMS; i++) {
				sum[(size_t)k * CHUNK_ELEMS + i] += value(s, k, i);
			}
		}
	}
}

static uint32_t
take_results(fb_ingest *g, fb_ingest_result *out, uint32_t cap)
{
	uint32_t n = 0;
	fb_ingest_result r;
	while (fb_ingest_result_next(g, &r)) {
		assert_true(n < cap);
		out[n++] = r;
	}
	return n;
}

static void
test_order_and_exact_sums(void **state)
{
	static const uint32_t threads[] = {0, 1, 2, 3, 8};
	static sink snk;
	static uint32_t want[CHUNKS * CHUNK_ELEMS];
	uint32_t upto[STREAMS];

	(void)state;
	for (uint32_t s = 0; s < STREAMS; s++) {
		upto[s] = CHUNKS;
	}
	expected(upto, want);
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		stream_log logs[STREAMS];
		uint64_t gen[STREAMS];
		fb_ingest_result res[STREAMS + 1];
		fb_ingest *g;

		memset(&snk, 0, sizeof(snk));
		memset(logs, 0, sizeof(logs));
		g = pool(threads[t], &snk);
		for (uint32_t s = 0; s < STREAMS; s++) {
			logs[s].id = s;
			logs[s].refuse_at = -1;
			assert_int_equal(fb_ingest_begin(g, s, NULL, &logs[s],
			                     &gen[s]), FB_OK);
		}
		/* Interleaved like workers uploading at once. */
		for (uint32_t k = 0; k < CHUNKS; k++) {
			for (uint32_t s = 0; s < STREAMS; s++) {
				assert_int_equal(fb_ingest_chunk(g, s, k,
				                     plain_buf(s, k), k + 1 == CHUNKS),
				    FB_OK);
			}
		}
		fb_ingest_drain(g);
		assert_int_equal(take_results(g, res, STREAMS + 1), STREAMS);
		for (uint32_t i = 0; i < STREAMS; i++) {
			uint32_t s = res[i].slot;
			assert_int_equal(res[i].status, FB_INGEST_DONE);
			assert_true(res[i].gen == gen[s]);
			assert_int_equal(res[i].consumed, CHUNKS);
		}
		for (uint32_t s = 0; s < STREAMS; s++) {
			assert_int_equal(logs[s].count, CHUNKS);
			for (uint32_t k = 0; k < CHUNKS; k++) {
				assert_int_equal(logs[s].seen[k], k);
			}
		}
		assert_memory_equal(snk.sum, want, sizeof(want));
		assert_true(fb_ingest_counter(g) == (uint64_t)STREAMS * CHUNKS);
		fb_ingest_free(g);
	}
}

/* An encrypted stream: ciphertext chunks, and the trailer signed by id. */
typedef struct enc_stream {
	uint8_t key[FB_STREAM_KEY_LEN];
	uint8_t header[FB_STREAM_HEADER_LEN];
	uint8_t trailer[FB_STREAM_TRAILER_LEN];
	uint8_t ct[CHUNKS][CHUNK_LEN + FB_STREAM_CHUNK_OVERHEAD];
	fb_stream_ctx ctx;
} enc_stream;

static void
encrypt(uint32_t s, bool final_on_last, const fb_identity *id, enc_stream *e)
{
	fb_stream_push *p = NULL;
	uint32_t plain[CHUNK_ELEMS];

	e->ctx.round = 7;
	e->ctx.sender = s;
	assert_int_equal(fb_run_id_random(&e->ctx.run), FB_OK);
	assert_int_equal(fb_stream_push_alloc(&e->ctx, CHUNK_LEN,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, e->key, e->header, &p),
	    FB_OK);
	for (uint32_t k = 0; k < CHUNKS; k++) {
		size_t clen = 0;
		fill_plain(s, k, plain);
		assert_int_equal(fb_stream_push_chunk(p, (const uint8_t *)plain,
		                     CHUNK_LEN, final_on_last && k + 1 == CHUNKS,
		                     e->ct[k], sizeof(e->ct[k]), &clen),
		    FB_OK);
		assert_int_equal(clen, sizeof(e->ct[k]));
	}
	if (final_on_last) {
		assert_int_equal(fb_stream_push_final(p, id, e->trailer), FB_OK);
	}
	fb_stream_push_free(p);
}

static fb_stream_pull *
decryptor(const enc_stream *e)
{
	fb_stream_pull *p = NULL;
	fb_reject why = FB_REJECT_NONE;
	assert_int_equal(fb_stream_pull_alloc(&e->ctx, FB_STREAM_DIGEST_INDEXED_TAGS,
	                     e->key, e->header, sizeof(e->header), CHUNK_LEN,
	                     &p, &why),
	    FB_OK);
	return p;
}

static fb_buf *
ct_buf(const enc_stream *e, uint32_t k, bool flip)
{
	fb_buf *b = NULL;
	assert_int_equal(fb_buf_alloc(sizeof(e->ct[k]), &b), FB_OK);
	memcpy(fb_buf_data(b), e->ct[k], sizeof(e->ct[k]));
	if (flip) {
		fb_buf_data(b)[100] ^= 0x20;
	}
	return b;
}

/*
 * Six encrypted streams at once: 0 and 1 complete and signed; 2 has a
 * flipped bit in chunk 5; 3 lacks its FINAL mark; 4's callback refuses
 * chunk 9; 5 has a trailer signed by the wrong key. Each failed stream
 * keeps exactly its chunks before the failure (the chunk-wise semantics of
 * the accumulator), whatever the thread count.
 */
static void
test_failures_mid_stream(void **state)
{
	static const uint32_t threads[] = {0, 1, 4};
	static sink snk;
	static uint32_t want[CHUNKS * CHUNK_ELEMS];
	static enc_stream es[STREAMS];
	fb_identity *id = NULL, *other = NULL;
	fb_pubkey pk;
	uint32_t upto[STREAMS] = {CHUNKS, CHUNKS, 5, CHUNKS - 1, 9, CHUNKS};

	(void)state;
	assert_int_equal(fb_crypto_init(), FB_OK);
	assert_int_equal(fb_identity_alloc("w", &id), FB_OK);
	assert_int_equal(fb_identity_alloc("x", &other), FB_OK);
	fb_identity_pubkey(id, &pk);
	for (uint32_t s = 0; s < STREAMS; s++) {
		encrypt(s, s != 3, s == 5 ? other : id, &es[s]);
	}
	expected(upto, want);
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		stream_log logs[STREAMS];
		uint64_t gen[STREAMS];
		fb_ingest_result res[STREAMS + 1];
		uint32_t n;
		fb_ingest *g;

		memset(&snk, 0, sizeof(snk));
		memset(logs, 0, sizeof(logs));
		g = pool(threads[t], &snk);
		for (uint32_t s = 0; s < STREAMS; s++) {
			logs[s].refuse_at = s == 4 ? 9 : -1;
			assert_int_equal(fb_ingest_begin(g, s, decryptor(&es[s]),
			                     &logs[s], &gen[s]), FB_OK);
		}
		for (uint32_t k = 0; k < CHUNKS; k++) {
			for (uint32_t s = 0; s < STREAMS; s++) {
				assert_int_equal(fb_ingest_chunk(g, s, k,
				                     ct_buf(&es[s], k, s == 2 && k == 5),
				                     k + 1 == CHUNKS),
				    FB_OK);
			}
		}
		for (uint32_t s = 0; s < STREAMS; s++) {
			assert_int_equal(fb_ingest_end(g, s, &pk, es[s].trailer,
			                     sizeof(es[s].trailer)), FB_OK);
		}
		fb_ingest_drain(g);
		n = take_results(g, res, STREAMS + 1);
		assert_int_equal(n, STREAMS); /* one each: no result twice */
		for (uint32_t i = 0; i < n; i++) {
			const fb_ingest_result *r = &res[i];
			assert_true(r->gen == gen[r->slot]);
			assert_int_equal(r->consumed, upto[r->slot]);
			switch (r->slot) {
			case 0:
			case 1:
				assert_int_equal(r->status, FB_INGEST_DONE);
				break;
			case 2:
				assert_int_equal(r->status, FB_INGEST_FAILED);
				assert_int_equal(r->stage, FB_INGEST_AT_DECRYPT);
				assert_int_equal(r->reject, FB_REJECT_BAD_MAC);
				assert_int_equal(r->chunk, 5);
				break;
			case 3:
				assert_int_equal(r->stage, FB_INGEST_AT_FINAL_MARK);
				assert_int_equal(r->chunk, CHUNKS - 1);
				break;
			case 4:
				assert_int_equal(r->stage, FB_INGEST_AT_CONSUME);
				assert_int_equal(r->err, FB_EINVAL);
				assert_int_equal(r->chunk, 9);
				break;
			case 5:
				assert_int_equal(r->stage, FB_INGEST_AT_TRAILER);
				assert_int_equal(r->reject,
				    FB_REJECT_BAD_SIGNATURE);
				break;
			}
		}
		for (uint32_t s = 0; s < STREAMS; s++) {
			assert_int_equal(logs[s].count, upto[s]);
		}
		assert_memory_equal(snk.sum, want, sizeof(want));
		fb_ingest_free(g);
	}
	fb_identity_free(id);
	fb_identity_free(other);
}

/* Where dst_cb sends the plaintext: one region per stream and chunk;
 * odd chunks go to the scratch (NULL). Touched by one thread per stream. */
typedef struct dst_log {
	uint32_t id;
	uint32_t *region;   /* CHUNKS x CHUNK_ELEMS */
	uint32_t in_place;  /* chunks handed to add_dst_cb in the region */
	uint32_t elsewhere; /* chunks handed over in the scratch */
} dst_log;

static void *
dst_cb(void *arg, void *stream_arg, uint32_t chunk, size_t *cap)
{
	dst_log *l = stream_arg;

	(void)arg;
	if (chunk % 2 == 1) {
		*cap = 0;
		return NULL;
	}
	*cap = CHUNK_LEN;
	return l->region + (size_t)chunk * CHUNK_ELEMS;
}

static fb_err
add_dst_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	dst_log *l = stream_arg;
	uint32_t *want = l->region + (size_t)chunk * CHUNK_ELEMS;

	(void)arg;
	(void)counter;
	if (len != CHUNK_LEN) {
		return FB_EPROTO;
	}
	if (data == want) {
		l->in_place++;
	} else {
		l->elsewhere++;
		memcpy(want, data, len);
	}
	return FB_OK;
}

/*
 * With a destination callback, a decrypted chunk is written where it says
 * and the chunk callback is handed that memory; where it says NULL, the
 * scratch as before. A chunk whose MAC fails leaves its region as it was.
 */
static void
test_decrypt_into_destination(void **state)
{
	static const uint32_t threads[] = {0, 2};
	static enc_stream es[2];
	static uint32_t region[2][CHUNKS * CHUNK_ELEMS];
	fb_identity *id = NULL;
	fb_pubkey pk;
	uint32_t plain[CHUNK_ELEMS];

	(void)state;
	assert_int_equal(fb_crypto_init(), FB_OK);
	assert_int_equal(fb_identity_alloc("w", &id), FB_OK);
	fb_identity_pubkey(id, &pk);
	for (uint32_t s = 0; s < 2; s++) {
		encrypt(s, true, id, &es[s]);
	}
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		fb_ingest *g = NULL;
		fb_ingest_opts o = {
		    .threads = threads[t],
		    .slots = STREAMS,
		    .chunk_count = CHUNKS,
		    .max_chunk_len = CHUNK_LEN,
		    .chunk_cb = add_dst_cb,
		    .dst_cb = dst_cb,
		};
		dst_log logs[2];
		uint64_t gen;
		fb_ingest_result res[3];
		uint32_t n;

		memset(region, 0xaa, sizeof(region));
		assert_int_equal(fb_ingest_alloc(&o, &g), FB_OK);
		for (uint32_t s = 0; s < 2; s++) {
			logs[s] = (dst_log){.id = s, .region = region[s]};
			assert_int_equal(fb_ingest_begin(g, s, decryptor(&es[s]),
			                     &logs[s], &gen), FB_OK);
		}
		/* stream 1: chunk 6's MAC fails (an even chunk: in place) */
		for (uint32_t k = 0; k < CHUNKS; k++) {
			for (uint32_t s = 0; s < 2; s++) {
				assert_int_equal(fb_ingest_chunk(g, s, k,
				                     ct_buf(&es[s], k, s == 1 && k == 6),
				                     k + 1 == CHUNKS),
				    FB_OK);
			}
		}
		assert_int_equal(fb_ingest_end(g, 0, &pk, es[0].trailer,
		                     sizeof(es[0].trailer)), FB_OK);
		fb_ingest_drain(g);
		n = take_results(g, res, 3);
		assert_int_equal(n, 2);
		assert_int_equal(logs[0].in_place, CHUNKS / 2);
		assert_int_equal(logs[0].elsewhere, CHUNKS / 2);
		assert_int_equal(logs[1].in_place, 3);  /* chunks 0, 2, 4 */
		assert_int_equal(logs[1].elsewhere, 3); /* chunks 1, 3, 5 */
		for (uint32_t k = 0; k < CHUNKS; k++) {
			fill_plain(0, k, plain);
			assert_memory_equal(region[0] + (size_t)k * CHUNK_ELEMS,
			    plain, CHUNK_LEN);
		}
		for (uint32_t i = 0; i < CHUNK_ELEMS; i++) {
			/* the failed chunk wrote nothing */
			assert_int_equal(region[1][6 * CHUNK_ELEMS + i],
			    0xaaaaaaaau);
		}
		fb_ingest_free(g);
	}
	fb_identity_free(id);
}

/* An abort after some chunks: those queued are still added, later ones
 * never are, and no result comes; the slot's next stream works. */
static void
test_abort_keeps_queued_chunks(void **state)
{
	static sink snk;
	static uint32_t want[CHUNKS * CHUNK_ELEMS];
	uint32_t upto[STREAMS] = {0};
	stream_log l0 = {.refuse_at = -1}, l1 = {.refuse_at = -1};
	fb_ingest_result r;
	uint64_t gen = 0;
	fb_ingest *g;

	(void)state;
	memset(&snk, 0, sizeof(snk));
	g = pool(2, &snk);
	assert_int_equal(fb_ingest_begin(g, 0, NULL, &l0, &gen), FB_OK);
	for (uint32_t k = 0; k < 7; k++) {
		assert_int_equal(fb_ingest_chunk(g, 0, k, plain_buf(0, k), false),
		    FB_OK);
	}
	fb_ingest_abort(g, 0);
	/* Chunks sent after the abort (a confused caller) are discarded. */
	assert_int_equal(fb_ingest_chunk(g, 0, 7, plain_buf(0, 7), false), FB_OK);
	fb_ingest_drain(g);
	assert_false(fb_ingest_result_next(g, &r));
	assert_int_equal(l0.count, 7);
	/* The slot's next stream. */
	assert_int_equal(fb_ingest_begin(g, 0, NULL, &l1, &gen), FB_OK);
	for (uint32_t k = 7; k < CHUNKS; k++) {
		assert_int_equal(fb_ingest_chunk(g, 0, k, plain_buf(0, k),
		                     k + 1 == CHUNKS), FB_OK);
	}
	fb_ingest_drain(g);
	assert_true(fb_ingest_result_next(g, &r));
	assert_int_equal(r.status, FB_INGEST_DONE);
	assert_true(r.gen == gen);
	assert_int_equal(r.consumed, CHUNKS - 7);
	upto[0] = CHUNKS;
	expected(upto, want);
	assert_memory_equal(snk.sum, want, sizeof(want));
	fb_ingest_free(g);
}

/* Freeing a pool with work queued finishes it and leaks nothing. */
static void
test_free_with_work_queued(void **state)
{
	static sink snk;
	stream_log l = {.refuse_at = -1};
	uint64_t gen = 0;
	fb_ingest *g;

	(void)state;
	g = pool(3, &snk);
	assert_int_equal(fb_ingest_begin(g, 1, NULL, &l, &gen), FB_OK);
	for (uint32_t k = 0; k < CHUNKS; k++) {
		assert_int_equal(fb_ingest_chunk(g, 1, k, plain_buf(1, k),
		                     k + 1 == CHUNKS), FB_OK);
	}
	fb_ingest_free(g);
	assert_int_equal(l.count, CHUNKS);
}

static void
test_bad_arguments(void **state)
{
	static sink snk;
	fb_ingest *g = NULL;
	fb_ingest_opts o = {.threads = 1, .slots = 0, .chunk_count = 1,
	    .max_chunk_len = 4, .chunk_cb = add_cb, .cb_arg = &snk};
	uint64_t gen = 1;

	(void)state;
	assert_int_equal(fb_ingest_alloc(&o, &g), FB_EINVAL);
	assert_null(g);
	g = pool(1, &snk);
	assert_int_equal(fb_ingest_begin(g, STREAMS, NULL, NULL, &gen),
	    FB_EINVAL);
	assert_true(gen == 0);
	assert_int_equal(fb_ingest_chunk(g, 0, CHUNKS, plain_buf(0, 0), false),
	    FB_EINVAL);
	assert_int_equal(fb_ingest_chunk(g, STREAMS, 0, plain_buf(0, 0), false),
	    FB_EINVAL);
	assert_true(fb_ingest_threads_auto() <= 16);
	fb_ingest_free(g);
	fb_ingest_free(NULL);
}

/* transport.io_threads auto: one I/O thread below 8 CPUs, two from 8 on,
 * and the running process gets what its CPU count says. */
static void
test_io_threads_auto(void **state)
{
	cpu_set_t set;
	long n = 0;

	(void)state;
	assert_int_equal(fb_io_threads_for(0), 1);
	assert_int_equal(fb_io_threads_for(1), 1);
	assert_int_equal(fb_io_threads_for(2), 1);
	assert_int_equal(fb_io_threads_for(7), 1);
	assert_int_equal(fb_io_threads_for(8), 2);
	assert_int_equal(fb_io_threads_for(32), 2);
	assert_int_equal(fb_io_threads_for(1024), 2);
	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		n = CPU_COUNT(&set);
	}
	if (n <= 0) {
		n = sysconf(_SC_NPROCESSORS_ONLN);
	}
	assert_int_equal(fb_io_threads_auto(), fb_io_threads_for(n));
}

/* ---- calls for the same chunk: serialised, or not (cb_concurrent) ----- */

typedef struct overlap_sink {
	_Atomic uint32_t inflight; /* calls for chunk 0 running now */
	_Atomic uint32_t peak;
	_Atomic uint32_t calls;
} overlap_sink;

static fb_err
overlap_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	overlap_sink *o = arg;
	struct timespec ts = {0, 20 * 1000 * 1000};
	uint32_t now = atomic_fetch_add(&o->inflight, 1) + 1;
	uint32_t peak = atomic_load(&o->peak);

	(void)stream_arg;
	(void)chunk;
	(void)data;
	(void)len;
	(void)counter;
	while (now > peak && !atomic_compare_exchange_weak(&o->peak, &peak,
	    now)) {
	}
	nanosleep(&ts, NULL); /* long enough for the others to start */
	atomic_fetch_sub(&o->inflight, 1);
	atomic_fetch_add(&o->calls, 1);
	return FB_OK;
}

static void
test_same_chunk_overlap(void **state)
{
	(void)state;
	for (int concurrent = 0; concurrent <= 1; concurrent++) {
		overlap_sink o = {0};
		fb_ingest *g = pool_with(STREAMS, 0, overlap_cb, &o, concurrent);
		fb_ingest_result r;
		uint32_t done = 0;
		uint64_t gen;

		/* every stream is one chunk, chunk 0 (a one-chunk model) */
		for (uint32_t s = 0; s < STREAMS; s++) {
			assert_int_equal(fb_ingest_begin(g, s, NULL, NULL, &gen),
			    FB_OK);
			assert_int_equal(fb_ingest_chunk(g, s, 0, plain_buf(s, 0),
			    true), FB_OK);
		}
		fb_ingest_drain(g);
		while (fb_ingest_result_next(g, &r)) {
			assert_int_equal(r.status, FB_INGEST_DONE);
			done++;
		}
		assert_int_equal(done, STREAMS);
		assert_int_equal(atomic_load(&o.calls), STREAMS);
		if (concurrent) {
			/* 6 threads, 6 chunks of 20 ms queued at once */
			assert_true(atomic_load(&o.peak) >= 2);
		} else {
			assert_int_equal(atomic_load(&o.peak), 1);
		}
		fb_ingest_free(g);
	}
}

/* ---- a callback's pieces of work on the idle threads --------------- */

enum { PIECES = 48, CALLS = STREAMS };

typedef struct piece_sink {
	fb_ingest *g;
	_Atomic uint32_t calls;
	_Atomic uint32_t ran[CALLS][PIECES];
	pthread_t who[CALLS][PIECES];
} piece_sink;

typedef struct piece_call {
	piece_sink *ps;
	uint32_t call;
} piece_call;

static void
piece_fn(void *arg, uint32_t i)
{
	piece_call *pc = arg;
	struct timespec ts = {0, 500 * 1000};
	atomic_fetch_add(&pc->ps->ran[pc->call][i], 1);
	pc->ps->who[pc->call][i] = pthread_self();
	nanosleep(&ts, NULL);
}

static fb_err
piece_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	piece_sink *ps = arg;
	piece_call pc = {.ps = ps, .call = atomic_fetch_add(&ps->calls, 1)};

	(void)stream_arg;
	(void)chunk;
	(void)data;
	(void)len;
	(void)counter;
	if (pc.call >= CALLS) {
		return FB_EINVAL;
	}
	fb_ingest_parallel(ps->g, PIECES, piece_fn, &pc);
	return FB_OK;
}

/* Runs CALLS chunk jobs (streams x chunks_per) through a pool of `threads`
 * whose callback splits each into PIECES; returns how many calls had their
 * pieces run on more than one thread. Every piece must run exactly once. */
static uint32_t
run_pieces_case(uint32_t threads, uint32_t streams, uint32_t chunks_per)
{
	static piece_sink ps;
	fb_ingest_result r;
	uint32_t done = 0, spread = 0;
	uint64_t gen;

	assert_true(streams * chunks_per == CALLS && streams <= STREAMS);
	memset(&ps, 0, sizeof(ps));
	ps.g = pool_with(threads, 0, piece_cb, &ps, false);
	for (uint32_t s = 0; s < streams; s++) {
		assert_int_equal(fb_ingest_begin(ps.g, s, NULL, NULL, &gen),
		    FB_OK);
		for (uint32_t k = 0; k < chunks_per; k++) {
			assert_int_equal(fb_ingest_chunk(ps.g, s, k,
			    plain_buf(s, k), k + 1 == chunks_per), FB_OK);
		}
	}
	fb_ingest_drain(ps.g);
	while (fb_ingest_result_next(ps.g, &r)) {
		assert_int_equal(r.status, FB_INGEST_DONE);
		done++;
	}
	assert_int_equal(done, streams);
	assert_int_equal(atomic_load(&ps.calls), CALLS);
	for (uint32_t c = 0; c < CALLS; c++) {
		bool several = false;
		for (uint32_t i = 0; i < PIECES; i++) {
			assert_int_equal(atomic_load(&ps.ran[c][i]), 1);
			several |= !pthread_equal(ps.who[c][i], ps.who[c][0]);
		}
		spread += several;
	}
	fb_ingest_free(ps.g);
	return spread;
}

static void
test_parallel_pieces(void **state)
{
	(void)state;
	/* One stream whose chunks queue up (each call takes >= 24 ms on
	 * its own; all six are queued in microseconds): the second call
	 * has four jobs waiting behind it, and three threads are idle. */
	assert_int_equal(run_pieces_case(0, 1, CALLS), 0);
	assert_int_equal(run_pieces_case(1, 1, CALLS), 0);
	assert_true(run_pieces_case(4, 1, CALLS) > 0);
	/* One chunk per stream: no stream falls behind, so no help, even
	 * with idle threads. */
	assert_int_equal(run_pieces_case(4, CALLS, 1), 0);
}

/* The accumulator's ring adds split in parts over the pool's threads,
 * several streams into the same chunks at once: exact sums. */
enum { BIG_ELEMS = 65536, BIG_CHUNKS = 3, BIG_STREAMS = STREAMS };

static fb_err
accum_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	(void)stream_arg;
	(void)counter;
	return fb_accum_ring_add(arg, chunk, data, len / 4);
}

static void
test_parallel_accum_adds_exact(void **state)
{
	fb_accum *a = NULL;
	fb_ingest *g = NULL;
	fb_ingest_result r;
	uint32_t done = 0;
	uint64_t gen;
	static uint32_t want[BIG_CHUNKS * BIG_ELEMS];

	(void)state;
	assert_int_equal(fb_accum_alloc(BIG_CHUNKS * BIG_ELEMS, BIG_ELEMS, 1.0,
	    &a), FB_OK);
	fb_ingest_opts o = {
	    .threads = 8,
	    .slots = BIG_STREAMS,
	    .chunk_count = BIG_CHUNKS,
	    .max_chunk_len = BIG_ELEMS * 4,
	    .chunk_cb = accum_cb,
	    .cb_arg = a,
	    .cb_concurrent = true,
	};
	assert_int_equal(fb_ingest_alloc(&o, &g), FB_OK);
	fb_accum_set_parallel(a, fb_ingest_parallel, g);
	memset(want, 0, sizeof(want));
	for (int rep = 0; rep < 5; rep++) {
		for (uint32_t s = 0; s < BIG_STREAMS; s++) {
			assert_int_equal(fb_ingest_begin(g, s, NULL, NULL, &gen),
			    FB_OK);
			/* every stream in the same chunk order: they collide */
			for (uint32_t k = 0; k < BIG_CHUNKS; k++) {
				fb_buf *b = NULL;
				uint32_t *v;
				assert_int_equal(fb_buf_alloc(BIG_ELEMS * 4, &b),
				    FB_OK);
				v = (uint32_t *)(void *)fb_buf_data(b);
				for (uint32_t i = 0; i < BIG_ELEMS; i++) {
					v[i] = value(s + 100 * (uint32_t)rep, k, i);
					want[(size_t)k * BIG_ELEMS + i] += v[i];
				}
				assert_int_equal(fb_ingest_chunk(g, s, k, b,
				    k + 1 == BIG_CHUNKS), FB_OK);
			}
		}
	}
	fb_ingest_drain(g);
	while (fb_ingest_result_next(g, &r)) {
		assert_int_equal(r.status, FB_INGEST_DONE);
		done++;
	}
	assert_int_equal(done, 5 * BIG_STREAMS);
	assert_memory_equal(fb_accum_ring(a), want, sizeof(want));
	fb_ingest_free(g);
	fb_accum_free(a);
}

/* Big encrypted chunks: their decryption splits into parts. */
enum { DEC_ELEMS = 131072, DEC_CHUNKS = 6 };

typedef struct dec_region {
	uint32_t *at; /* DEC_CHUNKS x DEC_ELEMS */
} dec_region;

static void *
dec_dst_cb(void *arg, void *stream_arg, uint32_t chunk, size_t *cap)
{
	dec_region *r = stream_arg;

	(void)arg;
	*cap = DEC_ELEMS * 4;
	return r->at + (size_t)chunk * DEC_ELEMS;
}

static fb_err
dec_chunk_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	dec_region *r = stream_arg;

	(void)arg;
	(void)counter;
	return data == r->at + (size_t)chunk * DEC_ELEMS && len == DEC_ELEMS * 4
	           ? FB_OK
	           : FB_EPROTO;
}

/* Stream s of test_decrypt_in_parts, pushed by libsodium's secretstream. */
typedef struct dec_stream {
	uint32_t plain[DEC_CHUNKS * DEC_ELEMS];
	uint32_t region[DEC_CHUNKS * DEC_ELEMS];
	uint8_t ct[DEC_CHUNKS][DEC_ELEMS * 4 + FB_STREAM_CHUNK_OVERHEAD];
	uint8_t key[FB_STREAM_KEY_LEN];
	uint8_t header[FB_STREAM_HEADER_LEN];
	uint8_t trailer[FB_STREAM_TRAILER_LEN];
	fb_stream_ctx ctx;
} dec_stream;

static void
dec_encrypt(uint32_t s, const fb_identity *id, dec_stream *d)
{
	fb_stream_push *p = NULL;

	memset(&d->ctx, 0, sizeof(d->ctx));
	d->ctx.round = 3;
	d->ctx.sender = s;
	assert_int_equal(fb_run_id_random(&d->ctx.run), FB_OK);
	assert_int_equal(fb_stream_push_alloc(&d->ctx, DEC_ELEMS * 4,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, d->key, d->header, &p),
	    FB_OK);
	for (uint32_t k = 0; k < DEC_CHUNKS; k++) {
		uint32_t *m = d->plain + (size_t)k * DEC_ELEMS;
		size_t clen = 0;
		for (uint32_t i = 0; i < DEC_ELEMS; i++) {
			m[i] = value(s, k, i);
		}
		assert_int_equal(fb_stream_push_chunk(p, (const uint8_t *)m,
		                     DEC_ELEMS * 4, k + 1 == DEC_CHUNKS, d->ct[k],
		                     sizeof(d->ct[k]), &clen),
		    FB_OK);
	}
	assert_int_equal(fb_stream_push_final(p, id, d->trailer), FB_OK);
	fb_stream_push_free(p);
	memset(d->region, 0xaa, sizeof(d->region));
}

/*
 * Encrypted chunks big enough to split (512 KiB) are decrypted in parts
 * that the pool's idle threads help with: the plaintext lands whole where
 * the destination callback says, and a chunk whose MAC fails fails its
 * stream at the decryption and leaves its region untouched.
 */
static void
test_decrypt_in_parts(void **state)
{
	static dec_stream d[2];
	dec_region dr[2] = {{d[0].region}, {d[1].region}};
	fb_identity *id = NULL;
	fb_pubkey pk;
	fb_ingest *g = NULL;
	fb_ingest_result res[3];
	uint64_t gen;
	fb_reject why;

	(void)state;
	assert_int_equal(fb_crypto_init(), FB_OK);
	assert_int_equal(fb_identity_alloc("w", &id), FB_OK);
	fb_identity_pubkey(id, &pk);
	dec_encrypt(0, id, &d[0]);
	dec_encrypt(1, id, &d[1]);
	d[1].ct[3][300000] ^= 0x40; /* stream 1, chunk 3: its MAC fails */
	fb_ingest_opts o = {
	    .threads = 4,
	    .slots = 2,
	    .chunk_count = DEC_CHUNKS,
	    .max_chunk_len = DEC_ELEMS * 4,
	    .chunk_cb = dec_chunk_cb,
	    .dst_cb = dec_dst_cb,
	};
	assert_int_equal(fb_ingest_alloc(&o, &g), FB_OK);
	for (uint32_t s = 0; s < 2; s++) {
		fb_stream_pull *pull = NULL;
		assert_int_equal(fb_stream_pull_alloc(&d[s].ctx,
		                     FB_STREAM_DIGEST_INDEXED_TAGS, d[s].key, d[s].header,
		                     FB_STREAM_HEADER_LEN, DEC_ELEMS * 4, &pull,
		                     &why),
		    FB_OK);
		assert_int_equal(fb_ingest_begin(g, s, pull, &dr[s], &gen),
		    FB_OK);
		/* all of a stream's chunks queue at once: it falls behind */
		for (uint32_t k = 0; k < DEC_CHUNKS; k++) {
			fb_buf *b = NULL;
			assert_int_equal(fb_buf_alloc(sizeof(d[s].ct[k]), &b),
			    FB_OK);
			memcpy(fb_buf_data(b), d[s].ct[k], sizeof(d[s].ct[k]));
			assert_int_equal(fb_ingest_chunk(g, s, k, b,
			                     k + 1 == DEC_CHUNKS),
			    FB_OK);
		}
		assert_int_equal(fb_ingest_end(g, s, &pk, d[s].trailer,
		                     sizeof(d[s].trailer)),
		    FB_OK);
	}
	fb_ingest_drain(g);
	assert_int_equal(take_results(g, res, 3), 2);
	for (uint32_t i = 0; i < 2; i++) {
		if (res[i].status == FB_INGEST_DONE) {
			continue;
		}
		assert_int_equal(res[i].status, FB_INGEST_FAILED);
		assert_int_equal(res[i].stage, FB_INGEST_AT_DECRYPT);
		assert_int_equal(res[i].reject, FB_REJECT_BAD_MAC);
		assert_int_equal(res[i].chunk, 3);
	}
	assert_true(res[0].status != res[1].status);
	assert_memory_equal(d[0].region, d[0].plain, sizeof(d[0].plain));
	assert_memory_equal(d[1].region, d[1].plain, 3 * DEC_ELEMS * 4);
	for (size_t i = 3 * (size_t)DEC_ELEMS; i < 4 * (size_t)DEC_ELEMS; i++) {
		assert_int_equal(d[1].region[i], 0xaaaaaaaa);
	}
	fb_ingest_free(g);
	fb_identity_free(id);
}

FB_TESTS = {
	{"each stream's chunks are consumed in order and sums are exact "
	 "whatever the thread count",
	    test_order_and_exact_sums},
	{"a stream failing mid-way keeps exactly its chunks before the failure",
	    test_failures_mid_stream},
	{"an abort keeps the queued chunks, gives no result, frees the slot",
	    test_abort_keeps_queued_chunks},
	{"freeing a pool finishes the queued work", test_free_with_work_queued},
	{"a decrypted chunk goes where the destination callback says, a "
	 "chunk failing its MAC nowhere", test_decrypt_into_destination},
	{"bad arguments are rejected", test_bad_arguments},
	{"transport.io_threads auto: 1 below 8 CPUs, 2 from 8 on",
	    test_io_threads_auto},
	{"calls for one chunk never overlap, unless the callback locks "
	 "for itself (then they do)", test_same_chunk_overlap},
	{"a callback's pieces run once each, on idle threads only for a "
	 "stream that falls behind", test_parallel_pieces},
	{"accumulator adds split over the pool's threads are exact",
	    test_parallel_accum_adds_exact},
	{"big encrypted chunks are decrypted in parts, a bad MAC fails first",
	    test_decrypt_in_parts},
	{NULL, NULL},
};

FB_TEST_MAIN("coordinator")
