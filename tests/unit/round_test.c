/* SPDX-License-Identifier: Apache-2.0 */
/*
 * round_test.c -- the coordinator's round state machine, driven with
 * synthetic events and a fake clock: no sockets, no threads.
 *
 * A coordinator is built from a real config (written to a file and read
 * by fb_coord_config_load) with a fake coord_io that records what it
 * sends, jobs run inline and the ingest pool on the caller. Fake workers
 * answer with real protocol messages: hellos, updates (plain, or
 * secretstream-encrypted and signed), and the SecAgg client side from
 * crypto/ (adverts, shares, masked inputs, reveals). The clock is
 * `t.now`; turn() is one turn of the loop after an event.
 */
#include <float.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"
#include "crypto/crypto.h"
#include "tests/unit/harness.h"

#include <sodium.h>

#define MAXW 8
#define PARAMS 2500   /* synthetic model: 3 chunks of 1024 floats */
#define CHUNK_BYTES 4096
#define T0 1000000    /* the fake clock's start, ms */

/* ---- the fake io ------------------------------------------------------- */

typedef struct sent {
	uint32_t to;      /* worker slot; UINT32_MAX: an unsealed answer */
	fb_msg m;
	uint8_t *payload; /* a copy */
	size_t len;
	fb_lent *held;    /* the memory it was sent from, held as a queued
	                   * ZeroMQ message would (io.hold) */
} sent;

static struct {
	sent v[8192];
	uint32_t n;
	uint32_t taken[MAXW]; /* per worker: messages read by the fake */
	bool full[MAXW];      /* that worker's queue refuses sends */
	bool hold[MAXW];      /* that worker reads nothing: what is sent to
	                       * it stays queued, holding its memory */
	fb_traffic traffic[MAXW]; /* what each worker's connection moved */
	bool has_traffic[MAXW];
	uint32_t credit_from[MAXW]; /* UpdateCredits read up to here */
	bool weighed[MAXW];   /* its upload's first credit came ... */
	uint32_t stale[MAXW]; /* ... with this staleness (secure async) */
} io;

static fb_err
fake_send_worker(coord *c, worker *w, const fb_msg *m, const void *payload,
    size_t len, fb_lent *origin)
{
	uint32_t slot = registry_slot(c, w).v;
	sent *s;

	(void)origin;
	if (slot < MAXW && io.full[slot]) {
		return FB_EAGAIN;
	}
	assert_true(io.n < FB_ARRAY_LEN(io.v));
	s = &io.v[io.n++];
	s->to = slot;
	s->m = *m;
	s->len = len;
	s->payload = NULL;
	s->held = NULL;
	if (origin != NULL && slot < MAXW && io.hold[slot]) {
		fb_lent_ref(origin);
		s->held = origin;
	}
	if (len > 0) {
		s->payload = malloc(len);
		assert_non_null(s->payload);
		memcpy(s->payload, payload, len);
	}
	return FB_OK;
}

static fb_err
fake_send_peer(coord *c, const fb_peer *peer, const fb_msg *m)
{
	(void)c;
	(void)peer;
	assert_true(io.n < FB_ARRAY_LEN(io.v));
	io.v[io.n].to = UINT32_MAX;
	io.v[io.n].m = *m;
	io.v[io.n].payload = NULL;
	io.v[io.n].len = 0;
	io.n++;
	return FB_OK;
}

static uint64_t
fake_bytes(coord *c)
{
	(void)c;
	return 0;
}

static fb_err
fake_traffic(coord *c, worker *w, fb_traffic *tr)
{
	uint32_t slot = registry_slot(c, w).v;

	if (slot >= MAXW || !io.has_traffic[slot]) {
		return FB_ENOTSUP;
	}
	*tr = io.traffic[slot];
	return FB_OK;
}

static const coord_io fake_io = {
    .send_worker = fake_send_worker,
    .send_peer = fake_send_peer,
    .bytes_sent = fake_bytes,
    .bytes_received = fake_bytes,
    .traffic = fake_traffic,
};

static void
io_reset(void)
{
	for (uint32_t i = 0; i < io.n; i++) {
		free(io.v[i].payload);
		fb_lent_free(io.v[i].held);
	}
	memset(&io, 0, sizeof(io));
}

/* The next message of `type` sent to worker `slot` after the ones already
 * taken (others are skipped), or NULL. */
static const sent *
next_to(uint32_t slot, fb_msg_type type)
{
	for (uint32_t i = io.taken[slot]; i < io.n; i++) {
		if (io.v[i].to == slot && io.v[i].m.type == type) {
			io.taken[slot] = i + 1;
			return &io.v[i];
		}
	}
	return NULL;
}

/* The update chunks worker `slot` was granted (UpdateCredit) since the
 * last call. */
static uint32_t
take_credits(uint32_t slot)
{
	uint32_t n = 0;

	for (uint32_t i = io.credit_from[slot]; i < io.n; i++) {
		if (io.v[i].to == slot &&
		    io.v[i].m.type == FB_MSG_UPDATE_CREDIT) {
			n += io.v[i].m.u.update_credit.chunks;
			if (!io.weighed[slot]) {
				/* as the worker: its weight from the first */
				io.weighed[slot] = true;
				io.stale[slot] =
				    io.v[i].m.u.update_credit.staleness;
			}
		}
	}
	io.credit_from[slot] = io.n;
	return n;
}

/* Whether any message of `type` went to `slot` (from the start). */
static uint32_t
count_to(uint32_t slot, fb_msg_type type)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < io.n; i++) {
		n += io.v[i].to == slot && io.v[i].m.type == type;
	}
	return n;
}

/* How many SecAgg messages of `phase` went to `slot` (from the start). */
static uint32_t
count_sa(uint32_t slot, fb_secagg_phase phase)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < io.n; i++) {
		n += io.v[i].to == slot && io.v[i].m.type == FB_MSG_SECAGG &&
		     io.v[i].m.u.secagg.phase == (uint32_t)phase;
	}
	return n;
}

/* ---- the test bench ------------------------------------------------------ */

typedef struct fake_worker {
	fb_identity *id;       /* secure mode */
	uint64_t samples;
	float update[PARAMS];  /* what it sends (x_global - x_local) */
	/* this round */
	uint32_t round;
	uint32_t first_chunk;
	fb_secagg_worker *sa;
	fb_secagg_encodings enc;
	uint32_t sa_n;
	double a_norm;         /* FedNova */
	double loss;
	uint64_t ev_n;         /* its validation examples; 0: no evaluation */
	double ev_loss, ev_acc;
	const fb_msg *rs;      /* its last RoundStart */
	/* its upload under way */
	fb_stream_push *push;
	const float *x;
	uint32_t pos, credit;
	/* a malicious worker: added to each ring element of its input */
	uint32_t evil_add;     /* model coordinates */
	uint32_t evil_w;       /* the weight coordinate */
	bool leak_speed;       /* sends steps_per_second under SecAgg */
	/* secure async: the SecAgg instance of an earlier task, kept for its
	 * cohort's unmasking (held_swap) */
	fb_secagg_worker *held_sa;
	uint32_t held_round, held_n;
	fb_secagg_encodings held_enc;
	bool old_stream;       /* its update stream in the TAGS mode */
} fake_worker;

typedef struct bench {
	coord *c;
	fb_coord_config cfg;
	char dir[512];
	int64_t now;
	uint32_t n;
	bool secure, sa;
	fb_identity *self;
	fake_worker fw[MAXW];
	float start[PARAMS];   /* the model before the round */
	round_phase trace[256]; /* the phases entered, in order */
	uint32_t ntrace;
} bench;

static bench t;

typedef struct setup {
	uint32_t workers;
	bool secure;           /* security and secure aggregation */
	const char *extra;     /* more config lines (indented under round:) */
	const char *agg_extra; /* lines under aggregation: */
	const char *sa_extra;  /* lines under secure_aggregation: */
	const char *tr_extra;  /* lines under transport: */
	bool threads;          /* the job thread and a pool, not inline */
} setup;

/* One event's worth of loop turns: as many as the phase keeps moving
 * (inline jobs finish at once, and the loop's wake fd would bring it
 * back for each). */
static void
turn(void)
{
	round_phase before;
	int k = 0;

	do {
		int64_t waited = 0;
		before = t.c->rd.phase;
		coord_turn(t.c, t.now);
		/* with the job thread: a job's end comes like the loop's wake
		 * fd would bring it */
		while (jobs_busy(t.c) && t.c->rd.phase == before &&
		    waited < 20000) {
			fb_sleep_ms(1);
			waited++;
			coord_turn(t.c, t.now);
		}
		if (t.c->rd.phase != before && t.ntrace < FB_ARRAY_LEN(t.trace)) {
			t.trace[t.ntrace++] = t.c->rd.phase;
		}
	} while (t.c->rd.phase != before && ++k < 16);
}

static void
advance(int64_t ms)
{
	/* in steps, so that timers fire in order */
	while (ms > 0) {
		int64_t d = ms > 50 ? 50 : ms;
		t.now += d;
		ms -= d;
		turn();
	}
}

static fb_frame
frame_of(uint32_t i, const fb_msg *m)
{
	fb_frame f;

	memset(&f, 0, sizeof(f));
	f.peer.len = 4;
	memcpy(f.peer.id, "pe", 2);
	f.peer.id[2] = (uint8_t)i;
	f.peer.id[3] = 1;
	f.msg = *m;
	return f;
}

/* Delivers worker i's message (authenticated, as on_sealed would). */
static void
deliver(uint32_t i, const fb_msg *m, const void *payload, size_t len)
{
	fb_frame f = frame_of(i, m);
	fb_buf *buf = NULL;
	worker *w = &t.c->reg.workers[i];

	t.c->now = t.now;
	if (m->type == FB_MSG_UPDATE_CHUNK) {
		assert_int_equal(fb_buf_alloc(len, &buf), FB_OK);
		memcpy(fb_buf_data(buf), payload, len);
	} else {
		f.payload = (uint8_t *)(uintptr_t)payload;
		f.payload_len = len;
	}
	assert_true(w->used);
	coord_dispatch(t.c, w, &f, buf);
	turn();
}

/* Worker i's hello with `session`, on connection `conn` (its peer id). */
static void
hello_on(uint32_t i, uint64_t session, uint8_t conn)
{
	fb_msg m = {.type = FB_MSG_HELLO};
	fb_frame f;

	m.u.hello.protocol_version = FB_PROTOCOL_VERSION;
	snprintf(m.u.hello.name, sizeof(m.u.hello.name), "w%u", i);
	m.u.hello.worker_index = i;
	m.u.hello.num_samples = t.sa ? 0 : t.fw[i].samples;
	m.u.hello.session = session;
	m.u.hello.partitions = MAXW; /* shares of one data set */
	snprintf(m.u.hello.backend, sizeof(m.u.hello.backend), "cpu");
	f = frame_of(i, &m);
	f.peer.id[3] = conn;
	t.c->now = t.now;
	if (t.secure) {
		registry_on_hello(t.c, &t.c->reg.workers[i], &f);
	} else {
		coord_handle_frame(t.c, &f);
	}
	turn();
}

static void
hello(uint32_t i)
{
	hello_on(i, 100 + i, 1);
}

static void
write_config(const setup *s, char *path, size_t cap)
{
	FILE *f;

	snprintf(path, cap, "%s/c.yaml", t.dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "listen: tcp://127.0.0.1:1\noutput_dir: %s/out\nseed: 3\n"
	           "model:\n  arch: synthetic\n  synthetic_params: %d\n"
	           "round:\n  rounds: 3\n  min_workers: %u\n"
	           "  min_updates: 2\n  deadline: 10s\n  local_steps: 5\n"
	           "  wait_for_workers: 60s\n%s"
	           "aggregation:\n  ingest_threads: 0\n  clip: 16\n%s"
	           "evaluation:\n  every: 0\n"
	           "transport:\n  chunk_size: %d\n  heartbeat: 1s\n"
	           "  liveness_timeout: 5s\n  send_timeout: 3s\n%s"
	           "security:\n  enabled: %s\n"
	           "secure_aggregation:\n  enabled: %s\n  setup_timeout: 4s\n"
	           "  unmask_timeout: 4s\n  max_samples: 1000\n  clip: 4\n%s%s",
	    t.dir, PARAMS, s->workers, s->extra ? s->extra : "",
	    s->agg_extra ? s->agg_extra : "", CHUNK_BYTES,
	    s->tr_extra ? s->tr_extra : "", s->secure ? "true" : "false",
	    s->secure ? "true" : "false",
	    s->sa_extra ? s->sa_extra : "",
	    /* rounds set up in the round, unless a test sets them up ahead */
	    s->sa_extra != NULL && strstr(s->sa_extra, "setup_ahead") != NULL
	        ? ""
	        : "  setup_ahead: false\n");
	fclose(f);
}

/* Builds the coordinator and admits s->workers fake workers, each with
 * samples 100 * (i + 1) and a distinct update. */
static void
bench_start(const setup *s)
{
	char path[1024];

	memset(&t, 0, sizeof(t));
	io_reset();
	snprintf(t.dir, sizeof(t.dir), "%s", fb_test_tmpdir());
	t.n = s->workers;
	t.secure = s->secure;
	t.sa = s->secure;
	t.now = T0;
	write_config(s, path, sizeof(path));
	assert_int_equal(fb_coord_config_load(path, &t.cfg), FB_OK);
	t.c = calloc(1, sizeof(*t.c));
	assert_non_null(t.c);
	t.c->now = t.now;
	t.c->wake_fd = -1;
	t.c->job.efd = -1;
	if (s->secure) {
		assert_int_equal(fb_identity_alloc("coordinator", &t.self), FB_OK);
		t.c->self = t.self;
		t.c->secure = true;
		assert_int_equal(fb_run_id_random(&t.c->run), FB_OK);
		memcpy(&t.c->run_id, t.c->run.b, sizeof(t.c->run_id));
	}
	for (uint32_t i = 0; i < t.n; i++) {
		char name[16];
		t.fw[i].samples = 100 * (uint64_t)(i + 1);
		for (uint32_t j = 0; j < PARAMS; j++) {
			t.fw[i].update[j] = (float)(((int)((i * 7 + j) % 23) - 11) *
			    0.01 * (i + 1));
		}
		if (s->secure) {
			fb_pubkey pk;
			snprintf(name, sizeof(name), "w%u", i);
			assert_int_equal(fb_identity_alloc(name, &t.fw[i].id), FB_OK);
			fb_identity_pubkey(t.fw[i].id, &pk);
			assert_int_equal(registry_allow_add(t.c, &pk, name), FB_OK);
		}
	}
	assert_int_equal(coord_init(t.c, &t.cfg, &fake_io, !s->threads), FB_OK);
	{
		uint32_t first = 0;
		assert_int_equal(outputs_lock(t.c, FB_START_FORCE), FB_OK);
		assert_int_equal(outputs_prepare(t.c, FB_START_FORCE, &first),
		    FB_OK);
		assert_int_equal(first, 1);
		assert_int_equal(outputs_begin(t.c, FB_START_FORCE), FB_OK);
	}
	t.c->rd.idle_since_ms = t.c->rd.last_note_ms = t.now;
	memcpy(t.start, t.c->params, sizeof(t.start));
}

static void
bench_stop(void)
{
	for (uint32_t i = 0; i < t.n; i++) {
		fb_secagg_worker_free(t.fw[i].sa);
		fb_secagg_worker_free(t.fw[i].held_sa);
		fb_identity_free(t.fw[i].id);
		fb_stream_push_free(t.fw[i].push);
	}
	t.c->self = NULL;
	coord_fini(t.c);
	free(t.c);
	fb_identity_free(t.self);
	fb_coord_config_fini(&t.cfg);
	io_reset();
}

static void
admit_all(void)
{
	for (uint32_t i = 0; i < t.n; i++) {
		hello(i);
		assert_non_null(next_to(i, FB_MSG_WELCOME));
	}
	turn();
}

/* ---- fake workers' messages ---------------------------------------------- */

/* The RoundStart worker i got, and its round fields taken. */
static const fb_msg *
take_round_start(uint32_t i)
{
	const sent *s = next_to(i, FB_MSG_ROUND_START);

	if (s == NULL) {
		return NULL;
	}
	t.fw[i].round = s->m.u.round_start.round;
	t.fw[i].first_chunk = s->m.u.round_start.first_chunk;
	t.fw[i].rs = &s->m;
	return &s->m;
}

/* The ahead setup's instance of each fake worker (see ahead_setup). */
static struct {
	fb_secagg_worker *sa;
	fb_secagg_encodings enc;
	uint32_t n, round, slot;
	fb_msg params;
} ahead_fw[MAXW];

/* One SecAgg instance of fake worker i: its round's own (t.fw[i]), or
 * the next round's, set up ahead (ahead_fw[i], its steps flagged). */
typedef struct fake_inst {
	fb_secagg_worker **sa;
	fb_secagg_encodings *enc;
	uint32_t *n;
	uint32_t round;
	bool ahead;
} fake_inst;

static fake_inst
own_inst(uint32_t i)
{
	return (fake_inst){&t.fw[i].sa, &t.fw[i].enc, &t.fw[i].sa_n,
	    t.fw[i].round, false};
}

static fake_inst
ahead_inst(uint32_t i)
{
	return (fake_inst){&ahead_fw[i].sa, &ahead_fw[i].enc, &ahead_fw[i].n,
	    ahead_fw[i].round, true};
}

static void
send_sa_as(uint32_t i, fake_inst in, fb_secagg_phase ph, uint32_t count,
    const void *data, size_t len)
{
	fb_msg m = {.type = FB_MSG_SECAGG};
	m.u.secagg.round = in.round;
	m.u.secagg.phase = ph;
	m.u.secagg.count = count;
	m.u.secagg.ahead = in.ahead;
	deliver(i, &m, data, len);
}

static void
send_secagg(uint32_t i, fb_secagg_phase ph, uint32_t count,
    const void *data, size_t len)
{
	send_sa_as(i, own_inst(i), ph, count, data, len);
}

/* The next SecAgg message to worker i: of `phase`, flagged ahead for an
 * instance set up ahead. */
static const sent *
next_sa_as(uint32_t i, fake_inst in, fb_secagg_phase phase)
{
	const sent *s = next_to(i, FB_MSG_SECAGG);

	assert_non_null(s);
	assert_int_equal(s->m.u.secagg.phase, phase);
	if (in.ahead) {
		assert_true(s->m.u.secagg.ahead);
	}
	return s;
}

/* SecAgg step 1: keys from the round's parameters, the signed advert. */
static void
sa_keys_as(uint32_t i, fake_inst in, const fb_msg *rs)
{
	fb_secagg_params p;
	uint8_t adv[FB_SECAGG_ADV_LEN];

	memset(&p, 0, sizeof(p));
	p.run = t.c->run;
	p.round = rs->u.round_start.round;
	p.n = rs->u.round_start.sa_n;
	p.degree = rs->u.round_start.sa_degree;
	p.threshold = rs->u.round_start.sa_threshold;
	memcpy(p.graph_seed, rs->u.round_start.sa_graph_seed.b, 32);
	fb_secagg_worker_free(*in.sa);
	assert_int_equal(fb_secagg_worker_alloc(&p, rs->u.round_start.sa_slot,
	                     in.sa),
	    FB_OK);
	assert_int_equal(fb_secagg_encodings_init(in.enc,
	                     rs->u.round_start.sa_ring_bits, p.n,
	                     rs->u.round_start.sa_clip,
	                     rs->u.round_start.sa_a_bound),
	    FB_OK);
	*in.n = p.n;
	assert_int_equal(fb_secagg_worker_advertise(*in.sa, t.fw[i].id, adv),
	    FB_OK);
	send_sa_as(i, in, FB_SA_ADVERT, 1, adv, sizeof(adv));
}

/* SecAgg step 2 up to the send: the neighbours' adverts in, the shares
 * made into out (cap bytes, *len written). */
static void
sa_peers_in(uint32_t i, fake_inst in, uint8_t *out, size_t cap, size_t *len)
{
	const sent *s = next_sa_as(i, in, FB_SA_PEERS);

	for (uint32_t k = 0; k < s->m.u.secagg.count; k++) {
		const uint8_t *e = s->payload + (size_t)k * FB_SECAGG_PEER_ENTRY_LEN;
		fb_pubkey pk;
		memcpy(pk.b, e + 4, FB_PUBKEY_LEN);
		assert_int_equal(fb_secagg_worker_add_advert(*in.sa, &pk,
		                     e + 4 + FB_PUBKEY_LEN, FB_SECAGG_ADV_LEN),
		    FB_OK);
	}
	assert_int_equal(fb_secagg_worker_make_shares(*in.sa, out, cap, len),
	    FB_OK);
}

/* SecAgg step 2: neighbours' adverts in, shares out. */
static void
sa_share_as(uint32_t i, fake_inst in)
{
	uint8_t out[MAXW * FB_SECAGG_SHARE_MSG_LEN];
	size_t out_len = 0;

	sa_peers_in(i, in, out, sizeof(out), &out_len);
	send_sa_as(i, in, FB_SA_SHARES,
	    (uint32_t)(out_len / FB_SECAGG_SHARE_MSG_LEN), out, out_len);
}

/* SecAgg step 3: relayed shares in, masks fixed. */
static void
sa_take_shares_as(uint32_t i, fake_inst in)
{
	const sent *s = next_sa_as(i, in, FB_SA_RELAY);

	for (uint32_t k = 0; k < s->m.u.secagg.count; k++) {
		assert_int_equal(fb_secagg_worker_add_share(*in.sa,
		                     s->payload + (size_t)k * FB_SECAGG_SHARE_MSG_LEN,
		                     FB_SECAGG_SHARE_MSG_LEN),
		    FB_OK);
	}
	assert_int_equal(fb_secagg_worker_mask_begin(*in.sa), FB_OK);
}

static void
sa_advertise(uint32_t i, const fb_msg *rs)
{
	sa_keys_as(i, own_inst(i), rs);
}

static void
sa_share(uint32_t i)
{
	sa_share_as(i, own_inst(i));
}

static void
sa_take_shares(uint32_t i)
{
	sa_take_shares_as(i, own_inst(i));
}

/* SecAgg step 4: the included set, signed (or, with `other`, a set with
 * `other`'s bit flipped: a worker told another set than the rest). */
static void
sa_confirm_as(uint32_t i, int other)
{
	fake_worker *fw = &t.fw[i];
	const sent *s = next_to(i, FB_MSG_SECAGG);
	uint8_t conf[FB_SECAGG_CONFIRM_LEN], set[MAXW];

	assert_non_null(s);
	assert_int_equal(s->m.u.secagg.phase, FB_SA_INCLUDED);
	assert_int_equal(s->len, fw->sa_n);
	memcpy(set, s->payload, fw->sa_n);
	if (other >= 0) {
		set[other] = !set[other];
	}
	assert_int_equal(
	    fb_secagg_worker_confirm(fw->sa, fw->id, set, fw->sa_n, conf),
	    FB_OK);
	send_secagg(i, FB_SA_CONFIRM, 1, conf, sizeof(conf));
}

static void
sa_confirm(uint32_t i)
{
	sa_confirm_as(i, -1);
}

/* SecAgg step 5: the neighbours' confirmations in, the shares out. */
static void
sa_reveal(uint32_t i)
{
	fake_worker *fw = &t.fw[i];
	const sent *s = next_to(i, FB_MSG_SECAGG);
	uint8_t out[FB_SECAGG_REVEAL_HEADER_LEN +
	    MAXW * FB_SECAGG_REVEAL_ENTRY_LEN];
	size_t len = 0;

	assert_non_null(s);
	assert_int_equal(s->m.u.secagg.phase, FB_SA_CONFIRMS);
	assert_int_equal(s->len, s->m.u.secagg.count * FB_SECAGG_CONFIRM_LEN);
	for (uint32_t k = 0; k < s->m.u.secagg.count; k++) {
		assert_int_equal(
		    fb_secagg_worker_add_confirm(fw->sa,
		        s->payload + (size_t)k * FB_SECAGG_CONFIRM_LEN,
		        FB_SECAGG_CONFIRM_LEN),
		    FB_OK);
	}
	assert_int_equal(
	    fb_secagg_worker_reveal(fw->sa, out, sizeof(out), &len), FB_OK);
	send_secagg(i, FB_SA_REVEAL, 1, out, len);
}

/* Steps 4 and 5 for the workers in `who` (a bit mask). */
static void
sa_fake_unmask(uint32_t who)
{
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			sa_confirm(i);
		}
	}
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			sa_reveal(i);
		}
	}
}

/* The chunk of the upload at position pos: its index and plaintext. */
static uint32_t
upload_chunk(uint32_t i, uint32_t pos, uint32_t *buf, size_t *len,
    const float *x)
{
	fake_worker *fw = &t.fw[i];
	uint32_t chunks = t.c->chunk_count;
	uint32_t k = fb_upload_chunk(fw->first_chunk, chunks, pos);
	uint64_t off = (uint64_t)k * (CHUNK_BYTES / 4);
	uint64_t n;

	/* its SecAgg weight: n / max_samples, times 1/sqrt(1 + s) for the
	 * staleness s of its first credit (0 in synchronous rounds) */
	double w = (double)fw->samples / 1000.0 / sqrt(1.0 + io.stale[i]);

	if (k == chunks) { /* SecAgg extras */
		fb_secagg_eval ev = {.v = (double)fw->ev_n / 1000.0,
		    .loss = fw->ev_loss, .accuracy = fw->ev_acc};
		assert_int_equal(fb_secagg_encode_extras(&fw->enc, w, fw->loss,
		                     fw->a_norm, &ev, PARAMS, 7 + i, buf),
		    FB_OK);
		buf[0] += fw->evil_w;
		assert_int_equal(fb_secagg_worker_mask_chunk(fw->sa, buf, PARAMS,
		                     SA_EXTRA),
		    FB_OK);
		*len = SA_EXTRA * 4;
		return k;
	}
	n = PARAMS - off < CHUNK_BYTES / 4 ? PARAMS - off : CHUNK_BYTES / 4;
	*len = n * 4;
	if (t.sa) {
		assert_int_equal(fb_encode_chunk(&fw->enc.x, x + off, n, w, off,
		                     7 + i, buf, NULL),
		    FB_OK);
		for (uint64_t j = 0; j < n; j++) {
			buf[j] += fw->evil_add;
		}
		assert_int_equal(fb_secagg_worker_mask_chunk(fw->sa, buf, off, n),
		    FB_OK);
	} else {
		memcpy(buf, x + off, n * 4);
	}
	return k;
}

/* Worker i's UpdateBegin for update `x` (its stream made in secure
 * mode); upload_more sends its chunks. */
static void
upload_begin(uint32_t i, const float *x)
{
	fake_worker *fw = &t.fw[i];
	fb_msg b = {.type = FB_MSG_UPDATE_BEGIN};

	fb_stream_push_free(fw->push);
	fw->push = NULL;
	fw->x = x;
	fw->pos = 0;
	fw->credit = 0;
	io.weighed[i] = false;
	io.stale[i] = 0;
	b.u.update_begin.round = fw->round;
	b.u.update_begin.param_count = PARAMS;
	b.u.update_begin.chunk_count = t.c->chunk_count + (t.sa ? 1 : 0);
	if (!t.sa || fw->leak_speed) {
		/* (a secure worker keeps its speed; one that does not is
		 * not listened to) */
		b.u.update_begin.steps_per_second = 10;
	}
	if (!t.sa) {
		b.u.update_begin.num_samples = fw->samples;
		b.u.update_begin.steps = 5;
		b.u.update_begin.train_loss = fw->loss;
		b.u.update_begin.a_norm = fw->a_norm;
		b.u.update_begin.eval_examples = fw->ev_n;
		b.u.update_begin.eval_loss = fw->ev_loss;
		b.u.update_begin.eval_accuracy = fw->ev_acc;
	}
	if (t.secure) {
		fb_stream_ctx ctx = {.run = t.c->run, .round = fw->round,
		    .sender = i};
		assert_int_equal(fb_stream_push_alloc(&ctx, CHUNK_BYTES,
		                     fw->old_stream ? FB_STREAM_DIGEST_TAGS
		                                    : FB_STREAM_DIGEST_INDEXED_TAGS,
		                     b.u.update_begin.stream_key.b,
		                     b.u.update_begin.stream_header.b, &fw->push),
		    FB_OK);
		b.u.update_begin.stream_key.len = FB_STREAM_KEY_LEN;
		b.u.update_begin.stream_header.len = FB_STREAM_HEADER_LEN;
	}
	deliver(i, &b, NULL, 0);
}

/*
 * Worker i sends the chunks of the update it began, as far as its credit
 * goes, up to position `stop_at` (UINT32_MAX: all, then the trailer in
 * secure mode). Returns true once the whole update is sent.
 */
static bool
upload_more(uint32_t i, uint32_t stop_at)
{
	fake_worker *fw = &t.fw[i];
	uint32_t chunks = t.c->chunk_count + (t.sa ? 1 : 0);
	static uint32_t plain[CHUNK_BYTES / 4];
	static uint8_t ct[CHUNK_BYTES + FB_STREAM_CHUNK_OVERHEAD];

	while (fw->pos < chunks && fw->pos < stop_at) {
		fb_msg m = {.type = FB_MSG_UPDATE_CHUNK};
		size_t len = 0, clen = 0;
		/* a chunk goes only on the coordinator's credit (none: the
		 * begin was refused, or it waits) */
		fw->credit += take_credits(i);
		if (fw->credit == 0) {
			return false;
		}
		m.u.update_chunk.round = fw->round;
		m.u.update_chunk.chunk = upload_chunk(i, fw->pos, plain, &len,
		    fw->x);
		if (t.secure) {
			assert_int_equal(fb_stream_push_chunk(fw->push,
			                     (const uint8_t *)plain, len,
			                     fw->pos + 1 == chunks, ct, sizeof(ct),
			                     &clen),
			    FB_OK);
			deliver(i, &m, ct, clen);
		} else {
			deliver(i, &m, plain, len);
		}
		fw->pos++;
		fw->credit--;
	}
	if (fw->pos < chunks) {
		return false;
	}
	if (t.secure && stop_at == UINT32_MAX) {
		fb_msg e = {.type = FB_MSG_UPDATE_END};
		e.u.update_end.round = fw->round;
		assert_int_equal(fb_stream_push_final(fw->push, fw->id,
		                     e.u.update_end.stream_trailer.b),
		    FB_OK);
		e.u.update_end.stream_trailer.len = FB_STREAM_TRAILER_LEN;
		deliver(i, &e, NULL, 0);
	}
	fb_stream_push_free(fw->push);
	fw->push = NULL;
	return true;
}

/*
 * Worker i uploads `x` (its update), stopping after `stop_after` chunks
 * (UINT32_MAX: all, and the trailer). Encrypted and signed in secure mode.
 */
static void
upload(uint32_t i, const float *x, uint32_t stop_after)
{
	upload_begin(i, x);
	(void)upload_more(i, stop_after);
}

/* Runs the SecAgg setup for the workers in `who` (a bit mask). */
static void
sa_setup(uint32_t who)
{
	const fb_msg *rs[MAXW] = {0};

	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			rs[i] = t.fw[i].rs != NULL ? t.fw[i].rs : take_round_start(i);
			assert_non_null(rs[i]);
			sa_advertise(i, rs[i]);
		}
	}
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			sa_share(i);
		}
	}
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			sa_take_shares(i);
		}
	}
}

/* ---- what the round did -------------------------------------------------- */

/* The expected model after a FedAvg round over the workers in `who`:
 * start - sum_i p_i x_i, p from fb_fedavg_weights (checked against n_i /
 * sum n here, too). Returns the largest deviation of the coordinator's
 * model from it. */
static double
fedavg_error(uint32_t who, double scale)
{
	uint64_t n[MAXW];
	double w[MAXW], err = 0, total = 0;
	uint32_t k = 0, idx[MAXW];

	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			n[k] = t.fw[i].samples;
			total += (double)n[k];
			idx[k++] = i;
		}
	}
	assert_int_equal(fb_fedavg_weights(n, k, w), FB_OK);
	for (uint32_t j = 0; j < PARAMS; j++) {
		double mean = 0;
		for (uint32_t s = 0; s < k; s++) {
			assert_true(fabs(w[s] - (double)n[s] / total) < 1e-15);
			mean += w[s] * t.fw[idx[s]].update[j];
		}
		double want = t.start[j] - scale * mean;
		double d = fabs((double)t.c->params[j] - want);
		err = d > err ? d : err;
	}
	return err;
}

/* The last line of metrics.jsonl. */
static void
last_metrics(char *line, size_t cap)
{
	FILE *f = fopen(t.c->metrics_path, "r");
	char buf[16384];

	line[0] = '\0';
	assert_non_null(f);
	while (fgets(buf, sizeof(buf), f) != NULL) {
		snprintf(line, cap, "%s", buf);
	}
	fclose(f);
}

static uint32_t
metrics_lines(void)
{
	FILE *f = fopen(t.c->metrics_path, "r");
	uint32_t n = 0;
	int ch;

	if (f == NULL) {
		return 0;
	}
	while ((ch = fgetc(f)) != EOF) {
		n += ch == '\n';
	}
	fclose(f);
	return n;
}

/* Whether the phases `want` were entered in this order (others between
 * them allowed: several may pass in one turn). */
static bool
trace_has(const round_phase *want, uint32_t n)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < t.ntrace && k < n; i++) {
		k += t.trace[i] == want[k];
	}
	return k == n;
}

#define assert_phase(p)                                                   \
	do {                                                              \
		if (t.c->rd.phase != (p)) {                               \
			fail_msg("phase %s, want %s",                     \
			    round_phase_names[t.c->rd.phase],             \
			    round_phase_names[p]);                        \
		}                                                         \
	} while (0)

/* ---- tests --------------------------------------------------------------- */

/* A plain round: IDLE until enough workers, TRAIN, then AGGREGATE and
 * RECORD inline (jobs run on the caller), back to IDLE for round 2; the
 * commit is start - sum p_i x_i with p_i = n_i / sum n. */
static void
test_plain_round_phases_and_fedavg(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3});
	assert_phase(PHASE_IDLE);
	hello(0);
	hello(1);
	advance(200);
	assert_phase(PHASE_IDLE); /* 2 of 3 */
	hello(2);
	assert_phase(PHASE_TRAIN);
	for (uint32_t i = 0; i < 3; i++) {
		const fb_msg *rs = take_round_start(i);
		assert_non_null(rs);
		assert_int_equal(rs->u.round_start.round, 1);
		assert_int_equal(rs->u.round_start.local_steps, 5);
		assert_false(rs->u.round_start.secagg);
		/* the weight the round gives it is the library's */
		assert_true(fabs(t.c->reg.workers[i].weight -
		                (double)t.fw[i].samples / 600.0) < 1e-15);
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_phase(PHASE_TRAIN);
	upload(2, t.fw[2].update, UINT32_MAX);
	/* all three in: the round committed and the next one began */
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(t.c->rd.number, 2);
	assert_phase(PHASE_TRAIN);
	{
		static const round_phase want[] = {PHASE_TRAIN, PHASE_AGGREGATE,
		    PHASE_RECORD, PHASE_TRAIN};
		assert_true(trace_has(want, FB_ARRAY_LEN(want)));
	}
	assert_true(fedavg_error(7, 1.0) < 3 * 16.0 / 1073741824.0 + 1e-6);
	assert_int_equal(metrics_lines(), 1);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"round\": 1,"));
	assert_non_null(strstr(line, "\"status\": \"ok\""));
	assert_non_null(strstr(line, "\"participants\": 3"));
	assert_non_null(strstr(line, "\"time\": \""));
	bench_stop();
}

/* Each worker's validation set, as counts: n_i examples, c_i of them
 * right, loss sum s_i. The union's accuracy and loss, computed from the
 * integer counts (not through the code under test's weighting). */
static const uint64_t ev_n[3] = {120, 380, 0};
static const uint64_t ev_correct[3] = {90, 301, 0};
static const double ev_loss_sum[3] = {61.5, 140.6, 0};

static void
fedeval_give(void)
{
	for (uint32_t i = 0; i < 3; i++) {
		t.fw[i].ev_n = ev_n[i];
		t.fw[i].ev_acc = ev_n[i] ? (double)ev_correct[i] / ev_n[i] : 0;
		t.fw[i].ev_loss = ev_n[i] ? ev_loss_sum[i] / ev_n[i] : 0;
	}
}

static void
fedeval_run_round(void)
{
	hello(0);
	hello(1);
	hello(2);
	if (t.sa) {
		sa_setup(7);
	} else {
		for (uint32_t i = 0; i < 3; i++) {
			assert_non_null(take_round_start(i));
		}
	}
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	if (t.sa) {
		sa_fake_unmask(0x7);
	}
	assert_int_equal(t.c->rd.committed, 1);
}

/* A plain round's metrics line holds the federated evaluation: the
 * sample-weighted means over the reports, which are the union's. */
static void
test_plain_round_federated_evaluation(void **state)
{
	char line[16384], want[128];
	double acc = (90.0 + 301.0) / 500.0, loss = (61.5 + 140.6) / 500.0;

	bench_start(&(setup){.workers = 3});
	fedeval_give();
	fedeval_run_round();
	/* the record of round 1 (round 2 has begun and reset rd.r) */
	last_metrics(line, sizeof(line));
	snprintf(want, sizeof(want), "\"fed_eval\": {\"workers\": 2, "
	    "\"examples\": 500, \"loss\": %.6f, \"accuracy\": %.6f}",
	    loss, acc);
	assert_non_null(strstr(line, want));
	bench_stop();
}

/* Under secure aggregation the evaluation comes only as masked sums; the
 * decoded means are the union's within the encoding's bound, and no
 * worker's own count is in the metrics line. */
static void
test_secure_round_federated_evaluation(void **state)
{
	char line[16384];
	double acc = (90.0 + 301.0) / 500.0, loss = (61.5 + 140.6) / 500.0;
	double got_acc = 0, got_loss = 0, got_n = 0;
	const char *p;

	bench_start(&(setup){.workers = 3, .secure = true});
	fedeval_give();
	fedeval_run_round();
	last_metrics(line, sizeof(line));
	p = strstr(line, "\"fed_eval\": {\"workers\": 3, ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "\"fed_eval\": {\"workers\": 3, "
	                     "\"examples\": %lf, \"loss\": %lf, "
	                     "\"accuracy\": %lf", &got_n, &got_loss, &got_acc),
	    3);
	assert_true(got_n == 500);
	/* v = n / 1000 (max_samples), 3 inputs: bounds 3 / S over V = 0.5 */
	assert_true(fabs(got_acc - acc) < 1e-6);
	assert_true(fabs(got_loss - loss) < 1e-3);
	assert_null(strstr(line, "\"examples\": 120"));
	assert_null(strstr(line, "\"examples\": 380"));
	bench_stop();
}

/* evaluation.federated_final: after the last round, one round that only
 * evaluates (secure here): RoundStart says so, the zero updates are summed
 * for the evaluation but the model is not stepped, and the last metrics
 * line is marked final. */
static void
test_final_round_only_evaluates(void **state)
{
	static float after1[PARAMS], zero[PARAMS];
	char line[16384];
	double acc = (90.0 + 301.0) / 500.0, got = 0;
	const char *p;

	bench_start(&(setup){.workers = 3, .secure = true});
	t.cfg.rounds = 1;
	t.cfg.fed_final = true;
	fedeval_give();
	fedeval_run_round();
	assert_int_equal(t.c->rd.number, 2);
	assert_true(t.c->rd.final);
	memcpy(after1, t.c->params, sizeof(after1));
	for (uint32_t i = 0; i < 3; i++) {
		const fb_msg *rs = take_round_start(i);
		assert_non_null(rs);
		assert_int_equal(rs->u.round_start.round, 2);
		assert_true(rs->u.round_start.evaluate_only);
	}
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, zero, UINT32_MAX);
	}
	sa_fake_unmask(0x7);
	assert_phase(PHASE_DONE);
	assert_int_equal(t.c->rd.committed, 1);
	assert_memory_equal(t.c->params, after1, sizeof(after1));
	assert_int_equal(metrics_lines(), 2);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "{\"round\": 2, \"final\": true, "));
	p = strstr(line, "\"accuracy\": ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "\"accuracy\": %lf", &got), 1);
	assert_true(fabs(got - acc) < 1e-6);
	bench_stop();
}

/* A report with an accuracy above 1 (a hostile or broken worker) is left
 * out; the others' still count. */
static void
test_plain_bad_evaluation_left_out(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3});
	fedeval_give();
	t.fw[1].ev_acc = 3.0;
	fedeval_run_round();
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"fed_eval\": {\"workers\": 1, "
	                             "\"examples\": 120, "));
	bench_stop();
}

/* IDLE gives up after round.wait_for_workers: the run ends with
 * FB_ETIMEDOUT, no round line. */
static void
test_idle_waits_then_times_out(void **state)
{
	bench_start(&(setup){.workers = 3});
	hello(0);
	advance(59000);
	assert_phase(PHASE_IDLE);
	advance(2000);
	assert_phase(PHASE_DONE);
	assert_int_equal(t.c->rd.exit_rc, FB_ETIMEDOUT);
	assert_int_equal(metrics_lines(), 0);
	bench_stop();
}

/* A worker lost in TRAIN (liveness: silence) leaves the round; the round
 * commits with the other two, and the lost one's slot is freed. */
static void
test_worker_lost_in_training(void **state)
{
	bench_start(&(setup){.workers = 3});
	admit_all();
	assert_phase(PHASE_TRAIN);
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	/* w0 and w1 keep talking; w2 goes silent past the 5 s liveness */
	for (int s = 0; s < 6; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		deliver(1, &hb, NULL, 0);
		deliver(0, &hb, NULL, 0);
		advance(1000);
	}
	assert_false(t.c->reg.workers[2].used);
	assert_phase(PHASE_TRAIN); /* w1 still training */
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-6);
	bench_stop();
}

/* A worker that cannot train says so (RoundFailed): it leaves the round
 * at once, with its reason in the record, and stays connected; the round
 * commits with the others without waiting. One for another round changes
 * nothing. */
static void
test_worker_round_failed_plain(void **state)
{
	char line[16384];
	fb_msg f = {.type = FB_MSG_ROUND_FAILED};
	uint64_t stale;

	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	stale = t.c->g.drops[DROP_STALE_ROUND];
	f.u.round_failed.round = t.c->rd.number + 1;
	snprintf(f.u.round_failed.reason, sizeof(f.u.round_failed.reason),
	    "not this round");
	deliver(2, &f, NULL, 0);
	assert_int_equal(t.c->g.drops[DROP_STALE_ROUND], stale + 1);
	assert_int_equal(t.c->reg.workers[2].state, W_TRAINING);
	f.u.round_failed.round = t.c->rd.number;
	snprintf(f.u.round_failed.reason, sizeof(f.u.round_failed.reason),
	    "training failed: the trainer exited with status 1");
	deliver(2, &f, NULL, 0);
	assert_int_equal(t.c->reg.workers[2].state, W_FAILED);
	assert_true(t.c->reg.workers[2].used);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1); /* no clock advanced */
	assert_true(fedavg_error(3, 1.0) < 1e-6);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"reason\": \"failed on the worker: "
	                             "training failed: the trainer exited "
	                             "with status 1\""));
	/* the next round has it again */
	turn();
	assert_int_equal(t.c->rd.number, 2);
	assert_int_equal(t.c->reg.workers[2].state, W_TRAINING);
	bench_stop();
}

/* A worker cut off mid-upload in plain mode (the deadline passes during
 * its upload): its chunks stay in (per coordinate averaging), it is
 * "partial", the round commits with the others. */
static void
test_worker_cut_mid_upload_plain(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(2, t.fw[2].update, 1);
	assert_int_equal(t.c->reg.workers[2].state, W_UPLOADING);
	for (int s = 0; s < 11; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(count_to(2, FB_MSG_ROUND_CANCEL), 1);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"partial\": 1"));
	assert_non_null(strstr(line, "deadline passed during upload"));
	bench_stop();
}

/* A worker lost mid-upload (its connection forgotten): its slot goes,
 * the round commits with the others. */
static void
test_worker_lost_mid_upload_plain(void **state)
{
	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(2, t.fw[2].update, 2);
	registry_forget(t.c, &t.c->reg.workers[2], "test: connection lost");
	turn();
	assert_int_equal(t.c->rd.committed, 1);
	assert_false(t.c->reg.workers[2].used);
	bench_stop();
}

/* The deadline (drop policy): a worker that never uploads is cancelled
 * with a RoundCancel and the round commits with the others. */
static void
test_deadline_drops_stragglers(void **state)
{
	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	for (int s = 0; s < 9; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_int_equal(t.c->rd.committed, 0);
	advance(1100);
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(count_to(2, FB_MSG_ROUND_CANCEL), 1);
	assert_true(fedavg_error(3, 1.0) < 1e-6);
	bench_stop();
}

/* Stragglers `wait`: past the deadline the round is in OVERTIME and
 * commits with the late update too. */
static void
test_stragglers_wait(void **state)
{
	bench_start(&(setup){.workers = 3, .extra = "  stragglers: wait\n"});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	for (int s = 0; s < 14; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_phase(PHASE_OVERTIME);
	assert_int_equal(count_to(2, FB_MSG_ROUND_CANCEL), 0);
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	bench_stop();
}

/* The quorum: with min_updates 2, one update at the deadline fails the
 * round; the model is unchanged and the metrics line says why. */
static void
test_quorum_not_met_fails_round(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	for (int s = 0; s < 11; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_int_equal(t.c->rd.committed, 0);
	assert_int_equal(t.c->rd.number, 2);
	assert_memory_equal(t.c->params, t.start, sizeof(t.start));
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"status\": \"failed\""));
	assert_non_null(strstr(line, "round.min_updates"));
	bench_stop();
}

/* Over-selection: 2 per round and 1 extra: 3 start, the first 2 updates
 * are kept, the third worker is told to stop. */
static void
test_over_selection_keeps_first(void **state)
{
	bench_start(&(setup){.workers = 3,
	    .extra = "  workers_per_round: 2\n  over_select: 1\n"});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	assert_int_equal(t.c->rd.target_updates, 2);
	upload(2, t.fw[2].update, UINT32_MAX);
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(count_to(1, FB_MSG_ROUND_CANCEL), 1);
	assert_true(fedavg_error(5, 1.0) < 1e-6);
	bench_stop();
}

/* FedNova, plain: the server steps by tau_eff = sum p_i a_i / sum p_i
 * (fb_fednova_tau_eff) times the mean of the normalised updates. */
static void
test_fednova_plain_scale(void **state)
{
	double p[2], a[2] = {3.0, 7.0}, tau = 0;

	bench_start(&(setup){.workers = 2, .extra = "",
	    .agg_extra = "  rule: fednova\n"});
	t.fw[0].a_norm = a[0];
	t.fw[1].a_norm = a[1];
	admit_all();
	for (uint32_t i = 0; i < 2; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	p[0] = 100.0 / 300.0;
	p[1] = 200.0 / 300.0;
	assert_int_equal(fb_fednova_tau_eff(p, a, 2, &tau), FB_OK);
	assert_true(fabs(t.c->rd.tau_eff - tau) < 1e-12);
	assert_true(fedavg_error(3, tau) < 1e-5);
	bench_stop();
}

/* A secure round: PREPARE (the model encrypted once), TRAIN with the
 * SecAgg setup, UNMASK, AGGREGATE, RECORD; the commit matches the plain
 * weighted mean within the quantisation bound. The model chunks a worker
 * fetches decrypt under the round key and carry the coordinator's
 * signature. */
static void
test_secure_round_phases(void **state)
{
	const fb_msg *rs;
	fb_stream_pull *pull = NULL;
	fb_reject why;

	bench_start(&(setup){.workers = 3, .secure = true});
	hello(0);
	hello(1);
	hello(2);
	/* the model was encrypted (PREPARE) before RoundStart went out; a
	 * small model's ciphertext is kept (transport.model_cache auto) */
	assert_phase(PHASE_TRAIN);
	assert_false(t.c->bc.on_fetch);
	assert_non_null(t.c->bc.lent);
	assert_true(t.ntrace >= 2);
	assert_int_equal(t.trace[0], PHASE_PREPARE);
	assert_int_equal(t.trace[1], PHASE_TRAIN);
	assert_int_equal(t.c->sa->phase, SA_ADVERTS);
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	/* worker 0 fetches the model and checks it */
	rs = t.fw[0].rs;
	{
		fb_stream_ctx ctx = {.run = t.c->run, .round = 1,
		    .sender = FB_SENDER_COORDINATOR};
		static uint8_t m[CHUNK_BYTES];
		size_t off = 0;
		fb_pubkey pk;
		assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
		                     rs->u.round_start.round_key.b,
		                     rs->u.round_start.stream_header.b,
		                     FB_STREAM_HEADER_LEN, CHUNK_BYTES, &pull, &why),
		    FB_OK);
		for (uint32_t k = 0; k < t.c->chunk_count; k++) {
			fb_msg f = {.type = FB_MSG_MODEL_FETCH};
			const sent *ch;
			size_t mlen = 0;
			int fin = 0;
			f.u.model_fetch.round = 1;
			f.u.model_fetch.chunk = k;
			t.fw[0].round = 1;
			deliver(0, &f, NULL, 0);
			ch = next_to(0, FB_MSG_MODEL_CHUNK);
			assert_non_null(ch);
			assert_int_equal(fb_stream_pull_chunk(pull, ch->payload,
			                     ch->len, m, sizeof(m), &mlen, &fin, &why),
			    FB_OK);
			assert_memory_equal(m, (uint8_t *)t.start + off, mlen);
			off += mlen;
		}
		fb_identity_pubkey(t.self, &pk);
		assert_int_equal(fb_stream_pull_final(pull, &pk,
		                     rs->u.round_start.stream_trailer.b,
		                     FB_STREAM_TRAILER_LEN, NULL, &why),
		    FB_OK);
		fb_stream_pull_free(pull);
	}
	sa_setup(7);
	assert_int_equal(t.c->sa->phase, SA_INPUT);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(t.c->rd.number, 2);
	{
		static const round_phase want[] = {PHASE_PREPARE, PHASE_TRAIN,
		    PHASE_UNMASK, PHASE_AGGREGATE, PHASE_RECORD, PHASE_TRAIN};
		assert_true(trace_has(want, FB_ARRAY_LEN(want)));
	}
	/* 3 workers, clip 4: within the encoding's bound on the weighted
	 * sum (3 / 2^27) over the weight sum 0.6, and float rounding */
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	bench_stop();
}

/* ---- secure_aggregation.setup_ahead -------------------------------------- */

/* SETUP in: fresh keys for that round, the advert out (flagged ahead). */
static void
ahead_advertise(uint32_t i)
{
	const sent *s = next_sa_as(i, ahead_inst(i), FB_SA_SETUP);
	fb_msg *rs = &ahead_fw[i].params;

	memset(rs, 0, sizeof(*rs));
	assert_int_equal(fb_sa_setup_unpack(s->payload, s->len, rs), FB_OK);
	rs->u.round_start.round = s->m.u.secagg.round;
	ahead_fw[i].round = s->m.u.secagg.round;
	ahead_fw[i].slot = rs->u.round_start.sa_slot;
	sa_keys_as(i, ahead_inst(i), rs);
}

/* The next round's setup, ahead, for the workers in `who`. */
static void
ahead_setup(uint32_t who)
{
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			ahead_advertise(i);
		}
	}
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			sa_share_as(i, ahead_inst(i));
		}
	}
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			sa_take_shares_as(i, ahead_inst(i));
		}
	}
}

/* That round's RoundStart: it says the setup was made ahead, with the
 * very parameters of the SETUP, and the fake masks with that instance. */
static void
ahead_install(uint32_t i)
{
	const fb_msg *rs = take_round_start(i);
	const fb_msg *a = &ahead_fw[i].params;

	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, ahead_fw[i].round);
	assert_true(rs->u.round_start.secagg);
	assert_true(rs->u.round_start.sa_set_up);
	assert_int_equal(rs->u.round_start.sa_slot, ahead_fw[i].slot);
	assert_int_equal(rs->u.round_start.sa_n, a->u.round_start.sa_n);
	assert_int_equal(rs->u.round_start.sa_threshold,
	    a->u.round_start.sa_threshold);
	assert_memory_equal(rs->u.round_start.sa_graph_seed.b,
	    a->u.round_start.sa_graph_seed.b, 32);
	fb_secagg_worker_free(t.fw[i].sa);
	t.fw[i].sa = ahead_fw[i].sa;
	t.fw[i].enc = ahead_fw[i].enc;
	t.fw[i].sa_n = ahead_fw[i].n;
	ahead_fw[i].sa = NULL;
}

static void
ahead_free(void)
{
	for (uint32_t i = 0; i < MAXW; i++) {
		fb_secagg_worker_free(ahead_fw[i].sa);
		memset(&ahead_fw[i], 0, sizeof(ahead_fw[i]));
	}
}

/*
 * secure_aggregation.setup_ahead: once round 1's own setup is done, round
 * 2 is set up among the three workers (SETUP, adverts, shares: all
 * flagged ahead, all bound to round 2) while round 1 goes on and commits;
 * round 2's RoundStart says so, it takes no advert, its masked inputs
 * stream in at once, and it commits their weighted average. Its metrics
 * line says the setup was made ahead; round 1's says it was not.
 */
static void
test_secure_round_set_up_ahead(void **state)
{
	char line[8192];

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  setup_ahead: true\n"});
	admit_all();
	assert_phase(PHASE_TRAIN);
	assert_int_equal(t.c->sa_ahead.phase, SA_OFF);
	sa_setup(7);
	/* round 1's setup done, but the round is young: no setup yet */
	assert_int_equal(t.c->sa_ahead.phase, SA_OFF);
	/* 50 ms into the round (AHEAD_AFTER_MS): round 2's begins */
	advance(50);
	assert_int_equal(t.c->sa_ahead.phase, SA_ADVERTS);
	assert_int_equal(t.c->sa_ahead.p.round, 2);
	ahead_setup(7);
	assert_int_equal(t.c->sa_ahead.phase, SA_INPUT);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"set_up_ahead\": false"));
	/* round 2: taken as it was set up */
	assert_phase(PHASE_TRAIN);
	assert_int_equal(t.c->rd.number, 2);
	assert_true(t.c->rd.set_up_ahead);
	assert_int_equal(t.c->sa->phase, SA_INPUT);
	memcpy(t.start, t.c->params, sizeof(t.start));
	for (uint32_t i = 0; i < 3; i++) {
		ahead_install(i);
	}
	/* round 3's setup goes on beside it, once round 2 is 50 ms old */
	assert_int_equal(t.c->sa_ahead.phase, SA_OFF);
	advance(50);
	assert_int_equal(t.c->sa_ahead.p.round, 3);
	ahead_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		/* neighbours' adverts: round 1's, 2's and 3's, none of them
		 * in round 2 itself */
		assert_int_equal(count_sa(i, FB_SA_PEERS), 3);
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"set_up_ahead\": true"));
	assert_non_null(strstr(line, "\"included\": 3"));
	ahead_free();
	bench_stop();
}

/*
 * A worker lost after its shares for round 2 went out, before round 2
 * begins: round 2 is still taken as set up (every live worker is in it)
 * and the lost one is its dropout, its masks recovered from the others'
 * shares; the round commits the average of the other two. A worker that
 * comes back in a new session is out of the setup it made in its old
 * one, so round 3 sets up in the round, with all three.
 */
static void
test_secure_ahead_dropout_and_return(void **state)
{
	char line[8192];

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n  setup_ahead: true\n"});
	admit_all();
	sa_setup(7);
	advance(50);
	ahead_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	/* round 2 began at once, set up ahead; worker 2 is lost in it */
	assert_int_equal(t.c->rd.number, 2);
	assert_true(t.c->rd.set_up_ahead);
	memcpy(t.start, t.c->params, sizeof(t.start));
	for (uint32_t i = 0; i < 3; i++) {
		ahead_install(i);
	}
	/* round 3's setup starts among the three; worker 2 is lost before
	 * its advert, so the other two go on without it */
	advance(50);
	assert_int_equal(t.c->sa_ahead.p.round, 3);
	registry_forget(t.c, &t.c->reg.workers[2], "test: lost");
	ahead_setup(3);
	assert_int_equal(t.c->sa_ahead.phase, SA_INPUT);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(3);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"set_up_ahead\": true"));
	assert_non_null(strstr(line, "\"included\": 2"));
	/* worker 2 is back in a new session: round 3 sets up afresh */
	hello_on(2, 0x5e55, 2);
	advance(10);
	while (t.c->rd.phase == PHASE_IDLE && t.c->rd.number == 3) {
		advance(100);
	}
	assert_int_equal(t.c->rd.number, 3);
	assert_false(t.c->rd.set_up_ahead);
	assert_int_equal(t.c->sa->phase, SA_ADVERTS);
	ahead_free();
	bench_stop();
}

/*
 * Round 1 ends while round 2's setup still waits for worker 2's shares:
 * the coordinator waits for it (no fresh setup, no round started) and
 * begins round 2, taking it as set up, the moment those shares are in.
 */
static void
test_secure_round_waits_for_its_setup(void **state)
{
	uint8_t late[MAXW * FB_SECAGG_SHARE_MSG_LEN];
	size_t late_len = 0;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  setup_ahead: true\n"});
	admit_all();
	sa_setup(7);
	advance(50);
	for (uint32_t i = 0; i < 3; i++) {
		ahead_advertise(i);
	}
	sa_share_as(0, ahead_inst(0));
	sa_share_as(1, ahead_inst(1));
	/* worker 2 takes its neighbours' adverts; its shares wait */
	sa_peers_in(2, ahead_inst(2), late, sizeof(late), &late_len);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	advance(200);
	assert_phase(PHASE_IDLE);
	assert_int_equal(t.c->rd.number, 2);
	assert_int_equal(t.c->sa_ahead.phase, SA_SHARES);
	assert_int_equal(count_to(0, FB_MSG_ROUND_START), 1);
	/* the shares come: round 2 begins, set up ahead */
	send_sa_as(2, ahead_inst(2), FB_SA_SHARES,
	    (uint32_t)(late_len / FB_SECAGG_SHARE_MSG_LEN), late, late_len);
	assert_phase(PHASE_TRAIN);
	assert_true(t.c->rd.set_up_ahead);
	assert_int_equal(t.c->sa->phase, SA_INPUT);
	for (uint32_t i = 0; i < 3; i++) {
		sa_take_shares_as(i, ahead_inst(i));
		ahead_install(i);
	}
	ahead_free();
	bench_stop();
}

/*
 * A round whose masked inputs are all in before it is 50 ms old (a small
 * model's): the next round is not set up while it runs, where the
 * setup's messages would take the loops its own inputs and reveals need,
 * but once its sum is in; the next round waits for that setup and is
 * taken as it was set up.
 */
static void
test_secure_short_round_sets_up_after_its_sum(void **state)
{
	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  setup_ahead: true\n"});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	assert_int_equal(t.c->sa_ahead.phase, SA_OFF);
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	/* set up once round 1's sum was in; round 2 waits for it */
	assert_int_equal(t.c->sa_ahead.p.round, 2);
	assert_int_equal(t.c->sa_ahead.phase, SA_ADVERTS);
	assert_phase(PHASE_IDLE);
	ahead_setup(7);
	assert_phase(PHASE_TRAIN);
	assert_int_equal(t.c->rd.number, 2);
	assert_true(t.c->rd.set_up_ahead);
	assert_int_equal(t.c->sa->phase, SA_INPUT);
	for (uint32_t i = 0; i < 3; i++) {
		ahead_install(i);
	}
	ahead_free();
	bench_stop();
}

/* ---- transport.model_cache seal_on_fetch --------------------------------- */

/* The slot worker `slot` stays in among the fake's sends. */
static void
release_held(uint32_t slot)
{
	io.hold[slot] = false;
	for (uint32_t i = 0; i < io.n; i++) {
		if (io.v[i].to == slot) {
			fb_lent_free(io.v[i].held);
			io.v[i].held = NULL;
		}
	}
}

/* Worker i asks for chunks [first, end) of its round's model at once. */
static void
fetch_chunks(uint32_t i, uint32_t first, uint32_t end)
{
	for (uint32_t k = first; k < end; k++) {
		fb_msg f = {.type = FB_MSG_MODEL_FETCH};
		f.u.model_fetch.round = t.fw[i].round;
		f.u.model_fetch.chunk = k;
		deliver(i, &f, NULL, 0);
	}
}

/*
 * Takes the model chunks sent to worker i, which must be all of them in
 * order: each one's hash (SHA-256 of LE64(length) || ciphertext,
 * computed here with libsodium's) is the one the encryption pass put in
 * the signed trailer, each decrypts under the round key to `want`, and
 * the trailer verifies with the coordinator's key.
 */
static void
take_model(uint32_t i, const float *want)
{
	const fb_msg *rs = t.fw[i].rs;
	fb_stream_ctx ctx = {.run = t.c->run, .round = t.fw[i].round,
	    .sender = FB_SENDER_COORDINATOR};
	static uint8_t m[CHUNK_BYTES];
	fb_stream_pull *pull = NULL;
	fb_reject why;
	fb_pubkey pk;
	size_t off = 0;

	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
	                     rs->u.round_start.round_key.b,
	                     rs->u.round_start.stream_header.b,
	                     FB_STREAM_HEADER_LEN, CHUNK_BYTES, &pull, &why),
	    FB_OK);
	for (uint32_t k = 0; k < t.c->chunk_count; k++) {
		const sent *ch = next_to(i, FB_MSG_MODEL_CHUNK);
		uint8_t h[FB_STREAM_HASH_LEN], l[8];
		crypto_hash_sha256_state st;
		size_t mlen = 0;
		int fin = 0;

		assert_non_null(ch);
		assert_int_equal(ch->m.u.model_chunk.chunk, k);
		assert_int_equal(ch->m.u.model_chunk.round, t.fw[i].round);
		fb_store_le64(l, ch->len);
		crypto_hash_sha256_init(&st);
		crypto_hash_sha256_update(&st, l, sizeof(l));
		crypto_hash_sha256_update(&st, ch->payload, ch->len);
		crypto_hash_sha256_final(&st, h);
		assert_memory_equal(h, t.c->bc.hash[k], sizeof(h));
		assert_int_equal(fb_stream_pull_chunk(pull, ch->payload,
		                     ch->len, m, sizeof(m), &mlen, &fin, &why),
		    FB_OK);
		assert_memory_equal(m, (const uint8_t *)want + off, mlen);
		off += mlen;
	}
	assert_int_equal(off, (size_t)PARAMS * 4);
	assert_null(next_to(i, FB_MSG_MODEL_CHUNK));
	fb_identity_pubkey(t.self, &pk);
	assert_int_equal(fb_stream_pull_final(pull, &pk,
	                     rs->u.round_start.stream_trailer.b,
	                     FB_STREAM_TRAILER_LEN, NULL, &why),
	    FB_OK);
	fb_stream_pull_free(pull);
}

/* model_cache seal_on_fetch: no ciphertext is kept; the chunks sealed on
 * fetch are the bytes whose hashes the trailer signs, they decrypt to the
 * model, and after the step the next round's chunks carry the new model
 * under the new key. The round commits as with the kept ciphertext. */
static void
test_seal_on_fetch_round(void **state)
{
	static float model2[PARAMS];

	bench_start(&(setup){.workers = 3, .secure = true,
	    .tr_extra = "  model_cache: seal_on_fetch\n"});
	admit_all();
	assert_phase(PHASE_TRAIN);
	assert_true(t.c->bc.on_fetch);
	assert_null(t.c->bc.lent); /* no model's worth of ciphertext */
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	/* worker 0 one chunk at a time, worker 1 all at once, worker 2 twice
	 * over (a worker that starts its download again) */
	for (uint32_t k = 0; k < t.c->chunk_count; k++) {
		fetch_chunks(0, k, k + 1);
	}
	take_model(0, t.start);
	fetch_chunks(1, 0, t.c->chunk_count);
	take_model(1, t.start);
	fetch_chunks(2, 0, t.c->chunk_count);
	take_model(2, t.start);
	fetch_chunks(2, 0, t.c->chunk_count);
	take_model(2, t.start);
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	/* round 2: the stepped model under a fresh key */
	assert_phase(PHASE_TRAIN);
	memcpy(model2, t.c->params, sizeof(model2));
	assert_true(memcmp(model2, t.start, sizeof(model2)) != 0);
	assert_non_null(take_round_start(1));
	assert_int_equal(t.fw[1].round, 2);
	fetch_chunks(1, 0, t.c->chunk_count);
	take_model(1, model2);
	bench_stop();
}

/* seal_on_fetch with the seal threads (as in the product): the chunks
 * come back from them in the order asked for, the same bytes. */
static void
test_seal_on_fetch_threads(void **state)
{
	bench_start(&(setup){.workers = 3, .secure = true, .threads = true,
	    .tr_extra = "  model_cache: seal_on_fetch\n"});
	admit_all();
	assert_phase(PHASE_TRAIN);
	assert_true(t.c->bc.nthreads >= 1);
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
		fetch_chunks(i, 0, t.c->chunk_count);
	}
	for (int ms = 0; ms < 10000; ms++) {
		uint32_t n = 0;
		for (uint32_t i = 0; i < 3; i++) {
			n += count_to(i, FB_MSG_MODEL_CHUNK);
		}
		if (n == 3 * t.c->chunk_count) {
			break;
		}
		fb_sleep_ms(1);
		coord_turn(t.c, t.now);
	}
	for (uint32_t i = 0; i < 3; i++) {
		take_model(i, t.start);
	}
	bench_stop();
}

/* seal_on_fetch with transport.fetch_memory of 2 chunks and 2 workers: a
 * worker that reads nothing pins its one chunk, never more, and the other
 * downloads the whole model meanwhile; once the first reads again, it
 * gets the rest. */
static void
test_seal_on_fetch_stalled_fetcher(void **state)
{
	char tr[128];
	uint64_t stride = CHUNK_BYTES + FB_STREAM_CHUNK_OVERHEAD;

	snprintf(tr, sizeof(tr), "  model_cache: seal_on_fetch\n"
	                         "  fetch_memory: %llu\n",
	    (unsigned long long)(2 * stride));
	bench_start(&(setup){.workers = 2, .secure = true, .tr_extra = tr});
	admit_all();
	assert_phase(PHASE_TRAIN);
	assert_int_equal(t.c->bc.nbufs, 2);
	assert_int_equal(t.c->bc.share, 1);
	assert_non_null(take_round_start(0));
	assert_non_null(take_round_start(1));
	io.hold[0] = true;
	fetch_chunks(0, 0, t.c->chunk_count);
	assert_int_equal(count_to(0, FB_MSG_MODEL_CHUNK), 1);
	assert_int_equal(t.c->bc.fw[0].held, 1);
	/* worker 0 waits for its buffer: no timer polls for it (the
	 * buffer's release wakes the loop, below) */
	assert_true(round_next_timer(t.c, t.now) > 1);
	/* worker 1 downloads the whole model meanwhile, in the other
	 * buffer: each fetch finds the chunk before it gone */
	fetch_chunks(1, 0, t.c->chunk_count);
	/* (the fake's sends to it hold no buffer: each is free at once) */
	assert_int_equal(t.c->bc.fw[1].held, 0);
	take_model(1, t.start);
	for (uint32_t k = 0; k < 3; k++) {
		t.now += 20;
		turn();
	}
	/* still stalled: nothing more went to worker 0 */
	assert_int_equal(count_to(0, FB_MSG_MODEL_CHUNK), 1);
	assert_int_equal(t.c->bc.fw[0].held, 1);
	/* it reads again (ZeroMQ lets go of its chunk): the buffers are
	 * looked at, and the rest follows without another fetch */
	{
		struct pollfd pfd = {.fd = broadcast_wake_fd(t.c),
		    .events = POLLIN};
		assert_true(pfd.fd >= 0);
		release_held(0);
		assert_int_equal(poll(&pfd, 1, 0), 1); /* the wake */
	}
	for (uint32_t k = 1; k < t.c->chunk_count; k++) {
		t.now += 20;
		turn();
	}
	take_model(0, t.start);
	assert_int_equal(round_next_timer(t.c, t.now) > 1, 1);
	bench_stop();
}

/* The same secure round with the job thread and the pool (the jobs run
 * beside the loop, as in the product): it commits the same model. */
static void
test_secure_round_with_job_thread(void **state)
{
	static float inline_model[PARAMS];

	bench_start(&(setup){.workers = 3, .secure = true});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	memcpy(inline_model, t.c->params, sizeof(inline_model));
	bench_stop();

	bench_start(&(setup){.workers = 3, .secure = true, .threads = true});
	admit_all();
	assert_phase(PHASE_TRAIN);
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	/* the masks' randomness differs, the decoded sum does not: the
	 * stochastic rounding is seeded the same */
	assert_memory_equal(t.c->params, inline_model, sizeof(inline_model));
	bench_stop();
}

/* Secure: a worker lost before its advert is left out (the neighbourhood
 * is complete without it), the other two commit. */
static void
test_secure_worker_lost_in_setup(void **state)
{
	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n"});
	admit_all();
	assert_phase(PHASE_TRAIN);
	registry_forget(t.c, &t.c->reg.workers[2], "test: lost");
	sa_setup(3);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(3);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	bench_stop();
}

/* Secure: a worker lost after its masked input is complete stays
 * included (its self-mask is recovered from the others' shares). */
static void
test_secure_worker_lost_after_input(void **state)
{
	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n"});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	registry_forget(t.c, &t.c->reg.workers[2], "test: lost");
	sa_fake_unmask(3);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-3);
	bench_stop();
}

/* Secure: a worker that fails after the setup (its shares are out) is a
 * dropout the others' shares recover: the round commits with the other
 * two, at once. */
static void
test_secure_worker_round_failed(void **state)
{
	fb_msg f = {.type = FB_MSG_ROUND_FAILED};

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n"});
	admit_all();
	sa_setup(7);
	f.u.round_failed.round = t.c->rd.number;
	snprintf(f.u.round_failed.reason, sizeof(f.u.round_failed.reason),
	    "training failed: NaN");
	deliver(2, &f, NULL, 0);
	assert_int_equal(t.c->reg.workers[2].state, W_FAILED);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	bench_stop();
}

/* Secure: an update stream in the old TAGS mode (a worker of another
 * version) is refused at its UpdateBegin, saying so; the worker is a
 * dropout and the round commits with the other two. */
static void
test_secure_old_stream_mode_refused(void **state)
{
	uint64_t malformed;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n"});
	admit_all();
	sa_setup(7);
	malformed = t.c->g.drops[DROP_MALFORMED];
	t.fw[2].old_stream = true;
	upload_begin(2, t.fw[2].update);
	assert_int_equal(t.c->reg.workers[2].state, W_FAILED);
	assert_non_null(strstr(t.c->reg.workers[2].fail_reason,
	    "another digest mode"));
	assert_int_equal(t.c->g.drops[DROP_MALFORMED], malformed + 1);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	t.fw[2].old_stream = false;
	bench_stop();
}

/* Secure: a worker cut off mid-upload (its connection closed after its
 * first chunk) is a dropout like any other: nothing of its masked input
 * reached the sum (it was kept apart), its masks are recovered from the
 * others' shares, and the round commits with the two others, exactly
 * their weighted mean. */
static void
test_secure_worker_cut_mid_upload(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n"});
	admit_all();
	sa_setup(7);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(2, t.fw[2].update, 2);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->reg.workers[2].state, W_UPLOADING);
	registry_on_closed(t.c, fb_peer_key(&t.c->reg.workers[2].peer));
	turn();
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"status\": \"ok\""));
	assert_non_null(strstr(line, "\"participants\": 2"));
	bench_stop();
}

/* Secure, secure_aggregation.max_uploads 0: masked chunks go straight
 * into the sum. w2, cut off two chunks into its upload, leaves part of its
 * input there: the sum starts again, w0 (whole) and w1 (under way) are
 * asked for theirs again, a chunk of w1's old stream still arriving is
 * dropped without fault, and the round commits with w0 and w1: the sum
 * exactly theirs. */
static void
test_secure_cut_upload_restarts_the_sum(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n  max_uploads: 0\n"});
	assert_int_equal(t.c->part.count, 0);
	admit_all();
	sa_setup(7);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(2, t.fw[2].update, 2);
	upload(1, t.fw[1].update, 1);
	assert_int_equal(t.c->reg.workers[0].state, W_DONE);
	assert_int_equal(count_sa(0, FB_SA_AGAIN), 0);
	registry_on_closed(t.c, fb_peer_key(&t.c->reg.workers[2].peer));
	turn();
	assert_int_equal(t.c->rd.sum_restarts, 1);
	assert_int_equal(count_sa(0, FB_SA_AGAIN), 1);
	assert_int_equal(count_sa(1, FB_SA_AGAIN), 1);
	assert_int_equal(count_sa(2, FB_SA_AGAIN), 0);
	for (uint32_t i = 0; i < 2; i++) {
		const sent *s = next_to(i, FB_MSG_SECAGG);
		assert_non_null(s);
		assert_int_equal(s->m.u.secagg.phase, FB_SA_AGAIN);
	}
	assert_int_equal(t.c->reg.workers[0].state, W_UPLOADING);
	assert_true(t.c->reg.workers[1].again);
	assert_true(upload_more(1, 2) || t.fw[1].pos == 2);
	assert_int_equal(t.c->reg.workers[1].state, W_UPLOADING);
	assert_phase(PHASE_TRAIN);
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_int_equal(t.c->rd.sum_restarts, 1);
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"status\": \"ok\""));
	assert_non_null(strstr(line, "\"participants\": 2"));
	bench_stop();
}

/* Secure, secure_aggregation.max_uploads 1: one masked upload under way
 * at a time, the next waiting for its first credit until the buffer is
 * free again -- when the one before is whole, or cut off (then nothing of
 * it is in the sum). */
static void
test_secure_masked_uploads_take_turns(void **state)
{
	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n  max_uploads: 1\n"});
	assert_int_equal(t.c->part.count, 1);
	admit_all();
	sa_setup(7);
	upload_begin(0, t.fw[0].update);
	upload_begin(1, t.fw[1].update);
	upload_begin(2, t.fw[2].update);
	assert_false(upload_more(1, UINT32_MAX)); /* no credit: it waits */
	assert_false(upload_more(0, 2));          /* w0 holds the buffer */
	assert_int_equal(t.fw[1].pos, 0);
	/* w0 is cut off: its buffer goes to the next in turn (w1) */
	registry_on_closed(t.c, fb_peer_key(&t.c->reg.workers[0].peer));
	turn();
	assert_false(upload_more(2, UINT32_MAX)); /* w1 has it now */
	assert_int_equal(t.fw[2].pos, 0);
	assert_true(upload_more(1, UINT32_MAX));
	/* w1 is whole: w2's turn */
	assert_true(upload_more(2, UINT32_MAX));
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x6);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(6, 1.0) < 1e-3);
	bench_stop();
}

/* Secure: a worker lost while the others reveal, with the threshold
 * still met by the rest, and lost during AGGREGATE/RECORD (jobs inline:
 * nothing to lose then) -- the round commits; below the threshold of
 * reveals (unmask_timeout) it is aborted. */
static void
test_secure_too_few_reveals_aborts(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 3\n"});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	/* all three confirm; only two reveal, the third stays silent */
	sa_confirm(0);
	sa_confirm(1);
	sa_confirm(2);
	sa_reveal(0);
	sa_reveal(1);
	for (int s = 0; s < 5; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_int_equal(t.c->rd.committed, 0);
	assert_int_equal(t.c->rd.number, 2);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "too few shares to unmask"));
	assert_memory_equal(t.c->params, t.start, sizeof(t.start));
	bench_stop();
}

/* Secure FedNova: tau_eff is the decoded weighted mean of the workers'
 * normalisers (their extra coordinate), the library's formula over the
 * masked sums. */
static void
test_secure_fednova_scale(void **state)
{
	double p[3], a[3] = {2.0, 4.0, 5.0}, tau = 0;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .agg_extra = "  rule: fednova\n"});
	for (uint32_t i = 0; i < 3; i++) {
		t.fw[i].a_norm = a[i];
		p[i] = (double)t.fw[i].samples / 1000.0;
	}
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(fb_fednova_tau_eff(p, a, 3, &tau), FB_OK);
	assert_true(fabs(t.c->rd.tau_eff - tau) < 1e-3);
	assert_true(fedavg_error(7, t.c->rd.tau_eff) < 5e-3);
	bench_stop();
}

/* A malicious masked input (coordinates far outside the clip, which the
 * coordinator cannot clip before the sum) is caught after unmasking: the
 * round is aborted, the model unchanged, the run goes on. */
static void
test_secure_poisoned_input_refused(void **state)
{
	static float evil[PARAMS];
	char line[16384];

	bench_start(&(setup){.workers = 3, .secure = true});
	admit_all();
	sa_setup(7);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	/* its encoded input plus 2^30 units (8 = 2 clips) per coordinate:
	 * far past what any clipped, weighted value encodes to */
	for (uint32_t j = 0; j < PARAMS; j++) {
		evil[j] = 0.5f;
	}
	t.fw[2].evil_add = 1u << 30;
	upload(2, evil, UINT32_MAX);
	sa_fake_unmask(7);
	assert_int_equal(t.c->rd.committed, 0);
	assert_int_equal(t.c->rd.number, 2);
	assert_memory_equal(t.c->params, t.start, sizeof(t.start));
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"status\": \"aborted\""));
	assert_non_null(strstr(line, "not what an honest worker sends"));
	bench_stop();
}

/* A worker whose queue stays full past transport.send_timeout is dropped
 * (sends never wait for it). */
/* A worker that reconnects (a new connection, a new session) while the
 * round trains gets its RoundStart again and is in the commit; one whose
 * update had begun this round is not sent back into it. */
static void
test_reconnected_worker_rejoins_round(void **state)
{
	const fb_msg *rs;

	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	hello_on(2, 900, 2);
	assert_non_null(next_to(2, FB_MSG_WELCOME));
	assert_true(t.c->reg.workers[2].used);
	rs = take_round_start(2);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 1);
	assert_int_equal(t.c->reg.workers[2].state, W_TRAINING);
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	/* round 2: w0's update begins, then it reconnects: left out */
	memcpy(t.start, t.c->params, sizeof(t.start));
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, 1);
	hello_on(0, 901, 3);
	assert_non_null(next_to(0, FB_MSG_WELCOME));
	assert_null(take_round_start(0));
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 2);
	bench_stop();
}

/* Secure: a worker whose connection closed is dropped at once; back
 * before its key advert was taken, it rejoins the round and its masked
 * input is in the sum. Back after its advert was taken (its neighbours
 * hold its old keys), it is left out and its masks are recovered. */
static void
test_secure_reconnect_rejoins_before_advert(void **state)
{
	uint32_t before;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .sa_extra = "  threshold: 2\n"});
	admit_all();
	assert_phase(PHASE_TRAIN);
	assert_non_null(take_round_start(2));
	t.fw[2].rs = NULL;
	registry_on_closed(t.c, fb_peer_key(&t.c->reg.workers[2].peer));
	assert_false(t.c->reg.workers[2].used);
	hello(2);
	assert_non_null(next_to(2, FB_MSG_WELCOME));
	sa_setup(7); /* w2 takes its second RoundStart */
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x7);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-3); /* all three in the mean */
	/* round 2: w2 advertised and shared, then its connection closed */
	memcpy(t.start, t.c->params, sizeof(t.start));
	for (uint32_t i = 0; i < 3; i++) {
		t.fw[i].rs = NULL;
		fb_secagg_worker_free(t.fw[i].sa);
		t.fw[i].sa = NULL;
	}
	sa_setup(7);
	registry_on_closed(t.c, fb_peer_key(&t.c->reg.workers[2].peer));
	before = count_to(2, FB_MSG_ROUND_START);
	hello(2);
	assert_int_equal(count_to(2, FB_MSG_ROUND_START), before);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_phase(PHASE_UNMASK);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(fedavg_error(3, 1.0) < 1e-3);
	bench_stop();
}

/* A closed connection drops its worker at once (not after the 5 s
 * liveness), and the round goes on with the others; a key that names no
 * worker changes nothing. */
static void
test_closed_connection_drops_at_once(void **state)
{
	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	registry_on_closed(t.c, 12345);
	assert_true(t.c->reg.workers[2].used);
	registry_on_closed(t.c, fb_peer_key(&t.c->reg.workers[2].peer));
	assert_false(t.c->reg.workers[2].used);
	assert_int_equal(t.c->reg.workers[2].state, W_IDLE); /* forgotten */
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(3, 1.0) < 1e-6);
	bench_stop();
}

/* A worker that sends no whole message but whose bytes keep arriving (a
 * chunk on a slow link) stays; once its bytes stop it is dropped after
 * the liveness timeout (5 s). A full queue whose bytes are acknowledged
 * bit by bit is not dropped either, until they stop for send_timeout. */
static void
test_bytes_moving_keep_workers(void **state)
{
	fb_msg hb = {.type = FB_MSG_HEARTBEAT};
	int64_t stop_at;

	bench_start(&(setup){.workers = 3});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	io.has_traffic[2] = true;
	for (int s = 0; s < 20; s++) {
		deliver(0, &hb, NULL, 0);
		deliver(1, &hb, NULL, 0);
		io.traffic[2].in += 4000;
		advance(1000);
	}
	assert_true(t.c->reg.workers[2].used);
	stop_at = t.now;
	while (t.c->reg.workers[2].used && t.now - stop_at < 20000) {
		deliver(0, &hb, NULL, 0);
		deliver(1, &hb, NULL, 0);
		advance(100);
	}
	assert_false(t.c->reg.workers[2].used);
	assert_true(t.now - stop_at > 5000 && t.now - stop_at <= 6500);
	/* w1's queue full, but what was sent is acknowledged all along */
	io.full[1] = true;
	io.has_traffic[1] = true;
	for (int s = 0; s < 10; s++) {
		deliver(0, &hb, NULL, 0);
		deliver(1, &hb, NULL, 0);
		io.traffic[1].acked += 4000;
		advance(1000);
	}
	assert_true(t.c->reg.workers[1].used);
	stop_at = t.now;
	while (t.c->reg.workers[1].used && t.now - stop_at < 20000) {
		deliver(0, &hb, NULL, 0);
		deliver(1, &hb, NULL, 0);
		advance(100);
	}
	assert_false(t.c->reg.workers[1].used);
	/* (bytes are looked at every liveness / 4 = 1.25 s) */
	assert_true(t.now - stop_at > 3000 - 1250 &&
	    t.now - stop_at <= 3000 + 1250);
	bench_stop();
}

/* Plain worker i's UpdateBegin, and its chunk at position pos. */
static void
plain_begin(uint32_t i)
{
	fb_msg b = {.type = FB_MSG_UPDATE_BEGIN};

	b.u.update_begin.round = t.fw[i].round;
	b.u.update_begin.param_count = PARAMS;
	b.u.update_begin.chunk_count = t.c->chunk_count;
	b.u.update_begin.num_samples = t.fw[i].samples;
	b.u.update_begin.steps = 5;
	deliver(i, &b, NULL, 0);
}

static void
plain_chunk(uint32_t i, uint32_t pos)
{
	static uint32_t buf[CHUNK_BYTES / 4];
	fb_msg m = {.type = FB_MSG_UPDATE_CHUNK};
	size_t len = 0;

	m.u.update_chunk.round = t.fw[i].round;
	m.u.update_chunk.chunk = upload_chunk(i, pos, buf, &len,
	    t.fw[i].update);
	deliver(i, &m, buf, len);
}

/* Update chunks go up only on credit, from one budget for all workers
 * (transport.upload_window: 2 chunks here): never more than that in
 * flight whatever the number uploading, each credit returned when its
 * chunk arrives, the waiting workers served in turn; and a chunk sent
 * without a credit takes its worker out of the round. */
static void
test_upload_credits_one_budget(void **state)
{
	uint32_t credit[3] = {0}, pos[3] = {0}, done = 0;

	bench_start(&(setup){.workers = 3, .tr_extra =
	    "  upload_window: 8KiB\n"});
	assert_int_equal(t.c->cr.budget, 2);
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
		plain_begin(i);
	}
	assert_int_equal(t.c->cr.out, 2);
	while (done < 3) {
		bool moved = false;
		for (uint32_t i = 0; i < 3; i++) {
			credit[i] += take_credits(i);
			if (credit[i] > 0 && pos[i] < t.c->chunk_count) {
				plain_chunk(i, pos[i]++);
				credit[i]--;
				done += pos[i] == t.c->chunk_count;
				moved = true;
			}
			assert_true(t.c->cr.out <= 2);
		}
		assert_true(moved);
	}
	assert_int_equal(t.c->cr.peak, 2);
	assert_int_equal(t.c->cr.out, 0);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	/* round 2: the budget goes to w0; w1, which began after it, has no
	 * credit yet and sends a chunk anyway: it leaves the round */
	memcpy(t.start, t.c->params, sizeof(t.start));
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	plain_begin(0);
	plain_begin(1);
	assert_int_equal(take_credits(0), 2);
	assert_int_equal(take_credits(1), 0);
	plain_chunk(1, 0);
	assert_int_equal(t.c->reg.workers[1].state, W_FAILED);
	plain_chunk(0, 0);
	assert_int_equal(take_credits(0), 1); /* the returned one */
	plain_chunk(0, 1);
	plain_chunk(0, 2);
	assert_int_equal(t.c->reg.workers[0].state, W_DONE);
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(fedavg_error(5, 1.0) < 1e-6);
	bench_stop();
}

static void
test_full_queue_drops_worker(void **state)
{
	bench_start(&(setup){.workers = 3});
	admit_all();
	io.full[1] = true;
	for (int s = 0; s < 5; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_false(t.c->reg.workers[1].used);
	assert_true(t.c->reg.workers[0].used);
	bench_stop();
}

/* A malicious weight claim: its weight coordinate pushed up by 3
 * (more than 3 workers' weights can sum to), or down by 4 (a negative
 * sum): refused after unmasking either way. */
static void
test_secure_bad_weight_refused(void **state)
{
	static const struct {
		uint32_t add;
		const char *why;
	} cases[] = {
	    {0x60000000u, "outside (0, 3]"},
	    {0x80000000u, "sum to zero or less"},
	};
	char line[16384];

	for (size_t k = 0; k < FB_ARRAY_LEN(cases); k++) {
		bench_start(&(setup){.workers = 3, .secure = true});
		admit_all();
		sa_setup(7);
		t.fw[1].evil_w = cases[k].add;
		for (uint32_t i = 0; i < 3; i++) {
			upload(i, t.fw[i].update, UINT32_MAX);
		}
		sa_fake_unmask(7);
		assert_int_equal(t.c->rd.committed, 0);
		assert_memory_equal(t.c->params, t.start, sizeof(t.start));
		last_metrics(line, sizeof(line));
		assert_non_null(strstr(line, "\"status\": \"aborted\""));
		assert_non_null(strstr(line, cases[k].why));
		bench_stop();
	}
}

/* Admission: a second worker with a data index already in use is
 * refused, naming the first; a plain-mode sample count above
 * secure_aggregation.max_samples is refused (it would take the weight). */
static void
test_admission_refusals(void **state)
{
	fb_msg m = {.type = FB_MSG_HELLO};
	fb_frame f;
	const sent *r;

	bench_start(&(setup){.workers = 3});
	hello(0);
	hello(1);
	/* w2 claims w0's index */
	m.u.hello.protocol_version = FB_PROTOCOL_VERSION;
	snprintf(m.u.hello.name, sizeof(m.u.hello.name), "w2");
	m.u.hello.worker_index = 0;
	m.u.hello.partitions = MAXW;
	m.u.hello.num_samples = 300;
	m.u.hello.session = 102;
	f = frame_of(2, &m);
	coord_handle_frame(t.c, &f);
	turn();
	assert_int_equal(registry_live_count(t.c), 2);
	r = &io.v[io.n - 1];
	assert_int_equal(r->m.type, FB_MSG_REJECT);
	assert_non_null(strstr(r->m.u.reject.reason, "data.index 0 of 8 is "
	                                              "worker 'w0''s already"));
	/* 10^15 samples */
	m.u.hello.worker_index = 2;
	m.u.hello.num_samples = 1000000000000000ull;
	f = frame_of(2, &m);
	coord_handle_frame(t.c, &f);
	turn();
	assert_int_equal(registry_live_count(t.c), 2);
	r = &io.v[io.n - 1];
	assert_int_equal(r->m.type, FB_MSG_REJECT);
	assert_non_null(strstr(r->m.u.reject.reason,
	    "more than secure_aggregation.max_samples"));
	/* with its own index and an honest count it is admitted */
	m.u.hello.num_samples = 300;
	f = frame_of(2, &m);
	coord_handle_frame(t.c, &f);
	turn();
	assert_int_equal(registry_live_count(t.c), 3);
	/* a box on its own data (partitions 0): its index is a label only,
	 * and another's is no conflict */
	snprintf(m.u.hello.name, sizeof(m.u.hello.name), "own");
	m.u.hello.worker_index = 0;
	m.u.hello.partitions = 0;
	m.u.hello.session = 103;
	f = frame_of(3, &m);
	coord_handle_frame(t.c, &f);
	turn();
	assert_int_equal(registry_live_count(t.c), 4);
	bench_stop();
}

/* Plain FedNova: a normaliser above what the round's most local steps
 * give is refused (it would scale the whole round's step). */
static void
test_fednova_normaliser_bound(void **state)
{
	bench_start(&(setup){.workers = 3, .agg_extra = "  rule: fednova\n"});
	t.fw[0].a_norm = 2.0;
	t.fw[1].a_norm = 3.0;
	t.fw[2].a_norm = 1e30;
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->reg.workers[2].state, W_FAILED);
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(t.c->rd.tau_eff < 5.0);
	bench_stop();
}

/* Plain mode, a malicious worker with the most samples allowed (the
 * cap), sending 100 in every coordinate (clip 16) and only its first
 * chunk: no coordinate moves more than server_lr x clip, and the chunk it
 * reached moves at most 2 p clip from the honest workers' mean (p its
 * share of the samples), as the README says. */
static void
test_plain_malicious_worker_bounded(void **state)
{
	static float evil[PARAMS];
	double p, err = 0;
	uint32_t k0;

	bench_start(&(setup){.workers = 3});
	t.fw[2].samples = 1000; /* secure_aggregation.max_samples */
	for (uint32_t j = 0; j < PARAMS; j++) {
		evil[j] = 100.0f;
	}
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(2, evil, 1);
	k0 = t.fw[2].first_chunk;
	registry_forget(t.c, &t.c->reg.workers[2], "test: gone");
	turn();
	assert_int_equal(t.c->rd.committed, 1);
	p = 1000.0 / (100 + 200 + 1000);
	for (uint32_t j = 0; j < PARAMS; j++) {
		double honest = (100.0 * t.fw[0].update[j] +
		                    200.0 * t.fw[1].update[j]) /
		    300.0;
		double moved = (double)t.start[j] - (double)t.c->params[j];
		bool reached = j / (CHUNK_BYTES / 4) == k0;
		/* server_lr 1 */
		assert_true(fabs(moved) <= 16.0 + 1e-5);
		if (reached) {
			double d = fabs(moved - honest);
			err = d > err ? d : err;
			assert_true(d <= 2 * p * 16.0 + 1e-5);
		} else {
			assert_true(fabs(moved - honest) < 1e-5);
		}
	}
	assert_true(err > 1.0); /* it did move the chunk it reached */
	bench_stop();
}

/* Secure: too few of the included workers confirm the included set by
 * unmask_timeout: nobody is asked for shares, the round is aborted. */
static void
test_secure_too_few_confirmations_abort(void **state)
{
	char line[16384];

	bench_start(&(setup){
	    .workers = 3, .secure = true, .sa_extra = "  threshold: 3\n"});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_phase(PHASE_UNMASK);
	assert_int_equal(t.c->sa->phase, SA_CONFIRM);
	sa_confirm(0);
	sa_confirm(1);
	for (int s = 0; s < 5; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		for (uint32_t i = 0; i < 3; i++) {
			deliver(i, &hb, NULL, 0);
		}
		advance(1000);
	}
	assert_int_equal(t.c->rd.committed, 0);
	assert_int_equal(t.c->rd.number, 2);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(count_sa(i, FB_SA_CONFIRMS), 0);
	}
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"status\": \"aborted\""));
	assert_non_null(strstr(line, "only 2 of the 3 included workers "
	                             "confirmed the included set"));
	assert_non_null(strstr(line, "\"confirmed\": 2"));
	assert_memory_equal(t.c->params, t.start, sizeof(t.start));
	bench_stop();
}

/* Secure: a worker that will not reveal (it did not get enough
 * confirmations of its set) says so, and once too few are left to
 * reveal the round is aborted at once, not at unmask_timeout. */
static void
test_secure_refusal_aborts_at_once(void **state)
{
	char line[16384];

	bench_start(&(setup){
	    .workers = 3, .secure = true, .sa_extra = "  threshold: 3\n"});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	for (uint32_t i = 0; i < 3; i++) {
		sa_confirm(i);
	}
	assert_int_equal(t.c->sa->phase, SA_UNMASK);
	sa_reveal(0);
	assert_int_equal(t.c->rd.number, 1);
	send_secagg(2, FB_SA_REFUSE, 0, NULL, 0);
	assert_int_equal(t.c->rd.committed, 0);
	assert_int_equal(t.c->rd.number, 2); /* aborted without waiting */
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"status\": \"aborted\""));
	assert_non_null(strstr(line, "(1 refused"));
	assert_non_null(strstr(line, "\"refused\": 1"));
	assert_memory_equal(t.c->params, t.start, sizeof(t.start));
	bench_stop();
}

/* Secure: a confirmation over another set than the one sent (a worker
 * claiming it was told something else) is refused and not counted, and
 * that worker is not asked for shares; with threshold 2 the other two
 * unmask the round. */
static void
test_secure_other_set_not_counted(void **state)
{
	char line[16384];
	const sent *s;

	bench_start(&(setup){
	    .workers = 3, .secure = true, .sa_extra = "  threshold: 2\n"});
	admit_all();
	sa_setup(7);
	for (uint32_t i = 0; i < 3; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	sa_confirm(0);
	sa_confirm_as(1, 2); /* signs {0, 1}: not what it was sent */
	assert_int_equal(t.c->g.drops[DROP_BAD_SIGNATURE], 1);
	assert_int_equal(
	    t.c->sa->flags[t.c->reg.workers[1].sa_slot] & SA_F_CONFIRMED, 0);
	sa_confirm(2);
	s = next_to(0, FB_MSG_SECAGG);
	assert_non_null(s);
	assert_int_equal(s->m.u.secagg.phase, FB_SA_CONFIRMS);
	assert_int_equal(s->m.u.secagg.count, 1); /* 2's, not 1's */
	io.taken[0]--;
	sa_reveal(0);
	sa_reveal(2);
	assert_int_equal(count_sa(1, FB_SA_CONFIRMS), 0);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(7, 1.0) < 1e-6);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"confirmed\": 2"));
	assert_non_null(strstr(line, "\"revealed\": 2"));
	bench_stop();
}

/* Secure time budget: RoundStart carries the budget and the step
 * bounds, with the fixed work for a worker without a speed; the
 * coordinator keeps no speed, even one a worker sends, and the metrics
 * line shows neither a speed nor steps. */
static void
test_secure_time_budget_private(void **state)
{
	char line[16384];
	const fb_msg *rs;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .extra = "  local_work: time_budget\n  time_budget: 2s\n"
	             "  min_steps: 3\n  max_steps: 50\n"});
	t.fw[0].leak_speed = true;
	admit_all();
	for (uint32_t r = 1; r <= 2; r++) {
		for (uint32_t i = 0; i < 3; i++) {
			rs = take_round_start(i);
			assert_non_null(rs);
			assert_int_equal(rs->u.round_start.round, r);
			assert_int_equal(rs->u.round_start.time_budget_ms,
			    2000);
			assert_int_equal(rs->u.round_start.min_steps, 3);
			assert_int_equal(rs->u.round_start.max_steps, 50);
			assert_int_equal(rs->u.round_start.local_steps, 5);
		}
		sa_setup(7);
		for (uint32_t i = 0; i < 3; i++) {
			upload(i, t.fw[i].update, UINT32_MAX);
		}
		sa_fake_unmask(7);
		assert_int_equal(t.c->rd.committed, r);
		assert_false(t.c->reg.workers[0].has_speed);
		assert_true(t.c->reg.workers[0].round_speed == 0);
		last_metrics(line, sizeof(line));
		assert_null(strstr(line, "steps_per_s"));
		assert_null(strstr(line, "assigned_steps"));
		assert_null(strstr(line, "train_seconds"));
		for (uint32_t i = 0; i < 3; i++) {
			t.fw[i].rs = NULL;
		}
	}
	bench_stop();
	/* plain rounds keep the coordinator's schedule and show it */
	bench_start(&(setup){.workers = 2,
	    .extra = "  local_work: time_budget\n  time_budget: 2s\n"
	             "  min_steps: 3\n  max_steps: 50\n"});
	admit_all();
	for (uint32_t i = 0; i < 2; i++) {
		rs = take_round_start(i);
		assert_int_equal(rs->u.round_start.time_budget_ms, 0);
		upload(i, t.fw[i].update, UINT32_MAX);
	}
	assert_true(t.c->reg.workers[0].has_speed);
	rs = take_round_start(0);
	assert_int_equal(rs->u.round_start.local_steps, 20); /* 10/s x 2 s */
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"steps_per_s\": 10.000"));
	bench_stop();
}

/* ---- round.mode: async --------------------------------------------------- */

#define ASYNC_ROUND "  mode: async\n  buffer_size: 2\n  max_staleness: 1\n"

/* The largest deviation of the model from before - D, D = sum_i n_i
 * (1 + s_i)^-1/2 x_i / sum_i n_i over the buffer's (worker, staleness)
 * pairs: the formula written out here, not the library's. */
static double
async_error(const float *before, const uint32_t *who, const uint32_t *st,
    uint32_t k)
{
	double err = 0, nsum = 0;

	for (uint32_t s = 0; s < k; s++) {
		nsum += (double)t.fw[who[s]].samples;
	}
	for (uint32_t j = 0; j < PARAMS; j++) {
		double d = 0;
		for (uint32_t s = 0; s < k; s++) {
			d += (double)t.fw[who[s]].samples / sqrt(1.0 + st[s]) *
			    t.fw[who[s]].update[j];
		}
		d = fabs((double)t.c->params[j] - (before[j] - d / nsum));
		err = d > err ? d : err;
	}
	return err;
}

/* Secure async's step for one cohort, written out here: each member's
 * masked input weighs n_i (1 + b_i)^-1/2 for the staleness b_i its first
 * credit carried, and the step is D = mean_i (1 + a_i)^-1/2 * sum_i n_i
 * (1 + b_i)^-1/2 x_i / sum_i n_i (1 + b_i)^-1/2, a_i the staleness at the
 * step (the scale takes the sample counts, which the coordinator does
 * not know, as equal). Returns the largest deviation of the model from
 * before - D. */
static double
cohort_error(const float *before, const uint32_t *who, const uint32_t *b,
    const uint32_t *a, uint32_t k)
{
	double err = 0, wsum = 0, gmean = 0;

	for (uint32_t s = 0; s < k; s++) {
		wsum += (double)t.fw[who[s]].samples / sqrt(1.0 + b[s]);
		gmean += 1.0 / sqrt(1.0 + a[s]) / k;
	}
	for (uint32_t j = 0; j < PARAMS; j++) {
		double d = 0;
		for (uint32_t s = 0; s < k; s++) {
			d += (double)t.fw[who[s]].samples / sqrt(1.0 + b[s]) *
			    t.fw[who[s]].update[j];
		}
		d = fabs((double)t.c->params[j] - (before[j] - gmean * d / wsum));
		err = d > err ? d : err;
	}
	return err;
}

/* Async: every worker gets a task at once; a worker done while the
 * buffer fills gets another at once (its own batch seed); every 2
 * updates the server steps, fresh updates by FedAvg, stale ones by
 * 1/sqrt(1 + s) of their share and of the step; each step is one line
 * with the versions. */
static void
test_async_buffer_steps_with_staleness(void **state)
{
	char line[16384];
	float before[PARAMS];
	const fb_msg *rs;
	uint64_t seed0;

	bench_start(&(setup){.workers = 3, .extra = ASYNC_ROUND});
	admit_all();
	assert_phase(PHASE_TRAIN);
	for (uint32_t i = 0; i < 3; i++) {
		rs = take_round_start(i);
		assert_non_null(rs);
		assert_int_equal(rs->u.round_start.round, 1);
	}
	seed0 = t.fw[0].rs->u.round_start.seed;
	assert_true(seed0 != t.fw[1].rs->u.round_start.seed);
	/* w0 done: into the buffer (1 of 2), and a new task of version 0 */
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_phase(PHASE_TRAIN);
	assert_int_equal(t.c->rd.committed, 0);
	rs = take_round_start(0);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 1);
	assert_true(rs->u.round_start.seed != seed0);
	/* w1 done: the buffer is full, the server steps (fresh: FedAvg) */
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	assert_int_equal(t.c->rd.number, 2);
	assert_phase(PHASE_TRAIN);
	assert_true(async_error(t.start, (uint32_t[]){0, 1},
	                (uint32_t[]){0, 0}, 2) < 1e-5);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"mode\": \"async\", \"version\": 1,"));
	assert_non_null(strstr(line, "\"trained_from\": 0, \"staleness\": 0"));
	assert_non_null(strstr(line, "\"participants\": 2"));
	/* w1 has a task of version 1 (round 2); w2's and w0's tasks are of
	 * version 0: one step stale each */
	rs = take_round_start(1);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 2);
	memcpy(before, t.c->params, sizeof(before));
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(async_error(before, (uint32_t[]){2, 0},
	                (uint32_t[]){1, 1}, 2) < 1e-5);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"version\": 2,"));
	assert_non_null(strstr(line, "\"trained_from\": 0, \"staleness\": 1, "
	                             "\"staleness_weight\": 0.707107"));
	assert_non_null(strstr(line, "\"dropped_stale\": 0"));
	assert_int_equal(metrics_lines(), 2);
	bench_stop();
}

/* Async: an update more than max_staleness steps old is dropped at its
 * begin (counted, its worker cancelled and given a fresh task), and the
 * model does not move for it. */
static void
test_async_too_stale_dropped(void **state)
{
	char line[16384];
	float before[PARAMS];
	uint32_t cancels;

	bench_start(&(setup){.workers = 3, .extra = ASYNC_ROUND});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	/* w0 and w1 make two steps while w2 trains from version 0 */
	for (int step = 0; step < 2; step++) {
		upload(0, t.fw[0].update, UINT32_MAX);
		upload(1, t.fw[1].update, UINT32_MAX);
		assert_non_null(take_round_start(0));
		assert_non_null(take_round_start(1));
	}
	assert_int_equal(t.c->rd.committed, 2);
	memcpy(before, t.c->params, sizeof(before));
	cancels = count_to(2, FB_MSG_ROUND_CANCEL);
	upload(2, t.fw[2].update, UINT32_MAX); /* staleness 2 > 1 */
	assert_int_equal(count_to(2, FB_MSG_ROUND_CANCEL), cancels + 1);
	assert_int_equal(take_credits(2), 0);
	assert_true(memcmp(before, t.c->params, sizeof(before)) == 0);
	{
		const fb_msg *rs = take_round_start(2);
		assert_non_null(rs);
		assert_int_equal(rs->u.round_start.round, 3); /* version 2 */
	}
	/* the next step holds w0, w1; its line counts the drop */
	upload(0, t.fw[0].update, UINT32_MAX);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 3);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"dropped_stale\": 1"));
	bench_stop();
}

/* Async: uploads under way when the buffer fills finish into it
 * (OVERTIME); a begin that comes meanwhile waits for the next buffer
 * and is then taken, one step stale. */
static void
test_async_overtime_and_held_begin(void **state)
{
	char line[16384];

	bench_start(&(setup){.workers = 4, .extra = ASYNC_ROUND});
	admit_all();
	for (uint32_t i = 0; i < 4; i++) {
		assert_non_null(take_round_start(i));
	}
	upload(0, t.fw[0].update, 1); /* one chunk of three */
	upload(1, t.fw[1].update, UINT32_MAX);
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_phase(PHASE_OVERTIME);
	assert_int_equal(t.c->rd.committed, 0);
	upload_begin(3, t.fw[3].update); /* held: no credit */
	assert_false(upload_more(3, UINT32_MAX));
	assert_true(upload_more(0, UINT32_MAX));
	/* the step took w1, w2 and w0, fresh */
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(async_error(t.start, (uint32_t[]){1, 2, 0},
	                (uint32_t[]){0, 0, 0}, 3) < 1e-5);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"participants\": 3"));
	/* buffer 2 took w3's held begin: its credit came */
	assert_true(upload_more(3, UINT32_MAX));
	assert_int_equal(t.c->rd.number, 2);
	assert_int_equal(t.c->as.count, 1);
	assert_string_equal(t.c->as.buf[0].name, "w3");
	assert_int_equal(t.c->as.buf[0].version, 0);
	assert_int_equal(t.c->as.buf[0].staleness, 1);
	bench_stop();
}

/* Async: a worker whose task failed (RoundFailed) is out of this buffer
 * and gets its next task when the next buffer opens. */
static void
test_async_failed_task_waits_next_buffer(void **state)
{
	fb_msg f = {.type = FB_MSG_ROUND_FAILED};
	const fb_msg *rs;

	bench_start(&(setup){.workers = 3, .extra = ASYNC_ROUND});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	f.u.round_failed.round = 1;
	snprintf(f.u.round_failed.reason, sizeof(f.u.round_failed.reason),
	    "trainer crashed");
	deliver(2, &f, NULL, 0);
	assert_int_equal(t.c->reg.workers[2].state, W_FAILED);
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_non_null(take_round_start(0)); /* w0 again, w2 not */
	assert_null(take_round_start(2));
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	rs = take_round_start(2);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 2);
	bench_stop();
}

/* Async: a worker that dies mid-task is not waited for: the others fill
 * the buffers and the steps go on; its slot is freed. */
static void
test_async_worker_lost_not_waited_for(void **state)
{
	bench_start(&(setup){.workers = 3, .extra = ASYNC_ROUND});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	for (int s = 0; s < 6; s++) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		deliver(0, &hb, NULL, 0);
		deliver(1, &hb, NULL, 0);
		advance(1000);
	}
	assert_false(t.c->reg.workers[2].used);
	for (int step = 0; step < 3; step++) {
		upload(0, t.fw[0].update, UINT32_MAX);
		upload(1, t.fw[1].update, UINT32_MAX);
		if (step < 2) {
			assert_non_null(take_round_start(0));
			assert_non_null(take_round_start(1));
		}
	}
	assert_int_equal(t.c->rd.committed, 3);
	assert_phase(PHASE_DONE); /* rounds: 3 steps */
	bench_stop();
}

/* ---- round.lr_decay: the workers' lr on a schedule --------------------- */

#define LR_DECAY "  lr: 0.04\n  lr_decay: cosine\n  lr_final: 0.25\n"

/* The workers' lr of step t of R under LR_DECAY, the cosine as the key's
 * help writes it, lr (f + (1 - f) (1 + cos(pi (t - 1) / R)) / 2), in long
 * double: not the library's cos^2 / sin^2 form. */
static long double
lr_ref(unsigned t_step, unsigned rounds)
{
	const long double pi = 3.141592653589793238462643383279502884L;
	long double c = (1 + cosl(pi * (t_step - 1) / rounds)) / 2;

	return 0.04L * (0.25L + 0.75L * c);
}

/* The RoundStart's lr is the reference's, rounded to the float it travels
 * as (within that float's half ulp, for the double rounding). */
static void
assert_lr(const fb_msg *rs, unsigned t_step)
{
	long double want = lr_ref(t_step, 3);
	long double got = rs->u.round_start.lr;

	if (fabsl(got - want) > want * FLT_EPSILON / 2) {
		fail_msg("step %u: lr %.9Lg, want %.9Lg", t_step, got, want);
	}
}

/* Sync: round t of 3 sends lr(t), 0.04, 0.0325, 0.0175, falling from
 * round.lr towards round.lr_final of it; the rounds' models are those of
 * plain rounds (the schedule changes what the workers are told, only). */
static void
test_lr_decay_sync_by_round(void **state)
{
	float prev = INFINITY;

	bench_start(&(setup){.workers = 2, .extra = LR_DECAY});
	admit_all();
	for (uint32_t r = 1; r <= 3; r++) {
		assert_phase(PHASE_TRAIN);
		for (uint32_t i = 0; i < 2; i++) {
			const fb_msg *rs = take_round_start(i);
			assert_non_null(rs);
			assert_int_equal(rs->u.round_start.round, r);
			assert_lr(rs, r);
			assert_true(rs->u.round_start.lr < prev ||
			    (i == 1 && rs->u.round_start.lr == prev));
			prev = rs->u.round_start.lr;
		}
		upload(0, t.fw[0].update, UINT32_MAX);
		upload(1, t.fw[1].update, UINT32_MAX);
		assert_int_equal(t.c->rd.committed, r);
	}
	assert_true(prev == 0.04f * (0.25f + 0.75f * 0.25f)); /* exact here */
	assert_phase(PHASE_DONE);
	bench_stop();
}

/* Without round.lr_decay every round sends round.lr itself, bit for bit
 * (the default leaves every earlier run as it was). */
static void
test_lr_decay_none_is_constant(void **state)
{
	bench_start(&(setup){.workers = 2, .extra = "  lr: 0.04\n"});
	assert_int_equal(t.cfg.lr_decay, FB_LR_DECAY_NONE);
	admit_all();
	for (uint32_t r = 1; r <= 3; r++) {
		for (uint32_t i = 0; i < 2; i++) {
			const fb_msg *rs = take_round_start(i);
			assert_non_null(rs);
			assert_true(rs->u.round_start.lr == (float)0.04);
		}
		upload(0, t.fw[0].update, UINT32_MAX);
		upload(1, t.fw[1].update, UINT32_MAX);
	}
	assert_phase(PHASE_DONE);
	bench_stop();
}

/* Async: a task's lr is that of the server step it trains towards, its
 * model version + 1, whatever the step under way when it is handed out:
 * a stale task keeps its version's lr. */
/* Worker i's next task, once its update is in: from model version
 * `version`, with the lr of schedule step `step`. */
static void
next_task_lr(uint32_t i, uint32_t version, unsigned step)
{
	const fb_msg *rs = take_round_start(i);

	assert_non_null(rs);
	assert_int_equal(t.c->reg.workers[i].task_version, version);
	assert_lr(rs, step);
}

static void
test_lr_decay_async_by_version(void **state)
{
	bench_start(&(setup){.workers = 3,
	    .extra = ASYNC_ROUND LR_DECAY});
	admit_all();
	for (uint32_t i = 0; i < 3; i++) {
		next_task_lr(i, 0, 1);
	}
	/* w0 done: a new task, still from version 0 */
	upload(0, t.fw[0].update, UINT32_MAX);
	next_task_lr(0, 0, 1);
	/* w1 done: the step; w1's next task is from version 1 */
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	next_task_lr(1, 1, 2);
	/* w2 (version 0, one step stale) done: its next task, version 1 */
	upload(2, t.fw[2].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 1);
	next_task_lr(2, 1, 2);
	/* w0's version-0 task done: the second step; w0 trains from 2 */
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_int_equal(t.c->rd.committed, 2);
	next_task_lr(0, 2, 3);
	bench_stop();
}

/* ---- secure async: one SecAgg cohort per buffer -------------------------- */

#define SECURE_ASYNC_ROUND                                                 \
	"  mode: async\n  buffer_size: 2\n  max_staleness: 4\n"

/* Swaps fake worker i's SecAgg instance (and its round) with the one it
 * holds: as the real worker keeps an earlier task's instance for its
 * cohort's unmasking while it trains for the next. */
static void
held_swap(uint32_t i)
{
	fake_worker *fw = &t.fw[i];
	fb_secagg_worker *sa = fw->sa;
	uint32_t round = fw->round, n = fw->sa_n;
	fb_secagg_encodings enc = fw->enc;

	fw->sa = fw->held_sa;
	fw->round = fw->held_round;
	fw->sa_n = fw->held_n;
	fw->enc = fw->held_enc;
	fw->held_sa = sa;
	fw->held_round = round;
	fw->held_n = n;
	fw->held_enc = enc;
}

/* Two cohorts in flight: the first two tasks make cohort 1, the third
 * opens cohort 2; fast w0, done in cohort 1, joins cohort 2 and seals it.
 * Cohort 2 completes first and is the first step, while cohort 1 waits
 * for its slow member w1 alone; then cohort 1 is the second step. w0's
 * input there began before the first step (staleness 0), slow w1's after
 * it (staleness 1): each credit says so, w1 weighs its input by 1/sqrt(2),
 * and the step is scaled by the two weights' mean (the formula written
 * out in cohort_error). Each step's line names its cohort and members. */
static void
test_secure_async_cohorts_in_flight(void **state)
{
	char line[16384];
	float before[PARAMS];
	const fb_msg *rs;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .extra = SECURE_ASYNC_ROUND});
	admit_all();
	assert_phase(PHASE_TRAIN);
	for (uint32_t i = 0; i < 3; i++) {
		rs = take_round_start(i);
		assert_non_null(rs);
		assert_true(rs->u.round_start.secagg);
		assert_int_equal(rs->u.round_start.sa_n, 2);
		assert_int_equal(rs->u.round_start.model_round, 1);
	}
	/* cohort 1: w0 and w1 (sealed); cohort 2 filling with w2 */
	assert_int_equal(t.fw[0].round, 1);
	assert_int_equal(t.fw[1].round, 1);
	assert_int_equal(t.fw[2].round, 2);
	assert_int_equal(t.fw[0].rs->u.round_start.sa_slot, 0);
	assert_int_equal(t.fw[1].rs->u.round_start.sa_slot, 1);
	assert_int_equal(t.fw[2].rs->u.round_start.sa_slot, 0);
	assert_int_equal(cohort_of(t.c, 1)->state, CO_RUNNING);
	assert_int_equal(cohort_of(t.c, 2)->state, CO_FILLING);
	sa_setup(0x3);
	sa_advertise(2, t.fw[2].rs); /* taken while its cohort fills */
	/* fast w0: its input into cohort 1, then a task in cohort 2 */
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_true(io.weighed[0]);
	assert_int_equal(io.stale[0], 0);
	held_swap(0);
	rs = take_round_start(0);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 2);
	assert_int_equal(rs->u.round_start.sa_slot, 1);
	assert_int_equal(cohort_of(t.c, 2)->state, CO_RUNNING);
	sa_advertise(0, rs);
	sa_share(2);
	sa_share(0);
	sa_take_shares(2);
	sa_take_shares(0);
	upload(2, t.fw[2].update, UINT32_MAX);
	upload(0, t.fw[0].update, UINT32_MAX);
	/* cohort 2 is in: unmasked and applied first; slow w1 holds back
	 * cohort 1 only */
	assert_int_equal(cohort_of(t.c, 1)->state, CO_RUNNING);
	sa_fake_unmask(0x5);
	assert_int_equal(t.c->rd.committed, 1);
	assert_true(fedavg_error(0x5, 1.0) < 1e-6);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"cohort\": 2, \"members\": 2"));
	assert_non_null(strstr(line, "\"participants\": 2"));
	assert_non_null(strstr(line, "\"secure_aggregation\": {\"workers\": 2, "
	                             "\"neighbours\": 1, \"threshold\": 2, "
	                             "\"included\": 2"));
	assert_non_null(strstr(line, "\"trained_from\": 0, \"staleness\": 0"));
	assert_null(strstr(line, "samples")); /* each worker's own */
	assert_null(cohort_of(t.c, 2));
	/* slow w1's input: cohort 1 completes, w0 answers its unmasking
	 * with the instance it kept */
	memcpy(before, t.c->params, sizeof(before));
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_true(io.weighed[1]);
	assert_int_equal(io.stale[1], 1);
	held_swap(0);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(cohort_error(before, (uint32_t[]){0, 1},
	                (uint32_t[]){0, 1}, (uint32_t[]){1, 1}, 2) < 1e-5);
	/* (not the members weighed alike, as before UpdateCredit.staleness) */
	assert_true(cohort_error(before, (uint32_t[]){0, 1},
	                (uint32_t[]){0, 0}, (uint32_t[]){1, 1}, 2) > 1e-4);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"cohort\": 1, \"members\": 2"));
	assert_non_null(strstr(line, "\"step_scale\": 0.707107"));
	assert_non_null(strstr(line, "\"trained_from\": 0, \"staleness\": 1, "
	                             "\"staleness_weight\": 0.707107, "
	                             "\"input_staleness\": 0, "
	                             "\"input_weight\": 1}"));
	assert_non_null(strstr(line, "\"trained_from\": 0, \"staleness\": 1, "
	                             "\"staleness_weight\": 0.707107, "
	                             "\"input_staleness\": 1, "
	                             "\"input_weight\": 0.707107}"));
	assert_int_equal(metrics_lines(), 2);
	bench_stop();
}

/* Sets worker i's measured task time. */
static void
set_task_ms(uint32_t i, double ms)
{
	t.c->reg.workers[i].task_ms = ms;
	t.c->reg.workers[i].has_task_ms = true;
}

/* n secure async workers admitted, each with its first task. */
static void
start_secure_async(uint32_t n, const char *extra)
{
	bench_start(&(setup){.workers = n, .secure = true, .extra = extra});
	admit_all();
	for (uint32_t i = 0; i < n; i++) {
		assert_non_null(take_round_start(i));
	}
}

static void
start_four(const char *extra)
{
	start_secure_async(4, extra);
}

/* Three workers, buffer 2: w0 and w1 make cohort 1, w2 opens cohort 2;
 * cohort 1's setup done. */
static void
three_set_up(void)
{
	start_secure_async(3, SECURE_ASYNC_ROUND);
	sa_setup(0x3);
}

/* three_set_up, and w0's input in. */
static void
three_w0_in(void)
{
	three_set_up();
	upload(0, t.fw[0].update, UINT32_MAX);
}

/* The member whose input completes a cohort gets its next task only once
 * that cohort is applied, from the model its own update is in (as plain
 * async's buffer does); a member in earlier gets its next task at once.
 * Cohort 1 is w0 and w1: w0 is in first and joins w2's cohort 2 at once;
 * w1 completes cohort 1, waits through its unmasking, and opens cohort 3
 * with the model of step 1. */
static void
test_secure_async_last_member_waits_for_step(void **state)
{
	const fb_msg *rs;

	three_w0_in();
	held_swap(0);
	rs = take_round_start(0); /* cohort 1 still runs: a task at once */
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 2);
	assert_int_equal(t.c->reg.workers[0].task_version, 0);
	upload(1, t.fw[1].update, UINT32_MAX);
	assert_int_equal(cohort_of(t.c, 1)->state, CO_UNMASK);
	assert_null(take_round_start(1));
	assert_int_equal(t.c->reg.workers[1].state, W_DONE);
	held_swap(0);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 1);
	rs = take_round_start(1);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 3); /* 2 is w2's and w0's */
	assert_int_equal(t.c->reg.workers[1].task_version, 1);
	assert_int_equal(cohort_of(t.c, 3)->state, CO_FILLING);
	bench_stop();
}

/*
 * A member whose input is in waits for its cohort's step while the
 * others' inputs are due within a quarter of its own task time, and then
 * trains from the model its update is in; the loop's timer wakes at the
 * wait's end. Cohort 1 is w0 and w1, w0's task time 1 s (500 ms once its
 * instant task is measured): w1 due in 50 ms is waited for, through the
 * unmask; due in 60 ms it is waited for until 125 ms past that, and no
 * longer; due in 2 s it is not waited for. (After a step since its task
 * was given it does not wait either: test_secure_async_no_wait_after_step.)
 */
static void
test_secure_async_member_waits_for_partner(void **state)
{
	static const int64_t due[3] = {50, 60, 2000};
	cohort *c1;
	const fb_msg *rs;

	for (int k = 0; k < 3; k++) {
		three_set_up();
		c1 = cohort_of(t.c, 1);
		set_task_ms(0, 1000);
		assert_int_equal(c1->m[1].slot, 1);
		c1->m[1].expect_ms = t.now + due[k];
		upload(0, t.fw[0].update, UINT32_MAX);
		assert_true(c1->sa.flags[0] & SA_F_INCLUDED);
		if (k == 2) {
			/* a partner due later: a task at once, from version 0 */
			rs = take_round_start(0);
			assert_non_null(rs);
			assert_int_equal(rs->u.round_start.round, 2);
			assert_int_equal(t.c->reg.workers[0].task_version, 0);
			bench_stop();
			continue;
		}
		assert_null(take_round_start(0));
		assert_int_equal(t.c->reg.workers[0].state, W_DONE);
		assert_true(t.c->reg.workers[0].task_ms > 499 &&
		            t.c->reg.workers[0].task_ms < 501);
		assert_int_equal(cohorts_next_timer(t.c, t.now, INT64_MAX),
		    due[k] + 125);
		if (k == 1) {
			/* w1 late: the wait ends 125 ms past its due time */
			advance(due[k] + 100);
			assert_null(take_round_start(0));
			advance(50);
			rs = take_round_start(0);
			assert_non_null(rs);
			assert_int_equal(t.c->reg.workers[0].task_version, 0);
			bench_stop();
			continue;
		}
		advance(20);
		upload(1, t.fw[1].update, UINT32_MAX);
		assert_int_equal(c1->state, CO_UNMASK);
		assert_null(take_round_start(0));
		assert_null(take_round_start(1));
		sa_fake_unmask(0x3);
		assert_int_equal(t.c->rd.committed, 1);
		for (uint32_t i = 0; i < 2; i++) {
			assert_non_null(take_round_start(i));
			assert_int_equal(t.c->reg.workers[i].task_version, 1);
		}
		bench_stop();
	}
}

/* A member does not wait for a partner due soon when a step was taken
 * since its task was given: its next task, at once, is from a model that
 * has moved. 4 workers: cohort 2 (w2, w3) completes and is applied while
 * cohort 1 (w0, w1) trains; then w0's input is in with w1 due in 50 ms. */
static void
test_secure_async_no_wait_after_step(void **state)
{
	cohort *c1;
	const fb_msg *rs;

	start_four(SECURE_ASYNC_ROUND);
	c1 = cohort_of(t.c, 1);
	assert_int_equal(c1->m[0].slot, 0);
	assert_int_equal(c1->m[1].slot, 1);
	assert_int_equal(cohort_of(t.c, 2)->m[0].slot, 2);
	sa_setup(0x3);
	sa_setup(0xc);
	for (uint32_t i = 0; i < 4; i++) {
		set_task_ms(i, 1000);
	}
	upload(2, t.fw[2].update, UINT32_MAX);
	held_swap(2);
	upload(3, t.fw[3].update, UINT32_MAX);
	held_swap(2);
	sa_fake_unmask(0xc);
	assert_int_equal(t.c->rd.committed, 1);
	c1->m[1].expect_ms = t.now + 50;
	upload(0, t.fw[0].update, UINT32_MAX);
	rs = take_round_start(0);
	assert_non_null(rs);
	assert_int_equal(t.c->reg.workers[0].task_version, 1);
	bench_stop();
}

/* A member whose task falls past max_staleness before its input is in is
 * cancelled at the step: a dropout of its cohort (3 slots, threshold 2),
 * which then completes with the other two and is applied. */
static void
test_secure_async_stale_member_cancelled(void **state)
{
	char line[16384];
	float before[PARAMS];
	const sent *cancel = NULL;

	bench_start(&(setup){.workers = 4, .secure = true,
	    .extra = "  mode: async\n  buffer_size: 3\n  max_staleness: 0\n"});
	admit_all();
	for (uint32_t i = 0; i < 4; i++) {
		assert_non_null(take_round_start(i));
	}
	assert_int_equal(t.fw[2].round, 1);
	assert_int_equal(t.fw[3].round, 2);
	sa_setup(0x7); /* cohort 1: w0, w1, w2 */
	sa_advertise(3, t.fw[3].rs);
	/* w0 and w1 done in cohort 1: they fill cohort 2 with w3 */
	for (uint32_t i = 0; i < 2; i++) {
		upload(i, t.fw[i].update, UINT32_MAX);
		held_swap(i);
		assert_non_null(take_round_start(i));
		assert_int_equal(t.fw[i].round, 2);
	}
	for (uint32_t i = 0; i < 2; i++) {
		sa_advertise(i, t.fw[i].rs);
	}
	sa_share(3);
	sa_share(0);
	sa_share(1);
	sa_take_shares(3);
	sa_take_shares(0);
	sa_take_shares(1);
	upload(3, t.fw[3].update, UINT32_MAX);
	upload(0, t.fw[0].update, UINT32_MAX);
	memcpy(before, t.c->params, sizeof(before));
	upload(1, t.fw[1].update, UINT32_MAX);
	sa_fake_unmask(0xb);
	/* step 1: w2's task (version 0) is now 1 step old, past 0: it is
	 * cancelled, and cohort 1 goes on with w0 and w1 */
	assert_int_equal(t.c->rd.committed, 1);
	while ((cancel = next_to(2, FB_MSG_ROUND_CANCEL)) != NULL &&
	    cancel->m.u.round_cancel.round != 1) {
	}
	assert_non_null(cancel);
	assert_non_null(strstr(cancel->m.u.round_cancel.reason,
	    "round.max_staleness"));
	assert_int_equal(cohort_of(t.c, 1)->state, CO_UNMASK);
	/* w2's input is not in cohort 1: it does not wait for its step,
	 * and takes a task in cohort 4 with w0 and w3 (whose tasks in
	 * cohort 3, of version 0 too, were cancelled alike) */
	assert_non_null(take_round_start(2));
	assert_int_equal(t.fw[2].round, 4);
	memcpy(before, t.c->params, sizeof(before));
	held_swap(0);
	held_swap(1);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 2);
	assert_true(async_error(before, (uint32_t[]){0, 1},
	                (uint32_t[]){1, 1}, 2) < 1e-5);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"cohort\": 1, \"members\": 3, "
	                             "\"dropped_stale\": 1"));
	assert_non_null(strstr(line, "\"participants\": 2"));
	assert_non_null(strstr(line, "\"included\": 2"));
	bench_stop();
}

/* A cohort with fewer inputs than its threshold fails: nothing of it is
 * applied, no step is recorded, and its members are free for new tasks. */
static void
test_secure_async_cohort_below_threshold_fails(void **state)
{
	fb_msg f = {.type = FB_MSG_ROUND_FAILED};
	uint32_t starts;

	three_w0_in();
	/* w1 fails its task: cohort 1 has 1 input, its threshold is 2 */
	starts = count_to(1, FB_MSG_ROUND_START);
	f.u.round_failed.round = 1;
	snprintf(f.u.round_failed.reason, sizeof(f.u.round_failed.reason),
	    "out of memory");
	deliver(1, &f, NULL, 0);
	assert_null(cohort_of(t.c, 1));
	assert_int_equal(t.c->cs.failed_total, 1);
	assert_int_equal(t.c->rd.committed, 0);
	assert_int_equal(metrics_lines(), 0);
	assert_memory_equal(t.c->params, t.start, sizeof(t.start));
	/* w1 is free again: a task in a new cohort */
	assert_int_equal(count_to(1, FB_MSG_ROUND_START), starts + 1);
	bench_stop();
}

/* Marks the first free cohort entry as filling with the workers in
 * `who` (a bit mask), each expected to begin its upload at `expect`: the
 * state cohort_place chooses from, made by hand. */
static cohort *
fake_filling(uint32_t id, uint32_t who, int64_t expect)
{
	uint32_t k = 0;
	cohort *co;

	while (t.c->cs.co[k].state != CO_FREE) {
		k++;
	}
	co = &t.c->cs.co[k];
	co->state = CO_FILLING;
	co->id = id;
	co->count = 0;
	for (uint32_t i = 0; i < t.n; i++) {
		if (who & (1u << i)) {
			co->m[co->count].slot = i;
			co->m[co->count].id = t.c->reg.workers[i].id;
			co->m[co->count].expect_ms = expect;
			co->count++;
		}
	}
	return co;
}

static void
fake_free(cohort *co)
{
	co->state = CO_FREE;
	co->count = 0;
	co->id = 0;
}

/* Makes two free cohort entries running by hand, into extra[]: with two
 * real cohorts of 4 live workers, the in-flight bound. */
static void
fake_running(cohort *extra[2])
{
	for (uint32_t j = 0, e = 0; e < 2; j++) {
		if (t.c->cs.co[j].state == CO_FREE) {
			extra[e] = &t.c->cs.co[j];
			extra[e]->state = CO_RUNNING;
			extra[e++]->id = 100 + j;
		}
	}
}

/* Placement by expected begin: 4 workers, buffer 3. Cohort 1 (w0, w1,
 * w2) is sealed and cohort 2 (w3) fills; a second cohort filling (id 99,
 * w2, a slow task) is made by hand. A worker goes to the one whose
 * expected begin is nearest its own, never to one it is in, to a far one
 * rather than waiting, and opens none past the bound or where the
 * cohorts filling could not all be filled. */
static void
test_secure_async_placement(void **state)
{
	cohort *co2, *slow, *extra[2];
	worker *w0, *w3;
	int64_t now;

	start_four("  mode: async\n  buffer_size: 3\n  max_staleness: 4\n");
	now = t.now;
	w0 = &t.c->reg.workers[0];
	w3 = &t.c->reg.workers[3];
	co2 = cohort_of(t.c, 2);
	assert_non_null(co2);
	assert_int_equal(co2->state, CO_FILLING);
	assert_int_equal(co2->count, 1);
	/* no measure yet: its expectation is unknown */
	assert_int_equal(co2->m[0].expect_ms, 0);
	co2->m[0].expect_ms = now + 1000;
	slow = fake_filling(99, 0x4, now + 8000);
	/* a fast task (1 s) goes with w3's, a slow one (7 s) with w2's */
	set_task_ms(0, 1000);
	assert_ptr_equal(cohort_place(t.c, w0, now), co2);
	set_task_ms(0, 7000);
	assert_ptr_equal(cohort_place(t.c, w0, now), slow);
	/* later, both members past due: a tie, the older cohort */
	assert_ptr_equal(cohort_place(t.c, w0, now + 9000), co2);
	/* one slot each: w3 (in cohort 2) goes to the other, however far */
	set_task_ms(3, 500);
	assert_ptr_equal(cohort_place(t.c, w3, now), slow);
	/* w0 far from both still joins one rather than wait */
	set_task_ms(0, 100000);
	assert_ptr_equal(cohort_place(t.c, w0, now), slow);
	/* w3 in both: a third cohort would leave 6 slots to fill from the
	 * one live worker outside them: it waits */
	slow->m[slow->count].slot = 3;
	slow->m[slow->count].id = w3->id;
	slow->count++;
	assert_null(cohort_place(t.c, w3, now));
	fake_free(slow);
	/* the in-flight bound: 4 live workers, 4 cohorts in flight (2 real,
	 * 2 made running by hand): no new one */
	fake_running(extra);
	assert_null(cohort_place(t.c, w3, now));
	fake_free(extra[0]);
	fake_free(extra[1]);
	bench_stop();
}

/* Long tasks are mixed with short ones: 4 workers, buffer 2, tasks of
 * 1, 1, 2 and 4 s (w2 and w3 long: at least 1.5x the shortest). With
 * w3 alone in a cohort filling (made by hand), a short task joins it; a
 * long one (w2) opens a cohort of its own, and joins w3's only when it
 * may not open one (the in-flight bound) or when its tasks are short
 * after all. */
static void
test_secure_async_long_tasks_mix(void **state)
{
	cohort *slow, *extra[2], *opened;
	worker *w0, *w2;
	int64_t now;
	uint32_t next;

	start_four(SECURE_ASYNC_ROUND);
	now = t.now;
	w0 = &t.c->reg.workers[0];
	w2 = &t.c->reg.workers[2];
	set_task_ms(0, 1000);
	set_task_ms(1, 1000);
	set_task_ms(2, 2000);
	set_task_ms(3, 4000);
	slow = fake_filling(99, 0x8, now + 4000);
	/* a short task joins the long one's cohort */
	assert_ptr_equal(cohort_place(t.c, w0, now), slow);
	/* the in-flight bound reached (2 real, 2 made running by hand):
	 * the long task joins rather than wait */
	fake_running(extra);
	assert_ptr_equal(cohort_place(t.c, w2, now), slow);
	fake_free(extra[0]);
	fake_free(extra[1]);
	/* w2's tasks about as short as w0's: it joins */
	set_task_ms(2, 1200);
	assert_ptr_equal(cohort_place(t.c, w2, now), slow);
	/* tasks that do no work (the shortest under 1 ms): none is long,
	 * w2's 2 s tasks included */
	set_task_ms(2, 2000);
	set_task_ms(0, 0);
	assert_ptr_equal(cohort_place(t.c, w2, now), slow);
	set_task_ms(0, 1000);
	/* long again: a cohort of its own, the next one opened */
	next = t.c->cs.next_id;
	opened = cohort_place(t.c, w2, now);
	assert_non_null(opened);
	assert_ptr_not_equal(opened, slow);
	assert_int_equal(opened->id, next);
	assert_int_equal(opened->state, CO_FILLING);
	assert_int_equal(opened->count, 0);
	bench_stop();
}

/*
 * A task expected past round.max_staleness (its age plus the steps due
 * before its expected begin, at the smoothed time between steps) is
 * doomed: it will be cancelled before its input is in, and with
 * buffer_size 2 its cohort fails with it. 4 workers, max_staleness 4,
 * steps 1 s apart: w3's 9 s task is doomed, and no other worker joins
 * its cohort (w0 opens one); with steps 3 s apart, or the step time not
 * known, it is not, and w0 joins it. A doomed worker itself joins no
 * cohort of others: it opens its own, or waits at the in-flight bound.
 */
static void
test_secure_async_doomed_task_alone(void **state)
{
	cohort *slow, *fast, *opened, *own;
	worker *w0, *w3;
	int64_t now;
	uint32_t next, round3;

	start_four(SECURE_ASYNC_ROUND);
	now = t.now;
	w0 = &t.c->reg.workers[0];
	w3 = &t.c->reg.workers[3];
	set_task_ms(0, 1000);
	set_task_ms(1, 1000);
	set_task_ms(2, 1000);
	set_task_ms(3, 9000);
	slow = fake_filling(99, 0x8, now + 9000);
	slow->m[0].version = t.c->rd.committed;
	round3 = w3->task_round;
	w3->task_round = 99; /* on its task */
	t.c->cs.step_ms = 3000; /* 3 steps to its begin: not doomed */
	assert_ptr_equal(cohort_place(t.c, w0, now), slow);
	t.c->cs.step_ms = 0; /* not known */
	assert_ptr_equal(cohort_place(t.c, w0, now), slow);
	t.c->cs.step_ms = 1000; /* 9 steps: doomed */
	next = t.c->cs.next_id;
	opened = cohort_place(t.c, w0, now);
	assert_non_null(opened);
	assert_ptr_not_equal(opened, slow);
	assert_int_equal(opened->id, next);
	assert_int_equal(opened->count, 0);
	/* w3 itself, doomed: at the in-flight bound (cohorts 1, 2, 99 and
	 * the one opened) it waits rather than join a cohort of others */
	fast = fake_filling(98, 0x1, now + 1000);
	assert_null(cohort_place(t.c, w3, now));
	fake_free(fast);
	fake_free(opened);
	/* below the bound: a cohort of its own */
	next = t.c->cs.next_id;
	own = cohort_place(t.c, w3, now);
	assert_non_null(own);
	assert_int_equal(own->id, next);
	assert_int_equal(own->count, 0);
	w3->task_round = round3;
	bench_stop();
}

/*
 * A filling cohort whose only member's task is cancelled past
 * round.max_staleness is closed at once, not failed: no input can come,
 * and nothing of it is lost. The cancelled task's running time is a
 * lower bound of the worker's task time, taken as its measure when it
 * has none. 3 workers, buffer 2, max_staleness 0: cohort 1 (w0, w1),
 * cohort 2 (w2, doomed by hand): w0, in first, keeps away from cohort 2
 * (it opens cohort 3); at step 1, w2's task is one step old and
 * cancelled.
 */
static void
test_secure_async_doomed_cohort_closed(void **state)
{
	cohort *co2;
	const sent *cancel = NULL;
	const fb_msg *rs;
	char line[16384];
	worker *w2;

	start_secure_async(3,
	    "  mode: async\n  buffer_size: 2\n  max_staleness: 0\n");
	sa_setup(0x3);
	sa_advertise(2, t.fw[2].rs);
	w2 = &t.c->reg.workers[2];
	co2 = cohort_of(t.c, 2);
	assert_non_null(co2);
	assert_int_equal(co2->state, CO_FILLING);
	assert_false(w2->has_task_ms);
	t.c->cs.step_ms = 1000;
	co2->m[0].expect_ms = t.now + 5000;
	advance(700);
	upload(0, t.fw[0].update, UINT32_MAX);
	held_swap(0);
	rs = take_round_start(0);
	assert_non_null(rs);
	assert_int_equal(rs->u.round_start.round, 3); /* not cohort 2 */
	assert_int_equal(co2->count, 1);
	upload(1, t.fw[1].update, UINT32_MAX);
	held_swap(0);
	sa_fake_unmask(0x3);
	assert_int_equal(t.c->rd.committed, 1);
	while ((cancel = next_to(2, FB_MSG_ROUND_CANCEL)) != NULL &&
	    cancel->m.u.round_cancel.round != 2) {
	}
	assert_non_null(cancel);
	assert_non_null(strstr(cancel->m.u.round_cancel.reason,
	    "round.max_staleness"));
	assert_null(cohort_of(t.c, 2));
	assert_int_equal(t.c->cs.failed_total, 0);
	assert_true(w2->has_task_ms);
	assert_true(w2->task_ms >= 700);
	last_metrics(line, sizeof(line));
	assert_non_null(strstr(line, "\"cohort\": 1, "));
	assert_non_null(strstr(line, "\"cohorts_failed\": 0"));
	bench_stop();
}

/* A cohort with a doomed task is not waited on to fill: 3 workers,
 * buffer 2, cohort 1 (w0, w1) sealed and cohort 2 (w2) filling with a
 * doomed task. w0, free, opens cohort 3: the live workers outside the
 * filling cohorts cannot fill both, but nobody is to fill cohort 2 (were
 * it counted, w0 and w1 would wait, and with no step taken, cohort 2's
 * task would never be cancelled). */
static void
test_secure_async_doomed_not_waited_on(void **state)
{
	cohort *co2, *opened;
	worker *w0;
	uint32_t next;

	start_secure_async(3, SECURE_ASYNC_ROUND);
	w0 = &t.c->reg.workers[0];
	co2 = cohort_of(t.c, 2);
	assert_non_null(co2);
	assert_int_equal(co2->state, CO_FILLING);
	co2->m[0].expect_ms = t.now + 9000;
	/* step time not known: cohort 2 is to be filled, and w0 joins it */
	assert_ptr_equal(cohort_place(t.c, w0, t.now), co2);
	t.c->cs.step_ms = 1000; /* 9 steps to its begin, past 4: doomed */
	next = t.c->cs.next_id;
	opened = cohort_place(t.c, w0, t.now);
	assert_non_null(opened);
	assert_int_equal(opened->id, next);
	bench_stop();
}

/* A worker's task time is measured from its RoundStart to its
 * UpdateBegin; each cohort's deadline and setup end set the loop's
 * timeout. */
static void
test_secure_async_task_time_and_timer(void **state)
{
	const cohort *c1, *c2;
	int64_t t0, want;

	bench_start(&(setup){.workers = 3, .secure = true,
	    .extra = SECURE_ASYNC_ROUND});
	admit_all();
	t0 = t.now;
	for (uint32_t i = 0; i < 3; i++) {
		assert_non_null(take_round_start(i));
	}
	c1 = cohort_of(t.c, 1);
	c2 = cohort_of(t.c, 2);
	assert_int_equal(c1->state, CO_RUNNING);
	assert_int_equal(c2->state, CO_FILLING);
	want = c1->sa.phase_end_ms;
	want = c1->deadline_ms < want ? c1->deadline_ms : want;
	want = c2->opened_ms + t.c->cfg->deadline_ms < want
	           ? c2->opened_ms + t.c->cfg->deadline_ms
	           : want;
	assert_int_equal(cohorts_next_timer(t.c, t.now, INT64_MAX),
	    want - t.now);
	assert_true(cohorts_next_timer(t.c, t.now, 7) == 7);
	sa_setup(0x3);
	assert_int_equal(c1->sa.phase, SA_INPUT);
	assert_true(c1->input_ms != 0);
	advance(1500);
	assert_false(t.c->reg.workers[0].has_task_ms);
	upload(0, t.fw[0].update, UINT32_MAX);
	assert_true(t.c->reg.workers[0].has_task_ms);
	assert_true(t.c->reg.workers[0].task_ms >= (double)(t.now - t0) - 1 &&
	            t.c->reg.workers[0].task_ms <= (double)(t.now - t0));
	bench_stop();
}

FB_TESTS = {
	{"the final round only evaluates: no step, a final line",
	    test_final_round_only_evaluates},
	{"a plain round writes the federated evaluation's weighted means",
	    test_plain_round_federated_evaluation},
	{"a secure round sums the federated evaluation under the masks",
	    test_secure_round_federated_evaluation},
	{"a worker's out-of-range evaluation is left out",
	    test_plain_bad_evaluation_left_out},
    {"a plain round goes idle, train, aggregate, record with FedAvg weights",
        test_plain_round_phases_and_fedavg},
    {"idle waits for min_workers, then times out the run",
        test_idle_waits_then_times_out},
    {"a worker lost in training leaves and the round commits",
        test_worker_lost_in_training},
    {"a worker's RoundFailed takes it out at once, with its reason",
        test_worker_round_failed_plain},
    {"a worker cut off mid-upload in plain mode counts as partial",
        test_worker_cut_mid_upload_plain},
    {"a worker lost mid-upload in plain mode leaves the round",
        test_worker_lost_mid_upload_plain},
    {"the deadline cancels stragglers and commits (drop)",
        test_deadline_drops_stragglers},
    {"stragglers wait: overtime commits with the late update",
        test_stragglers_wait},
    {"too few updates for the quorum fail the round, model unchanged",
        test_quorum_not_met_fails_round},
    {"over-selection keeps the first updates and cancels the rest",
        test_over_selection_keeps_first},
    {"plain FedNova steps by the library's tau_eff", test_fednova_plain_scale},
    {"a secure round passes prepare, train, unmask, aggregate, record",
        test_secure_round_phases},
    {"secure: round 2 set up during round 1 is taken as it was set up",
        test_secure_round_set_up_ahead},
    {"secure: a dropout of a round set up ahead; a worker back sets up anew",
        test_secure_ahead_dropout_and_return},
    {"secure: the next round waits for its setup under way, then takes it",
        test_secure_round_waits_for_its_setup},
    {"secure: a round done before 50 ms sets the next up after its sum",
        test_secure_short_round_sets_up_after_its_sum},
    {"a secure round with the job thread commits the same model",
        test_secure_round_with_job_thread},
    {"model chunks sealed on fetch are the bytes the trailer signs",
        test_seal_on_fetch_round},
    {"the seal threads send each worker's chunks in order",
        test_seal_on_fetch_threads},
    {"a fetcher that stops reading pins only its share of fetch_memory",
        test_seal_on_fetch_stalled_fetcher},
    {"secure: a worker lost before its advert is left out",
        test_secure_worker_lost_in_setup},
    {"secure: a worker lost after its input stays included",
        test_secure_worker_lost_after_input},
    {"secure: a worker's RoundFailed after the setup is a dropout",
        test_secure_worker_round_failed},
    {"secure: an update stream in the old digest mode is refused",
        test_secure_old_stream_mode_refused},
    {"secure: masked uploads take turns for max_uploads buffers",
        test_secure_masked_uploads_take_turns},
    {"secure: max_uploads 0, a cut upload in the sum starts it again",
        test_secure_cut_upload_restarts_the_sum},
    {"secure: a worker cut off mid-upload is a dropout; the round commits",
        test_secure_worker_cut_mid_upload},
    {"secure: too few reveals by unmask_timeout abort the round",
        test_secure_too_few_reveals_aborts},
    {"secure FedNova steps by the decoded tau_eff", test_secure_fednova_scale},
    {"secure: a poisoned masked input is refused after unmasking",
        test_secure_poisoned_input_refused},
    {"secure: a malicious weight claim is refused after unmasking",
        test_secure_bad_weight_refused},
    {"a worker whose queue stays full is dropped", test_full_queue_drops_worker},
    {"update chunks go up on credit from one budget for all workers",
        test_upload_credits_one_budget},
    {"a worker that reconnects during training rejoins the round",
        test_reconnected_worker_rejoins_round},
    {"secure: a worker back before its advert rejoins, after it does not",
        test_secure_reconnect_rejoins_before_advert},
    {"a closed connection drops its worker at once",
        test_closed_connection_drops_at_once},
    {"bytes that move keep a worker whose messages take long",
        test_bytes_moving_keep_workers},
    {"admission refuses a taken data index and an oversized sample count",
        test_admission_refusals},
    {"plain FedNova refuses a normaliser above the round's bound",
        test_fednova_normaliser_bound},
    {"a malicious plain worker moves the model within the documented bound",
        test_plain_malicious_worker_bounded},
    {"secure: too few confirmations of the included set abort the round",
        test_secure_too_few_confirmations_abort},
    {"secure: a refusal to reveal aborts the round at once",
        test_secure_refusal_aborts_at_once},
    {"secure: a confirmation of another set is refused and not counted",
        test_secure_other_set_not_counted},
    {"secure: a time budget goes to the workers, and no speed is kept",
        test_secure_time_budget_private},
    {"async: free workers get tasks, the buffer steps with staleness weights",
        test_async_buffer_steps_with_staleness},
    {"async: an update past max_staleness is dropped and counted",
        test_async_too_stale_dropped},
    {"async: uploads under way finish into the full buffer, a begin waits",
        test_async_overtime_and_held_begin},
    {"async: a failed task's worker gets a task in the next buffer",
        test_async_failed_task_waits_next_buffer},
    {"async: a worker lost mid-task is not waited for",
        test_async_worker_lost_not_waited_for},
    {"lr_decay cosine: round t's RoundStart has the reference's lr",
        test_lr_decay_sync_by_round},
    {"lr_decay none: every RoundStart has round.lr, bit for bit",
        test_lr_decay_none_is_constant},
    {"lr_decay async: a task's lr is its model version + 1's",
        test_lr_decay_async_by_version},
    {"secure async: two cohorts in flight, a slow member holds back its own",
        test_secure_async_cohorts_in_flight},
    {"secure async: a cohort's last member's next task is from its step",
        test_secure_async_last_member_waits_for_step},
    {"secure async: a member waits for a partner due soon, not a late one",
        test_secure_async_member_waits_for_partner},
    {"secure async: after a step since its task, a member does not wait",
        test_secure_async_no_wait_after_step},
    {"secure async: a member past max_staleness is a dropout, recovered",
        test_secure_async_stale_member_cancelled},
    {"secure async: a cohort below its threshold fails, nothing applied",
        test_secure_async_cohort_below_threshold_fails},
    {"secure async: tasks placed by expected begin, bounded",
        test_secure_async_placement},
    {"secure async: a long task opens a cohort rather than join long ones",
        test_secure_async_long_tasks_mix},
    {"secure async: a task doomed past max_staleness is left alone",
        test_secure_async_doomed_task_alone},
    {"secure async: a filling cohort with no member left is closed",
        test_secure_async_doomed_cohort_closed},
    {"secure async: a cohort with a doomed task is not waited on to fill",
        test_secure_async_doomed_not_waited_on},
    {"secure async: task time measured, cohort timers",
        test_secure_async_task_time_and_timer},
    {NULL, NULL},
};

FB_TEST_MAIN("round")
