/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto_test.c -- unit tests of proto/: every message survives pack and
 * unpack; every way a peer can get frame 0 wrong is FB_EPROTO (hand-built
 * protobufs, truncations, random bytes, oversize frames and strings, payload
 * flags); and the ZeroMQ link over real TCP sockets, including a raw libzmq
 * DEALER that sends malformed multipart messages, and the door's limits
 * on connections that have not authenticated (raw TCP connections from
 * loopback addresses of their own).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "common/util.h"
#include "crypto/crypto.h"
#include "proto/proto.h"
#include "tests/unit/harness.h"

/* ---- helpers: messages -------------------------------------------------- */

static void
fill_text(char *dst, size_t cap, const char *s)
{
	assert_true(strlen(s) < cap);
	memcpy(dst, s, strlen(s) + 1);
}

/* sample_msg fills *m (zeroed first) with non-default values in every
 * field of type t. */
static void
sample_msg(fb_msg_type t, fb_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = t;
	switch (t) {
	case FB_MSG_HELLO:
		m->u.hello.protocol_version = FB_PROTOCOL_VERSION;
		fill_text(m->u.hello.name, FB_NAME_MAX, "worker-07 \xc3\xa9");
		m->u.hello.worker_index = 7;
		m->u.hello.num_samples = 60000ULL * 1000000ULL;
		fill_text(m->u.hello.backend, FB_TEXT_MAX,
		    "cuda: 2 x NVIDIA H200 (fp32)");
		fill_text(m->u.hello.software, FB_NAME_MAX, "fedbox 0.1.0");
		m->u.hello.session = 0xfedcba9876543210ULL;
		m->u.hello.lane = 3;
		break;
	case FB_MSG_WELCOME:
		m->u.welcome.protocol_version = 3;
		m->u.welcome.run_id = UINT64_MAX - 5;
		m->u.welcome.worker_id = 12;
		m->u.welcome.heartbeat_ms = 500;
		m->u.welcome.liveness_ms = 5000;
		m->u.welcome.chunk_bytes = 1 << 20;
		fill_text(m->u.welcome.model.arch, 32, "plugin");
		m->u.welcome.model.input_dim = 784;
		m->u.welcome.model.classes = 10;
		for (uint32_t i = 0; i < FB_PROTO_MAX_HIDDEN; i++) {
			m->u.welcome.model.hidden[i] = 100000 + i;
		}
		m->u.welcome.model.hidden_count = FB_PROTO_MAX_HIDDEN;
		m->u.welcome.model.synthetic_params = 1ULL << 40;
		m->u.welcome.model.task = 1;
		fill_text(m->u.welcome.model.plugin, FB_TEXT_MAX,
		    "tiny-tanh.so");
		m->u.welcome.param_count = 123456789012ULL;
		break;
	case FB_MSG_REJECT:
		fill_text(m->u.reject.reason, FB_TEXT_MAX,
		    "duplicate worker name");
		m->u.reject.protocol_version = 9;
		break;
	case FB_MSG_ROUND_START:
		m->u.round_start.round = 41;
		m->u.round_start.evaluate_only = true;
		m->u.round_start.param_count = 5000000000ULL;
		m->u.round_start.chunk_count = 4769;
		m->u.round_start.chunk_bytes = 1 << 20;
		m->u.round_start.local_steps = 1ULL << 33;
		m->u.round_start.batch_size = 64;
		m->u.round_start.lr = 0.05f;
		m->u.round_start.momentum = 0.9f;
		m->u.round_start.weight_decay = -1e-4f;
		m->u.round_start.seed = 0x123456789abcdefULL;
		m->u.round_start.deadline_ms = 30000;
		m->u.round_start.synthetic = true;
		memset(m->u.round_start.round_key.b, 0xab, 32);
		m->u.round_start.round_key.len = 32;
		memset(m->u.round_start.stream_header.b, 0x5c, 32);
		m->u.round_start.stream_header.len = 32;
		memset(m->u.round_start.stream_trailer.b, 0x01, 140);
		m->u.round_start.stream_trailer.len = 140;
		m->u.round_start.prox_mu = 0.01f;
		m->u.round_start.fednova = true;
		m->u.round_start.local_epochs = 2.5f;
		m->u.round_start.first_chunk = 9;
		m->u.round_start.secagg = true;
		m->u.round_start.sa_slot = 4;
		m->u.round_start.sa_n = 128;
		m->u.round_start.sa_degree = 22;
		m->u.round_start.sa_threshold = 12;
		memset(m->u.round_start.sa_graph_seed.b, 0x3d, 32);
		m->u.round_start.sa_graph_seed.len = 32;
		m->u.round_start.sa_ring_bits = 24;
		m->u.round_start.sa_clip = 0.125;
		m->u.round_start.sa_max_samples = 1ULL << 40;
		m->u.round_start.sa_a_bound = 1234.5;
		m->u.round_start.sa_max_staleness = 1000000;
		m->u.round_start.sa_set_up = true;
		break;
	case FB_MSG_SECAGG:
		m->u.secagg.round = 9;
		m->u.secagg.phase = FB_SA_SETUP;
		m->u.secagg.count = 70000;
		m->u.secagg.ahead = true;
		break;
	case FB_MSG_MODEL_FETCH:
		m->u.model_fetch.round = 3;
		m->u.model_fetch.chunk = 4;
		break;
	case FB_MSG_MODEL_CHUNK:
		m->u.model_chunk.round = UINT32_MAX;
		m->u.model_chunk.chunk = 77;
		break;
	case FB_MSG_UPDATE_BEGIN:
		m->u.update_begin.round = 5;
		m->u.update_begin.num_samples = 6000;
		m->u.update_begin.param_count = 101770;
		m->u.update_begin.chunk_count = 2;
		m->u.update_begin.steps = 94;
		m->u.update_begin.train_loss = 0.4321;
		m->u.update_begin.train_seconds = 1.5e-3;
		fill_text(m->u.update_begin.backend, FB_TEXT_MAX, "cpu");
		memset(m->u.update_begin.stream_key.b, 0x77, 32);
		m->u.update_begin.stream_key.len = 32;
		memset(m->u.update_begin.stream_header.b, 0x78, 32);
		m->u.update_begin.stream_header.len = 32;
		m->u.update_begin.eval_examples = 2500;
		m->u.update_begin.eval_loss = 0.25;
		m->u.update_begin.eval_accuracy = 0.875;
		m->u.update_begin.eval_metric_count = FB_WIRE_METRICS_MAX;
		for (int k = 0; k < FB_WIRE_METRICS_MAX; k++) {
			snprintf(m->u.update_begin.eval_name[k],
			    FB_WIRE_METRIC_NAME, "metric_%d_%.*s", k, 20,
			    "abcdefghijklmnopqrstuvwxyz");
			m->u.update_begin.eval_metric[k] = 0.5 + k;
		}
		break;
	case FB_MSG_UPDATE_END:
		m->u.update_end.round = 5;
		memset(m->u.update_end.stream_trailer.b, 0xee, 140);
		m->u.update_end.stream_trailer.len = 140;
		break;
	case FB_MSG_HANDSHAKE:
		for (int i = 0; i < 164; i++) {
			m->u.handshake.data.b[i] = (uint8_t)(i * 7);
		}
		m->u.handshake.data.len = 164;
		m->u.handshake.lane = 1;
		break;
	case FB_MSG_REDIRECT:
		m->u.redirect.lane = 5;
		m->u.redirect.port = 65535;
		break;
	case FB_MSG_UPDATE_CHUNK:
		m->u.update_chunk.round = 5;
		m->u.update_chunk.chunk = 1;
		break;
	case FB_MSG_UPDATE_CREDIT:
		m->u.update_credit.round = 6;
		m->u.update_credit.chunks = 8;
		break;
	case FB_MSG_HEARTBEAT:
		m->u.heartbeat.round = 8;
		break;
	case FB_MSG_ROUND_CANCEL:
		m->u.round_cancel.round = 9;
		fill_text(m->u.round_cancel.reason, FB_TEXT_MAX,
		    "deadline passed");
		break;
	case FB_MSG_ROUND_FAILED:
		m->u.round_failed.round = 10;
		fill_text(m->u.round_failed.reason, FB_TEXT_MAX,
		    "the trainer exited with status 1");
		break;
	case FB_MSG_SHUTDOWN:
		fill_text(m->u.shutdown.reason, FB_TEXT_MAX, "run complete");
		break;
	default:
		fail_msg("no sample for type %d", (int)t);
	}
}

/* A decoded message is sane: a known type, strings terminated in their
 * fields, counts in range. */
static void
assert_msg_sane(const fb_msg *m)
{
	uint8_t buf[FB_MAX_CONTROL_LEN];
	size_t len = 0;
	assert_true(m->type > FB_MSG_NONE && m->type < FB_MSG_TYPE_COUNT_);
	if (m->type == FB_MSG_WELCOME) {
		assert_true(m->u.welcome.model.hidden_count <=
		    FB_PROTO_MAX_HIDDEN);
		assert_non_null(memchr(m->u.welcome.model.arch, 0, 32));
		assert_non_null(
		    memchr(m->u.welcome.model.plugin, 0, FB_TEXT_MAX));
	}
	if (m->type == FB_MSG_HELLO) {
		assert_non_null(memchr(m->u.hello.name, 0, FB_NAME_MAX));
		assert_non_null(memchr(m->u.hello.software, 0, FB_NAME_MAX));
		assert_non_null(memchr(m->u.hello.backend, 0, FB_TEXT_MAX));
	}
	/* whatever decodes can be sent again */
	assert_int_equal(fb_msg_pack(m, buf, sizeof(buf), &len), FB_OK);
}

/* ---- helpers: hand-built protobuf --------------------------------------- */

typedef struct pbuf {
	uint8_t b[3 * FB_MAX_CONTROL_LEN];
	size_t n;
} pbuf;

static void
pb_raw(pbuf *p, const void *d, size_t len)
{
	assert_true(p->n + len <= sizeof(p->b));
	memcpy(p->b + p->n, d, len);
	p->n += len;
}

static void
pb_varint(pbuf *p, uint64_t v)
{
	uint8_t c;
	do {
		c = (uint8_t)(v & 0x7f);
		v >>= 7;
		c |= v ? 0x80 : 0;
		pb_raw(p, &c, 1);
	} while (v);
}

static void
pb_uint(pbuf *p, unsigned field, uint64_t v)
{
	pb_varint(p, (uint64_t)field << 3);
	pb_varint(p, v);
}

static void
pb_bytes(pbuf *p, unsigned field, const void *d, size_t len)
{
	pb_varint(p, (uint64_t)field << 3 | 2);
	pb_varint(p, len);
	pb_raw(p, d, len);
}

static void
pb_str(pbuf *p, unsigned field, const char *s)
{
	pb_bytes(p, field, s, strlen(s));
}

/* frame builds prefix + Envelope{ body_field: body }. */
static void
frame(pbuf *out, uint8_t flags, unsigned body_field, const pbuf *body)
{
	uint8_t prefix[4] = {'F', 'B', 1, flags};
	out->n = 0;
	pb_raw(out, prefix, 4);
	if (body != NULL) {
		pb_bytes(out, body_field, body->b, body->n);
	}
}

static fb_err
unpack_pbuf(const pbuf *p, fb_msg *m)
{
	const char *why = NULL;
	fb_err rc = fb_msg_unpack(p->b, p->n, m, &why);
	if (rc != FB_OK) {
		assert_int_equal(rc, FB_EPROTO);
		assert_non_null(why);
	}
	return rc;
}

/* A hello whose name is `name`. */
static fb_err
hello_named(const char *field_value, unsigned field)
{
	pbuf body = {0}, f;
	fb_msg m;
	pb_uint(&body, 1, 1);
	pb_str(&body, field, field_value);
	frame(&f, 0, 1, &body);
	return unpack_pbuf(&f, &m);
}

/* An UpdateBegin with `n` evaluation metrics, the first named `name0`. */
static fb_err
update_begin_metrics(uint32_t n, const char *name0)
{
	pbuf body = {0}, met, f;
	fb_msg m;

	pb_uint(&body, 1, 3);
	for (uint32_t k = 0; k < n; k++) {
		char name[64];
		snprintf(name, sizeof(name), "m%u", k);
		met.n = 0;
		pb_str(&met, 1, k == 0 ? name0 : name);
		pb_bytes(&body, 33, met.b, met.n);
	}
	frame(&f, 0, 7, &body);
	return unpack_pbuf(&f, &m);
}

/* A peer's evaluation metrics: at most 8, with names that fit and hold
 * no control bytes. */
static void
test_update_begin_metrics_bounded(void **state)
{
	char longname[FB_WIRE_METRIC_NAME + 1];

	memset(longname, 'x', FB_WIRE_METRIC_NAME);
	longname[FB_WIRE_METRIC_NAME] = '\0';
	assert_int_equal(update_begin_metrics(FB_WIRE_METRICS_MAX, "ok"),
	    FB_OK);
	assert_int_equal(update_begin_metrics(FB_WIRE_METRICS_MAX + 1, "ok"),
	    FB_EPROTO);
	assert_int_equal(update_begin_metrics(1, longname), FB_EPROTO);
	longname[FB_WIRE_METRIC_NAME - 1] = '\0'; /* 31 bytes: fits */
	assert_int_equal(update_begin_metrics(1, longname), FB_OK);
	assert_int_equal(update_begin_metrics(1, "a\nb"), FB_EPROTO);
}

/* ---- message tests ------------------------------------------------------ */

static void
test_roundtrip_every_type(void **state)
{
	for (int t = FB_MSG_HELLO; t < FB_MSG_TYPE_COUNT_; t++) {
		fb_msg m, out;
		uint8_t buf[FB_MAX_CONTROL_LEN];
		size_t len = 0;
		const char *why = NULL;

		sample_msg((fb_msg_type)t, &m);
		assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len),
		    FB_OK);
		assert_true(len > FB_WIRE_PREFIX_LEN && len <= sizeof(buf));
		assert_int_equal(buf[3] & 1, fb_msg_has_payload(m.type));
		memset(&out, 0xa5, sizeof(out));
		assert_int_equal(fb_msg_unpack(buf, len, &out, &why), FB_OK);
		assert_memory_equal(&m, &out, sizeof(m));
		assert_string_not_equal(fb_msg_type_name((fb_msg_type)t),
		    "unknown");
		/* exact capacity is enough, one byte less is not */
		size_t len2 = 0;
		assert_int_equal(fb_msg_pack(&m, buf, len, &len2), FB_OK);
		assert_int_equal(len2, len);
		assert_int_equal(fb_msg_pack(&m, buf, len - 1, &len2),
		    FB_ERANGE);
	}
	assert_true(fb_msg_has_payload(FB_MSG_MODEL_CHUNK));
	assert_true(fb_msg_has_payload(FB_MSG_UPDATE_CHUNK));
	assert_false(fb_msg_has_payload(FB_MSG_HELLO));
	assert_string_equal(fb_msg_type_name(FB_MSG_ROUND_START),
	    "round_start");
	assert_string_equal(fb_msg_type_name((fb_msg_type)999), "unknown");
}

static void
test_default_values_roundtrip(void **state)
{
	/* all-zero fields (proto3 omits them on the wire) come back zero */
	for (int t = FB_MSG_HELLO; t < FB_MSG_TYPE_COUNT_; t++) {
		fb_msg m, out;
		uint8_t buf[FB_MAX_CONTROL_LEN];
		size_t len = 0;
		memset(&m, 0, sizeof(m));
		m.type = (fb_msg_type)t;
		if (t == FB_MSG_SECAGG) {
			m.u.secagg.phase = FB_SA_ADVERT; /* 0 is no phase */
		}
		assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len),
		    FB_OK);
		assert_int_equal(fb_msg_unpack(buf, len, &out, NULL), FB_OK);
		assert_memory_equal(&m, &out, sizeof(m));
	}
}

static void
test_pack_refuses_unknown_type(void **state)
{
	fb_msg m;
	uint8_t buf[FB_MAX_CONTROL_LEN];
	size_t len = 99;
	int bad[] = {FB_MSG_NONE, FB_MSG_TYPE_COUNT_, 200, -1};

	for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
		memset(&m, 0, sizeof(m));
		m.type = (fb_msg_type)bad[i];
		len = 99;
		assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len),
		    FB_EINVAL);
		assert_int_equal(len, 0);
	}
	/* too many hidden sizes cannot be packed either */
	sample_msg(FB_MSG_WELCOME, &m);
	m.u.welcome.model.hidden_count = FB_PROTO_MAX_HIDDEN + 1;
	assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len), FB_EINVAL);
	/* nor a model task other than classification (0), regression (1) */
	sample_msg(FB_MSG_WELCOME, &m);
	m.u.welcome.model.task = 2;
	assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len), FB_EINVAL);
}

static void
test_bad_prefix(void **state)
{
	fb_msg m;
	uint8_t buf[FB_MAX_CONTROL_LEN];
	size_t len = 0;
	const char *why = NULL;

	sample_msg(FB_MSG_HEARTBEAT, &m);
	assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len), FB_OK);
	for (size_t short_len = 0; short_len < FB_WIRE_PREFIX_LEN;
	     short_len++) {
		why = NULL;
		assert_int_equal(fb_msg_unpack(buf, short_len, &m, &why),
		    FB_EPROTO);
		assert_non_null(why);
		assert_int_equal(m.type, FB_MSG_NONE);
	}
	for (int i = 0; i < 2; i++) {
		uint8_t save = buf[i];
		buf[i] ^= 0x20;
		assert_int_equal(fb_msg_unpack(buf, len, &m, NULL), FB_EPROTO);
		buf[i] = save;
	}
	assert_int_equal(fb_msg_unpack(buf, len, &m, NULL), FB_OK);
}

static void
test_wrong_wire_version(void **state)
{
	fb_msg m;
	uint8_t buf[FB_MAX_CONTROL_LEN];
	size_t len = 0;
	const char *why = NULL;
	uint8_t versions[] = {0, 2, 255};

	sample_msg(FB_MSG_HELLO, &m);
	assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len), FB_OK);
	assert_int_equal(buf[2], 1);
	for (size_t i = 0; i < FB_ARRAY_LEN(versions); i++) {
		buf[2] = versions[i];
		assert_int_equal(fb_msg_unpack(buf, len, &m, &why), FB_EPROTO);
		assert_non_null(strstr(why, "version"));
	}
}

static void
test_every_truncation(void **state)
{
	for (int t = FB_MSG_HELLO; t < FB_MSG_TYPE_COUNT_; t++) {
		fb_msg m, out;
		uint8_t buf[FB_MAX_CONTROL_LEN];
		size_t len = 0;
		sample_msg((fb_msg_type)t, &m);
		assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len),
		    FB_OK);
		for (size_t cut = 0; cut < len; cut++) {
			/* a fresh heap copy of exactly `cut` bytes, so ASan
			 * catches any read past the end */
			uint8_t *p = malloc(cut ? cut : 1);
			assert_non_null(p);
			memcpy(p, buf, cut);
			fb_err rc = fb_msg_unpack(p, cut, &out, NULL);
			if (rc == FB_OK) {
				assert_msg_sane(&out);
			} else {
				assert_int_equal(rc, FB_EPROTO);
				assert_int_equal(out.type, FB_MSG_NONE);
			}
			free(p);
		}
	}
}

static void
test_random_bytes(void **state)
{
	int ok = 0;
	for (uint64_t seed = 1; seed <= 20000; seed++) {
		fb_rng r;
		fb_msg out;
		size_t len;
		uint8_t *p;

		fb_rng_init(&r, seed, 0x9e7);
		len = (size_t)fb_rng_below(&r, 300);
		p = malloc(len ? len : 1);
		assert_non_null(p);
		for (size_t i = 0; i < len; i++) {
			p[i] = (uint8_t)fb_rng_u64(&r);
		}
		/* mostly give them a good prefix so the protobuf is reached */
		if (seed % 8 != 0 && len >= 4) {
			p[0] = 'F';
			p[1] = 'B';
			p[2] = 1;
			p[3] &= 1;
		}
		/* and sometimes a plausible envelope tag and length */
		if (seed % 3 == 0 && len >= 6) {
			p[4] = (uint8_t)((1 + fb_rng_below(&r, 11)) << 3 | 2);
			p[5] = (uint8_t)(len - 6);
		}
		fb_err rc = fb_msg_unpack(p, len, &out, NULL);
		if (rc == FB_OK) {
			assert_msg_sane(&out);
			ok++;
		} else {
			assert_int_equal(rc, FB_EPROTO);
		}
		free(p);
	}
	(void)ok;
}

static void
test_frame_too_long(void **state)
{
	pbuf body = {0}, f;
	fb_msg m;
	uint8_t pad[FB_MAX_CONTROL_LEN];
	size_t fixed;

	memset(pad, 'x', sizeof(pad));
	/* hello + an unknown field sized so the frame is exactly the limit */
	pb_uint(&body, 1, 1);
	pb_str(&body, 2, "w");
	frame(&f, 0, 1, &body);
	fixed = f.n;
	/* unknown field 1000 of length L costs 2 (tag) + 2 (length) + L */
	size_t l = FB_MAX_CONTROL_LEN - fixed - 4;
	pb_bytes(&f, 1000, pad, l);
	assert_int_equal(f.n, FB_MAX_CONTROL_LEN);
	assert_int_equal(unpack_pbuf(&f, &m), FB_OK);
	assert_int_equal(m.type, FB_MSG_HELLO);
	assert_string_equal(m.u.hello.name, "w");
	/* one byte more is too long */
	frame(&f, 0, 1, &body);
	pb_bytes(&f, 1000, pad, l + 1);
	assert_int_equal(f.n, FB_MAX_CONTROL_LEN + 1);
	assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
	/* and much longer */
	frame(&f, 0, 1, &body);
	pb_bytes(&f, 1000, pad, sizeof(pad));
	pb_bytes(&f, 1000, pad, sizeof(pad));
	assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
}

static void
test_bad_strings(void **state)
{
	char s[FB_TEXT_MAX + 8];

	assert_int_equal(hello_named("plain name", 2), FB_OK);
	assert_int_equal(hello_named("caf\xc3\xa9", 2), FB_OK);
	/* control bytes anywhere, and DEL */
	assert_int_equal(hello_named("a\nb", 2), FB_EPROTO);
	assert_int_equal(hello_named("\x1b[31mred", 2), FB_EPROTO);
	assert_int_equal(hello_named("tab\t", 2), FB_EPROTO);
	assert_int_equal(hello_named("del\x7f", 2), FB_EPROTO);
	assert_int_equal(hello_named("\r", 5), FB_EPROTO);
	assert_int_equal(hello_named("\x01", 6), FB_EPROTO);
	/* lengths: name and software hold 63 bytes, backend 255 */
	memset(s, 'n', sizeof(s));
	s[FB_NAME_MAX - 1] = '\0';
	assert_int_equal(hello_named(s, 2), FB_OK);
	assert_int_equal(hello_named(s, 6), FB_OK);
	s[FB_NAME_MAX - 1] = 'n';
	s[FB_NAME_MAX] = '\0';
	assert_int_equal(hello_named(s, 2), FB_EPROTO);
	assert_int_equal(hello_named(s, 6), FB_EPROTO);
	assert_int_equal(hello_named(s, 5), FB_OK);
	memset(s, 'b', sizeof(s));
	s[FB_TEXT_MAX - 1] = '\0';
	assert_int_equal(hello_named(s, 5), FB_OK);
	s[FB_TEXT_MAX - 1] = 'b';
	s[FB_TEXT_MAX] = '\0';
	assert_int_equal(hello_named(s, 5), FB_EPROTO);

	/* the other text fields: reject, round_cancel, shutdown,
	 * update_begin, round_failed, model spec arch and plugin */
	struct {
		unsigned body_field, str_field;
		size_t cap;
	} fields[] = {
	    {3, 1, FB_TEXT_MAX},
	    {10, 2, FB_TEXT_MAX},
	    {11, 1, FB_TEXT_MAX},
	    {7, 8, FB_TEXT_MAX},
	    {17, 2, FB_TEXT_MAX},
	};
	for (size_t i = 0; i < FB_ARRAY_LEN(fields); i++) {
		pbuf body = {0}, f;
		fb_msg m;
		memset(s, 'r', sizeof(s));
		s[fields[i].cap - 1] = '\0';
		pb_str(&body, fields[i].str_field, s);
		frame(&f, 0, fields[i].body_field, &body);
		assert_int_equal(unpack_pbuf(&f, &m), FB_OK);
		body.n = 0;
		s[fields[i].cap - 1] = 'r';
		s[fields[i].cap] = '\0';
		pb_str(&body, fields[i].str_field, s);
		frame(&f, 0, fields[i].body_field, &body);
		assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
		body.n = 0;
		pb_str(&body, fields[i].str_field, "bad\x02");
		frame(&f, 0, fields[i].body_field, &body);
		assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
	}
	for (unsigned sf = 1; sf <= 6; sf += 5) { /* arch = 1, plugin = 6 */
		size_t cap = sf == 1 ? 32 : FB_TEXT_MAX;
		pbuf spec = {0}, body = {0}, f;
		fb_msg m;
		memset(s, 'a', sizeof(s));
		s[cap - 1] = '\0';
		pb_str(&spec, sf, s);
		pb_bytes(&body, 7, spec.b, spec.n);
		frame(&f, FB_WIRE_PAYLOAD, 2, &body);
		assert_int_equal(unpack_pbuf(&f, &m), FB_OK);
		s[cap - 1] = 'a';
		s[cap] = '\0';
		spec.n = 0;
		body.n = 0;
		pb_str(&spec, sf, s);
		pb_bytes(&body, 7, spec.b, spec.n);
		frame(&f, FB_WIRE_PAYLOAD, 2, &body);
		assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
		spec.n = 0;
		body.n = 0;
		pb_str(&spec, sf, "x\ny");
		pb_bytes(&body, 7, spec.b, spec.n);
		frame(&f, FB_WIRE_PAYLOAD, 2, &body);
		assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
	}
}

/* A welcome whose model has `count` hidden sizes, packed or not. */
static fb_err
welcome_hidden(uint32_t count, bool packed, fb_msg *m)
{
	pbuf spec = {0}, body = {0}, f, list = {0};
	pb_str(&spec, 1, "mlp");
	if (packed) {
		for (uint32_t i = 0; i < count; i++) {
			pb_varint(&list, 10 + i);
		}
		pb_bytes(&spec, 4, list.b, list.n);
	} else {
		for (uint32_t i = 0; i < count; i++) {
			pb_uint(&spec, 4, 10 + i);
		}
	}
	pb_uint(&body, 1, 1);
	pb_bytes(&body, 7, spec.b, spec.n);
	frame(&f, FB_WIRE_PAYLOAD, 2, &body);
	return unpack_pbuf(&f, m);
}

static void
test_too_many_hidden_sizes(void **state)
{
	fb_msg m;
	for (int packed = 0; packed < 2; packed++) {
		assert_int_equal(welcome_hidden(FB_PROTO_MAX_HIDDEN,
		                     packed != 0, &m),
		    FB_OK);
		assert_int_equal(m.u.welcome.model.hidden_count,
		    FB_PROTO_MAX_HIDDEN);
		assert_int_equal(m.u.welcome.model.hidden[15], 25);
		assert_int_equal(welcome_hidden(FB_PROTO_MAX_HIDDEN + 1,
		                     packed != 0, &m),
		    FB_EPROTO);
		assert_int_equal(welcome_hidden(1000, packed != 0, &m),
		    FB_EPROTO);
	}
}

static void
test_unknown_model_task(void **state)
{
	for (uint32_t task = 0; task < 3; task++) {
		pbuf spec = {0}, body = {0}, f;
		fb_msg m;
		pb_str(&spec, 1, "mlp");
		pb_uint(&spec, 7, task);
		pb_uint(&body, 1, 1);
		pb_bytes(&body, 7, spec.b, spec.n);
		frame(&f, FB_WIRE_PAYLOAD, 2, &body);
		if (task < 2) {
			assert_int_equal(unpack_pbuf(&f, &m), FB_OK);
			assert_int_equal(m.u.welcome.model.task, task);
		} else {
			assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
		}
	}
}

static void
test_payload_flag_mismatch(void **state)
{
	for (int t = FB_MSG_HELLO; t < FB_MSG_TYPE_COUNT_; t++) {
		fb_msg m;
		uint8_t buf[FB_MAX_CONTROL_LEN];
		size_t len = 0;
		const char *why = NULL;
		sample_msg((fb_msg_type)t, &m);
		assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &len),
		    FB_OK);
		buf[3] ^= 1;
		assert_int_equal(fb_msg_unpack(buf, len, &m, &why), FB_EPROTO);
		assert_non_null(why);
	}
}

static void
test_envelope_without_body(void **state)
{
	pbuf f, body = {0};
	fb_msg m;

	frame(&f, 0, 0, NULL); /* just the prefix */
	assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
	/* only unknown fields */
	pb_uint(&f, 20, 5);
	pb_str(&f, 12, "future body");
	assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
	/* an unknown body number with a valid-looking message inside */
	pb_uint(&body, 1, 1);
	frame(&f, 0, 12, &body);
	assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
	/* wrong wire type for the body field */
	frame(&f, 0, 0, NULL);
	pb_uint(&f, 1, 7);
	assert_int_equal(unpack_pbuf(&f, &m), FB_EPROTO);
}

static void
test_two_bodies(void **state)
{
	/* A oneof seen twice: protobuf keeps the last; either that or
	 * FB_EPROTO is fine, but nothing may leak (ASan) or mix. */
	pbuf f, hello = {0}, hb = {0};
	fb_msg m;

	pb_uint(&hello, 1, 1);
	pb_str(&hello, 2, "first");
	pb_uint(&hb, 1, 77);
	frame(&f, 0, 1, &hello);
	pb_bytes(&f, 9, hb.b, hb.n);
	fb_err rc = unpack_pbuf(&f, &m);
	if (rc == FB_OK) {
		assert_int_equal(m.type, FB_MSG_HEARTBEAT);
		assert_int_equal(m.u.heartbeat.round, 77);
	}
	frame(&f, 0, 9, &hb);
	pb_bytes(&f, 1, hello.b, hello.n);
	rc = unpack_pbuf(&f, &m);
	if (rc == FB_OK) {
		assert_int_equal(m.type, FB_MSG_HELLO);
		assert_string_equal(m.u.hello.name, "first");
	}
}

/* ---- link helpers ------------------------------------------------------- */

static const fb_link_opts opts = {
    .max_payload = 4096,
    .send_timeout_ms = 1000,
    .hwm = 16,
};

/* bind_router_with binds a ROUTER with `o` on a random free loopback
 * port; bind_router with the default opts. */
static fb_link *
bind_router_with(const fb_link_opts *o, char *endpoint, size_t cap)
{
	fb_link *l = NULL;
	fb_rng r;
	fb_rng_init(&r, (uint64_t)getpid() ^ (uint64_t)fb_now_ms(), 1);
	for (int tries = 0; tries < 100; tries++) {
		unsigned port = 20000 + (unsigned)fb_rng_below(&r, 40000);
		snprintf(endpoint, cap, "tcp://127.0.0.1:%u", port);
		fb_err rc = fb_link_bind(endpoint, o, &l);
		if (rc == FB_OK) {
			return l;
		}
		assert_int_equal(rc, FB_EZMQ);
	}
	fail_msg("no free port found");
	return NULL;
}

static fb_link *
bind_router(char *endpoint, size_t cap)
{
	return bind_router_with(&opts, endpoint, cap);
}

/* recv_wait waits up to 5 s for anything but a timeout. */
static fb_err
recv_wait(fb_link *l, fb_frame *f, const char **why)
{
	int64_t end = fb_now_ms() + 5000;
	fb_err rc;
	do {
		rc = fb_link_recv(l, 100, -1, NULL, f, why);
	} while (rc == FB_ETIMEDOUT && fb_now_ms() < end);
	return rc;
}

static void
raw_send(void *sock, const void *const *parts, const size_t *lens, int n)
{
	for (int i = 0; i < n; i++) {
		assert_true(zmq_send(sock, parts[i], lens[i],
		                i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
	}
}

/* ---- link tests --------------------------------------------------------- */

static void
test_link_exchange(void **state)
{
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_link *dealer = NULL;
	fb_msg m;
	fb_frame f;
	const char *why = NULL;
	uint8_t payload[3000];
	uint8_t buf[FB_MAX_CONTROL_LEN];
	size_t hello_len = 0, chunk_len = 0;

	for (size_t i = 0; i < sizeof(payload); i++) {
		payload[i] = (uint8_t)(i * 7 + 1);
	}
	assert_int_equal(fb_link_connect(ep, &opts, &dealer), FB_OK);
	assert_int_equal(fb_link_bytes_sent(dealer), 0);
	assert_int_equal(fb_link_bytes_received(router), 0);

	sample_msg(FB_MSG_HELLO, &m);
	assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &hello_len), FB_OK);
	assert_int_equal(fb_link_send(dealer, NULL, &m, NULL, 0), FB_OK);
	assert_int_equal(fb_link_bytes_sent(dealer), hello_len);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_HELLO);
	assert_memory_equal(&f.msg, &m, sizeof(m));
	assert_true(f.peer.len > 0 && f.peer.len <= FB_PEER_ID_MAX);
	assert_null(f.payload);
	assert_true(f.wire_len >= hello_len);
	assert_true(fb_link_bytes_received(router) >= hello_len);
	fb_peer peer = f.peer;

	/* the ROUTER answers the peer it learned */
	sample_msg(FB_MSG_WELCOME, &m);
	assert_int_equal(fb_link_send(router, &peer, &m, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(dealer, &f, &why), FB_OK);
	assert_memory_equal(&f.msg, &m, sizeof(m));
	assert_true(fb_link_bytes_received(dealer) > 0);

	/* a chunk with payload, both ways */
	sample_msg(FB_MSG_UPDATE_CHUNK, &m);
	assert_int_equal(fb_msg_pack(&m, buf, sizeof(buf), &chunk_len), FB_OK);
	assert_int_equal(
	    fb_link_send(dealer, NULL, &m, payload, sizeof(payload)), FB_OK);
	assert_int_equal(fb_link_bytes_sent(dealer),
	    hello_len + chunk_len + sizeof(payload));
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_UPDATE_CHUNK);
	assert_true(fb_peer_equal(&f.peer, &peer));
	assert_int_equal(f.payload_len, sizeof(payload));
	assert_memory_equal(f.payload, payload, sizeof(payload));
	assert_true(f.wire_len >= chunk_len + sizeof(payload));
	assert_true(fb_link_bytes_received(router) >=
	    hello_len + chunk_len + sizeof(payload));

	sample_msg(FB_MSG_MODEL_CHUNK, &m);
	assert_int_equal(
	    fb_link_send(router, &peer, &m, payload, opts.max_payload > 100
	                                        ? 100
	                                        : 1),
	    FB_OK);
	assert_int_equal(recv_wait(dealer, &f, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_MODEL_CHUNK);
	assert_int_equal(f.payload_len, 100);
	assert_memory_equal(f.payload, payload, 100);
	/* an empty payload is still a payload frame */
	assert_int_equal(fb_link_send(router, &peer, &m, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(dealer, &f, &why), FB_OK);
	assert_int_equal(f.payload_len, 0);

	/* misuse */
	assert_int_equal(fb_link_send(dealer, &peer, &m, payload, 1),
	    FB_EINVAL);
	assert_int_equal(fb_link_send(router, NULL, &m, payload, 1),
	    FB_EINVAL);
	assert_int_equal(fb_link_send(router, &peer, &m, payload,
	                     opts.max_payload + 1),
	    FB_EINVAL);
	fb_peer ghost = {.id = {0, 1, 2, 3, 4}, .len = 5};
	sample_msg(FB_MSG_HEARTBEAT, &m);
	assert_int_equal(fb_link_send(router, &ghost, &m, NULL, 0),
	    FB_ECLOSED);
	m.type = FB_MSG_NONE;
	assert_int_equal(fb_link_send(dealer, NULL, &m, NULL, 0), FB_EINVAL);

	fb_link_close(dealer);
	fb_link_close(router);
	fb_link_close(NULL);
}

/* A DEALER connected to a port nobody listens on, queueing while no
 * connection is up: what it sends stays in ZeroMQ's queue. */
static fb_link *
connect_nowhere(void)
{
	char ep[64];
	fb_link_opts o = opts;
	fb_link *l = bind_router(ep, sizeof(ep)), *d = NULL;
	fb_link_close(l);
	o.queue_unconnected = true;
	assert_int_equal(fb_link_connect(ep, &o, &d), FB_OK);
	return d;
}

static bool
wait_idle(const fb_lent *b)
{
	int64_t end = fb_now_ms() + 5000;
	while (!fb_lent_idle(b) && fb_now_ms() < end) {
		fb_sleep_ms(1);
	}
	return fb_lent_idle(b);
}

static void
test_link_lent(void **state)
{
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_link *dealer = NULL, *stuck = NULL;
	fb_lent *b = NULL, *first;
	fb_msg m;
	fb_frame f;
	const char *why = NULL;
	size_t len = opts.max_payload;
	uint8_t *p;
	int sent = 0;
	fb_err rc;

	assert_int_equal(fb_lent_new(2 * len, &b), FB_OK);
	p = fb_lent_data(b);
	for (size_t i = 0; i < 2 * len; i++) {
		p[i] = (uint8_t)(i * 13 + 5);
	}
	assert_true(fb_lent_idle(b));
	assert_int_equal(fb_link_connect(ep, &opts, &dealer), FB_OK);

	/* sent from the memory, received intact, let go once written */
	sample_msg(FB_MSG_UPDATE_CHUNK, &m);
	assert_int_equal(fb_link_send_from(dealer, NULL, &m, p + len, len, b),
	    FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_UPDATE_CHUNK);
	assert_int_equal(f.payload_len, len);
	assert_memory_equal(f.payload, p + len, len);
	assert_true(wait_idle(b));
	first = b;
	assert_int_equal(fb_lent_own(&b, 2 * len, true), FB_OK);
	assert_ptr_equal(b, first); /* idle: the owner writes in place */

	/* with fb_lent_notify, the release that leaves the memory idle
	 * writes the eventfd: the owner's loop wakes instead of polling */
	{
		int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		struct pollfd pfd = {.fd = -1, .events = POLLIN};
		uint64_t n = 0;
		assert_true(efd >= 0);
		pfd.fd = efd;
		fb_lent_notify(b, efd);
		assert_int_equal(poll(&pfd, 1, 0), 0); /* nothing yet */
		assert_int_equal(fb_link_send_from(dealer, NULL, &m, p, len, b),
		    FB_OK);
		assert_int_equal(recv_wait(router, &f, &why), FB_OK);
		assert_int_equal(poll(&pfd, 1, 5000), 1);
		assert_int_equal(read(efd, &n, sizeof(n)), (ssize_t)sizeof(n));
		assert_int_equal(n, 1);
		assert_true(fb_lent_idle(b)); /* woken: it is idle */
		fb_lent_notify(b, -1);
		close(efd);
	}

	/* a refused send takes no reference */
	assert_int_equal(fb_link_send_from(dealer, NULL, &m, p, len + 1, b),
	    FB_EINVAL);
	assert_true(fb_lent_idle(b));

	/* queued for a peer that never reads: the memory stays held, and the
	 * owner gets a copy to write instead */
	stuck = connect_nowhere();
	assert_int_equal(fb_link_send_from(stuck, NULL, &m, p, len, b), FB_OK);
	assert_false(fb_lent_idle(b));
	assert_int_equal(fb_lent_own(&b, 2 * len, true), FB_OK);
	assert_ptr_not_equal(b, first);
	assert_true(fb_lent_idle(b));
	assert_memory_equal(fb_lent_data(b), p, 2 * len);
	/* while the old memory is held, sends from the new one copy: a peer
	 * that stops reading pins one old generation, not one per round */
	assert_false(fb_lent_lendable(b));
	assert_int_equal(fb_link_send_from(dealer, NULL, &m,
	                     (uint8_t *)fb_lent_data(b) + len, len, b),
	    FB_OK);
	assert_true(fb_lent_idle(b));
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_int_equal(f.payload_len, len);
	assert_memory_equal(f.payload, (uint8_t *)fb_lent_data(b) + len, len);
	/* closing drops the queued message and frees the first memory (the
	 * sanitizer and valgrind runs check that nothing leaks); sends from
	 * b are copy-free again */
	fb_link_close(stuck);
	{
		int64_t end = fb_now_ms() + 5000;
		while (!fb_lent_lendable(b) && fb_now_ms() < end) {
			fb_sleep_ms(1);
		}
	}
	assert_true(fb_lent_lendable(b));

	/* sends refused by a full queue (FB_EAGAIN: the send gave up after
	 * send_timeout_ms) leave no reference behind */
	stuck = connect_nowhere();
	p = fb_lent_data(b);
	do {
		rc = fb_link_send_from(stuck, NULL, &m, p, len, b);
		sent += rc == FB_OK;
	} while (rc == FB_OK && sent < 1000);
	assert_int_equal(rc, FB_EAGAIN);
	assert_true(sent >= 2 && sent < 1000);
	assert_false(fb_lent_idle(b));
	fb_link_close(stuck);
	assert_true(wait_idle(b));

	fb_lent_free(b);
	fb_lent_free(NULL);
	fb_link_close(dealer);
	fb_link_close(router);
}

static void
test_link_recv_times_out(void **state)
{
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_frame f;
	bool woke = true;
	int fds[2];
	int64_t t0;

	t0 = fb_now_ms();
	assert_int_equal(fb_link_recv(router, 200, -1, &woke, &f, NULL),
	    FB_ETIMEDOUT);
	int64_t dt = fb_now_ms() - t0;
	assert_true(dt >= 150 && dt < 2000);
	assert_false(woke);
	/* 0 polls */
	t0 = fb_now_ms();
	assert_int_equal(fb_link_recv(router, 0, -1, NULL, &f, NULL),
	    FB_ETIMEDOUT);
	assert_true(fb_now_ms() - t0 < 100);
	/* a readable wake_fd returns at once */
	assert_int_equal(pipe(fds), 0);
	assert_int_equal(write(fds[1], "x", 1), 1);
	t0 = fb_now_ms();
	assert_int_equal(fb_link_recv(router, 5000, fds[0], &woke, &f, NULL),
	    FB_ETIMEDOUT);
	assert_true(woke);
	assert_true(fb_now_ms() - t0 < 1000);
	close(fds[0]);
	close(fds[1]);
	assert_int_equal(fb_link_bytes_received(router), 0);
	fb_link_close(router);
}

/*
 * With send_timeout_ms 0 a send never waits: a full queue (a peer that
 * does not read) is FB_EAGAIN at once, fb_link_wait says when there is
 * room (FB_LINK_OUT) and when a message waits (FB_LINK_IN), and a ROUTER
 * refuses a full peer at once too.
 */
static void
test_link_nonblocking_send(void **state)
{
	char ep[64];
	fb_link_opts nb = opts;
	fb_link *router = NULL, *dealer = NULL, *stuck = NULL;
	fb_msg hb = {.type = FB_MSG_HEARTBEAT};
	fb_peer peer;
	fb_frame f;
	unsigned ready = 0;
	uint32_t sent = 0;
	int64_t t0;
	fb_err rc;

	nb.send_timeout_ms = 0;
	nb.hwm = 2;
	/* a DEALER whose coordinator never answers: the queue fills */
	{
		fb_link *gone = bind_router(ep, sizeof(ep));
		fb_link_close(gone);
	}
	assert_int_equal(fb_link_connect(ep, &nb, &stuck), FB_OK);
	t0 = fb_now_ms();
	do {
		rc = fb_link_send(stuck, NULL, &hb, NULL, 0);
		sent += rc == FB_OK;
	} while (rc == FB_OK && sent < 1000);
	assert_int_equal(rc, FB_EAGAIN);
	assert_true(sent < 1000);
	assert_true(fb_now_ms() - t0 < 500); /* nothing waited */
	assert_int_equal(fb_link_wait(stuck, 50, -1, FB_LINK_OUT, &ready),
	    FB_OK);
	assert_false(ready & FB_LINK_OUT);
	fb_link_close(stuck);

	/* a live pair: room to send, then a message to receive */
	router = bind_router_with(&nb, ep, sizeof(ep));
	assert_int_equal(fb_link_connect(ep, &opts, &dealer), FB_OK);
	/* a wait also ends on the connection's own events (FB_LINK_CONN):
	 * room comes once the connection is up */
	t0 = fb_now_ms();
	do {
		assert_int_equal(fb_link_wait(dealer, 2000, -1, FB_LINK_OUT,
		                     &ready),
		    FB_OK);
	} while (!(ready & FB_LINK_OUT) && fb_now_ms() - t0 < 2000);
	assert_true(ready & FB_LINK_OUT);
	assert_int_equal(fb_link_send(dealer, NULL, &hb, NULL, 0), FB_OK);
	assert_int_equal(fb_link_wait(router, 2000, -1, FB_LINK_IN, &ready),
	    FB_OK);
	assert_true(ready & FB_LINK_IN);
	assert_int_equal(recv_wait(router, &f, NULL), FB_OK);
	peer = f.peer;
	/* the dealer never reads: the ROUTER's queue to it fills, and the
	 * ROUTER refuses at once instead of waiting */
	sent = 0;
	t0 = fb_now_ms();
	do {
		rc = fb_link_send(router, &peer, &hb, NULL, 0);
		sent += rc == FB_OK;
	} while (rc == FB_OK && sent < 100000);
	assert_int_equal(rc, FB_EAGAIN);
	assert_true(fb_now_ms() - t0 < 2000);
	fb_link_close(dealer);
	fb_link_close(router);
}

/* expect_bad: the raw dealer sends `parts`; the ROUTER drops it with
 * FB_EPROTO, then still receives a good hello from the same dealer. */
static void
expect_bad(fb_link *router, void *raw, const void *const *parts,
    const size_t *lens, int n, const char *what)
{
	fb_frame f;
	const char *why = NULL;
	uint8_t hello[FB_MAX_CONTROL_LEN];
	size_t hello_len = 0;
	fb_msg m;
	uint64_t before = fb_link_bytes_received(router);

	raw_send(raw, parts, lens, n);
	fb_err rc = recv_wait(router, &f, &why);
	if (rc != FB_EPROTO) {
		fail_msg("%s: got %s, want FB_EPROTO", what, fb_strerror(rc));
	}
	assert_non_null(why);
	assert_true(f.peer.len > 0);
	assert_null(f.payload);
	assert_true(f.wire_len > 0);
	assert_true(fb_link_bytes_received(router) >= before + f.wire_len);

	sample_msg(FB_MSG_HELLO, &m);
	assert_int_equal(fb_msg_pack(&m, hello, sizeof(hello), &hello_len),
	    FB_OK);
	const void *ok[] = {hello};
	size_t ok_len[] = {hello_len};
	raw_send(raw, ok, ok_len, 1);
	rc = recv_wait(router, &f, &why);
	if (rc != FB_OK) {
		fail_msg("%s: next good message: %s (%s)", what,
		    fb_strerror(rc), why);
	}
	assert_memory_equal(&f.msg, &m, sizeof(m));
}

static void
test_link_raw_dealer_garbage(void **state)
{
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	void *ctx = zmq_ctx_new();
	void *raw = zmq_socket(ctx, ZMQ_DEALER);
	int zero = 0;
	uint8_t hello[FB_MAX_CONTROL_LEN], chunk[FB_MAX_CONTROL_LEN];
	size_t hello_len = 0, chunk_len = 0;
	fb_msg m;
	static uint8_t big[4096 + 2000];
	const char garbage[] = "GET / HTTP/1.1\r\n\r\n";

	assert_non_null(raw);
	assert_int_equal(zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof(zero)),
	    0);
	assert_int_equal(zmq_connect(raw, ep), 0);
	sample_msg(FB_MSG_HELLO, &m);
	assert_int_equal(fb_msg_pack(&m, hello, sizeof(hello), &hello_len),
	    FB_OK);
	sample_msg(FB_MSG_UPDATE_CHUNK, &m);
	assert_int_equal(fb_msg_pack(&m, chunk, sizeof(chunk), &chunk_len),
	    FB_OK);

	{
		const void *p[] = {garbage};
		size_t l[] = {sizeof(garbage)};
		expect_bad(router, raw, p, l, 1, "garbage frame");
	}
	{
		const void *p[] = {""};
		size_t l[] = {0};
		expect_bad(router, raw, p, l, 1, "empty frame");
	}
	{
		const void *p[] = {hello, "extra", "more"};
		size_t l[] = {hello_len, 5, 4};
		expect_bad(router, raw, p, l, 3, "hello with two extra frames");
	}
	{
		const void *p[] = {hello, big};
		size_t l[] = {hello_len, 10};
		expect_bad(router, raw, p, l, 2, "hello with a payload");
	}
	{
		const void *p[] = {chunk};
		size_t l[] = {chunk_len};
		expect_bad(router, raw, p, l, 1, "chunk without payload");
	}
	{
		const void *p[] = {chunk, big, "x"};
		size_t l[] = {chunk_len, 16, 1};
		expect_bad(router, raw, p, l, 3, "chunk with a third frame");
	}
	{
		const void *p[] = {chunk, big};
		size_t l[] = {chunk_len, opts.max_payload + 1};
		expect_bad(router, raw, p, l, 2, "payload over max_payload");
	}
	{
		const void *p[] = {chunk, big};
		size_t l[] = {chunk_len, sizeof(big)};
		expect_bad(router, raw, p, l, 2, "payload well over max");
	}
	{
		const void *p[] = {garbage, big};
		size_t l[] = {sizeof(garbage), 100};
		expect_bad(router, raw, p, l, 2, "garbage with a payload");
	}
	/* a payload of exactly max_payload is fine */
	{
		const void *p[] = {chunk, big};
		size_t l[] = {chunk_len, opts.max_payload};
		fb_frame f;
		const char *why = NULL;
		raw_send(raw, p, l, 2);
		assert_int_equal(recv_wait(router, &f, &why), FB_OK);
		assert_int_equal(f.payload_len, opts.max_payload);
	}
	/* random frames, many seeds */
	for (uint64_t seed = 1; seed <= 200; seed++) {
		fb_rng r;
		uint8_t junk[64];
		fb_rng_init(&r, seed, 77);
		size_t len = 1 + (size_t)fb_rng_below(&r, sizeof(junk));
		for (size_t i = 0; i < len; i++) {
			junk[i] = (uint8_t)fb_rng_u64(&r);
		}
		junk[0] = 'G'; /* never a valid prefix */
		const void *p[] = {junk};
		size_t l[] = {len};
		expect_bad(router, raw, p, l, 1, "random frame");
	}
	zmq_close(raw);
	zmq_ctx_term(ctx);
	fb_link_close(router);
}

static void
test_link_oversize_message_costs_the_sender(void **state)
{
	/* A frame over max_payload + FB_MAX_CONTROL_LEN is cut by ZeroMQ
	 * itself; the ROUTER must keep serving other peers. */
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_link *dealer = NULL;
	void *ctx = zmq_ctx_new();
	void *raw = zmq_socket(ctx, ZMQ_DEALER);
	int zero = 0;
	size_t huge_len = 1 << 20;
	uint8_t *huge = calloc(1, huge_len);
	uint8_t chunk[FB_MAX_CONTROL_LEN];
	size_t chunk_len = 0;
	fb_msg m;
	fb_frame f;
	const char *why = NULL;

	assert_non_null(huge);
	assert_int_equal(zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof(zero)),
	    0);
	assert_int_equal(zmq_connect(raw, ep), 0);
	sample_msg(FB_MSG_UPDATE_CHUNK, &m);
	assert_int_equal(fb_msg_pack(&m, chunk, sizeof(chunk), &chunk_len),
	    FB_OK);
	const void *p[] = {chunk, huge};
	size_t l[] = {chunk_len, huge_len};
	raw_send(raw, p, l, 2);
	fb_err rc = fb_link_recv(router, 300, -1, NULL, &f, &why);
	assert_true(rc == FB_ETIMEDOUT || rc == FB_EPROTO);

	assert_int_equal(fb_link_connect(ep, &opts, &dealer), FB_OK);
	sample_msg(FB_MSG_HEARTBEAT, &m);
	assert_int_equal(fb_link_send(dealer, NULL, &m, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_HEARTBEAT);
	free(huge);
	zmq_close(raw);
	zmq_ctx_term(ctx);
	fb_link_close(dealer);
	fb_link_close(router);
}

static void
test_link_long_routing_id(void **state)
{
	/* A peer may pick its own routing id, up to 255 bytes; one longer
	 * than FB_PEER_ID_MAX must not overflow fb_peer. */
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_link *dealer = NULL;
	void *ctx = zmq_ctx_new();
	void *raw = zmq_socket(ctx, ZMQ_DEALER);
	int zero = 0;
	uint8_t id[200];
	uint8_t hello[FB_MAX_CONTROL_LEN];
	size_t hello_len = 0;
	fb_msg m;
	fb_frame f;
	const char *why = NULL;

	memset(id, 'i', sizeof(id));
	assert_int_equal(zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof(zero)),
	    0);
	assert_int_equal(zmq_setsockopt(raw, ZMQ_ROUTING_ID, id, sizeof(id)),
	    0);
	assert_int_equal(zmq_connect(raw, ep), 0);
	sample_msg(FB_MSG_HELLO, &m);
	assert_int_equal(fb_msg_pack(&m, hello, sizeof(hello), &hello_len),
	    FB_OK);
	const void *p[] = {hello};
	size_t l[] = {hello_len};
	raw_send(raw, p, l, 1);
	fb_err rc = recv_wait(router, &f, &why);
	assert_true(rc == FB_EPROTO || rc == FB_OK);
	assert_true(f.peer.len <= FB_PEER_ID_MAX);
	/* others still get through */
	assert_int_equal(fb_link_connect(ep, &opts, &dealer), FB_OK);
	assert_int_equal(fb_link_send(dealer, NULL, &m, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_memory_equal(&f.msg, &m, sizeof(m));
	zmq_close(raw);
	zmq_ctx_term(ctx);
	fb_link_close(dealer);
	fb_link_close(router);
}

static void
test_link_bind_refuses_busy_endpoint(void **state)
{
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_link *second = (fb_link *)&second;
	assert_int_equal(fb_link_bind(ep, &opts, &second), FB_EZMQ);
	assert_null(second);
	assert_int_equal(fb_link_bind("nonsense://x", &opts, &second),
	    FB_EZMQ);
	assert_null(second);
	fb_link_close(router);
}

/* ---- the door ----------------------------------------------------------- */

/* A door small enough to fill by hand; chunks of 64 KiB. */
static const fb_link_opts door_opts = {
    .max_payload = 65536,
    .send_timeout_ms = 0,
    .hwm = 16,
    .door = {
        .max_pending = 8,
        .max_per_source = 2,
        .handshake_ms = 600,
        .max_pending_bytes = 4096,
        .max_pending_memory = 1 << 20,
        .fd_reserve = 16,
    },
};

static unsigned
endpoint_port(const char *ep)
{
	return (unsigned)atoi(strrchr(ep, ':') + 1);
}

/* raw_connect: a TCP connection to 127.0.0.1:port from address `src`
 * (-1 if `src` cannot be bound: no loopback aliases). */
static int
raw_connect(const char *src, unsigned port)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	inet_pton(AF_INET, src, &a.sin_addr);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	a.sin_port = htons((uint16_t)port);
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* peer_closed: whether the other end closed `fd` within `ms` (what it
 * sent before is read and dropped). */
static bool
peer_closed(int fd, int ms)
{
	int64_t end = fb_now_ms() + ms;
	char buf[4096];

	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int left = (int)(end - fb_now_ms());
		ssize_t n;
		if (left < 0 || poll(&p, 1, left) <= 0) {
			return false;
		}
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN)) {
			return true;
		}
	}
}

/* A ZMTP 3.1 greeting (NULL, client) and READY, as a libzmq DEALER
 * sends them. */
static size_t
zmtp_greeting(uint8_t *b)
{
	static const char ready[] = "\x05READY\x0bSocket-Type\0\0\0\x06"
	                            "DEALER\x08Identity\0\0\0\0";
	size_t n = 0;

	memset(b, 0, 64);
	b[0] = 0xff;
	b[8] = 0x01;
	b[9] = 0x7f;
	b[10] = 3;
	b[11] = 1;
	memcpy(b + 12, "NULL", 4);
	n = 64;
	b[n++] = 0x04;
	b[n++] = (uint8_t)(sizeof(ready) - 1);
	memcpy(b + n, ready, sizeof(ready) - 1);
	return n + sizeof(ready) - 1;
}

/* zmtp_join: sends the greeting on `fd` and waits for the other side's
 * greeting and READY (libzmq drops a peer whose frames come first). */
static void
zmtp_join(int fd)
{
	uint8_t b[512];
	size_t n = zmtp_greeting(b), got = 0;

	assert_true(send(fd, b, n, MSG_NOSIGNAL) == (ssize_t)n);
	while (got < 66 || got < 66 + (size_t)b[65]) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t k;
		assert_true(poll(&p, 1, 2000) == 1);
		k = recv(fd, b + got, sizeof(b) - got, 0);
		assert_true(k > 0);
		got += (size_t)k;
	}
}

static bool
have_loopback_aliases(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	bool ok;

	inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
	ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	if (fd >= 0) {
		close(fd);
	}
	return ok;
}

/*
 * One address gets max_per_source pending connections, the rest are
 * refused at once; another address is unaffected; pending connections are
 * closed at the handshake timeout (they send a ZMTP greeting, so that it
 * is the door's timeout and not libzmq's ZMTP handshake limit).
 */
static void
test_door_per_source_and_timeout(void **state)
{
	char ep[64];
	fb_link *router;
	fb_door_stats st;
	int a[4], b;
	int64_t t0;
	unsigned port;
	int closed = 0;
	uint8_t greet[128];
	size_t glen = zmtp_greeting(greet);

	(void)state;
	router = bind_router_with(&door_opts, ep, sizeof(ep));
	port = endpoint_port(ep);
	if (!have_loopback_aliases()) {
		fb_link_close(router);
		skip();
	}
	for (int i = 0; i < 4; i++) {
		a[i] = raw_connect("127.0.0.2", port);
		assert_true(send(a[i], greet, glen, MSG_NOSIGNAL) > 0);
		usleep(20000); /* in order, so the first two are the ones kept */
	}
	b = raw_connect("127.0.0.3", port);
	assert_true(send(b, greet, glen, MSG_NOSIGNAL) > 0);
	t0 = fb_now_ms();
	for (int i = 2; i < 4; i++) {
		assert_true(peer_closed(a[i], 300));
	}
	for (int i = 0; i < 2; i++) {
		assert_false(peer_closed(a[i], 50));
	}
	assert_false(peer_closed(b, 10));
	fb_link_door_stats(router, &st);
	assert_int_equal(st.refused_source, 2);
	assert_int_equal(st.pending, 3);
	assert_true(fb_now_ms() - t0 < 500);
	/* the handshake timeout (600 ms) closes the three that stayed */
	closed += peer_closed(a[0], 1000);
	closed += peer_closed(a[1], 300);
	closed += peer_closed(b, 300);
	assert_int_equal(closed, 3);
	assert_true(fb_now_ms() - t0 >= 500);
	fb_link_door_stats(router, &st);
	assert_int_equal(st.timed_out, 3);
	assert_int_equal(st.pending, 0);
	for (int i = 0; i < 4; i++) {
		close(a[i]);
	}
	close(b);
	fb_link_close(router);
}

/*
 * A connection the program trusts (fb_link_peer_trust, as the coordinator
 * does once a message proved its sender) outlives the handshake timeout
 * and stays reachable; one that sent the same hello but was not trusted
 * is closed, and sends to it find it gone.
 */
static void
test_door_trusted_connection_stays(void **state)
{
	char ep[64];
	fb_link *router, *good = NULL, *bad = NULL;
	fb_msg hello, hb = {.type = FB_MSG_HEARTBEAT};
	fb_peer good_peer, bad_peer;
	fb_door_stats st;
	fb_frame f;
	fb_err rc = FB_OK;
	int64_t end;

	(void)state;
	router = bind_router_with(&door_opts, ep, sizeof(ep));
	sample_msg(FB_MSG_HELLO, &hello);
	assert_int_equal(fb_link_connect(ep, &opts, &good), FB_OK);
	assert_int_equal(fb_link_connect(ep, &opts, &bad), FB_OK);
	assert_int_equal(fb_link_send(good, NULL, &hello, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(router, &f, NULL), FB_OK);
	good_peer = f.peer;
	fb_link_peer_trust(router, &f.peer);
	assert_int_equal(fb_link_send(bad, NULL, &hello, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(router, &f, NULL), FB_OK);
	bad_peer = f.peer;
	fb_link_peer_trust(router, &good_peer); /* not its sender: ignored */
	usleep(900 * 1000); /* past the handshake timeout */
	assert_int_equal(fb_link_send(router, &good_peer, &hb, NULL, 0),
	    FB_OK);
	assert_int_equal(recv_wait(good, &f, NULL), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_HEARTBEAT);
	/* the untrusted one is gone (its DEALER reconnects, as a new peer) */
	end = fb_now_ms() + 2000;
	do {
		rc = fb_link_send(router, &bad_peer, &hb, NULL, 0);
		if (rc == FB_OK) {
			usleep(50000);
		}
	} while (rc == FB_OK && fb_now_ms() < end);
	assert_int_equal(rc, FB_ECLOSED);
	fb_link_door_stats(router, &st);
	assert_int_equal(st.trusted, 1);
	assert_true(st.timed_out >= 1);
	assert_true(st.connections >= 1);
	fb_link_close(good);
	fb_link_close(bad);
	fb_link_close(router);
}

/*
 * Bytes before authentication: a connection that sends more than a frame
 * plus max_pending_bytes is closed within a sweep; max_pending_memory
 * caps how many may be pending, each with a frame in progress (a
 * newcomer takes the place of the oldest once that one had its moment);
 * freed memory is given back (malloc_trim).
 */
static void
test_door_bytes_before_authentication(void **state)
{
	char ep[64];
	fb_link_opts o = door_opts;
	fb_link *router;
	fb_door_stats st;
	uint8_t *buf = malloc(1 << 21);
	size_t n;
	unsigned port;
	int big, part[3], closed = 0;

	(void)state;
	assert_non_null(buf);
	o.door.max_pending_bytes = 1 << 20; /* the memory limit acts first */
	o.door.max_per_source = 8;
	o.door.handshake_ms = 5000;
	router = bind_router_with(&door_opts, ep, sizeof(ep));
	port = endpoint_port(ep);
	/* three whole 64 KiB messages that nobody reads: over 4 KiB and one
	 * frame (ZMQ_MAXMSGSIZE, 68 KiB here) */
	big = raw_connect("127.0.0.1", port);
	zmtp_join(big);
	n = 0;
	for (int i = 0; i < 3; i++) {
		buf[n++] = 0x02;
		memset(buf + n, 0, 8);
		buf[n + 5] = 0x01; /* 65536 */
		n += 8;
		memset(buf + n, 0xab, 65536);
		n += 65536;
	}
	assert_true(send(big, buf, n, MSG_NOSIGNAL) > 0);
	assert_true(peer_closed(big, 1000));
	close(big);
	fb_link_door_stats(router, &st);
	assert_int_equal(st.over_bytes, 1);
	fb_link_close(router);

	/* memory: with frames of up to 1 MiB (+ 4 KiB) and 2.5 MiB for
	 * pending connections, two may be pending: a third that comes at
	 * once is refused, one that comes later evicts the oldest (a frame
	 * header of 1 MiB, then silence) */
	o.max_payload = 1 << 20;
	o.door.max_pending_memory = 5 << 19;
	router = bind_router_with(&o, ep, sizeof(ep));
	port = endpoint_port(ep);
	fb_link_door_stats(router, &st);
	assert_int_equal(st.max_pending, 2);
	n = 0;
	buf[n++] = 0x02;
	memset(buf + n, 0, 8);
	buf[n + 5] = 0x10; /* 1 MiB */
	n += 8;
	for (int i = 0; i < 2; i++) {
		part[i] = raw_connect("127.0.0.1", port);
		zmtp_join(part[i]);
		assert_true(send(part[i], buf, n, MSG_NOSIGNAL) > 0);
	}
	part[2] = raw_connect("127.0.0.1", port); /* within the grace time */
	assert_true(peer_closed(part[2], 500));
	fb_link_door_stats(router, &st);
	assert_int_equal(st.refused_full, 1);
	close(part[2]);
	usleep(300 * 1000); /* past the grace time of the first two */
	part[2] = raw_connect("127.0.0.1", port);
	for (int i = 0; i < 3; i++) {
		closed += peer_closed(part[i], 300);
	}
	assert_int_equal(closed, 1);
	assert_true(peer_closed(part[0], 10)); /* the oldest went */
	usleep(1200 * 1000); /* malloc_trim after peers went, once a second */
	fb_link_door_stats(router, &st);
	assert_int_equal(st.evicted, 1);
	assert_int_equal(st.pending, 2);
	assert_true(st.trims >= 1);
	for (int i = 0; i < 3; i++) {
		close(part[i]);
	}
	free(buf);
	fb_link_close(router);
}

/* The door raises the soft descriptor limit, and refuses to start when the
 * reserve leaves no descriptor for connections. */
static void
test_door_descriptor_budget(void **state)
{
	char ep[64];
	fb_link_opts o = door_opts;
	fb_link *router = NULL;
	fb_door_stats st;
	struct rlimit rl, low;

	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	low = rl;
	low.rlim_cur = rl.rlim_max > 256 ? 256 : rl.rlim_max;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	router = bind_router_with(&o, ep, sizeof(ep));
	fb_link_door_stats(router, &st);
	assert_true(st.fd_limit >= low.rlim_cur);
	assert_true(rl.rlim_max == RLIM_INFINITY ||
	    st.fd_limit == (rl.rlim_max > (1u << 20) ? (1u << 20)
	                                             : rl.rlim_max));
	assert_true(st.max_connections > 0 &&
	    st.max_connections < st.fd_limit - o.door.fd_reserve);
	fb_link_close(router);
	o.door.fd_reserve = st.fd_limit;
	assert_int_equal(fb_link_bind("tcp://127.0.0.1:*", &o, &router),
	    FB_EINVAL);
	assert_null(router);
}

/* Endpoints with another port: tcp://HOST:PORT only. */
static void
test_endpoint_port(void **state)
{
	char out[64];
	uint32_t base = 99;

	(void)state;
	assert_int_equal(fb_endpoint_port("tcp://10.0.0.5:5555", 5557, out,
	                     sizeof(out), &base), FB_OK);
	assert_string_equal(out, "tcp://10.0.0.5:5557");
	assert_int_equal(base, 5555);
	assert_int_equal(fb_endpoint_port("tcp://[::1]:7300", 7301, out,
	                     sizeof(out), &base), FB_OK);
	assert_string_equal(out, "tcp://[::1]:7301");
	assert_int_equal(base, 7300);
	assert_int_equal(fb_endpoint_port("tcp://*:*", 0, out, sizeof(out),
	                     &base), FB_OK);
	assert_string_equal(out, "tcp://*:*");
	assert_int_equal(base, 0);
	assert_int_equal(fb_endpoint_port("tcp://host.example:80", 0, out,
	                     sizeof(out), NULL), FB_OK);
	assert_string_equal(out, "tcp://host.example:*");
	const char *bad[] = {"ipc:///tmp/x", "tcp://host", "tcp://:5555",
	    "tcp://host:", "tcp://host:55a5", "tcp://host:65536",
	    "tcp://host:99999999999", "inproc://x:5"};
	for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
		assert_int_equal(fb_endpoint_port(bad[i], 1, out, sizeof(out),
		                     NULL), FB_EINVAL);
	}
	assert_int_equal(fb_endpoint_port("tcp://10.0.0.5:5555", 1, out,
	                     8, NULL), FB_ERANGE);
	assert_int_equal(fb_endpoint_port("tcp://h:1", 65536, out,
	                     sizeof(out), NULL), FB_EINVAL);
}

/* A ROUTER with lanes listens on consecutive ports, and each carries
 * messages; lanes need as many I/O threads and a tcp endpoint. */
static void
test_link_lanes(void **state)
{
	fb_link_opts lo = opts;
	fb_link *router = NULL, *dealer = NULL;
	char ep[64], lane_ep[64];
	fb_frame f;
	fb_msg m;
	const char *why = NULL;
	fb_rng r;
	fb_err rc = FB_EZMQ;

	(void)state;
	lo.io_threads = 3;
	lo.lanes = 3;
	fb_rng_init(&r, (uint64_t)getpid() ^ (uint64_t)fb_now_ms(), 2);
	for (int tries = 0; tries < 100 && rc != FB_OK; tries++) {
		unsigned port = 20000 + (unsigned)fb_rng_below(&r, 40000);
		snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", port);
		rc = fb_link_bind(ep, &lo, &router);
		assert_true(rc == FB_OK || rc == FB_EZMQ);
	}
	assert_int_equal(rc, FB_OK);
	assert_int_equal(fb_link_lanes(router), 3);
	for (uint32_t i = 1; i < 3; i++) {
		assert_int_equal(fb_link_lane_port(router, i),
		    fb_link_lane_port(router, 0) + i);
	}
	assert_int_equal(fb_link_lane_port(router, 3), 0);
	assert_int_equal(fb_endpoint_port(ep, fb_link_lane_port(router, 2),
	                     lane_ep, sizeof(lane_ep), NULL), FB_OK);
	assert_int_equal(fb_link_connect(lane_ep, &opts, &dealer), FB_OK);
	sample_msg(FB_MSG_HELLO, &m);
	assert_int_equal(fb_link_send(dealer, NULL, &m, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_memory_equal(&f.msg, &m, sizeof(m));
	sample_msg(FB_MSG_REDIRECT, &m);
	assert_int_equal(fb_link_send(router, &f.peer, &m, NULL, 0), FB_OK);
	assert_int_equal(recv_wait(dealer, &f, &why), FB_OK);
	assert_memory_equal(&f.msg, &m, sizeof(m));
	fb_link_close(dealer);
	fb_link_close(router);

	/* ephemeral ports: each lane gets one */
	assert_int_equal(fb_link_bind("tcp://127.0.0.1:*", &lo, &router), FB_OK);
	for (uint32_t i = 0; i < 3; i++) {
		assert_true(fb_link_lane_port(router, i) > 0);
	}
	fb_link_close(router);

	router = (fb_link *)&router;
	lo.lanes = 4; /* more than the I/O threads */
	assert_int_equal(fb_link_bind(ep, &lo, &router), FB_EINVAL);
	assert_null(router);
	lo.lanes = 2;
	router = (fb_link *)&router;
	assert_int_equal(fb_link_bind("ipc:///tmp/fb-lanes-test", &lo, &router),
	    FB_EINVAL);
	assert_null(router);
}

/* ---- sealed secure-aggregation payloads (secure.c) ---------------------- */

/* A worker session and the coordinator's matching one. */
static void
session_pair(fb_session **ws, fb_session **cs)
{
	fb_identity *coord = NULL, *w = NULL;
	fb_pubkey coord_pk, w_pk;
	fb_allowlist allow = {&w_pk, 1};
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	uint8_t ckey[FB_HS_COOKIE_KEY_LEN] = {9}, cookie[FB_HS_COOKIE_LEN];
	fb_hs_accept_cfg cfg = {.proto_version = FB_PROTOCOL_VERSION,
	    .lookup = fb_allowlist_lookup_cb, .lookup_arg = &allow,
	    .cookie_key = ckey, .now_ms = 1000, .cookie_ms = 1000};
	fb_reject why;

	assert_int_equal(fb_identity_alloc("c", &coord), FB_OK);
	assert_int_equal(fb_identity_alloc("w", &w), FB_OK);
	fb_identity_pubkey(coord, &coord_pk);
	fb_identity_pubkey(w, &w_pk);
	cfg.self = coord;
	assert_int_equal(fb_run_id_random(&cfg.run), FB_OK);
	fb_hs_cookie_make(ckey, 1000, cookie);
	assert_int_equal(fb_handshake_start(w, &coord_pk, FB_PROTOCOL_VERSION,
	                     cookie, hello, &hs), FB_OK);
	assert_int_equal(fb_handshake_accept(&cfg, hello, sizeof(hello), reply,
	                     cs, &why), FB_OK);
	assert_int_equal(fb_handshake_finish(hs, reply, sizeof(reply), ws,
	                     &why), FB_OK);
	fb_handshake_free(hs);
	fb_identity_free(coord);
	fb_identity_free(w);
}

static void
test_secagg_payload_sealed(void **state)
{
	char ep[64];
	fb_link *router = bind_router(ep, sizeof(ep));
	fb_link *dealer = NULL;
	fb_session *ws = NULL, *cs = NULL;
	fb_msg m = {.type = FB_MSG_SECAGG};
	fb_frame f;
	const char *why = NULL;
	int reject = 0;
	uint8_t secret[500];

	(void)state;
	for (size_t i = 0; i < sizeof(secret); i++) {
		secret[i] = (uint8_t)(0xa5 ^ i);
	}
	session_pair(&ws, &cs);
	assert_int_equal(fb_link_connect(ep, &opts, &dealer), FB_OK);
	m.u.secagg.round = 3;
	m.u.secagg.phase = FB_SA_REVEAL;
	m.u.secagg.count = 1;

	/* sent sealed: the payload on the wire is not the plaintext */
	assert_int_equal(fb_secure_send(dealer, NULL, ws, 3, &m, secret,
	                     sizeof(secret)), FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	assert_true(f.sealed);
	assert_int_equal(f.payload_len, sizeof(secret) + FB_MSG_OVERHEAD);
	assert_null(memmem(f.payload, f.payload_len, secret + 100, 32));
	assert_int_equal(fb_secure_open(cs, &f, &reject, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_SECAGG);
	assert_int_equal(f.msg.u.secagg.phase, FB_SA_REVEAL);
	assert_int_equal(f.payload_len, sizeof(secret));
	assert_memory_equal(f.payload, secret, sizeof(secret));

	/* a flipped payload bit: the message is refused */
	assert_int_equal(fb_secure_send(dealer, NULL, ws, 3, &m, secret,
	                     sizeof(secret)), FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	f.payload[FB_MSG_HEADER_LEN + 7] ^= 1;
	assert_int_not_equal(fb_secure_open(cs, &f, &reject, &why), FB_OK);
	assert_int_equal(f.msg.type, FB_MSG_NONE);

	/* no payload at all: refused, not read past */
	assert_int_equal(fb_secure_send(dealer, NULL, ws, 3, &m, secret,
	                     sizeof(secret)), FB_OK);
	assert_int_equal(recv_wait(router, &f, &why), FB_OK);
	f.payload_len = 3;
	assert_int_not_equal(fb_secure_open(cs, &f, &reject, &why), FB_OK);

	fb_link_close(dealer);
	fb_link_close(router);
	fb_session_free(ws);
	fb_session_free(cs);
}

/*
 * A SETUP's payload carries RoundStart's secure-aggregation fields as a
 * SecAggRound: they come back as they went (set_up is RoundStart's own,
 * never a setup's); garbage, a seed over 32 bytes and an oversized
 * payload are refused.
 */
static void
test_sa_setup_payload(void **state)
{
	fb_msg rs, back;
	uint8_t buf[FB_SA_SETUP_MAX], big[FB_SA_SETUP_MAX + 1];
	size_t len = 0;

	(void)state;
	memset(&rs, 0, sizeof(rs));
	memset(&back, 0, sizeof(back));
	sample_msg(FB_MSG_ROUND_START, &rs);
	assert_int_equal(fb_sa_setup_pack(&rs, buf, sizeof(buf), &len), FB_OK);
	assert_int_equal(fb_sa_setup_pack(&rs, buf, 8, &len), FB_ERANGE);
	assert_int_equal(fb_sa_setup_pack(&rs, buf, sizeof(buf), &len), FB_OK);
	assert_int_equal(fb_sa_setup_unpack(buf, len, &back), FB_OK);
	assert_true(back.u.round_start.secagg);
	assert_false(back.u.round_start.sa_set_up);
	assert_int_equal(back.u.round_start.sa_slot, 4);
	assert_int_equal(back.u.round_start.sa_n, 128);
	assert_int_equal(back.u.round_start.sa_degree, 22);
	assert_int_equal(back.u.round_start.sa_threshold, 12);
	assert_int_equal(back.u.round_start.sa_graph_seed.len, 32);
	assert_memory_equal(back.u.round_start.sa_graph_seed.b,
	    rs.u.round_start.sa_graph_seed.b, 32);
	assert_int_equal(back.u.round_start.sa_ring_bits, 24);
	assert_true(back.u.round_start.sa_clip == 0.125);
	assert_int_equal(back.u.round_start.sa_max_samples, 1ULL << 40);
	assert_true(back.u.round_start.sa_a_bound == 1234.5);
	assert_int_equal(back.u.round_start.sa_max_staleness, 1000000);
	/* not a SecAggRound */
	memset(buf, 0xff, sizeof(buf));
	assert_int_equal(fb_sa_setup_unpack(buf, 40, &back), FB_EPROTO);
	/* a graph seed of 33 bytes */
	rs.u.round_start.sa_graph_seed.len = 33;
	assert_int_equal(fb_sa_setup_pack(&rs, buf, sizeof(buf), &len), FB_OK);
	assert_int_equal(fb_sa_setup_unpack(buf, len, &back), FB_EPROTO);
	/* longer than any setup */
	memset(big, 0, sizeof(big));
	assert_int_equal(fb_sa_setup_unpack(big, sizeof(big), &back),
	    FB_EPROTO);
}

FB_TESTS = {
    {"a setup's payload: RoundStart's SecAgg fields, and nothing else",
        test_sa_setup_payload},
	{"an update's evaluation metrics are bounded in count and name",
	    test_update_begin_metrics_bounded},
    {"every message type survives pack and unpack with all fields",
        test_roundtrip_every_type},
    {"messages with default fields survive pack and unpack",
        test_default_values_roundtrip},
    {"pack refuses an unknown type and too many hidden sizes",
        test_pack_refuses_unknown_type},
    {"a bad prefix is malformed", test_bad_prefix},
    {"a wrong wire version is malformed", test_wrong_wire_version},
    {"every truncation of a valid frame is malformed or valid",
        test_every_truncation},
    {"random bytes are malformed or valid, never a crash",
        test_random_bytes},
    {"a frame longer than the control limit is malformed",
        test_frame_too_long},
    {"strings with control bytes or too long are malformed",
        test_bad_strings},
    {"more hidden sizes than the limit are malformed",
        test_too_many_hidden_sizes},
    {"welcome with an unknown model task is malformed",
        test_unknown_model_task},
    {"a payload flag that does not match the type is malformed",
        test_payload_flag_mismatch},
    {"an envelope with no known body is malformed",
        test_envelope_without_body},
    {"an envelope with two bodies keeps one or is malformed",
        test_two_bodies},
    {"dealer and router exchange hello, welcome and chunks",
        test_link_exchange},
    {"payloads sent from lent memory arrive intact and hold it until sent",
        test_link_lent},
    {"recv times out, polls, and wakes on its fd", test_link_recv_times_out},
    {"sends that never wait refuse a full queue at once; wait sees room",
        test_link_nonblocking_send},
    {"a raw dealer's malformed messages are dropped and the router goes on",
        test_link_raw_dealer_garbage},
    {"an oversize message costs only its sender",
        test_link_oversize_message_costs_the_sender},
    {"a routing id longer than the peer id limit is handled",
        test_link_long_routing_id},
    {"binding a busy endpoint fails", test_link_bind_refuses_busy_endpoint},
    {"the door refuses an address's extra pending connections and closes "
     "the rest at the handshake timeout",
        test_door_per_source_and_timeout},
    {"a trusted connection outlives the handshake timeout; an untrusted "
     "one does not", test_door_trusted_connection_stays},
    {"bytes sent before authenticating are bounded per connection and in "
     "all", test_door_bytes_before_authentication},
    {"the door raises the descriptor limit and needs room under it",
        test_door_descriptor_budget},
    {"an endpoint's port is replaced, tcp://HOST:PORT only",
        test_endpoint_port},
    {"lanes listen on consecutive ports, each carrying messages",
        test_link_lanes},
    {"secure-aggregation payloads travel sealed; tampering is refused",
        test_secagg_payload_sealed},
    {NULL, NULL},
};

FB_TEST_MAIN("proto")
