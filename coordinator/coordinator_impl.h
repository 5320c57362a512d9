/* SPDX-License-Identifier: Apache-2.0 */
/*
 * coordinator_impl.h -- the coordinator's private state, shared by its
 * files (never included outside coordinator/ and its unit tests).
 *
 *   loop.c       the one event loop: socket, ingest results, job
 *                completions and timers as events; authentication
 *   registry.c   the roster: handshakes, hellos, allowlist, lanes,
 *                liveness, heartbeats
 *   guard.c      drop reasons, their logs and counts, per-peer rate limit
 *   round.c      the round's phase machine: select, schedule, close
 *   broadcast.c  the model under the round key; ModelFetch serving
 *   upload.c     update streams: checks, the ingest pool's results
 *   secagg.c     SecAgg+: adverts, share relay, reveals
 *   jobs.c       the job thread: encryption, unmasking and the commit,
 *                off the loop, on every core
 *   outputs.c    metrics.jsonl, model.safetensors, the round line
 *   wirelog.c    debug.wire_log: what the workers sent, for tests
 *   coordinator.c  init, fini, fb_coordinator_run
 *
 * Threads: the loop thread owns everything here, except what a job reads
 * and writes while it runs (job.h's list per job kind), the ingest pool's
 * adds into the accumulator, and the link's zero-copy sends (fb_lent).
 * Every transition of the round takes `now` (ms on the coordinator's
 * clock) as an argument, so a test drives the machine with a fake clock
 * and fake sends (coord_io) and no sockets: tests/unit/round_test.c.
 */
#ifndef FB_COORDINATOR_COORDINATOR_IMPL_H
#define FB_COORDINATOR_COORDINATOR_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "aggregation/aggregation.h"
#include "common/pool.h"
#include "common/util.h"
#include "coordinator/coordinator.h"
#include "coordinator/ingest.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"
#include "proto/proto.h"

/* Ids that must not be mixed up. A worker slot indexes coord.workers (in
 * secure mode it is also the allowlist entry and the sender id); a SecAgg
 * slot indexes one round's participants. */
typedef struct { uint32_t v; } wslot;
typedef struct { uint32_t v; } sa_slot;

typedef enum worker_state {
	W_IDLE = 0,  /* admitted, not in the current round */
	W_TRAINING,  /* RoundStart sent; fetching or training */
	W_UPLOADING, /* UpdateBegin accepted, chunks arriving */
	W_DONE,      /* complete update added */
	W_FAILED,    /* lost, cancelled or rejected this round */
	W_STATE_COUNT_
} worker_state;

extern const char *const worker_state_names[W_STATE_COUNT_];

/*
 * The round's phases. A round runs IDLE -> [PREPARE] -> TRAIN ->
 * [OVERTIME] -> [UNMASK] -> AGGREGATE -> RECORD, then IDLE for the next
 * or DONE. PREPARE only with security (the model is encrypted once for
 * the round); UNMASK only with secure aggregation. A round that cannot
 * commit skips to RECORD with its reason.
 */
typedef enum round_phase {
	PHASE_IDLE = 0, /* between rounds: waiting for round.min_workers */
	PHASE_PREPARE,  /* job: the model encrypted under the round key */
	PHASE_TRAIN,    /* RoundStart out: fetch, train, upload (and the
	                 * SecAgg setup alongside, sa.phase) */
	PHASE_OVERTIME, /* past the deadline: stragglers waited for, or
	                 * masked uploads under way let finish */
	PHASE_UNMASK,   /* SecAgg: reveals asked for, up to unmask_timeout */
	PHASE_AGGREGATE, /* job: unmask, checks, server step, evaluation,
	                  * model file */
	PHASE_RECORD,   /* job: the round's metrics line */
	PHASE_DONE,     /* every round ran, or the run stops */
	PHASE_COUNT_
} round_phase;

extern const char *const round_phase_names[PHASE_COUNT_];

typedef enum round_status {
	ROUND_OK = 0,
	ROUND_FAILED,  /* too few updates, or the model step refused */
	ROUND_ABORTED, /* secure aggregation could not finish */
	ROUND_STATUS_COUNT_
} round_status;

extern const char *const round_status_names[ROUND_STATUS_COUNT_];

/* Reasons a message is dropped, counted per round in metrics.jsonl. */
typedef enum drop_reason {
	DROP_MALFORMED = 0,
	DROP_UNKNOWN_PEER,
	DROP_STALE_ROUND,
	DROP_UNEXPECTED,
	DROP_OUT_OF_ORDER,
	DROP_WRONG_SIZE,
	DROP_NONFINITE,
	DROP_VERSION,
	DROP_UNKNOWN_KEY,
	DROP_BAD_SIGNATURE,
	DROP_BAD_MAC,
	DROP_REPLAY,
	DROP_WRONG_RUN,
	DROP_WRONG_SENDER,
	DROP_TRUNCATED,
	DROP_IDENTITY,
	DROP_INSECURE,
	DROP_RATE_LIMITED,
	DROP_REASON_COUNT_
} drop_reason;

extern const char *const drop_names[DROP_REASON_COUNT_];

typedef struct worker {
	bool used;
	bool welcomed;           /* its hello was taken */
	fb_peer peer;
	uint32_t id;             /* secure: allowlist index; plain: a count */
	char name[FB_NAME_MAX];
	char hello_name[FB_NAME_MAX]; /* the name in its last hello */
	uint32_t index;          /* its data.index */
	uint32_t partitions;     /* the index's data.workers; 0: own data */
	uint64_t num_samples;    /* plain mode only; 0 under SecAgg */
	uint64_t session;
	char backend[FB_TEXT_MAX];
	int64_t last_seen_ms;
	int64_t full_since_ms;   /* its send queue was found full; 0: not */
	fb_conn conn;            /* the connection its last message came on */
	fb_traffic seen;         /* that connection's byte counts, last look */
	int64_t traffic_ms;      /* when they were looked at */
	int64_t rx_moved_ms;     /* bytes from it last arrived */
	int64_t tx_moved_ms;     /* bytes to it were last acknowledged */
	fb_session *sess;        /* secure: current session, NULL until one */
	fb_session *pending;     /* secure: newer handshake, taken on use */
	fb_session *prev;        /* secure: the session a newer one took over
	                          * from, kept a liveness timeout: still used
	                          * from its connection, two processes share
	                          * the key (loop.c) */
	fb_peer prev_peer;
	int64_t prev_until_ms;
	/* this round */
	worker_state state;
	const char *fail_reason; /* static text, or fail_text */
	char fail_text[FB_TEXT_MAX + 32]; /* a reason the worker sent */
	double weight;           /* plain FedAvg weight */
	uint64_t assigned_steps;
	uint32_t first_chunk;    /* where its upload starts (RoundStart) */
	uint32_t next_chunk;     /* chunks of its upload received so far */
	uint32_t credit;         /* chunks it may send now (granted, not yet
	                          * received) */
	uint32_t credited;       /* chunks granted for this upload in all */
	bool credit_queued;      /* in credits.queue */
	bool again;              /* W_UPLOADING: asked to send its masked
	                          * input again, its new UpdateBegin not yet
	                          * here (what comes of the old stream is
	                          * dropped) */
	uint64_t steps;
	double train_loss;
	double train_seconds;
	uint64_t ingest_gen;     /* its update's stream number in the pool */
	double begin_s;          /* when its update began (fb_now_s) */
	bool final_seen;         /* the update's trailer was queued */
	int64_t done_ms;         /* when its update completed */
	double a_norm;           /* plain FedNova ||a_i||_1 */
	/* plain rounds: its federated evaluation, from UpdateBegin */
	uint64_t eval_examples;  /* 0: none */
	double eval_loss, eval_accuracy;
	uint32_t eval_metric_count;
	char eval_name[FB_WIRE_METRICS_MAX][FB_WIRE_METRIC_NAME];
	double eval_metric[FB_WIRE_METRICS_MAX];
	uint32_t sa_slot;        /* SecAgg: its slot in the round */
	uint32_t ahead_slot;     /* its slot in c->sa_ahead, when a member */
	/* round.mode: async */
	uint32_t task_round;     /* the round number of its task's RoundStart */
	uint32_t task_version;   /* the model version (rd.committed) it
	                          * trains from */
	uint32_t staleness;      /* steps since task_version, at its begin */
	uint64_t task_seed;      /* its batch order's seed */
	/* heterogeneity */
	double speed;            /* smoothed local steps per second */
	bool has_speed;
	double round_speed;      /* this round's steps per second */
	/* secure async (cohort.c): its tasks' time from RoundStart sent to
	 * its masked input begun, smoothed; plain metadata the coordinator
	 * sees (when it gave the task, when the upload began), not the
	 * worker's speed, which it keeps */
	int64_t task_sent_ms;    /* its current task was sent; 0: none */
	double task_ms;          /* smoothed; valid when has_task_ms */
	bool has_task_ms;
} worker;

/* Secure aggregation (SecAgg+, crypto.h) of one round. */
#define SA_EXTRA FB_SECAGG_EXTRA /* weight, weight*loss, weight*a */

typedef enum sa_phase {
	SA_OFF = 0,
	SA_ADVERTS, /* collecting key adverts */
	SA_SHARES,  /* collecting share batches */
	SA_INPUT,   /* shares relayed: masked inputs may stream in */
	SA_CONFIRM, /* the included set sent: its confirmations come in */
	SA_UNMASK,  /* confirmations relayed: reveals come in */
	SA_PHASE_COUNT_
} sa_phase;

extern const char *const sa_phase_names[SA_PHASE_COUNT_];

#define SA_F_ADV 1u
#define SA_F_SHARED 2u
#define SA_F_INCLUDED 4u
#define SA_F_REVEALED 8u
#define SA_F_CONFIRMED 16u /* signed the included set (U4) */
#define SA_F_REFUSED 32u   /* said it will not reveal */
#define SA_F_DISCARDED 64u /* its confirmation did not verify */
#define SA_F_OUT 128u      /* set up ahead: left the setup (secagg.c) */

typedef struct sa_round {
	sa_phase phase;
	int64_t phase_end_ms;
	fb_secagg_params p;
	fb_secagg_server *srv;
	uint32_t n, k, t;
	uint32_t *slot_worker;  /* SecAgg slot -> worker slot */
	uint8_t *flags;         /* per SecAgg slot, SA_F_* */
	uint8_t *adv;           /* per SecAgg slot, its advert */
	uint8_t *shares;        /* per SecAgg slot, its sealed shares */
	uint32_t *share_len;    /* bytes in each batch */
	uint8_t *confirm;       /* per SecAgg slot, its confirmation of U3 */
	uint32_t extra[SA_EXTRA]; /* coord.extra_mu: the pool adds here */
	fb_secagg_encodings enc;
	const char *poisoned;   /* why the sum is unusable, or NULL */
	/* secure_aggregation.setup_ahead: the next round's instance, set up
	 * while the current one runs; each slot's worker id and session
	 * (hello's: a new one for each process and rejoin) when given */
	bool ahead;
	uint32_t *slot_id;
	uint64_t *slot_session;
} sa_round;

/*
 * Upload credits: after UpdateBegin a worker sends an update chunk only
 * with a credit (UpdateCredit), granted from one budget for all workers
 * (transport.upload_window), so what uploads hold in the coordinator's
 * queues does not grow with the worker count. A worker holds at most
 * per_worker (transport.upload_credits) at once and is topped up when it
 * is down to half; the workers waiting are served in turn.
 */
typedef struct credits {
	uint32_t budget;  /* chunks in flight at most, all workers (>= 1) */
	uint32_t per_worker; /* chunks in flight at most, one worker (>= 1) */
	uint32_t out;     /* granted and not yet received */
	uint32_t peak;    /* the most out at once since the start */
	uint32_t *queue;  /* slots of workers waiting for credit (a ring) */
	uint32_t head, count, cap;
} credits;

/* What the ingest pool's callback needs to add one worker's update; set
 * when the update begins, unchanged while the pool holds its chunks. */
typedef struct ingest_arg {
	double weight; /* plain FedAvg weight */
	bool masked;   /* secure aggregation: ring elements, mod 2^32 */
	/* masked: the stream is kept apart in partials.buf[partial] (set by
	 * the loop before its first chunk is queued; -1 none yet) and added
	 * into the sum once whole, from first_chunk on */
	int32_t partial;
	uint32_t first_chunk;
	uint32_t sa_slot;  /* its SecAgg slot */
	uint32_t cohort;   /* secure async: its cohort's id (0: none) */
	fb_accum *accum;   /* the sum it adds into (c->accum, or its
	                    * cohort's) */
	uint32_t *extra;   /* masked: the extras' sum (its sa_round's) */
	uint64_t gen;      /* its stream number (fb_ingest_begin) */
	/* masked, straight into the sum (max_uploads 0): the sum's epoch it
	 * adds into (partials.epoch at its begin) and its chunks added */
	uint32_t epoch;
	atomic_uint added;
} ingest_arg;

/*
 * Masked uploads kept apart until whole: a masked input cut off midway
 * never reaches the sum (a part of one could not be unmasked without
 * exposing it), so its worker is a dropout like any other. At most
 * `count` are under way (secure_aggregation.max_uploads); each buffer
 * holds param_count + SA_EXTRA ring elements, made when first needed and
 * kept for the next rounds. `busy` is set by the loop when it gives a
 * buffer to a stream and cleared by the ingest pool's end callback.
 */
typedef struct partial_flag {
	atomic_bool v;
} partial_flag;

typedef struct partials {
	uint32_t count;          /* 0: masked inputs go straight into the sum */
	uint32_t **buf;
	partial_flag *busy;
	/* count 0: a masked stream that ends incomplete after some of its
	 * chunks went into the sum sets `cut` (the ingest pool's end
	 * callback); the loop then starts the sum again (upload_sum_check):
	 * a new epoch, and every masked input in it or under way sent again.
	 * Streams of an older epoch no longer count. */
	atomic_uint epoch;
	atomic_bool cut;
	bool warned;       /* out of memory for a buffer, logged */
} partials;

/* Peers sending bad messages fast are ignored for a while, so that a
 * flood costs one table lookup per message, not a decode or a MAC. */
#define RL_SLOTS 256
#define RL_WINDOW_MS 1000
#define RL_MAX_BAD 20 /* bad messages per window before blocking */
#define RL_BLOCK_MS 10000

typedef struct rl_entry {
	fb_peer peer;
	int64_t window_ms;
	uint32_t bad;
	int64_t blocked_until_ms;
} rl_entry;

typedef struct guard {
	uint64_t drops[DROP_REASON_COUNT_];          /* since the start */
	uint64_t drops_reported[DROP_REASON_COUNT_]; /* up to the last line */
	int64_t logged_ms[DROP_REASON_COUNT_];
	uint64_t unlogged[DROP_REASON_COUNT_];
	const fb_peer *cur_peer; /* sender of the message being handled */
	rl_entry rl[RL_SLOTS];
} guard;

#define HELLO_CACHE 4096 /* remembered hello cookies (replays) */
#define HS_COOKIE_MS 30000 /* a handshake cookie's life */
#define LANE_SEEN 256    /* remembered lane choices (retried hellos) */

typedef struct registry {
	worker *workers;
	uint32_t cap;            /* slots: allowlist size, or max_workers */
	uint32_t next_id;
	uint32_t last_found;     /* find_peer's last hit */
	int64_t last_scan_ms;    /* liveness scan */
	int64_t last_heartbeat_ms;
	/* secure mode */
	fb_pubkey *allow;        /* allowlist keys; slot i = entry i */
	char (*allow_names)[FB_NAME_MAX];
	uint32_t allow_count;
	uint8_t (*hello_nonces)[32]; /* the cookies of hellos taken */
	uint32_t hello_next;
	/* random per process: a hello recorded before a restart carries a
	 * cookie under another key, and is refused */
	uint8_t cookie_key[FB_HS_COOKIE_KEY_LEN];
	/* lanes: the choice made for recent connections on the listen port */
	uint32_t lanes;
	uint32_t lane_next;
	struct {
		fb_peer peer;
		uint32_t lane;
	} lane_seen[LANE_SEEN];
	uint32_t lane_seen_next;
} registry;

/*
 * transport.model_cache seal_on_fetch: a sealed chunk's buffer. The loop
 * owns it but while it is SEALING (a seal thread writes it) and while
 * ZeroMQ holds it (SENT, until fb_lent_idle).
 */
typedef enum seal_state {
	SEAL_FREE = 0,
	SEAL_SEALING,            /* queued for, or on, a seal thread */
	SEAL_SENT,               /* handed to the link; free once idle */
} seal_state;

typedef struct seal_buf {
	fb_lent *lent;           /* stride bytes; NULL until first used */
	uint32_t worker;         /* reg.workers index */
	uint32_t round;          /* the key's round it is sealed for */
	uint32_t epoch;          /* bc.epoch when it was queued */
	uint32_t chunk;
	uint32_t len;            /* ciphertext bytes, once sealed */
	int rc;                  /* the seal's result (fb_err) */
	seal_state state;
	bool sealed;             /* loop's view: back from the thread */
	uint32_t next;           /* todo / done list (under bc.mu) */
	uint32_t wnext;          /* its worker's queue or sent list */
} seal_buf;

#define SEAL_NONE UINT32_MAX

/* A worker's fetches under seal_on_fetch (loop only). Chunks requested
 * and not yet sealed are a run [want, want_end): a worker asks for its
 * chunks in order. */
typedef struct fetcher {
	uint32_t round;          /* of the run requested */
	uint32_t want, want_end;
	uint32_t held;           /* its buffers: sealing, sealed or sent */
	uint32_t q_head, q_tail; /* sealing or sealed, in request order */
	uint32_t s_head, s_tail; /* sent, in order: ZeroMQ frees them so */
	bool ready;              /* in bc.ready */
} fetcher;

/*
 * The global model as sent this round: plain, or under the round key.
 * keep: encrypted once into `data`, which every worker fetches.
 * on_fetch: the encryption only hashes the chunks for the signed trailer;
 * each chunk is sealed again when it is fetched, into one of `bufs`, on
 * the seal threads, and sent from there without a copy.
 */
typedef struct broadcast {
	uint8_t *data;           /* keep: ciphertext, fb_lent_data(lent) */
	fb_lent *lent;           /* sent from without a copy */
	uint64_t stride;         /* bytes per chunk slot in data */
	uint32_t *len;           /* ciphertext bytes of each chunk */
	uint8_t (*hash)[FB_STREAM_HASH_LEN]; /* per chunk, for the digest */
	uint8_t key[FB_STREAM_KEY_LEN];
	uint8_t header[FB_STREAM_HEADER_LEN];
	uint8_t trailer[FB_STREAM_TRAILER_LEN];
	/* seal_on_fetch */
	bool on_fetch;
	fb_stream_push *push;    /* the round key's stream, kept to seal */
	const float *src;        /* the model the key's round sends */
	uint32_t round;          /* whose key push holds; 0: none */
	uint32_t epoch;          /* broadcast_open calls: a new key each */
	bool frozen;             /* no seal may start: the model or the key
	                          * is about to change */
	seal_buf *bufs;
	uint32_t nbufs;          /* fetch_memory / stride, 1 to 1024 */
	uint32_t free_head;      /* free list (loop), through `next` */
	uint32_t share;          /* most buffers one worker holds */
	fetcher *fw;             /* per reg slot */
	uint32_t *ready;         /* ring of workers with chunks to seal */
	uint32_t ready_head, ready_count;
	bool released;           /* a sent chunk may have been let go of
	                          * since the sent lists were looked at */
	/* the seal threads; under mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;       /* work, or stop */
	pthread_cond_t idle_cv;  /* a seal finished */
	uint32_t todo_head, todo_tail, done_head, done_tail;
	uint32_t running;        /* seals on a thread now */
	bool stop;
	pthread_t *threads;
	uint32_t nthreads;       /* 0: sealed on the loop (tests) */
	int efd;                 /* a seal is done; -1: none */
	bool mu_init;
} broadcast;

/* What a round found, for its metrics line and round line. */
typedef struct round_result {
	round_status status;
	uint32_t selected;
	uint32_t participants;
	uint32_t partial;
	double test_accuracy; /* NaN when not evaluated */
	double test_loss;
	double train_loss;    /* NaN when unknown */
	double sa_a;          /* SecAgg: sum p_i a_i / sum p_i (FedNova) */
	fb_eval_mean fed_eval; /* the federated evaluation of the model the
	                        * round started from; reports 0: none */
	double seconds;
	char backend[FB_TEXT_MAX];
	bool mixed;           /* workers on different backends */
	uint32_t worker_failed; /* workers that said their round failed */
	char failed_first[FB_NAME_MAX + FB_TEXT_MAX + 40]; /* the first: who,
	                                                    * and its words */
} round_result;

/*
 * round.mode: async (async.c). Each round is one server step: its buffer
 * takes the updates that complete while it is open, whatever model version
 * each was trained from. An update's accumulator weight is
 * n_i g(s_i) / norm (fb_staleness_weight), norm fixed when the buffer
 * opens so that at most `limit` updates keep the weights' sum <= 1; the
 * step's scale comes from fb_fedbuff_weights over the entries.
 */
typedef struct async_entry {
	char name[FB_NAME_MAX];
	char backend[FB_TEXT_MAX];
	uint64_t n;              /* its sample count */
	uint32_t version;        /* the model it was trained from */
	uint32_t staleness;      /* server steps since */
	uint32_t input_staleness; /* secure async: that at its begin, which
	                           * its masked input was weighted by */
	uint64_t steps;
	double train_loss, train_seconds, speed, a_norm;
} async_entry;

typedef struct async_state {
	async_entry *buf;        /* this step's complete updates */
	uint32_t count, cap;     /* cap: buffer_size + registry slots */
	uint32_t begun;          /* updates begun into this buffer */
	uint32_t limit;          /* most updates one buffer takes: buffer_size
	                          * + the live workers at its opening */
	uint64_t n_max;          /* largest sample count at the opening */
	double norm;             /* limit * n_max */
	bool closing;            /* full or past its deadline: new begins
	                          * wait for the next buffer */
	int64_t closing_ms;
	uint64_t dropped_stale;  /* this step's updates past max_staleness */
	uint64_t superseded;     /* tasks whose model went before fetched */
	double scale;            /* the step's fb_fedbuff_weights scale */
	uint64_t tasks;          /* tasks given out since the start */
	fb_msg *deferred;        /* per slot: an UpdateBegin held back */
	uint32_t *deferred_id;   /* ... from the worker of this id */
	bool *has_deferred;
} async_state;

/*
 * round.mode async with secure aggregation (cohort.c). Each buffer is a
 * cohort: one SecAgg instance of round.buffer_size slots among the
 * workers given their tasks for it, in the order they are given them,
 * with its own sum. The coordinator learns each cohort's sum, never one
 * member's input. A cohort fills as tasks go out, is sealed when full
 * (its SecAgg setup then runs while its members train), completes when
 * its members' masked inputs are in (or at its deadline with at least
 * the threshold of them), is unmasked with its members' shares, and is
 * applied by the job as one server step, cohorts in the order they
 * complete. Its id is the round number its members' tasks carry (their
 * RoundStart, stream and SecAgg messages), distinct from the step
 * numbers; the model each task trains from goes out under the step's
 * round (RoundStart.model_round).
 */
typedef enum cohort_state {
	CO_FREE = 0,
	CO_FILLING,  /* members join as they are given tasks */
	CO_RUNNING,  /* sealed: SecAgg setup, then the masked inputs */
	CO_UNMASK,   /* inputs in: confirmations, then reveals */
	CO_READY,    /* reveals in: waits for the job */
	CO_APPLYING, /* the job unmasks it and steps the model */
	CO_STATE_COUNT_
} cohort_state;

typedef struct cohort_member {
	uint32_t slot;    /* its worker slot */
	uint32_t id;      /* that worker's id when it joined */
	uint32_t version; /* the model version (rd.committed) it trains from */
	uint32_t staleness; /* server steps since, at its upload's begin: its
	                     * input is weighted 1/sqrt(1 + staleness) by the
	                     * worker (UpdateCredit.staleness) */
	int64_t expect_ms; /* when its upload is expected to begin (0: no
	                    * measure of its tasks' time yet) */
	char name[FB_NAME_MAX];
} cohort_member;

typedef struct cohort {
	cohort_state state;
	uint32_t id;          /* the round its members' tasks carry */
	uint32_t count;       /* members so far (<= sa.n) */
	cohort_member *m;     /* sa.n = round.buffer_size entries */
	sa_round sa;
	fb_accum *accum;      /* its sum: made when first needed, kept */
	int64_t opened_ms;    /* its first member joined */
	int64_t input_ms;     /* its shares were relayed (0: not yet) */
	int64_t deadline_ms;  /* sealed: inputs by then (round.deadline) */
	int64_t closing_ms;   /* past the deadline, uploads finishing */
	uint64_t ready_seq;   /* the order it completed in */
	uint32_t stale;       /* members cancelled past max_staleness */
	uint32_t superseded;  /* members whose model went before fetched */
} cohort;

typedef struct cohorts {
	cohort *co;           /* cap entries */
	uint32_t cap;         /* registry slots + 1 */
	uint32_t next_id;     /* the next cohort's id */
	int32_t applying;     /* the cohort the step applies, -1: none */
	uint64_t seq;
	uint32_t bc_version;  /* the model version the broadcast holds */
	bool bc_ready;        /* ... and it may be served */
	uint32_t failed;      /* cohorts failed since the last step */
	uint32_t failed_total;
	int64_t last_step_ms; /* the last step applied (0: none yet) */
	double step_ms;       /* the time between steps, smoothed (0: not
	                       * known yet) */
} cohorts;

typedef struct round_state {
	round_phase phase;
	uint32_t number;         /* the round being run, 1-based */
	int64_t phase_ms;        /* when the phase began */
	int64_t idle_since_ms;   /* waiting for workers since */
	int64_t last_note_ms;    /* "waiting for workers" log */
	int64_t started_ms;      /* its first action */
	int64_t deadline_ms;
	uint32_t target_updates; /* updates that close a round early */
	bool waiting_logged;
	char why[256];           /* why it failed or aborted */
	double tau_eff;
	uint32_t in_chunks;      /* chunks of an update (+1 with SecAgg) */
	uint64_t clipped_base;   /* fb_ingest_counter at its start */
	uint64_t clipped;
	uint64_t sent0, recv0;   /* the link's counters at its start */
	uint64_t up_bytes, down_bytes;
	double first_begin_s;    /* the round's first update began; 0 */
	uint32_t sum_restarts;   /* the sum started again (partials.cut) */
	bool set_up_ahead;       /* its SecAgg setup ran in the round before */
	uint32_t ahead_tried;    /* the last round set up ahead (or tried) */
	int64_t restart_ms;      /* the last time; 0: never this round */
	round_result r;
	uint32_t *sel;           /* the selected workers' slots ... */
	uint32_t *sel_id;        /* ... and their ids at selection */
	double *sel_weight;      /* ... and plain FedAvg weights */
	uint32_t nsel;
	uint32_t *upload_round;  /* per slot: the round its last update began
	                          * in (survives the slot's reuse) */
	uint32_t committed;      /* rounds committed, resumed runs included */
	uint32_t ran;            /* rounds recorded by this process */
	uint32_t model_round;    /* the last committed round (its model) */
	bool final;              /* this round only evaluates (the run's
	                          * last, evaluation.federated_final) */
	double seconds_sum;      /* of the rounds this process recorded */
	uint64_t rejected[DROP_REASON_COUNT_]; /* in the last metrics line */
	char *resume_line;       /* --resume: the checkpoint's metrics line */
	size_t resume_line_len;
	fb_err exit_rc;          /* PHASE_DONE: what fb_coordinator_run says */
} round_state;

/* Work done off the loop (jobs.c). One job at a time. */
typedef enum job_kind {
	JOB_NONE = 0,
	JOB_ENCRYPT,   /* reads params; writes bcast */
	JOB_AGGREGATE, /* reads/writes accum, sa (srv, extra), params, opt;
	                * reads model, test */
	JOB_RECORD,    /* reads params, opt, rng, rd; writes rd.model_round,
	                * the checkpoint, the export, then appends job.line to
	                * metrics.jsonl */
	JOB_KIND_COUNT_
} job_kind;

typedef struct job {
	job_kind kind;           /* the job running or done; NONE: idle */
	bool done;               /* its result waits for the loop */
	fb_err rc;
	bool fatal;              /* the run cannot go on (files, evaluation) */
	char why[256];           /* the reason, when rc != FB_OK */
	/* AGGREGATE inputs */
	bool secure_sum;         /* unmask first */
	sa_round *sa;            /* secure_sum: the instance to unmask */
	fb_accum *accum;         /* the sum the step takes */
	double sa_scale;         /* secure_sum: the step's factor on top of
	                          * FedNova's (secure async: staleness) */
	double scale;            /* plain: tau_eff (FedNova) or 1 */
	bool evaluate;
	bool eval_only;          /* the final round: unmask, no step */
	/* AGGREGATE outputs */
	double W, loss, a;       /* SecAgg: decoded sums */
	fb_eval_mean fed_eval;   /* SecAgg: the decoded evaluation sums */
	double test_loss, test_accuracy;
	double seconds[3];       /* unmask, step, evaluate */
	/* RECORD input */
	char *line;
	size_t line_len;
	/* the thread */
	pthread_t thread;
	bool thread_live;
	bool started;            /* jobs_start ran: mu, cv and efd exist */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	int efd;                 /* readable: a job is done */
	bool inline_only;        /* tests: run jobs on the caller */
} job;

typedef struct coord coord;

/*
 * The coordinator's sends and clock. The loop's are the link's; a unit
 * test gives fakes. send_worker sends to an admitted worker (sealed with
 * its session in secure mode); send_peer sends an unsealed answer (reject,
 * redirect, handshake reply) to a connection. Both never block: FB_EAGAIN
 * means the peer's queue is full.
 */
typedef struct coord_io {
	fb_err (*send_worker)(coord *c, worker *w, const fb_msg *m,
	    const void *payload, size_t len, fb_lent *origin);
	fb_err (*send_peer)(coord *c, const fb_peer *peer, const fb_msg *m);
	uint64_t (*bytes_sent)(coord *c);
	uint64_t (*bytes_received)(coord *c);
	/* traffic: the bytes w's connection moved (fb_link_conn_traffic);
	 * an error when it cannot say. May be NULL (whole messages only). */
	fb_err (*traffic)(coord *c, worker *w, fb_traffic *t);
	void *arg;
} coord_io;

struct coord {
	const fb_coord_config *cfg;
	coord_io io;
	fb_link *link;           /* NULL in unit tests */
	volatile sig_atomic_t *stop;
	int64_t now;             /* the time of the event being handled */
	/* model and aggregation */
	fb_model *model;
	uint64_t param_count;
	uint32_t chunk_elems;
	uint32_t chunk_count;
	float *params;           /* fb_lent_data(params_lent) */
	fb_lent *params_lent;    /* plain chunks are sent from it */
	char model_desc[128];
	uint8_t *layout;         /* the model's layout, wire form: the
	                          * welcome's payload (fb_model_layout_pack) */
	size_t layout_len;
	char *preprocessing;     /* fb_dataset_describe of the test set */
	fb_accum *accum;
	fb_server_opt *opt;
	fb_ingest *ingest;       /* decrypts and adds update chunks */
	ingest_arg *stream_arg;  /* per worker slot */
	fb_pool *pool;           /* every core, for the jobs' long passes */
	fb_dataset test;
	bool evaluate;
	fb_rng rng;
	uint64_t run_id;
	char listening[1024];    /* the "listening on" line, logged once
	                          * the outputs are ready (round 0's
	                          * checkpoint written) */
	char metrics_path[4096];
	char model_path[4096];
	int lock_fd;             /* OUTPUT_DIR/.lock, flock'd; -1: none */
	/* security */
	bool secure;
	fb_identity *self;
	fb_run_id run;
	registry reg;
	guard g;
	round_state rd;
	broadcast bc;
	credits cr;
	partials part;
	sa_round sa_sync;        /* the round's SecAgg instance (sync) */
	sa_round *sa;            /* the instance being handled: &sa_sync, or
	                          * a cohort's (secure async, cohort.c), or
	                          * sa_ahead while its messages are handled */
	sa_round sa_ahead;       /* the next round's, set up during this one
	                          * (secure_aggregation.setup_ahead) */
	fb_secagg_keys *sa_seen; /* the workers' verified advert signatures,
	                          * across rounds (loop thread only) */
	async_state as;          /* round.mode: async */
	cohorts cs;              /* round.mode: async, secure aggregation */
	pthread_mutex_t extra_mu; /* the ingest pool's adds into sa.extra */
	job job;
	int wake_fd;             /* epoll set: ingest results, job done */
	/* progress.c */
	FILE *wirelog;           /* debug.wire_log, or NULL */
	struct fb_metrics *prom; /* the Prometheus endpoint, or NULL */
	int64_t prom_ms;
	bool tty;                /* stdout is a terminal: a status line */
	bool tty_shown;
	int64_t tty_ms;
};

/* ---- registry.c ---- */
worker *registry_find_peer(coord *c, const fb_peer *p);
uint32_t registry_live_count(const coord *c);
wslot registry_slot(const coord *c, const worker *w);
FB_MUST_CHECK fb_err registry_allow_add(coord *c, const fb_pubkey *pk,
    const char *name);
FB_MUST_CHECK fb_err registry_load_allowlist(coord *c);
FB_MUST_CHECK fb_err registry_alloc(coord *c, uint32_t cap);
void registry_fini(coord *c);
void registry_on_hello(coord *c, worker *w, const fb_frame *f);
void registry_on_handshake(coord *c, const fb_frame *f);
void registry_forget(coord *c, worker *w, const char *why);
void registry_tick(coord *c, int64_t now);
void registry_on_closed(coord *c, uint64_t key);
fb_err coord_send(coord *c, worker *w, const fb_msg *m,
    const void *payload, size_t len, fb_lent *origin);
void coord_send_reject(coord *c, const fb_peer *peer, const char *reason);
void coord_trust(coord *c, const fb_peer *peer);

/* ---- guard.c ---- */
void guard_drop(coord *c, drop_reason r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool guard_blocked(coord *c, const fb_peer *p);
uint32_t guard_bad_count(coord *c, const fb_peer *p);
drop_reason guard_reason_of_reject(int why);

/* ---- round.c ---- */
void round_step(coord *c, int64_t now);
void round_worker_failed(coord *c, worker *w, const char *why);
/* round_on_failed takes a worker's RoundFailed: out of the round at once,
 * its reason (prefixed "failed on the worker: ") in the round's record.
 * Round 0 is a refusal of the whole run (at the welcome: the worker's
 * model differs): logged with its reason, and the worker forgotten. */
void round_on_failed(coord *c, worker *w, const fb_msg *m);
void round_job_done(coord *c, job_kind kind, int64_t now);
void round_cancel(coord *c, worker *w, const char *why);
bool round_open_for(const coord *c, uint32_t round);
void round_rejoin(coord *c, worker *w, int64_t now);
int64_t round_next_timer(const coord *c, int64_t now);
void round_stop(coord *c, int64_t now);

/* Shared by round.c and async.c. */
void round_enter(coord *c, round_phase p, int64_t now);
/* round_open_model sends the round's model out: at once in plain mode,
 * after its encryption on the job thread (PHASE_PREPARE) in secure mode;
 * then the workers get their tasks (round starts, or async tasks). */
void round_open_model(coord *c, int64_t now);
void round_reset(coord *c, int64_t now);
/* round_reset_result: only the record and the clock (secure async: the
 * sums and credits belong to the cohorts, across steps). */
void round_reset_result(coord *c, int64_t now);
void round_fail(coord *c, round_status st, int64_t now, const char *fmt,
    ...) __attribute__((format(printf, 4, 5)));
void round_record(coord *c, int64_t now);
void round_send_start(coord *c, worker *w);
uint64_t round_schedule_steps(const coord *c, const worker *w);
/* round_task_reset readies w for a new task: its steps scheduled, the last
 * task's results and evaluation forgotten, its upload to start at
 * first_chunk (spread over the model so that the ingest threads add
 * different streams to different chunks of the sum). */
void round_task_reset(coord *c, worker *w, uint32_t first_chunk);
/* round_open_to says whether a message of worker w for `round` belongs to
 * its current task (sync: round_open_for). */
bool round_open_to(const coord *c, const worker *w, uint32_t round);
/* round_of is the round number of w's task (sync: the round's). */
uint32_t round_of(const coord *c, const worker *w);

/* ---- async.c: round.mode async, one server step per buffer ---- */
FB_MUST_CHECK fb_err async_alloc(coord *c);
void async_fini(coord *c);
/* async_begin opens the next buffer (IDLE -> PREPARE or TRAIN). */
void async_begin(coord *c, int64_t now);
/* async_open starts the buffer's TRAIN: held begins, then tasks. */
void async_open(coord *c, int64_t now);
/* async_step: harvest complete updates, give free workers tasks, close. */
void async_step(coord *c, int64_t now);
/* async_on_begin decides an UpdateBegin first: true when it is taken care
 * of here (held for the next buffer, or dropped as too stale), false when
 * upload_on_begin goes on (w->weight set). */
bool async_on_begin(coord *c, worker *w, const fb_msg *m);
/* async_fetch_ok says whether w's ModelFetch can be served the model of
 * its task; if not, the task is cancelled (a new one follows). */
bool async_fetch_ok(coord *c, worker *w);
/* async_task_seed is the batch seed of the next task given out. */
uint64_t async_task_seed(coord *c);

/* ---- cohort.c: round.mode async with secure aggregation ---- */
bool cohorts_on(const coord *c);
#ifdef FB_TEST_LIAR
/* Test build only: whether FB_TEST_LIE names `lie` (secagg.c). */
bool liar_tells(const char *lie);
#endif
FB_MUST_CHECK fb_err cohorts_alloc(coord *c);
void cohorts_fini(coord *c);
/* cohorts_begin opens the next step (IDLE -> PREPARE): the cohorts in
 * flight go on; members now past round.max_staleness are cancelled. */
void cohorts_begin(coord *c, int64_t now);
/* cohorts_open: the step's model is out (PREPARE -> TRAIN). */
void cohorts_open(coord *c, int64_t now);
/* cohorts_tick moves every cohort on (any round phase); in TRAIN it gives
 * free workers tasks and applies the first cohort completed. */
void cohorts_tick(coord *c, int64_t now);
/* cohorts_applied: the step's metrics line is out; its cohort is freed. */
void cohorts_applied(coord *c);
/* cohort_of returns the live cohort of that id, or NULL. */
cohort *cohort_of(coord *c, uint32_t id);
/* cohort_enter makes co's instance c->sa, and w's slot in it (if w is a
 * member) w->sa_slot; it returns the instance that was c->sa. */
sa_round *cohort_enter(coord *c, cohort *co, worker *w);
void cohort_leave(coord *c, sa_round *prev, worker *w);
void cohort_on_secagg(coord *c, worker *w, const fb_frame *f);
/* cohort_place: the cohort free worker w's task goes to (one it may
 * open), or NULL: it waits (cohort.c says how it is chosen). */
cohort *cohort_place(coord *c, const worker *w, int64_t now);
/* cohort_note_staleness: w's masked upload is beginning; its staleness
 * (server steps since its task's model) is fixed now, in its member entry
 * and w->staleness, for its credits to carry. */
void cohort_note_staleness(coord *c, cohort *co, worker *w);
/* cohort_note_begin: w's masked upload began (UpdateBegin taken); its
 * task's time is measured. */
void cohort_note_begin(coord *c, worker *w, int64_t now);
/* cohorts_next_timer: milliseconds until a cohort's own deadline or
 * phase end (at most `next`). */
int64_t cohorts_next_timer(const coord *c, int64_t now, int64_t next);
bool cohort_open_to(const coord *c, const worker *w, uint32_t round);
bool cohort_fetch_ok(coord *c, worker *w);
/* round_sa is the SecAgg instance the round's record speaks of. */
const sa_round *round_sa(const coord *c);

/* ---- broadcast.c ---- */
/* broadcast_alloc picks keep or seal_on_fetch (transport.model_cache)
 * and, for seal_on_fetch, starts the seal threads (none: `inline_seal`,
 * each chunk sealed on the loop, for tests). */
FB_MUST_CHECK fb_err broadcast_alloc(coord *c, bool inline_seal);
/* broadcast_stop joins the seal threads (before the model goes). */
void broadcast_stop(coord *c);
void broadcast_fini(coord *c);
/* broadcast_wake_fd: readable when a sealed chunk is ready; -1: none. */
int broadcast_wake_fd(const coord *c);
/* broadcast_freeze (loop): no chunk is sealed from now on until the next
 * round's model is open; queued fetches are dropped. Before the model or
 * the round key changes. */
void broadcast_freeze(coord *c);
/* broadcast_quiesce (job thread): waits for the seals under way, after
 * broadcast_freeze, so the model may be written. */
void broadcast_quiesce(coord *c);
FB_MUST_CHECK fb_err broadcast_prepare(coord *c);
fb_err broadcast_encrypt(coord *c);      /* job thread */
/* broadcast_open (loop): the encryption is done, fetches are served. */
void broadcast_open(coord *c);
/* broadcast_pump (loop): sealed chunks go out, freed buffers take the
 * next fetches. */
void broadcast_pump(coord *c);
void broadcast_round_start(const coord *c, fb_msg *m);
void broadcast_on_fetch(coord *c, worker *w, const fb_msg *m);
FB_MUST_CHECK fb_err model_writable(coord *c, fb_lent **b, size_t len,
    bool keep);

/* ---- upload.c ---- */
void upload_on_begin(coord *c, worker *w, const fb_msg *m);
void upload_on_chunk(coord *c, worker *w, const fb_msg *m, fb_buf *buf);
void upload_on_end(coord *c, worker *w, const fb_msg *m);
void upload_results(coord *c);
void upload_settle(coord *c);
/* upload_sum_check starts the secure sum again when a masked upload that
 * went straight into it (max_uploads 0) was cut off midway; true if it
 * did (the round goes on with the workers asked again). */
bool upload_sum_check(coord *c, int64_t now);
fb_err upload_add_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter);
fb_err upload_end_cb(void *arg, void *stream_arg, bool complete);
void *upload_dst_cb(void *arg, void *stream_arg, uint32_t chunk,
    size_t *cap);
FB_MUST_CHECK fb_err upload_partials_alloc(coord *c);
void upload_partials_fini(coord *c);
bool upload_any_in_flight(const coord *c);
FB_MUST_CHECK fb_err upload_credits_alloc(coord *c);
void upload_credits_fini(coord *c);
void upload_credit_pump(coord *c);
void upload_credit_release(coord *c, worker *w);
void upload_credits_reset(coord *c);

/* ---- secagg.c ---- */
/* sa_begin sets up c->sa for `round` (the workers' task round) over the
 * n workers cand[0..n-1] (slot s: cand[s]). */
FB_MUST_CHECK fb_err sa_begin(coord *c, uint32_t round, const uint32_t *cand,
    uint32_t n, const char **why);
void sa_free(sa_round *sa);
void sa_round_start(const coord *c, const worker *w, fb_msg *m);
void sa_on_message(coord *c, worker *w, const fb_frame *f);
/* sa_handle takes w's SecAgg message for c->sa (its round checked). */
void sa_handle(coord *c, worker *w, const fb_frame *f);
/* sa_member_pending: slot's worker is still on its task for c->sa and
 * its masked input is not in. */
bool sa_member_pending(coord *c, uint32_t slot);
/* sa_assign gives SecAgg slot `slot` of c->sa to worker slot ws. */
void sa_assign(coord *c, uint32_t slot, uint32_t ws);
void sa_advance(coord *c, int64_t now);
void sa_request_confirms(coord *c, int64_t now);
bool sa_confirms_pending(const coord *c);
FB_MUST_CHECK fb_err sa_request_reveals(coord *c, int64_t now);
bool sa_reveals_pending(const coord *c);
bool sa_reveals_hopeless(const coord *c);
uint32_t sa_count(const sa_round *sa, unsigned flag);
/* sa_inputs_again empties the included set and the extras' sum: the sum
 * starts again (upload_sum_check). A no-op outside the input phase. */
void sa_inputs_again(coord *c);
/* sa_ask_again asks w for its masked input again (FB_SA_AGAIN). */
fb_err sa_ask_again(coord *c, worker *w);
double sa_a_bound(const coord *c);
void sa_note_included(coord *c, uint32_t slot);
/*
 * secure_aggregation.setup_ahead (sync rounds, every live worker in each):
 * sa_ahead_step starts the next round's setup once the current round's
 * own is done, and moves it on (its key and share phases) whatever the
 * round is doing; sa_ahead_adopt, at the next round's start, takes it as
 * that round's instance and selects its members still here (true), or
 * drops it (false: the round sets up as before).
 */
void sa_ahead_step(coord *c, int64_t now);
bool sa_ahead_adopt(coord *c, int64_t now);
/* sa_ahead_pending: the round about to begin is being set up ahead (its
 * adverts or shares still come). */
bool sa_ahead_pending(const coord *c);
int64_t sa_ahead_next_timer(const coord *c, int64_t now, int64_t next);
fb_err sa_unmask(coord *c, job *j);      /* job thread */

/* ---- jobs.c ---- */
FB_MUST_CHECK fb_err jobs_start(coord *c, bool inline_only);
void jobs_stop(coord *c);
void jobs_submit(coord *c, job_kind kind);
job_kind jobs_take_done(coord *c);
bool jobs_busy(coord *c);

/* ---- fedeval.c: the federated evaluation of a round ---- */
/* fedeval_record keeps what a plain UpdateBegin says of w's evaluation. */
void fedeval_record(worker *w, const fb_msg *m);
/* fedeval_clear forgets w's evaluation (at selection). */
void fedeval_clear(worker *w);
/* fedeval_tally sets rd.r.fed_eval from the plain reports of the round's
 * included updates (a malformed report is left out, logged). */
void fedeval_tally(coord *c);
/* fedeval_json writes `"fed_eval": {...}, ` for the metrics line, or
 * nothing when the round had no federated evaluation. */
void fedeval_json(const coord *c, FILE *f);
/* fedeval_round_text writes e.g. "fed 91.20%  " into buf ("" when none). */
void fedeval_round_text(const coord *c, char *buf, size_t len);

/* ---- outputs.c ---- */
FB_MUST_CHECK fb_err outputs_lock(coord *c, fb_coord_start how);
FB_MUST_CHECK fb_err outputs_prepare(coord *c, fb_coord_start how,
    uint32_t *first);
FB_MUST_CHECK fb_err outputs_begin(coord *c, fb_coord_start how);
void outputs_unlock(coord *c);
fb_err outputs_save_model(coord *c, double acc, const char *path);
fb_err outputs_metrics_line(coord *c, char **line, size_t *len);
fb_err outputs_append_line(coord *c, const char *line, size_t len);
void outputs_round_line(coord *c);

/* ---- checkpoint.c (the write and the read run on the job thread or
 * before the loop starts) ---- */
fb_err checkpoint_write(coord *c, bool committed, const char *line,
    size_t len);
FB_MUST_CHECK fb_err checkpoint_read(coord *c, uint32_t *first);
bool checkpoint_exists(const coord *c, uint32_t *round);
fb_err checkpoint_export(coord *c);
void checkpoint_clear(const coord *c);
unsigned checkpoint_prune(const coord *c);

/* ---- wirelog.c ---- */
FB_MUST_CHECK fb_err wirelog_open(coord *c);
void wirelog_close(coord *c);
/* wirelog_frame writes f's message (sender: the worker id, -1 unknown)
 * when debug.wire_log is set. */
void wirelog_frame(coord *c, const fb_frame *f, int64_t sender);

/* ---- progress.c ---- */
FB_MUST_CHECK fb_err progress_start(coord *c);
void progress_stop(coord *c);
void progress_phase(coord *c);
void progress_round_done(coord *c, const uint64_t *rejected);
void progress_cohort_failed(coord *c);
void progress_worker_left(coord *c, const worker *w);
void progress_tick(coord *c, int64_t now);

/* ---- coordinator.c ---- */
FB_MUST_CHECK fb_err coord_init(coord *c, const fb_coord_config *cfg,
    const coord_io *io, bool inline_jobs);
void coord_fini(coord *c);
/* loop.c: what the loop does with one received, well-formed frame */
void coord_handle_frame(coord *c, fb_frame *f);
void coord_dispatch(coord *c, worker *w, const fb_frame *f, fb_buf *buf);
/* coord_turn: after each event, the pool's results, a finished job, the
 * registry's tick and the round's step, at `now`. */
void coord_turn(coord *c, int64_t now);
FB_MUST_CHECK fb_err coord_loop(coord *c);

#endif
