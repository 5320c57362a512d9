/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ingest.h -- the coordinator's update ingest pool: decrypts the workers'
 * update streams and consumes their chunks off the event-loop thread.
 *
 * Each worker's update is one stream in a numbered slot. The event loop
 * checks each message (round, state, order, size) and queues its payload;
 * a small pool of threads then decrypts it (secretstream, which is
 * sequential within a stream) and hands the plaintext to a callback (the
 * fixed-point accumulator today; the secure-aggregation ring sum later).
 * One slot's jobs run in order, one at a time; different slots run in
 * parallel. Calls of the callback for the same chunk index never overlap
 * (unless the callback says it locks for itself: cb_concurrent), so a
 * callback that adds into a shared array needs no lock of its own and,
 * its additions being integer and commutative, the sum does not depend on
 * the order or the thread count.
 *
 * The event loop learns the outcome of each stream from results (the
 * stream completed, or failed and why), signalled on a file descriptor it
 * can poll next to its socket. Chunks queued before a failure or an abort
 * are still consumed (like chunks handled at once used to be); chunks after
 * a failure are discarded. Memory: at most `queue_max` payloads queued,
 * plus one chunk of scratch per thread.
 */
#ifndef FB_COORDINATOR_INGEST_H
#define FB_COORDINATOR_INGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "crypto/crypto.h"
#include "proto/proto.h"

typedef struct fb_ingest fb_ingest;

/*
 * fb_ingest_chunk_cb consumes the plaintext of chunk `chunk` of the stream
 * begun with `stream_arg`: `len` bytes at `data` (4-byte aligned, writable,
 * valid during the call). Calls for the same chunk index never overlap
 * (but see cb_concurrent); others may run at the same time on other
 * threads. It may add to *counter
 * (e.g. clamped coordinates; see fb_ingest_counter). Any error ends the
 * stream with a result (stage FB_INGEST_AT_CONSUME, err = the error); the
 * callback must then have changed nothing.
 */
typedef fb_err (*fb_ingest_chunk_cb)(void *arg, void *stream_arg,
    uint32_t chunk, void *data, size_t len, uint64_t *counter);

/*
 * fb_ingest_end_cb hears, once per stream begun, how it ended, on the
 * thread that ended it (a pool thread, or the caller of the call that
 * ended it): `complete` when it is whole (its last chunk consumed, or for
 * a decrypted stream its trailer verified), before its FB_INGEST_DONE
 * result is posted; an error then makes the result FAILED (stage
 * CONSUME). Otherwise (failed, aborted, replaced by a new stream in its
 * slot, or the pool freed) with `complete` false, its return ignored.
 * After it returns the pool no longer touches stream_arg.
 */
typedef fb_err (*fb_ingest_end_cb)(void *arg, void *stream_arg,
    bool complete);

/*
 * fb_ingest_dst_cb says where the plaintext of chunk `chunk` of a
 * decrypted stream should be written instead of the thread's scratch
 * (4-byte aligned, *cap bytes there), or NULL for the scratch. The chunk
 * callback then gets that memory as `data`. It runs on the pool thread,
 * before the chunk's MAC is checked: what it names may hold the bytes of
 * a chunk that later fails, and is not written when the MAC fails.
 */
typedef void *(*fb_ingest_dst_cb)(void *arg, void *stream_arg,
    uint32_t chunk, size_t *cap);

typedef struct fb_ingest_opts {
	uint32_t threads;      /* 0: every job runs inline, in the caller */
	uint32_t slots;        /* streams at once, slots 0..slots-1; >= 1 */
	uint32_t chunk_count;  /* chunk indices 0..chunk_count-1; >= 1 */
	size_t max_chunk_len;  /* plaintext bytes of a chunk, > 0 */
	uint32_t queue_max;    /* payloads queued at most; 0: 4 per thread */
	fb_ingest_chunk_cb chunk_cb;
	fb_ingest_end_cb end_cb; /* may be NULL */
	fb_ingest_dst_cb dst_cb; /* may be NULL: always the scratch */
	void *cb_arg;
	/* The callback locks what it shares itself: calls for the same chunk
	 * index may then run at the same time (false: they never overlap). */
	bool cb_concurrent;
} fb_ingest_opts;

/*
 * fb_ingest_threads_auto is the thread count for "auto": the CPUs this
 * process may use, less one for the event loop, at most 16; 0 (inline)
 * with 2 CPUs or fewer.
 */
uint32_t fb_ingest_threads_auto(void);

/*
 * fb_io_threads_auto is the ZeroMQ I/O thread count for
 * transport.io_threads "auto": fb_io_threads_for(the CPUs this process may
 * use), which is 2 from 8 CPUs on, else 1.
 */
uint32_t fb_io_threads_auto(void);
uint32_t fb_io_threads_for(long cpus);

/*
 * fb_ingest_alloc starts the pool (opts copied). On FB_OK the caller owns
 * *out (fb_ingest_free). Errors: FB_EINVAL, FB_ENOMEM, FB_EIO (threads or
 * the event fd could not be made).
 */
FB_MUST_CHECK fb_err fb_ingest_alloc(const fb_ingest_opts *opts,
    fb_ingest **out);

/* fb_ingest_free waits for the queued jobs, stops the threads, wipes and
 * frees the streams' state and what is queued. NULL is a no-op. */
void fb_ingest_free(fb_ingest *g);

/* fb_ingest_wake_fd is readable while results are waiting (poll it). */
int fb_ingest_wake_fd(const fb_ingest *g);

/*
 * fb_ingest_begin queues the start of a new stream in `slot`, after the
 * slot's earlier jobs (an earlier stream there ends first). It takes `pull`
 * (the decryptor; NULL for a plaintext stream) whatever it returns, and
 * sets *gen to the stream's number (> 0, unique), which its result carries.
 * `stream_arg` goes to the callback; it must stay valid and unchanged until
 * the stream ends. Event-loop thread only. Errors: FB_EINVAL, FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_ingest_begin(fb_ingest *g, uint32_t slot,
    fb_stream_pull *pull, void *stream_arg, uint64_t *gen);

/*
 * fb_ingest_chunk queues chunk `chunk` of the slot's stream: `buf` holds
 * the ciphertext (or plaintext) and is taken whatever the call returns.
 * `last` marks the stream's last chunk: a decrypted stream must carry its
 * FINAL tag exactly there (else TRUNCATED); a plaintext stream is complete
 * once it is consumed (a FB_INGEST_DONE result). Blocks while the queue is
 * full (until a thread finishes a chunk). Event-loop thread only.
 * Errors: FB_EINVAL, FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_ingest_chunk(fb_ingest *g, uint32_t slot,
    uint32_t chunk, fb_buf *buf, bool last);

/*
 * fb_ingest_end queues the check of a decrypted stream's signed trailer
 * (fb_stream_pull_final with `signer`), after its chunks: FB_INGEST_DONE
 * if it holds, a failure result otherwise. Ignored for a stream that has
 * already failed. Errors: FB_EINVAL, FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_ingest_end(fb_ingest *g, uint32_t slot,
    const fb_pubkey *signer, const uint8_t *trailer, size_t trailer_len);

/*
 * fb_ingest_abort ends the slot's stream after the chunks already queued
 * (they are still consumed), without a result. Never fails: without memory
 * for the job it drains the pool and ends the stream itself.
 */
void fb_ingest_abort(fb_ingest *g, uint32_t slot);

/* fb_ingest_drain blocks until no job is queued or running. */
void fb_ingest_drain(fb_ingest *g);

typedef enum fb_ingest_status {
	FB_INGEST_DONE = 0, /* complete: last chunk consumed / trailer ok */
	FB_INGEST_FAILED,
} fb_ingest_status;

typedef enum fb_ingest_stage {
	FB_INGEST_AT_NONE = 0,
	FB_INGEST_AT_DECRYPT,    /* fb_stream_pull_chunk refused the chunk */
	FB_INGEST_AT_FINAL_MARK, /* FINAL tag missing on the last / early */
	FB_INGEST_AT_CONSUME,    /* the callback refused the chunk */
	FB_INGEST_AT_TRAILER,    /* fb_stream_pull_final refused the trailer */
} fb_ingest_stage;

typedef struct fb_ingest_result {
	uint32_t slot;
	uint64_t gen;            /* fb_ingest_begin's stream number */
	fb_ingest_status status;
	fb_ingest_stage stage;   /* FAILED: where */
	fb_err err;              /* FAILED: the error */
	fb_reject reject;        /* DECRYPT, TRAILER: the decoder's reason */
	uint32_t chunk;          /* FAILED: the chunk refused */
	uint32_t consumed;       /* chunks consumed before the result */
} fb_ingest_result;

/* fb_ingest_result_next pops the oldest waiting result; false if none.
 * Does not block. Event-loop thread only. */
bool fb_ingest_result_next(fb_ingest *g, fb_ingest_result *r);

/*
 * fb_ingest_parallel runs fn(arg, i) for i in [0, n), pieces of one job's
 * work that may run at the same time: the calling thread and the pool's
 * idle threads take them, and it returns when all are done. For use
 * inside the chunk callback (pool: its `arg` is the fb_ingest). The idle
 * threads help only a stream that falls behind: two or more of its jobs
 * wait behind the running one. Otherwise, without threads, or outside the
 * pool, the caller runs every piece itself. fn must not fail and must not
 * call back into the pool.
 */
void fb_ingest_parallel(void *pool, uint32_t n,
    void (*fn)(void *arg, uint32_t i), void *arg);

/* fb_ingest_counter is the sum of every callback's *counter additions
 * since the pool started (read after fb_ingest_drain for an exact value). */
uint64_t fb_ingest_counter(const fb_ingest *g);

#endif
