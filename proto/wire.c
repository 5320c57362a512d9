/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire.c -- fb_msg <-> frame 0 (prefix + protobuf Envelope).
 *
 * The only file that includes the generated protobuf-c header. Unpacking
 * never trusts the peer: every string is copied with a bound and checked
 * for control bytes, every repeated field is bounded.
 */
#include <string.h>

#include "proto/fedbox.pb-c.h"
#include "proto/proto.h"

#define WIRE_MAGIC0 'F'
#define WIRE_MAGIC1 'B'
#define WIRE_VERSION 1

static const char *const type_names[FB_MSG_TYPE_COUNT_] = {
	"none", "hello", "welcome", "reject", "round_start", "model_fetch",
	"model_chunk", "update_begin", "update_chunk", "heartbeat",
	"round_cancel", "shutdown", "handshake", "update_end", "secagg",
	"redirect", "round_failed", "update_credit",
};

const char *
fb_msg_type_name(fb_msg_type t)
{
	if ((unsigned)t >= FB_MSG_TYPE_COUNT_) {
		return "unknown";
	}
	return type_names[t];
}

bool
fb_msg_has_payload(fb_msg_type t)
{
	return t == FB_MSG_MODEL_CHUNK || t == FB_MSG_UPDATE_CHUNK ||
	    t == FB_MSG_SECAGG || t == FB_MSG_WELCOME;
}

/* Text from a peer: bounded, printable or UTF-8 bytes, no control bytes. */
static bool
copy_text(char *dst, size_t cap, const char *src)
{
	size_t n;
	if (src == NULL) {
		dst[0] = '\0';
		return true;
	}
	n = strlen(src);
	if (n >= cap) {
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)src[i] < 0x20 || src[i] == 0x7f) {
			return false;
		}
	}
	memcpy(dst, src, n + 1);
	return true;
}

static ProtobufCBinaryData
blob_to_pb(const fb_blob *b)
{
	ProtobufCBinaryData d = {b->len, (uint8_t *)(uintptr_t)b->b};
	return d;
}

/* RoundStart m's secure-aggregation fields as a SecAggRound (set_up
 * left false); its seed points into m. */
static void
sar_from_msg(const fb_msg *m, Fedbox__SecAggRound *sar)
{
	fedbox__sec_agg_round__init(sar);
	sar->slot = m->u.round_start.sa_slot;
	sar->n = m->u.round_start.sa_n;
	sar->degree = m->u.round_start.sa_degree;
	sar->threshold = m->u.round_start.sa_threshold;
	sar->graph_seed = blob_to_pb(&m->u.round_start.sa_graph_seed);
	sar->ring_bits = m->u.round_start.sa_ring_bits;
	sar->clip = m->u.round_start.sa_clip;
	sar->max_samples = m->u.round_start.sa_max_samples;
	sar->a_bound = m->u.round_start.sa_a_bound;
	sar->max_staleness = m->u.round_start.sa_max_staleness;
}

static bool
blob_from_pb(fb_blob *b, ProtobufCBinaryData d)
{
	if (d.len > sizeof(b->b)) {
		return false;
	}
	if (d.len > 0) {
		memcpy(b->b, d.data, d.len);
	}
	b->len = (uint32_t)d.len;
	return true;
}

static void
spec_to_pb(const fb_wire_model_spec *s, Fedbox__ModelSpec *pb)
{
	fedbox__model_spec__init(pb);
	pb->arch = (char *)(uintptr_t)s->arch;
	pb->input_dim = s->input_dim;
	pb->classes = s->classes;
	pb->n_hidden = s->hidden_count;
	pb->hidden = (uint32_t *)(uintptr_t)s->hidden;
	pb->synthetic_params = s->synthetic_params;
	pb->plugin = (char *)(uintptr_t)s->plugin;
	pb->task = s->task;
}

fb_err
fb_msg_pack_envelope(const fb_msg *m, uint8_t *buf, size_t cap, size_t *len)
{
	Fedbox__Envelope env = FEDBOX__ENVELOPE__INIT;
	Fedbox__Hello hello;
	Fedbox__Welcome welcome;
	Fedbox__ModelSpec spec;
	Fedbox__Reject reject;
	Fedbox__RoundStart rs;
	Fedbox__ModelFetch mf;
	Fedbox__ModelChunk mc;
	Fedbox__UpdateBegin ub;
	Fedbox__UpdateChunk uc;
	Fedbox__UpdateCredit ucr;
	Fedbox__Heartbeat hb;
	Fedbox__RoundCancel rc;
	Fedbox__RoundFailed rf;
	Fedbox__Shutdown sd;
	Fedbox__Handshake hs;
	Fedbox__UpdateEnd ue;
	Fedbox__SecAgg sa;
	Fedbox__SecAggRound sar;
	Fedbox__Redirect rd;
	Fedbox__Metric met[FB_WIRE_METRICS_MAX];
	Fedbox__Metric *metp[FB_WIRE_METRICS_MAX];
	size_t need;

	*len = 0;
	switch (m->type) {
	case FB_MSG_HELLO:
		fedbox__hello__init(&hello);
		hello.protocol_version = m->u.hello.protocol_version;
		hello.name = (char *)(uintptr_t)m->u.hello.name;
		hello.worker_index = m->u.hello.worker_index;
		hello.num_samples = m->u.hello.num_samples;
		hello.backend = (char *)(uintptr_t)m->u.hello.backend;
		hello.software = (char *)(uintptr_t)m->u.hello.software;
		hello.session = m->u.hello.session;
		hello.lane = m->u.hello.lane;
		hello.partitions = m->u.hello.partitions;
		env.body_case = FEDBOX__ENVELOPE__BODY_HELLO;
		env.hello = &hello;
		break;
	case FB_MSG_WELCOME:
		if (m->u.welcome.model.hidden_count > FB_PROTO_MAX_HIDDEN ||
		    m->u.welcome.model.task > 1) {
			return FB_EINVAL;
		}
		fedbox__welcome__init(&welcome);
		welcome.protocol_version = m->u.welcome.protocol_version;
		welcome.run_id = m->u.welcome.run_id;
		welcome.worker_id = m->u.welcome.worker_id;
		welcome.heartbeat_ms = m->u.welcome.heartbeat_ms;
		welcome.liveness_ms = m->u.welcome.liveness_ms;
		welcome.chunk_bytes = m->u.welcome.chunk_bytes;
		spec_to_pb(&m->u.welcome.model, &spec);
		welcome.model = &spec;
		welcome.param_count = m->u.welcome.param_count;
		env.body_case = FEDBOX__ENVELOPE__BODY_WELCOME;
		env.welcome = &welcome;
		break;
	case FB_MSG_REJECT:
		fedbox__reject__init(&reject);
		reject.reason = (char *)(uintptr_t)m->u.reject.reason;
		reject.protocol_version = m->u.reject.protocol_version;
		env.body_case = FEDBOX__ENVELOPE__BODY_REJECT;
		env.reject = &reject;
		break;
	case FB_MSG_ROUND_START:
		fedbox__round_start__init(&rs);
		rs.round = m->u.round_start.round;
		rs.param_count = m->u.round_start.param_count;
		rs.chunk_count = m->u.round_start.chunk_count;
		rs.chunk_bytes = m->u.round_start.chunk_bytes;
		rs.local_steps = m->u.round_start.local_steps;
		rs.batch_size = m->u.round_start.batch_size;
		rs.lr = m->u.round_start.lr;
		rs.momentum = m->u.round_start.momentum;
		rs.weight_decay = m->u.round_start.weight_decay;
		rs.seed = m->u.round_start.seed;
		rs.deadline_ms = m->u.round_start.deadline_ms;
		rs.synthetic = m->u.round_start.synthetic;
		rs.round_key = blob_to_pb(&m->u.round_start.round_key);
		rs.stream_header = blob_to_pb(&m->u.round_start.stream_header);
		rs.stream_trailer = blob_to_pb(&m->u.round_start.stream_trailer);
		rs.prox_mu = m->u.round_start.prox_mu;
		rs.fednova = m->u.round_start.fednova;
		rs.local_epochs = m->u.round_start.local_epochs;
		rs.first_chunk = m->u.round_start.first_chunk;
		rs.time_budget_ms = m->u.round_start.time_budget_ms;
		rs.min_steps = m->u.round_start.min_steps;
		rs.max_steps = m->u.round_start.max_steps;
		rs.model_round = m->u.round_start.model_round;
		rs.evaluate_only = m->u.round_start.evaluate_only;
		if (m->u.round_start.secagg) {
			sar_from_msg(m, &sar);
			sar.set_up = m->u.round_start.sa_set_up;
			rs.secagg = &sar;
		}
		env.body_case = FEDBOX__ENVELOPE__BODY_ROUND_START;
		env.round_start = &rs;
		break;
	case FB_MSG_MODEL_FETCH:
		fedbox__model_fetch__init(&mf);
		mf.round = m->u.model_fetch.round;
		mf.chunk = m->u.model_fetch.chunk;
		env.body_case = FEDBOX__ENVELOPE__BODY_MODEL_FETCH;
		env.model_fetch = &mf;
		break;
	case FB_MSG_MODEL_CHUNK:
		fedbox__model_chunk__init(&mc);
		mc.round = m->u.model_chunk.round;
		mc.chunk = m->u.model_chunk.chunk;
		env.body_case = FEDBOX__ENVELOPE__BODY_MODEL_CHUNK;
		env.model_chunk = &mc;
		break;
	case FB_MSG_UPDATE_BEGIN:
		fedbox__update_begin__init(&ub);
		ub.round = m->u.update_begin.round;
		ub.num_samples = m->u.update_begin.num_samples;
		ub.param_count = m->u.update_begin.param_count;
		ub.chunk_count = m->u.update_begin.chunk_count;
		ub.steps = m->u.update_begin.steps;
		ub.train_loss = m->u.update_begin.train_loss;
		ub.train_seconds = m->u.update_begin.train_seconds;
		ub.backend = (char *)(uintptr_t)m->u.update_begin.backend;
		ub.stream_key = blob_to_pb(&m->u.update_begin.stream_key);
		ub.stream_header = blob_to_pb(&m->u.update_begin.stream_header);
		ub.a_norm = m->u.update_begin.a_norm;
		ub.steps_per_second = m->u.update_begin.steps_per_second;
		ub.eval_examples = m->u.update_begin.eval_examples;
		ub.eval_loss = m->u.update_begin.eval_loss;
		ub.eval_accuracy = m->u.update_begin.eval_accuracy;
		if (m->u.update_begin.eval_metric_count > FB_WIRE_METRICS_MAX) {
			return FB_EINVAL;
		}
		for (uint32_t k = 0; k < m->u.update_begin.eval_metric_count;
		     k++) {
			fedbox__metric__init(&met[k]);
			met[k].name =
			    (char *)(uintptr_t)m->u.update_begin.eval_name[k];
			met[k].value = m->u.update_begin.eval_metric[k];
			metp[k] = &met[k];
		}
		ub.n_eval_metrics = m->u.update_begin.eval_metric_count;
		ub.eval_metrics = metp;
		env.body_case = FEDBOX__ENVELOPE__BODY_UPDATE_BEGIN;
		env.update_begin = &ub;
		break;
	case FB_MSG_UPDATE_CHUNK:
		fedbox__update_chunk__init(&uc);
		uc.round = m->u.update_chunk.round;
		uc.chunk = m->u.update_chunk.chunk;
		env.body_case = FEDBOX__ENVELOPE__BODY_UPDATE_CHUNK;
		env.update_chunk = &uc;
		break;
	case FB_MSG_UPDATE_CREDIT:
		fedbox__update_credit__init(&ucr);
		ucr.round = m->u.update_credit.round;
		ucr.chunks = m->u.update_credit.chunks;
		ucr.staleness = m->u.update_credit.staleness;
		env.body_case = FEDBOX__ENVELOPE__BODY_UPDATE_CREDIT;
		env.update_credit = &ucr;
		break;
	case FB_MSG_HEARTBEAT:
		fedbox__heartbeat__init(&hb);
		hb.round = m->u.heartbeat.round;
		env.body_case = FEDBOX__ENVELOPE__BODY_HEARTBEAT;
		env.heartbeat = &hb;
		break;
	case FB_MSG_ROUND_CANCEL:
		fedbox__round_cancel__init(&rc);
		rc.round = m->u.round_cancel.round;
		rc.reason = (char *)(uintptr_t)m->u.round_cancel.reason;
		env.body_case = FEDBOX__ENVELOPE__BODY_ROUND_CANCEL;
		env.round_cancel = &rc;
		break;
	case FB_MSG_ROUND_FAILED:
		fedbox__round_failed__init(&rf);
		rf.round = m->u.round_failed.round;
		rf.reason = (char *)(uintptr_t)m->u.round_failed.reason;
		env.body_case = FEDBOX__ENVELOPE__BODY_ROUND_FAILED;
		env.round_failed = &rf;
		break;
	case FB_MSG_SHUTDOWN:
		fedbox__shutdown__init(&sd);
		sd.reason = (char *)(uintptr_t)m->u.shutdown.reason;
		env.body_case = FEDBOX__ENVELOPE__BODY_SHUTDOWN;
		env.shutdown = &sd;
		break;
	case FB_MSG_HANDSHAKE:
		fedbox__handshake__init(&hs);
		hs.data = blob_to_pb(&m->u.handshake.data);
		hs.lane = m->u.handshake.lane;
		env.body_case = FEDBOX__ENVELOPE__BODY_HANDSHAKE;
		env.handshake = &hs;
		break;
	case FB_MSG_UPDATE_END:
		fedbox__update_end__init(&ue);
		ue.round = m->u.update_end.round;
		ue.stream_trailer = blob_to_pb(&m->u.update_end.stream_trailer);
		env.body_case = FEDBOX__ENVELOPE__BODY_UPDATE_END;
		env.update_end = &ue;
		break;
	case FB_MSG_REDIRECT:
		fedbox__redirect__init(&rd);
		rd.lane = m->u.redirect.lane;
		rd.port = m->u.redirect.port;
		env.body_case = FEDBOX__ENVELOPE__BODY_REDIRECT;
		env.redirect = &rd;
		break;
	case FB_MSG_SECAGG:
		fedbox__sec_agg__init(&sa);
		sa.round = m->u.secagg.round;
		sa.phase = m->u.secagg.phase;
		sa.count = m->u.secagg.count;
		sa.ahead = m->u.secagg.ahead;
		env.body_case = FEDBOX__ENVELOPE__BODY_SECAGG;
		env.secagg = &sa;
		break;
	default:
		return FB_EINVAL;
	}
	need = fedbox__envelope__get_packed_size(&env);
	if (need > cap || need + FB_WIRE_PREFIX_LEN > FB_MAX_CONTROL_LEN) {
		return FB_ERANGE;
	}
	fedbox__envelope__pack(&env, buf);
	*len = need;
	return FB_OK;
}

fb_err
fb_msg_pack(const fb_msg *m, uint8_t *buf, size_t cap, size_t *len)
{
	fb_err rc;
	size_t n = 0;

	*len = 0;
	if (cap < FB_WIRE_PREFIX_LEN) {
		return FB_ERANGE;
	}
	rc = fb_msg_pack_envelope(m, buf + FB_WIRE_PREFIX_LEN,
	    cap - FB_WIRE_PREFIX_LEN, &n);
	if (rc != FB_OK) {
		return rc;
	}
	buf[0] = WIRE_MAGIC0;
	buf[1] = WIRE_MAGIC1;
	buf[2] = WIRE_VERSION;
	buf[3] = fb_msg_has_payload(m->type) ? FB_WIRE_PAYLOAD : 0;
	*len = n + FB_WIRE_PREFIX_LEN;
	return FB_OK;
}

static bool
spec_from_pb(const Fedbox__ModelSpec *pb, fb_wire_model_spec *s)
{
	if (pb == NULL || pb->n_hidden > FB_PROTO_MAX_HIDDEN || pb->task > 1) {
		return false;
	}
	if (!copy_text(s->arch, sizeof(s->arch), pb->arch) ||
	    !copy_text(s->plugin, sizeof(s->plugin), pb->plugin)) {
		return false;
	}
	s->input_dim = pb->input_dim;
	s->classes = pb->classes;
	s->hidden_count = (uint32_t)pb->n_hidden;
	for (size_t i = 0; i < pb->n_hidden; i++) {
		s->hidden[i] = pb->hidden[i];
	}
	s->synthetic_params = pb->synthetic_params;
	s->task = pb->task;
	return true;
}

fb_err
fb_msg_unpack(const uint8_t *buf, size_t len, fb_msg *m, const char **why)
{
	const char *reason = NULL;

	memset(m, 0, sizeof(*m));
	if (len < FB_WIRE_PREFIX_LEN || buf[0] != WIRE_MAGIC0 ||
	    buf[1] != WIRE_MAGIC1) {
		reason = "not a fedbox frame (bad prefix)";
	} else if (buf[2] != WIRE_VERSION) {
		reason = "unsupported wire version";
	} else if (len > FB_MAX_CONTROL_LEN) {
		reason = "control frame too long";
	} else if (buf[3] & ~(FB_WIRE_PAYLOAD | FB_WIRE_SEALED)) {
		reason = "unknown frame flags";
	} else if (buf[3] & FB_WIRE_SEALED) {
		reason = "sealed frame where a plain one was expected";
	}
	if (reason != NULL) {
		if (why != NULL) {
			*why = reason;
		}
		return FB_EPROTO;
	}
	return fb_msg_unpack_envelope(buf + FB_WIRE_PREFIX_LEN,
	    len - FB_WIRE_PREFIX_LEN, (buf[3] & FB_WIRE_PAYLOAD) != 0, m, why);
}

fb_err
fb_msg_unpack_envelope(const uint8_t *buf, size_t len, bool with_payload,
    fb_msg *m, const char **why)
{
	fb_err rc = FB_EPROTO;
	Fedbox__Envelope *env = NULL;
	const char *reason = "malformed";

	memset(m, 0, sizeof(*m));
	if (len + FB_WIRE_PREFIX_LEN > FB_MAX_CONTROL_LEN) {
		reason = "control frame too long";
		goto out;
	}
	env = fedbox__envelope__unpack(NULL, len, buf);
	if (env == NULL) {
		reason = "protobuf does not decode";
		goto out;
	}
	reason = "bad field";
	switch (env->body_case) {
	case FEDBOX__ENVELOPE__BODY_HELLO:
		m->type = FB_MSG_HELLO;
		m->u.hello.protocol_version = env->hello->protocol_version;
		m->u.hello.worker_index = env->hello->worker_index;
		m->u.hello.num_samples = env->hello->num_samples;
		m->u.hello.session = env->hello->session;
		m->u.hello.lane = env->hello->lane;
		m->u.hello.partitions = env->hello->partitions;
		if (!copy_text(m->u.hello.name, sizeof(m->u.hello.name),
		        env->hello->name) ||
		    !copy_text(m->u.hello.backend, sizeof(m->u.hello.backend),
		        env->hello->backend) ||
		    !copy_text(m->u.hello.software,
		        sizeof(m->u.hello.software), env->hello->software)) {
			reason = "hello: bad text field";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_WELCOME:
		m->type = FB_MSG_WELCOME;
		m->u.welcome.protocol_version = env->welcome->protocol_version;
		m->u.welcome.run_id = env->welcome->run_id;
		m->u.welcome.worker_id = env->welcome->worker_id;
		m->u.welcome.heartbeat_ms = env->welcome->heartbeat_ms;
		m->u.welcome.liveness_ms = env->welcome->liveness_ms;
		m->u.welcome.chunk_bytes = env->welcome->chunk_bytes;
		m->u.welcome.param_count = env->welcome->param_count;
		if (!spec_from_pb(env->welcome->model, &m->u.welcome.model)) {
			reason = "welcome: bad model spec";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_REJECT:
		m->type = FB_MSG_REJECT;
		m->u.reject.protocol_version = env->reject->protocol_version;
		if (!copy_text(m->u.reject.reason, sizeof(m->u.reject.reason),
		        env->reject->reason)) {
			reason = "reject: bad reason text";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_ROUND_START: {
		const Fedbox__RoundStart *p = env->round_start;
		m->type = FB_MSG_ROUND_START;
		m->u.round_start.round = p->round;
		m->u.round_start.param_count = p->param_count;
		m->u.round_start.chunk_count = p->chunk_count;
		m->u.round_start.chunk_bytes = p->chunk_bytes;
		m->u.round_start.local_steps = p->local_steps;
		m->u.round_start.batch_size = p->batch_size;
		m->u.round_start.lr = p->lr;
		m->u.round_start.momentum = p->momentum;
		m->u.round_start.weight_decay = p->weight_decay;
		m->u.round_start.seed = p->seed;
		m->u.round_start.deadline_ms = p->deadline_ms;
		m->u.round_start.synthetic = p->synthetic;
		m->u.round_start.prox_mu = p->prox_mu;
		m->u.round_start.fednova = p->fednova;
		m->u.round_start.local_epochs = p->local_epochs;
		m->u.round_start.first_chunk = p->first_chunk;
		m->u.round_start.time_budget_ms = p->time_budget_ms;
		m->u.round_start.min_steps = p->min_steps;
		m->u.round_start.max_steps = p->max_steps;
		m->u.round_start.model_round = p->model_round;
		m->u.round_start.evaluate_only = p->evaluate_only != 0;
		if (p->secagg != NULL) {
			const Fedbox__SecAggRound *q = p->secagg;
			m->u.round_start.secagg = true;
			m->u.round_start.sa_slot = q->slot;
			m->u.round_start.sa_n = q->n;
			m->u.round_start.sa_degree = q->degree;
			m->u.round_start.sa_threshold = q->threshold;
			m->u.round_start.sa_ring_bits = q->ring_bits;
			m->u.round_start.sa_clip = q->clip;
			m->u.round_start.sa_max_samples = q->max_samples;
			m->u.round_start.sa_a_bound = q->a_bound;
			m->u.round_start.sa_max_staleness = q->max_staleness;
			m->u.round_start.sa_set_up = q->set_up != 0;
			if (!blob_from_pb(&m->u.round_start.sa_graph_seed,
			        q->graph_seed)) {
				reason = "round_start: blob too long";
				goto out;
			}
		}
		if (!blob_from_pb(&m->u.round_start.round_key, p->round_key) ||
		    !blob_from_pb(&m->u.round_start.stream_header,
		        p->stream_header) ||
		    !blob_from_pb(&m->u.round_start.stream_trailer,
		        p->stream_trailer)) {
			reason = "round_start: blob too long";
			goto out;
		}
		break;
	}
	case FEDBOX__ENVELOPE__BODY_MODEL_FETCH:
		m->type = FB_MSG_MODEL_FETCH;
		m->u.model_fetch.round = env->model_fetch->round;
		m->u.model_fetch.chunk = env->model_fetch->chunk;
		break;
	case FEDBOX__ENVELOPE__BODY_MODEL_CHUNK:
		m->type = FB_MSG_MODEL_CHUNK;
		m->u.model_chunk.round = env->model_chunk->round;
		m->u.model_chunk.chunk = env->model_chunk->chunk;
		break;
	case FEDBOX__ENVELOPE__BODY_UPDATE_BEGIN: {
		const Fedbox__UpdateBegin *p = env->update_begin;
		m->type = FB_MSG_UPDATE_BEGIN;
		m->u.update_begin.round = p->round;
		m->u.update_begin.num_samples = p->num_samples;
		m->u.update_begin.param_count = p->param_count;
		m->u.update_begin.chunk_count = p->chunk_count;
		m->u.update_begin.steps = p->steps;
		m->u.update_begin.train_loss = p->train_loss;
		m->u.update_begin.train_seconds = p->train_seconds;
		m->u.update_begin.a_norm = p->a_norm;
		m->u.update_begin.steps_per_second = p->steps_per_second;
		m->u.update_begin.eval_examples = p->eval_examples;
		m->u.update_begin.eval_loss = p->eval_loss;
		m->u.update_begin.eval_accuracy = p->eval_accuracy;
		if (p->n_eval_metrics > FB_WIRE_METRICS_MAX) {
			reason = "update_begin: too many evaluation metrics";
			goto out;
		}
		m->u.update_begin.eval_metric_count =
		    (uint32_t)p->n_eval_metrics;
		for (size_t k = 0; k < p->n_eval_metrics; k++) {
			const char *nm = p->eval_metrics[k]->name;
			if (!copy_text(m->u.update_begin.eval_name[k],
			        FB_WIRE_METRIC_NAME, nm)) {
				reason = "update_begin: bad metric name";
				goto out;
			}
			m->u.update_begin.eval_metric[k] =
			    p->eval_metrics[k]->value;
		}
		if (!copy_text(m->u.update_begin.backend,
		        sizeof(m->u.update_begin.backend), p->backend)) {
			reason = "update_begin: bad backend text";
			goto out;
		}
		if (!blob_from_pb(&m->u.update_begin.stream_key, p->stream_key) ||
		    !blob_from_pb(&m->u.update_begin.stream_header,
		        p->stream_header)) {
			reason = "update_begin: blob too long";
			goto out;
		}
		break;
	}
	case FEDBOX__ENVELOPE__BODY_UPDATE_CHUNK:
		m->type = FB_MSG_UPDATE_CHUNK;
		m->u.update_chunk.round = env->update_chunk->round;
		m->u.update_chunk.chunk = env->update_chunk->chunk;
		break;
	case FEDBOX__ENVELOPE__BODY_UPDATE_CREDIT:
		m->type = FB_MSG_UPDATE_CREDIT;
		m->u.update_credit.round = env->update_credit->round;
		m->u.update_credit.chunks = env->update_credit->chunks;
		m->u.update_credit.staleness = env->update_credit->staleness;
		break;
	case FEDBOX__ENVELOPE__BODY_HEARTBEAT:
		m->type = FB_MSG_HEARTBEAT;
		m->u.heartbeat.round = env->heartbeat->round;
		break;
	case FEDBOX__ENVELOPE__BODY_ROUND_CANCEL:
		m->type = FB_MSG_ROUND_CANCEL;
		m->u.round_cancel.round = env->round_cancel->round;
		if (!copy_text(m->u.round_cancel.reason,
		        sizeof(m->u.round_cancel.reason),
		        env->round_cancel->reason)) {
			reason = "round_cancel: bad reason text";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_ROUND_FAILED:
		m->type = FB_MSG_ROUND_FAILED;
		m->u.round_failed.round = env->round_failed->round;
		if (!copy_text(m->u.round_failed.reason,
		        sizeof(m->u.round_failed.reason),
		        env->round_failed->reason)) {
			reason = "round_failed: bad reason text";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_SHUTDOWN:
		m->type = FB_MSG_SHUTDOWN;
		if (!copy_text(m->u.shutdown.reason,
		        sizeof(m->u.shutdown.reason), env->shutdown->reason)) {
			reason = "shutdown: bad reason text";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_HANDSHAKE:
		m->type = FB_MSG_HANDSHAKE;
		if (!blob_from_pb(&m->u.handshake.data, env->handshake->data)) {
			reason = "handshake: blob too long";
			goto out;
		}
		m->u.handshake.lane = env->handshake->lane;
		break;
	case FEDBOX__ENVELOPE__BODY_REDIRECT:
		m->type = FB_MSG_REDIRECT;
		m->u.redirect.lane = env->redirect->lane;
		m->u.redirect.port = env->redirect->port;
		break;
	case FEDBOX__ENVELOPE__BODY_UPDATE_END:
		m->type = FB_MSG_UPDATE_END;
		m->u.update_end.round = env->update_end->round;
		if (!blob_from_pb(&m->u.update_end.stream_trailer,
		        env->update_end->stream_trailer)) {
			reason = "update_end: blob too long";
			goto out;
		}
		break;
	case FEDBOX__ENVELOPE__BODY_SECAGG:
		m->type = FB_MSG_SECAGG;
		m->u.secagg.round = env->secagg->round;
		m->u.secagg.phase = env->secagg->phase;
		m->u.secagg.count = env->secagg->count;
		m->u.secagg.ahead = env->secagg->ahead != 0;
		if (m->u.secagg.phase < FB_SA_ADVERT ||
		    m->u.secagg.phase > FB_SA_PHASE_MAX_) {
			reason = "secagg: unknown phase";
			goto out;
		}
		break;
	default:
		reason = "envelope has no known body";
		goto out;
	}
	if (with_payload != fb_msg_has_payload(m->type)) {
		reason = "payload flag does not match the message type";
		goto out;
	}
	rc = FB_OK;
out:
	if (env != NULL) {
		fedbox__envelope__free_unpacked(env, NULL);
	}
	if (rc != FB_OK) {
		memset(m, 0, sizeof(*m));
		if (why != NULL) {
			*why = reason;
		}
	}
	return rc;
}

fb_err
fb_sa_setup_pack(const fb_msg *rs, uint8_t *buf, size_t cap, size_t *len)
{
	Fedbox__SecAggRound sar;

	sar_from_msg(rs, &sar);
	if (fedbox__sec_agg_round__get_packed_size(&sar) > cap) {
		return FB_ERANGE;
	}
	*len = fedbox__sec_agg_round__pack(&sar, buf);
	return FB_OK;
}

fb_err
fb_sa_setup_unpack(const uint8_t *buf, size_t len, fb_msg *rs)
{
	Fedbox__SecAggRound *q;
	fb_err rc = FB_OK;

	if (len > FB_SA_SETUP_MAX ||
	    (q = fedbox__sec_agg_round__unpack(NULL, len, buf)) == NULL) {
		return FB_EPROTO;
	}
	rs->u.round_start.secagg = true;
	rs->u.round_start.sa_slot = q->slot;
	rs->u.round_start.sa_n = q->n;
	rs->u.round_start.sa_degree = q->degree;
	rs->u.round_start.sa_threshold = q->threshold;
	rs->u.round_start.sa_ring_bits = q->ring_bits;
	rs->u.round_start.sa_clip = q->clip;
	rs->u.round_start.sa_max_samples = q->max_samples;
	rs->u.round_start.sa_a_bound = q->a_bound;
	rs->u.round_start.sa_max_staleness = q->max_staleness;
	rs->u.round_start.sa_set_up = false;
	if (q->graph_seed.len > 32 ||
	    !blob_from_pb(&rs->u.round_start.sa_graph_seed, q->graph_seed)) {
		rc = FB_EPROTO;
	}
	fedbox__sec_agg_round__free_unpacked(q, NULL);
	return rc;
}
