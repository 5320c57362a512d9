/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker_impl.h -- the worker's private state machine, shared by its files.
 *
 * The worker is one state machine (struct fb_wk) driven by events: a frame
 * from the coordinator, the trainer thread's end, room on the link, and the
 * clock (tick). Each event is a function of (state, event, now) that never
 * touches the socket or a thread itself: what it sends and starts goes
 * through a small seam of operations (fb_wk_io) that the real loop
 * (worker.c) implements with the link and the trainer thread, and a unit
 * test implements with fakes. So the whole protocol runs without sockets in
 * tests/unit/worker_sm_test.c.
 *
 *   worker.c  fb_worker_run and its loop, dispatch of frames, tick, outbox
 *   join.c    handshake, hello, welcome, redirect to a lane, keys, peers
 *   round.c   RoundStart, model fetch, the trainer thread, its result
 *   upload.c  the update stream, sent chunk by chunk as the link has room
 *   secagg.c  the secure-aggregation client: phases and masked chunks
 *
 * Every send is non-blocking. Control messages that find the coordinator's
 * queue full wait in a small FIFO (the outbox), flushed before the next
 * update chunk; heartbeats and the join messages, which are resent by the
 * tick, are simply skipped. Sealed messages are sealed when the link takes
 * them, so sequence numbers only grow (with gaps where a send found no
 * room).
 *
 * Threads: everything here runs on the loop's thread, except the trainer
 * thread of round.c, which reads the round's settings and `global` (set
 * before it starts), writes `local`, `stats` and `train_rc` (read after it
 * is joined), and reads `cancel` (atomic).
 */
#ifndef FB_WORKER_WORKER_IMPL_H
#define FB_WORKER_WORKER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "aggregation/aggregation.h"
#include "common/err.h"
#include "common/util.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"
#include "proto/proto.h"
#include "worker/trainer.h"
#include "worker/worker.h"

#define FB_WK_JOIN_RETRY_MS 1000      /* first join retry; doubles ... */
#define FB_WK_JOIN_RETRY_MAX_MS 30000 /* ... up to this (plus jitter) */
#define FB_WK_NOTE_FIRST_MS 3000      /* "still trying" notes: the first,
                                       * then twice as far apart ... */
#define FB_WK_NOTE_MAX_MS 600000      /* ... up to every 10 minutes */
#define FB_WK_LANE_GIVEUP_MS 15000 /* no welcome on a lane: back to listen */
#define FB_WK_LANE_STAY UINT32_MAX /* "do not send me to a lane" */
#define FB_WK_OUTBOX_MAX 16        /* control messages waiting for room */
#define FB_WK_CHUNKS_PER_PUMP 16   /* update chunks per writable event */
#define FB_WK_NOTE_EVERY_MS 5000   /* rate limit of repeated warnings */

/* Where the worker is in the protocol. */
typedef enum fb_wk_phase {
	FB_WK_JOINING = 0, /* handshake / hello sent; waiting for Welcome */
	FB_WK_IDLE,        /* admitted, between rounds */
	FB_WK_FETCHING,    /* downloading the round's global model */
	FB_WK_TRAINING,    /* the trainer thread runs */
	FB_WK_WAITING,     /* trained; the update waits for the SecAgg masks */
	FB_WK_UPLOADING,   /* the update goes up, chunk by chunk */
	FB_WK_DONE,        /* the coordinator ended the run */
} fb_wk_phase;

/* fb_wk_phase_name returns "joining", "idle", ... for logs and tests. */
const char *fb_wk_phase_name(fb_wk_phase p);

/* This round's secure aggregation, as far as this worker is concerned. */
typedef enum fb_wk_sa_phase {
	FB_WK_SA_OFF = 0,    /* none this round (or it was abandoned) */
	FB_WK_SA_ADVERTISED, /* our signed key advert sent */
	FB_WK_SA_SHARED,     /* neighbours' adverts in, our shares sent */
	FB_WK_SA_MASKING, /* their shares in, masks fixed: the update may go */
	FB_WK_SA_CONFIRMED, /* the included set signed: reveal on confirms */
} fb_wk_sa_phase;

typedef struct fb_wk fb_wk;

/*
 * A secure-aggregation instance and the per-round fields that go with it,
 * kept apart from w's own (w->sa, its sa_* fields and w->enc): a secure
 * async task's, held for its cohort's unmasking, or the next round's, set
 * up ahead. secagg.c's sa_swap exchanges one with w's while one of its
 * messages is handled.
 */
typedef struct fb_wk_sa_state {
	fb_secagg_worker *sa; /* NULL: none */
	uint32_t round;
	fb_wk_sa_phase phase;
	uint32_t n, t, again;
	double weight;
	uint64_t max_samples;
	uint32_t max_staleness;
	fb_secagg_encodings enc;
} fb_wk_sa_state;

/* Instances kept after their task (secure async). */
#define FB_WK_SA_HELD 4

/* The next round's, set up ahead (FB_SA_SETUP) while the current round
 * runs, and taken as the round's at its RoundStart. */
typedef struct fb_wk_sa_ahead {
	fb_wk_sa_state st;
	fb_msg params; /* the setup's SecAggRound, as RoundStart fields */
} fb_wk_sa_ahead;

/*
 * The operations the state machine uses. None may call back into the
 * state machine. `arg` is the implementation's own.
 */
typedef struct fb_wk_io {
	void *arg;
	/* send hands `m` (with `len` bytes of `payload` when its type carries
	 * one; from `origin`'s lent memory when non-NULL) to the link now,
	 * sealed with w's session for fb_wk_msg_round(w, m) when `seal`
	 * (then, not when it was made). It never waits:
	 * FB_EAGAIN when the coordinator's queue is full (nothing was sent).
	 * Other errors: the link's. */
	fb_err (*send)(void *arg, fb_wk *w, const fb_msg *m,
	    const void *payload, size_t len, fb_lent *origin, bool seal);
	/* train_start runs the round's training (w's settings, w->global) in
	 * the background; its end is reported as fb_wk_on_trained once
	 * w->local, w->stats and w->train_rc hold its result. */
	fb_err (*train_start)(void *arg, fb_wk *w);
	/* train_stop cancels the training, if any, and waits for it; no
	 * fb_wk_on_trained follows. */
	void (*train_stop)(void *arg, fb_wk *w);
	/* relink replaces the link by one to `endpoint` (messages queued on
	 * the old one are lost). On error the old link stays. */
	fb_err (*relink)(void *arg, fb_wk *w, const char *endpoint);
	/* traffic fills *t with the bytes the link's connection moved (see
	 * fb_link_traffic); an error when it cannot say (no connection, not
	 * TCP): liveness then counts whole messages only. May be NULL. */
	fb_err (*traffic)(void *arg, fb_wk *w, fb_traffic *t);
} fb_wk_io;

/* A control message waiting for room on the link (payload copied). */
typedef struct fb_wk_out {
	fb_msg msg;
	uint8_t *payload; /* malloc'd, wiped when sent or dropped; or NULL */
	size_t len;
} fb_wk_out;

/* The update being sent: UpdateBegin, the chunks in rotated order, then
 * (secure) UpdateEnd. */
#define FB_WK_BATCH_MAX 16 /* masked chunks made ahead at once */

typedef struct fb_wk_upload {
	bool begun;      /* UpdateBegin is on the link */
	uint32_t pos;    /* next chunk position, 0..chunks */
	uint32_t chunks; /* model chunks, + 1 with secure aggregation */
	uint32_t credit; /* chunks the coordinator lets us send now */
	bool weighed;    /* SecAgg: its weight fixed, by the first credit */
	uint32_t staleness; /* ... from that credit's staleness */
	/* secure: the ct window in use (send_ct[ct_which]) holds the chunks
	 * of positions ct_first .. ct_first + FB_WK_BATCH_MAX - 1, in order,
	 * sealed as their batches are made (ct_live: it is this upload's);
	 * ct_len: each slot's sealed length; the batch in use lies in
	 * send_ct[batch_which] from slot batch_slot0 on; failed: the first
	 * error of a batch (the stream then has a gap: no later chunk goes) */
	uint32_t ct_which, ct_first;
	bool ct_live;
	size_t ct_len[2][FB_WK_BATCH_MAX];
	uint32_t batch_which, batch_slot0;
	fb_err failed;
	bool ended;   /* secure: the trailer is signed (end staged) */
	fb_msg begin; /* holds the stream key until it is sent */
	fb_msg end;
	fb_stream_push *push; /* secure: the update's stream */
	double loss;          /* what goes into the extra coordinates */
	uint64_t clipped;
	FILE *enc_dump, *mask_dump; /* debug.dump_updates, or NULL */
	/* secure: chunks made (masked with SecAgg, and sealed) several at
	 * once on the pool, the masked inputs (SecAgg) in two halves of
	 * `batch` used in turn: positions
	 * batch_first .. batch_first + batch_n - 1 in half `half`, and,
	 * while the loop sends those, the next batch (ahead_first, ahead_n)
	 * made in the other half by the masker thread (w->mk) */
	uint32_t *batch;      /* SecAgg: 2 x batch_cap chunks of chunk_bytes */
	uint32_t batch_cap;
	size_t batch_bytes;   /* batch's size; it is kept from round to round */
	uint32_t batch_first, batch_n, half;
	bool ahead;
	uint32_t ahead_first, ahead_n;
} fb_wk_upload;

/* Rate limit for a warning a peer can repeat at will. */
typedef struct fb_wk_note {
	bool written; /* one was written, at last_ms */
	int64_t last_ms;
	uint64_t suppressed; /* repeats not written since */
} fb_wk_note;

struct fb_wk {
	const fb_worker_config *cfg;
	const fb_wk_io *io;
	int64_t now; /* ms, the clock of the event being handled */
	fb_wk_phase phase;
	/* joining */
	uint32_t lane;         /* the coordinator's lane we are on; 0: listen */
	int64_t lane_since_ms; /* when we went to it */
	bool welcomed;         /* admitted by the current run */
	bool admitted;         /* secure: a sealed Welcome was ever taken */
	uint64_t run_id;
	uint64_t session;     /* hello's session id (new on each rejoin) */
	int64_t heartbeat_ms; /* the coordinator's, from the Welcome */
	int64_t liveness_ms;
	int64_t last_rx_ms; /* last message taken from the coordinator */
	int64_t last_tx_ms; /* last message handed to the link */
	int64_t last_hello_ms;
	int64_t hello_since_ms; /* joining since (transport.connect_timeout) */
	int64_t join_retry_ms;  /* the join's retry interval now (backoff) */
	int64_t next_join_ms;   /* when the join message goes again */
	bool join_due;          /* the link is up, took no join message yet */
	int64_t note_gap_ms;    /* "still trying" notes: the gap to the next */
	int64_t next_note_ms;
	fb_rng jitter;          /* for the retries' jitter (not a secret) */
	/* the link's connection (fb_wk_on_link) and the bytes it moved */
	bool link_up;
	uint32_t link_gen;      /* the connection we joined on */
	/* a join message (hello, handshake) was taken by the link since it
	 * was made or its connection last closed: on the link's first
	 * connection it is on its way, and is not sent again */
	bool join_queued;
	fb_traffic seen;        /* its counters at the last look */
	int64_t rx_moved_ms;    /* bytes last arrived (0: never seen) */
	int64_t tx_moved_ms;    /* bytes we sent were last acknowledged */
	bool full;              /* the last send found the queue full */
	int64_t full_since_ms;  /* since then (transport.send_timeout) */
	/* the model and this box's data */
	fb_dataset shard;
	fb_dataset valid;        /* data.valid, when given (fb_dataset_load) */
	fb_model *model;
	uint64_t param_count;
	uint32_t chunk_bytes;
	float *global;
	float *local;         /* fb_lent_data(local_lent) */
	fb_lent *local_lent;  /* plain updates go from it without a copy */
	bool synthetic_ready; /* data.dataset none: the fixed update is made */
	int64_t refused_ms;   /* we refused the run then (a layout differs):
	                       * stop once the refusal had time to leave */
	/* the trainer (round.c) */
	fb_trainer *trainer;
	/* train.command: every trainer this worker opens is that process */
	fb_trainer_proc_config proc;
	const char *proc_argv[FB_CFG_MAX_LIST], *proc_env[FB_CFG_MAX_LIST];
	bool has_proc;
	uint32_t trainer_batch;
	char backend[FB_TEXT_MAX];
	pthread_t thread;
	bool thread_live;
	int efd;              /* the trainer thread's "done" eventfd */
	atomic_int cancel;    /* set by the loop, read by the trainer */
	fb_err train_rc;      /* written by the trainer thread */
	char train_why[FB_TEXT_MAX]; /* its last error, when train_rc fails */
	fb_train_stats stats; /* written by the trainer thread */
	/* this worker's own measured speed: it schedules its steps in a
	 * secure time budget, and is never sent (secure aggregation) */
	double speed; /* smoothed local steps per second; has_speed */
	bool has_speed;
	fb_train_eval eval;   /* the global model's federated evaluation;
	                       * written by the trainer thread */
	bool eval_warned;     /* the model cannot evaluate: said once */
	/* the current round */
	uint32_t round;
	uint64_t steps;
	bool own_budget; /* steps fitted to a secure time budget here */
	uint32_t batch;
	float lr, momentum, weight_decay, prox_mu;
	bool fednova;
	double a_norm;
	uint64_t seed;
	bool synthetic;
	bool eval_only; /* this round evaluates only: a zero update */
	uint32_t chunk_count;
	uint32_t first_chunk; /* the update goes up from this chunk on */
	uint32_t next_chunk;  /* next model chunk expected */
	uint32_t next_fetch;  /* next model chunk to request */
	/* secure mode: model chunks received and not yet checked, positions
	 * dl_first .. dl_first + dl_n - 1, their ciphertexts in dl_slots
	 * (dl_cap slots of dl_stride bytes), checked and decrypted together
	 * on the pool */
	uint8_t *dl_slots;
	size_t dl_stride;
	uint32_t dl_cap, dl_first, dl_n;
	size_t dl_len[FB_WK_BATCH_MAX];
	/* secure mode */
	bool secure;
	fb_identity *self;
	fb_pubkey coord_pk;
	fb_handshake *hs; /* a handshake waiting for its reply */
	bool cookie_wait; /* a cookie request is out (secure, joining) */
	fb_session *sess;
	fb_stream_pull *mpull; /* this round's model stream */
	fb_blob model_trailer;
	/* secure mode: encrypted update chunks, FB_WK_BATCH_MAX slots of
	 * fb_wk_ct_stride() bytes in each of two buffers used in turn, sent
	 * from there without a copy (worker/upload.c) */
	fb_lent *send_ct[2];
	/* secure aggregation of the current round */
	fb_wk_sa_phase sa_phase;
	fb_secagg_worker *sa; /* NULL: none this round */
	/* The secure-aggregation session: the c key pair and the verified
	 * peers' signatures with their agreements, for the process's life
	 * (crypto.h, "Key lifetimes"); every instance borrows it. */
	fb_secagg_keys *sa_keys;
	uint32_t sa_round; /* the round w->sa belongs to */
	/* secure async: the instances of earlier tasks whose masked input
	 * went up, held for their cohort's unmasking while the next task
	 * runs (oldest replaced first) */
	fb_wk_sa_state sa_held[FB_WK_SA_HELD];
	uint32_t sa_held_next;
	bool sa_swapped; /* a held instance is in w->sa for a moment */
	fb_wk_sa_ahead ahead; /* the next round's, set up ahead */
	bool in_ahead;   /* the ahead instance is in w->sa for a moment */
	uint32_t sa_n;
	uint32_t sa_again;       /* times asked for the masked input again */
	uint32_t sa_t;    /* the round's threshold */
	double sa_weight; /* samples / max_samples, times the staleness
	                   * weight of its first credit (secure async) */
	uint64_t sa_max_samples; /* the round's max_samples (> 0) */
	uint32_t sa_max_staleness; /* the most a credit may say (async) */
	fb_secagg_encodings enc;
	uint32_t *encbuf; /* one encoded (then masked) chunk */
	struct fb_pool *pool; /* the box's cores, for the masks (may be NULL) */
	struct fb_wk_masker *mk; /* makes masked inputs ahead (upload.c) */
	struct fb_wk_premask *premask; /* the mask made ahead (premask.c) */
	bool premask_noted; /* auto said once why it does not make them */
	fb_pubkey *peers; /* security.peers: the keys we accept, or NULL */
	uint32_t peer_count;
	/* what goes out */
	fb_wk_out outbox[FB_WK_OUTBOX_MAX];
	uint32_t out_head, out_count;
	fb_wk_upload up;
	/* rate-limited warnings */
	fb_wk_note note_plain;  /* plain messages ignored in a secure session */
	fb_wk_note note_sealed; /* sealed messages that do not open */
};

/* ---- worker.c: lifecycle, events, sending ------------------------------ */

/*
 * fb_wk_init prepares `w` for `cfg` with operations `io` (both borrowed;
 * they must outlive w). It allocates nothing; fb_wk_fini is safe after it.
 */
void fb_wk_init(fb_wk *w, const fb_worker_config *cfg, const fb_wk_io *io);

/* fb_wk_fini stops the trainer (io->train_stop) and frees all w owns. */
void fb_wk_fini(fb_wk *w);

/* fb_wk_start begins joining at `now` (handshake or hello). */
void fb_wk_start(fb_wk *w, int64_t now);

/*
 * fb_wk_on_frame handles one frame from the coordinator, as the link
 * returned it (sealed frames are opened here, in place). The frame's
 * payload may be wiped or decrypted in place. A Redirect relinks, after
 * which `f` is gone. Returns FB_OK to go on, FB_ECLOSED when the
 * coordinator ended the run, or the reason to stop: FB_EAUTH (refused),
 * FB_ECONFIG (our config cannot serve its model), FB_ENOTSUP, FB_EPROTO,
 * FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_wk_on_frame(fb_wk *w, fb_frame *f, int64_t now);

/*
 * fb_wk_on_link takes the link's connection state at `now`: `up`, and
 * `gen`, the count of connections that came up (fb_link_conn_gen). An
 * admitted worker whose connection went down or was replaced joins again
 * (what was in flight is lost, and the coordinator drops a closed
 * connection's worker); a joining one sends its join message as soon as
 * a connection is up.
 */
void fb_wk_on_link(fb_wk *w, bool up, uint32_t gen, int64_t now);

/* fb_wk_on_bad_frame notes a frame the link could not decode (`why`). */
void fb_wk_on_bad_frame(fb_wk *w, const char *why, int64_t now);

/* fb_wk_wants_out says whether w has something to send now (outbox, model
 * requests, update chunks): the loop then waits for room too. */
bool fb_wk_wants_out(const fb_wk *w);

/* fb_wk_on_writable sends what waits, while the link takes it. */
void fb_wk_on_writable(fb_wk *w, int64_t now);

/*
 * fb_wk_tick runs the timers at `now`: join retries (backoff from 1 s
 * doubling to 30 s, each drawn from the upper half of its interval), lanes
 * that do not answer, heartbeats, and the coordinator's liveness and full
 * queue (reconnect), which count bytes the connection moved (io->traffic)
 * as well as messages. Returns FB_ETIMEDOUT when no coordinator answered
 * for transport.connect_timeout (never when it is forever), else FB_OK.
 */
FB_MUST_CHECK fb_err fb_wk_tick(fb_wk *w, int64_t now);

/*
 * fb_wk_send_now hands `m` to io->send at once (sealed when w has a
 * session and `m` is not a handshake), keeping the clocks: FB_OK, FB_EAGAIN
 * (queue full: not sent), or the link's error (logged).
 */
FB_MUST_CHECK fb_err fb_wk_send_now(fb_wk *w, const fb_msg *m,
    const void *payload, size_t len, fb_lent *origin);

/*
 * fb_wk_send_ctl sends a control message in order with those waiting: now
 * when the outbox is empty and the link takes it, else queued (the payload
 * is copied). Errors: FB_ENOMEM, FB_EAGAIN (the outbox is full: dropped,
 * logged), the link's.
 */
FB_MUST_CHECK fb_err fb_wk_send_ctl(
    fb_wk *w, const fb_msg *m, const void *payload, size_t len);

/* fb_wk_msg_round is the round a message is sealed for: its own for one
 * about a round (one that waited in the outbox may be of the last round),
 * else the current one. */
uint32_t fb_wk_msg_round(const fb_wk *w, const fb_msg *m);

/* fb_wk_outbox_clear drops what waits in the outbox (a new link). */
void fb_wk_outbox_clear(fb_wk *w);

/* fb_wk_note writes a warning unless one of `n` went out in the last
 * FB_WK_NOTE_EVERY_MS; the next one says how many were held back. */
void fb_wk_note_warn(fb_wk *w, fb_wk_note *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* This worker's sample count: its data's, or data.none_samples. */
uint64_t fb_wk_samples(const fb_wk *w);

/* ---- join.c ------------------------------------------------------------ */

/* fb_wk_load_keys reads security.key, the pinned coordinator key and
 * security.peers. Errors: FB_ECONFIG (logged), FB_ENOMEM. */
FB_MUST_CHECK fb_err fb_wk_load_keys(fb_wk *w);

/* fb_wk_new_session draws a fresh hello session id. */
void fb_wk_new_session(fb_wk *w);

/* fb_wk_join (re)starts joining on the current link: a fresh handshake in
 * secure mode (the old session goes), else a hello. */
void fb_wk_join(fb_wk *w);

/* fb_wk_send_hello and fb_wk_send_handshake send the join messages (a full
 * queue, or no connection, skips them: they go when the link has room or
 * at the next retry). */
void fb_wk_send_hello(fb_wk *w);
void fb_wk_send_handshake(fb_wk *w);

/* fb_wk_join_resend sends the join message the worker is at (handshake
 * or hello); fb_wk_join_backoff sets when it goes next (now plus the
 * upper half of the interval, at random) and doubles the interval. */
void fb_wk_join_resend(fb_wk *w);
void fb_wk_join_backoff(fb_wk *w);

/* fb_wk_move_link goes to `endpoint` as lane `lane` and joins there; on
 * failure the worker stays where it is. */
void fb_wk_move_link(fb_wk *w, const char *endpoint, uint32_t lane);

/* fb_wk_rejoin leaves the run (the coordinator is gone or stuck: `why`)
 * and joins again, on the listen port; with `new_link` on a new link (a
 * connection on which nothing moved for a while may be dead, say across
 * a partition, and TCP would retry on it ever more slowly). */
void fb_wk_rejoin(fb_wk *w, const char *why, bool new_link);

void fb_wk_on_handshake_reply(fb_wk *w, const fb_msg *m);
void fb_wk_on_redirect(fb_wk *w, const fb_msg *m);

/* fb_wk_on_welcome admits us, or refuses the run when our model's layout
 * differs from the one in f's payload (errors as fb_wk_on_frame). */
FB_MUST_CHECK fb_err fb_wk_on_welcome(fb_wk *w, const fb_frame *f);

/* ---- round.c ----------------------------------------------------------- */

void fb_wk_on_round_start(fb_wk *w, const fb_msg *m);
void fb_wk_on_model_chunk(fb_wk *w, const fb_frame *f);
void fb_wk_on_round_cancel(fb_wk *w, const fb_msg *m);

/* fb_wk_on_trained takes the trainer's result (w->train_rc, w->stats,
 * w->local) and sends the update, or waits for the masks. */
void fb_wk_on_trained(fb_wk *w, int64_t now);

/* fb_wk_round_leave ends w's part in the current round: the trainer is
 * stopped, the upload and secure aggregation dropped; phase idle. */
void fb_wk_round_leave(fb_wk *w);

/*
 * fb_wk_round_fail leaves the round (fb_wk_round_leave) and tells the
 * coordinator, in a RoundFailed for `round`, that this worker cannot
 * deliver its update and why (`why`, e.g. the error the failure logged;
 * control characters become spaces, cut to fit), so that the round goes on
 * without it at once instead of at its deadline. Best effort: a message
 * that cannot go out is logged and dropped.
 */
void fb_wk_round_fail(fb_wk *w, uint32_t round, const char *why);

/* fb_wk_fetch_more requests model chunks while the window and the link
 * allow. Errors: the link's but FB_EAGAIN (retried on room). */
FB_MUST_CHECK fb_err fb_wk_fetch_more(fb_wk *w);

/* fb_wk_fetch_pending says whether a model request waits for room. */
bool fb_wk_fetch_pending(const fb_wk *w);

/* The real trainer thread (the loop's io): start, cancel and join, and
 * reap after its eventfd fired. */
FB_MUST_CHECK fb_err fb_wk_thread_start(fb_wk *w);
/* fb_wk_update_form turns the trained parameters in w->local into the
 * update, w->global - w->local (FedNova: normalised, w->a_norm set); the
 * trainer thread calls it after training. Errors: FB_ERANGE. */
fb_err fb_wk_update_form(fb_wk *w);
void fb_wk_thread_stop(fb_wk *w);
bool fb_wk_thread_reap(fb_wk *w); /* true: it had run and is joined */

/* fb_wk_load_shard loads this box's part of the data set. Errors: the data
 * module's (logged). */
FB_MUST_CHECK fb_err fb_wk_load_shard(fb_wk *w);

/* ---- upload.c ---------------------------------------------------------- */

/*
 * fb_wk_upload_start prepares the update in w->local (made by round.c) for
 * sending with the given training facts; it goes out from
 * fb_wk_upload_pump. Phase uploading. Errors: crypto's (stream set-up).
 */
FB_MUST_CHECK fb_err fb_wk_upload_start(
    fb_wk *w, double seconds, double loss, uint64_t steps);

/* fb_wk_upload_wants says whether the upload has something it may send now
 * (UpdateBegin, a chunk it has credit for, or UpdateEnd). */
bool fb_wk_upload_wants(const fb_wk *w);

/* fb_wk_on_credit takes an UpdateCredit: more chunks of this round's
 * update may go (a credit for another round, or more than the update has
 * left, is ignored or cut to what is left). */
void fb_wk_on_credit(fb_wk *w, const fb_msg *m);

/* fb_wk_upload_pump sends up to `budget` chunks while the link takes them;
 * at the end the phase is idle. A send error abandons the update. */
void fb_wk_upload_pump(fb_wk *w, uint32_t budget);

/*
 * fb_wk_mask_wait waits for the batch of masked inputs the masker thread
 * is making ahead, if any: call it before w->local, w->sa or the update's
 * state change. fb_wk_mask_stop ends the masker thread (fb_wk_fini).
 */
void fb_wk_mask_wait(fb_wk *w);
void fb_wk_mask_stop(fb_wk *w);

/* fb_wk_ct_stride is the bytes of one encrypted chunk's slot (a chunk and
 * its overhead, 64-byte aligned): the update's send buffers, the model's
 * download slots. */
static inline size_t
fb_wk_ct_stride(const fb_wk *w)
{
	return ((size_t)w->chunk_bytes + FB_STREAM_CHUNK_OVERHEAD + 63) &
	       ~(size_t)63;
}

/* fb_wk_upload_drop forgets the update being sent (nothing more of it
 * goes out). */
void fb_wk_upload_drop(fb_wk *w);

/* ---- premask.c --------------------------------------------------------- */

/*
 * fb_wk_premask_start starts expanding this round's whole mask (w->sa,
 * its masks fixed) on the pool, in upload order, in the background, when
 * security.secagg_masks_ahead allows; fb_wk_premask_stop stops it and
 * waits for the batch in progress (what was made stays usable);
 * fb_wk_premask_drop also forgets and wipes it (before w->sa changes);
 * fb_wk_premask_free releases it all (before the pool goes). Loop thread.
 */
void fb_wk_premask_start(fb_wk *w);
void fb_wk_premask_stop(fb_wk *w);
void fb_wk_premask_drop(fb_wk *w);
/* fb_wk_premask_drop_sa is fb_wk_premask_drop for instance `sa`. */
void fb_wk_premask_drop_sa(fb_wk *w, const fb_secagg_worker *sa);
void fb_wk_premask_free(fb_wk *w);

/*
 * fb_wk_premask_get returns the mask made ahead for elements off ..
 * off + count of w->sa's input when that whole chunk was made (exactly
 * an upload chunk's span), else NULL. Any thread, while w->sa stays.
 */
const uint32_t *fb_wk_premask_get(const fb_wk *w, uint64_t off,
    uint64_t count);
/* fb_wk_premask_made counts the chunks of w->sa's mask made so far. */
uint32_t fb_wk_premask_made(const fb_wk *w);

/* ---- secagg.c ---------------------------------------------------------- */

/* fb_wk_sa_start joins the round's secure aggregation and sends our advert
 * (through the outbox). Errors: FB_ENOTSUP, FB_EPROTO, FB_ERANGE,
 * FB_ENOMEM, crypto's (all logged). */
FB_MUST_CHECK fb_err fb_wk_sa_start(fb_wk *w, const fb_msg *m);

/* fb_wk_sa_end wipes this round's secure-aggregation secrets. */
void fb_wk_sa_end(fb_wk *w);
/* fb_wk_sa_hold keeps w->sa, whose masked input went up, for its
 * cohort's unmasking (secure async: a new task begins meanwhile). */
void fb_wk_sa_hold(fb_wk *w);
/* fb_wk_sa_held_free wipes every held instance. */
void fb_wk_sa_held_free(fb_wk *w);
/* fb_wk_sa_ahead_free wipes the next round's instance set up ahead. */
void fb_wk_sa_ahead_free(fb_wk *w);
/* fb_wk_sa_ahead_check, at a RoundStart: an instance set up ahead for
 * this round or an earlier one that the RoundStart does not take is
 * dropped. */
void fb_wk_sa_ahead_check(fb_wk *w, const fb_msg *rs);
/* fb_wk_sa_ahead_premask: the current round's update is up, so the
 * mask of the round set up ahead (its shares in) is made now. */
void fb_wk_sa_ahead_premask(fb_wk *w);

void fb_wk_on_secagg(fb_wk *w, const fb_frame *f);

/*
 * fb_wk_evaluate evaluates the round's global model (w->global) on the
 * box's validation data (data.valid) into w->eval, for the native
 * trainers; a worker without validation data, or whose model cannot
 * evaluate (said once), gets w->eval.examples = 0. Runs on the trainer
 * thread; never fails the round.
 */
void fb_wk_evaluate(fb_wk *w);

/* fb_wk_eval_to_begin writes w->eval into a plain UpdateBegin `m`. */
void fb_wk_eval_to_begin(const fb_wk *w, fb_msg *m);

/* fb_wk_sa_eval gives w->eval as the masked input's evaluation
 * coordinates (v = examples / max_samples; v = 0 when there is none, or
 * when the count is above max_samples, said in the log). */
void fb_wk_sa_eval(const fb_wk *w, fb_secagg_eval *ev);

/*
 * fb_wk_sa_encode_chunk turns elements off..off+count of `x` (or at off =
 * P the extra coordinates) into this worker's masked input in `out`,
 * writing the debug dumps when open. Errors: the encoder's and mask's.
 */
FB_MUST_CHECK fb_err fb_wk_sa_encode_chunk(fb_wk *w, const float *x,
    uint64_t off, uint64_t count, double loss, uint64_t *clipped,
    FILE *enc_dump, FILE *mask_dump, uint32_t *out);

#endif
