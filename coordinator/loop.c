/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop.c -- the coordinator's one event loop.
 *
 * Each turn waits (at most until the round's next timer, and never more
 * than 100 ms) for a message on the ROUTER socket or for the wake fd: an
 * epoll set of the ingest pool's results and the job thread's completions.
 * Then, in order: the message (authenticated in secure mode, then
 * dispatched by type), the pool's results, a finished job, the registry's
 * heartbeats and liveness, and the round's step. No handler waits: long
 * work is a job, and sends never block (a full queue is FB_EAGAIN).
 *
 * The wake fd also fires when the link saw an authenticated connection
 * close: its worker is dropped once the socket's queue is empty, so that
 * what the worker sent before it went (its last update chunks, say) is
 * still taken.
 */
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

/* Dispatches an authenticated (or, in plain mode, admitted) message. `buf`
 * is its payload, taken out of the link (UpdateChunk only), which the
 * handler owns. */
void
coord_dispatch(coord *c, worker *w, const fb_frame *f, fb_buf *buf)
{
	w->last_seen_ms = c->now;
	if (c->link != NULL) {
		fb_link_last_conn(c->link, &w->conn);
	}
	switch (f->msg.type) {
	case FB_MSG_HEARTBEAT:
		break;
	case FB_MSG_MODEL_FETCH:
		broadcast_on_fetch(c, w, &f->msg);
		break;
	case FB_MSG_UPDATE_BEGIN:
		upload_on_begin(c, w, &f->msg);
		break;
	case FB_MSG_UPDATE_CHUNK:
		upload_on_chunk(c, w, &f->msg, buf);
		buf = NULL;
		break;
	case FB_MSG_UPDATE_END:
		upload_on_end(c, w, &f->msg);
		break;
	case FB_MSG_SECAGG:
		sa_on_message(c, w, f);
		break;
	case FB_MSG_ROUND_FAILED:
		round_on_failed(c, w, &f->msg);
		break;
	default:
		guard_drop(c, DROP_UNEXPECTED, "%s from worker %s",
		    fb_msg_type_name(f->msg.type), w->name);
		break;
	}
	fb_buf_free(buf);
}

/* The payload of an UpdateChunk, moved out of the link (NULL otherwise);
 * a frame without one gets an empty buffer. */
static fb_buf *
take_chunk(coord *c, const fb_frame *f)
{
	fb_buf *buf = NULL;

	if (f->msg.type != FB_MSG_UPDATE_CHUNK) {
		return NULL;
	}
	if (c->link != NULL && fb_link_take_payload(c->link, &buf) == FB_OK) {
		return buf;
	}
	if (fb_buf_alloc(0, &buf) != FB_OK) {
		return NULL;
	}
	return buf;
}

static void
dispatch_taken(coord *c, worker *w, const fb_frame *f)
{
	fb_buf *buf = take_chunk(c, f);

	if (f->msg.type == FB_MSG_UPDATE_CHUNK && buf == NULL) {
		round_worker_failed(c, w, "out of memory");
		return;
	}
	coord_dispatch(c, w, f, buf);
}

/* Secure mode: opens a sealed frame with its sender's session, or with a
 * newer handshake's (the worker restarted), and hands it on. */
/*
 * The session a newer handshake took over is still in use from its own
 * connection: two live processes hold one worker's key. The first keeps
 * its place; the newer is refused, sealed, with both named, and each
 * side's log says so (a worker heeds a sealed refusal and stops).
 */
static void
duplicate_identity(coord *c, worker *w)
{
	fb_msg m = {.type = FB_MSG_REJECT};
	char first[FB_NAME_MAX];

	snprintf(first, sizeof(first), "%s", w->name[0] ? w->name : "?");
	snprintf(m.u.reject.reason, sizeof(m.u.reject.reason),
	    "another process holds the key of worker '%s' (id %u) and is "
	    "connected with it: two workers share one key; give each its own "
	    "(fedbox-keygen)",
	    first, w->id);
	m.u.reject.protocol_version = FB_PROTOCOL_VERSION;
	fb_log_error("two processes use the key of worker '%s' (id %u): the "
	             "one connected first stays, the other ('%s') is refused; "
	             "give each worker its own key (fedbox-keygen)",
	    first, w->id, w->hello_name[0] ? w->hello_name : first);
	guard_drop(c, DROP_IDENTITY, "worker %u: a second process with its "
	    "key", w->id);
	(void)coord_send(c, w, &m, NULL, 0, NULL); /* to the newer one */
	if (w->used) {
		round_worker_failed(c, w, "two processes share its key");
	}
	fb_session_free(w->sess);
	w->sess = w->prev;
	w->prev = NULL;
	w->peer = w->prev_peer;
}

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
		guard_drop(c, DROP_MALFORMED, "sealed frame without a header");
		return;
	}
	if (id >= c->reg.allow_count || (c->reg.workers[id].sess == NULL &&
	                                    c->reg.workers[id].pending == NULL)) {
		guard_drop(c, DROP_UNKNOWN_PEER, "sealed frame from sender %u, "
		    "which has no session", id);
		return;
	}
	w = &c->reg.workers[id];
	if (w->prev != NULL && c->now > w->prev_until_ms) {
		fb_session_free(w->prev); /* the old process is gone */
		w->prev = NULL;
	}
	if ((w->pending != NULL || w->prev != NULL) &&
	    f->sealed_len <= sizeof(copy)) {
		memcpy(copy, f->sealed_data, f->sealed_len);
		have_copy = true;
	}
	rc = w->sess != NULL ? fb_secure_open(w->sess, f, &reject, &why)
	                     : FB_EAUTH;
	if (rc != FB_OK && have_copy && w->pending != NULL) {
		memcpy(f->sealed_data, copy, f->sealed_len);
		if (fb_secure_open(w->pending, f, &reject, &why) == FB_OK) {
			/* The worker restarted: its new session takes over. The
			 * old one is kept a while, to tell a restart from a second
			 * process with the same key. */
			if (w->used) {
				round_worker_failed(c, w, "worker restarted its "
				                          "session");
			}
			fb_session_free(w->prev);
			w->prev = w->sess;
			w->prev_peer = w->peer;
			w->prev_until_ms = c->now + c->cfg->liveness_ms;
			w->sess = w->pending;
			w->pending = NULL;
			w->peer = f->peer;
			rc = FB_OK;
		}
	}
	if (rc != FB_OK && have_copy && w->prev != NULL &&
	    fb_peer_equal(&f->peer, &w->prev_peer)) {
		memcpy(f->sealed_data, copy, f->sealed_len);
		if (fb_secure_open(w->prev, f, &reject, &why) == FB_OK) {
			duplicate_identity(c, w);
			rc = FB_OK;
		}
	}
	if (rc != FB_OK) {
		guard_drop(c, guard_reason_of_reject(reject), "sealed %s for "
		    "worker %u: %s", reject == FB_REJECT_NONE ? "frame" : "message",
		    id, why != NULL ? why : "rejected");
		return;
	}
	coord_trust(c, &f->peer);
	wirelog_frame(c, f, (int64_t)id);
	if (!fb_peer_equal(&w->peer, &f->peer)) {
		/* Authentic and fresh from another connection: reconnected. */
		fb_log_info("worker %u reconnected", id);
		w->peer = f->peer;
	}
	if (f->msg.type == FB_MSG_HELLO) {
		registry_on_hello(c, w, f);
		return;
	}
	if (!w->used) {
		guard_drop(c, DROP_UNEXPECTED, "%s before hello from worker %u",
		    fb_msg_type_name(f->msg.type), id);
		return;
	}
	dispatch_taken(c, w, f);
}

static void
handle_secure(coord *c, fb_frame *f)
{
	if (f->sealed) {
		on_sealed(c, f);
	} else if (f->msg.type == FB_MSG_HANDSHAKE) {
		registry_on_handshake(c, f);
	} else if (f->msg.type == FB_MSG_HELLO) {
		guard_drop(c, DROP_INSECURE, "plain hello from '%s'",
		    f->msg.u.hello.name);
		coord_send_reject(c, &f->peer,
		    "this coordinator only speaks encrypted, signed sessions: "
		    "give the worker security.key and security.coordinator_key");
	} else {
		guard_drop(c, DROP_INSECURE, "plain %s",
		    fb_msg_type_name(f->msg.type));
	}
}

void
coord_handle_frame(coord *c, fb_frame *f)
{
	worker *w;

	if (!f->sealed) {
		w = registry_find_peer(c, &f->peer);
		wirelog_frame(c, f, w != NULL ? (int64_t)w->id : -1);
	}
	if (c->secure) {
		handle_secure(c, f);
		return;
	}
	if (f->sealed) {
		guard_drop(c, DROP_MALFORMED, "sealed frame, but security is off");
		return;
	}
	w = registry_find_peer(c, &f->peer);
	if (f->msg.type == FB_MSG_HELLO) {
		registry_on_hello(c, w, f);
		return;
	}
	if (w == NULL) {
		guard_drop(c, DROP_UNKNOWN_PEER, "%s from a peer that has not "
		    "said hello", fb_msg_type_name(f->msg.type));
		return;
	}
	dispatch_taken(c, w, f);
}

/* One frame from the link: rate limit, then the handlers. */
static void
on_frame(coord *c, fb_err rc, fb_frame *f, const char *why)
{
	if (guard_blocked(c, &f->peer)) {
		c->g.drops[DROP_RATE_LIMITED]++;
		return;
	}
	c->g.cur_peer = &f->peer;
	if (rc == FB_OK) {
		coord_handle_frame(c, f);
	} else {
		worker *w = registry_find_peer(c, &f->peer);
		guard_drop(c, DROP_MALFORMED, "%s (from %s)", why,
		    w != NULL ? w->name : "an unknown peer");
	}
	c->g.cur_peer = NULL;
}

void
coord_turn(coord *c, int64_t now)
{
	job_kind done;

	c->now = now;
	upload_results(c);
	if ((done = jobs_take_done(c)) != JOB_NONE) {
		round_job_done(c, done, now);
	}
	registry_tick(c, now);
	upload_credit_pump(c); /* credits given back since */
	broadcast_pump(c);     /* sealed model chunks, freed buffers */
	round_step(c, now);
	progress_tick(c, now);
}

fb_err
coord_loop(coord *c)
{
	while (c->rd.phase != PHASE_DONE) {
		fb_frame f;
		const char *why = NULL;
		bool woke = false;
		fb_err rc;

		c->now = fb_now_ms();
		if (*c->stop) {
			round_stop(c, c->now);
			break;
		}
		rc = fb_link_recv(c->link, (int)round_next_timer(c, c->now),
		    c->wake_fd, &woke, &f, &why);
		c->now = fb_now_ms();
		if (rc == FB_OK || rc == FB_EPROTO) {
			on_frame(c, rc, &f, why);
		} else if (rc == FB_ETIMEDOUT) {
			uint64_t key;
			/* nothing queued: what closed connections sent is in */
			while (fb_link_closed_next(c->link, &key)) {
				registry_on_closed(c, key);
			}
		} else if (rc != FB_ECLOSED) {
			round_stop(c, c->now);
			c->rd.exit_rc = rc;
			break;
		}
		coord_turn(c, c->now);
	}
	return c->rd.exit_rc;
}
