/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.c -- the worker's protocol loop.
 *
 * The main thread owns the socket and never blocks for long: it answers
 * the coordinator, sends heartbeats, and watches the coordinator's own
 * heartbeats. Training runs on a second thread that touches no socket; it
 * signals completion through an eventfd that the main thread polls next to
 * the socket. So a box that trains for an hour still looks alive, and a
 * round cancelled by the coordinator stops within one SGD step.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "aggregation/aggregation.h"
#include "common/util.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"
#include "proto/proto.h"
#include "worker/trainer.h"
#include "worker/worker.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fedbox sends float32 tensors in host order: little-endian only"
#endif

#define HELLO_RETRY_MS 2000
#define HANDSHAKE_RETRY_MS 5000
#define LANE_GIVEUP_MS 15000 /* no welcome on a lane: back to listen's port */
#define LANE_STAY UINT32_MAX /* "do not send me to a lane" */

typedef enum wk_state {
	S_HELLO = 0, /* waiting for Welcome */
	S_IDLE,      /* between rounds */
	S_FETCHING,  /* downloading the global model */
	S_TRAINING,  /* trainer thread running */
} wk_state;

typedef struct wk {
	const fb_worker_config *cfg;
	fb_link *link;
	fb_link_opts link_opts;
	uint32_t lane;         /* the coordinator's lane we are on; 0: listen */
	int64_t lane_since_ms; /* when we went to it */
	fb_dataset shard;
	fb_model *model;
	fb_trainer *trainer;
	uint32_t trainer_batch;
	char backend[FB_TEXT_MAX];
	uint64_t param_count;
	uint32_t chunk_bytes;
	uint32_t chunk_count;
	uint32_t first_chunk;  /* the update goes up from this chunk on */
	float *global;
	float *local;          /* fb_lent_data(local_lent) */
	fb_lent *local_lent;   /* plain updates go from it without a copy */
	bool welcomed;
	uint64_t run_id;
	uint64_t session;
	int64_t heartbeat_ms;
	int64_t liveness_ms;
	wk_state st;
	/* the current round */
	uint32_t round;
	uint64_t steps;
	uint32_t batch;
	float lr, momentum, weight_decay, prox_mu;
	bool fednova;
	double a_norm;
	uint64_t seed;
	bool synthetic;
	uint32_t next_chunk; /* next chunk expected from the coordinator */
	uint32_t next_fetch; /* next chunk to request */
	/* trainer thread */
	pthread_t thread;
	bool thread_live;
	int efd;
	atomic_int cancel; /* set here, read by the trainer thread */
	fb_err train_rc;
	fb_train_stats stats;
	/* timers */
	int64_t last_rx_ms;
	int64_t last_tx_ms;
	int64_t last_hello_ms;
	int64_t hello_since_ms;
	volatile sig_atomic_t *stop;
	/* secure mode */
	bool secure;
	fb_identity *self;
	fb_pubkey coord_pk;
	fb_handshake *hs;
	fb_session *sess;
	fb_stream_pull *mpull; /* this round's model stream */
	fb_blob model_trailer;
	uint8_t *sendbuf;      /* one encrypted update chunk */
	/* secure aggregation of the current round */
	fb_secagg_worker *sa;  /* NULL: none this round */
	uint32_t sa_n;
	bool sa_masking;       /* shares in, masks fixed: the update may go */
	bool sa_pending;       /* trained; waiting for the shares */
	double sa_weight;      /* samples / max_samples */
	fb_secagg_encodings enc;
	uint32_t *encbuf;      /* one encoded (then masked) chunk */
	fb_pubkey *peers;      /* security.peers: the keys we accept, or NULL */
	uint32_t peer_count;
} wk;

/* This worker's sample count: its data's, or the benchmark setting. */
static uint64_t
samples(const wk *w)
{
	return w->cfg->dataset == 0 ? w->shard.count
	                            : (uint64_t)w->cfg->none_samples;
}

/* `origin`: the lent memory `payload` lies in (sent without a copy), or
 * NULL. */
static fb_err
wk_send_from(wk *w, const fb_msg *m, const void *payload, size_t len,
    fb_lent *origin)
{
	fb_err rc = w->secure
	    ? fb_secure_send_from(w->link, NULL, w->sess, w->round, m, payload,
	          len, origin)
	    : fb_link_send_from(w->link, NULL, m, payload, len, origin);
	if (rc != FB_OK) {
		fb_log_warn("cannot send %s to the coordinator: %s",
		    fb_msg_type_name(m->type), fb_strerror(rc));
	} else {
		w->last_tx_ms = fb_now_ms();
	}
	return rc;
}

static fb_err
wk_send(wk *w, const fb_msg *m, const void *payload, size_t len)
{
	return wk_send_from(w, m, payload, len, NULL);
}

static fb_err
send_hello(wk *w)
{
	fb_msg m = {.type = FB_MSG_HELLO};
	m.u.hello.protocol_version = FB_PROTOCOL_VERSION;
	snprintf(m.u.hello.name, sizeof(m.u.hello.name), "%s", w->cfg->name);
	m.u.hello.worker_index = (uint32_t)w->cfg->index;
	/* Required secure aggregation keeps the sample count private: only
	 * the masked sum of all workers' weights reaches the coordinator. */
	m.u.hello.num_samples = w->cfg->secure_aggregation == 0 ? 0 : samples(w);
	snprintf(m.u.hello.backend, sizeof(m.u.hello.backend), "%s",
	    w->backend[0] ? w->backend : "not yet chosen");
	snprintf(m.u.hello.software, sizeof(m.u.hello.software),
	    "fedbox %s", FB_VERSION);
	m.u.hello.session = w->session;
	m.u.hello.lane = w->lane;
	w->last_hello_ms = fb_now_ms();
	return wk_send(w, &m, NULL, 0);
}

/* Secure mode: starts a fresh handshake (new ephemeral key). */
static fb_err
send_handshake(wk *w)
{
	fb_msg m = {.type = FB_MSG_HANDSHAKE};
	fb_err rc;

	fb_handshake_free(w->hs);
	w->hs = NULL;
	rc = fb_handshake_start(w->self, &w->coord_pk, FB_PROTOCOL_VERSION,
	    m.u.handshake.data.b, &w->hs);
	if (rc != FB_OK) {
		return rc;
	}
	m.u.handshake.data.len = FB_HS_HELLO_LEN;
	m.u.handshake.lane = w->lane;
	w->last_hello_ms = fb_now_ms();
	rc = fb_link_send(w->link, NULL, &m, NULL, 0);
	if (rc != FB_OK) {
		fb_log_warn("cannot send the handshake: %s", fb_strerror(rc));
	}
	return rc;
}

/* Starts (or restarts) joining: handshake first when secure. */
static void
join(wk *w)
{
	if (w->secure) {
		fb_session_free(w->sess);
		w->sess = NULL;
		(void)send_handshake(w);
	} else {
		(void)send_hello(w);
	}
}

static void
on_handshake_reply(wk *w, const fb_msg *m)
{
	fb_reject why = FB_REJECT_NONE;
	fb_session *s = NULL;

	if (!w->secure || w->hs == NULL || w->sess != NULL) {
		return;
	}
	if (fb_handshake_finish(w->hs, m->u.handshake.data.b,
	        m->u.handshake.data.len, &s, &why) != FB_OK) {
		fb_log_warn("handshake reply refused: %s%s", fb_reject_name(why),
		    why == FB_REJECT_UNPINNED_KEY
		        ? " (the coordinator's key is not the one in "
		          "security.coordinator_key)"
		        : "");
		return;
	}
	fb_handshake_free(w->hs);
	w->hs = NULL;
	w->sess = s;
	fb_log_info("secure session established (worker id %u)",
	    fb_session_worker_id(s));
	(void)send_hello(w);
}

/*
 * Moves the link to `endpoint`, as lane `lane`, and starts joining there.
 * Nothing is in flight before a welcome, so closing the old link loses
 * nothing. On failure the old link stays.
 */
static void
move_link(wk *w, const char *endpoint, uint32_t lane)
{
	fb_link *nl = NULL;

	if (fb_link_connect(endpoint, &w->link_opts, &nl) != FB_OK) {
		fb_log_warn("cannot connect to %s: staying where we are",
		    endpoint);
		return;
	}
	fb_link_close(w->link);
	w->link = nl;
	w->lane = lane;
	w->lane_since_ms = fb_now_ms();
	join(w);
}

/* A Redirect (before the welcome, on the listen port): go to that lane. */
static void
on_redirect(wk *w, const fb_msg *m)
{
	char ep[FB_TEXT_MAX + 16];

	if (w->welcomed || w->lane != 0) {
		fb_log_debug("dropped a redirect: already on lane %u%s", w->lane,
		    w->welcomed ? ", admitted" : "");
		return;
	}
	if (m->u.redirect.lane == 0 || m->u.redirect.lane == LANE_STAY ||
	    m->u.redirect.port == 0 || m->u.redirect.port > 65535) {
		fb_log_warn("dropped a redirect to lane %u, port %u: not a "
		            "lane's port", m->u.redirect.lane,
		    m->u.redirect.port);
		return;
	}
	if (fb_endpoint_port(w->cfg->coordinator, m->u.redirect.port, ep,
	        sizeof(ep), NULL) != FB_OK) {
		fb_log_warn("the coordinator sends this worker to its port %u, "
		            "but %s is not a tcp://HOST:PORT endpoint: staying",
		    m->u.redirect.port, w->cfg->coordinator);
		return;
	}
	fb_log_info("the coordinator sends this worker to its lane %u: "
	            "connecting to %s", m->u.redirect.lane, ep);
	move_link(w, ep, m->u.redirect.lane);
}

static void
new_session(wk *w)
{
	if (getrandom(&w->session, sizeof(w->session), 0) !=
	    (ssize_t)sizeof(w->session)) {
		w->session ^= (uint64_t)fb_now_ms() * 0x9e3779b97f4a7c15ULL;
	}
}

static void *
train_main(void *arg)
{
	wk *w = arg;
	fb_train_opts o = {
	    .steps = w->steps,
	    .batch = w->batch,
	    .lr = w->lr,
	    .momentum = w->momentum,
	    .weight_decay = w->weight_decay,
	    .prox_mu = w->prox_mu,
	    .seed = w->seed,
	    .round = w->round,
	    .worker_index = (uint32_t)w->cfg->index,
	};
	uint64_t one = 1;
	fb_err rc;

	memset(&w->stats, 0, sizeof(w->stats));
	if ((rc = fb_trainer_set_params(w->trainer, w->global)) == FB_OK &&
	    (rc = fb_trainer_train(w->trainer, &o, &w->stats, &w->cancel)) ==
	        FB_OK) {
		rc = fb_trainer_get_params(w->trainer, w->local);
	}
	w->train_rc = rc;
	if (write(w->efd, &one, sizeof(one)) != sizeof(one)) {
		fb_log_error("eventfd write: %s", strerror(errno));
	}
	return NULL;
}

/* Stops the trainer thread (if any) and waits for it. */
static void
stop_training(wk *w)
{
	uint64_t v;
	if (!w->thread_live) {
		return;
	}
	atomic_store(&w->cancel, 1);
	pthread_join(w->thread, NULL);
	w->thread_live = false;
	if (read(w->efd, &v, sizeof(v)) < 0) {
		/* Nothing pending: fine. */
	}
}

static fb_err
ensure_trainer(wk *w)
{
	fb_trainer_config tc;
	fb_err rc;

	if (w->trainer != NULL && w->trainer_batch >= w->batch) {
		return FB_OK;
	}
	fb_trainer_close(w->trainer);
	w->trainer = NULL;
	memset(&tc, 0, sizeof(tc));
	tc.device = w->cfg->device;
	tc.gpu_count = (uint32_t)w->cfg->gpus.count;
	for (size_t i = 0; i < w->cfg->gpus.count; i++) {
		tc.gpus[i] = (int)w->cfg->gpus.v[i];
	}
	tc.math = w->cfg->math;
	tc.throttle = w->cfg->throttle;
	rc = fb_trainer_open(w->model, &w->shard, &tc, w->batch, &w->trainer);
	if (rc != FB_OK) {
		fb_log_error("cannot start the trainer: %s", fb_strerror(rc));
		return rc;
	}
	w->trainer_batch = w->batch;
	fb_trainer_describe(w->trainer, w->backend, sizeof(w->backend));
	fb_log_info("trainer: %s", w->backend);
	if (w->cfg->throttle > 1.0) {
		fb_log_info("SIMULATION: training throttled %.2fx slower "
		            "(train.throttle)", w->cfg->throttle);
	}
	return FB_OK;
}

static fb_err
on_welcome(wk *w, const fb_msg *m)
{
	fb_model_spec spec;
	const fb_wire_model_spec *ws = &m->u.welcome.model;
	fb_err rc;

	if (w->welcomed && m->u.welcome.run_id == w->run_id) {
		return FB_OK; /* a repeat of a hello we resent */
	}
	if (m->u.welcome.protocol_version != FB_PROTOCOL_VERSION) {
		fb_log_error("coordinator speaks protocol %u, we speak %u",
		    m->u.welcome.protocol_version, FB_PROTOCOL_VERSION);
		return FB_ENOTSUP;
	}
	if (m->u.welcome.chunk_bytes == 0 || m->u.welcome.chunk_bytes % 4 ||
	    m->u.welcome.heartbeat_ms == 0 ||
	    m->u.welcome.liveness_ms <= m->u.welcome.heartbeat_ms) {
		fb_log_error("coordinator sent unusable transport settings");
		return FB_EPROTO;
	}
	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "%s", ws->arch);
	spec.input_dim = ws->input_dim;
	spec.classes = ws->classes;
	spec.hidden_count = ws->hidden_count;
	memcpy(spec.hidden, ws->hidden, sizeof(uint32_t) * ws->hidden_count);
	spec.synthetic_params = ws->synthetic_params;
	snprintf(spec.plugin, sizeof(spec.plugin), "%s",
	    w->cfg->plugin[0] ? w->cfg->plugin : ws->plugin);
	if (w->model != NULL) {
		/* A new run (coordinator restarted): the model must match. */
		if (fb_model_param_count(w->model) != m->u.welcome.param_count) {
			fb_log_error("the coordinator's new run has a different "
			             "model; restart this worker");
			return FB_EPROTO;
		}
	} else {
		if ((rc = fb_model_open(&spec, &w->model)) != FB_OK) {
			fb_log_error("cannot create the coordinator's model "
			             "(%s): %s", spec.arch, fb_strerror(rc));
			return rc;
		}
		if (fb_model_param_count(w->model) != m->u.welcome.param_count) {
			fb_log_error("model has %" PRIu64 " parameters here but "
			             "%" PRIu64 " at the coordinator",
			    fb_model_param_count(w->model),
			    m->u.welcome.param_count);
			return FB_EPROTO;
		}
		w->param_count = m->u.welcome.param_count;
		w->global = fb_alloc(w->param_count * 4);
		if (w->global == NULL ||
		    fb_lent_new(w->param_count * 4, &w->local_lent) != FB_OK) {
			return FB_ENOMEM;
		}
		w->local = fb_lent_data(w->local_lent);
	}
	if (w->secure && w->sendbuf == NULL) {
		w->sendbuf = fb_alloc((size_t)m->u.welcome.chunk_bytes +
		    FB_STREAM_CHUNK_OVERHEAD);
		if (w->sendbuf == NULL) {
			return FB_ENOMEM;
		}
	}
	w->welcomed = true;
	w->run_id = m->u.welcome.run_id;
	w->heartbeat_ms = m->u.welcome.heartbeat_ms;
	w->liveness_ms = m->u.welcome.liveness_ms;
	w->chunk_bytes = m->u.welcome.chunk_bytes;
	w->st = S_IDLE;
	{
		char desc[128];
		fb_model_describe(w->model, desc, sizeof(desc));
		fb_log_info("admitted as worker %u of run %016" PRIx64
		            "; model %s",
		    m->u.welcome.worker_id, w->run_id, desc);
	}
	return FB_OK;
}

static fb_err
request_chunks(wk *w)
{
	fb_msg m = {.type = FB_MSG_MODEL_FETCH};
	fb_err rc;
	while (w->next_fetch < w->chunk_count &&
	    w->next_fetch < w->next_chunk + (uint32_t)w->cfg->fetch_window) {
		m.u.model_fetch.round = w->round;
		m.u.model_fetch.chunk = w->next_fetch;
		if ((rc = wk_send(w, &m, NULL, 0)) != FB_OK) {
			return rc;
		}
		w->next_fetch++;
	}
	return FB_OK;
}

/* ---- secure aggregation ------------------------------------------------- */

/* Ends this round's secure aggregation (wipes its secrets). */
static void
sa_end(wk *w)
{
	fb_secagg_worker_free(w->sa);
	w->sa = NULL;
	w->sa_masking = false;
	w->sa_pending = false;
}

static fb_err
sa_send(wk *w, fb_secagg_phase phase, uint32_t count, const void *data,
    size_t len)
{
	fb_msg m = {.type = FB_MSG_SECAGG};
	m.u.secagg.round = w->round;
	m.u.secagg.phase = phase;
	m.u.secagg.count = count;
	return wk_send(w, &m, data, len);
}

/*
 * sa_start joins the round's secure aggregation: checks the public round
 * parameters, derives the same encodings as the coordinator, makes this
 * round's keys and sends the signed advert.
 */
static fb_err
sa_start(wk *w, const fb_msg *m)
{
	fb_secagg_params p;
	uint8_t adv[FB_SECAGG_ADV_LEN];
	uint32_t n = m->u.round_start.sa_n;
	uint32_t bits = m->u.round_start.sa_ring_bits;
	uint64_t maxs = m->u.round_start.sa_max_samples;
	fb_err rc;

	if (!w->secure) {
		fb_log_error("round %u: secure aggregation needs security "
		             "(security.enabled); skipping the round", w->round);
		return FB_ENOTSUP;
	}
	if (m->u.round_start.sa_graph_seed.len != 32 || n < 2 ||
	    m->u.round_start.sa_slot >= n || maxs == 0 ||
	    fb_secagg_encodings_init(&w->enc, bits, n,
	        m->u.round_start.sa_clip, m->u.round_start.sa_a_bound) != FB_OK) {
		fb_log_warn("round %u: unusable secure-aggregation parameters; "
		            "skipping the round", w->round);
		return FB_EPROTO;
	}
	if (samples(w) > maxs) {
		fb_log_error("round %u: this worker has %" PRIu64 " samples, more "
		             "than the coordinator's secure_aggregation."
		             "max_samples (%" PRIu64 "); skipping the round",
		    w->round, samples(w), maxs);
		return FB_ERANGE;
	}
	memset(&p, 0, sizeof(p));
	fb_session_run_id(w->sess, &p.run);
	p.round = w->round;
	p.n = n;
	p.degree = m->u.round_start.sa_degree;
	p.threshold = m->u.round_start.sa_threshold;
	memcpy(p.graph_seed, m->u.round_start.sa_graph_seed.b, 32);
	if ((rc = fb_secagg_worker_alloc(&p, m->u.round_start.sa_slot,
	         &w->sa)) != FB_OK ||
	    (rc = fb_secagg_worker_advertise(w->sa, w->self, adv)) != FB_OK) {
		fb_log_warn("round %u: cannot start secure aggregation: %s",
		    w->round, fb_strerror(rc));
		return rc;
	}
	if (w->encbuf == NULL &&
	    (w->encbuf = fb_alloc(w->chunk_bytes > 4 * FB_SECAGG_EXTRA
	                              ? w->chunk_bytes
	                              : 4 * FB_SECAGG_EXTRA)) == NULL) {
		return FB_ENOMEM;
	}
	w->sa_n = n;
	w->sa_weight = (double)samples(w) / (double)maxs;
	return sa_send(w, FB_SA_ADVERT, 1, adv, sizeof(adv));
}

/* Leaves the round: secure aggregation cannot go on for us. */
static void
sa_abandon(wk *w, const char *why)
{
	fb_log_warn("round %u: %s; leaving the round", w->round, why);
	stop_training(w);
	w->st = S_IDLE;
	sa_end(w);
}

static void
on_round_start(wk *w, const fb_msg *m)
{
	uint64_t expect_chunks;

	if (w->st == S_FETCHING || w->st == S_TRAINING) {
		fb_log_warn("round %u started while round %u was running; "
		            "abandoning round %u",
		    m->u.round_start.round, w->round, w->round);
		stop_training(w);
	}
	w->st = S_IDLE;
	expect_chunks = (w->param_count * 4 + w->chunk_bytes - 1) /
	    w->chunk_bytes;
	sa_end(w);
	if (m->u.round_start.param_count != w->param_count ||
	    m->u.round_start.chunk_bytes != w->chunk_bytes ||
	    m->u.round_start.chunk_count != expect_chunks ||
	    m->u.round_start.first_chunk >= expect_chunks ||
	    m->u.round_start.batch_size == 0 ||
	    (m->u.round_start.local_steps == 0 &&
	        !(m->u.round_start.secagg &&
	            m->u.round_start.local_epochs > 0 &&
	            isfinite(m->u.round_start.local_epochs)))) {
		fb_log_warn("round %u: malformed round start ignored",
		    m->u.round_start.round);
		return;
	}
	if (m->u.round_start.synthetic != (w->cfg->dataset == 1)) {
		fb_log_error("round %u: the coordinator's model is %s but this "
		             "worker has %s; skipping the round",
		    m->u.round_start.round,
		    m->u.round_start.synthetic ? "synthetic" : "trainable",
		    w->cfg->dataset == 1 ? "no data (data.dataset: none)"
		                         : "training data");
		return;
	}
	if (!m->u.round_start.secagg && w->cfg->secure_aggregation == 0) {
		fb_log_error("round %u: the coordinator runs it without secure "
		             "aggregation, which this worker requires "
		             "(security.secure_aggregation); skipping the round",
		    m->u.round_start.round);
		return;
	}
	w->round = m->u.round_start.round;
	w->steps = m->u.round_start.local_steps;
	if (w->steps == 0) {
		/* Secure aggregation: our sample count stays here, so we turn
		 * the coordinator's local_epochs into steps ourselves. */
		double st = ceil((double)m->u.round_start.local_epochs *
		    (double)samples(w) / (double)m->u.round_start.batch_size);
		w->steps = st < 1 ? 1 : (uint64_t)st;
	}
	w->batch = m->u.round_start.batch_size;
	w->lr = m->u.round_start.lr;
	w->momentum = m->u.round_start.momentum;
	w->weight_decay = m->u.round_start.weight_decay;
	w->prox_mu = m->u.round_start.prox_mu;
	w->fednova = m->u.round_start.fednova;
	w->seed = m->u.round_start.seed;
	w->synthetic = m->u.round_start.synthetic;
	w->chunk_count = m->u.round_start.chunk_count;
	w->first_chunk = m->u.round_start.first_chunk;
	w->next_chunk = 0;
	w->next_fetch = 0;
	if (w->secure) {
		fb_stream_ctx ctx = {.round = w->round,
		    .sender = FB_SENDER_COORDINATOR};
		fb_reject why = FB_REJECT_NONE;
		fb_session_run_id(w->sess, &ctx.run);
		fb_stream_pull_free(w->mpull);
		w->mpull = NULL;
		if (m->u.round_start.round_key.len != FB_STREAM_KEY_LEN ||
		    fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
		        m->u.round_start.round_key.b,
		        m->u.round_start.stream_header.b,
		        m->u.round_start.stream_header.len, w->chunk_bytes,
		        &w->mpull, &why) != FB_OK) {
			fb_log_warn("round %u: unusable model stream (%s); "
			            "skipping the round",
			    w->round, fb_reject_name(why));
			return;
		}
		w->model_trailer = m->u.round_start.stream_trailer;
	}
	if (m->u.round_start.secagg && sa_start(w, m) != FB_OK) {
		sa_end(w);
		return;
	}
	w->st = S_FETCHING;
	fb_log_debug("round %u: fetching the model (%u chunks)", w->round,
	    w->chunk_count);
	if (request_chunks(w) != FB_OK) {
		w->st = S_IDLE;
	}
}

/* Test hook (debug.dump_updates): one file of this round's update. */
static FILE *
dump_open(const wk *w, const char *what)
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

/*
 * sa_encode_chunk turns elements off..off+count of the update (or, at
 * off = P, the extra coordinates) into this worker's masked input, in
 * w->encbuf. The stochastic rounding is seeded from the round, not secret.
 */
static fb_err
sa_encode_chunk(wk *w, const float *x, uint64_t off, uint64_t count,
    double loss, uint64_t *clipped, FILE *enc_dump, FILE *mask_dump)
{
	uint64_t seed = w->seed ^ ((uint64_t)w->round * 0x9e3779b97f4a7c15ULL) ^
	    (((uint64_t)w->cfg->index + 1) * 0xc2b2ae3d27d4eb4fULL);
	fb_err rc;

	rc = off < w->param_count
	    ? fb_encode_chunk(&w->enc.x, x + off, count, w->sa_weight, off, seed,
	          w->encbuf, clipped)
	    : fb_secagg_encode_extras(&w->enc, w->sa_weight, loss, w->a_norm,
	          off, seed, w->encbuf);
	if (rc != FB_OK) {
		return rc;
	}
	/* (the dumps are in element order: chunks go up rotated) */
	if (enc_dump != NULL &&
	    fseeko(enc_dump, (off_t)(off * 4), SEEK_SET) == 0) {
		fwrite(w->encbuf, 4, count, enc_dump);
	}
	rc = fb_secagg_worker_mask_chunk(w->sa, w->encbuf, off, count);
	if (rc == FB_OK && mask_dump != NULL &&
	    fseeko(mask_dump, (off_t)(off * 4), SEEK_SET) == 0) {
		fwrite(w->encbuf, 4, count, mask_dump);
	}
	return rc;
}

static fb_err
send_update(wk *w, double seconds, double loss, uint64_t steps)
{
	fb_msg m = {.type = FB_MSG_UPDATE_BEGIN};
	fb_err rc;
	uint64_t total = w->param_count * 4;
	const float *update = w->local;
	const uint8_t *p = (const uint8_t *)update;
	fb_stream_push *push = NULL;
	bool sa = w->sa != NULL;
	uint32_t chunks = w->chunk_count + (sa ? 1 : 0);
	uint64_t clipped = 0;
	FILE *fu = NULL, *fe = NULL, *fm = NULL, *fj = NULL;

	m.u.update_begin.round = w->round;
	m.u.update_begin.param_count = w->param_count;
	m.u.update_begin.chunk_count = chunks;
	m.u.update_begin.steps_per_second = seconds > 0
	    ? (double)steps / seconds : 0;
	if (!sa) {
		/* With secure aggregation these stay here: the coordinator
		 * learns only their weighted sums (extra coordinates). */
		m.u.update_begin.num_samples = samples(w);
		m.u.update_begin.steps = steps;
		m.u.update_begin.train_loss = loss;
		m.u.update_begin.train_seconds = seconds;
		m.u.update_begin.a_norm = w->a_norm;
	}
	if ((fu = dump_open(w, "update.f32")) != NULL) {
		fwrite(update, 4, w->param_count, fu);
		dump_close(fu);
		if ((fj = dump_open(w, "json")) != NULL) {
			fprintf(fj, "{\"samples\": %" PRIu64 ", \"weight\": %.17g, "
			            "\"loss\": %.17g, \"a_norm\": %.17g, "
			            "\"secure\": %s}\n",
			    samples(w), sa ? w->sa_weight : 0.0, loss, w->a_norm,
			    sa ? "true" : "false");
			dump_close(fj);
		}
		if (sa) {
			fe = dump_open(w, "encoded.u32");
			fm = dump_open(w, "masked.u32");
		}
	}
	snprintf(m.u.update_begin.backend, sizeof(m.u.update_begin.backend),
	    "%s", w->backend);
	if (w->secure) {
		fb_stream_ctx ctx = {.round = w->round,
		    .sender = fb_session_worker_id(w->sess)};
		fb_session_run_id(w->sess, &ctx.run);
		rc = fb_stream_push_alloc(&ctx, w->chunk_bytes,
		    FB_STREAM_DIGEST_TAGS, m.u.update_begin.stream_key.b,
		    m.u.update_begin.stream_header.b, &push);
		if (rc != FB_OK) {
			return rc;
		}
		m.u.update_begin.stream_key.len = FB_STREAM_KEY_LEN;
		m.u.update_begin.stream_header.len = FB_STREAM_HEADER_LEN;
	}
	rc = wk_send(w, &m, NULL, 0);
	fb_wipe(&m.u.update_begin.stream_key, sizeof(m.u.update_begin.stream_key));
	if (rc != FB_OK) {
		goto out;
	}
	/* Chunks first_chunk, first_chunk + 1, ... wrapping around, then
	 * the SecAgg extra chunk; the stream's order is this order. */
	for (uint32_t pos = 0; pos < chunks; pos++) {
		uint32_t k =
		    fb_upload_chunk(w->first_chunk, w->chunk_count, pos);
		uint64_t off = (uint64_t)k * w->chunk_bytes;
		uint64_t len = k == w->chunk_count ? 4 * FB_SECAGG_EXTRA
		    : total - off < w->chunk_bytes ? total - off
		                                   : w->chunk_bytes;
		fb_msg c = {.type = FB_MSG_UPDATE_CHUNK};
		c.u.update_chunk.round = w->round;
		c.u.update_chunk.chunk = k;
		if (sa) {
			rc = sa_encode_chunk(w, update,
			    k == w->chunk_count ? w->param_count : off / 4, len / 4,
			    loss,
			    &clipped, fe, fm);
			if (rc != FB_OK) {
				fb_log_error("round %u: cannot mask the update: %s",
				    w->round, fb_strerror(rc));
				goto out;
			}
		}
		if (w->secure) {
			size_t clen = 0;
			memcpy(w->sendbuf + 1, sa ? (const uint8_t *)w->encbuf
			                          : p + off, len);
			rc = fb_stream_push_chunk(push, w->sendbuf + 1, len,
			    pos + 1 == chunks, w->sendbuf,
			    (size_t)w->chunk_bytes + FB_STREAM_CHUNK_OVERHEAD,
			    &clen);
			if (rc == FB_OK) {
				rc = wk_send(w, &c, w->sendbuf, clen);
			}
		} else {
			/* from w->local itself, without a copy */
			rc = wk_send_from(w, &c, p + off, len, w->local_lent);
		}
		if (rc != FB_OK) {
			goto out;
		}
	}
	if (w->secure) {
		fb_msg e = {.type = FB_MSG_UPDATE_END};
		e.u.update_end.round = w->round;
		rc = fb_stream_push_final(push, w->self,
		    e.u.update_end.stream_trailer.b);
		if (rc == FB_OK) {
			e.u.update_end.stream_trailer.len = FB_STREAM_TRAILER_LEN;
			rc = wk_send(w, &e, NULL, 0);
		}
	}
out:
	dump_close(fe);
	dump_close(fm);
	if (clipped > 0) {
		fb_log_info("round %u: %" PRIu64 " coordinates clipped to +-%g "
		            "(secure_aggregation.clip)", w->round, clipped,
		    w->enc.x.clip);
	}
	fb_stream_push_free(push);
	return rc;
}

static void
on_secagg(wk *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	uint32_t cnt = m->u.secagg.count;
	uint8_t *out = NULL;
	size_t out_len = 0, cap;
	fb_err rc;

	if (w->sa == NULL || m->u.secagg.round != w->round) {
		fb_log_debug("dropped a secure-aggregation message of round %u",
		    m->u.secagg.round);
		return;
	}
	switch (m->u.secagg.phase) {
	case FB_SA_PEERS:
		if (cnt >= w->sa_n ||
		    f->payload_len != (size_t)cnt * FB_SECAGG_PEER_ENTRY_LEN) {
			sa_abandon(w, "malformed key adverts");
			return;
		}
		for (uint32_t i = 0; i < cnt; i++) {
			const uint8_t *e = f->payload +
			    (size_t)i * FB_SECAGG_PEER_ENTRY_LEN;
			fb_pubkey pk;
			bool known = w->peers == NULL;
			memcpy(pk.b, e + 4, FB_PUBKEY_LEN);
			for (uint32_t j = 0; !known && j < w->peer_count; j++) {
				known = fb_pubkey_equal(&w->peers[j], &pk);
			}
			if (!known) {
				char fp[FB_FINGERPRINT_SIZE];
				fb_pubkey_fingerprint(&pk, fp);
				fb_log_warn("round %u: key advert signed by %s, "
				            "which is not in security.peers: refused",
				    w->round, fp);
				continue;
			}
			rc = fb_secagg_worker_add_advert(w->sa, &pk,
			    e + 4 + FB_PUBKEY_LEN, FB_SECAGG_ADV_LEN);
			if (rc != FB_OK) {
				fb_log_warn("round %u: key advert of worker slot "
				            "%u refused: %s",
				    w->round, (unsigned)e[0] | (unsigned)e[1] << 8,
				    fb_strerror(rc));
			}
		}
		cap = (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN + 1;
		if ((out = malloc(cap)) == NULL) {
			sa_abandon(w, "out of memory");
			return;
		}
		rc = fb_secagg_worker_make_shares(w->sa, out, cap, &out_len);
		if (rc == FB_OK) {
			rc = sa_send(w, FB_SA_SHARES, (uint32_t)(out_len /
			    FB_SECAGG_SHARE_MSG_LEN), out, out_len);
		} else {
			sa_abandon(w, rc == FB_ERANGE
			        ? "too few neighbours for the secure-aggregation "
			          "threshold"
			        : "cannot make the secure-aggregation shares");
		}
		fb_wipe(out, cap);
		free(out);
		return;
	case FB_SA_RELAY:
		if (f->payload_len != (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN) {
			sa_abandon(w, "malformed relayed shares");
			return;
		}
		for (uint32_t i = 0; i < cnt; i++) {
			rc = fb_secagg_worker_add_share(w->sa,
			    f->payload + (size_t)i * FB_SECAGG_SHARE_MSG_LEN,
			    FB_SECAGG_SHARE_MSG_LEN);
			if (rc != FB_OK) {
				fb_log_warn("round %u: a relayed share was refused: "
				            "%s", w->round, fb_strerror(rc));
			}
		}
		fb_wipe(f->payload, f->payload_len);
		if ((rc = fb_secagg_worker_mask_begin(w->sa)) != FB_OK) {
			sa_abandon(w, rc == FB_ERANGE
			        ? "too few neighbours shared for the "
			          "secure-aggregation threshold"
			        : "cannot fix the secure-aggregation masks");
			return;
		}
		w->sa_masking = true;
		if (w->sa_pending) {
			w->sa_pending = false;
			if (send_update(w, w->stats.seconds,
			        w->stats.loss_mean, w->stats.steps) != FB_OK) {
				fb_log_warn("round %u: update not delivered",
				    w->round);
			}
		}
		return;
	case FB_SA_UNMASK:
		if (cnt != w->sa_n || f->payload_len != w->sa_n) {
			fb_log_warn("round %u: malformed unmasking request",
			    w->round);
			return;
		}
		cap = FB_SECAGG_REVEAL_HEADER_LEN +
		    (size_t)w->sa_n * FB_SECAGG_REVEAL_ENTRY_LEN;
		if ((out = malloc(cap)) == NULL) {
			return;
		}
		rc = fb_secagg_worker_reveal(w->sa, f->payload, w->sa_n, out,
		    cap, &out_len);
		if (rc == FB_OK) {
			(void)sa_send(w, FB_SA_REVEAL, 1, out, out_len);
			fb_log_debug("round %u: unmasking shares sent", w->round);
		} else {
			fb_log_warn("round %u: unmasking request refused: %s",
			    w->round, fb_strerror(rc));
		}
		fb_wipe(out, cap);
		free(out);
		return;
	default:
		fb_log_warn("unexpected secure-aggregation step %u from the "
		            "coordinator", m->u.secagg.phase);
		return;
	}
}

/* Benchmark rounds: no training; the update is fixed small noise. */
static fb_err
synthetic_update(wk *w)
{
	static bool ready;
	double t0 = fb_now_s();
	if (!ready) {
		fb_rng r;
		fb_rng_init(&r, (uint64_t)w->cfg->index + 1, 0x5e);
		for (uint64_t j = 0; j < w->param_count; j++) {
			w->local[j] = (float)((double)(fb_rng_u64(&r) >> 40) *
			    0x1.0p-24 - 0.5) * 0.02f;
		}
		ready = true;
	}
	snprintf(w->backend, sizeof(w->backend), "none (synthetic update)");
	memset(&w->stats, 0, sizeof(w->stats));
	w->a_norm = 0;
	if (w->sa != NULL && !w->sa_masking) {
		w->sa_pending = true; /* sent once the shares are in */
		return FB_OK;
	}
	return send_update(w, fb_now_s() - t0, 0.0, 0);
}

/*
 * The trainer is about to overwrite w->local. Parts of the last update may
 * still be queued in ZeroMQ (an upload the coordinator stopped reading):
 * they keep the old memory, and training gets fresh memory.
 */
static fb_err
local_writable(wk *w)
{
	if (fb_lent_own(&w->local_lent, w->param_count * 4, false) != FB_OK) {
		fb_log_error("round %u: out of memory for the update", w->round);
		return FB_ENOMEM;
	}
	w->local = fb_lent_data(w->local_lent);
	return FB_OK;
}

static void
start_training(wk *w)
{
	if (w->synthetic) {
		(void)synthetic_update(w);
		w->st = S_IDLE;
		return;
	}
	if (ensure_trainer(w) != FB_OK || local_writable(w) != FB_OK) {
		w->st = S_IDLE;
		return;
	}
	atomic_store(&w->cancel, 0);
	if (pthread_create(&w->thread, NULL, train_main, w) != 0) {
		fb_log_error("cannot start the training thread");
		w->st = S_IDLE;
		return;
	}
	w->thread_live = true;
	w->st = S_TRAINING;
}

static void
on_model_chunk(wk *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	uint64_t off, len, total = w->param_count * 4;

	if (w->st != S_FETCHING || m->u.model_chunk.round != w->round) {
		fb_log_debug("dropped model chunk %u of round %u",
		    m->u.model_chunk.chunk, m->u.model_chunk.round);
		return;
	}
	if (m->u.model_chunk.chunk != w->next_chunk) {
		fb_log_warn("round %u: model chunk %u out of order (wanted %u);"
		            " abandoning the round",
		    w->round, m->u.model_chunk.chunk, w->next_chunk);
		w->st = S_IDLE;
		return;
	}
	off = (uint64_t)w->next_chunk * w->chunk_bytes;
	len = total - off < w->chunk_bytes ? total - off : w->chunk_bytes;
	if (f->payload_len != len + (w->secure ? FB_STREAM_CHUNK_OVERHEAD : 0)) {
		fb_log_warn("round %u: model chunk %u has %zu bytes, expected "
		            "%" PRIu64 "; abandoning the round",
		    w->round, w->next_chunk, f->payload_len, len);
		w->st = S_IDLE;
		return;
	}
	if (w->secure) {
		size_t mlen = 0;
		int final = 0;
		fb_reject why = FB_REJECT_NONE;
		if (fb_stream_pull_chunk(w->mpull, f->payload, f->payload_len,
		        (uint8_t *)w->global + off, len, &mlen, &final,
		        &why) != FB_OK ||
		    mlen != len ||
		    (final != 0) != (w->next_chunk + 1 == w->chunk_count)) {
			fb_log_warn("round %u: model chunk %u rejected (%s); "
			            "abandoning the round",
			    w->round, w->next_chunk, fb_reject_name(why));
			w->st = S_IDLE;
			return;
		}
	} else {
		memcpy((uint8_t *)w->global + off, f->payload, len);
	}
	w->next_chunk++;
	if (w->next_chunk == w->chunk_count && w->secure) {
		fb_reject why = FB_REJECT_NONE;
		if (fb_stream_pull_final(w->mpull, &w->coord_pk,
		        w->model_trailer.b, w->model_trailer.len, NULL, &why) !=
		    FB_OK) {
			fb_log_warn("round %u: the model's signature does not "
			            "verify (%s); abandoning the round",
			    w->round, fb_reject_name(why));
			w->st = S_IDLE;
			return;
		}
	}
	if (w->next_chunk == w->chunk_count) {
		fb_log_debug("round %u: model received; training %" PRIu64
		             " steps", w->round, w->steps);
		start_training(w);
	} else if (request_chunks(w) != FB_OK) {
		w->st = S_IDLE;
	}
}

/* The trainer thread finished: send the update (global - local). */
static void
on_trained(wk *w)
{
	uint64_t v;
	fb_err rc;

	if (read(w->efd, &v, sizeof(v)) < 0) {
		return;
	}
	pthread_join(w->thread, NULL);
	w->thread_live = false;
	w->st = S_IDLE;
	rc = w->train_rc;
	if (rc == FB_ECLOSED) {
		fb_log_info("round %u: training cancelled", w->round);
		return;
	}
	if (rc != FB_OK) {
		fb_log_error("round %u: training failed: %s", w->round,
		    fb_strerror(rc));
		return;
	}
	for (uint64_t j = 0; j < w->param_count; j++) {
		w->local[j] = w->global[j] - w->local[j];
	}
	w->a_norm = 0;
	if (w->fednova) {
		/* FedNova: send d_i = update / ||a_i||_1; the coordinator
		 * scales the mean back by tau_eff. */
		if (fb_fednova_a_norm(w->stats.steps, w->momentum, w->lr,
		        w->prox_mu, &w->a_norm) != FB_OK ||
		    fb_fednova_normalise(w->local, w->param_count, w->a_norm) !=
		        FB_OK) {
			fb_log_error("round %u: FedNova normaliser failed",
			    w->round);
			return;
		}
	}
	if (w->sa != NULL && !w->sa_masking) {
		fb_log_info("round %u: %" PRIu64 " steps in %.2fs, loss %.4f; "
		            "waiting for the secure-aggregation shares",
		    w->round, w->stats.steps, w->stats.seconds,
		    w->stats.loss_mean);
		w->sa_pending = true;
		return;
	}
	fb_log_info("round %u: %" PRIu64 " steps in %.2fs, loss %.4f; "
	            "sending %supdate",
	    w->round, w->stats.steps, w->stats.seconds, w->stats.loss_mean,
	    w->sa != NULL ? "masked " : "");
	if (send_update(w, w->stats.seconds, w->stats.loss_mean,
	        w->stats.steps) != FB_OK) {
		fb_log_warn("round %u: update not delivered", w->round);
	}
}

/* Returns FB_ECLOSED when the run is over, FB_OK to continue. */
static fb_err
on_message(wk *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;

	w->last_rx_ms = fb_now_ms();
	switch (m->type) {
	case FB_MSG_WELCOME:
		return on_welcome(w, m);
	case FB_MSG_REJECT:
		fb_log_error("the coordinator refused this worker: %s",
		    m->u.reject.reason);
		return FB_EAUTH;
	case FB_MSG_ROUND_START:
		if (w->welcomed) {
			on_round_start(w, m);
		}
		return FB_OK;
	case FB_MSG_MODEL_CHUNK:
		on_model_chunk(w, f);
		return FB_OK;
	case FB_MSG_HEARTBEAT:
		return FB_OK;
	case FB_MSG_HANDSHAKE:
		on_handshake_reply(w, m);
		return FB_OK;
	case FB_MSG_REDIRECT:
		on_redirect(w, m); /* closes the link f came on: f is gone */
		return FB_OK;
	case FB_MSG_ROUND_CANCEL:
		if (m->u.round_cancel.round == w->round &&
		    (w->st == S_FETCHING || w->st == S_TRAINING)) {
			fb_log_warn("round %u cancelled by the coordinator: %s",
			    w->round, m->u.round_cancel.reason);
			stop_training(w);
			w->st = S_IDLE;
		}
		if (m->u.round_cancel.round == w->round && w->sa != NULL) {
			sa_end(w);
		}
		return FB_OK;
	case FB_MSG_SECAGG:
		on_secagg(w, f);
		return FB_OK;
	case FB_MSG_SHUTDOWN:
		fb_log_info("coordinator ended the run: %s",
		    m->u.shutdown.reason);
		return FB_ECLOSED;
	default:
		fb_log_warn("unexpected %s from the coordinator",
		    fb_msg_type_name(m->type));
		return FB_OK;
	}
}

static fb_err
load_shard(wk *w)
{
	const fb_worker_config *cfg = w->cfg;
	fb_dataset full = {0};
	fb_partition_spec ps = {
	    .scheme = (fb_partition_scheme)cfg->partition,
	    .workers = (uint32_t)cfg->workers,
	    .index = (uint32_t)cfg->index,
	    .seed = (uint64_t)cfg->partition_seed,
	    .alpha = cfg->alpha,
	    .shards_per_worker = (uint32_t)cfg->shards_per_worker,
	};
	uint32_t *idx = NULL, n = 0;
	fb_err rc;

	if (cfg->dataset == 1) {
		return FB_OK;
	}
	if ((rc = fb_dataset_load_fmnist(cfg->data_dir, 1, &full)) != FB_OK) {
		fb_log_error("cannot load the training set from %s (data.dir)",
		    cfg->data_dir);
		goto out;
	}
	rc = fb_partition_indices(full.y, full.count, full.classes, &ps, &idx,
	    &n);
	if (rc != FB_OK) {
		goto out;
	}
	if ((rc = fb_dataset_subset(&full, idx, n, &w->shard)) != FB_OK) {
		goto out;
	}
	fb_log_info("shard %lld of %lld (%s): %u examples",
	    (long long)cfg->index, (long long)cfg->workers,
	    fb_partition_scheme_names[cfg->partition], n);
out:
	fb_free(idx);
	fb_dataset_fini(&full);
	return rc;
}

static void
tick(wk *w)
{
	int64_t now = fb_now_ms();

	if (!w->welcomed) {
		if (now - w->hello_since_ms > w->cfg->connect_timeout_ms) {
			return;
		}
		if (w->lane != 0 && w->lane != LANE_STAY &&
		    now - w->lane_since_ms > LANE_GIVEUP_MS) {
			fb_log_warn("no answer on the coordinator's lane %u for "
			            "%.0fs (is its port open?): back to %s, "
			            "staying there", w->lane,
			    (double)(now - w->lane_since_ms) / 1000.0,
			    w->cfg->coordinator);
			move_link(w, w->cfg->coordinator, LANE_STAY);
			return;
		}
		if (w->secure && w->sess == NULL) {
			if (now - w->last_hello_ms >= HANDSHAKE_RETRY_MS) {
				(void)send_handshake(w);
			}
		} else if (now - w->last_hello_ms >= HELLO_RETRY_MS) {
			(void)send_hello(w);
		}
		return;
	}
	if (now - w->last_tx_ms >= w->heartbeat_ms) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		hb.u.heartbeat.round = w->round;
		(void)wk_send(w, &hb, NULL, 0);
	}
	if (now - w->last_rx_ms > w->liveness_ms) {
		fb_log_warn("coordinator silent for %.1fs: reconnecting",
		    (double)(now - w->last_rx_ms) / 1000.0);
		stop_training(w);
		w->welcomed = false;
		w->st = S_HELLO;
		new_session(w);
		w->hello_since_ms = now;
		if (w->lane != 0) {
			/* The coordinator may have restarted with other lanes:
			 * ask its listen port again. */
			move_link(w, w->cfg->coordinator, 0);
		} else {
			join(w);
		}
	}
}

/*
 * Secure mode: opens sealed frames with the session; of plain frames only
 * the handshake reply and a refusal are taken. Returns false to drop.
 */
static bool
accept_frame(wk *w, fb_frame *f)
{
	int reject = 0;
	const char *why = NULL;

	if (!w->secure) {
		if (f->sealed) {
			fb_log_warn("dropped a sealed message: security is off "
			            "here but on at the coordinator?");
			return false;
		}
		return true;
	}
	if (!f->sealed) {
		if (f->msg.type == FB_MSG_HANDSHAKE ||
		    f->msg.type == FB_MSG_REJECT ||
		    f->msg.type == FB_MSG_REDIRECT) {
			return true;
		}
		fb_log_warn("dropped a plain %s: this worker only accepts "
		            "sealed messages", fb_msg_type_name(f->msg.type));
		return false;
	}
	if (w->sess == NULL) {
		return false;
	}
	if (fb_secure_open(w->sess, f, &reject, &why) != FB_OK) {
		fb_log_warn("dropped a sealed message: %s", why);
		return false;
	}
	return true;
}

/* security.peers: an allowlist file (public key lines, # comments). */
static fb_err
load_peers(wk *w, const char *path)
{
	char line[512];
	unsigned lineno = 0;
	FILE *f = fopen(path, "r");

	if (f == NULL) {
		fb_log_error("security.peers: cannot read %s", path);
		return FB_ECONFIG;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		char name[FB_COMMENT_MAX];
		fb_pubkey pk, *grown;
		size_t n = strcspn(line, "\r\n");
		lineno++;
		line[n] = '\0';
		if (line[0] == '\0' || line[0] == '#') {
			continue;
		}
		if (fb_pubkey_parse(line, &pk, name, sizeof(name)) != FB_OK) {
			fb_log_error("%s:%u: not a fedbox public key line", path,
			    lineno);
			fclose(f);
			return FB_ECONFIG;
		}
		grown = realloc(w->peers, (w->peer_count + 1) * sizeof(*grown));
		if (grown == NULL) {
			fclose(f);
			return FB_ENOMEM;
		}
		w->peers = grown;
		w->peers[w->peer_count++] = pk;
	}
	fclose(f);
	if (w->peer_count == 0) {
		fb_log_error("security.peers: %s lists no keys", path);
		return FB_ECONFIG;
	}
	return FB_OK;
}

static fb_err
load_keys(wk *w)
{
	const fb_worker_config *cfg = w->cfg;
	char comment[FB_COMMENT_MAX];
	fb_err rc;

	if (cfg->key[0] == '\0' || cfg->coordinator_key[0] == '\0') {
		fb_log_error("security.key and security.coordinator_key are "
		             "required (make a key with fedbox-keygen -o NAME), "
		             "or set security.enabled: false");
		return FB_ECONFIG;
	}
	if ((rc = fb_identity_load(cfg->key, &w->self)) != FB_OK) {
		return rc == FB_ENOMEM ? rc : FB_ECONFIG;
	}
	/* The pinned key: a public key line, or a file holding one. */
	if (strncmp(cfg->coordinator_key, "fedbox-ed25519 ", 15) == 0) {
		rc = fb_pubkey_parse(cfg->coordinator_key, &w->coord_pk, comment,
		    sizeof(comment));
		if (rc != FB_OK) {
			fb_log_error("security.coordinator_key: not a valid "
			             "public key line");
		}
	} else {
		rc = fb_pubkey_load(cfg->coordinator_key, &w->coord_pk, comment,
		    sizeof(comment));
	}
	if (rc != FB_OK) {
		return FB_ECONFIG;
	}
	w->secure = true;
	return cfg->peers[0] != '\0' ? load_peers(w, cfg->peers) : FB_OK;
}

fb_err
fb_worker_run(const fb_worker_config *cfg, volatile sig_atomic_t *stop)
{
	fb_err rc;
	wk w;
	fb_link_opts lo = {
	    .max_payload = (256u << 20) + FB_STREAM_CHUNK_OVERHEAD,
	    .send_timeout_ms = (int)cfg->send_timeout_ms,
	    .hwm = 16,
	};

	memset(&w, 0, sizeof(w));
	w.cfg = cfg;
	w.stop = stop;
	w.efd = -1;
	new_session(&w);
	if (cfg->security && (rc = load_keys(&w)) != FB_OK) {
		goto out;
	}
	if ((rc = load_shard(&w)) != FB_OK) {
		goto out;
	}
	if ((w.efd = eventfd(0, EFD_CLOEXEC)) < 0) {
		fb_log_error("eventfd: %s", strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	w.link_opts = lo;
	if ((rc = fb_link_connect(cfg->coordinator, &lo, &w.link)) != FB_OK) {
		goto out;
	}
	fb_log_info("connecting to %s as %s%s", cfg->coordinator, cfg->name,
	    w.secure ? "" : " (security off: unencrypted, unsigned)");
	w.hello_since_ms = fb_now_ms();
	join(&w);
	while (!*stop) {
		fb_frame f;
		const char *why = NULL;
		bool woke = false;

		rc = fb_link_recv(w.link, 100, w.efd, &woke, &f, &why);
		if (woke && w.thread_live) {
			on_trained(&w);
		}
		if (rc == FB_OK && !accept_frame(&w, &f)) {
			rc = FB_ETIMEDOUT; /* dropped: nothing to handle */
		}
		if (rc == FB_OK) {
			rc = on_message(&w, &f);
			if (rc == FB_ECLOSED) {
				rc = FB_OK;
				break;
			}
			if (rc != FB_OK) {
				break;
			}
		} else if (rc == FB_EPROTO) {
			fb_log_warn("dropped a malformed message: %s", why);
		} else if (rc != FB_ETIMEDOUT) {
			break;
		}
		rc = FB_OK;
		tick(&w);
		if (!w.welcomed &&
		    fb_now_ms() - w.hello_since_ms > cfg->connect_timeout_ms) {
			fb_log_error("no answer from the coordinator at %s for "
			             "%.0fs (transport.connect_timeout)",
			    cfg->coordinator,
			    (double)cfg->connect_timeout_ms / 1000.0);
			rc = FB_ETIMEDOUT;
			break;
		}
	}
	if (*stop) {
		fb_log_info("stopping on signal");
	}
out:
	stop_training(&w);
	fb_trainer_close(w.trainer);
	fb_link_close(w.link);
	fb_model_close(w.model);
	fb_dataset_fini(&w.shard);
	fb_free(w.global);
	fb_lent_free(w.local_lent); /* after fb_link_close: nothing in flight */
	fb_free(w.sendbuf);
	fb_free(w.encbuf);
	free(w.peers);
	sa_end(&w);
	fb_stream_pull_free(w.mpull);
	fb_handshake_free(w.hs);
	fb_session_free(w.sess);
	fb_identity_free(w.self);
	if (w.efd >= 0) {
		close(w.efd);
	}
	return rc;
}
