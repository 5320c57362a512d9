/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wirelog.c -- debug.wire_log (tests only): every message the coordinator
 * decoded from a worker, one JSON object per line, as it arrived: its
 * type, whether it was sealed, the sender's id, and each field a worker
 * sets (secrets left out: stream keys, handshake and payload bytes are
 * given by length only). A test reads it to check what a worker really
 * sent, e.g. that no speed or sample count leaves a secure-aggregation
 * worker.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "common/log.h"
#include "coordinator/coordinator_impl.h"

fb_err
wirelog_open(coord *c)
{
	const char *path = c->cfg->wire_log;

	if (path == NULL || path[0] == '\0') {
		return FB_OK;
	}
	if ((c->wirelog = fopen(path, "a")) == NULL) {
		fb_log_error("debug.wire_log: cannot open %s", path);
		return FB_EIO;
	}
	fb_log_warn("debug.wire_log: every message from the workers is "
	            "written to %s (tests only)", path);
	return FB_OK;
}

void
wirelog_close(coord *c)
{
	if (c->wirelog != NULL) {
		fclose(c->wirelog);
		c->wirelog = NULL;
	}
}

static void
put_text(FILE *f, const char *key, const char *s)
{
	fprintf(f, ", \"%s\": \"", key);
	for (; *s != '\0'; s++) {
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

/* A double as JSON (null when not finite: a peer may send anything). */
static void
put_num(FILE *f, const char *key, double v)
{
	if (isfinite(v)) {
		fprintf(f, ", \"%s\": %.17g", key, v);
	} else {
		fprintf(f, ", \"%s\": null", key);
	}
}

static void
put_fields(FILE *f, const fb_frame *fr)
{
	const fb_msg *m = &fr->msg;

	switch (m->type) {
	case FB_MSG_HELLO:
		fprintf(f, ", \"protocol_version\": %u",
		    m->u.hello.protocol_version);
		put_text(f, "name", m->u.hello.name);
		fprintf(f, ", \"worker_index\": %u, \"num_samples\": %" PRIu64
		           ", \"session\": %" PRIu64 ", \"lane\": %u, "
		           "\"partitions\": %u",
		    m->u.hello.worker_index, m->u.hello.num_samples,
		    m->u.hello.session, m->u.hello.lane, m->u.hello.partitions);
		put_text(f, "backend", m->u.hello.backend);
		put_text(f, "software", m->u.hello.software);
		return;
	case FB_MSG_UPDATE_BEGIN:
		fprintf(f, ", \"round\": %u, \"num_samples\": %" PRIu64
		           ", \"param_count\": %" PRIu64
		           ", \"chunk_count\": %u, \"steps\": %" PRIu64,
		    m->u.update_begin.round, m->u.update_begin.num_samples,
		    m->u.update_begin.param_count,
		    m->u.update_begin.chunk_count, m->u.update_begin.steps);
		put_num(f, "train_loss", m->u.update_begin.train_loss);
		put_num(f, "train_seconds", m->u.update_begin.train_seconds);
		put_num(f, "a_norm", m->u.update_begin.a_norm);
		put_num(f, "steps_per_second",
		    m->u.update_begin.steps_per_second);
		put_text(f, "backend", m->u.update_begin.backend);
		fprintf(f, ", \"stream_key_len\": %u",
		    m->u.update_begin.stream_key.len);
		return;
	case FB_MSG_UPDATE_CHUNK:
	case FB_MSG_MODEL_FETCH:
		fprintf(f, ", \"round\": %u, \"chunk\": %u",
		    m->u.update_chunk.round, m->u.update_chunk.chunk);
		return;
	case FB_MSG_UPDATE_END:
		fprintf(f, ", \"round\": %u, \"trailer_len\": %u",
		    m->u.update_end.round, m->u.update_end.stream_trailer.len);
		return;
	case FB_MSG_SECAGG:
		fprintf(f, ", \"round\": %u, \"phase\": %u, \"count\": %u",
		    m->u.secagg.round, m->u.secagg.phase, m->u.secagg.count);
		return;
	case FB_MSG_HEARTBEAT:
		fprintf(f, ", \"round\": %u", m->u.heartbeat.round);
		return;
	case FB_MSG_HANDSHAKE:
		fprintf(f, ", \"data_len\": %u, \"lane\": %u",
		    m->u.handshake.data.len, m->u.handshake.lane);
		return;
	default:
		return;
	}
}

void
wirelog_frame(coord *c, const fb_frame *f, int64_t sender)
{
	FILE *out = c->wirelog;

	if (out == NULL) {
		return;
	}
	fprintf(out, "{\"t_ms\": %" PRId64 ", \"type\": \"%s\", "
	             "\"sealed\": %s, \"sender\": %" PRId64
	             ", \"payload_len\": %zu",
	    c->now, fb_msg_type_name(f->msg.type), f->sealed ? "true" : "false",
	    sender, f->payload_len);
	put_fields(out, f);
	fputs("}\n", out);
	fflush(out);
}
