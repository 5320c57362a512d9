/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker_sm_test.c -- the worker's state machine (worker/worker_impl.h)
 * driven with synthetic events and a fake clock, with no socket and no
 * thread: a fake link records every message the worker hands it (and can
 * be made full), a fake trainer records starts and stops, and the test
 * plays the coordinator, in clear or with real sealed sessions, model
 * streams and a second secure-aggregation participant from crypto/.
 *
 * It checks the messages the worker emits and the phases it reaches: each
 * phase of a round, a cancel in each, a round start while a round runs,
 * the coordinator going silent (and merely busy), a queue that stays full,
 * malformed input, refusals in clear before and after the coordinator
 * authenticated itself, and the plug-in path a welcome names.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/pool.h"
#include "common/util.h"
#include "tests/unit/harness.h"
#include "worker/worker_impl.h"

#define P 51     /* parameters of the 8-4-3 MLP */
#define CHUNK 64 /* bytes per chunk: the model is 4 chunks */
#define NCHUNK 4
#define LAST_LEN (P * 4 - 3 * CHUNK) /* 12 */
#define LOG_MAX 1024
#define ROOM_ANY ((size_t)-1)
#define T0 1000000       /* the fake clock's start, ms */
#define PAYLOAD_BIT 0x80 /* a sealed payload's type (proto/secure.c) */

typedef struct sent {
	fb_msg msg;
	uint8_t *payload; /* copy, or NULL */
	size_t len;
	bool sealed;
	uint32_t seal_round; /* what the link would seal it for */
	bool lent;           /* sent from lent memory, without a copy */
} sent;

typedef struct fix {
	fb_worker_config cfg;
	fb_wk_io io;
	fb_wk w;
	int64_t now;
	/* the fake link and trainer */
	sent log[LOG_MAX];
	size_t nlog;
	size_t served; /* log entries the fake coordinator has answered */
	size_t room;   /* messages the link takes before it is full */
	int starts, stops, relinks;
	char relinked[FB_TEXT_MAX];
	fb_traffic traffic; /* what the fake connection moved */
	bool has_traffic;   /* false: the link cannot say */
	fb_err start_rc;
	/* the coordinator's side */
	float global[P];
	uint8_t head[FB_MAX_CONTROL_LEN + 256];
	uint8_t pbuf[16384];
	uint8_t lay[4096]; /* a welcome's layout (welcome_layout) */
	fb_identity *cid; /* coordinator */
	fb_identity *pid; /* the other SecAgg participant */
	fb_pubkey cpk, wpk, ppk;
	fb_run_id run;
	fb_session *cs; /* the coordinator's session with the worker */
	uint8_t mchunk[NCHUNK][CHUNK + FB_STREAM_CHUNK_OVERHEAD];
	size_t mchunk_len[NCHUNK];
	fb_secagg_worker *peer;
	fb_secagg_params sap;
	uint8_t ckey[FB_HS_COOKIE_KEY_LEN]; /* the coordinator's cookies */
	fb_train_eval ev; /* the evaluation the trainer thread reports */
	uint32_t credit_stale; /* UpdateCredit.staleness that writable sends */
	uint32_t max_stale;    /* the RoundStart's sa_max_staleness */
	uint64_t peer_max_samples; /* the peer's max_samples (0: the round's) */
} fix;

/* ---- the fakes ---------------------------------------------------------- */

static fb_err
fake_send(void *arg, fb_wk *w, const fb_msg *m, const void *payload, size_t len,
    fb_lent *origin, bool seal)
{
	fix *x = arg;
	sent *s;

	if (x->room == 0) {
		return FB_EAGAIN;
	}
	if (x->room != ROOM_ANY) {
		x->room--;
	}
	assert_true(x->nlog < LOG_MAX);
	s = &x->log[x->nlog++];
	memset(s, 0, sizeof(*s));
	s->msg = *m;
	s->sealed = seal;
	s->seal_round = fb_wk_msg_round(w, m);
	s->lent = origin != NULL;
	if (fb_msg_has_payload(m->type) && len > 0) {
		s->payload = malloc(len);
		assert_non_null(s->payload);
		memcpy(s->payload, payload, len);
		s->len = len;
	}
	return FB_OK;
}

static fb_err
fake_train_start(void *arg, fb_wk *w)
{
	fix *x = arg;

	x->starts++;
	return x->start_rc;
}

static void
fake_train_stop(void *arg, fb_wk *w)
{
	fix *x = arg;

	if (w->phase == FB_WK_TRAINING) {
		x->stops++;
	}
}

static fb_err
fake_relink(void *arg, fb_wk *w, const char *endpoint)
{
	fix *x = arg;

	x->relinks++;
	snprintf(x->relinked, sizeof(x->relinked), "%s", endpoint);
	x->room = ROOM_ANY; /* a new link: an empty queue */
	return FB_OK;
}

static fb_err
fake_traffic(void *arg, fb_wk *w, fb_traffic *t)
{
	fix *x = arg;

	*t = x->traffic;
	return x->has_traffic ? FB_OK : FB_ECLOSED;
}

static fix *
fix_new(bool secure)
{
	fix *x = calloc(1, sizeof(*x));

	assert_non_null(x);
	x->cfg.coordinator = (char *)"tcp://127.0.0.1:5555";
	x->cfg.name = (char *)"w0";
	x->cfg.data_dir = (char *)"";
	x->cfg.workers = 2;
	x->cfg.none_samples = 1000;
	x->cfg.throttle = 1.0;
	x->cfg.plugin = (char *)"";
	x->cfg.init_file = (char *)"";
	x->cfg.connect_timeout_ms = -1; /* forever, the default */
	x->cfg.send_timeout_ms = 30000;
	x->cfg.fetch_window = 2;
	x->cfg.security = secure;
	x->cfg.key = (char *)"";
	x->cfg.coordinator_key = (char *)"";
	x->cfg.secure_aggregation = secure ? 0 : 1;
	x->cfg.peers = (char *)"";
	x->cfg.dump_updates = (char *)"";
	x->io = (fb_wk_io){
	    .arg = x,
	    .send = fake_send,
	    .train_start = fake_train_start,
	    .train_stop = fake_train_stop,
	    .relink = fake_relink,
	    .traffic = fake_traffic,
	};
	x->room = ROOM_ANY;
	x->now = T0;
	for (int j = 0; j < P; j++) {
		x->global[j] = 0.25f * (float)(j % 7) - 0.5f;
	}
	fb_wk_init(&x->w, &x->cfg, &x->io);
	/* the samples this worker has: 600 of the welcome's model's shape
	 * (8 features, classes 0..2), all zero (nothing trains them here) */
	x->w.shard.count = 600;
	x->w.shard.dim = 8;
	x->w.shard.classes = 3;
	x->w.shard.x = fb_calloc(600 * 8, sizeof(float));
	x->w.shard.y = fb_calloc(600, sizeof(fb_label));
	assert_true(x->w.shard.x != NULL && x->w.shard.y != NULL);
	if (secure) {
		uint8_t seed[32] = {1};
		fb_identity *wid = NULL;
		assert_int_equal(
		    fb_identity_alloc_from_seed(seed, "coordinator", &x->cid),
		    FB_OK);
		seed[0] = 2;
		assert_int_equal(
		    fb_identity_alloc_from_seed(seed, "w0", &wid), FB_OK);
		seed[0] = 3;
		assert_int_equal(
		    fb_identity_alloc_from_seed(seed, "w1", &x->pid), FB_OK);
		fb_identity_pubkey(x->cid, &x->cpk);
		fb_identity_pubkey(wid, &x->wpk);
		fb_identity_pubkey(x->pid, &x->ppk);
		assert_int_equal(fb_run_id_random(&x->run), FB_OK);
		memset(x->ckey, 0x3c, sizeof(x->ckey));
		x->w.self = wid; /* the worker owns it from here */
		x->w.coord_pk = x->cpk;
		x->w.secure = true;
	}
	return x;
}

static void
fix_free(fix *x)
{
	fb_wk_fini(&x->w);
	for (size_t i = 0; i < x->nlog; i++) {
		free(x->log[i].payload);
	}
	fb_identity_free(x->cid);
	fb_identity_free(x->pid);
	fb_session_free(x->cs);
	fb_secagg_worker_free(x->peer);
	free(x);
}

/* ---- what the worker sent ---------------------------------------------- */

static sent *
last(fix *x)
{
	assert_true(x->nlog > 0);
	return &x->log[x->nlog - 1];
}

/* How many messages of `type` went out from log entry `from` on. */
static size_t
count_of(const fix *x, fb_msg_type type, size_t from)
{
	size_t n = 0;

	for (size_t i = from; i < x->nlog; i++) {
		n += x->log[i].msg.type == type;
	}
	return n;
}

/* The first message of `type` from log entry `from` on, or NULL. */
static sent *
find(fix *x, fb_msg_type type, size_t from)
{
	for (size_t i = from; i < x->nlog; i++) {
		if (x->log[i].msg.type == type) {
			return &x->log[i];
		}
	}
	return NULL;
}

/* ---- the coordinator's messages ----------------------------------------- */

static uint32_t
msg_round(const fix *x, const fb_msg *m)
{
	switch (m->type) {
	case FB_MSG_ROUND_START:
		return m->u.round_start.round;
	case FB_MSG_MODEL_CHUNK:
		return m->u.model_chunk.round;
	case FB_MSG_ROUND_CANCEL:
		return m->u.round_cancel.round;
	case FB_MSG_SECAGG:
		return m->u.secagg.round;
	default:
		return x->w.round;
	}
}

/*
 * welcome_layout: the layout a coordinator sends with welcome `m`, that of
 * the model it names (a plug-in: this worker's train.plugin; one that
 * cannot be built: the 8-4-3 MLP's), into x->lay.
 */
static void
welcome_layout(fix *x, const fb_msg *m, const void **payload, size_t *len)
{
	fb_model_spec spec;
	fb_model *mod = NULL;
	uint8_t *b = NULL;
	size_t n = 0;

	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "%s", m->u.welcome.model.arch);
	spec.input_dim = m->u.welcome.model.input_dim;
	spec.classes = m->u.welcome.model.classes;
	spec.hidden_count = m->u.welcome.model.hidden_count;
	memcpy(spec.hidden, m->u.welcome.model.hidden, sizeof(spec.hidden));
	snprintf(spec.plugin, sizeof(spec.plugin), "%s", x->cfg.plugin);
	if (fb_model_open(&spec, &mod) != FB_OK) {
		snprintf(spec.arch, sizeof(spec.arch), "mlp");
		spec.input_dim = 8;
		spec.classes = 3;
		spec.hidden[0] = 4;
		spec.hidden_count = 1;
		assert_int_equal(fb_model_open(&spec, &mod), FB_OK);
	}
	assert_int_equal(fb_model_layout_pack(mod, &b, &n), FB_OK);
	assert_true(n <= sizeof(x->lay));
	memcpy(x->lay, b, n);
	fb_free(b);
	fb_model_close(mod);
	*payload = x->lay;
	*len = n;
}

/* In clear, as the link hands it over. A welcome without a payload gets
 * its model's layout. */
static fb_err
deliver(fix *x, const fb_msg *m, const void *payload, size_t len)
{
	fb_frame f;

	if (m->type == FB_MSG_WELCOME && payload == NULL) {
		welcome_layout(x, m, &payload, &len);
	}
	memset(&f, 0, sizeof(f));
	f.msg = *m;
	if (fb_msg_has_payload(m->type)) {
		assert_true(len <= sizeof(x->pbuf));
		if (len > 0) {
			memcpy(x->pbuf, payload, len);
		}
		f.payload = x->pbuf;
		f.payload_len = len;
	}
	return fb_wk_on_frame(&x->w, &f, x->now);
}

/* Sealed with the coordinator's session, as proto/secure.c seals it. */
static fb_err
deliver_sealed(fix *x, const fb_msg *m, const void *payload, size_t len)
{
	uint8_t env[FB_MAX_CONTROL_LEN];
	size_t env_len = 0, sl = 0, pl = 0;
	uint32_t round = msg_round(x, m);
	bool with_payload = fb_msg_has_payload(m->type);
	fb_frame f;

	if (m->type == FB_MSG_WELCOME && payload == NULL) {
		welcome_layout(x, m, &payload, &len);
	}
	memset(&f, 0, sizeof(f));
	assert_non_null(x->cs);
	assert_int_equal(
	    fb_msg_pack_envelope(m, env, sizeof(env), &env_len), FB_OK);
	x->head[0] = 'F';
	x->head[1] = 'B';
	x->head[2] = 1;
	x->head[3] = FB_WIRE_SEALED | (with_payload ? FB_WIRE_PAYLOAD : 0);
	assert_int_equal(fb_msg_seal(x->cs, (uint8_t)m->type, round, env,
	                     env_len, x->head + 4, sizeof(x->head) - 4, &sl),
	    FB_OK);
	f.sealed = true;
	f.sealed_data = x->head + 4;
	f.sealed_len = sl;
	if (with_payload &&
	    (m->type == FB_MSG_SECAGG || m->type == FB_MSG_WELCOME)) {
		assert_int_equal(
		    fb_msg_seal(x->cs, (uint8_t)(m->type | PAYLOAD_BIT), round,
		        payload != NULL ? payload : (const void *)"", len,
		        x->pbuf, sizeof(x->pbuf), &pl),
		    FB_OK);
		f.payload = x->pbuf;
		f.payload_len = pl;
	} else if (with_payload) {
		assert_true(len <= sizeof(x->pbuf));
		if (len > 0) {
			memcpy(x->pbuf, payload, len);
		}
		f.payload = x->pbuf;
		f.payload_len = len;
	}
	return fb_wk_on_frame(&x->w, &f, x->now);
}

static fb_err
send_msg(fix *x, const fb_msg *m, const void *payload, size_t len)
{
	return x->w.secure ? deliver_sealed(x, m, payload, len)
	                   : deliver(x, m, payload, len);
}

static fb_msg
welcome_msg(void)
{
	fb_msg m = {.type = FB_MSG_WELCOME};

	m.u.welcome.protocol_version = FB_PROTOCOL_VERSION;
	m.u.welcome.run_id = 42;
	m.u.welcome.worker_id = 1;
	m.u.welcome.heartbeat_ms = 200;
	m.u.welcome.liveness_ms = 3000;
	m.u.welcome.chunk_bytes = CHUNK;
	m.u.welcome.param_count = P;
	strcpy(m.u.welcome.model.arch, "mlp");
	m.u.welcome.model.input_dim = 8;
	m.u.welcome.model.classes = 3;
	m.u.welcome.model.hidden[0] = 4;
	m.u.welcome.model.hidden_count = 1;
	return m;
}

static fb_msg
round_msg(uint32_t round, uint32_t first)
{
	fb_msg m = {.type = FB_MSG_ROUND_START};

	m.u.round_start.round = round;
	m.u.round_start.param_count = P;
	m.u.round_start.chunk_count = NCHUNK;
	m.u.round_start.chunk_bytes = CHUNK;
	m.u.round_start.local_steps = 5;
	m.u.round_start.batch_size = 8;
	m.u.round_start.lr = 0.1f;
	m.u.round_start.seed = 9;
	m.u.round_start.deadline_ms = 60000;
	m.u.round_start.first_chunk = first;
	return m;
}

static fb_msg
simple_msg(fb_msg_type type, uint32_t round)
{
	fb_msg m = {.type = type};

	if (type == FB_MSG_HEARTBEAT) {
		m.u.heartbeat.round = round;
	} else if (type == FB_MSG_ROUND_CANCEL) {
		m.u.round_cancel.round = round;
		strcpy(m.u.round_cancel.reason, "round deadline passed");
	} else if (type == FB_MSG_REJECT) {
		strcpy(m.u.reject.reason, "injected");
	} else if (type == FB_MSG_SHUTDOWN) {
		strcpy(m.u.shutdown.reason, "all rounds done");
	}
	return m;
}

/* Secure mode: the round's model as the coordinator streams it. */
static void
model_stream(fix *x, fb_msg *rs)
{
	/* (secure async: the model under the step's round, model_round) */
	fb_stream_ctx ctx = {.run = x->run,
	    .round = rs->u.round_start.model_round != 0
	        ? rs->u.round_start.model_round
	        : rs->u.round_start.round,
	    .sender = FB_SENDER_COORDINATOR};
	fb_stream_push *p = NULL;

	assert_int_equal(
	    fb_stream_push_alloc(&ctx, CHUNK, FB_STREAM_DIGEST_FULL,
	        rs->u.round_start.round_key.b,
	        rs->u.round_start.stream_header.b, &p),
	    FB_OK);
	rs->u.round_start.round_key.len = FB_STREAM_KEY_LEN;
	rs->u.round_start.stream_header.len = FB_STREAM_HEADER_LEN;
	for (uint32_t k = 0; k < NCHUNK; k++) {
		size_t len = k + 1 == NCHUNK ? LAST_LEN : CHUNK;
		assert_int_equal(
		    fb_stream_push_chunk(p,
		        (const uint8_t *)x->global + (size_t)k * CHUNK, len,
		        k + 1 == NCHUNK, x->mchunk[k], sizeof(x->mchunk[k]),
		        &x->mchunk_len[k]),
		    FB_OK);
	}
	assert_int_equal(
	    fb_stream_push_final(p, x->cid, rs->u.round_start.stream_trailer.b),
	    FB_OK);
	rs->u.round_start.stream_trailer.len = FB_STREAM_TRAILER_LEN;
	fb_stream_push_free(p);
}

/* Answers the worker's model requests, in order, until it stops asking. */
static void
serve_model(fix *x)
{
	for (; x->served < x->nlog; x->served++) {
		sent *s = &x->log[x->served];
		fb_msg c = {.type = FB_MSG_MODEL_CHUNK};
		uint32_t k;

		if (s->msg.type != FB_MSG_MODEL_FETCH) {
			continue;
		}
		k = s->msg.u.model_fetch.chunk;
		assert_true(k < NCHUNK);
		c.u.model_chunk.round = s->msg.u.model_fetch.round;
		c.u.model_chunk.chunk = k;
		if (x->w.secure) {
			assert_int_equal(deliver_sealed(x, &c, x->mchunk[k],
			                     x->mchunk_len[k]),
			    FB_OK);
		} else {
			assert_int_equal(
			    deliver(x, &c,
			        (const uint8_t *)x->global + (size_t)k * CHUNK,
			        k + 1 == NCHUNK ? LAST_LEN : CHUNK),
			    FB_OK);
		}
	}
}

/* The link has room: what waits goes; an update that began and has no
 * credit left gets the coordinator's (8 chunks, as coordinator/upload.c
 * grants them), sealed in secure mode. */
static void
writable(fix *x)
{
	fb_wk_on_writable(&x->w, x->now);
	if (x->w.phase == FB_WK_UPLOADING && x->w.up.begun &&
	    x->w.up.credit == 0 && x->w.up.pos < x->w.up.chunks) {
		fb_msg cr = {.type = FB_MSG_UPDATE_CREDIT};
		cr.u.update_credit.round = x->w.round;
		cr.u.update_credit.chunks = 8;
		cr.u.update_credit.staleness = x->credit_stale;
		assert_int_equal(send_msg(x, &cr, NULL, 0), FB_OK);
	}
}

/* What the fake trainer "computed": local = global - u, u[j] known. */
static void
train_done(fix *x, fb_err rc)
{
	for (int j = 0; j < P; j++) {
		x->w.local[j] = x->global[j] - 0.01f * (float)(j + 1);
	}
	memset(&x->w.stats, 0, sizeof(x->w.stats));
	x->w.stats.steps = 5;
	x->w.stats.samples = 40;
	x->w.stats.loss_mean = 0.5;
	x->w.stats.seconds = 0.25;
	/* as the trainer thread does after training */
	x->w.eval = x->ev;
	x->w.train_rc = rc == FB_OK ? fb_wk_update_form(&x->w) : rc;
	fb_wk_on_trained(&x->w, x->now);
}

/* The last message sent is a RoundFailed for round, whose reason holds
 * want. */
static void
assert_failed(fix *x, uint32_t round, const char *want)
{
	const fb_msg *m = &last(x)->msg;

	assert_int_equal(m->type, FB_MSG_ROUND_FAILED);
	assert_int_equal(m->u.round_failed.round, round);
	assert_true(m->u.round_failed.reason[0] != '\0');
	assert_non_null(strstr(m->u.round_failed.reason, want));
}

/* Plain: admitted by the welcome. */
static void
plain_join(fix *x)
{
	fb_msg m = welcome_msg();

	fb_wk_start(&x->w, x->now);
	assert_int_equal(last(x)->msg.type, FB_MSG_HELLO);
	assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
}

/* The worker's last message is a cookie request (an empty handshake in
 * clear): the coordinator's cookie goes back, and the signed hello that
 * answers it is returned. */
static sent *
cookie_to_hello(fix *x)
{
	fb_msg c = {.type = FB_MSG_HANDSHAKE};
	sent *h = last(x);

	assert_int_equal(h->msg.type, FB_MSG_HANDSHAKE);
	assert_false(h->sealed);
	assert_int_equal(h->msg.u.handshake.data.len, 0);
	fb_hs_cookie_make(x->ckey, x->now, c.u.handshake.data.b);
	c.u.handshake.data.len = FB_HS_COOKIE_LEN;
	assert_int_equal(deliver(x, &c, NULL, 0), FB_OK);
	h = last(x);
	assert_int_equal(h->msg.type, FB_MSG_HANDSHAKE);
	assert_false(h->sealed);
	assert_int_equal(h->msg.u.handshake.data.len, FB_HS_HELLO_LEN);
	/* it carries the cookie, signed */
	assert_memory_equal(h->msg.u.handshake.data.b + 68,
	    c.u.handshake.data.b, FB_HS_COOKIE_LEN);
	return h;
}

/* The coordinator's side of a handshake with this fixture. */
static fb_hs_accept_cfg
accept_cfg(fix *x, fb_allowlist *al)
{
	fb_hs_accept_cfg hc = {
	    .self = x->cid,
	    .run = x->run,
	    .proto_version = FB_PROTOCOL_VERSION,
	    .lookup = fb_allowlist_lookup_cb,
	    .lookup_arg = al,
	    .cookie_key = x->ckey,
	    .now_ms = x->now,
	    .cookie_ms = 30000,
	};
	return hc;
}

/* Secure: handshake in clear, then a sealed hello and welcome. */
static void
secure_join(fix *x)
{
	fb_allowlist al = {&x->wpk, 1};
	fb_hs_accept_cfg hc = accept_cfg(x, &al);
	fb_msg r = {.type = FB_MSG_HANDSHAKE}, m = welcome_msg();
	fb_reject why = FB_REJECT_NONE;
	sent *h;

	fb_wk_start(&x->w, x->now);
	h = cookie_to_hello(x);
	fb_session_free(x->cs);
	x->cs = NULL;
	assert_int_equal(fb_handshake_accept(&hc, h->msg.u.handshake.data.b,
	                     h->msg.u.handshake.data.len, r.u.handshake.data.b,
	                     &x->cs, &why),
	    FB_OK);
	r.u.handshake.data.len = FB_HS_REPLY_LEN;
	assert_int_equal(deliver(x, &r, NULL, 0), FB_OK);
	assert_non_null(x->w.sess);
	assert_int_equal(last(x)->msg.type, FB_MSG_HELLO);
	assert_true(last(x)->sealed);
	assert_int_equal(deliver_sealed(x, &m, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_true(x->w.admitted);
}

/* A round up to the trainer's start. */
static void
run_to_training(fix *x, uint32_t round, uint32_t first)
{
	fb_msg rs = round_msg(round, first);

	if (x->w.secure) {
		model_stream(x, &rs);
	}
	x->served = x->nlog;
	assert_int_equal(send_msg(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_FETCHING);
	serve_model(x);
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	assert_memory_equal(x->w.global, x->global, sizeof(x->global));
}

/* ---- plain rounds ------------------------------------------------------- */

static void
test_hello_and_welcome(void **state)
{
	fix *x = fix_new(false);
	fb_msg m = welcome_msg();
	sent *h;

	fb_wk_start(&x->w, x->now);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	h = last(x);
	assert_int_equal(h->msg.type, FB_MSG_HELLO);
	assert_false(h->sealed);
	assert_string_equal(h->msg.u.hello.name, "w0");
	assert_int_equal(h->msg.u.hello.protocol_version, FB_PROTOCOL_VERSION);
	assert_int_equal(h->msg.u.hello.num_samples, 600);
	assert_int_equal(h->msg.u.hello.session, x->w.session);
	assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->w.param_count, P);
	/* A repeat of the welcome (a hello we resent) changes nothing. */
	assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->nlog, 1);
	fix_free(x);
}

static void
test_round_end_to_end(void **state)
{
	fix *x = fix_new(false);
	size_t begin_at;
	sent *b;

	plain_join(x);
	run_to_training(x, 1, 2);
	assert_int_equal(x->starts, 1);
	assert_int_equal(count_of(x, FB_MSG_MODEL_FETCH, 0), NCHUNK);
	begin_at = x->nlog;
	train_done(x, FB_OK);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	assert_true(fb_wk_wants_out(&x->w));
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_false(fb_wk_wants_out(&x->w));
	/* UpdateBegin, then chunks 2, 3, 0, 1: rotated from first_chunk. */
	assert_int_equal(x->nlog - begin_at, 1 + NCHUNK);
	b = &x->log[begin_at];
	assert_int_equal(b->msg.type, FB_MSG_UPDATE_BEGIN);
	assert_int_equal(b->msg.u.update_begin.round, 1);
	assert_int_equal(b->msg.u.update_begin.chunk_count, NCHUNK);
	assert_int_equal(b->msg.u.update_begin.num_samples, 600);
	assert_int_equal(b->msg.u.update_begin.steps, 5);
	for (uint32_t pos = 0; pos < NCHUNK; pos++) {
		sent *c = &x->log[begin_at + 1 + pos];
		uint32_t k = (2 + pos) % NCHUNK;
		float want[CHUNK / 4];
		size_t len = k + 1 == NCHUNK ? LAST_LEN : CHUNK;
		for (size_t j = 0; j < len / 4; j++) {
			size_t e = (size_t)k * (CHUNK / 4) + j;
			want[j] = x->global[e] -
			          (x->global[e] - 0.01f * (float)(e + 1));
		}
		assert_int_equal(c->msg.type, FB_MSG_UPDATE_CHUNK);
		assert_int_equal(c->msg.u.update_chunk.chunk, k);
		assert_true(c->lent); /* from w->local, without a copy */
		assert_int_equal(c->len, len);
		assert_memory_equal(c->payload, want, len);
	}
	fix_free(x);
}

/* The global model's evaluation rides in a plain UpdateBegin, named
 * metrics included. */
static void
test_plain_update_carries_evaluation(void **state)
{
	fix *x = fix_new(false);
	size_t at;
	sent *b;

	x->ev.examples = 250;
	x->ev.loss = 0.75;
	x->ev.accuracy = 0.812;
	x->ev.metric_count = 1;
	snprintf(x->ev.name[0], sizeof(x->ev.name[0]), "f1");
	x->ev.value[0] = 0.66;
	plain_join(x);
	run_to_training(x, 1, 2);
	at = x->nlog;
	train_done(x, FB_OK);
	fb_wk_on_writable(&x->w, x->now);
	b = &x->log[at];
	assert_int_equal(b->msg.type, FB_MSG_UPDATE_BEGIN);
	assert_int_equal(b->msg.u.update_begin.eval_examples, 250);
	assert_true(b->msg.u.update_begin.eval_loss == 0.75);
	assert_true(b->msg.u.update_begin.eval_accuracy == 0.812);
	assert_int_equal(b->msg.u.update_begin.eval_metric_count, 1);
	assert_string_equal(b->msg.u.update_begin.eval_name[0], "f1");
	assert_true(b->msg.u.update_begin.eval_metric[0] == 0.66);
	fix_free(x);
}

/* After UpdateBegin the chunks wait for the coordinator's credit: none
 * goes without one, and the loop does not spin meanwhile (nothing to
 * send); a credit lets exactly that many go; a credit for another round
 * is ignored, one beyond what is left is cut to it. */
static void
test_chunks_wait_for_credit(void **state)
{
	fix *x = fix_new(false);
	fb_msg cr = {.type = FB_MSG_UPDATE_CREDIT};
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	at = x->nlog;
	train_done(x, FB_OK);
	fb_wk_on_writable(&x->w, x->now);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_BEGIN, at), 1);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), 0);
	assert_false(fb_wk_wants_out(&x->w));
	cr.u.update_credit.round = 2;
	cr.u.update_credit.chunks = 8;
	assert_int_equal(deliver(x, &cr, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), 0);
	cr.u.update_credit.round = 1;
	cr.u.update_credit.chunks = 1;
	assert_int_equal(deliver(x, &cr, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), 1);
	assert_false(fb_wk_wants_out(&x->w));
	cr.u.update_credit.chunks = 2;
	assert_int_equal(deliver(x, &cr, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), 3);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	cr.u.update_credit.chunks = 100; /* one chunk is left */
	assert_int_equal(deliver(x, &cr, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), NCHUNK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fix_free(x);
}

static void
test_fetch_window(void **state)
{
	fix *x = fix_new(false);
	fb_msg rs = round_msg(1, 0), c = {.type = FB_MSG_MODEL_CHUNK};
	size_t at;

	plain_join(x);
	at = x->nlog;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	/* fetch_window 2: two requests ahead, one more per chunk taken */
	assert_int_equal(count_of(x, FB_MSG_MODEL_FETCH, at), 2);
	assert_false(fb_wk_wants_out(&x->w)); /* the window is full */
	c.u.model_chunk.round = 1;
	c.u.model_chunk.chunk = 0;
	assert_int_equal(deliver(x, &c, x->global, CHUNK), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_MODEL_FETCH, at), 3);
	assert_int_equal(last(x)->msg.u.model_fetch.chunk, 2);
	fix_free(x);
}

static void
test_full_queue_defers_and_resumes(void **state)
{
	fix *x = fix_new(false);
	fb_msg rs = round_msg(3, 1);
	size_t at;

	plain_join(x);
	x->room = 1; /* one request goes, the next finds the queue full */
	x->served = x->nlog;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_MODEL_FETCH, 0), 1);
	assert_true(fb_wk_wants_out(&x->w));
	x->room = ROOM_ANY;
	writable(x);
	assert_int_equal(count_of(x, FB_MSG_MODEL_FETCH, 0), 2);
	serve_model(x);
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	train_done(x, FB_OK);
	/* The update goes as the link takes it: 2, then 0, then the rest. */
	at = x->nlog;
	x->room = 2;
	writable(x);
	assert_int_equal(x->nlog - at, 2);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	assert_true(fb_wk_wants_out(&x->w));
	writable(x); /* still full: nothing */
	assert_int_equal(x->nlog - at, 2);
	x->room = ROOM_ANY;
	writable(x);
	assert_int_equal(x->nlog - at, 1 + NCHUNK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	for (uint32_t pos = 0; pos < NCHUNK; pos++) {
		assert_int_equal(x->log[at + 1 + pos].msg.u.update_chunk.chunk,
		    (1 + pos) % NCHUNK);
	}
	fix_free(x);
}

static void
test_busy_upload_answers_coordinator(void **state)
{
	fix *x = fix_new(false);
	fb_msg hb = simple_msg(FB_MSG_HEARTBEAT, 1);
	fb_msg cancel = simple_msg(FB_MSG_ROUND_CANCEL, 1);
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	train_done(x, FB_OK);
	x->room = 2;
	writable(x);
	/* The coordinator reads slowly for 10 s (more than its 3 s liveness)
	 * but keeps sending heartbeats: the worker stays, and uploads on. */
	for (int s = 0; s < 10; s++) {
		x->now += 1000;
		assert_int_equal(deliver(x, &hb, NULL, 0), FB_OK);
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
		assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	}
	assert_int_equal(count_of(x, FB_MSG_HELLO, 1), 0);
	/* A cancel mid-upload ends it: nothing more of it goes out. */
	assert_int_equal(deliver(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_false(fb_wk_wants_out(&x->w));
	at = x->nlog;
	x->room = ROOM_ANY;
	writable(x);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), 0);
	fix_free(x);
}

static void
test_cancel_in_each_phase(void **state)
{
	fb_msg cancel = simple_msg(FB_MSG_ROUND_CANCEL, 1);
	fb_msg other = simple_msg(FB_MSG_ROUND_CANCEL, 9);
	fix *x;
	size_t at;

	/* while fetching: no more requests */
	x = fix_new(false);
	plain_join(x);
	x->cfg.fetch_window = 1;
	{
		fb_msg rs = round_msg(1, 0);
		assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	}
	assert_int_equal(deliver(x, &other, NULL, 0), FB_OK); /* not ours */
	assert_int_equal(x->w.phase, FB_WK_FETCHING);
	assert_int_equal(deliver(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	at = x->nlog;
	x->served = x->nlog - 1;
	serve_model(x); /* its chunk 0 arrives late: dropped */
	assert_int_equal(x->nlog, at);
	assert_int_equal(x->starts, 0);
	fix_free(x);

	/* while training: the trainer is stopped; its end is ignored */
	x = fix_new(false);
	plain_join(x);
	run_to_training(x, 1, 0);
	assert_int_equal(deliver(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->stops, 1);
	at = x->nlog;
	train_done(x, FB_ECLOSED);
	train_done(x, FB_OK);
	assert_int_equal(x->nlog, at);
	fix_free(x);

	/* while uploading: covered by the busy upload; after it: nothing */
	x = fix_new(false);
	plain_join(x);
	run_to_training(x, 1, 0);
	train_done(x, FB_OK);
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	at = x->nlog;
	assert_int_equal(deliver(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->nlog, at);
	fix_free(x);
}

static void
test_round_start_while_running(void **state)
{
	fix *x = fix_new(false);
	fb_msg rs = round_msg(2, 0);
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	at = x->nlog;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->stops, 1);
	assert_int_equal(x->w.phase, FB_WK_FETCHING);
	assert_int_equal(x->w.round, 2);
	assert_int_equal(
	    find(x, FB_MSG_MODEL_FETCH, at)->msg.u.model_fetch.round, 2);
	x->served = at;
	serve_model(x);
	train_done(x, FB_OK);
	/* and while uploading round 2: its update stops, round 3 goes on */
	x->room = 1;
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	rs = round_msg(3, 0);
	x->room = ROOM_ANY;
	at = x->nlog;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_FETCHING);
	writable(x);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, at), 0);
	fix_free(x);
}

static void
test_trainer_failures(void **state)
{
	fix *x = fix_new(false);
	fb_msg rs = round_msg(2, 0);
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	at = x->nlog;
	train_done(x, FB_EINVAL);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	/* the coordinator is told at once, with the reason; no update */
	assert_int_equal(x->nlog, at + 1);
	assert_failed(x, 1, "training failed: ");
	/* a trainer that does not start: the round is left, and said so */
	x->start_rc = FB_ENOTSUP;
	x->served = x->nlog;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	serve_model(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->starts, 2);
	assert_failed(x, 2, "");
	fix_free(x);
}

/* An update that holds NaN is never sent: the round fails, by name. */
static void
test_nan_update_fails_round(void **state)
{
	fix *x = fix_new(false);
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	at = x->nlog;
	for (int j = 0; j < P; j++) {
		x->w.local[j] = x->global[j];
	}
	x->w.local[P / 2] = NAN;
	memset(&x->w.stats, 0, sizeof(x->w.stats));
	x->w.stats.steps = 5;
	x->w.stats.samples = 40;
	x->w.train_rc = fb_wk_update_form(&x->w);
	assert_int_equal(x->w.train_rc, FB_ERANGE);
	fb_wk_on_trained(&x->w, x->now);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->nlog, at + 1);
	assert_failed(x, 1, "training failed: ");
	fix_free(x);
}

static void
test_silent_coordinator(void **state)
{
	fix *x = fix_new(false);
	uint64_t old_session;
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	old_session = x->w.session;
	/* heartbeats go out every 200 ms while nothing else does */
	at = x->nlog;
	for (int i = 0; i < 14; i++) {
		x->now += 200;
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	}
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	assert_true(count_of(x, FB_MSG_HEARTBEAT, at) >= 13);
	/* 3 s (its liveness) without a word: gone; training stops, and the
	 * worker joins again with a new session */
	x->now += 400;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	assert_false(x->w.welcomed);
	assert_int_equal(x->stops, 1);
	assert_int_equal(last(x)->msg.type, FB_MSG_HELLO);
	assert_int_not_equal(last(x)->msg.u.hello.session, old_session);
	/* on a new link: the old connection may be dead (a partition) */
	assert_int_equal(x->relinks, 1);
	assert_string_equal(x->relinked, "tcp://127.0.0.1:5555");
	fix_free(x);
}

static void
test_full_queue_past_send_timeout(void **state)
{
	fix *x = fix_new(false);
	fb_msg hb = simple_msg(FB_MSG_HEARTBEAT, 0);

	int64_t full_at = 0;

	plain_join(x);
	x->w.lane = 1; /* on a lane: the rejoin goes back to listen's port */
	x->room = 0;
	/* The coordinator's heartbeats come in, but it takes nothing from
	 * us: the first heartbeat we try finds the queue full at T0 + 1 s. */
	while (x->w.phase == FB_WK_IDLE && x->now < T0 + 60000) {
		x->now += 1000;
		assert_int_equal(deliver(x, &hb, NULL, 0), FB_OK);
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
		full_at = full_at != 0 ? full_at : x->now;
	}
	/* more than 30 s (transport.send_timeout) full: rejoin */
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	assert_int_equal(x->now - full_at, 31000);
	assert_int_equal(x->relinks, 1);
	assert_string_equal(x->relinked, "tcp://127.0.0.1:5555");
	assert_int_equal(last(x)->msg.type, FB_MSG_HELLO);
	fix_free(x);
}

/* The times (ms after T0) the hellos of a 10-minute outage went out. */
static size_t
hello_times(fix *x, int64_t *at, size_t cap)
{
	size_t n = 0;

	fb_wk_start(&x->w, x->now);
	at[n++] = 0;
	while (x->now < T0 + 600000) {
		size_t before = count_of(x, FB_MSG_HELLO, 0);
		x->now += 10;
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
		if (count_of(x, FB_MSG_HELLO, 0) > before && n < cap) {
			at[n++] = x->now - T0;
		}
	}
	return n;
}

static void
test_join_retries_with_backoff(void **state)
{
	fix *x = fix_new(false), *y = fix_new(false);
	int64_t at[256], bt[256];
	size_t n, m, same = 0;

	/* no answer for 10 minutes: never given up (forever), the hellos go
	 * out ever further apart, each gap in the upper half of the
	 * interval: 1 s, 2 s, 4 s, ... 30 s */
	n = hello_times(x, at, 256);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	assert_true(n >= 20 && n < 40);
	for (size_t i = 1; i < n; i++) {
		int64_t gap = at[i] - at[i - 1];
		int64_t r = (int64_t)FB_WK_JOIN_RETRY_MS << (i - 1);
		r = r > FB_WK_JOIN_RETRY_MAX_MS ? FB_WK_JOIN_RETRY_MAX_MS : r;
		assert_true(gap >= r / 2 && gap <= r + 10);
	}
	/* another worker (another session) draws other gaps: not in step */
	m = hello_times(y, bt, 256);
	for (size_t i = 1; i < n && i < m; i++) {
		same += at[i] == bt[i];
	}
	assert_true(same < 3);
	fix_free(x);
	fix_free(y);
	/* with a connect timeout set, it gives up after it */
	x = fix_new(false);
	x->cfg.connect_timeout_ms = 120000;
	fb_wk_start(&x->w, x->now);
	x->now = T0 + 120000;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	x->now += 1;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_ETIMEDOUT);
	fix_free(x);
}

static void
test_link_events_join_and_rejoin(void **state)
{
	fix *x = fix_new(false);
	fb_msg wm = welcome_msg();
	uint64_t old_session;
	size_t at;

	/* no connection at first: the hello finds no room and waits; the
	 * connection comes up and it goes at once */
	x->room = 0;
	fb_wk_start(&x->w, x->now);
	assert_int_equal(x->nlog, 0);
	assert_false(fb_wk_wants_out(&x->w));
	x->room = ROOM_ANY;
	x->now += 300;
	fb_wk_on_link(&x->w, true, 1, x->now);
	assert_int_equal(count_of(x, FB_MSG_HELLO, 0), 1);
	/* up but the queue full: it goes on the first room */
	fb_wk_rejoin(&x->w, "test", false);
	at = x->nlog;
	x->room = 0;
	fb_wk_on_link(&x->w, false, 1, x->now);
	fb_wk_on_link(&x->w, true, 2, x->now);
	assert_true(fb_wk_wants_out(&x->w));
	x->room = ROOM_ANY;
	writable(x);
	assert_int_equal(count_of(x, FB_MSG_HELLO, at), 1);
	assert_false(fb_wk_wants_out(&x->w));
	assert_int_equal(deliver(x, &wm, NULL, 0), FB_OK);
	assert_true(x->w.welcomed);
	run_to_training(x, 1, 0);
	/* the connection closes: the round is left and the worker joins
	 * again, with a new session, as soon as a connection is back */
	old_session = x->w.session;
	at = x->nlog;
	x->now += 50;
	fb_wk_on_link(&x->w, false, 2, x->now);
	assert_false(x->w.welcomed);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	assert_int_equal(x->stops, 1);
	assert_int_not_equal(x->w.session, old_session);
	fb_wk_on_link(&x->w, true, 3, x->now);
	assert_true(count_of(x, FB_MSG_HELLO, at) >= 1);
	assert_int_equal(last(x)->msg.u.hello.session, x->w.session);
	/* welcomed again; a connection replaced under it (a new one came up
	 * without our seeing the old go) is a rejoin too */
	assert_int_equal(deliver(x, &wm, NULL, 0), FB_OK);
	assert_true(x->w.welcomed);
	fb_wk_on_link(&x->w, true, 3, x->now); /* the same: nothing */
	assert_true(x->w.welcomed);
	fb_wk_on_link(&x->w, true, 4, x->now);
	assert_false(x->w.welcomed);
	fix_free(x);
}

/* A handshake the link took before its first connection was seen went
 * out on that connection: the connection's event does not start another
 * (its reply would then be refused), but a later connection does; nor
 * does that event, seen after the welcome, make the worker rejoin. */
static void
test_first_connection_keeps_its_handshake(void **state)
{
	fix *x = fix_new(true);
	size_t at;

	fb_wk_start(&x->w, x->now);
	assert_int_equal(count_of(x, FB_MSG_HANDSHAKE, 0), 1);
	at = x->nlog;
	fb_wk_on_link(&x->w, true, 1, x->now);
	assert_int_equal(x->nlog, at); /* nothing more */
	assert_true(x->w.cookie_wait); /* its cookie request is out */
	/* that connection closes before the reply: the next one gets a
	 * fresh handshake at once */
	fb_wk_on_link(&x->w, false, 1, x->now);
	fb_wk_on_link(&x->w, true, 2, x->now);
	assert_int_equal(count_of(x, FB_MSG_HANDSHAKE, at), 1);
	fix_free(x);
	/* the first connection's event may come only after the welcome: it
	 * is the connection the worker joined on, not a replacement */
	x = fix_new(true);
	secure_join(x);
	fb_wk_on_link(&x->w, true, 1, x->now);
	assert_true(x->w.welcomed);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fb_wk_on_link(&x->w, true, 2, x->now); /* this one is */
	assert_false(x->w.welcomed);
	fix_free(x);
}

static void
test_bytes_moving_keep_links_alive(void **state)
{
	fix *x = fix_new(false);

	plain_join(x);
	x->has_traffic = true;
	run_to_training(x, 1, 0);
	/* no whole message from the coordinator for a minute, but bytes
	 * (a model chunk on a slow link, say) keep coming in: still here */
	for (int i = 0; i < 600; i++) {
		x->now += 100;
		x->traffic.in += 3000;
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	}
	assert_true(x->w.welcomed);
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	/* the bytes stop: gone after the liveness timeout (3 s) */
	for (int i = 0; i < 30; i++) {
		x->now += 100;
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	}
	assert_true(x->w.welcomed);
	x->now += 100;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	assert_false(x->w.welcomed);
	fix_free(x);
	/* the queue full for a minute, but what we sent is acknowledged bit
	 * by bit (an upload on a slow link): no rejoin; once nothing is
	 * acknowledged for transport.send_timeout (30 s), rejoin */
	x = fix_new(false);
	plain_join(x);
	x->has_traffic = true;
	x->room = 0;
	for (int i = 0; i < 60; i++) {
		fb_msg hb = simple_msg(FB_MSG_HEARTBEAT, 0);
		x->now += 1000;
		x->traffic.acked += 30000;
		assert_int_equal(deliver(x, &hb, NULL, 0), FB_OK);
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	}
	assert_true(x->w.welcomed);
	for (int i = 0; i < 31; i++) {
		fb_msg hb = simple_msg(FB_MSG_HEARTBEAT, 0);
		x->now += 1000;
		assert_int_equal(deliver(x, &hb, NULL, 0), FB_OK);
		assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	}
	assert_false(x->w.welcomed);
	fix_free(x);
}

static void
test_redirect_and_lane_giveup(void **state)
{
	fix *x = fix_new(false);
	fb_msg r = {.type = FB_MSG_REDIRECT}, m = welcome_msg();

	fb_wk_start(&x->w, x->now);
	r.u.redirect.lane = 1;
	r.u.redirect.port = 5556;
	assert_int_equal(deliver(x, &r, NULL, 0), FB_OK);
	assert_int_equal(x->relinks, 1);
	assert_string_equal(x->relinked, "tcp://127.0.0.1:5556");
	assert_int_equal(last(x)->msg.type, FB_MSG_HELLO);
	assert_int_equal(last(x)->msg.u.hello.lane, 1);
	/* a second redirect (we are on a lane already) is dropped */
	assert_int_equal(deliver(x, &r, NULL, 0), FB_OK);
	assert_int_equal(x->relinks, 1);
	/* no answer on the lane for 15 s: back to listen's port, to stay */
	x->now += 15001;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	assert_int_equal(x->relinks, 2);
	assert_string_equal(x->relinked, "tcp://127.0.0.1:5555");
	assert_int_equal(last(x)->msg.u.hello.lane, FB_WK_LANE_STAY);
	assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	/* after the welcome a redirect is dropped */
	x->w.lane = 0;
	assert_int_equal(deliver(x, &r, NULL, 0), FB_OK);
	assert_int_equal(x->relinks, 2);
	fix_free(x);
}

static void
test_malformed_inputs(void **state)
{
	fix *x = fix_new(false);
	fb_msg m = welcome_msg(), rs, c = {.type = FB_MSG_MODEL_CHUNK};
	fb_msg odd = {.type = FB_MSG_UPDATE_CHUNK};
	fb_msg sa = {.type = FB_MSG_SECAGG};
	size_t at;

	fb_wk_start(&x->w, x->now);
	m.u.welcome.chunk_bytes = 0;
	assert_int_equal(deliver(x, &m, NULL, 0), FB_EPROTO);
	m = welcome_msg();
	m.u.welcome.liveness_ms = m.u.welcome.heartbeat_ms;
	assert_int_equal(deliver(x, &m, NULL, 0), FB_EPROTO);
	m = welcome_msg();
	m.u.welcome.protocol_version = FB_PROTOCOL_VERSION + 1;
	assert_int_equal(deliver(x, &m, NULL, 0), FB_ENOTSUP);
	m = welcome_msg();
	m.u.welcome.param_count = P + 1;
	assert_int_equal(deliver(x, &m, NULL, 0), FB_EPROTO);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	assert_null(x->w.model);
	m = welcome_msg();
	assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
	/* round starts that do not fit the welcome: ignored, nothing sent */
	at = x->nlog;
	rs = round_msg(1, 0);
	rs.u.round_start.param_count = P - 1;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	rs = round_msg(1, NCHUNK);
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	rs = round_msg(1, 0);
	rs.u.round_start.batch_size = 0;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->nlog, at);
	/* a well-formed one this worker cannot run: the coordinator is told
	 * why, in a RoundFailed */
	rs = round_msg(1, 0);
	rs.u.round_start.synthetic = true; /* we have data */
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->nlog, at + 1);
	assert_failed(x, 1, "synthetic");
	at = x->nlog;
	/* odd messages: no change */
	fb_wk_on_bad_frame(&x->w, "bad prefix", x->now);
	assert_int_equal(deliver(x, &odd, NULL, 0), FB_OK);
	assert_int_equal(deliver(x, &sa, "x", 1), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	/* a model chunk of the wrong size, or out of order: round left */
	rs = round_msg(1, 0);
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	c.u.model_chunk.round = 1;
	c.u.model_chunk.chunk = 0;
	assert_int_equal(deliver(x, &c, x->global, CHUNK - 4), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	rs = round_msg(2, 0);
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	c.u.model_chunk.round = 2;
	c.u.model_chunk.chunk = 1;
	assert_int_equal(deliver(x, &c, x->global, CHUNK), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->starts, 0);
	/* a sealed frame when security is off: dropped */
	{
		fb_frame f;
		memset(&f, 0, sizeof(f));
		f.sealed = true;
		f.sealed_data = x->head;
		f.sealed_len = 60;
		assert_int_equal(fb_wk_on_frame(&x->w, &f, x->now), FB_OK);
	}
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fix_free(x);
}

static void
test_shutdown_ends_run(void **state)
{
	fix *x = fix_new(false);
	fb_msg s = simple_msg(FB_MSG_SHUTDOWN, 0), rs = round_msg(1, 0);
	size_t at;

	plain_join(x);
	run_to_training(x, 1, 0);
	assert_int_equal(deliver(x, &s, NULL, 0), FB_ECLOSED);
	assert_int_equal(x->w.phase, FB_WK_DONE);
	assert_int_equal(x->stops, 1);
	at = x->nlog;
	assert_int_equal(deliver(x, &rs, NULL, 0), FB_OK);
	x->now += 60000;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	assert_int_equal(x->nlog, at);
	fix_free(x);
}

static void
test_plain_refusal_is_final(void **state)
{
	fix *x = fix_new(false);
	fb_msg r = simple_msg(FB_MSG_REJECT, 0);

	plain_join(x);
	/* without security nothing is authenticated: a refusal is taken */
	assert_int_equal(deliver(x, &r, NULL, 0), FB_EAUTH);
	fix_free(x);
}

/* ---- secure sessions ---------------------------------------------------- */

static void
test_secure_join_and_round(void **state)
{
	fix *x = fix_new(true);
	fb_stream_ctx ctx;
	fb_stream_pull *pull = NULL;
	fb_reject why = FB_REJECT_NONE;
	uint8_t plain[CHUNK];
	size_t at, mlen;
	sent *b;
	int final;

	secure_join(x);
	x->cfg.secure_aggregation = 1; /* this round without SecAgg */
	run_to_training(x, 4, 1);
	at = x->nlog;
	train_done(x, FB_OK);
	/* the update goes in steps of two messages */
	while (x->w.phase == FB_WK_UPLOADING) {
		x->room = 2;
		writable(x);
	}
	assert_int_equal(x->nlog - at, 1 + NCHUNK + 1);
	b = &x->log[at];
	assert_int_equal(b->msg.type, FB_MSG_UPDATE_BEGIN);
	assert_int_equal(last(x)->msg.type, FB_MSG_UPDATE_END);
	for (size_t i = at; i < x->nlog; i++) {
		assert_true(x->log[i].sealed);
	}
	/* what went up is one valid stream, signed by the worker */
	memset(&ctx, 0, sizeof(ctx));
	ctx.run = x->run;
	ctx.round = 4;
	ctx.sender = fb_session_worker_id(x->cs);
	assert_int_equal(
	    fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_INDEXED_TAGS,
	        b->msg.u.update_begin.stream_key.b,
	        b->msg.u.update_begin.stream_header.b,
	        b->msg.u.update_begin.stream_header.len, CHUNK, &pull, &why),
	    FB_OK);
	for (uint32_t pos = 0; pos < NCHUNK; pos++) {
		sent *c = &x->log[at + 1 + pos];
		uint32_t k = (1 + pos) % NCHUNK;
		assert_int_equal(c->msg.u.update_chunk.chunk, k);
		assert_true(c->lent); /* from its encrypted slot, no copy */
		assert_int_equal(fb_stream_pull_chunk(pull, c->payload, c->len,
		                     plain, sizeof(plain), &mlen, &final, &why),
		    FB_OK);
		assert_int_equal(mlen, k + 1 == NCHUNK ? LAST_LEN : CHUNK);
		assert_int_equal(final != 0, pos + 1 == NCHUNK);
	}
	assert_int_equal(
	    fb_stream_pull_final(pull, &x->wpk,
	        last(x)->msg.u.update_end.stream_trailer.b,
	        last(x)->msg.u.update_end.stream_trailer.len, NULL, &why),
	    FB_OK);
	fb_stream_pull_free(pull);
	fix_free(x);
}

static void
test_secure_model_tampered(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs = round_msg(2, 0);

	secure_join(x);
	x->cfg.secure_aggregation = 1;
	model_stream(x, &rs);
	x->mchunk[1][5] ^= 1;
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	serve_model(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->starts, 0);
	/* and a round this worker must skip: it requires secure aggregation */
	x->cfg.secure_aggregation = 0;
	rs = round_msg(3, 0);
	model_stream(x, &rs);
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fix_free(x);
}

/*
 * With a pool, the model's chunks are checked and decrypted in batches of
 * one per core: the model arrives whole whatever the batch size, and a
 * chunk tampered with anywhere (first batch, last one, the short last
 * chunk) still stops the round before training, with RoundFailed sent.
 */
static void
test_secure_model_on_pool(void **state)
{
	for (uint32_t threads = 1; threads <= 4; threads++) {
		for (int bad = -1; bad < NCHUNK; bad++) {
			fb_pool *pool = NULL;
			fix *x = fix_new(true);
			fb_msg rs = round_msg(2, 0);
			size_t at;

			assert_int_equal(fb_pool_alloc(threads, &pool), FB_OK);
			x->w.pool = pool;
			secure_join(x);
			x->cfg.secure_aggregation = 1;
			if (bad < 0) {
				run_to_training(x, 3, 1);
				assert_int_equal(x->w.dl_cap,
				    threads + 1 > FB_WK_BATCH_MAX ? FB_WK_BATCH_MAX
				                                  : threads + 1);
				fix_free(x);
				fb_pool_free(pool);
				continue;
			}
			model_stream(x, &rs);
			x->mchunk[bad][FB_STREAM_CHUNK_OVERHEAD] ^= 4;
			x->served = x->nlog;
			at = x->nlog;
			assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
			serve_model(x);
			assert_int_equal(x->w.phase, FB_WK_IDLE);
			assert_int_equal(x->starts, 0);
			assert_int_equal(count_of(x, FB_MSG_ROUND_FAILED, at), 1);
			fix_free(x);
			fb_pool_free(pool);
		}
	}
}

static void
test_refusal_before_authentication(void **state)
{
	fb_msg r = simple_msg(FB_MSG_REJECT, 0);
	fix *x = fix_new(true);

	/* no session yet: a refusal in clear is how a coordinator answers an
	 * unknown key, and it ends the run */
	fb_wk_start(&x->w, x->now);
	assert_int_equal(deliver(x, &r, NULL, 0), FB_EAUTH);
	fix_free(x);

	/* a session, no welcome yet (a name this key is not for) */
	x = fix_new(true);
	{
		fb_allowlist al = {&x->wpk, 1};
		fb_hs_accept_cfg hc = accept_cfg(x, &al);
		fb_msg rep = {.type = FB_MSG_HANDSHAKE};
		fb_reject why;
		fb_wk_start(&x->w, x->now);
		assert_int_equal(
		    fb_handshake_accept(&hc,
		        cookie_to_hello(x)->msg.u.handshake.data.b,
		        FB_HS_HELLO_LEN, rep.u.handshake.data.b, &x->cs, &why),
		    FB_OK);
		rep.u.handshake.data.len = FB_HS_REPLY_LEN;
		assert_int_equal(deliver(x, &rep, NULL, 0), FB_OK);
	}
	assert_non_null(x->w.sess);
	assert_int_equal(deliver(x, &r, NULL, 0), FB_EAUTH);
	fix_free(x);
}

static void
test_refusal_in_clear_after_admission(void **state)
{
	fix *x = fix_new(true);
	fb_msg r = simple_msg(FB_MSG_REJECT, 0);
	fb_msg hb = simple_msg(FB_MSG_HEARTBEAT, 0);
	fb_msg cancel = simple_msg(FB_MSG_ROUND_CANCEL, 1);
	int64_t rx;

	secure_join(x);
	x->cfg.secure_aggregation = 1;
	run_to_training(x, 1, 0);
	rx = x->w.last_rx_ms;
	x->now += 100;
	for (int i = 0; i < 3; i++) {
		assert_int_equal(deliver(x, &r, NULL, 0), FB_OK);
	}
	/* in clear, a heartbeat does not keep the worker here, nor does a
	 * cancel end its round */
	assert_int_equal(deliver(x, &hb, NULL, 0), FB_OK);
	assert_int_equal(deliver(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	assert_int_equal(x->w.last_rx_ms, rx);
	assert_int_equal(x->stops, 0);
	/* noted once; the repeats within 5 s are counted, not logged */
	assert_true(x->w.note_plain.written);
	assert_int_equal(x->w.note_plain.suppressed, 4);
	/* the sealed cancel is the coordinator's: it counts */
	assert_int_equal(deliver_sealed(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->stops, 1);
	/* and so would a sealed refusal */
	assert_int_equal(deliver_sealed(x, &r, NULL, 0), FB_EAUTH);
	fix_free(x);
}

static void
test_rehandshake_takes_only_its_reply(void **state)
{
	fix *x = fix_new(true);
	fb_msg r = simple_msg(FB_MSG_REJECT, 0);
	fb_msg redirect = {.type = FB_MSG_REDIRECT};
	fb_allowlist al;
	fb_hs_accept_cfg hc;
	fb_msg rep = {.type = FB_MSG_HANDSHAKE}, m = welcome_msg();
	fb_reject why;

	secure_join(x);
	/* the coordinator goes silent: the worker shakes hands again */
	x->now += 3001;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	assert_null(x->w.sess);
	assert_int_equal(last(x)->msg.type, FB_MSG_HANDSHAKE);
	/* a refusal in clear now is anyone's: ignored */
	assert_int_equal(deliver(x, &r, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_JOINING);
	/* the reply to this handshake is taken, then the sealed welcome */
	al = (fb_allowlist){&x->wpk, 1};
	hc = accept_cfg(x, &al);
	fb_session_free(x->cs);
	x->cs = NULL;
	assert_int_equal(
	    fb_handshake_accept(&hc, cookie_to_hello(x)->msg.u.handshake.data.b,
	        FB_HS_HELLO_LEN, rep.u.handshake.data.b, &x->cs, &why),
	    FB_OK);
	rep.u.handshake.data.len = FB_HS_REPLY_LEN;
	assert_int_equal(deliver(x, &rep, NULL, 0), FB_OK);
	assert_non_null(x->w.sess);
	assert_true(last(x)->sealed);
	/* once it is established, a handshake reply or redirect in clear is
	 * not taken either */
	assert_int_equal(deliver(x, &rep, NULL, 0), FB_OK);
	redirect.u.redirect.lane = 1;
	redirect.u.redirect.port = 5556;
	assert_int_equal(deliver(x, &redirect, NULL, 0), FB_OK);
	assert_int_equal(x->relinks, 1); /* the rejoin's own new link only */
	m.u.welcome.run_id = 43;
	assert_int_equal(deliver_sealed(x, &m, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fix_free(x);
}

/*
 * The handshake's cookie: a secure worker first asks for one (an empty
 * handshake), signs it into its hello, and takes only a cookie it asked
 * for; a retry asks again, and a hello whose cookie another coordinator
 * process made (one recorded before a restart) is refused by the
 * coordinator's side, which answers nothing.
 */
static void
test_handshake_cookie(void **state)
{
	fix *x = fix_new(true);
	fb_allowlist al = {&x->wpk, 1};
	fb_hs_accept_cfg hc;
	fb_msg c = {.type = FB_MSG_HANDSHAKE};
	uint8_t reply[FB_HS_REPLY_LEN], old[FB_HS_HELLO_LEN];
	fb_session *s = NULL;
	fb_reject why;
	size_t at;

	fb_wk_start(&x->w, x->now);
	assert_true(x->w.cookie_wait);
	memcpy(old, cookie_to_hello(x)->msg.u.handshake.data.b, sizeof(old));
	assert_false(x->w.cookie_wait);
	/* a second cookie, unasked: no second hello */
	at = x->nlog;
	fb_hs_cookie_make(x->ckey, x->now, c.u.handshake.data.b);
	c.u.handshake.data.len = FB_HS_COOKIE_LEN;
	assert_int_equal(deliver(x, &c, NULL, 0), FB_OK);
	assert_int_equal(x->nlog, at);
	/* no answer by the next join retry: the worker asks for a new
	 * cookie */
	x->now = x->w.next_join_ms;
	assert_int_equal(fb_wk_tick(&x->w, x->now), FB_OK);
	assert_int_equal(last(x)->msg.u.handshake.data.len, 0);
	assert_true(x->w.cookie_wait);
	/* the coordinator restarted meanwhile (a new cookie key): the hello
	 * recorded before is refused, silently */
	x->ckey[0] ^= 1;
	hc = accept_cfg(x, &al);
	assert_int_equal(
	    fb_handshake_accept(&hc, old, sizeof(old), reply, &s, &why),
	    FB_ESTALE);
	assert_int_equal(why, FB_REJECT_REPLAY);
	assert_null(s);
	/* and the worker's new hello, with the new process's cookie, joins */
	assert_int_equal(
	    fb_handshake_accept(&hc, cookie_to_hello(x)->msg.u.handshake.data.b,
	        FB_HS_HELLO_LEN, reply, &s, &why),
	    FB_OK);
	fb_session_free(s);
	fix_free(x);
}

static void
test_sealed_garbage_dropped(void **state)
{
	fix *x = fix_new(true);
	fb_msg hb = simple_msg(FB_MSG_HEARTBEAT, 0);
	fb_frame f;
	size_t sl = 0;
	uint8_t env[64];
	size_t env_len = 0;

	secure_join(x);
	assert_int_equal(
	    fb_msg_pack_envelope(&hb, env, sizeof(env), &env_len), FB_OK);
	assert_int_equal(fb_msg_seal(x->cs, FB_MSG_HEARTBEAT, 0, env, env_len,
	                     x->head + 4, sizeof(x->head) - 4, &sl),
	    FB_OK);
	x->head[4 + sl - 1] ^= 1; /* the MAC */
	memset(&f, 0, sizeof(f));
	f.sealed = true;
	f.sealed_data = x->head + 4;
	f.sealed_len = sl;
	x->now += 2000;
	assert_int_equal(fb_wk_on_frame(&x->w, &f, x->now), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_true(x->w.last_rx_ms < x->now);
	assert_true(x->w.note_sealed.written);
	fix_free(x);
}

/* ---- secure aggregation ------------------------------------------------- */

/* A SecAgg round start: slot 0 of n on the complete graph, threshold t
 * (slot 1 is x->peer). */
static fb_msg
sa_round_msg_n(fix *x, uint32_t round, uint32_t n, uint32_t t)
{
	fb_msg rs = round_msg(round, 0);

	rs.u.round_start.secagg = true;
	rs.u.round_start.sa_slot = 0;
	rs.u.round_start.sa_n = n;
	rs.u.round_start.sa_degree = n - 1;
	rs.u.round_start.sa_threshold = t;
	rs.u.round_start.sa_graph_seed.len = 32;
	memset(rs.u.round_start.sa_graph_seed.b, 0x77, 32);
	rs.u.round_start.sa_ring_bits = 32;
	rs.u.round_start.sa_clip = 4.0;
	rs.u.round_start.sa_max_samples = 1000;
	rs.u.round_start.sa_a_bound = 100.0;
	rs.u.round_start.sa_max_staleness = x->max_stale;
	memset(&x->sap, 0, sizeof(x->sap));
	x->sap.run = x->run;
	x->sap.round = round;
	x->sap.n = n;
	x->sap.degree = n - 1;
	x->sap.threshold = t;
	memset(x->sap.graph_seed, 0x77, 32);
	fb_secagg_bind_terms(&x->sap, &(fb_secagg_terms){.ring_bits = 32,
	    .clip = 4.0,
	    .max_samples = x->peer_max_samples ? x->peer_max_samples : 1000,
	    .a_bound = 100.0, .max_staleness = x->max_stale});
	fb_secagg_worker_free(x->peer);
	x->peer = NULL;
	assert_int_equal(fb_secagg_worker_alloc(&x->sap, 1, &x->peer), FB_OK);
	model_stream(x, &rs);
	return rs;
}

/* Slot 0 of 2 (the other is x->peer). */
static fb_msg
sa_round_msg(fix *x, uint32_t round)
{
	return sa_round_msg_n(x, round, 2, 2);
}

static fb_msg
sa_msg(uint32_t round, fb_secagg_phase phase, uint32_t count)
{
	fb_msg m = {.type = FB_MSG_SECAGG};

	m.u.secagg.round = round;
	m.u.secagg.phase = phase;
	m.u.secagg.count = count;
	return m;
}

/* The worker's secure-aggregation message of `round` and `phase`. */
static sent *
find_sa(fix *x, uint32_t round, fb_secagg_phase phase)
{
	for (size_t i = 0; i < x->nlog; i++) {
		sent *s = &x->log[i];
		if (s->msg.type == FB_MSG_SECAGG &&
		    s->msg.u.secagg.round == round &&
		    s->msg.u.secagg.phase == phase) {
			return s;
		}
	}
	return NULL;
}

/* The worker's advert goes to the peer; the peer's comes back (PEERS),
 * both flagged `ahead` for a round set up ahead. */
static void
sa_exchange_adverts_as(fix *x, uint32_t round, bool ahead)
{
	uint8_t entry[FB_SECAGG_PEER_ENTRY_LEN];
	sent *adv = find_sa(x, round, FB_SA_ADVERT);
	fb_msg pm = sa_msg(round, FB_SA_PEERS, 1);

	pm.u.secagg.ahead = ahead;
	assert_non_null(adv);
	assert_true(adv->sealed);
	if (ahead) {
		assert_true(adv->msg.u.secagg.ahead);
	}
	assert_int_equal(adv->len, FB_SECAGG_ADV_LEN);
	assert_int_equal(fb_secagg_worker_add_advert(
	                     x->peer, &x->wpk, adv->payload, adv->len),
	    FB_OK);
	memset(entry, 0, sizeof(entry));
	entry[0] = 1; /* slot 1 */
	memcpy(entry + 4, x->ppk.b, FB_PUBKEY_LEN);
	assert_int_equal(fb_secagg_worker_advertise(
	                     x->peer, x->pid, entry + 4 + FB_PUBKEY_LEN),
	    FB_OK);
	assert_int_equal(deliver_sealed(x, &pm, entry, sizeof(entry)), FB_OK);
}

static void
sa_exchange_adverts(fix *x, uint32_t round)
{
	sa_exchange_adverts_as(x, round, false);
}

/* The worker's shares go to the peer; the peer's for it come back (both
 * flagged `ahead` for a round set up ahead). */
static void
sa_exchange_shares_as(fix *x, uint32_t round, bool ahead)
{
	uint8_t out[4 * FB_SECAGG_SHARE_MSG_LEN];
	size_t out_len = 0;
	sent *sh = find_sa(x, round, FB_SA_SHARES);
	fb_msg rm = sa_msg(round, FB_SA_RELAY, 1);

	rm.u.secagg.ahead = ahead;
	assert_non_null(sh);
	assert_true(sh->sealed);
	if (ahead) {
		assert_true(sh->msg.u.secagg.ahead);
	}
	assert_int_equal(sh->msg.u.secagg.count, 1);
	assert_int_equal(
	    fb_secagg_worker_make_shares(x->peer, out, sizeof(out), &out_len),
	    FB_OK);
	assert_int_equal(out_len, FB_SECAGG_SHARE_MSG_LEN);
	assert_int_equal(
	    fb_secagg_worker_add_share(x->peer, sh->payload, sh->len), FB_OK);
	assert_int_equal(deliver_sealed(x, &rm, out, out_len), FB_OK);
}

static void
sa_exchange_shares(fix *x, uint32_t round)
{
	sa_exchange_shares_as(x, round, false);
}

/* Secure round `round` up to the upload: RoundStart, adverts, the model,
 * training, shares; the worker is then uploading. */
static void
sa_round_to_upload(fix *x, uint32_t round)
{
	fb_msg rs = sa_round_msg(x, round);

	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	sa_exchange_adverts(x, round);
	serve_model(x);
	train_done(x, FB_OK);
	sa_exchange_shares(x, round);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
}

static void
test_secagg_round(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs, um = sa_msg(5, FB_SA_INCLUDED, 2);
	fb_msg cm = sa_msg(5, FB_SA_CONFIRMS, 1);
	uint8_t included[2] = {1, 1};
	uint8_t pconf[FB_SECAGG_CONFIRM_LEN];
	size_t at;
	sent *b;

	x->ev.examples = 250; /* an evaluation: only in the masked input */
	x->ev.loss = 0.75;
	x->ev.accuracy = 0.812;
	x->ev.metric_count = 1;
	snprintf(x->ev.name[0], sizeof(x->ev.name[0]), "f1");
	secure_join(x);
	rs = sa_round_msg(x, 5);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_ADVERTISED);
	sa_exchange_adverts(x, 5);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_SHARED);
	serve_model(x);
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	/* trained before the shares are in: the update waits for the masks */
	train_done(x, FB_OK);
	assert_int_equal(x->w.phase, FB_WK_WAITING);
	assert_false(fb_wk_wants_out(&x->w));
	sa_exchange_shares(x, 5);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_MASKING);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	at = x->nlog;
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	/* Begin, 4 masked chunks and the extra one, End; no sample count,
	 * step count or loss in clear */
	assert_int_equal(x->nlog - at, 1 + NCHUNK + 1 + 1);
	b = &x->log[at];
	assert_int_equal(b->msg.u.update_begin.chunk_count, NCHUNK + 1);
	assert_int_equal(b->msg.u.update_begin.num_samples, 0);
	assert_int_equal(b->msg.u.update_begin.steps, 0);
	assert_true(b->msg.u.update_begin.train_loss == 0.0);
	assert_true(b->msg.u.update_begin.steps_per_second == 0.0);
	assert_true(b->msg.u.update_begin.train_seconds == 0.0);
	assert_int_equal(b->msg.u.update_begin.eval_examples, 0);
	assert_true(b->msg.u.update_begin.eval_loss == 0.0);
	assert_true(b->msg.u.update_begin.eval_accuracy == 0.0);
	assert_int_equal(b->msg.u.update_begin.eval_metric_count, 0);
	assert_int_equal(
	    x->log[at + 1 + NCHUNK].msg.u.update_chunk.chunk, NCHUNK);
	assert_int_equal(last(x)->msg.type, FB_MSG_UPDATE_END);
	/* the included set: our signature of it goes back, and it checks
	 * out at the peer */
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &um, included, 2), FB_OK);
	assert_int_equal(x->nlog - at, 1);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_CONFIRM);
	assert_int_equal(last(x)->len, FB_SECAGG_CONFIRM_LEN);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_CONFIRMED);
	assert_int_equal(fb_secagg_worker_mask_begin(x->peer), FB_OK);
	assert_int_equal(
	    fb_secagg_worker_confirm(x->peer, x->pid, included, 2, pconf),
	    FB_OK);
	assert_int_equal(fb_secagg_worker_add_confirm(
	                     x->peer, last(x)->payload, last(x)->len),
	    FB_OK);
	/* the peer's confirmation: our reveal goes back */
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &cm, pconf, sizeof(pconf)), FB_OK);
	assert_int_equal(x->nlog - at, 1);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_REVEAL);
	assert_true(last(x)->len > FB_SECAGG_REVEAL_HEADER_LEN);
	fix_free(x);
}


/* Reads n words of `path` from word `at`. */
static void
read_words(const char *path, uint64_t at, uint32_t *out, size_t n)
{
	FILE *f = fopen(path, "rb");

	assert_non_null(f);
	assert_int_equal(fseeko(f, (off_t)(at * 4), SEEK_SET), 0);
	assert_int_equal(fread(out, 4, n, f), n);
	fclose(f);
}

/*
 * Secure async: the coordinator's first credit says how stale the update
 * is (3 steps); the worker weighs its masked input n / max_samples /
 * sqrt(1 + 3), the update's coordinates and the weight coordinate alike
 * (read from debug.dump_updates' encoded input, before the masks). A
 * later credit's staleness changes nothing: the first chunk went under
 * the first one.
 */
static void
test_secagg_credit_staleness_weighs_the_input(void **state)
{
	fix *x = fix_new(true);
	char dir[] = "/tmp/fbwk.XXXXXX", path[600];
	fb_msg cr = {.type = FB_MSG_UPDATE_CREDIT};
	uint32_t enc[P + FB_SECAGG_EXTRA];
	double want;
	FILE *f;
	char json[512];

	assert_non_null(mkdtemp(dir));
	x->cfg.dump_updates = dir;
	x->max_stale = 8;
	secure_join(x);
	sa_round_to_upload(x, 5);
	/* the begin goes, and nothing else without a credit */
	x->room = 1;
	fb_wk_on_writable(&x->w, x->now);
	assert_true(x->w.up.begun);
	assert_int_equal(x->w.up.pos, 0);
	want = (double)fb_wk_samples(&x->w) / (double)x->w.sa_max_samples / 2.0;
	cr.u.update_credit.round = 5;
	cr.u.update_credit.chunks = 1;
	cr.u.update_credit.staleness = 3;
	x->room = ROOM_ANY;
	assert_int_equal(send_msg(x, &cr, NULL, 0), FB_OK);
	assert_int_equal(x->w.up.pos, 1);
	assert_true(fabs(x->w.sa_weight - want) < 1e-12);
	x->credit_stale = 7; /* the rest of the credits: ignored */
	while (x->w.phase == FB_WK_UPLOADING) {
		writable(x);
	}
	assert_true(fabs(x->w.sa_weight - want) < 1e-12);
	snprintf(path, sizeof(path), "%s/round-5.encoded.u32", dir);
	read_words(path, 0, enc, P + FB_SECAGG_EXTRA);
	assert_true(fabs(fb_decode_value(&x->w.enc.w, enc[P]) - want) < 1e-6);
	for (uint32_t j = 0; j < P; j += 5) {
		/* update = global - local = 0.01 (j + 1) (train_done) */
		double u = 0.01 * (j + 1);
		assert_true(fabs(fb_decode_value(&x->w.enc.x, enc[j]) - want * u) <
		            1e-4 * (1 + u));
	}
	snprintf(path, sizeof(path), "%s/round-5.json", dir);
	f = fopen(path, "r");
	assert_non_null(f);
	assert_non_null(fgets(json, sizeof(json), f));
	fclose(f);
	assert_non_null(strstr(json, "\"staleness\": 3,"));
	fix_free(x);
	snprintf(path, sizeof(path), "rm -rf '%s'", dir);
	assert_int_equal(system(path), 0);
}

/*
 * A credit that counts the update more steps stale than the round's
 * max_staleness (which the neighbours were told too) would weigh the
 * input below the bound: the worker sends no chunk and leaves the round,
 * saying why.
 */
static void
test_secagg_credit_past_max_staleness(void **state)
{
	fix *x = fix_new(true);
	fb_msg cr = {.type = FB_MSG_UPDATE_CREDIT};

	x->max_stale = 8;
	secure_join(x);
	sa_round_to_upload(x, 5);
	x->room = 1;
	fb_wk_on_writable(&x->w, x->now);
	assert_true(x->w.up.begun);
	cr.u.update_credit.round = 5;
	cr.u.update_credit.chunks = 8;
	cr.u.update_credit.staleness = 9;
	x->room = ROOM_ANY;
	assert_int_equal(send_msg(x, &cr, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, 0), 0);
	assert_failed(x, 5, "past the round's max_staleness (8)");
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fix_free(x);
}

/*
 * A neighbour told another max_samples (the coordinator would weigh it
 * down, to read this worker's input nearly alone): neither opens the
 * other's shares, and this worker, left below the threshold (2), leaves
 * the round before any masked input goes.
 */
static void
test_secagg_peer_told_other_terms(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs;
	uint8_t out[4 * FB_SECAGG_SHARE_MSG_LEN];
	size_t out_len = 0;
	sent *sh;
	fb_msg rm = sa_msg(5, FB_SA_RELAY, 1);

	x->peer_max_samples = 1000000;
	secure_join(x);
	rs = sa_round_msg(x, 5);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	sa_exchange_adverts(x, 5);
	serve_model(x);
	train_done(x, FB_OK);
	assert_int_equal(x->w.phase, FB_WK_WAITING);
	sh = find_sa(x, 5, FB_SA_SHARES);
	assert_non_null(sh);
	assert_int_equal(fb_secagg_worker_add_share(x->peer, sh->payload,
	                     sh->len),
	    FB_EAUTH);
	assert_int_equal(
	    fb_secagg_worker_make_shares(x->peer, out, sizeof(out), &out_len),
	    FB_OK);
	assert_int_equal(deliver_sealed(x, &rm, out, out_len), FB_OK);
	assert_failed(x, 5, "too few neighbours shared");
	assert_int_equal(count_of(x, FB_MSG_UPDATE_BEGIN, 0), 0);
	assert_int_equal(count_of(x, FB_MSG_UPDATE_CHUNK, 0), 0);
	fix_free(x);
}

/*
 * Secure async: a task's round is its cohort's (5), its model the step's
 * (model_round 1). Once its masked input is up, the next task (cohort 6)
 * begins, and the instance of cohort 5 is kept: while the worker trains
 * for cohort 6, it signs cohort 5's included set and reveals its shares
 * for it, sealed for round 5; its cohort 6 instance is untouched, and
 * cohort 5's is wiped once revealed.
 */
static void
test_secagg_async_keeps_the_last_cohort(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs, um = sa_msg(5, FB_SA_INCLUDED, 2);
	fb_msg cm = sa_msg(5, FB_SA_CONFIRMS, 1);
	uint8_t included[2] = {1, 1};
	uint8_t pconf[FB_SECAGG_CONFIRM_LEN];
	fb_secagg_worker *peer5;
	size_t at;
	bool held = false;

	secure_join(x);
	rs = sa_round_msg(x, 5);
	rs.u.round_start.model_round = 1;
	model_stream(x, &rs);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	sa_exchange_adverts(x, 5);
	serve_model(x); /* decrypts only under model_round */
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	train_done(x, FB_OK);
	sa_exchange_shares(x, 5);
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(last(x)->msg.type, FB_MSG_UPDATE_END);
	peer5 = x->peer; /* cohort 5's other member */
	x->peer = NULL;
	/* the next task, in cohort 6 */
	rs = sa_round_msg(x, 6);
	rs.u.round_start.model_round = 1;
	model_stream(x, &rs);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.round, 6);
	assert_int_equal(x->w.sa_round, 6);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_ADVERTISED);
	for (uint32_t i = 0; i < FB_WK_SA_HELD; i++) {
		held |= x->w.sa_held[i].sa != NULL && x->w.sa_held[i].round == 5;
	}
	assert_true(held);
	sa_exchange_adverts(x, 6);
	serve_model(x);
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	/* cohort 5's unmasking, while cohort 6's task trains */
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &um, included, 2), FB_OK);
	assert_int_equal(x->nlog - at, 1);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_CONFIRM);
	assert_int_equal(last(x)->msg.u.secagg.round, 5);
	assert_true(last(x)->sealed);
	assert_int_equal(fb_secagg_worker_mask_begin(peer5), FB_OK);
	assert_int_equal(
	    fb_secagg_worker_confirm(peer5, x->pid, included, 2, pconf), FB_OK);
	assert_int_equal(
	    fb_secagg_worker_add_confirm(peer5, last(x)->payload, last(x)->len),
	    FB_OK);
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &cm, pconf, sizeof(pconf)), FB_OK);
	assert_int_equal(x->nlog - at, 1);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_REVEAL);
	assert_int_equal(last(x)->msg.u.secagg.round, 5);
	/* cohort 6 goes on as it was; cohort 5's secrets are gone */
	assert_int_equal(x->w.phase, FB_WK_TRAINING);
	assert_int_equal(x->w.sa_round, 6);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_SHARED);
	for (uint32_t i = 0; i < FB_WK_SA_HELD; i++) {
		assert_true(x->w.sa_held[i].sa == NULL ||
		    x->w.sa_held[i].round != 5);
	}
	/* a second reveal request for cohort 5 finds nothing */
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &cm, pconf, sizeof(pconf)), FB_OK);
	assert_int_equal(x->nlog, at);
	fb_secagg_worker_free(peer5);
	fix_free(x);
}

/*
 * With a pool the masked inputs are made in batches, the next one on the
 * masker thread while the loop seals the current one: whatever the pool's
 * size, every chunk goes up in order, and each one decrypts to exactly the
 * masked input made for it one at a time.
 */
static void
test_secagg_masks_made_ahead(void **state)
{
	for (uint32_t threads = 0; threads <= 3; threads++) {
		fb_pool *pool = NULL;
		fix *x = fix_new(true);
		fb_stream_ctx ctx;
		fb_stream_pull *pull = NULL;
		fb_reject why = FB_REJECT_NONE;
		uint32_t plain[CHUNK / 4], want[CHUNK / 4];
		size_t at, mlen;
		int final;
		sent *b;

		if (threads > 0) {
			assert_int_equal(fb_pool_alloc(threads, &pool), FB_OK);
		}
		x->w.pool = pool;
		secure_join(x);
		sa_round_to_upload(x, 5);
		at = x->nlog;
		while (x->w.phase == FB_WK_UPLOADING) {
			x->room = 1; /* one message at a time: batches overlap */
			writable(x);
		}
		assert_int_equal(x->nlog - at, 1 + NCHUNK + 1 + 1);
		b = &x->log[at];
		memset(&ctx, 0, sizeof(ctx));
		ctx.run = x->run;
		ctx.round = 5;
		ctx.sender = fb_session_worker_id(x->cs);
		assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_INDEXED_TAGS,
		                     b->msg.u.update_begin.stream_key.b,
		                     b->msg.u.update_begin.stream_header.b,
		                     b->msg.u.update_begin.stream_header.len,
		                     CHUNK, &pull, &why),
		    FB_OK);
		for (uint32_t pos = 0; pos < NCHUNK; pos++) {
			sent *c = &x->log[at + 1 + pos];
			uint32_t k = c->msg.u.update_chunk.chunk;
			uint64_t off = (uint64_t)k * (CHUNK / 4);
			uint64_t n = k + 1 == NCHUNK ? LAST_LEN / 4 : CHUNK / 4;
			uint64_t clipped = 0;
			assert_int_equal(k, pos); /* first_chunk 0 */
			assert_int_equal(fb_stream_pull_chunk(pull, c->payload,
			                     c->len, (uint8_t *)plain, sizeof(plain),
			                     &mlen, &final, &why),
			    FB_OK);
			assert_int_equal(mlen, n * 4);
			assert_int_equal(fb_wk_sa_encode_chunk(&x->w, x->w.local, off,
			                     n, 0.0, &clipped, NULL, NULL, want),
			    FB_OK);
			assert_memory_equal(plain, want, mlen);
		}
		fb_stream_pull_free(pull);
		fix_free(x);
		fb_pool_free(pool);
	}
}

/* The upload logged from `at` (UpdateBegin, the chunks, the extras, the
 * end): its chunks' plaintexts into out[pos], in the order sent. */
static void
sa_upload_plain(fix *x, size_t at, uint32_t out[][CHUNK / 4])
{
	sent *b = &x->log[at];
	fb_stream_ctx ctx;
	fb_stream_pull *pull = NULL;
	fb_reject why = FB_REJECT_NONE;
	size_t mlen;
	int final;

	assert_int_equal(b->msg.type, FB_MSG_UPDATE_BEGIN);
	memset(&ctx, 0, sizeof(ctx));
	ctx.run = x->run;
	ctx.round = b->msg.u.update_begin.round;
	ctx.sender = fb_session_worker_id(x->cs);
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_INDEXED_TAGS,
	                     b->msg.u.update_begin.stream_key.b,
	                     b->msg.u.update_begin.stream_header.b,
	                     b->msg.u.update_begin.stream_header.len, CHUNK,
	                     &pull, &why),
	    FB_OK);
	for (uint32_t pos = 0; pos <= NCHUNK; pos++) {
		sent *c = &x->log[at + 1 + pos];
		assert_int_equal(c->msg.type, FB_MSG_UPDATE_CHUNK);
		memset(out[pos], 0, CHUNK);
		assert_int_equal(fb_stream_pull_chunk(pull, c->payload, c->len,
		                     (uint8_t *)out[pos], CHUNK, &mlen, &final,
		                     &why),
		    FB_OK);
		assert_int_equal(final != 0, pos == NCHUNK);
	}
	assert_int_equal(x->log[at + 2 + NCHUNK].msg.type, FB_MSG_UPDATE_END);
	fb_stream_pull_free(pull);
}

/*
 * security.secagg_masks_ahead: the shares come in while the worker still
 * trains, so the whole mask is made ahead on the pool (auto and on; never
 * with off), and the upload adds it. Whether the mask was all made before
 * the upload began (`wait`) or the upload stopped it midway, every chunk
 * decrypts to exactly the masked input made as the chunk goes (the mask
 * made ahead forgotten first), the extras included.
 */
static void
test_secagg_whole_mask_made_ahead(void **state)
{
	static uint32_t got[NCHUNK + 1][CHUNK / 4];
	static const int modes[] = {FB_WORKER_MASKS_AHEAD_AUTO,
	    FB_WORKER_MASKS_AHEAD_ON, FB_WORKER_MASKS_AHEAD_OFF};

	for (uint32_t mi = 0; mi < 3; mi++) {
		for (uint32_t threads = 0; threads <= 2; threads++) {
			for (int wait = 0; wait <= 1; wait++) {
				fb_pool *pool = NULL;
				fix *x = fix_new(true);
				uint32_t want[CHUNK / 4];
				fb_msg rs;
				size_t at;

				x->cfg.secagg_masks_ahead = modes[mi];
				if (threads > 0) {
					assert_int_equal(
					    fb_pool_alloc(threads, &pool), FB_OK);
				}
				x->w.pool = pool;
				secure_join(x);
				rs = sa_round_msg(x, 5);
				x->served = x->nlog;
				assert_int_equal(
				    deliver_sealed(x, &rs, NULL, 0), FB_OK);
				sa_exchange_adverts(x, 5);
				serve_model(x);
				assert_int_equal(x->w.phase, FB_WK_TRAINING);
				sa_exchange_shares(x, 5); /* while training */
				assert_int_equal(x->w.sa_phase, FB_WK_SA_MASKING);
				assert_int_equal(x->w.phase, FB_WK_TRAINING);
				if (modes[mi] == FB_WORKER_MASKS_AHEAD_OFF) {
					assert_null(x->w.premask);
				} else {
					assert_non_null(x->w.premask);
				}
				for (int spin = 0; wait && x->w.premask != NULL &&
				     fb_wk_premask_made(&x->w) < NCHUNK + 1 &&
				     spin < 10000; spin++) {
					fb_sleep_ms(1);
				}
				if (wait && x->w.premask != NULL) {
					assert_int_equal(
					    fb_wk_premask_made(&x->w), NCHUNK + 1);
				}
				train_done(x, FB_OK);
				assert_int_equal(x->w.phase, FB_WK_UPLOADING);
				if (wait && x->w.premask != NULL) {
					/* every chunk, the extras too, from it */
					for (uint32_t k = 0; k <= NCHUNK; k++) {
						uint64_t off = k < NCHUNK
						    ? (uint64_t)k * (CHUNK / 4)
						    : P;
						uint64_t n = k == NCHUNK
						    ? FB_SECAGG_EXTRA
						    : k + 1 == NCHUNK ? LAST_LEN / 4
						                      : CHUNK / 4;
						assert_non_null(
						    fb_wk_premask_get(&x->w, off, n));
					}
				}
				at = x->nlog;
				while (x->w.phase == FB_WK_UPLOADING) {
					writable(x);
				}
				sa_upload_plain(x, at, got);
				/* the reference: masks made as the chunks go */
				fb_wk_premask_drop(&x->w);
				for (uint32_t k = 0; k <= NCHUNK; k++) {
					uint64_t off = k < NCHUNK
					    ? (uint64_t)k * (CHUNK / 4)
					    : P;
					uint64_t n = k == NCHUNK ? FB_SECAGG_EXTRA
					    : k + 1 == NCHUNK    ? LAST_LEN / 4
					                         : CHUNK / 4;
					uint64_t clipped = 0;
					assert_null(fb_wk_premask_get(&x->w, off, n));
					assert_int_equal(
					    fb_wk_sa_encode_chunk(&x->w, x->w.local,
					        off, n, x->w.stats.loss_mean, &clipped,
					        NULL,
					        NULL, want),
					    FB_OK);
					assert_memory_equal(got[k], want, n * 4);
				}
				fix_free(x);
				fb_pool_free(pool);
			}
		}
	}
}

/*
 * secure_aggregation.setup_ahead, the worker's side. During round 5 (its
 * update up) the coordinator sets round 6 up: the worker answers the
 * SETUP with a fresh advert for round 6, flagged ahead, and the flagged
 * PEERS and RELAY with its shares and its masks, while round 5's instance
 * stays as it was. Round 6's RoundStart (sa_set_up) takes that instance:
 * no advert goes in the round, the trained update goes up at once, and
 * each chunk is exactly the masked input of that instance. A RoundStart
 * that says set up ahead where no setup was finished fails the round,
 * saying so; flagged steps of a setup it does not hold are dropped.
 */
static void
test_secagg_set_up_ahead(void **state)
{
	static uint32_t got[NCHUNK + 1][CHUNK / 4];
	fix *x = fix_new(true);
	fb_msg rs5, rs6, m;
	uint8_t setup[FB_SA_SETUP_MAX], entry[FB_SECAGG_PEER_ENTRY_LEN] = {0};
	const fb_secagg_worker *round5;
	size_t len = 0, at;
	sent *f;

	secure_join(x);
	rs5 = sa_round_msg(x, 5);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs5, NULL, 0), FB_OK);
	sa_exchange_adverts(x, 5);
	serve_model(x);
	train_done(x, FB_OK);
	sa_exchange_shares(x, 5);
	while (x->w.phase == FB_WK_UPLOADING) {
		writable(x);
	}
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	round5 = x->w.sa;
	/* round 6's setup (its peer is a fresh slot-1 instance of round 6) */
	rs6 = sa_round_msg(x, 6);
	assert_int_equal(fb_sa_setup_pack(&rs6, setup, sizeof(setup), &len),
	    FB_OK);
	m = sa_msg(6, FB_SA_SETUP, 1);
	m.u.secagg.ahead = true;
	assert_int_equal(deliver_sealed(x, &m, setup, len), FB_OK);
	assert_non_null(find_sa(x, 6, FB_SA_ADVERT));
	assert_true(x->w.sa == round5 && x->w.sa_round == 5);
	assert_non_null(x->w.ahead.st.sa);
	assert_int_equal(x->w.ahead.st.phase, FB_WK_SA_ADVERTISED);
	/* its advert, the peers' and the shares: flagged ahead, round 6 */
	sa_exchange_adverts_as(x, 6, true);
	assert_int_equal(x->w.ahead.st.phase, FB_WK_SA_SHARED);
	sa_exchange_shares_as(x, 6, true);
	assert_int_equal(x->w.ahead.st.phase, FB_WK_SA_MASKING);
	assert_true(x->w.sa == round5 && x->w.phase == FB_WK_IDLE);
	/* round 6 begins, set up ahead: no advert in the round */
	rs6.u.round_start.sa_set_up = true;
	x->served = x->nlog;
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs6, NULL, 0), FB_OK);
	assert_int_equal(count_of(x, FB_MSG_SECAGG, at), 0);
	assert_int_equal(x->w.sa_round, 6);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_MASKING);
	assert_null(x->w.ahead.st.sa);
	serve_model(x);
	train_done(x, FB_OK);
	assert_int_equal(x->w.phase, FB_WK_UPLOADING);
	at = x->nlog;
	while (x->w.phase == FB_WK_UPLOADING) {
		writable(x);
	}
	sa_upload_plain(x, at, got);
	fb_wk_premask_drop(&x->w);
	for (uint32_t k = 0; k <= NCHUNK; k++) {
		uint32_t want[CHUNK / 4];
		uint64_t off = k < NCHUNK ? (uint64_t)k * (CHUNK / 4) : P;
		uint64_t n = k == NCHUNK ? FB_SECAGG_EXTRA
		    : k + 1 == NCHUNK    ? LAST_LEN / 4
		                         : CHUNK / 4;
		uint64_t clipped = 0;
		assert_int_equal(fb_wk_sa_encode_chunk(&x->w, x->w.local, off, n,
		                     x->w.stats.loss_mean, &clipped, NULL, NULL,
		                     want),
		    FB_OK);
		assert_memory_equal(got[k], want, n * 4);
	}
	/* flagged PEERS of a setup it does not hold: dropped */
	at = x->nlog;
	m = sa_msg(8, FB_SA_PEERS, 1);
	m.u.secagg.ahead = true;
	assert_int_equal(deliver_sealed(x, &m, entry, sizeof(entry)), FB_OK);
	assert_int_equal(x->nlog, at);
	/* round 7 claims a setup made ahead that this worker never made */
	rs6 = sa_round_msg(x, 7);
	rs6.u.round_start.sa_set_up = true;
	x->served = x->nlog;
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs6, NULL, 0), FB_OK);
	f = find(x, FB_MSG_ROUND_FAILED, at);
	assert_non_null(f);
	assert_int_equal(f->msg.u.round_failed.round, 7);
	assert_non_null(strstr(f->msg.u.round_failed.reason, "up ahead"));
	fix_free(x);
}

/*
 * Asked for its masked input again (the coordinator's sum started again:
 * secure_aggregation.max_uploads 0), the worker sends it anew in a new
 * stream: the same plaintext chunk for chunk, the extras too, under a new
 * stream key. Asked before its input went, or more than once for each
 * other slot of the round (one here), it ignores the ask.
 */
static void
test_secagg_input_sent_again(void **state)
{
	static uint32_t plain[2][NCHUNK + 1][CHUNK / 4];
	fix *x = fix_new(true);
	fb_msg rs, am = sa_msg(5, FB_SA_AGAIN, 0);
	size_t at[2], n;

	secure_join(x);
	rs = sa_round_msg(x, 5);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(deliver_sealed(x, &am, NULL, 0), FB_OK);
	assert_int_equal(x->w.sa_again, 0); /* nothing to send yet */
	sa_exchange_adverts(x, 5);
	serve_model(x);
	train_done(x, FB_OK);
	sa_exchange_shares(x, 5);
	for (uint32_t k = 0; k < 2; k++) {
		if (k > 0) {
			assert_int_equal(deliver_sealed(x, &am, NULL, 0), FB_OK);
		}
		assert_int_equal(x->w.phase, FB_WK_UPLOADING);
		at[k] = x->nlog;
		while (x->w.phase == FB_WK_UPLOADING) {
			writable(x);
		}
		assert_int_equal(x->nlog - at[k], 1 + NCHUNK + 1 + 1);
		sa_upload_plain(x, at[k], plain[k]);
	}
	assert_memory_equal(plain[1], plain[0], sizeof(plain[0]));
	assert_memory_not_equal(x->log[at[0]].msg.u.update_begin.stream_key.b,
	    x->log[at[1]].msg.u.update_begin.stream_key.b, FB_STREAM_KEY_LEN);
	/* a second time: more than the round's other slots, ignored */
	n = x->nlog;
	assert_int_equal(deliver_sealed(x, &am, NULL, 0), FB_OK);
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->nlog, n);
	fix_free(x);
}

/*
 * A secure round with three slots up to the upload: the worker (slot 0)
 * and x->peer (slot 1) exchange adverts and shares; slot 2 never shares.
 * With `twin`, the PEERS message also carries an advert for slot 2
 * signed by the peer's identity key. Returns false if the worker left
 * the round before its shares went.
 */
static bool
sa_three_to_upload(fix *x, uint32_t round, uint32_t t, bool twin)
{
	uint8_t entry[2][FB_SECAGG_PEER_ENTRY_LEN];
	fb_msg rs = sa_round_msg_n(x, round, 3, t), pm;
	fb_secagg_worker *twin_w = NULL;
	sent *adv;

	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.sa_phase, FB_WK_SA_ADVERTISED);
	adv = find_sa(x, round, FB_SA_ADVERT);
	assert_non_null(adv);
	assert_int_equal(fb_secagg_worker_add_advert(
	                     x->peer, &x->wpk, adv->payload, adv->len),
	    FB_OK);
	memset(entry, 0, sizeof(entry));
	entry[0][0] = 1;
	memcpy(entry[0] + 4, x->ppk.b, FB_PUBKEY_LEN);
	assert_int_equal(fb_secagg_worker_advertise(
	                     x->peer, x->pid, entry[0] + 4 + FB_PUBKEY_LEN),
	    FB_OK);
	if (twin) {
		/* slot 2's advert, signed by the peer's identity too: one
		 * key standing in for two neighbours */
		entry[1][0] = 2;
		memcpy(entry[1] + 4, x->ppk.b, FB_PUBKEY_LEN);
		assert_int_equal(
		    fb_secagg_worker_alloc(&x->sap, 2, &twin_w), FB_OK);
		assert_int_equal(fb_secagg_worker_advertise(twin_w, x->pid,
		                     entry[1] + 4 + FB_PUBKEY_LEN),
		    FB_OK);
		fb_secagg_worker_free(twin_w);
	}
	pm = sa_msg(round, FB_SA_PEERS, twin ? 2 : 1);
	assert_int_equal(deliver_sealed(x, &pm, entry,
	                     (twin ? 2 : 1) * FB_SECAGG_PEER_ENTRY_LEN),
	    FB_OK);
	if (x->w.sa == NULL) {
		return false;
	}
	assert_int_equal(x->w.sa_phase, FB_WK_SA_SHARED);
	serve_model(x);
	train_done(x, FB_OK);
	sa_exchange_shares(x, round);
	assert_int_equal(fb_secagg_worker_mask_begin(x->peer), FB_OK);
	for (int k = 0; k < 8 && x->w.phase == FB_WK_UPLOADING; k++) {
		writable(x); /* the update goes up on the coordinator's credit */
	}
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(last(x)->msg.type, FB_MSG_UPDATE_END);
	return true;
}

/*
 * The coordinator tells the worker that slots 0 and 1 are in, and the
 * peer that all three are (so that slot 2's shares could be asked as if
 * it were in and, of others, as if it were out): the peer's signature is
 * over another set and does not count, so the worker holds one
 * confirmation of its set (its own) of the two needed, and refuses to
 * reveal -- it says so, and sends no shares. It also never signs a
 * second set.
 */
static void
test_secagg_conflicting_sets_refused(void **state)
{
	fix *x = fix_new(true);
	const uint8_t mine[3] = {1, 1, 0}, theirs[3] = {1, 1, 1};
	fb_msg um = sa_msg(11, FB_SA_INCLUDED, 3);
	fb_msg cm = sa_msg(11, FB_SA_CONFIRMS, 1);
	uint8_t pconf[FB_SECAGG_CONFIRM_LEN];
	size_t at;

	secure_join(x);
	assert_true(sa_three_to_upload(x, 11, 2, false));
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &um, mine, 3), FB_OK);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_CONFIRM);
	assert_int_equal(
	    fb_secagg_worker_confirm(x->peer, x->pid, theirs, 3, pconf), FB_OK);
	/* at the peer, ours does not count either */
	assert_int_equal(fb_secagg_worker_add_confirm(
	                     x->peer, last(x)->payload, last(x)->len),
	    FB_EAUTH);
	assert_int_equal(deliver_sealed(x, &cm, pconf, sizeof(pconf)), FB_OK);
	assert_null(find_sa(x, 11, FB_SA_REVEAL));
	assert_non_null(find_sa(x, 11, FB_SA_REFUSE));
	assert_int_equal(count_of(x, FB_MSG_SECAGG, at), 2);
	assert_null(x->w.sa); /* its secrets are gone with the round */
	fix_free(x);

	/* asked to sign a second set: it refuses, says so, and leaves */
	x = fix_new(true);
	secure_join(x);
	assert_true(sa_three_to_upload(x, 12, 2, false));
	um = sa_msg(12, FB_SA_INCLUDED, 3);
	assert_int_equal(deliver_sealed(x, &um, mine, 3), FB_OK);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_CONFIRM);
	assert_int_equal(deliver_sealed(x, &um, theirs, 3), FB_OK);
	assert_int_equal(last(x)->msg.u.secagg.phase, FB_SA_REFUSE);
	assert_null(x->w.sa);
	assert_null(find_sa(x, 12, FB_SA_REVEAL));
	fix_free(x);
}

/*
 * The coordinator relays two adverts signed by one identity key (the
 * peer's) for slots 1 and 2: the worker takes the first and refuses the
 * second. With threshold 2 it goes on with one neighbour; with 3 it has
 * too few and leaves the round before sending any share.
 */
static void
test_secagg_one_identity_one_slot(void **state)
{
	fix *x = fix_new(true);

	secure_join(x);
	assert_true(sa_three_to_upload(x, 13, 2, true));
	assert_int_equal(find_sa(x, 13, FB_SA_SHARES)->msg.u.secagg.count, 1);
	fix_free(x);

	x = fix_new(true);
	secure_join(x);
	assert_false(sa_three_to_upload(x, 14, 3, true));
	assert_null(find_sa(x, 14, FB_SA_SHARES));
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	fix_free(x);
}

/*
 * The threshold floor: on 5 workers (4 neighbours each) a majority of a
 * neighbourhood is 3, so a round asking 2 is skipped before anything is
 * made or sent; security.secagg_min_threshold lowers or raises the floor.
 */
static void
test_secagg_threshold_floor(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs;
	size_t at;

	secure_join(x);
	rs = sa_round_msg_n(x, 15, 5, 2);
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	/* no advert, no model request: only the refusal, with its reason */
	assert_int_equal(x->nlog, at + 1);
	assert_failed(x, 15, "floor");
	assert_null(x->w.sa);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	/* a majority is taken */
	rs = sa_round_msg_n(x, 16, 5, 3);
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_non_null(find_sa(x, 16, FB_SA_ADVERT));
	/* an explicit floor of 2 takes 2; one of 4 refuses 3 */
	x->cfg.secagg_min_threshold = 2;
	rs = sa_round_msg_n(x, 17, 5, 2);
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_non_null(find_sa(x, 17, FB_SA_ADVERT));
	x->cfg.secagg_min_threshold = 4;
	rs = sa_round_msg_n(x, 18, 5, 3);
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_null(find_sa(x, 18, FB_SA_ADVERT));
	assert_null(x->w.sa);
	fix_free(x);
}

/*
 * A secure time budget: the first round does the fixed work (no speed
 * yet); from then on the worker fits its steps to the budget at its own
 * measured speed (the fake trainer: 5 steps in 0.25 s), clamped to
 * min/max_steps. Nothing of it leaves: no speed, steps, time, sample
 * count or loss in its hello or updates.
 */
static void
test_secagg_private_time_budget(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs;
	sent *b;

	secure_join(x);
	assert_int_equal(find(x, FB_MSG_HELLO, 0)->msg.u.hello.num_samples, 0);
	for (uint32_t r = 21; r <= 23; r++) {
		fb_msg pm;
		uint8_t entry[FB_SECAGG_PEER_ENTRY_LEN];
		sent *adv;
		rs = sa_round_msg(x, r);
		rs.u.round_start.time_budget_ms = r == 23 ? 60000 : 1000;
		rs.u.round_start.min_steps = 2;
		rs.u.round_start.max_steps = 100;
		x->served = x->nlog;
		assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
		/* 21: fixed work; 22: 20 steps/s x 1 s; 23: 1200, clamped */
		assert_int_equal(x->w.steps, r == 21 ? 5 : r == 22 ? 20 : 100);
		adv = find_sa(x, r, FB_SA_ADVERT);
		assert_int_equal(fb_secagg_worker_add_advert(x->peer, &x->wpk,
		                     adv->payload, adv->len),
		    FB_OK);
		memset(entry, 0, sizeof(entry));
		entry[0] = 1;
		memcpy(entry + 4, x->ppk.b, FB_PUBKEY_LEN);
		assert_int_equal(fb_secagg_worker_advertise(x->peer, x->pid,
		                     entry + 4 + FB_PUBKEY_LEN),
		    FB_OK);
		pm = sa_msg(r, FB_SA_PEERS, 1);
		assert_int_equal(deliver_sealed(x, &pm, entry, sizeof(entry)),
		    FB_OK);
		serve_model(x);
		train_done(x, FB_OK);
		sa_exchange_shares(x, r);
		fb_wk_on_writable(&x->w, x->now);
		b = find(x, FB_MSG_UPDATE_BEGIN, x->served);
		assert_non_null(b);
		assert_true(b->msg.u.update_begin.steps_per_second == 0.0);
		assert_int_equal(b->msg.u.update_begin.steps, 0);
		assert_int_equal(b->msg.u.update_begin.num_samples, 0);
		assert_true(b->msg.u.update_begin.train_seconds == 0.0);
		assert_true(b->msg.u.update_begin.train_loss == 0.0);
		assert_true(b->msg.u.update_begin.a_norm == 0.0);
	}
	/* a budget with min above max, or without secure aggregation, is
	 * malformed: no round */
	rs = sa_round_msg(x, 24);
	rs.u.round_start.time_budget_ms = 1000;
	rs.u.round_start.min_steps = 9;
	rs.u.round_start.max_steps = 3;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_null(find_sa(x, 24, FB_SA_ADVERT));
	fix_free(x);
}

static void
test_secagg_outbox_keeps_order(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs, um = sa_msg(6, FB_SA_INCLUDED, 2);
	uint8_t included[2] = {1, 1};
	size_t at, first_fetch;

	secure_join(x);
	rs = sa_round_msg(x, 6);
	/* the queue is full when the round starts: the advert waits, and the
	 * model requests wait behind it */
	x->room = 0;
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->nlog, at);
	assert_int_equal(x->w.out_count, 1);
	assert_true(fb_wk_wants_out(&x->w));
	x->room = ROOM_ANY;
	writable(x);
	assert_int_equal(x->log[at].msg.type, FB_MSG_SECAGG);
	assert_int_equal(x->log[at].msg.u.secagg.phase, FB_SA_ADVERT);
	assert_int_equal(x->log[at + 1].msg.type, FB_MSG_MODEL_FETCH);
	first_fetch = at + 1;
	/* the shares find the queue full too; a model chunk arriving then
	 * does not send its next request ahead of them */
	x->room = 0;
	sa_exchange_adverts(x, 6);
	assert_int_equal(x->w.out_count, 1);
	x->room = ROOM_ANY;
	at = x->nlog;
	{
		fb_msg c = {.type = FB_MSG_MODEL_CHUNK};
		c.u.model_chunk.round = 6;
		c.u.model_chunk.chunk = 0;
		assert_int_equal(
		    deliver_sealed(x, &c, x->mchunk[0], x->mchunk_len[0]),
		    FB_OK);
	}
	assert_int_equal(x->nlog, at);
	writable(x);
	assert_int_equal(x->log[at].msg.u.secagg.phase, FB_SA_SHARES);
	assert_int_equal(x->log[at + 1].msg.type, FB_MSG_MODEL_FETCH);
	assert_int_equal(x->log[at + 1].msg.u.model_fetch.chunk, 2);
	sa_exchange_shares(x, 6);
	x->served = first_fetch + 1; /* chunk 0 is in: from chunk 1 on */
	serve_model(x);
	assert_int_equal(x->starts, 1);
	train_done(x, FB_OK);
	writable(x);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_non_null(find(x, FB_MSG_UPDATE_END, at));
	/* 17 included sets (the same) while the link takes nothing: 16
	 * confirmations wait in the outbox, the last is dropped, none is
	 * reordered */
	x->room = 0;
	for (int i = 0; i < FB_WK_OUTBOX_MAX + 1; i++) {
		assert_int_equal(deliver_sealed(x, &um, included, 2), FB_OK);
	}
	assert_int_equal(x->w.out_count, FB_WK_OUTBOX_MAX);
	at = x->nlog;
	x->room = 1;
	writable(x);
	assert_int_equal(x->w.out_count, FB_WK_OUTBOX_MAX - 1);
	/* round 7 starts meanwhile: its advert queues behind round 6's
	 * confirmations, which are still sealed for round 6 when they go */
	rs = sa_round_msg(x, 7);
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.out_count, FB_WK_OUTBOX_MAX);
	x->room = ROOM_ANY;
	writable(x);
	assert_int_equal(x->w.out_count, 0);
	assert_int_equal(count_of(x, FB_MSG_SECAGG, at), FB_WK_OUTBOX_MAX + 1);
	for (size_t i = at; i < at + FB_WK_OUTBOX_MAX; i++) {
		assert_int_equal(x->log[i].msg.u.secagg.phase, FB_SA_CONFIRM);
		assert_int_equal(x->log[i].seal_round, 6);
	}
	assert_int_equal(
	    x->log[at + FB_WK_OUTBOX_MAX].msg.u.secagg.phase, FB_SA_ADVERT);
	assert_int_equal(x->log[at + FB_WK_OUTBOX_MAX].seal_round, 7);
	assert_int_equal(
	    x->log[at + FB_WK_OUTBOX_MAX + 1].msg.type, FB_MSG_MODEL_FETCH);
	fix_free(x);
}

static void
test_secagg_cancel_and_malformed(void **state)
{
	fix *x = fix_new(true);
	fb_msg rs, cancel = simple_msg(FB_MSG_ROUND_CANCEL, 7);
	fb_msg pm = sa_msg(8, FB_SA_PEERS, 1);
	uint8_t junk[10] = {0};
	size_t at;

	secure_join(x);
	rs = sa_round_msg(x, 7);
	x->served = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	sa_exchange_adverts(x, 7);
	serve_model(x);
	train_done(x, FB_OK);
	assert_int_equal(x->w.phase, FB_WK_WAITING);
	/* a cancel while waiting for the masks: the round and its secrets go */
	assert_int_equal(deliver_sealed(x, &cancel, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_null(x->w.sa);
	at = x->nlog;
	sa_exchange_shares(x, 7); /* late shares: nothing happens */
	assert_int_equal(x->nlog, at);
	/* adverts of the wrong size: the round is left */
	rs = sa_round_msg(x, 8);
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_FETCHING);
	assert_int_equal(deliver_sealed(x, &pm, junk, sizeof(junk)), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_null(x->w.sa);
	/* unusable parameters: the round is skipped */
	rs = sa_round_msg(x, 9);
	rs.u.round_start.sa_slot = 2;
	at = x->nlog;
	assert_int_equal(deliver_sealed(x, &rs, NULL, 0), FB_OK);
	assert_int_equal(x->w.phase, FB_WK_IDLE);
	assert_int_equal(x->nlog, at + 1);
	assert_failed(x, 9, "");
	fix_free(x);
}

/* ---- the model a welcome names ------------------------------------------ */

static void
test_plugin_only_from_own_config(void **state)
{
	char path[512];
	const char *b = getenv("FB_BUILD");
	fix *x = fix_new(false);
	fb_msg m = welcome_msg();

	strcpy(m.u.welcome.model.arch, "plugin");
	strcpy(m.u.welcome.model.plugin, "/nonexistent/evil.so");
	fb_wk_start(&x->w, x->now);
	assert_int_equal(deliver(x, &m, NULL, 0), FB_ECONFIG);
	assert_null(x->w.model);
	fix_free(x);
	/* with train.plugin set, that library is the one loaded */
	snprintf(
	    path, sizeof(path), "%s/examples/tiny.so", b != NULL ? b : "build");
	x = fix_new(false);
	x->cfg.plugin = path;
	fb_wk_start(&x->w, x->now);
	assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
	assert_non_null(x->w.model);
	assert_int_equal(x->w.param_count, P);
	fix_free(x);
}

/* A layout of the 8-4-3 MLP's tensors with tensor `which` renamed or
 * reshaped (its first dimension and the next tensor's traded), into buf. */
static size_t
mlp_layout_bent(uint8_t *buf, size_t cap, int rename)
{
	fb_model_spec spec;
	fb_model *mod = NULL;
	uint8_t *b = NULL;
	size_t n = 0;

	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "mlp");
	spec.input_dim = 8;
	spec.classes = 3;
	spec.hidden[0] = 4;
	spec.hidden_count = 1;
	assert_int_equal(fb_model_open(&spec, &mod), FB_OK);
	assert_int_equal(fb_model_layout_pack(mod, &b, &n), FB_OK);
	assert_true(n <= cap);
	memcpy(buf, b, n);
	fb_free(b);
	fb_model_close(mod);
	/* the first tensor: 4-byte magic, count, then its name length and
	 * name ("fc1.weight", 10 bytes), dtype, rank, shape */
	assert_int_equal(buf[8], 10);
	assert_memory_equal(buf + 9, "fc1.weight", 10);
	if (rename) {
		buf[9 + 2] = '9'; /* "fc9.weight" */
	} else {
		/* [4, 8] becomes [8, 4]: same count, another shape */
		fb_store_le64(buf + 21, 8);
		fb_store_le64(buf + 29, 4);
	}
	return n;
}

static void
test_layout_differs_refused(void **state)
{
	uint8_t lay[4096];
	fb_msg m = welcome_msg();
	const fb_msg *out;
	size_t n;

	for (int rename = 0; rename <= 1; rename++) {
		fix *x = fix_new(false);
		fb_wk_start(&x->w, x->now);
		n = mlp_layout_bent(lay, sizeof(lay), rename);
		assert_int_equal(deliver(x, &m, lay, n), FB_OK);
		/* the coordinator is told, naming the tensor on each side */
		out = &last(x)->msg;
		assert_int_equal(out->type, FB_MSG_ROUND_FAILED);
		assert_int_equal(out->u.round_failed.round, 0);
		assert_non_null(
		    strstr(out->u.round_failed.reason, "layout differs"));
		if (rename) {
			assert_non_null(strstr(out->u.round_failed.reason,
			    "\"fc9.weight\" [4, 8] F32 in the coordinator's"));
		} else {
			assert_non_null(strstr(out->u.round_failed.reason,
			    "\"fc1.weight\" [8, 4] F32 in the coordinator's"));
		}
		assert_non_null(strstr(out->u.round_failed.reason,
		    "\"fc1.weight\" [4, 8] F32 in this worker's"));
		assert_false(x->w.welcomed);
		assert_null(x->w.model);
		assert_int_equal(x->w.phase, FB_WK_DONE);
		/* it stops once the refusal had time to leave, not before */
		assert_int_equal(fb_wk_tick(&x->w, x->now + 100), FB_OK);
		assert_int_equal(fb_wk_tick(&x->w, x->now + 600), FB_ECONFIG);
		fix_free(x);
	}
	/* a new run (a restarted coordinator) with another layout of the same
	 * size: refused too; with the same one, taken */
	{
		fix *x = fix_new(false);
		fb_wk_start(&x->w, x->now);
		assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
		assert_true(x->w.welcomed);
		m.u.welcome.run_id = 43;
		n = mlp_layout_bent(lay, sizeof(lay), 0);
		assert_int_equal(deliver(x, &m, lay, n), FB_EPROTO);
		assert_int_equal(deliver(x, &m, NULL, 0), FB_OK);
		assert_int_equal(x->w.run_id, 43);
		fix_free(x);
	}
}

static void
test_init_model_from_welcome(void **state)
{
	fix *x = fix_new(false);
	fb_msg m = welcome_msg();
	const void *lay;
	size_t n;
	fb_tensor_info ti;

	welcome_layout(x, &m, &lay, &n);
	strcpy(m.u.welcome.model.arch, "init");
	fb_wk_start(&x->w, x->now);
	/* a malformed layout is the coordinator's fault: refused */
	assert_int_equal(deliver(x, &m, lay, n - 1), FB_EPROTO);
	assert_null(x->w.model);
	assert_int_equal(deliver(x, &m, lay, n), FB_OK);
	assert_true(x->w.welcomed);
	assert_non_null(x->w.model);
	assert_int_equal(x->w.param_count, P);
	assert_int_equal(fb_model_tensor_count(x->w.model), 4);
	fb_model_tensor_info(x->w.model, 2, &ti);
	assert_string_equal(ti.name, "fc2.weight");
	assert_int_equal(ti.shape[0], 3);
	assert_int_equal(ti.shape[1], 4);
	fix_free(x);
}

FB_TESTS = {
	{"a plain update carries the global model's evaluation",
	    test_plain_update_carries_evaluation},
    {"a plain worker says hello and the welcome admits it",
        test_hello_and_welcome},
    {"a round goes from its start to an update in rotated chunk order",
        test_round_end_to_end},
    {"update chunks wait for the coordinator's credit",
        test_chunks_wait_for_credit},
    {"model requests stay within the fetch window", test_fetch_window},
    {"a full queue defers requests and chunks until the link has room",
        test_full_queue_defers_and_resumes},
    {"during a slow upload heartbeats keep the worker and a cancel stops it",
        test_busy_upload_answers_coordinator},
    {"a cancel while fetching, training or after the upload leaves the round",
        test_cancel_in_each_phase},
    {"a round start while a round runs abandons the old round",
        test_round_start_while_running},
    {"a trainer that fails or does not start leaves the round, and says so",
        test_trainer_failures},
    {"an update holding NaN fails the round instead of going up",
        test_nan_update_fails_round},
    {"a silent coordinator is left after its liveness timeout",
        test_silent_coordinator},
    {"a queue full past transport.send_timeout makes the worker rejoin",
        test_full_queue_past_send_timeout},
    {"joining retries with backoff and jitter, forever unless told",
        test_join_retries_with_backoff},
    {"the link's connection events start, and restart, the join",
        test_link_events_join_and_rejoin},
    {"a join taken before the first connection is not sent twice",
        test_first_connection_keeps_its_handshake},
    {"bytes that move keep the coordinator alive on a slow link",
        test_bytes_moving_keep_links_alive},
    {"a redirect moves the worker to a lane, and a mute lane sends it back",
        test_redirect_and_lane_giveup},
    {"malformed welcomes, round starts, chunks and frames are refused",
        test_malformed_inputs},
    {"the coordinator's shutdown ends the run", test_shutdown_ends_run},
    {"without security a refusal ends the run", test_plain_refusal_is_final},
    {"a secure worker shakes hands and sends one valid signed stream",
        test_secure_join_and_round},
    {"a tampered model chunk or an unwanted round starts no training",
        test_secure_model_tampered},
    {"the model's chunks are checked in batches on the pool, tampering "
     "anywhere stops the round",
        test_secure_model_on_pool},
    {"a refusal in clear is taken before the coordinator authenticated",
        test_refusal_before_authentication},
    {"after admission a refusal or cancel in clear changes nothing",
        test_refusal_in_clear_after_admission},
    {"a new handshake takes only its own reply in clear",
        test_rehandshake_takes_only_its_reply},
    {"the hello carries the coordinator's cookie, asked for each time",
        test_handshake_cookie},
    {"a sealed frame that does not open is dropped",
        test_sealed_garbage_dropped},
    {"a secure-aggregation round: advert, shares, masked update, reveal",
        test_secagg_round},
    {"secure async: the last cohort's unmasking runs beside the next task",
        test_secagg_async_keeps_the_last_cohort},
    {"secure async: the first credit's staleness weighs the masked input",
        test_secagg_credit_staleness_weighs_the_input},
    {"secure async: a credit past max_staleness sends nothing, ends the "
     "round",
        test_secagg_credit_past_max_staleness},
    {"a neighbour told other weight terms: no shares open, no input goes",
        test_secagg_peer_told_other_terms},
    {"masked inputs made ahead on the pool go up whole and in order",
        test_secagg_masks_made_ahead},
    {"the whole mask made ahead while training: the same masked input",
        test_secagg_whole_mask_made_ahead},
    {"a round set up during the one before: its instance, no advert",
        test_secagg_set_up_ahead},
    {"asked again, the masked input goes up anew: the same bytes",
        test_secagg_input_sent_again},
    {"a full queue keeps secure-aggregation messages in order",
        test_secagg_outbox_keeps_order},
    {"a cancel while waiting for masks, or bad adverts, end the round",
        test_secagg_cancel_and_malformed},
    {"conflicting included sets are caught: the worker refuses to reveal",
        test_secagg_conflicting_sets_refused},
    {"adverts where one identity signs two neighbour slots are refused",
        test_secagg_one_identity_one_slot},
    {"a threshold below the worker's floor is refused",
        test_secagg_threshold_floor},
    {"a secure time budget is fitted to the worker's own speed, never sent",
        test_secagg_private_time_budget},
    {"a welcome whose layout differs in one tensor is refused, naming it",
        test_layout_differs_refused},
    {"an init model is built from the welcome's layout alone",
        test_init_model_from_welcome},
    {"a plug-in model is loaded only from train.plugin",
        test_plugin_only_from_own_config},
    {NULL, NULL},
};

FB_TEST_MAIN("worker_sm")
