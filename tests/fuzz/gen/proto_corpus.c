/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto_corpus.c -- writes the seed corpora of the proto/ fuzz targets into
 * DIR/proto_frame/, DIR/proto_envelope/ and DIR/proto_sealed/:
 *   build/fuzz/gen/proto_corpus tests/fuzz/corpus
 * One valid message of every type (packed by fb_msg_pack and
 * fb_msg_pack_envelope, so the seeds follow format changes) and near misses
 * that each break one rule: prefix, flags, payload flag, truncation, a
 * string one byte too long or with a control byte, 17 hidden sizes, a
 * 257-byte blob, a missing model spec, the frame-length limit, and for
 * sealed frames: replay, wrong round, wrong sender, wrong type, bad MAC.
 * Near misses that fb_msg_pack refuses to write are built with protobuf-c.
 * Sealed seeds are sealed on the fixture's worker session (fuzz_common.h)
 * exactly as fb_secure_send does; see targets/proto_sealed.c for the
 * layout of that target's input.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "proto/fedbox.pb-c.h"
#include "proto/proto.h"
#include "tests/fuzz/fuzz_common.h"

#define PAYLOAD_SEED_LEN 16

static const char *out_dir;

static void
put(const char *target, const char *name, const uint8_t *p, size_t n)
{
	char path[1024];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) != 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	if ((fp = fopen(path, "wb")) == NULL || fwrite(p, 1, n, fp) != n ||
	    fclose(fp) != 0) {
		perror(path);
		exit(1);
	}
}

static void
fill(fb_blob *b, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++) {
		b->b[i] = (uint8_t)(v + i);
	}
	b->len = (uint32_t)n;
}

/* One realistic message of type `t`. */
static void
example(fb_msg_type t, const fz_fixture *f, fb_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = t;
	switch (t) {
	case FB_MSG_HELLO:
		m->u.hello.protocol_version = FB_PROTOCOL_VERSION;
		strcpy(m->u.hello.name, "worker-0");
		m->u.hello.worker_index = 0;
		m->u.hello.num_samples = 60000;
		strcpy(m->u.hello.backend, "cuda: 2 x NVIDIA H200 (fp32)");
		strcpy(m->u.hello.software, "fedbox 0.1");
		m->u.hello.session = 0x0123456789abcdefull;
		break;
	case FB_MSG_WELCOME:
		m->u.welcome.protocol_version = FB_PROTOCOL_VERSION;
		m->u.welcome.run_id = 0x5a5a5a5a5a5a5a5aull;
		m->u.welcome.worker_id = FZ_WORKER_ID;
		m->u.welcome.heartbeat_ms = 1000;
		m->u.welcome.liveness_ms = 5000;
		m->u.welcome.chunk_bytes = 1u << 20;
		strcpy(m->u.welcome.model.arch, "mlp");
		m->u.welcome.model.input_dim = 784;
		m->u.welcome.model.classes = 10;
		m->u.welcome.model.hidden[0] = 128;
		m->u.welcome.model.hidden[1] = 64;
		m->u.welcome.model.hidden_count = 2;
		strcpy(m->u.welcome.model.plugin, "");
		m->u.welcome.param_count = 109386;
		break;
	case FB_MSG_REJECT:
		strcpy(m->u.reject.reason, "duplicate worker name");
		m->u.reject.protocol_version = FB_PROTOCOL_VERSION;
		break;
	case FB_MSG_ROUND_START:
		m->u.round_start.round = FZ_ROUND;
		m->u.round_start.param_count = 109386;
		m->u.round_start.chunk_count = 1;
		m->u.round_start.chunk_bytes = 1u << 20;
		m->u.round_start.local_steps = 100;
		m->u.round_start.batch_size = 32;
		m->u.round_start.lr = 0.05f;
		m->u.round_start.momentum = 0.9f;
		m->u.round_start.weight_decay = 1e-4f;
		m->u.round_start.seed = 7;
		m->u.round_start.deadline_ms = 60000;
		m->u.round_start.synthetic = false;
		fill(&m->u.round_start.round_key, FB_STREAM_KEY_LEN, 0x10);
		fill(&m->u.round_start.stream_header, FB_STREAM_HEADER_LEN,
		    0x40);
		fill(&m->u.round_start.stream_trailer, FB_STREAM_TRAILER_LEN,
		    0x80);
		m->u.round_start.secagg = true;
		m->u.round_start.sa_slot = 1;
		m->u.round_start.sa_n = 4;
		m->u.round_start.sa_degree = 3;
		m->u.round_start.sa_threshold = 3;
		fill(&m->u.round_start.sa_graph_seed, 32, 0x33);
		m->u.round_start.sa_ring_bits = 32;
		m->u.round_start.sa_clip = 4;
		m->u.round_start.sa_max_samples = 1000000;
		m->u.round_start.sa_a_bound = 1;
		break;
	case FB_MSG_MODEL_FETCH:
		m->u.model_fetch.round = FZ_ROUND;
		m->u.model_fetch.chunk = 3;
		break;
	case FB_MSG_MODEL_CHUNK:
		m->u.model_chunk.round = FZ_ROUND;
		m->u.model_chunk.chunk = 3;
		break;
	case FB_MSG_UPDATE_BEGIN:
		m->u.update_begin.round = FZ_ROUND;
		m->u.update_begin.num_samples = 15000;
		m->u.update_begin.param_count = 109386;
		m->u.update_begin.chunk_count = 1;
		m->u.update_begin.steps = 100;
		m->u.update_begin.train_loss = 0.4321;
		m->u.update_begin.train_seconds = 1.5;
		strcpy(m->u.update_begin.backend, "cpu");
		fill(&m->u.update_begin.stream_key, FB_STREAM_KEY_LEN, 0x20);
		fill(&m->u.update_begin.stream_header, FB_STREAM_HEADER_LEN,
		    0x60);
		break;
	case FB_MSG_UPDATE_CHUNK:
		m->u.update_chunk.round = FZ_ROUND;
		m->u.update_chunk.chunk = 0;
		break;
	case FB_MSG_HEARTBEAT:
		m->u.heartbeat.round = FZ_ROUND;
		break;
	case FB_MSG_ROUND_CANCEL:
		m->u.round_cancel.round = FZ_ROUND;
		strcpy(m->u.round_cancel.reason, "deadline passed");
		break;
	case FB_MSG_ROUND_FAILED:
		m->u.round_failed.round = FZ_ROUND;
		strcpy(m->u.round_failed.reason, "training failed");
		break;
	case FB_MSG_SHUTDOWN:
		strcpy(m->u.shutdown.reason, "run complete");
		break;
	case FB_MSG_HANDSHAKE:
		memcpy(m->u.handshake.data.b, f->hello, sizeof(f->hello));
		m->u.handshake.data.len = sizeof(f->hello);
		break;
	case FB_MSG_REDIRECT:
		m->u.redirect.lane = 1;
		m->u.redirect.port = 7301;
		break;
	case FB_MSG_UPDATE_END:
		m->u.update_end.round = FZ_ROUND;
		fill(&m->u.update_end.stream_trailer, FB_STREAM_TRAILER_LEN,
		    0x90);
		break;
	case FB_MSG_SECAGG:
		m->u.secagg.round = FZ_ROUND;
		m->u.secagg.phase = FB_SA_SHARES;
		m->u.secagg.count = 2;
		break;
	case FB_MSG_UPDATE_CREDIT:
		m->u.update_credit.round = FZ_ROUND;
		m->u.update_credit.chunks = 8;
		m->u.update_credit.staleness = 2;
		break;
	default:
		fz_die("type");
	}
}

/* The round fb_secure_send's callers seal a message under. */
static uint32_t
seal_round(const fb_msg *m)
{
	switch (m->type) {
	case FB_MSG_ROUND_START:
	case FB_MSG_MODEL_FETCH:
	case FB_MSG_MODEL_CHUNK:
	case FB_MSG_UPDATE_BEGIN:
	case FB_MSG_UPDATE_CHUNK:
	case FB_MSG_UPDATE_END:
	case FB_MSG_ROUND_CANCEL:
	case FB_MSG_SECAGG:
		return FZ_ROUND; /* all examples are about round FZ_ROUND */
	default:
		return 0; /* between rounds */
	}
}

/* ---- proto_frame and proto_envelope ---- */

static void
put_frame(const char *name, const uint8_t *env, size_t n, uint8_t flags)
{
	static uint8_t buf[8192];

	buf[0] = 'F';
	buf[1] = 'B';
	buf[2] = 1;
	buf[3] = flags;
	memcpy(buf + 4, env, n);
	put("proto_frame", name, buf, n + 4);
}

static void
put_env(const char *name, const uint8_t *env, size_t n, bool with_payload)
{
	static uint8_t buf[8192];

	buf[0] = with_payload ? 1 : 0;
	memcpy(buf + 1, env, n);
	put("proto_envelope", name, buf, n + 1);
}

/* A near miss in both plain targets. */
static void
put_both(const char *name, const uint8_t *env, size_t n, bool with_payload)
{
	put_frame(name, env, n, with_payload ? FB_WIRE_PAYLOAD : 0);
	put_env(name, env, n, with_payload);
}

static size_t
pack_pb(const Fedbox__Envelope *e, uint8_t *buf, size_t cap)
{
	size_t n = fedbox__envelope__get_packed_size(e);
	if (n > cap) {
		fz_die("pb size");
	}
	return fedbox__envelope__pack(e, buf);
}

static void
gen_plain(const fz_fixture *f)
{
	uint8_t buf[FB_MAX_CONTROL_LEN], env[8192];
	size_t n, en;
	char name[64];
	fb_msg m;

	for (int t = FB_MSG_HELLO; t < FB_MSG_TYPE_COUNT_; t++) {
		example((fb_msg_type)t, f, &m);
		if (fb_msg_pack(&m, buf, sizeof(buf), &n) != FB_OK ||
		    fb_msg_pack_envelope(&m, env, sizeof(env), &en) != FB_OK) {
			fz_die("pack");
		}
		snprintf(name, sizeof(name), "valid_%s", fb_msg_type_name(t));
		put("proto_frame", name, buf, n);
		put_env(name, env, en, fb_msg_has_payload(m.type));
	}

	/* Prefix and flags (on a valid hello). */
	example(FB_MSG_HELLO, f, &m);
	if (fb_msg_pack_envelope(&m, env, sizeof(env), &en) != FB_OK) {
		fz_die("pack");
	}
	put_frame("miss_sealed_flag", env, en, FB_WIRE_SEALED);
	put_frame("miss_unknown_flag", env, en, 0x04);
	put_both("miss_truncated", env, en - 1, false);
	put_both("miss_payload_flag", env, en, true);
	if (fb_msg_pack(&m, buf, sizeof(buf), &n) != FB_OK) {
		fz_die("pack");
	}
	buf[0] = 'X';
	put("proto_frame", "miss_magic", buf, n);
	buf[0] = 'F';
	buf[2] = 2;
	put("proto_frame", "miss_wire_version", buf, n);
	put("proto_frame", "miss_prefix_only", buf, 3);
	put_both("miss_empty", env, 0, false);

	/* A chunk without its payload frame. */
	example(FB_MSG_MODEL_CHUNK, f, &m);
	if (fb_msg_pack_envelope(&m, env, sizeof(env), &en) != FB_OK) {
		fz_die("pack");
	}
	put_both("miss_no_payload", env, en, false);

	/* A control byte in a name (fb_msg_pack does not check text). */
	example(FB_MSG_HELLO, f, &m);
	m.u.hello.name[2] = 0x01;
	if (fb_msg_pack_envelope(&m, env, sizeof(env), &en) != FB_OK) {
		fz_die("pack");
	}
	put_both("miss_control_byte", env, en, false);

	/* Protobuf-c built near misses fb_msg_pack cannot write. */
	{
		Fedbox__Envelope e = FEDBOX__ENVELOPE__INIT;
		Fedbox__Hello h = FEDBOX__HELLO__INIT;
		Fedbox__Welcome w = FEDBOX__WELCOME__INIT;
		Fedbox__ModelSpec s = FEDBOX__MODEL_SPEC__INIT;
		Fedbox__Handshake hs = FEDBOX__HANDSHAKE__INIT;
		char longname[FB_NAME_MAX + 1], okname[FB_NAME_MAX];
		uint32_t hidden[FB_PROTO_MAX_HIDDEN + 1];
		uint8_t blob[FB_BLOB_MAX + 1];

		memset(longname, 'n', FB_NAME_MAX);
		longname[FB_NAME_MAX] = '\0';
		memset(okname, 'n', FB_NAME_MAX - 1);
		okname[FB_NAME_MAX - 1] = '\0';
		h.protocol_version = FB_PROTOCOL_VERSION;
		h.name = longname;
		e.body_case = FEDBOX__ENVELOPE__BODY_HELLO;
		e.hello = &h;
		en = pack_pb(&e, env, sizeof(env));
		put_both("miss_name_64", env, en, false);
		h.name = okname;
		en = pack_pb(&e, env, sizeof(env));
		put_both("edge_name_63", env, en, false);

		for (size_t i = 0; i <= FB_PROTO_MAX_HIDDEN; i++) {
			hidden[i] = (uint32_t)(i + 1);
		}
		s.arch = "mlp";
		s.input_dim = 784;
		s.classes = 10;
		s.hidden = hidden;
		s.n_hidden = FB_PROTO_MAX_HIDDEN + 1;
		w.protocol_version = FB_PROTOCOL_VERSION;
		w.model = &s;
		e.body_case = FEDBOX__ENVELOPE__BODY_WELCOME;
		e.welcome = &w;
		en = pack_pb(&e, env, sizeof(env));
		put_both("miss_hidden_17", env, en, false);
		s.n_hidden = FB_PROTO_MAX_HIDDEN;
		en = pack_pb(&e, env, sizeof(env));
		put_both("edge_hidden_16", env, en, false);
		w.model = NULL;
		en = pack_pb(&e, env, sizeof(env));
		put_both("miss_no_model", env, en, false);

		memset(blob, 0xb1, sizeof(blob));
		hs.data.data = blob;
		hs.data.len = FB_BLOB_MAX + 1;
		e.body_case = FEDBOX__ENVELOPE__BODY_HANDSHAKE;
		e.handshake = &hs;
		en = pack_pb(&e, env, sizeof(env));
		put_both("miss_blob_257", env, en, false);
		hs.data.len = FB_BLOB_MAX;
		en = pack_pb(&e, env, sizeof(env));
		put_both("edge_blob_256", env, en, false);
	}

	/* The frame-length limit: a heartbeat padded with an unknown field
	 * to exactly FB_MAX_CONTROL_LEN bytes (accepted), and one byte more
	 * (refused). */
	for (int extra = 0; extra < 2; extra++) {
		size_t total = FB_MAX_CONTROL_LEN + (size_t)extra;
		size_t pad = total - 4 - 4 - 3; /* prefix, heartbeat, tag+len */
		uint8_t *p = env;
		*p++ = (9 << 3) | 2; /* heartbeat, length-delimited */
		*p++ = 2;
		*p++ = (1 << 3) | 0; /* round = 1 */
		*p++ = 1;
		*p++ = (14 << 3) | 2; /* unknown field 14 */
		*p++ = (uint8_t)(0x80 | (pad & 0x7f));
		*p++ = (uint8_t)(pad >> 7);
		memset(p, 0, pad);
		en = (size_t)(p - env) + pad;
		put_both(extra ? "miss_too_long" : "edge_max_len", env, en,
		    false);
	}
}

/* ---- proto_sealed ---- */

/* Seals `env` on session `s` as fb_secure_send does: fb_msg_seal with the
 * message type and round. Returns the sealed length. */
static size_t
seal(fb_session *s, uint8_t type, uint32_t round, const uint8_t *env,
    size_t n, uint8_t *out, size_t cap)
{
	size_t len = 0;
	s->send_seq = 0; /* every seed is sequence number 1 */
	if (fb_msg_seal(s, type, round, env, n, out, cap, &len) != FB_OK) {
		fz_die("seal");
	}
	return len;
}

/* A RAW input of proto_sealed: selector, [payload length], frame,
 * [payload]. */
static void
put_raw(const char *name, uint8_t sel, const uint8_t *sealed, size_t n,
    bool with_payload)
{
	static uint8_t buf[8192];
	size_t pos = 0;

	buf[pos++] = (uint8_t)(sel | (with_payload ? 2 : 0));
	if (with_payload) {
		buf[pos++] = PAYLOAD_SEED_LEN;
	}
	memcpy(buf + pos, sealed, n);
	pos += n;
	if (with_payload) {
		for (size_t i = 0; i < PAYLOAD_SEED_LEN; i++) {
			buf[pos++] = (uint8_t)(0xe0 + i);
		}
	}
	put("proto_sealed", name, buf, pos);
}

/* A SEAL input: selector 1, [payload length], type, round, envelope,
 * [payload]. */
static void
put_seal(const char *name, uint8_t type, uint32_t round, const uint8_t *env,
    size_t n, bool with_payload)
{
	static uint8_t buf[8192];

	buf[0] = type;
	buf[1] = (uint8_t)round;
	buf[2] = (uint8_t)(round >> 8);
	buf[3] = (uint8_t)(round >> 16);
	buf[4] = (uint8_t)(round >> 24);
	memcpy(buf + 5, env, n);
	put_raw(name, 1, buf, n + 5, with_payload);
}

static void
gen_sealed(const fz_fixture *f)
{
	uint8_t env[FB_MAX_CONTROL_LEN], out[FB_MAX_CONTROL_LEN + 128];
	size_t en, n;
	char name[64];
	fb_msg m;

	for (int t = FB_MSG_HELLO; t < FB_MSG_TYPE_COUNT_; t++) {
		bool pl = fb_msg_has_payload((fb_msg_type)t);
		example((fb_msg_type)t, f, &m);
		if (fb_msg_pack_envelope(&m, env, sizeof(env), &en) != FB_OK) {
			fz_die("pack");
		}
		n = seal(f->worker_s, (uint8_t)t, seal_round(&m), env, en, out,
		    sizeof(out));
		snprintf(name, sizeof(name), "raw_%s", fb_msg_type_name(t));
		put_raw(name, 0, out, n, pl);
		snprintf(name, sizeof(name), "seal_%s", fb_msg_type_name(t));
		put_seal(name, (uint8_t)t, seal_round(&m), env, en, pl);
	}

	/* Near misses on a sealed round_start of round FZ_ROUND. */
	example(FB_MSG_ROUND_START, f, &m);
	if (fb_msg_pack_envelope(&m, env, sizeof(env), &en) != FB_OK) {
		fz_die("pack");
	}
	n = seal(f->worker_s, FB_MSG_ROUND_START, FZ_ROUND, env, en, out,
	    sizeof(out));
	put_raw("raw_miss_replay", 4, out, n, false);
	put_raw("raw_miss_payload_flag", 0, out, n, true);
	put_raw("raw_miss_short", 0, out, FB_MSG_OVERHEAD - 1, false);
	put_raw("raw_miss_cut", 0, out, n - 1, false);
	out[n - 1] ^= 1;
	put_raw("raw_miss_bad_mac", 0, out, n, false);
	n = seal(f->worker_s, FB_MSG_ROUND_START, FZ_ROUND + 1, env, en, out,
	    sizeof(out));
	put_raw("raw_miss_wrong_round", 0, out, n, false);
	n = seal(f->worker_s, FB_MSG_HEARTBEAT, FZ_ROUND, env, en, out,
	    sizeof(out));
	put_raw("raw_miss_wrong_type", 0, out, n, false);
	n = seal(f->coord_s, FB_MSG_ROUND_START, FZ_ROUND, env, en, out,
	    sizeof(out));
	put_raw("raw_miss_wrong_sender", 0, out, n, false);
	put_seal("seal_miss_wrong_round", FB_MSG_ROUND_START, FZ_ROUND + 1,
	    env, en, false);
	put_seal("seal_miss_wrong_type", FB_MSG_HEARTBEAT, FZ_ROUND, env, en,
	    false);
	put_seal("seal_miss_truncated", FB_MSG_ROUND_START, FZ_ROUND, env,
	    en - 1, false);
	put_seal("seal_miss_payload_flag", FB_MSG_ROUND_START, FZ_ROUND, env,
	    en, true);
	f->coord_s->send_seq = 0;
	f->worker_s->send_seq = 0;
}

int
main(int argc, char **argv)
{
	const fz_fixture *f;

	if (argc != 2) {
		fprintf(stderr, "usage: proto_corpus DIR\n");
		return 2;
	}
	out_dir = argv[1];
	f = fz_setup();
	gen_plain(f);
	gen_sealed(f);
	return 0;
}
