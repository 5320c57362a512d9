/* SPDX-License-Identifier: Apache-2.0 */
/*
 * coordinator.c -- the round state machine.
 *
 * One thread, one event loop: every wait is a bounded poll on the ROUTER
 * socket, so heartbeats, deadlines and signals are handled on time whatever
 * the workers do. A round:
 *   select  -> RoundStart to each selected worker (its local steps, lr, ...)
 *   fetch   -> workers pull the global model chunk by chunk (ModelFetch),
 *              a bounded number in flight each, so queues stay small
 *   train   -> workers send Heartbeats while they train
 *   ingest  -> UpdateBegin then UpdateChunks; each chunk is checked here
 *              and queued to the ingest pool (ingest.h), whose threads
 *              decrypt it and add it to the one fixed-point accumulator;
 *              the pool's results (update complete, or refused and why)
 *              come back to this loop
 *   commit  -> when every selected worker is done or lost, or at the
 *              deadline: apply the mean update, evaluate, write the model
 *              (atomically) and one metrics line
 * Anything unexpected from the network is dropped, logged (rate-limited)
 * and counted by reason in the round's metrics.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "aggregation/aggregation.h"
#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator.h"
#include "coordinator/ingest.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"
#include "proto/proto.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fedbox sends float32 tensors in host order: little-endian only"
#endif

typedef enum wstate {
	W_IDLE = 0,  /* admitted, not in the current round */
	W_TRAINING,  /* RoundStart sent; fetching or training */
	W_UPLOADING, /* UpdateBegin accepted, chunks arriving */
	W_DONE,      /* complete update added */
	W_FAILED,    /* lost, cancelled or rejected this round */
} wstate;

static const char *const wstate_names[] = {"idle", "training", "uploading",
    "done", "failed"};

typedef struct worker {
	bool used;
	fb_peer peer;
	uint32_t id;
	char name[FB_NAME_MAX];
	uint32_t index;
	uint64_t num_samples;
	uint64_t session;
	char backend[FB_TEXT_MAX];
	int64_t last_seen_ms;
	int64_t full_since_ms;   /* its send queue was found full; 0: not */
	/* current round */
	wstate state;
	double weight;
	uint64_t assigned_steps;
	uint32_t first_chunk;    /* where its upload starts (RoundStart) */
	uint32_t next_chunk;     /* chunks of its upload received so far */
	uint64_t steps;
	double train_loss;
	double train_seconds;
	const char *fail_reason;
	/* secure mode: slot i is allowlist entry i */
	fb_session *sess;    /* current session; NULL until a handshake */
	fb_session *pending; /* a newer handshake, promoted on first use */
	uint64_t ingest_gen; /* the update's stream number in the pool */
	double begin_s;      /* fb_now_s() when its update began */
	bool final_seen;     /* the update's end (trailer) was queued */
	/* heterogeneity */
	double speed;        /* smoothed local steps per second */
	bool has_speed;
	double round_speed;  /* this round's measured steps per second */
	double a_norm;       /* FedNova ||a_i||_1 of this round's update */
	int64_t done_ms;     /* when its update completed */
	uint32_t slot;       /* secure aggregation: its index in the round */
} worker;

/* Secure aggregation (SecAgg+, crypto.h) of one round. */
#define SA_EXTRA FB_SECAGG_EXTRA /* weight, weight*loss, weight*a */

enum sa_phase { SA_OFF = 0, SA_ADVERTS, SA_SHARES, SA_INPUT, SA_UNMASK };
static const char *const sa_phase_names[] = {"off", "key adverts",
    "share distribution", "masked inputs", "unmasking"};

#define SA_F_ADV 1u
#define SA_F_SHARED 2u
#define SA_F_INCLUDED 4u
#define SA_F_REVEALED 8u

typedef struct sa_round {
	enum sa_phase phase;
	int64_t phase_end_ms;
	fb_secagg_params p;
	fb_secagg_server *srv;
	uint32_t n, k, t;
	uint32_t *slot_worker;  /* slot -> index in coord.workers */
	uint8_t *flags;         /* per slot, SA_F_* */
	uint8_t *adv;           /* per slot, its advert */
	uint8_t *shares;        /* per slot, its batch of sealed shares */
	uint32_t *share_len;    /* bytes in each batch */
	uint32_t extra[SA_EXTRA];
	fb_secagg_encodings enc;
	const char *poisoned;   /* why the sum is unusable, or NULL */
} sa_round;

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

static const char *const drop_names[DROP_REASON_COUNT_] = {
	"malformed", "unknown_peer", "stale_round", "unexpected",
	"out_of_order", "wrong_size", "non_finite", "version", "unknown_key",
	"bad_signature", "bad_mac", "replay", "wrong_run", "wrong_sender",
	"truncated", "wrong_identity", "not_sealed", "rate_limited",
};

/* Reasons that honest peers never cause: they count against the sender's
 * rate limit. (A late chunk from a slow honest worker is merely stale.) */
static bool
drop_is_hostile(drop_reason r)
{
	return r != DROP_STALE_ROUND && r != DROP_UNEXPECTED &&
	    r != DROP_RATE_LIMITED;
}

static drop_reason
drop_of_reject(int why)
{
	switch ((fb_reject)why) {
	case FB_REJECT_VERSION:
		return DROP_VERSION;
	case FB_REJECT_UNKNOWN_KEY:
	case FB_REJECT_UNPINNED_KEY:
		return DROP_UNKNOWN_KEY;
	case FB_REJECT_BAD_SIGNATURE:
		return DROP_BAD_SIGNATURE;
	case FB_REJECT_BAD_MAC:
		return DROP_BAD_MAC;
	case FB_REJECT_REPLAY:
		return DROP_REPLAY;
	case FB_REJECT_WRONG_RUN:
		return DROP_WRONG_RUN;
	case FB_REJECT_WRONG_ROUND:
		return DROP_STALE_ROUND;
	case FB_REJECT_WRONG_SENDER:
		return DROP_WRONG_SENDER;
	case FB_REJECT_TRUNCATED:
		return DROP_TRUNCATED;
	case FB_REJECT_TOO_LARGE:
		return DROP_WRONG_SIZE;
	default:
		return DROP_MALFORMED;
	}
}

/* Peers sending bad messages fast are ignored for a while, so that a
 * flood costs one table lookup per message, not a decode or a MAC. */
#define RL_SLOTS 256
#define RL_WINDOW_MS 1000
#define RL_MAX_BAD 20   /* bad messages per window before blocking */
#define RL_BLOCK_MS 10000
#define HELLO_CACHE 4096 /* remembered handshake nonces (replays) */
#define LANE_SEEN 256    /* remembered lane choices (retried first messages) */

typedef struct rl_entry {
	fb_peer peer;
	int64_t window_ms;
	uint32_t bad;
	int64_t blocked_until_ms;
} rl_entry;

/* What the ingest pool's callback needs to add one worker's update; set
 * when the update begins, unchanged while the pool holds its chunks. */
typedef struct ingest_arg {
	double weight; /* FedAvg weight of a plain update */
	bool masked;   /* secure aggregation: ring elements, mod 2^32 */
} ingest_arg;

typedef struct coord {
	const fb_coord_config *cfg;
	fb_link *link;
	fb_model *model;
	uint64_t param_count;
	uint32_t chunk_elems;
	uint32_t chunk_count;
	float *params;      /* the global model: fb_lent_data(params_lent) */
	fb_lent *params_lent; /* plain model chunks are sent from it, no copy */
	fb_accum *accum;
	fb_dataset test;
	bool evaluate;
	worker *workers;
	uint32_t worker_cap;
	uint32_t next_id;
	uint64_t run_id;
	fb_rng rng;
	char model_desc[128];
	char metrics_path[4096];
	char model_path[4096];
	/* current round */
	uint32_t round;
	int64_t round_started_ms;
	int64_t deadline_ms;
	int64_t last_heartbeat_ms;
	uint64_t drops[DROP_REASON_COUNT_];          /* since the start */
	uint64_t drops_reported[DROP_REASON_COUNT_]; /* up to the last line */
	int64_t drop_logged_ms[DROP_REASON_COUNT_];
	uint64_t drops_unlogged[DROP_REASON_COUNT_];
	uint64_t clipped;
	uint64_t clipped_base;    /* fb_ingest_counter at the round's start */
	fb_ingest *ingest;        /* decrypts and adds update chunks */
	ingest_arg *stream_arg;   /* slot i: how to add worker i's update */
	pthread_mutex_t extra_mu; /* the pool's adds into sa.extra */
	double first_begin_s;     /* the round's first update began; 0 */
	uint32_t last_found;      /* find_peer's last hit */
	int64_t last_scan_ms;     /* tick's last liveness scan */
	uint64_t up_bytes;
	uint64_t down_bytes;
	volatile sig_atomic_t *stop;
	const fb_peer *cur_peer; /* sender of the message being handled */
	rl_entry rl[RL_SLOTS];
	/* secure mode */
	bool secure;
	fb_identity *self;
	fb_run_id run;
	fb_pubkey *allow;        /* allowlist keys; slot i = worker id i */
	char (*allow_names)[FB_NAME_MAX];
	uint32_t allow_count;
	uint8_t (*hello_nonces)[32];
	uint32_t hello_next;
	/* lanes: the choice made for recent connections on the listen port */
	uint32_t lanes;
	uint32_t lane_next;
	struct {
		fb_peer peer;
		uint32_t lane;
	} lane_seen[LANE_SEEN];
	uint32_t lane_seen_next;
	uint8_t *bcast;          /* the round's model, encrypted once */
	fb_lent *bcast_lent;     /* bcast's memory, sent from without a copy */
	uint64_t bcast_stride;   /* bytes per chunk slot in bcast */
	uint32_t *bcast_len;     /* ciphertext bytes of each chunk */
	uint8_t round_key[FB_STREAM_KEY_LEN];
	uint8_t stream_header[FB_STREAM_HEADER_LEN];
	uint8_t stream_trailer[FB_STREAM_TRAILER_LEN];
	/* round policy */
	fb_server_opt *opt;      /* the server rule's optimiser */
	uint32_t target_updates; /* updates that close a round early */
	bool waiting_logged;
	double tau_eff;
	/* secure aggregation */
	sa_round sa;
	uint32_t in_chunks;      /* chunks of an update (+1 with SecAgg) */
	char sa_why[256];        /* why this round cannot aggregate */
} coord;

static rl_entry *
rl_find(coord *c, const fb_peer *p, bool create)
{
	uint32_t h = 2166136261u;
	for (uint8_t i = 0; i < p->len; i++) {
		h = (h ^ p->id[i]) * 16777619u;
	}
	rl_entry *e = &c->rl[h % RL_SLOTS];
	if (fb_peer_equal(&e->peer, p)) {
		return e;
	}
	if (!create) {
		return NULL;
	}
	memset(e, 0, sizeof(*e));
	e->peer = *p;
	return e;
}

/* Whether messages from `p` are being ignored right now. */
static bool
rl_blocked(coord *c, const fb_peer *p)
{
	rl_entry *e = rl_find(c, p, false);
	return e != NULL && e->blocked_until_ms > fb_now_ms();
}

static void
rl_penalize(coord *c, const fb_peer *p)
{
	int64_t now = fb_now_ms();
	rl_entry *e = rl_find(c, p, true);

	if (now - e->window_ms > RL_WINDOW_MS) {
		e->window_ms = now;
		e->bad = 0;
	}
	if (++e->bad > RL_MAX_BAD && e->blocked_until_ms <= now) {
		e->blocked_until_ms = now + RL_BLOCK_MS;
		fb_log_warn("peer sending bad messages (%u in %dms): ignoring "
		            "it for %ds",
		    e->bad, RL_WINDOW_MS, RL_BLOCK_MS / 1000);
	}
}

/* Logs a dropped message at most once a second per reason; counts all. */
static void
drop(coord *c, drop_reason r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
drop(coord *c, drop_reason r, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	int64_t now = fb_now_ms();

	c->drops[r]++;
	if (c->cur_peer != NULL && drop_is_hostile(r)) {
		rl_penalize(c, c->cur_peer);
	}
	if (now - c->drop_logged_ms[r] < 1000) {
		c->drops_unlogged[r]++;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (c->drops_unlogged[r] > 0) {
		fb_log_warn("dropped message (%s): %s [and %" PRIu64
		            " more of this kind]",
		    drop_names[r], text, c->drops_unlogged[r]);
	} else {
		fb_log_warn("dropped message (%s): %s", drop_names[r], text);
	}
	c->drops_unlogged[r] = 0;
	c->drop_logged_ms[r] = now;
}

static worker *
find_peer(coord *c, const fb_peer *p)
{
	/* Chunks come in runs from one peer: try the last one found first. */
	worker *w = &c->workers[c->last_found < c->worker_cap ? c->last_found
	                                                      : 0];
	if (w->used && fb_peer_equal(&w->peer, p)) {
		return w;
	}
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		if (c->workers[i].used && fb_peer_equal(&c->workers[i].peer, p)) {
			c->last_found = i;
			return &c->workers[i];
		}
	}
	return NULL;
}

static uint32_t
live_count(const coord *c)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		n += c->workers[i].used;
	}
	return n;
}

/* `origin`: the lent memory `payload` lies in (sent without a copy), or
 * NULL. */
static fb_err
send_to(coord *c, worker *w, const fb_msg *m, const void *payload,
    size_t len, fb_lent *origin)
{
	fb_err rc = c->secure
	    ? fb_secure_send_from(c->link, &w->peer, w->sess, c->round, m,
	          payload, len, origin)
	    : fb_link_send_from(c->link, &w->peer, m, payload, len, origin);
	if (rc == FB_EAGAIN && w->full_since_ms == 0) {
		w->full_since_ms = fb_now_ms();
	} else if (rc == FB_OK) {
		w->full_since_ms = 0;
	}
	if (rc != FB_OK) {
		fb_log_warn("cannot send %s to %s: %s", fb_msg_type_name(m->type),
		    w->name, fb_strerror(rc));
	}
	return rc;
}

/* Best-effort sends: a failure is logged by the caller's context only. */
static void
send_quiet(coord *c, const fb_peer *peer, const fb_msg *m)
{
	if (fb_link_send(c->link, peer, m, NULL, 0) != FB_OK) {
		fb_log_debug("could not send %s", fb_msg_type_name(m->type));
	}
}

/* door: a peer gets one REJECT per rate-limit window, the first of its
 * bad messages (drop, which counts them, runs before). */
static void
send_reject(coord *c, const fb_peer *peer, const char *reason)
{
	fb_msg m = {.type = FB_MSG_REJECT};
	rl_entry *e = rl_find(c, peer, false);

	if (e != NULL && e->bad > 1) {
		return;
	}
	snprintf(m.u.reject.reason, sizeof(m.u.reject.reason), "%s", reason);
	m.u.reject.protocol_version = FB_PROTOCOL_VERSION;
	send_quiet(c, peer, &m);
}

static void
worker_fail(coord *c, worker *w, const char *why)
{
	if (c->sa.phase != SA_OFF && w->state == W_UPLOADING &&
	    w->next_chunk > 0 && c->sa.poisoned == NULL) {
		/* Part of its masked input is in the sum: without all of it
		 * the masks cannot be removed (and revealing both of its
		 * secrets would expose the part). */
		c->sa.poisoned = "a masked input was cut off mid-stream";
	}
	if (w->state == W_TRAINING || w->state == W_UPLOADING) {
		if (w->state == W_UPLOADING) {
			/* Chunks already queued are still added, as they were
			 * when each was added on arrival. */
			fb_ingest_abort(c->ingest, (uint32_t)(w - c->workers));
		}
		fb_log_warn("round %u: %s leaves the round: %s", c->round,
		    w->name, why);
		w->state = W_FAILED;
		w->fail_reason = why;
	}
}

static void
worker_forget(coord *c, worker *w, const char *why)
{
	worker_fail(c, w, why);
	fb_log_info("worker %s removed: %s", w->name, why);
	fb_session_free(w->sess);
	fb_session_free(w->pending);
	memset(w, 0, sizeof(*w));
}

/*
 * Lanes: the first message of a connection on the listen port (lane 0)
 * gives the connection the next lane in turn. For lane 0 it returns true
 * (go on); for another it answers with a Redirect to that lane's port and
 * returns false. The choice is remembered per connection, so a first
 * message retried on it gets the same answer. A message saying it came
 * in on a lane is let through (a wrong claim costs only balance).
 */
static bool
lane_admit(coord *c, const fb_peer *peer, uint32_t lane)
{
	fb_msg m = {.type = FB_MSG_REDIRECT};
	uint32_t pick = 0, i;

	if (c->lanes < 2 || lane != 0) {
		return true;
	}
	for (i = 0; i < LANE_SEEN; i++) {
		if (fb_peer_equal(&c->lane_seen[i].peer, peer)) {
			pick = c->lane_seen[i].lane;
			break;
		}
	}
	if (i == LANE_SEEN) {
		pick = c->lane_next++ % c->lanes;
		c->lane_seen[c->lane_seen_next].peer = *peer;
		c->lane_seen[c->lane_seen_next].lane = pick;
		c->lane_seen_next = (c->lane_seen_next + 1) % LANE_SEEN;
	}
	if (pick == 0) {
		return true;
	}
	m.u.redirect.lane = pick;
	m.u.redirect.port = fb_link_lane_port(c->link, pick);
	fb_log_debug("a new connection is sent to lane %u (port %u)", pick,
	    m.u.redirect.port);
	send_quiet(c, peer, &m);
	return false;
}

/*
 * on_hello admits a worker. Plain mode: `w` is the slot of its connection
 * (or NULL). Secure mode: `w` is the slot of the identity whose session
 * opened this sealed hello, so the name must be the allowlist's.
 */
static void
on_hello(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	fb_msg out = {.type = FB_MSG_WELCOME};
	char reason[FB_TEXT_MAX];

	if (m->u.hello.protocol_version != FB_PROTOCOL_VERSION) {
		snprintf(reason, sizeof(reason),
		    "protocol version %u is not supported: this coordinator "
		    "speaks version %u (upgrade the worker or coordinator)",
		    m->u.hello.protocol_version, FB_PROTOCOL_VERSION);
		drop(c, DROP_VERSION, "hello from '%s': %s", m->u.hello.name,
		    reason);
		send_reject(c, &f->peer, reason);
		return;
	}
	if (m->u.hello.name[0] == '\0') {
		drop(c, DROP_MALFORMED, "hello without a name");
		send_reject(c, &f->peer, "hello needs a name");
		return;
	}
	if (m->u.hello.num_samples == 0 && !c->cfg->sa_enabled) {
		drop(c, DROP_UNEXPECTED, "hello from '%s' without a sample count",
		    m->u.hello.name);
		send_reject(c, &f->peer, "this worker keeps its sample count "
		    "private (it requires secure aggregation) but this "
		    "coordinator has secure_aggregation.enabled: false");
		return;
	}
	if (!c->secure && w == NULL &&
	    !lane_admit(c, &f->peer, m->u.hello.lane)) {
		return;
	}
	if (c->secure) {
		uint32_t id = (uint32_t)(w - c->workers);
		if (strcmp(m->u.hello.name, c->allow_names[id]) != 0) {
			snprintf(reason, sizeof(reason),
			    "this key belongs to worker '%s', not '%s'",
			    c->allow_names[id], m->u.hello.name);
			drop(c, DROP_IDENTITY, "hello: %s", reason);
			send_reject(c, &f->peer, reason);
			return;
		}
		if (!w->used) {
			w->used = true;
			w->id = id;
			w->state = W_IDLE;
		} else if (w->session != m->u.hello.session) {
			worker_fail(c, w, "worker restarted its session");
		}
		w->peer = f->peer;
	} else if (w != NULL && w->session == m->u.hello.session) {
		/* A repeated hello of the same session: welcome it again. */
		w->last_seen_ms = fb_now_ms();
	} else if (w != NULL) {
		/* The worker lost its session (e.g. it thought we were gone). */
		worker_fail(c, w, "worker restarted its session");
	} else {
		/* Same name from a new connection: the old one is stale. */
		for (uint32_t i = 0; i < c->worker_cap; i++) {
			if (c->workers[i].used &&
			    strcmp(c->workers[i].name, m->u.hello.name) == 0) {
				worker_forget(c, &c->workers[i],
				    "replaced by a new connection");
			}
		}
		for (uint32_t i = 0; i < c->worker_cap && w == NULL; i++) {
			if (!c->workers[i].used) {
				w = &c->workers[i];
			}
		}
		if (w == NULL) {
			send_reject(c, &f->peer, "coordinator is full "
			                         "(transport.max_workers)");
			fb_log_warn("refused %s: already %u workers",
			    m->u.hello.name, c->worker_cap);
			return;
		}
		memset(w, 0, sizeof(*w));
		w->used = true;
		w->peer = f->peer;
		w->id = ++c->next_id;
	}
	snprintf(w->name, sizeof(w->name), "%s", m->u.hello.name);
	snprintf(w->backend, sizeof(w->backend), "%s", m->u.hello.backend);
	w->index = m->u.hello.worker_index;
	w->num_samples = m->u.hello.num_samples;
	w->session = m->u.hello.session;
	w->last_seen_ms = fb_now_ms();

	out.u.welcome.protocol_version = FB_PROTOCOL_VERSION;
	out.u.welcome.run_id = c->run_id;
	out.u.welcome.worker_id = w->id;
	out.u.welcome.heartbeat_ms = (uint32_t)c->cfg->heartbeat_ms;
	out.u.welcome.liveness_ms = (uint32_t)c->cfg->liveness_ms;
	out.u.welcome.chunk_bytes = c->chunk_elems * 4;
	out.u.welcome.param_count = c->param_count;
	snprintf(out.u.welcome.model.arch, sizeof(out.u.welcome.model.arch),
	    "%s", c->cfg->model_arch);
	out.u.welcome.model.input_dim = (uint32_t)c->cfg->input_dim;
	out.u.welcome.model.classes = (uint32_t)c->cfg->classes;
	out.u.welcome.model.hidden_count = (uint32_t)c->cfg->hidden.count;
	for (size_t i = 0; i < c->cfg->hidden.count; i++) {
		out.u.welcome.model.hidden[i] = (uint32_t)c->cfg->hidden.v[i];
	}
	out.u.welcome.model.synthetic_params =
	    (uint64_t)c->cfg->synthetic_params;
	snprintf(out.u.welcome.model.plugin,
	    sizeof(out.u.welcome.model.plugin), "%s", c->cfg->plugin);
	if (c->cfg->sa_enabled) {
		w->num_samples = 0; /* only the masked sum of weights counts */
	}
	if (send_to(c, w, &out, NULL, 0, NULL) != FB_OK) {
		return;
	}
	fb_link_peer_trust(c->link, &f->peer); /* door: plain mode admits */
	if (w->num_samples > 0) {
		fb_log_info("worker %s admitted (id %u, index %u, %" PRIu64
		            " samples, %s); %u connected",
		    w->name, w->id, w->index, w->num_samples,
		    w->backend[0] ? w->backend : "?", live_count(c));
	} else {
		fb_log_info("worker %s admitted (id %u, index %u, %s); %u "
		            "connected",
		    w->name, w->id, w->index, w->backend[0] ? w->backend : "?",
		    live_count(c));
	}
}

static void
on_model_fetch(coord *c, worker *w, const fb_msg *m)
{
	fb_msg out = {.type = FB_MSG_MODEL_CHUNK};
	uint32_t k = m->u.model_fetch.chunk;
	uint64_t first, n;
	fb_err rc;

	if (m->u.model_fetch.round != c->round) {
		drop(c, DROP_STALE_ROUND, "model_fetch for round %u from %s "
		    "(round %u is open)", m->u.model_fetch.round, w->name,
		    c->round);
		return;
	}
	if (w->state != W_TRAINING) {
		drop(c, DROP_UNEXPECTED, "model_fetch from %s, which is %s",
		    w->name, wstate_names[w->state]);
		return;
	}
	if (k >= c->chunk_count) {
		drop(c, DROP_WRONG_SIZE, "model_fetch of chunk %u of %u from %s",
		    k, c->chunk_count, w->name);
		return;
	}
	first = (uint64_t)k * c->chunk_elems;
	n = fb_accum_chunk_len(c->accum, k);
	out.u.model_chunk.round = c->round;
	out.u.model_chunk.chunk = k;
	if (c->secure) {
		rc = send_to(c, w, &out, c->bcast + (uint64_t)k * c->bcast_stride,
		    c->bcast_len[k], c->bcast_lent);
	} else {
		rc = send_to(c, w, &out, c->params + first, n * 4,
		    c->params_lent);
	}
	if (rc != FB_OK) {
		worker_fail(c, w, "model download failed");
	}
}

/* Updates complete or streaming in: over-selection keeps the first. */
static uint32_t
updates_claimed(const coord *c)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		const worker *w = &c->workers[i];
		n += w->used && (w->state == W_DONE || w->state == W_UPLOADING);
	}
	return n;
}

static void
on_update_begin(coord *c, worker *w, const fb_msg *m)
{
	fb_stream_pull *pull = NULL;
	uint32_t slot = (uint32_t)(w - c->workers);

	if (m->u.update_begin.round != c->round) {
		drop(c, DROP_STALE_ROUND, "update for round %u from %s "
		    "(round %u is open)", m->u.update_begin.round, w->name,
		    c->round);
		return;
	}
	if (w->state != W_TRAINING) {
		drop(c, DROP_UNEXPECTED, "update_begin from %s, which is %s",
		    w->name, wstate_names[w->state]);
		return;
	}
	if (m->u.update_begin.param_count != c->param_count ||
	    m->u.update_begin.chunk_count != c->in_chunks) {
		drop(c, DROP_WRONG_SIZE, "update from %s has %" PRIu64
		    " params in %u chunks; the model has %" PRIu64 " in %u",
		    w->name, m->u.update_begin.param_count,
		    m->u.update_begin.chunk_count, c->param_count,
		    c->in_chunks);
		worker_fail(c, w, "update of the wrong size");
		return;
	}
	if (c->sa.phase != SA_OFF &&
	    (c->sa.phase != SA_INPUT ||
	        !(c->sa.flags[w->slot] & SA_F_SHARED))) {
		drop(c, DROP_UNEXPECTED, "masked update from %s before its "
		    "shares were relayed (%s phase)", w->name,
		    sa_phase_names[c->sa.phase]);
		worker_fail(c, w, "update before secure-aggregation setup");
		return;
	}
	if (c->sa.phase == SA_OFF &&
	    m->u.update_begin.num_samples != w->num_samples) {
		drop(c, DROP_UNEXPECTED, "update from %s claims %" PRIu64
		    " samples, it declared %" PRIu64, w->name,
		    m->u.update_begin.num_samples, w->num_samples);
		worker_fail(c, w, "sample count changed");
		return;
	}
	if (c->secure) {
		fb_stream_ctx ctx = {.run = c->run, .round = c->round,
		    .sender = w->id};
		fb_reject why = FB_REJECT_NONE;
		fb_err rc;

		if (m->u.update_begin.stream_key.len != FB_STREAM_KEY_LEN) {
			drop(c, DROP_MALFORMED, "update from %s without a stream "
			    "key", w->name);
			worker_fail(c, w, "update without a stream key");
			return;
		}
		rc = fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_TAGS,
		    m->u.update_begin.stream_key.b,
		    m->u.update_begin.stream_header.b,
		    m->u.update_begin.stream_header.len, c->chunk_elems * 4,
		    &pull, &why);
		if (rc != FB_OK) {
			drop(c, drop_of_reject(why), "update stream header from "
			    "%s: %s", w->name, fb_reject_name(why));
			worker_fail(c, w, "bad update stream header");
			return;
		}
	}
	if (updates_claimed(c) >= c->target_updates) {
		fb_msg cm = {.type = FB_MSG_ROUND_CANCEL};
		cm.u.round_cancel.round = c->round;
		snprintf(cm.u.round_cancel.reason, sizeof(cm.u.round_cancel.reason),
		    "the round has its %u updates (over-selection)",
		    c->target_updates);
		(void)send_to(c, w, &cm, NULL, 0, NULL);
		worker_fail(c, w, "not needed: over-selected and later");
		fb_stream_pull_free(pull);
		return;
	}
	if (c->sa.phase == SA_OFF && fb_rule_is_fednova((fb_rule)c->cfg->rule) &&
	    !(m->u.update_begin.a_norm > 0 &&
	        isfinite(m->u.update_begin.a_norm))) {
		drop(c, DROP_MALFORMED, "FedNova update from %s without a "
		    "normaliser", w->name);
		worker_fail(c, w, "FedNova update without a normaliser");
		fb_stream_pull_free(pull);
		return;
	}
	/* The pool takes the decryptor (plain mode: none). */
	c->stream_arg[slot].weight = w->weight;
	c->stream_arg[slot].masked = c->sa.phase != SA_OFF;
	if (fb_ingest_begin(c->ingest, slot, pull, &c->stream_arg[slot],
	        &w->ingest_gen) != FB_OK) {
		worker_fail(c, w, "out of memory");
		return;
	}
	w->a_norm = m->u.update_begin.a_norm;
	if (m->u.update_begin.steps_per_second > 0 &&
	    isfinite(m->u.update_begin.steps_per_second)) {
		double sp = m->u.update_begin.steps_per_second;
		w->round_speed = sp;
		w->speed = w->has_speed ? 0.5 * w->speed + 0.5 * sp : sp;
		w->has_speed = true;
	}
	w->state = W_UPLOADING;
	w->next_chunk = 0;
	w->final_seen = false;
	w->begin_s = fb_now_s();
	if (c->first_begin_s == 0) {
		c->first_begin_s = w->begin_s;
	}
	w->steps = m->u.update_begin.steps;
	w->train_loss = m->u.update_begin.train_loss;
	w->train_seconds = m->u.update_begin.train_seconds;
	if (m->u.update_begin.backend[0] != '\0') {
		snprintf(w->backend, sizeof(w->backend), "%s",
		    m->u.update_begin.backend);
	}
}

static void
on_update_chunk(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	uint32_t k = m->u.update_chunk.chunk, expect;
	uint64_t elems;
	fb_buf *buf = NULL;
	fb_err rc;

	if (m->u.update_chunk.round != c->round) {
		drop(c, DROP_STALE_ROUND, "update chunk for round %u from %s "
		    "(round %u is open)", m->u.update_chunk.round, w->name,
		    c->round);
		return;
	}
	if (w->state != W_UPLOADING || w->next_chunk == c->in_chunks) {
		/* (all chunks in: the update is done or being finished) */
		drop(c, DROP_UNEXPECTED, "update chunk from %s, which is %s",
		    w->name, w->state != W_UPLOADING ? wstate_names[w->state]
		                                     : "done");
		return;
	}
	expect = fb_upload_chunk(w->first_chunk, c->chunk_count, w->next_chunk);
	if (k != expect) {
		drop(c, DROP_OUT_OF_ORDER, "update chunk %u from %s, expected %u",
		    k, w->name, expect);
		worker_fail(c, w, "update chunks out of order");
		return;
	}
	if (k >= c->in_chunks) {
		drop(c, DROP_WRONG_SIZE, "update chunk %u from %s: the update "
		    "has %u chunks", k, w->name, c->in_chunks);
		worker_fail(c, w, "update chunk out of range");
		return;
	}
	elems = k < c->chunk_count ? fb_accum_chunk_len(c->accum, k) : SA_EXTRA;
	if (f->payload_len !=
	    elems * 4 + (c->secure ? FB_STREAM_CHUNK_OVERHEAD : 0)) {
		drop(c, DROP_WRONG_SIZE, "update chunk %u from %s has %zu "
		    "bytes, expected %" PRIu64, k, w->name, f->payload_len,
		    elems * 4);
		worker_fail(c, w, "update chunk of the wrong size");
		return;
	}
	/* Decrypted (secure mode), checked and added by the ingest pool;
	 * what it refuses comes back in ingest_results(). */
	rc = fb_link_take_payload(c->link, &buf);
	if (rc == FB_OK) {
		rc = fb_ingest_chunk(c->ingest, (uint32_t)(w - c->workers), k,
		    buf, w->next_chunk + 1 == c->in_chunks);
	}
	if (rc != FB_OK) {
		worker_fail(c, w, "out of memory");
		return;
	}
	w->next_chunk++;
}

static void
on_update_end(coord *c, worker *w, const fb_msg *m)
{
	fb_pubkey pk;

	if (m->u.update_end.round != c->round) {
		drop(c, DROP_STALE_ROUND, "update end for round %u from %s",
		    m->u.update_end.round, w->name);
		return;
	}
	if (!c->secure) {
		return; /* plain updates are complete at their last chunk */
	}
	if (w->state != W_UPLOADING || w->next_chunk != c->in_chunks ||
	    w->final_seen) {
		drop(c, DROP_TRUNCATED, "update end from %s after %u of %u "
		    "chunks", w->name, w->next_chunk, c->in_chunks);
		worker_fail(c, w, "update truncated");
		return;
	}
	/* Checked by the pool after the last chunk: see ingest_results(). */
	pk = c->allow[w->id];
	if (fb_ingest_end(c->ingest, (uint32_t)(w - c->workers), &pk,
	        m->u.update_end.stream_trailer.b,
	        m->u.update_end.stream_trailer.len) != FB_OK) {
		worker_fail(c, w, "out of memory");
		return;
	}
	w->final_seen = true;
}

/*
 * What the ingest pool made of the update streams: complete updates, and
 * the chunk or trailer it refused, dropped and counted as they were when
 * this loop decrypted and added each chunk itself.
 */
static void
ingest_results(coord *c)
{
	fb_ingest_result r;

	while (fb_ingest_result_next(c->ingest, &r)) {
		worker *w = &c->workers[r.slot];
		bool cur = w->used && w->ingest_gen == r.gen;
		const char *name = cur ? w->name : "a departed worker";

		c->cur_peer = cur ? &w->peer : NULL;
		if (cur) {
			w->next_chunk = r.consumed;
		}
		if (r.status == FB_INGEST_DONE) {
			if (cur && w->state == W_UPLOADING) {
				if (c->sa.phase != SA_OFF) {
					if (fb_secagg_server_set_included(c->sa.srv,
					        w->slot) != FB_OK) {
						c->sa.poisoned = "a masked input "
						    "could not be recorded";
					}
					c->sa.flags[w->slot] |= SA_F_INCLUDED;
				}
				w->state = W_DONE;
				w->done_ms = fb_now_ms();
				double now = fb_now_s();
				fb_log_debug("round %u: %supdate from %s complete "
				             "(%.6fs after the first update began; "
				             "it took %.6fs)",
				    c->round, c->secure ? "signed " : "", name,
				    now - c->first_begin_s, now - w->begin_s);
			}
		} else if (r.stage == FB_INGEST_AT_TRAILER) {
			drop(c, drop_of_reject(r.reject), "update trailer from "
			    "%s: %s", name, fb_reject_name(r.reject));
			if (cur) {
				worker_fail(c, w, "update signature rejected");
			}
		} else if (r.stage == FB_INGEST_AT_DECRYPT ||
		    r.stage == FB_INGEST_AT_FINAL_MARK) {
			drop(c, r.stage == FB_INGEST_AT_DECRYPT
			        ? drop_of_reject(r.reject)
			        : DROP_TRUNCATED,
			    "update chunk %u from %s: %s", r.chunk, name,
			    r.stage == FB_INGEST_AT_DECRYPT
			        ? fb_reject_name(r.reject)
			        : "final mark on the wrong chunk");
			if (cur) {
				worker_fail(c, w, "update stream rejected");
			}
		} else if (r.err == FB_EINVAL) {
			drop(c, DROP_NONFINITE, "update chunk %u from %s holds NaN "
			    "or infinity", r.chunk, name);
			if (cur) {
				worker_fail(c, w, "non-finite values in the update");
			}
		} else {
			drop(c, DROP_UNEXPECTED, "update chunk %u from %s: %s",
			    r.chunk, name, fb_strerror(r.err));
			if (cur) {
				worker_fail(c, w, "update could not be added");
			}
		}
		c->cur_peer = NULL;
	}
}

/* Waits for the pool to finish what it holds, then takes its results. */
static void
ingest_settle(coord *c)
{
	fb_ingest_drain(c->ingest);
	ingest_results(c);
}

/*
 * The ingest pool's callback: adds one decrypted chunk with the update's
 * weight, or (secure aggregation) its masked ring elements. Calls for the
 * same chunk may run at once (cb_concurrent): the accumulator locks parts
 * of a chunk, so several updates are added into one chunk in parallel
 * (a one-chunk model, or more workers than chunks), and the pool's idle
 * threads take parts of each add (fb_accum_set_parallel); the few SecAgg
 * extras have a lock of their own.
 */
static fb_err
ingest_add_cb(void *arg, void *stream_arg, uint32_t chunk, void *data,
    size_t len, uint64_t *counter)
{
	coord *c = arg;
	const ingest_arg *a = stream_arg;

	if (a->masked) {
		/* A masked input: ring elements, added mod 2^32. */
		if (chunk < c->chunk_count) {
			return len % 4 == 0 && fb_accum_ring_add(c->accum,
			    chunk, data, len / 4) == FB_OK ? FB_OK : FB_EPROTO;
		}
		if (len != SA_EXTRA * 4) {
			return FB_EPROTO;
		}
		pthread_mutex_lock(&c->extra_mu);
		fb_ring_add(c->sa.extra, data, SA_EXTRA);
		pthread_mutex_unlock(&c->extra_mu);
		return FB_OK;
	}
	if (chunk >= c->chunk_count ||
	    len != fb_accum_chunk_len(c->accum, chunk) * 4) {
		return FB_EPROTO;
	}
	return fb_accum_add(c->accum, chunk, data, a->weight, counter);
}

static fb_err pump(coord *c, int timeout_ms);

/* ---- secure aggregation (SecAgg+) ---------------------------------------- */

static void
sa_free(sa_round *sa)
{
	fb_secagg_server_free(sa->srv);
	free(sa->slot_worker);
	free(sa->flags);
	free(sa->adv);
	free(sa->shares);
	free(sa->share_len);
	memset(sa, 0, sizeof(*sa)); /* phase SA_OFF */
}

/* Takes worker w out of the round, telling it why. */
static void
sa_cancel(coord *c, worker *w, const char *why)
{
	fb_msg m = {.type = FB_MSG_ROUND_CANCEL};
	m.u.round_cancel.round = c->round;
	snprintf(m.u.round_cancel.reason, sizeof(m.u.round_cancel.reason), "%s",
	    why);
	(void)send_to(c, w, &m, NULL, 0, NULL);
	worker_fail(c, w, why);
}

/* The number of slots with `flag` set. */
static uint32_t
sa_count(const sa_round *sa, unsigned flag)
{
	uint32_t n = 0;
	for (uint32_t s = 0; s < sa->n; s++) {
		n += (sa->flags[s] & flag) != 0;
	}
	return n;
}

static worker *
sa_worker(coord *c, uint32_t slot)
{
	return &c->workers[c->sa.slot_worker[slot]];
}

/* Whether slot's worker is still taking part in the round. */
static bool
sa_in_round(coord *c, uint32_t slot)
{
	const worker *w = sa_worker(c, slot);
	return w->used && (w->state == W_TRAINING || w->state == W_UPLOADING ||
	                      w->state == W_DONE);
}

/*
 * sa_begin sets up the round's secure aggregation over the n selected
 * workers (cand[s] gets slot s): graph randomness, degree, threshold and
 * the encodings, which every worker derives the same way from RoundStart.
 * On failure *why says what is wrong and the round cannot run.
 */
static fb_err
sa_begin(coord *c, const uint32_t *cand, uint32_t n, double a_bound,
    const char **why)
{
	const fb_coord_config *cfg = c->cfg;
	sa_round *sa = &c->sa;
	/* auto (-1 in the config) is 0 for the library */
	uint32_t tcfg = cfg->sa_threshold > 0 ? (uint32_t)cfg->sa_threshold : 0;
	uint32_t kcfg = cfg->sa_neighbours > 0 ? (uint32_t)cfg->sa_neighbours
	                                       : FB_SECAGG_DEGREE_AUTO;
	uint32_t bits = (uint32_t)cfg->sa_ring_bits;
	fb_secagg_graph *g = NULL;
	fb_err rc;

	sa_free(sa);
	if (n < 2) {
		*why = "secure aggregation needs at least 2 workers in a round";
		return FB_ERANGE;
	}
	if (n > FB_SECAGG_MAX_WORKERS) {
		*why = "more workers in one round than secure aggregation takes";
		return FB_ERANGE;
	}
	sa->p.run = c->run;
	sa->p.round = c->round;
	sa->p.n = n;
	if (getrandom(sa->p.graph_seed, sizeof(sa->p.graph_seed), 0) !=
	    (ssize_t)sizeof(sa->p.graph_seed)) {
		*why = "no randomness for the neighbour graph";
		return FB_EIO;
	}
	rc = fb_secagg_graph_alloc(n, kcfg, tcfg,
	    sa->p.graph_seed, c->round, &g);
	if (rc != FB_OK) {
		*why = "cannot build the neighbour graph";
		return rc;
	}
	sa->k = fb_secagg_graph_degree(g);
	fb_secagg_graph_free(g);
	sa->t = tcfg != 0 ? tcfg : fb_secagg_threshold_default(sa->k);
	if (sa->t > sa->k + 1) {
		*why = "secure_aggregation.threshold exceeds a neighbourhood "
		       "(neighbours + 1) in this round: lower it, raise "
		       "secure_aggregation.neighbours, or add workers";
		return FB_ERANGE;
	}
	sa->n = n;
	sa->p.degree = sa->k;
	sa->p.threshold = sa->t;
	if (fb_secagg_encodings_init(&sa->enc, bits, n, cfg->sa_clip,
	        a_bound) != FB_OK) {
		*why = "no overflow-free encoding for this many workers: raise "
		       "secure_aggregation.ring_bits or lower "
		       "secure_aggregation.clip";
		return FB_ERANGE;
	}
	if ((rc = fb_secagg_server_alloc(&sa->p, &sa->srv)) != FB_OK) {
		*why = "cannot start the secure-aggregation server";
		return rc;
	}
	sa->slot_worker = calloc(n, sizeof(*sa->slot_worker));
	sa->flags = calloc(n, 1);
	sa->adv = calloc(n, FB_SECAGG_ADV_LEN);
	sa->shares = calloc((size_t)n * sa->k, FB_SECAGG_SHARE_MSG_LEN);
	sa->share_len = calloc(n, sizeof(*sa->share_len));
	if (sa->slot_worker == NULL || sa->flags == NULL || sa->adv == NULL ||
	    sa->shares == NULL || sa->share_len == NULL) {
		sa_free(sa);
		*why = "out of memory";
		return FB_ENOMEM;
	}
	for (uint32_t s = 0; s < n; s++) {
		sa->slot_worker[s] = cand[s];
		c->workers[cand[s]].slot = s;
	}
	sa->phase = SA_ADVERTS;
	sa->phase_end_ms = fb_now_ms() + cfg->sa_setup_ms;
	return FB_OK;
}

/* Fills the RoundStart fields of secure aggregation for worker w. */
static void
sa_round_start(const coord *c, const worker *w, fb_msg *m)
{
	const sa_round *sa = &c->sa;
	m->u.round_start.secagg = true;
	m->u.round_start.sa_slot = w->slot;
	m->u.round_start.sa_n = sa->n;
	m->u.round_start.sa_degree = sa->k;
	m->u.round_start.sa_threshold = sa->t;
	memcpy(m->u.round_start.sa_graph_seed.b, sa->p.graph_seed, 32);
	m->u.round_start.sa_graph_seed.len = 32;
	m->u.round_start.sa_ring_bits = sa->enc.x.bits;
	m->u.round_start.sa_clip = sa->enc.x.clip;
	m->u.round_start.sa_max_samples = (uint64_t)c->cfg->sa_max_samples;
	m->u.round_start.sa_a_bound = sa->enc.a.clip;
}

static drop_reason
sa_drop_reason(fb_err rc)
{
	return rc == FB_EAUTH ? DROP_BAD_SIGNATURE
	    : rc == FB_ESTALE ? DROP_STALE_ROUND
	                      : DROP_MALFORMED;
}

static void
on_secagg(coord *c, worker *w, const fb_frame *f)
{
	sa_round *sa = &c->sa;
	const fb_msg *m = &f->msg;
	uint32_t slot = w->slot;
	fb_err rc;

	if (m->u.secagg.round != c->round) {
		drop(c, DROP_STALE_ROUND, "secure-aggregation message for round "
		    "%u from %s (round %u is open)", m->u.secagg.round, w->name,
		    c->round);
		return;
	}
	if (sa->phase == SA_OFF || !(w->state == W_TRAINING ||
	                               w->state == W_UPLOADING ||
	                               w->state == W_DONE)) {
		drop(c, DROP_UNEXPECTED, "secure-aggregation message from %s, "
		    "which is %s", w->name, wstate_names[w->state]);
		return;
	}
	switch (m->u.secagg.phase) {
	case FB_SA_ADVERT:
		if (sa->phase != SA_ADVERTS || (sa->flags[slot] & SA_F_ADV)) {
			drop(c, DROP_UNEXPECTED, "key advert from %s in the %s "
			    "phase", w->name, sa_phase_names[sa->phase]);
			return;
		}
		rc = fb_secagg_server_add_advert(sa->srv, slot, &c->allow[w->id],
		    f->payload, f->payload_len);
		if (rc != FB_OK) {
			drop(c, sa_drop_reason(rc), "key advert from %s: %s",
			    w->name, fb_strerror(rc));
			sa_cancel(c, w, "bad secure-aggregation key advert");
			return;
		}
		memcpy(sa->adv + (size_t)slot * FB_SECAGG_ADV_LEN, f->payload,
		    FB_SECAGG_ADV_LEN);
		sa->flags[slot] |= SA_F_ADV;
		return;
	case FB_SA_SHARES:
		if (sa->phase != SA_SHARES || !(sa->flags[slot] & SA_F_ADV) ||
		    (sa->flags[slot] & SA_F_SHARED)) {
			drop(c, DROP_UNEXPECTED, "shares from %s in the %s phase",
			    w->name, sa_phase_names[sa->phase]);
			return;
		}
		if (f->payload_len > (size_t)sa->k * FB_SECAGG_SHARE_MSG_LEN) {
			drop(c, DROP_WRONG_SIZE, "%zu bytes of shares from %s",
			    f->payload_len, w->name);
			sa_cancel(c, w, "bad secure-aggregation shares");
			return;
		}
		rc = fb_secagg_server_add_shares(sa->srv, slot, f->payload,
		    f->payload_len);
		if (rc != FB_OK) {
			drop(c, sa_drop_reason(rc), "shares from %s: %s", w->name,
			    fb_strerror(rc));
			sa_cancel(c, w, "bad secure-aggregation shares");
			return;
		}
		memcpy(sa->shares + (size_t)slot * sa->k * FB_SECAGG_SHARE_MSG_LEN,
		    f->payload, f->payload_len);
		sa->share_len[slot] = (uint32_t)f->payload_len;
		sa->flags[slot] |= SA_F_SHARED;
		return;
	case FB_SA_REVEAL:
		if (sa->phase != SA_UNMASK || !(sa->flags[slot] & SA_F_INCLUDED) ||
		    (sa->flags[slot] & SA_F_REVEALED)) {
			drop(c, DROP_UNEXPECTED, "reveal from %s in the %s phase",
			    w->name, sa_phase_names[sa->phase]);
			return;
		}
		rc = fb_secagg_server_add_reveal(sa->srv, slot, f->payload,
		    f->payload_len);
		if (rc != FB_OK) {
			drop(c, sa_drop_reason(rc), "reveal from %s: %s", w->name,
			    fb_strerror(rc));
			return;
		}
		sa->flags[slot] |= SA_F_REVEALED;
		return;
	default:
		drop(c, DROP_UNEXPECTED, "secure-aggregation step %u from %s",
		    m->u.secagg.phase, w->name);
		return;
	}
}

static fb_err
sa_send(coord *c, worker *w, fb_secagg_phase phase, uint32_t count,
    const void *data, size_t len)
{
	fb_msg m = {.type = FB_MSG_SECAGG};
	m.u.secagg.round = c->round;
	m.u.secagg.phase = phase;
	m.u.secagg.count = count;
	return send_to(c, w, &m, data, len, NULL);
}

/* Key adverts are in (or late): each advertiser gets its neighbours'. */
static void
sa_send_peers(coord *c)
{
	sa_round *sa = &c->sa;
	const fb_secagg_graph *g = fb_secagg_server_graph(sa->srv);
	uint32_t *nb = calloc(sa->k + 1, sizeof(*nb));
	uint8_t *buf = calloc(sa->k + 1, FB_SECAGG_PEER_ENTRY_LEN);
	uint32_t u1 = 0;

	for (uint32_t s = 0; s < sa->n; s++) {
		worker *w = sa_worker(c, s);
		uint32_t cnt = 0;
		if (!sa_in_round(c, s)) {
			continue;
		}
		if (!(sa->flags[s] & SA_F_ADV)) {
			sa_cancel(c, w, "no secure-aggregation key advert within "
			                "secure_aggregation.setup_timeout");
			continue;
		}
		if (nb == NULL || buf == NULL ||
		    fb_secagg_graph_neighbours(g, s, nb) != FB_OK) {
			sa_cancel(c, w, "out of memory");
			continue;
		}
		for (uint32_t i = 0; i < sa->k; i++) {
			uint32_t j = nb[i];
			uint8_t *e = buf + (size_t)cnt * FB_SECAGG_PEER_ENTRY_LEN;
			if (!(sa->flags[j] & SA_F_ADV)) {
				continue;
			}
			e[0] = (uint8_t)j;
			e[1] = (uint8_t)(j >> 8);
			e[2] = (uint8_t)(j >> 16);
			e[3] = (uint8_t)(j >> 24);
			memcpy(e + 4, c->allow[sa_worker(c, j)->id].b,
			    FB_PUBKEY_LEN);
			memcpy(e + 4 + FB_PUBKEY_LEN,
			    sa->adv + (size_t)j * FB_SECAGG_ADV_LEN,
			    FB_SECAGG_ADV_LEN);
			cnt++;
		}
		if (sa_send(c, w, FB_SA_PEERS, cnt, buf,
		        (size_t)cnt * FB_SECAGG_PEER_ENTRY_LEN) != FB_OK) {
			worker_fail(c, w, "key adverts could not be sent");
			continue;
		}
		u1++;
	}
	free(nb);
	free(buf);
	fb_log_debug("round %u: %u key adverts relayed", c->round, u1);
	sa->phase = SA_SHARES;
	sa->phase_end_ms = fb_now_ms() + c->cfg->sa_setup_ms;
}

/* Shares are in (or late): each sharer gets the shares addressed to it. */
static void
sa_relay_shares(coord *c)
{
	sa_round *sa = &c->sa;
	uint8_t *buf = calloc(sa->k + 1, FB_SECAGG_SHARE_MSG_LEN);
	uint32_t u2 = 0;

	for (uint32_t s = 0; s < sa->n; s++) {
		worker *w = sa_worker(c, s);
		uint32_t cnt = 0;
		if (!sa_in_round(c, s) || !(sa->flags[s] & SA_F_ADV)) {
			continue;
		}
		if (!(sa->flags[s] & SA_F_SHARED)) {
			sa_cancel(c, w, "no secure-aggregation shares within "
			                "secure_aggregation.setup_timeout");
			continue;
		}
		for (uint32_t j = 0; buf != NULL && j < sa->n; j++) {
			const uint8_t *batch = sa->shares +
			    (size_t)j * sa->k * FB_SECAGG_SHARE_MSG_LEN;
			if (j == s || !(sa->flags[j] & SA_F_SHARED)) {
				continue;
			}
			for (uint32_t off = 0; off < sa->share_len[j];
			     off += FB_SECAGG_SHARE_MSG_LEN) {
				uint32_t from = 0, to = 0;
				if (fb_secagg_share_msg_peek(batch + off,
				        FB_SECAGG_SHARE_MSG_LEN, &from, &to) ==
				        FB_OK &&
				    to == s && cnt <= sa->k) {
					memcpy(buf + (size_t)cnt *
					        FB_SECAGG_SHARE_MSG_LEN,
					    batch + off, FB_SECAGG_SHARE_MSG_LEN);
					cnt++;
				}
			}
		}
		if (buf == NULL ||
		    sa_send(c, w, FB_SA_RELAY, cnt, buf,
		        (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN) != FB_OK) {
			worker_fail(c, w, "shares could not be relayed");
			continue;
		}
		u2++;
	}
	free(buf);
	fb_log_debug("round %u: shares relayed to %u workers", c->round, u2);
	sa->phase = SA_INPUT;
}

/* Moves the setup phases on once every worker answered or time is up. */
static void
sa_advance(coord *c)
{
	sa_round *sa = &c->sa;
	unsigned need = sa->phase == SA_ADVERTS ? 0 : SA_F_ADV;
	unsigned have = sa->phase == SA_ADVERTS ? SA_F_ADV : SA_F_SHARED;
	bool waiting = false;

	if (sa->phase != SA_ADVERTS && sa->phase != SA_SHARES) {
		return;
	}
	for (uint32_t s = 0; s < sa->n && !waiting; s++) {
		waiting = sa_in_round(c, s) && (sa->flags[s] & need) == need &&
		    !(sa->flags[s] & have);
	}
	if (waiting && fb_now_ms() < sa->phase_end_ms) {
		return;
	}
	if (sa->phase == SA_ADVERTS) {
		sa_send_peers(c);
	} else {
		sa_relay_shares(c);
	}
}

/*
 * sa_unmask runs the unmasking phase once the inputs are in: asks every
 * included worker for its shares, waits for them (bounded), reconstructs,
 * and removes the masks from the accumulator's ring. On FB_OK the
 * accumulator holds the weighted sum of the included updates; *W, *loss
 * and *a are the decoded sums of weights, weighted train losses and
 * weighted FedNova normalisers. Otherwise c->sa_why says why the round
 * cannot be committed.
 */
static fb_err
sa_unmask(coord *c, char *why, size_t why_len, double *W, double *loss,
    double *a)
{
	sa_round *sa = &c->sa;
	uint8_t *inc = NULL;
	uint32_t included = 0, revealed = 0;
	fb_err rc;

	if (sa->poisoned != NULL) {
		snprintf(why, why_len, "%s", sa->poisoned);
		return FB_ERANGE;
	}
	included = sa_count(sa, SA_F_INCLUDED);
	if (included < sa->t) {
		snprintf(why, why_len, "only %u masked inputs complete, below "
		    "the secure-aggregation threshold of %u", included, sa->t);
		return FB_ERANGE;
	}
	if ((inc = calloc(sa->n, 1)) == NULL) {
		snprintf(why, why_len, "out of memory");
		return FB_ENOMEM;
	}
	fb_secagg_server_included(sa->srv, inc);
	sa->phase = SA_UNMASK;
	sa->phase_end_ms = fb_now_ms() + c->cfg->sa_unmask_ms;
	for (uint32_t s = 0; s < sa->n; s++) {
		if ((sa->flags[s] & SA_F_INCLUDED) && sa_worker(c, s)->used) {
			(void)sa_send(c, sa_worker(c, s), FB_SA_UNMASK, sa->n, inc,
			    sa->n);
		}
	}
	free(inc);
	for (;;) {
		bool waiting = false;
		for (uint32_t s = 0; s < sa->n && !waiting; s++) {
			waiting = (sa->flags[s] & SA_F_INCLUDED) &&
			    !(sa->flags[s] & SA_F_REVEALED) &&
			    sa_worker(c, s)->used;
		}
		if (!waiting || fb_now_ms() >= sa->phase_end_ms || *c->stop) {
			break;
		}
		if ((rc = pump(c, 50)) != FB_OK) {
			snprintf(why, why_len, "%s", fb_strerror(rc));
			return rc;
		}
	}
	revealed = sa_count(sa, SA_F_REVEALED);
	rc = fb_secagg_server_finish(sa->srv);
	if (rc == FB_ERANGE) {
		snprintf(why, why_len, "too few shares to unmask: %u of %u "
		    "included workers answered, %u needed", revealed, included,
		    sa->t);
		return rc;
	}
	if (rc != FB_OK) {
		snprintf(why, why_len, "unmasking failed: %s%s", fb_strerror(rc),
		    rc == FB_EAUTH ? " (a reconstructed secret does not match "
		                     "its commitment: corrupt shares)"
		                   : "");
		return rc;
	}
	for (uint32_t k = 0; k < c->chunk_count && rc == FB_OK; k++) {
		uint64_t first = (uint64_t)k * c->chunk_elems;
		rc = fb_secagg_server_unmask_chunk(sa->srv,
		    fb_accum_ring(c->accum) + first, first,
		    fb_accum_chunk_len(c->accum, k));
	}
	if (rc == FB_OK) {
		rc = fb_secagg_server_unmask_chunk(sa->srv, sa->extra,
		    c->param_count, SA_EXTRA);
	}
	if (rc != FB_OK) {
		snprintf(why, why_len, "unmasking failed: %s", fb_strerror(rc));
		return rc;
	}
	if (fb_secagg_decode_extras(&sa->enc, sa->extra, W, loss, a) != FB_OK) {
		snprintf(why, why_len, "the included workers' weights sum to "
		    "zero");
		return FB_ERANGE;
	}
	if ((rc = fb_accum_set_secure_sum(c->accum, &sa->enc.x, *W)) != FB_OK) {
		snprintf(why, why_len, "cannot decode the sum: %s",
		    fb_strerror(rc));
		return rc;
	}
	fb_log_debug("round %u: unmasked the sum of %u inputs with %u "
	             "workers' shares (%" PRIu64 " mask expansions)",
	    c->round, included, revealed,
	    fb_secagg_server_correction_terms(sa->srv));
	return FB_OK;
}

/* Dispatches an authenticated (or, in plain mode, admitted) message. */
static void
dispatch(coord *c, worker *w, const fb_frame *f)
{
	w->last_seen_ms = fb_now_ms();
	switch (f->msg.type) {
	case FB_MSG_HEARTBEAT:
		break;
	case FB_MSG_MODEL_FETCH:
		on_model_fetch(c, w, &f->msg);
		break;
	case FB_MSG_UPDATE_BEGIN:
		on_update_begin(c, w, &f->msg);
		break;
	case FB_MSG_UPDATE_CHUNK:
		on_update_chunk(c, w, f);
		break;
	case FB_MSG_UPDATE_END:
		on_update_end(c, w, &f->msg);
		break;
	case FB_MSG_SECAGG:
		on_secagg(c, w, f);
		break;
	default:
		drop(c, DROP_UNEXPECTED, "%s from worker %s",
		    fb_msg_type_name(f->msg.type), w->name);
		break;
	}
}

/* Secure mode: a signed hello from a worker; answer with our reply. */
static void
on_handshake(coord *c, const fb_frame *f)
{
	const fb_blob *h = &f->msg.u.handshake.data;
	fb_hs_accept_cfg cfg = {
	    .self = c->self,
	    .run = c->run,
	    .proto_version = FB_PROTOCOL_VERSION,
	    .lookup = fb_allowlist_lookup_cb,
	};
	fb_allowlist al = {c->allow, c->allow_count};
	fb_msg out = {.type = FB_MSG_HANDSHAKE};
	fb_session *sess = NULL;
	fb_reject why = FB_REJECT_NONE;
	uint32_t id;
	worker *w;

	cfg.lookup_arg = &al;
	if (h->len == FB_HS_HELLO_LEN) {
		/* A hello seen before is a replay (nonce at 68..100). */
		for (uint32_t i = 0; i < HELLO_CACHE; i++) {
			if (memcmp(c->hello_nonces[i], h->b + 68, 32) == 0) {
				drop(c, DROP_REPLAY, "replayed handshake hello");
				return;
			}
		}
	}
	if (fb_handshake_accept(&cfg, h->b, h->len, out.u.handshake.data.b,
	        &sess, &why) != FB_OK) {
		char fp[FB_FINGERPRINT_SIZE] = "?";
		if ((why == FB_REJECT_UNKNOWN_KEY ||
		        why == FB_REJECT_BAD_SIGNATURE) &&
		    h->len == FB_HS_HELLO_LEN) {
			fb_pubkey pk;
			memcpy(pk.b, h->b + 4, FB_PUBKEY_LEN);
			fb_pubkey_fingerprint(&pk, fp);
		}
		drop(c, drop_of_reject(why), "handshake refused: %s (key %s)",
		    fb_reject_name(why), fp);
		/* door: the same REJECT for an unknown key and for a known
		 * key whose hello does not verify, so that the allowlist
		 * cannot be probed. */
		if (why == FB_REJECT_UNKNOWN_KEY ||
		    why == FB_REJECT_BAD_SIGNATURE) {
			char reason[FB_TEXT_MAX];
			snprintf(reason, sizeof(reason),
			    "key %s is not on this coordinator's allowlist, or "
			    "the hello was not signed with it", fp);
			send_reject(c, &f->peer, reason);
		} else if (why == FB_REJECT_VERSION) {
			send_reject(c, &f->peer, "protocol version not supported");
		}
		return;
	}
	memcpy(c->hello_nonces[c->hello_next], h->b + 68, 32);
	c->hello_next = (c->hello_next + 1) % HELLO_CACHE;
	if (!lane_admit(c, &f->peer, f->msg.u.handshake.lane)) {
		/* It hands shakes again on its lane, with a fresh hello. */
		fb_session_free(sess);
		return;
	}
	id = fb_session_worker_id(sess);
	w = &c->workers[id];
	if (w->sess == NULL) {
		w->sess = sess;
		w->peer = f->peer;
	} else {
		/* The live session stays until the new one is used: a replayed
		 * or stray hello cannot knock a worker out. */
		fb_session_free(w->pending);
		w->pending = sess;
	}
	out.u.handshake.data.len = FB_HS_REPLY_LEN;
	send_quiet(c, &f->peer, &out);
}

/* Secure mode: authenticate a sealed frame and hand it on. */
static void
on_sealed(coord *c, fb_frame *f)
{
	uint32_t id = 0;
	worker *w;
	int reject = 0;
	const char *why = NULL;
	uint8_t copy[FB_MAX_CONTROL_LEN + 256];
	bool have_copy = false;
	fb_err rc;

	if (fb_secure_sender(f, &id) != FB_OK) {
		drop(c, DROP_MALFORMED, "sealed frame without a header");
		return;
	}
	if (id >= c->allow_count || (c->workers[id].sess == NULL &&
	                                c->workers[id].pending == NULL)) {
		drop(c, DROP_UNKNOWN_PEER, "sealed frame from sender %u, which "
		    "has no session", id);
		return;
	}
	w = &c->workers[id];
	if (w->pending != NULL && f->sealed_len <= sizeof(copy)) {
		memcpy(copy, f->sealed_data, f->sealed_len);
		have_copy = true;
	}
	rc = w->sess != NULL ? fb_secure_open(w->sess, f, &reject, &why)
	                     : FB_EAUTH;
	if (rc != FB_OK && have_copy) {
		memcpy(f->sealed_data, copy, f->sealed_len);
		if (fb_secure_open(w->pending, f, &reject, &why) == FB_OK) {
			/* The worker restarted: its new session takes over. */
			if (w->used) {
				worker_fail(c, w, "worker restarted its session");
			}
			fb_session_free(w->sess);
			w->sess = w->pending;
			w->pending = NULL;
			w->peer = f->peer;
			rc = FB_OK;
		}
	}
	if (rc != FB_OK) {
		drop(c, drop_of_reject(reject), "sealed %s for worker %u: %s",
		    reject == FB_REJECT_NONE ? "frame" : "message", id,
		    why != NULL ? why : "rejected");
		return;
	}
	fb_link_peer_trust(c->link, &f->peer); /* door: it authenticated */
	if (!fb_peer_equal(&w->peer, &f->peer)) {
		/* Authentic and fresh from another connection: reconnected. */
		fb_log_info("worker %u reconnected", id);
		w->peer = f->peer;
	}
	if (f->msg.type == FB_MSG_HELLO) {
		on_hello(c, w, f);
		return;
	}
	if (!w->used) {
		drop(c, DROP_UNEXPECTED, "%s before hello from worker %u",
		    fb_msg_type_name(f->msg.type), id);
		return;
	}
	dispatch(c, w, f);
}

static void
handle_frame(coord *c, fb_frame *f)
{
	worker *w;

	if (c->secure) {
		if (f->sealed) {
			on_sealed(c, f);
		} else if (f->msg.type == FB_MSG_HANDSHAKE) {
			on_handshake(c, f);
		} else if (f->msg.type == FB_MSG_HELLO) {
			drop(c, DROP_INSECURE, "plain hello from '%s'",
			    f->msg.u.hello.name);
			send_reject(c, &f->peer,
			    "this coordinator only speaks encrypted, signed "
			    "sessions: give the worker security.key and "
			    "security.coordinator_key");
		} else {
			drop(c, DROP_INSECURE, "plain %s",
			    fb_msg_type_name(f->msg.type));
		}
		return;
	}
	if (f->sealed) {
		drop(c, DROP_MALFORMED, "sealed frame, but security is off");
		return;
	}
	w = find_peer(c, &f->peer);
	if (f->msg.type == FB_MSG_HELLO) {
		on_hello(c, w, f);
		return;
	}
	if (w == NULL) {
		drop(c, DROP_UNKNOWN_PEER, "%s from a peer that has not said "
		    "hello", fb_msg_type_name(f->msg.type));
		return;
	}
	dispatch(c, w, f);
}

/* Heartbeats to every worker, and the liveness check of each. */
static void
tick(coord *c)
{
	int64_t now = fb_now_ms();

	if (now - c->last_heartbeat_ms >= c->cfg->heartbeat_ms) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		hb.u.heartbeat.round = c->round;
		for (uint32_t i = 0; i < c->worker_cap; i++) {
			if (c->workers[i].used) {
				(void)send_to(c, &c->workers[i], &hb, NULL, 0, NULL);
			}
		}
		c->last_heartbeat_ms = now;
	}
	/* Liveness is in seconds: scanning every worker slot on every
	 * message (up to transport.max_workers) is wasted; every 10 ms. */
	if (now - c->last_scan_ms < 10) {
		return;
	}
	c->last_scan_ms = now;
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		worker *w = &c->workers[i];
		if (w->used && w->full_since_ms != 0 &&
		    now - w->full_since_ms > c->cfg->send_timeout_ms) {
			fb_log_warn("worker %s lost: its queue stayed full for "
			            "%.1fs (transport.send_timeout)", w->name,
			    (double)(now - w->full_since_ms) / 1000.0);
			worker_forget(c, w, "lost (not reading)");
		} else if (w->used &&
		    now - w->last_seen_ms > c->cfg->liveness_ms) {
			char why[96];
			snprintf(why, sizeof(why), "no message for %.1fs",
			    (double)(now - w->last_seen_ms) / 1000.0);
			fb_log_warn("worker %s lost: %s", w->name, why);
			worker_forget(c, w, "lost (liveness timeout)");
		}
	}
}

/* Waits up to `timeout_ms` for one message and handles it. */
static fb_err
pump(coord *c, int timeout_ms)
{
	fb_frame f;
	const char *why = NULL;
	fb_err rc;

	rc = fb_link_recv(c->link, timeout_ms, fb_ingest_wake_fd(c->ingest),
	    NULL, &f, &why);
	if ((rc == FB_OK || rc == FB_EPROTO) && rl_blocked(c, &f.peer)) {
		c->drops[DROP_RATE_LIMITED]++;
	} else if (rc == FB_OK) {
		c->cur_peer = &f.peer;
		handle_frame(c, &f);
		c->cur_peer = NULL;
	} else if (rc == FB_EPROTO) {
		worker *w = find_peer(c, &f.peer);
		c->cur_peer = &f.peer;
		drop(c, DROP_MALFORMED, "%s (from %s)", why,
		    w != NULL ? w->name : "an unknown peer");
		c->cur_peer = NULL;
	} else if (rc != FB_ETIMEDOUT) {
		return rc;
	}
	ingest_results(c);
	tick(c);
	return FB_OK;
}

static fb_err
wait_for_workers(coord *c)
{
	int64_t start = fb_now_ms();
	int64_t last_note = start;
	fb_err rc;

	while (live_count(c) < (uint32_t)c->cfg->min_workers) {
		if (*c->stop) {
			return FB_ECLOSED;
		}
		if (fb_now_ms() - start > c->cfg->wait_for_workers_ms) {
			fb_log_error("only %u of the %lld workers needed "
			             "(round.min_workers) connected within %.0fs "
			             "(round.wait_for_workers)",
			    live_count(c), (long long)c->cfg->min_workers,
			    (double)c->cfg->wait_for_workers_ms / 1000.0);
			return FB_ETIMEDOUT;
		}
		if (fb_now_ms() - last_note > 10000) {
			fb_log_info("waiting for workers: %u of %lld connected",
			    live_count(c), (long long)c->cfg->min_workers);
			last_note = fb_now_ms();
		}
		if ((rc = pump(c, 100)) != FB_OK) {
			return rc;
		}
	}
	return FB_OK;
}

/*
 * Model chunks may still be queued in ZeroMQ for a worker that stopped
 * reading (one dropped at the deadline): they keep the bytes they were sent
 * from, and the model is written into fresh memory (see fb_lent_own).
 */
static fb_err
model_writable(coord *c, fb_lent **b, size_t len, bool keep)
{
	fb_err rc = fb_lent_own(b, len, keep);
	if (rc != FB_OK) {
		fb_log_error("round %u: out of memory for the model", c->round);
	}
	return rc;
}

/*
 * Secure mode: encrypts the global model ONCE for the round, under a fresh
 * round key, into the broadcast buffer; every selected worker gets the same
 * ciphertext and the key sealed to its own session.
 */
static fb_err
encrypt_broadcast(coord *c)
{
	fb_stream_ctx ctx = {.run = c->run, .round = c->round,
	    .sender = FB_SENDER_COORDINATOR};
	fb_stream_push *p = NULL;
	const uint8_t *src = (const uint8_t *)c->params;
	fb_err rc;

	if ((rc = model_writable(c, &c->bcast_lent,
	         c->bcast_stride * c->chunk_count, false)) != FB_OK) {
		return rc;
	}
	c->bcast = fb_lent_data(c->bcast_lent);
	rc = fb_stream_push_alloc(&ctx, c->chunk_elems * 4,
	    FB_STREAM_DIGEST_FULL, c->round_key, c->stream_header, &p);
	if (rc != FB_OK) {
		return rc;
	}
	for (uint32_t k = 0; k < c->chunk_count && rc == FB_OK; k++) {
		uint64_t len = fb_accum_chunk_len(c->accum, k) * 4;
		uint8_t *dst = c->bcast + (uint64_t)k * c->bcast_stride;
		size_t clen = 0;
		rc = fb_stream_push_chunk(p, src + (uint64_t)k * c->chunk_elems * 4,
		    len, k + 1 == c->chunk_count, dst, c->bcast_stride, &clen);
		c->bcast_len[k] = (uint32_t)clen;
	}
	if (rc == FB_OK) {
		rc = fb_stream_push_final(p, c->self, c->stream_trailer);
	}
	fb_stream_push_free(p);
	return rc;
}

/*
 * sa_a_bound returns the public bound on a worker's FedNova ||a_i||_1 this
 * round: that of the most local steps the round policy can give.
 */
static double
sa_a_bound(const coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	double steps, a = 1.0;

	if (!fb_rule_is_fednova((fb_rule)cfg->rule)) {
		return 1.0;
	}
	steps = cfg->local_steps > 0
	    ? (double)cfg->local_steps
	    : ceil(cfg->local_epochs * (double)cfg->sa_max_samples /
	          (double)cfg->batch_size);
	if (cfg->local_work == 1 && (double)cfg->max_steps > steps) {
		steps = (double)cfg->max_steps;
	}
	if (fb_fednova_a_norm((uint64_t)(steps < 1 ? 1 : steps), cfg->momentum,
	        cfg->lr, cfg->prox_mu, &a) != FB_OK) {
		return 1.0;
	}
	return a * (1 + 1e-6);
}

/* Picks this round's workers and tells each its work. */
static uint32_t
start_round(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	uint32_t *cand, ncand = 0, nsel;
	uint64_t total = 0;
	uint32_t selected = 0;

	cand = calloc(c->worker_cap, sizeof(*cand));
	if (cand == NULL) {
		return 0;
	}
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		c->workers[i].state = W_IDLE;
		c->workers[i].fail_reason = NULL;
		if (c->workers[i].used) {
			cand[ncand++] = i;
		}
	}
	nsel = ncand;
	c->target_updates = ncand;
	if (cfg->workers_per_round > 0 &&
	    (uint32_t)cfg->workers_per_round < ncand) {
		c->target_updates = (uint32_t)cfg->workers_per_round;
		nsel = c->target_updates + (uint32_t)cfg->over_select;
		nsel = nsel < ncand ? nsel : ncand;
		fb_rng_shuffle_u32(&c->rng, cand, ncand);
	}
	c->waiting_logged = false;
	for (uint32_t s = 0; s < nsel; s++) {
		total += c->workers[cand[s]].num_samples;
	}
	fb_accum_reset(c->accum);
	if (c->secure && encrypt_broadcast(c) != FB_OK) {
		fb_log_error("round %u: cannot encrypt the model", c->round);
		nsel = 0;
	}
	sa_free(&c->sa);
	c->in_chunks = c->chunk_count;
	memset(c->sa_why, 0, sizeof(c->sa_why));
	if (cfg->sa_enabled && nsel > 0) {
		const char *why = NULL;
		if (sa_begin(c, cand, nsel, sa_a_bound(c), &why) != FB_OK) {
			snprintf(c->sa_why, sizeof(c->sa_why), "%s", why);
			fb_log_error("round %u: cannot aggregate securely: %s",
			    c->round, why);
			sa_free(&c->sa);
			nsel = 0;
		} else {
			c->in_chunks = c->chunk_count + 1;
		}
	}
	c->round_started_ms = fb_now_ms();
	c->deadline_ms = c->round_started_ms + cfg->deadline_ms;
	for (uint32_t s = 0; s < nsel; s++) {
		worker *w = &c->workers[cand[s]];
		fb_msg m = {.type = FB_MSG_ROUND_START};
		uint64_t steps = (uint64_t)cfg->local_steps;
		if (steps == 0 && c->sa.phase != SA_OFF) {
			/* The sample count is the worker's secret: it turns
			 * local_epochs into steps itself. */
			m.u.round_start.local_epochs = (float)cfg->local_epochs;
		} else if (steps == 0) {
			steps = (uint64_t)ceil(cfg->local_epochs *
			    (double)w->num_samples / (double)cfg->batch_size);
			steps = steps == 0 ? 1 : steps;
		}
		if (cfg->local_work == 1 && w->has_speed) {
			/* time_budget: as many steps as fit in the budget at the
			 * worker's measured speed (the first round, without a
			 * measurement, uses the fixed local work). */
			double fit = floor(w->speed *
			    (double)cfg->time_budget_ms / 1000.0);
			fit = fit < (double)cfg->min_steps ? (double)cfg->min_steps
			                                   : fit;
			fit = fit > (double)cfg->max_steps ? (double)cfg->max_steps
			                                   : fit;
			steps = (uint64_t)fit;
		}
		w->round_speed = 0;
		w->a_norm = 0;
		w->done_ms = 0;
		w->weight = total > 0 ? (double)w->num_samples / (double)total
		                      : 0.0;
		w->assigned_steps = steps;
		w->next_chunk = 0;
		w->steps = 0;
		w->train_loss = 0;
		w->train_seconds = 0;
		m.u.round_start.round = c->round;
		m.u.round_start.param_count = c->param_count;
		m.u.round_start.chunk_count = c->chunk_count;
		m.u.round_start.chunk_bytes = c->chunk_elems * 4;
		m.u.round_start.local_steps = steps;
		m.u.round_start.batch_size = (uint32_t)cfg->batch_size;
		m.u.round_start.lr = (float)cfg->lr;
		m.u.round_start.momentum = (float)cfg->momentum;
		m.u.round_start.weight_decay = (float)cfg->weight_decay;
		m.u.round_start.seed = (uint64_t)cfg->seed;
		m.u.round_start.deadline_ms = (uint32_t)cfg->deadline_ms;
		m.u.round_start.prox_mu = (float)cfg->prox_mu;
		m.u.round_start.fednova = fb_rule_is_fednova((fb_rule)cfg->rule);
		m.u.round_start.synthetic =
		    strcmp(cfg->model_arch, "synthetic") == 0;
		/* Uploads start evenly spread over the model, so that the
		 * ingest threads add different streams to different chunks
		 * of the sum instead of queueing on the same one. */
		w->first_chunk = (uint32_t)((uint64_t)s * c->chunk_count / nsel);
		m.u.round_start.first_chunk = w->first_chunk;
		if (c->sa.phase != SA_OFF) {
			sa_round_start(c, w, &m);
		}
		if (c->secure) {
			memcpy(m.u.round_start.round_key.b, c->round_key,
			    FB_STREAM_KEY_LEN);
			m.u.round_start.round_key.len = FB_STREAM_KEY_LEN;
			memcpy(m.u.round_start.stream_header.b, c->stream_header,
			    FB_STREAM_HEADER_LEN);
			m.u.round_start.stream_header.len = FB_STREAM_HEADER_LEN;
			memcpy(m.u.round_start.stream_trailer.b,
			    c->stream_trailer, FB_STREAM_TRAILER_LEN);
			m.u.round_start.stream_trailer.len =
			    FB_STREAM_TRAILER_LEN;
		}
		w->state = W_TRAINING;
		if (send_to(c, w, &m, NULL, 0, NULL) != FB_OK) {
			worker_fail(c, w, "round start could not be sent");
		}
		fb_wipe(&m.u.round_start.round_key, sizeof(m.u.round_start.round_key));
		selected++;
	}
	free(cand);
	return selected;
}

static bool
round_finished(const coord *c)
{
	uint32_t done = 0;
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		done += c->workers[i].used && c->workers[i].state == W_DONE;
	}
	if (done >= c->target_updates) {
		return true;
	}
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		const worker *w = &c->workers[i];
		if (w->used && (w->state == W_TRAINING ||
		                   w->state == W_UPLOADING)) {
			return false;
		}
	}
	return true;
}

static void
cancel_stragglers(coord *c, bool deadline, bool keep_uploads)
{
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		worker *w = &c->workers[i];
		if (w->used && (w->state == W_TRAINING ||
		                   (w->state == W_UPLOADING && !keep_uploads))) {
			fb_msg m = {.type = FB_MSG_ROUND_CANCEL};
			m.u.round_cancel.round = c->round;
			snprintf(m.u.round_cancel.reason,
			    sizeof(m.u.round_cancel.reason), "%s",
			    deadline ? "round deadline passed"
			             : "the round has the updates it needs");
			(void)send_to(c, w, &m, NULL, 0, NULL);
			worker_fail(c, w, !deadline ? "not needed (over-selected)"
			        : w->state == W_UPLOADING
			        ? "deadline passed during upload"
			        : "deadline passed during training");
		}
	}
}

static void
json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\') {
			fprintf(f, "\\%c", ch);
		} else if (ch < 0x20) {
			fprintf(f, "\\u%04x", ch);
		} else {
			fputc(ch, f);
		}
	}
	fputc('"', f);
}

typedef struct round_result {
	const char *status;  /* "ok", "failed" */
	uint32_t selected;
	uint32_t participants;
	uint32_t partial;
	double test_accuracy; /* NaN when not evaluated */
	double test_loss;
	double train_loss;
	double seconds;
	double sa_a;          /* SecAgg: sum p_i a_i / sum p_i (FedNova) */
} round_result;

static fb_err
write_metrics(coord *c, const round_result *r)
{
	FILE *f = fopen(c->metrics_path, "a");
	bool first = true;

	if (f == NULL) {
		fb_log_error("cannot append to %s", c->metrics_path);
		return FB_EIO;
	}
	fprintf(f, "{\"round\": %u, \"status\": \"%s\", \"selected\": %u, "
	           "\"participants\": %u, \"partial\": %u, ",
	    c->round, r->status, r->selected, r->participants, r->partial);
	if (isnan(r->test_accuracy)) {
		fprintf(f, "\"test_accuracy\": null, \"test_loss\": null, ");
	} else {
		fprintf(f, "\"test_accuracy\": %.6f, \"test_loss\": %.6f, ",
		    r->test_accuracy, r->test_loss);
	}
	fprintf(f, "\"rule\": \"%s\", \"tau_eff\": %.6g, ",
	    fb_rule_names[c->cfg->rule], c->tau_eff);
	if (isnan(r->train_loss)) {
		fprintf(f, "\"train_loss\": null, ");
	} else {
		fprintf(f, "\"train_loss\": %.6f, ", r->train_loss);
	}
	if (strcmp(r->status, "ok") != 0 && c->sa_why[0] != '\0') {
		fprintf(f, "\"reason\": ");
		json_str(f, c->sa_why);
		fprintf(f, ", ");
	}
	if (c->sa.phase != SA_OFF) {
		fprintf(f, "\"secure_aggregation\": {\"workers\": %u, "
		           "\"neighbours\": %u, \"threshold\": %u, "
		           "\"included\": %u, \"revealed\": %u}, ",
		    c->sa.n, c->sa.k, c->sa.t, sa_count(&c->sa, SA_F_INCLUDED),
		    sa_count(&c->sa, SA_F_REVEALED));
	}
	fprintf(f, "\"seconds\": %.3f, \"bytes_up\": %"
	           PRIu64 ", \"bytes_down\": %" PRIu64 ", \"clipped\": %" PRIu64
	           ", \"rejected\": {",
	    r->seconds, c->up_bytes, c->down_bytes, c->clipped);
	for (int i = 0; i < DROP_REASON_COUNT_; i++) {
		fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", drop_names[i],
		    c->drops[i] - c->drops_reported[i]);
	}
	fprintf(f, "}, \"workers\": [");
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		const worker *w = &c->workers[i];
		if (!w->used || w->state == W_IDLE) {
			continue;
		}
		fprintf(f, "%s{\"name\": ", first ? "" : ", ");
		json_str(f, w->name);
		fprintf(f, ", \"status\": \"%s\"", wstate_names[w->state]);
		if (c->sa.phase == SA_OFF) {
			fprintf(f, ", \"assigned_steps\": %" PRIu64 ", \"steps\": %"
			           PRIu64 ", \"train_seconds\": %.3f",
			    w->assigned_steps, w->steps, w->train_seconds);
		} else if (w->assigned_steps > 0) {
			/* Secure aggregation: what a worker did stays its own;
			 * its speed is known (it schedules time budgets). */
			fprintf(f, ", \"assigned_steps\": %" PRIu64,
			    w->assigned_steps);
		}
		fprintf(f, ", \"steps_per_s\": %.3f, \"made_deadline\": %s",
		    w->round_speed,
		    w->state == W_DONE && w->done_ms <= c->deadline_ms ? "true"
		                                                      : "false");
		if (fb_rule_is_fednova((fb_rule)c->cfg->rule) &&
		    c->sa.phase == SA_OFF) {
			fprintf(f, ", \"a_norm\": %.6g", w->a_norm);
		}
		fprintf(f, ", \"backend\": ");
		json_str(f, w->backend);
		if (w->fail_reason != NULL) {
			fprintf(f, ", \"reason\": ");
			json_str(f, w->fail_reason);
		}
		fputc('}', f);
		first = false;
	}
	fprintf(f, "]}\n");
	memcpy(c->drops_reported, c->drops, sizeof(c->drops));
	if (fflush(f) != 0 || ferror(f)) {
		fclose(f);
		fb_log_error("cannot write %s", c->metrics_path);
		return FB_EIO;
	}
	fclose(f);
	return FB_OK;
}

static fb_err
save_model(coord *c, double acc)
{
	char round[16], accs[32], run[32];
	const char *const meta[][2] = {
	    {"format", "pt"},
	    {"fedbox.round", round},
	    {"fedbox.model", c->model_desc},
	    {"fedbox.preprocessing", FB_FMNIST_PREPROCESSING},
	    {"fedbox.test_accuracy", accs},
	    {"fedbox.run_id", run},
	    {"fedbox.version", FB_VERSION},
	};
	snprintf(round, sizeof(round), "%u", c->round);
	if (isnan(acc)) {
		snprintf(accs, sizeof(accs), "null");
	} else {
		snprintf(accs, sizeof(accs), "%.6f", acc);
	}
	snprintf(run, sizeof(run), "%016" PRIx64, c->run_id);
	return fb_model_save_safetensors(c->model, c->params, c->model_path,
	    meta, FB_ARRAY_LEN(meta));
}

static bool
uploads_in_flight(const coord *c)
{
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		if (c->workers[i].used && c->workers[i].state == W_UPLOADING) {
			return true;
		}
	}
	return false;
}

static fb_err
run_round(coord *c, uint32_t rounds_total)
{
	fb_err rc = FB_OK;
	round_result r = {.status = "ok", .test_accuracy = NAN,
	    .test_loss = NAN};
	uint64_t sent0 = fb_link_bytes_sent(c->link);
	uint64_t recv0 = fb_link_bytes_received(c->link);
	double wloss = 0, wsum = 0;
	bool cancelled = false, mixed = false;
	const char *backend = NULL;

	c->clipped_base = fb_ingest_counter(c->ingest);
	c->first_begin_s = 0;
	r.selected = start_round(c);
	while (!round_finished(c)) {
		int64_t left = c->deadline_ms - fb_now_ms();
		if (*c->stop) {
			cancel_stragglers(c, true, false);
			return FB_ECLOSED;
		}
		if (left <= 0 && c->cfg->stragglers == 1) {
			if (!c->waiting_logged) {
				fb_log_warn("round %u: deadline (%.1fs) passed; "
				            "waiting for the stragglers "
				            "(round.stragglers: wait)",
				    c->round,
				    (double)c->cfg->deadline_ms / 1000.0);
				c->waiting_logged = true;
			}
			left = 100;
		} else if (left <= 0 && c->sa.phase == SA_INPUT &&
		    uploads_in_flight(c) &&
		    -left < c->cfg->sa_unmask_ms) {
			/* A masked input must arrive whole or not at all:
			 * uploads under way at the deadline may finish. */
			if (!c->waiting_logged) {
				fb_log_warn("round %u: deadline (%.1fs) passed; "
				            "letting the masked uploads under way "
				            "finish",
				    c->round,
				    (double)c->cfg->deadline_ms / 1000.0);
				cancel_stragglers(c, true, true);
				c->waiting_logged = true;
			}
			left = 100;
		} else if (left <= 0) {
			/* Updates whose last chunks the pool holds are in. */
			ingest_settle(c);
			if (round_finished(c)) {
				break;
			}
			fb_log_warn("round %u: deadline (%.1fs) reached",
			    c->round, (double)c->cfg->deadline_ms / 1000.0);
			cancel_stragglers(c, true, false);
			cancelled = true;
			break;
		}
		if ((rc = pump(c, left < 100 ? (int)left : 100)) != FB_OK) {
			return rc;
		}
		sa_advance(c);
	}
	(void)cancelled;
	/* Over-selection: the round has its updates; stop the others. */
	cancel_stragglers(c, false, false);
	/* Every chunk received is added before the round commits. */
	ingest_settle(c);
	c->clipped = fb_ingest_counter(c->ingest) - c->clipped_base;
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		const worker *w = &c->workers[i];
		if (w->used && w->state == W_DONE) {
			r.participants++;
			if (backend == NULL) {
				backend = w->backend;
			} else if (strcmp(backend, w->backend) != 0) {
				mixed = true;
			}
			wloss += w->weight * w->train_loss;
			wsum += w->weight;
		} else if (w->state == W_FAILED && w->next_chunk > 0) {
			r.partial++;
		}
	}
	r.train_loss = wsum > 0 ? wloss / wsum : NAN;
	if (c->sa.phase != SA_OFF &&
	    r.participants >= (uint32_t)c->cfg->min_updates) {
		double W = 0, loss = 0, a = 0;
		if (sa_unmask(c, c->sa_why, sizeof(c->sa_why), &W, &loss, &a) !=
		    FB_OK) {
			r.status = "aborted";
			fb_log_error("round %u aborted: %s; the model is unchanged",
			    c->round, c->sa_why);
		} else {
			r.train_loss = loss;
			r.sa_a = a;
			/* Included inputs, also of workers lost since. */
			r.participants = sa_count(&c->sa, SA_F_INCLUDED);
		}
	}
	if (strcmp(r.status, "ok") != 0) {
		/* aborted above */
	} else if (r.participants >= (uint32_t)c->cfg->min_updates) {
		double scale = 1.0;
		if (c->sa.phase != SA_OFF &&
		    fb_rule_is_fednova((fb_rule)c->cfg->rule)) {
			/* tau_eff = sum p_i a_i / sum p_i from the masked sums */
			scale = r.sa_a;
		} else if (fb_rule_is_fednova((fb_rule)c->cfg->rule)) {
			/* tau_eff = sum p_i ||a_i||_1 / sum p_i over the updates
			 * included (their weights p_i are the sample shares). */
			double pa = 0, p = 0;
			for (uint32_t i = 0; i < c->worker_cap; i++) {
				const worker *w = &c->workers[i];
				if (w->used && w->state == W_DONE) {
					pa += w->weight * w->a_norm;
					p += w->weight;
				}
			}
			scale = p > 0 ? pa / p : 1.0;
		}
		c->tau_eff = scale;
		if ((rc = model_writable(c, &c->params_lent, c->param_count * 4,
		         true)) != FB_OK) {
			return rc;
		}
		c->params = fb_lent_data(c->params_lent);
		if ((rc = fb_server_opt_step(c->opt, c->accum, c->params, scale)) !=
		    FB_OK) {
			fb_log_error("round %u: server step failed: %s", c->round,
			    fb_strerror(rc));
			return rc;
		}
		if (c->evaluate && c->cfg->eval_every > 0 &&
		    (c->round % c->cfg->eval_every == 0 ||
		        c->round == rounds_total)) {
			rc = fb_model_evaluate(c->model, c->params, c->test.x,
			    c->test.y, c->test.count, &r.test_loss,
			    &r.test_accuracy);
			if (rc != FB_OK) {
				fb_log_error("evaluation failed: %s",
				    fb_strerror(rc));
				return rc;
			}
		}
		if ((rc = save_model(c, r.test_accuracy)) != FB_OK) {
			return rc;
		}
	} else {
		r.status = "failed";
		if (c->sa_why[0] == '\0') {
			snprintf(c->sa_why, sizeof(c->sa_why), "%u complete "
			    "updates, %lld needed (round.min_updates)",
			    r.participants, (long long)c->cfg->min_updates);
		}
		fb_log_error("round %u failed: %s; the model is unchanged",
		    c->round, c->sa_why);
	}
	c->up_bytes = fb_link_bytes_received(c->link) - recv0;
	c->down_bytes = fb_link_bytes_sent(c->link) - sent0;
	r.seconds = (double)(fb_now_ms() - c->round_started_ms) / 1000.0;
	if ((rc = write_metrics(c, &r)) != FB_OK) {
		return rc;
	}
	printf("round %3u/%u  workers %u/%u%s  ", c->round, rounds_total,
	    r.participants, r.selected, r.partial ? " (+partial)" : "");
	if (isnan(r.test_accuracy)) {
		printf("acc    -     loss   -     ");
	} else {
		printf("acc %6.2f%%  loss %.4f  ", 100.0 * r.test_accuracy,
		    r.test_loss);
	}
	printf("%6.1fs  up %.1f MB  down %.1f MB", r.seconds,
	    (double)c->up_bytes / 1e6, (double)c->down_bytes / 1e6);
	if (backend != NULL && backend[0] != '\0') {
		printf("  [%s%s]", backend, mixed ? " and others" : "");
	}
	sa_free(&c->sa);
	if (strcmp(r.status, "ok") == 0) {
		printf("\n");
	} else {
		printf("  %s (model unchanged): %s\n",
		    strcmp(r.status, "aborted") == 0 ? "ABORTED" : "FAILED",
		    c->sa_why);
	}
	fflush(stdout);
	return FB_OK;
}

static void
shutdown_workers(coord *c, const char *reason)
{
	fb_msg m = {.type = FB_MSG_SHUTDOWN};
	snprintf(m.u.shutdown.reason, sizeof(m.u.shutdown.reason), "%s",
	    reason);
	for (uint32_t i = 0; i < c->worker_cap; i++) {
		if (c->workers[i].used) {
			(void)send_to(c, &c->workers[i], &m, NULL, 0, NULL);
		}
	}
	/* Give the I/O thread a moment to flush before the socket closes. */
	fb_sleep_ms(200);
}

/* Adds one allowlist line ("fedbox-ed25519 KEY NAME") as worker id n. */
static fb_err
allow_add(coord *c, const char *line, const char *where)
{
	fb_pubkey pk;
	char name[FB_COMMENT_MAX];
	uint32_t n = c->allow_count;

	if (fb_pubkey_parse(line, &pk, name, sizeof(name)) != FB_OK) {
		fb_log_error("%s: not a fedbox public key line: '%.60s'", where,
		    line);
		return FB_ECONFIG;
	}
	if (name[0] == '\0' || strlen(name) >= FB_NAME_MAX ||
	    strchr(name, ' ') != NULL) {
		fb_log_error("%s: the key's comment must be the worker's name "
		             "(one word, < %d bytes): '%.60s'",
		    where, FB_NAME_MAX, line);
		return FB_ECONFIG;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (fb_pubkey_equal(&c->allow[i], &pk) ||
		    strcmp(c->allow_names[i], name) == 0) {
			fb_log_error("%s: worker '%s' or its key is listed twice",
			    where, name);
			return FB_ECONFIG;
		}
	}
	{
		fb_pubkey *keys = realloc(c->allow, (n + 1) * sizeof(*keys));
		if (keys == NULL) {
			return FB_ENOMEM;
		}
		c->allow = keys;
	}
	{
		char(*names)[FB_NAME_MAX] = realloc(c->allow_names,
		    (n + 1) * sizeof(*names));
		if (names == NULL) {
			return FB_ENOMEM;
		}
		c->allow_names = names;
	}
	c->allow[n] = pk;
	snprintf(c->allow_names[n], FB_NAME_MAX, "%s", name);
	c->allow_count = n + 1;
	return FB_OK;
}

static fb_err
load_security(coord *c, const fb_coord_config *cfg)
{
	fb_err rc;
	char line[FB_PUBLINE_MAX + 64];
	FILE *f;
	unsigned lineno = 0;

	if (cfg->key[0] == '\0') {
		fb_log_error("security.key is required (the coordinator's "
		             "identity; make one with fedbox-keygen -o NAME), "
		             "or set security.enabled: false");
		return FB_ECONFIG;
	}
	if ((rc = fb_identity_load(cfg->key, &c->self)) != FB_OK) {
		return rc == FB_ENOMEM ? rc : FB_ECONFIG;
	}
	for (size_t i = 0; i < cfg->workers.count; i++) {
		if ((rc = allow_add(c, cfg->workers.v[i], "security.workers")) !=
		    FB_OK) {
			return rc;
		}
	}
	if (cfg->allowlist[0] != '\0') {
		if ((f = fopen(cfg->allowlist, "r")) == NULL) {
			fb_log_error("security.allowlist: cannot open %s",
			    cfg->allowlist);
			return FB_ECONFIG;
		}
		while (fgets(line, sizeof(line), f) != NULL) {
			char where[4200];
			size_t n = strcspn(line, "\r\n");
			lineno++;
			line[n] = '\0';
			if (line[0] == '\0' || line[0] == '#') {
				continue;
			}
			snprintf(where, sizeof(where), "%s:%u", cfg->allowlist,
			    lineno);
			if ((rc = allow_add(c, line, where)) != FB_OK) {
				fclose(f);
				return rc;
			}
		}
		fclose(f);
	}
	if (c->allow_count == 0) {
		fb_log_error("no worker may join: list their public keys in "
		             "security.allowlist (a file) or security.workers");
		return FB_ECONFIG;
	}
	if ((c->hello_nonces = calloc(HELLO_CACHE, 32)) == NULL) {
		return FB_ENOMEM;
	}
	if ((rc = fb_run_id_random(&c->run)) != FB_OK) {
		return rc;
	}
	memcpy(&c->run_id, c->run.b, sizeof(c->run_id));
	c->bcast_stride = (uint64_t)c->chunk_elems * 4 + FB_STREAM_CHUNK_OVERHEAD;
	c->bcast_len = calloc(c->chunk_count, sizeof(*c->bcast_len));
	if (c->bcast_len == NULL ||
	    fb_lent_new(c->bcast_stride * c->chunk_count, &c->bcast_lent) !=
	        FB_OK) {
		return FB_ENOMEM;
	}
	c->bcast = fb_lent_data(c->bcast_lent);
	c->secure = true;
	{
		fb_pubkey pk;
		char fp[FB_FINGERPRINT_SIZE];
		fb_identity_pubkey(c->self, &pk);
		fb_pubkey_fingerprint(&pk, fp);
		fb_log_info("secure sessions on: identity %s, %u workers on the "
		            "allowlist", fp, c->allow_count);
	}
	return FB_OK;
}

static fb_err
coord_init(coord *c, const fb_coord_config *cfg, bool resume,
    uint32_t *first_round)
{
	fb_err rc;
	fb_model_spec spec;
	/* Sends never wait: a worker that stops reading loses messages and,
	 * past transport.send_timeout, its place (tick). Model chunks go
	 * without a copy, so the send queue may hold a whole fetch window. */
	fb_link_opts lo = {
	    .max_payload = (uint32_t)cfg->chunk_size,
	    .send_timeout_ms = 0,
	    .hwm = 16,
	    .send_hwm = FB_FETCH_WINDOW_MAX + 16,
	    .io_threads = cfg->io_threads < 0 ? (int)fb_io_threads_auto()
	                                      : (int)cfg->io_threads,
	    /* door: limits on connections until they authenticate */
	    .door = {
	        .max_connections = cfg->max_connections < 0
	            ? 0
	            : (uint32_t)cfg->max_connections,
	        .max_pending = (uint32_t)cfg->max_pending,
	        .max_per_source = (uint32_t)cfg->max_pending_per_source,
	        .handshake_ms = (uint32_t)cfg->handshake_timeout_ms,
	        .max_pending_bytes = (uint32_t)cfg->max_pending_bytes,
	        .max_pending_memory = cfg->max_pending_memory,
	        .fd_reserve = (uint32_t)cfg->fd_reserve,
	    },
	};
	/* lanes auto: one per I/O thread where the endpoint is TCP; lanes set
	 * with io_threads auto: at least as many I/O threads as lanes. */
	if (cfg->lanes < 0) {
		lo.lanes = strncmp(cfg->listen, "tcp://", 6) == 0 ? lo.io_threads
		                                                  : 1;
	} else {
		lo.lanes = (int)cfg->lanes;
		if (cfg->io_threads < 0 && lo.io_threads < lo.lanes) {
			lo.io_threads = lo.lanes;
		}
	}

	*first_round = 1;
	pthread_mutex_init(&c->extra_mu, NULL);
	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "%s", cfg->model_arch);
	spec.input_dim = (uint32_t)cfg->input_dim;
	spec.classes = (uint32_t)cfg->classes;
	spec.hidden_count = (uint32_t)cfg->hidden.count;
	if (spec.hidden_count > FB_MODEL_MAX_HIDDEN) {
		fb_log_error("model.hidden: at most %d layers",
		    FB_MODEL_MAX_HIDDEN);
		return FB_ECONFIG;
	}
	for (size_t i = 0; i < cfg->hidden.count; i++) {
		spec.hidden[i] = (uint32_t)cfg->hidden.v[i];
	}
	spec.synthetic_params = (uint64_t)cfg->synthetic_params;
	snprintf(spec.plugin, sizeof(spec.plugin), "%s", cfg->plugin);
	if ((rc = fb_model_open(&spec, &c->model)) != FB_OK) {
		fb_log_error("cannot create the model: %s", fb_strerror(rc));
		return rc == FB_EINVAL ? FB_ECONFIG : rc;
	}
	fb_model_describe(c->model, c->model_desc, sizeof(c->model_desc));
	c->param_count = fb_model_param_count(c->model);
	c->chunk_elems = (uint32_t)(cfg->chunk_size / 4);
	rc = fb_accum_alloc(c->param_count, c->chunk_elems, cfg->clip,
	    &c->accum);
	if (rc != FB_OK) {
		return rc;
	}
	c->chunk_count = fb_accum_chunk_count(c->accum);
	{
		fb_server_opt_params op;
		fb_server_opt_params_default(&op,
		    fb_rule_server_kind((fb_rule)cfg->rule));
		op.lr = cfg->server_lr;
		op.beta1 = cfg->beta1;
		op.beta2 = cfg->beta2;
		op.tau = cfg->tau;
		if ((rc = fb_server_opt_alloc(&op, c->param_count, &c->opt)) !=
		    FB_OK) {
			return rc;
		}
	}
	if (fb_lent_new(c->param_count * 4, &c->params_lent) != FB_OK) {
		return FB_ENOMEM;
	}
	c->params = fb_lent_data(c->params_lent);
	fb_model_init_params(c->model, c->params, (uint64_t)cfg->seed);
	if ((rc = fb_mkdir_p(cfg->output_dir)) != FB_OK) {
		return rc;
	}
	snprintf(c->metrics_path, sizeof(c->metrics_path), "%s/metrics.jsonl",
	    cfg->output_dir);
	snprintf(c->model_path, sizeof(c->model_path), "%s/model.safetensors",
	    cfg->output_dir);
	if (resume) {
		uint32_t done = 0;
		rc = fb_model_load_safetensors(c->model, c->model_path,
		    c->params, &done);
		if (rc != FB_OK) {
			fb_log_error("cannot resume from %s: %s", c->model_path,
			    fb_strerror(rc));
			return rc;
		}
		*first_round = done + 1;
		fb_log_info("resuming after round %u from %s", done,
		    c->model_path);
	} else {
		FILE *f = fopen(c->metrics_path, "w");
		if (f == NULL) {
			fb_log_error("cannot create %s", c->metrics_path);
			return FB_EIO;
		}
		fclose(f);
	}
	c->evaluate = strcmp(cfg->model_arch, "synthetic") != 0 &&
	    cfg->eval_every > 0;
	if (c->evaluate) {
		rc = fb_dataset_load_fmnist(cfg->data_dir, 0, &c->test);
		if (rc != FB_OK) {
			fb_log_error("cannot load the test set from %s "
			             "(evaluation.data_dir)", cfg->data_dir);
			return rc;
		}
	}
	if (cfg->security) {
		if ((rc = load_security(c, cfg)) != FB_OK) {
			return rc;
		}
		c->worker_cap = c->allow_count;
		lo.max_payload += FB_STREAM_CHUNK_OVERHEAD;
		if (cfg->sa_enabled) {
			/* Share and advert batches travel as payloads too. */
			uint64_t sa_max = (uint64_t)c->allow_count *
			        (FB_SECAGG_SHARE_MSG_LEN +
			            FB_SECAGG_REVEAL_ENTRY_LEN) +
			    FB_SECAGG_REVEAL_HEADER_LEN + FB_MSG_OVERHEAD;
			fb_encoding e;
			if (sa_max > lo.max_payload) {
				lo.max_payload = (uint32_t)sa_max;
			}
			if (fb_encoding_init(&e, (uint32_t)cfg->sa_ring_bits,
			        c->allow_count, cfg->sa_clip, 1.0) != FB_OK) {
				fb_log_error("secure_aggregation: with ring_bits "
				             "%lld and clip %g, a sum of %u workers "
				             "could overflow: raise ring_bits or "
				             "lower clip",
				    (long long)cfg->sa_ring_bits, cfg->sa_clip,
				    c->allow_count);
				return FB_ECONFIG;
			}
			fb_log_info("secure aggregation on: ring Z_2^%lld, clip "
			            "%g, one unit %.3g with all %u workers",
			    (long long)cfg->sa_ring_bits, cfg->sa_clip,
			    1.0 / e.scale, c->allow_count);
		}
	} else {
		c->worker_cap = (uint32_t)cfg->max_workers;
		fb_log_warn("security.enabled is false: messages and updates "
		            "travel unencrypted and unsigned");
		if (getrandom(&c->run_id, sizeof(c->run_id), 0) !=
		    (ssize_t)sizeof(c->run_id)) {
			c->run_id = (uint64_t)fb_now_ms() ^
			    ((uint64_t)getpid() << 32);
		}
	}
	if ((c->workers = calloc(c->worker_cap, sizeof(*c->workers))) ==
	    NULL ||
	    (c->stream_arg = calloc(c->worker_cap, sizeof(*c->stream_arg))) ==
	        NULL) {
		return FB_ENOMEM;
	}
	{
		fb_ingest_opts io = {
		    .threads = cfg->ingest_threads < 0
		        ? fb_ingest_threads_auto()
		        : (uint32_t)cfg->ingest_threads,
		    .slots = c->worker_cap,
		    .chunk_count = c->chunk_count + 1, /* + SecAgg extras */
		    .max_chunk_len = (size_t)c->chunk_elems * 4,
		    .chunk_cb = ingest_add_cb,
		    .cb_arg = c,
		    .cb_concurrent = true,
		};
		if ((rc = fb_ingest_alloc(&io, &c->ingest)) != FB_OK) {
			return rc;
		}
		/* The pool's idle threads help with the parts of each add. */
		fb_accum_set_parallel(c->accum, fb_ingest_parallel, c->ingest);
		if (io.threads > 0) {
			fb_log_info("ingest pool: %u threads decrypt and add "
			            "updates", io.threads);
		} else {
			fb_log_info("ingest: updates decrypted and added on the "
			            "event loop");
		}
	}
	fb_rng_init(&c->rng, (uint64_t)cfg->seed, 0xc00d);
	if ((rc = fb_link_bind(cfg->listen, &lo, &c->link)) != FB_OK) {
		return rc;
	}
	c->lanes = fb_link_lanes(c->link);
	{
		/* door: room for every worker under the descriptor limit? */
		fb_door_stats ds;
		fb_link_door_stats(c->link, &ds);
		if (ds.max_connections < c->worker_cap) {
			fb_log_warn("only %u connections fit under the "
			            "file-descriptor limit (%u) for up to %u "
			            "workers: raise it (ulimit -n) or lower "
			            "transport.fd_reserve", ds.max_connections,
			    ds.fd_limit, c->worker_cap);
		}
	}
	{
		/* ", 2 lanes: workers are sent in turn to this port and to
		 * port 5556", or nothing without lanes */
		char lanes[64 + FB_LANES_MAX * 7] = "";
		int used = 0;
		if (c->lanes > 1) {
			used = snprintf(lanes, sizeof(lanes), ", %u lanes: workers "
			    "are sent in turn to this port and to port%s", c->lanes,
			    c->lanes > 2 ? "s" : "");
		}
		for (uint32_t i = 1; i < c->lanes && used > 0 &&
		     (size_t)used < sizeof(lanes); i++) {
			int n = snprintf(lanes + used, sizeof(lanes) - (size_t)used,
			    "%s %u", i > 1 ? "," : "", fb_link_lane_port(c->link, i));
			used = n > 0 ? used + n : -1;
		}
		fb_log_info("listening on %s (%d ZeroMQ I/O thread%s%s); model %s; "
		            "run %016" PRIx64, cfg->listen, lo.io_threads,
		    lo.io_threads == 1 ? "" : "s", lanes, c->model_desc,
		    c->run_id);
	}
	return FB_OK;
}

static void
coord_fini(coord *c)
{
	fb_ingest_free(c->ingest); /* first: its threads use the accumulator */
	pthread_mutex_destroy(&c->extra_mu);
	sa_free(&c->sa);
	fb_link_close(c->link);
	fb_accum_free(c->accum);
	fb_server_opt_free(c->opt);
	fb_lent_free(c->params_lent); /* after fb_link_close: none in flight */
	fb_model_close(c->model);
	fb_dataset_fini(&c->test);
	free(c->stream_arg);
	for (uint32_t i = 0; c->workers != NULL && i < c->worker_cap; i++) {
		fb_session_free(c->workers[i].sess);
		fb_session_free(c->workers[i].pending);
	}
	free(c->workers);
	fb_identity_free(c->self);
	free(c->allow);
	free(c->allow_names);
	free(c->hello_nonces);
	fb_lent_free(c->bcast_lent);
	free(c->bcast_len);
	fb_wipe(c->round_key, sizeof(c->round_key));
}

fb_err
fb_coordinator_run(const fb_coord_config *cfg, bool resume,
    volatile sig_atomic_t *stop)
{
	fb_err rc;
	coord c;
	uint32_t first;

	memset(&c, 0, sizeof(c));
	c.cfg = cfg;
	c.stop = stop;
	if ((rc = coord_init(&c, cfg, resume, &first)) != FB_OK) {
		goto out;
	}
	for (c.round = first; c.round <= (uint32_t)cfg->rounds; c.round++) {
		if ((rc = wait_for_workers(&c)) != FB_OK) {
			goto out;
		}
		if ((rc = run_round(&c, (uint32_t)cfg->rounds)) != FB_OK) {
			goto out;
		}
	}
	fb_log_info("all %lld rounds done; model in %s", (long long)cfg->rounds,
	    c.model_path);
out:
	if (c.link != NULL) {
		shutdown_workers(&c, rc == FB_OK ? "training finished"
		                                 : "coordinator stopping");
	}
	if (rc == FB_ECLOSED && *stop) {
		fb_log_info("stopped by signal after round %u",
		    c.round > 0 ? c.round - 1 : 0);
		rc = FB_OK;
	}
	coord_fini(&c);
	return rc;
}
