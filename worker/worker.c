/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.c -- the worker's event loop and the core of its state machine.
 *
 * One loop on the main thread waits on the link (a message in, room to
 * send) and on the trainer thread's eventfd, and hands each event to the
 * state machine (worker_impl.h), then runs its timers. Nothing on it waits
 * for the network: sends never block, the update goes up chunk by chunk as
 * the link takes it, and the coordinator is read and answered all along.
 * So a box that trains or uploads for an hour still looks alive, and a
 * round cancelled by the coordinator stops within one SGD step.
 *
 * Here too: dispatch of frames (what a secure session accepts, in clear
 * and sealed), the tick (join retries, heartbeats, liveness), and the
 * outbox of control messages that found the coordinator's queue full.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pool.h"
#include "common/util.h"
#include "worker/worker_impl.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fedbox sends float32 tensors in host order: little-endian only"
#endif

#define LOOP_WAIT_MS 100 /* the tick's period when nothing happens */
#define RECV_PER_WAKE 64 /* messages taken per wake before the rest */

static const char *const phase_names[] = {
    [FB_WK_JOINING] = "joining",
    [FB_WK_IDLE] = "idle",
    [FB_WK_FETCHING] = "fetching the model",
    [FB_WK_TRAINING] = "training",
    [FB_WK_WAITING] = "waiting for the masks",
    [FB_WK_UPLOADING] = "uploading",
    [FB_WK_DONE] = "done",
};

const char *
fb_wk_phase_name(fb_wk_phase p)
{
	return (unsigned)p < sizeof(phase_names) / sizeof(phase_names[0])
	           ? phase_names[p]
	           : "?";
}

uint64_t
fb_wk_samples(const fb_wk *w)
{
	return w->cfg->dataset != 1 ? w->shard.count
	                            : (uint64_t)w->cfg->none_samples;
}

void
fb_wk_init(fb_wk *w, const fb_worker_config *cfg, const fb_wk_io *io)
{
	memset(w, 0, sizeof(*w));
	w->cfg = cfg;
	w->io = io;
	w->efd = -1;
	atomic_init(&w->cancel, 0);
	fb_wk_new_session(w);
	/* the retries' jitter differs between workers (the session is
	 * random), so that a federation does not retry in step */
	fb_rng_init(&w->jitter, w->session, 0x7e7);
	w->join_retry_ms = FB_WK_JOIN_RETRY_MS;
}

void
fb_wk_fini(fb_wk *w)
{
	if (w->io != NULL) {
		w->io->train_stop(w->io->arg, w);
	}
	fb_wk_upload_drop(w);
	fb_free(w->up.batch); /* (kept from round to round) */
	w->up.batch = NULL;
	fb_wk_mask_stop(w);
	fb_wk_premask_free(w);
	fb_wk_outbox_clear(w);
	fb_wk_sa_end(w);
	fb_wk_sa_ahead_free(w);
	fb_wk_sa_held_free(w);
	fb_secagg_keys_free(w->sa_keys); /* after every instance */
	w->sa_keys = NULL;
	fb_trainer_close(w->trainer);
	fb_model_close(w->model);
	fb_dataset_fini(&w->shard);
	fb_dataset_fini(&w->valid);
	fb_free(w->global);
	fb_lent_free(w->local_lent); /* freed once no message holds it */
	fb_lent_free(w->send_ct[0]); /* freed once no message holds it */
	fb_lent_free(w->send_ct[1]);
	fb_free(w->encbuf);
	fb_free(w->dl_slots);
	free(w->peers);
	fb_stream_pull_free(w->mpull);
	fb_handshake_free(w->hs);
	fb_session_free(w->sess);
	fb_identity_free(w->self);
	w->trainer = NULL;
	w->model = NULL;
	w->global = NULL;
	w->local_lent = NULL;
	w->send_ct[0] = w->send_ct[1] = NULL;
	w->encbuf = NULL;
	w->dl_slots = NULL;
	w->peers = NULL;
	w->mpull = NULL;
	w->hs = NULL;
	w->sess = NULL;
	w->self = NULL;
}

void
fb_wk_start(fb_wk *w, int64_t now)
{
	w->now = now;
	w->hello_since_ms = now;
	w->note_gap_ms = FB_WK_NOTE_FIRST_MS;
	w->next_note_ms = now + w->note_gap_ms;
	fb_wk_join(w);
}

void
fb_wk_note_warn(fb_wk *w, fb_wk_note *n, const char *fmt, ...)
{
	char text[FB_TEXT_MAX + 128];
	va_list ap;

	if (n->written && w->now - n->last_ms < FB_WK_NOTE_EVERY_MS) {
		n->suppressed++;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (n->suppressed > 0) {
		fb_log_warn("%s (%llu more like it not shown)", text,
		    (unsigned long long)n->suppressed);
	} else {
		fb_log_warn("%s", text);
	}
	n->written = true;
	n->last_ms = w->now;
	n->suppressed = 0;
}

/* ---- sending ------------------------------------------------------------ */

fb_err
fb_wk_send_now(
    fb_wk *w, const fb_msg *m, const void *payload, size_t len, fb_lent *origin)
{
	bool seal = w->secure && m->type != FB_MSG_HANDSHAKE;
	fb_err rc;

	if (seal && w->sess == NULL) {
		fb_log_warn("cannot send %s: no session yet",
		    fb_msg_type_name(m->type));
		return FB_EINVAL;
	}
	rc = w->io->send(w->io->arg, w, m, payload, len, origin, seal);
	if (rc == FB_OK) {
		w->last_tx_ms = w->now;
		w->full = false;
	} else if (rc == FB_EAGAIN) {
		if (!w->full) {
			w->full = true;
			w->full_since_ms = w->now;
		}
	} else {
		fb_log_warn("cannot send %s to the coordinator: %s",
		    fb_msg_type_name(m->type), fb_strerror(rc));
	}
	return rc;
}

uint32_t
fb_wk_msg_round(const fb_wk *w, const fb_msg *m)
{
	switch (m->type) {
	case FB_MSG_MODEL_FETCH:
		return m->u.model_fetch.round;
	case FB_MSG_UPDATE_BEGIN:
		return m->u.update_begin.round;
	case FB_MSG_UPDATE_CHUNK:
		return m->u.update_chunk.round;
	case FB_MSG_UPDATE_END:
		return m->u.update_end.round;
	case FB_MSG_SECAGG:
		return m->u.secagg.round;
	case FB_MSG_ROUND_FAILED:
		return m->u.round_failed.round;
	default:
		return w->round;
	}
}

static void
out_free(fb_wk_out *e)
{
	if (e->payload != NULL) {
		fb_wipe(e->payload, e->len);
		free(e->payload);
	}
	memset(e, 0, sizeof(*e));
}

void
fb_wk_outbox_clear(fb_wk *w)
{
	for (uint32_t i = 0; i < FB_WK_OUTBOX_MAX; i++) {
		out_free(&w->outbox[i]);
	}
	w->out_head = 0;
	w->out_count = 0;
}

fb_err
fb_wk_send_ctl(fb_wk *w, const fb_msg *m, const void *payload, size_t len)
{
	fb_wk_out *e;
	fb_err rc;

	if (w->out_count == 0) {
		rc = fb_wk_send_now(w, m, payload, len, NULL);
		if (rc != FB_EAGAIN) {
			return rc;
		}
	}
	if (w->out_count == FB_WK_OUTBOX_MAX) {
		fb_log_warn("%s dropped: %u messages already wait for room "
		            "on the link",
		    fb_msg_type_name(m->type), w->out_count);
		return FB_EAGAIN;
	}
	e = &w->outbox[(w->out_head + w->out_count) % FB_WK_OUTBOX_MAX];
	e->msg = *m;
	if (payload != NULL && len > 0) {
		if ((e->payload = malloc(len)) == NULL) {
			memset(e, 0, sizeof(*e));
			return FB_ENOMEM;
		}
		memcpy(e->payload, payload, len);
		e->len = len;
	}
	w->out_count++;
	return FB_OK;
}

/* Sends what waits in the outbox, in order, while the link takes it. */
static void
outbox_flush(fb_wk *w)
{
	while (w->out_count > 0) {
		fb_wk_out *e = &w->outbox[w->out_head];
		if (fb_wk_send_now(w, &e->msg, e->payload, e->len, NULL) ==
		    FB_EAGAIN) {
			return;
		}
		out_free(e); /* sent, or failed (logged): either way done */
		w->out_head = (w->out_head + 1) % FB_WK_OUTBOX_MAX;
		w->out_count--;
	}
}

bool
fb_wk_wants_out(const fb_wk *w)
{
	return w->out_count > 0 || fb_wk_fetch_pending(w) ||
	       fb_wk_upload_wants(w) || w->join_due;
}

void
fb_wk_on_writable(fb_wk *w, int64_t now)
{
	w->now = now;
	if (w->join_due) {
		fb_wk_join_resend(w);
	}
	outbox_flush(w);
	if (w->out_count > 0) {
		return;
	}
	if (fb_wk_fetch_more(w) != FB_OK) {
		fb_log_warn("round %u: cannot request the model; leaving the "
		            "round",
		    w->round);
		fb_wk_round_leave(w);
	}
	fb_wk_upload_pump(w, FB_WK_CHUNKS_PER_PUMP);
}

/* ---- receiving ---------------------------------------------------------- */

/*
 * A plain frame in secure mode. Before this worker's coordinator has ever
 * authenticated itself with a sealed Welcome, a refusal in clear is taken
 * (that is how a coordinator answers an unknown key or an identity that
 * is not this name's). Afterwards only the answers to our own handshake
 * are: its reply, or a Redirect to a lane in its place. Anything else in
 * clear could come from anyone on the path; it is ignored and noted.
 */
static bool
accept_plain(fb_wk *w, const fb_frame *f)
{
	bool shaking = (w->hs != NULL || w->cookie_wait) && w->sess == NULL;

	switch (f->msg.type) {
	case FB_MSG_HANDSHAKE:
	case FB_MSG_REDIRECT:
		if (shaking && (f->msg.type == FB_MSG_HANDSHAKE ||
		                   (!w->welcomed && w->lane == 0))) {
			return true;
		}
		/* a late answer to a handshake we already finished or
		 * retried: harmless, and a coordinator can send it */
		fb_log_debug("dropped a plain %s: no handshake waits for it",
		    fb_msg_type_name(f->msg.type));
		return false;
	case FB_MSG_REJECT:
		if (!w->admitted) {
			return true;
		}
		fb_wk_note_warn(w, &w->note_plain,
		    "ignored a refusal in clear ('%s'): it is not "
		    "authenticated, and this coordinator has authenticated "
		    "itself, so only its sealed messages count",
		    f->msg.u.reject.reason);
		return false;
	default:
		break;
	}
	fb_wk_note_warn(w, &w->note_plain,
	    "dropped a plain %s: this worker only accepts sealed messages now",
	    fb_msg_type_name(f->msg.type));
	return false;
}

/* Opens sealed frames with the session; returns false to drop. */
static bool
accept_frame(fb_wk *w, fb_frame *f)
{
	int reject = 0;
	const char *why = NULL;

	if (!w->secure) {
		if (f->sealed) {
			fb_wk_note_warn(w, &w->note_sealed,
			    "dropped a sealed message: security is off here "
			    "but on at the coordinator?");
			return false;
		}
		return true;
	}
	if (!f->sealed) {
		return accept_plain(w, f);
	}
	if (w->sess == NULL) {
		fb_log_debug("dropped a sealed message: no session yet");
		return false;
	}
	if (fb_secure_open(w->sess, f, &reject, &why) != FB_OK) {
		fb_wk_note_warn(w, &w->note_sealed,
		    "dropped a sealed message: %s",
		    why != NULL ? why : "rejected");
		return false;
	}
	return true;
}

static fb_err
dispatch(fb_wk *w, fb_frame *f)
{
	const fb_msg *m = &f->msg;

	w->last_rx_ms = w->now; /* any message taken: the coordinator lives */
	switch (m->type) {
	case FB_MSG_WELCOME:
		return fb_wk_on_welcome(w, f);
	case FB_MSG_REJECT:
		fb_log_error("the coordinator refused this worker: %s",
		    m->u.reject.reason);
		return FB_EAUTH;
	case FB_MSG_ROUND_START:
		if (w->welcomed) {
			fb_wk_on_round_start(w, m);
		}
		return FB_OK;
	case FB_MSG_MODEL_CHUNK:
		fb_wk_on_model_chunk(w, f);
		return FB_OK;
	case FB_MSG_HEARTBEAT:
		return FB_OK;
	case FB_MSG_UPDATE_CREDIT:
		fb_wk_on_credit(w, m);
		return FB_OK;
	case FB_MSG_HANDSHAKE:
		fb_wk_on_handshake_reply(w, m);
		return FB_OK;
	case FB_MSG_REDIRECT:
		fb_wk_on_redirect(w, m); /* closes the link f came on */
		return FB_OK;
	case FB_MSG_ROUND_CANCEL:
		fb_wk_on_round_cancel(w, m);
		return FB_OK;
	case FB_MSG_SECAGG:
		fb_wk_on_secagg(w, f);
		return FB_OK;
	case FB_MSG_SHUTDOWN:
		fb_log_info(
		    "coordinator ended the run: %s", m->u.shutdown.reason);
		fb_wk_round_leave(w);
		w->phase = FB_WK_DONE;
		return FB_ECLOSED;
	default:
		fb_log_warn("unexpected %s from the coordinator",
		    fb_msg_type_name(m->type));
		return FB_OK;
	}
}

fb_err
fb_wk_on_frame(fb_wk *w, fb_frame *f, int64_t now)
{
	w->now = now;
	if (w->phase == FB_WK_DONE || !accept_frame(w, f)) {
		return FB_OK;
	}
	return dispatch(w, f);
}

void
fb_wk_on_bad_frame(fb_wk *w, const char *why, int64_t now)
{
	w->now = now;
	fb_wk_note_warn(w, &w->note_sealed, "dropped a malformed message: %s",
	    why != NULL ? why : "?");
}

/* ---- timers ------------------------------------------------------------- */

/* While joining: "still trying" at a slowing rate, so that an outage of
 * hours writes tens of lines, not thousands. */
static void
note_joining(fb_wk *w)
{
	int64_t now = w->now;

	if (now < w->next_note_ms) {
		return;
	}
	fb_log_warn("no answer from the coordinator at %s for %.0fs (%s); "
	            "still trying%s",
	    w->cfg->coordinator, (double)(now - w->hello_since_ms) / 1000.0,
	    w->link_up ? "connected, no reply" : "no connection",
	    w->cfg->connect_timeout_ms < 0
	        ? " (transport.connect_timeout: forever)"
	        : "");
	w->note_gap_ms = w->note_gap_ms * 2 > FB_WK_NOTE_MAX_MS
	    ? FB_WK_NOTE_MAX_MS
	    : w->note_gap_ms * 2;
	w->next_note_ms = now + w->note_gap_ms;
}

/* Before the welcome: retries, a lane that does not answer, giving up. */
static fb_err
tick_joining(fb_wk *w)
{
	int64_t now = w->now;

	if (w->cfg->connect_timeout_ms >= 0 &&
	    now - w->hello_since_ms > w->cfg->connect_timeout_ms) {
		fb_log_error("no answer from the coordinator at %s for %.0fs "
		             "(transport.connect_timeout)",
		    w->cfg->coordinator,
		    (double)w->cfg->connect_timeout_ms / 1000.0);
		return FB_ETIMEDOUT;
	}
	note_joining(w);
	if (w->lane != 0 && w->lane != FB_WK_LANE_STAY &&
	    now - w->lane_since_ms > FB_WK_LANE_GIVEUP_MS) {
		fb_log_warn("no answer on the coordinator's lane %u for %.0fs "
		            "(is its port open?): back to %s, staying there",
		    w->lane, (double)(now - w->lane_since_ms) / 1000.0,
		    w->cfg->coordinator);
		fb_wk_move_link(w, w->cfg->coordinator, FB_WK_LANE_STAY);
		return FB_OK;
	}
	if (now >= w->next_join_ms) {
		fb_wk_join_backoff(w);
		fb_wk_join_resend(w);
	}
	return FB_OK;
}

/* What the link's connection moved since the last look: the times bytes
 * last came in and were last acknowledged. */
static void
traffic_look(fb_wk *w)
{
	fb_traffic t;

	if (w->io->traffic == NULL ||
	    w->io->traffic(w->io->arg, w, &t) != FB_OK) {
		return;
	}
	if (t.in != w->seen.in) {
		w->rx_moved_ms = w->now;
	}
	if (t.acked != w->seen.acked) {
		w->tx_moved_ms = w->now;
	}
	w->seen = t;
}

void
fb_wk_on_link(fb_wk *w, bool up, uint32_t gen, int64_t now)
{
	bool was_up = w->link_up;
	uint32_t was_gen = w->link_gen;

	w->now = now;
	w->link_up = up;
	if (up) {
		w->link_gen = gen;
	}
	if (up != was_up || gen != was_gen) {
		memset(&w->seen, 0, sizeof(w->seen)); /* its own counts */
	}
	if (w->phase == FB_WK_DONE) {
		return;
	}
	/* a first connection seen only after the welcome is the one we
	 * joined on (the link queues on nothing else): nothing to do */
	if (w->welcomed && (!up || (gen != was_gen && was_gen != 0))) {
		fb_wk_rejoin(w, up ? "the connection to the coordinator was "
		                     "replaced"
		                   : "the connection to the coordinator closed",
		    false);
		return;
	}
	if (!w->welcomed && up && (!was_up || gen != was_gen)) {
		/* a connection at last: join on it now, and retry soon; but a
		 * join the link took before its first connection was seen is
		 * on that connection already (the link queues only on one that
		 * is up): a second handshake would void the first's reply */
		fb_log_debug("connected to the coordinator");
		w->join_retry_ms = FB_WK_JOIN_RETRY_MS;
		fb_wk_join_backoff(w);
		if (!(was_gen == 0 && w->join_queued)) {
			fb_wk_join_resend(w);
		}
	}
	if (!up) {
		w->join_queued = false;
	}
}

fb_err
fb_wk_tick(fb_wk *w, int64_t now)
{
	char why[160];

	w->now = now;
	if (w->phase == FB_WK_DONE) {
		/* A refusal (join.c) goes out before we stop: the link drops
		 * what is still queued when it closes. */
		return w->refused_ms != 0 && now - w->refused_ms >= 500
		    ? FB_ECONFIG : FB_OK;
	}
	if (!w->welcomed) {
		return tick_joining(w);
	}
	if (now - w->last_tx_ms >= w->heartbeat_ms && w->out_count == 0) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		hb.u.heartbeat.round = w->round;
		if (fb_wk_send_now(w, &hb, NULL, 0, NULL) == FB_EAGAIN) {
			fb_log_debug("heartbeat skipped: the queue is full");
		}
	}
	traffic_look(w);
	/* Alive while whole messages, or at least their bytes, arrive: a
	 * model chunk on a slow link takes longer than the liveness timeout
	 * to complete, but its bytes come in all along. */
	if (now - w->last_rx_ms > w->liveness_ms &&
	    now - w->rx_moved_ms > w->liveness_ms) {
		snprintf(why, sizeof(why), "nothing from the coordinator for "
		    "%.1fs (not a byte)",
		    (double)(now - (w->rx_moved_ms > w->last_rx_ms
		                        ? w->rx_moved_ms
		                        : w->last_rx_ms)) / 1000.0);
		fb_wk_rejoin(w, why, true);
	} else if (w->full &&
	           now - w->full_since_ms > w->cfg->send_timeout_ms &&
	           now - w->tx_moved_ms > w->cfg->send_timeout_ms) {
		snprintf(why, sizeof(why),
		    "the coordinator's queue stayed full for %.1fs and took "
		    "no byte (transport.send_timeout)",
		    (double)(now - w->full_since_ms) / 1000.0);
		fb_wk_rejoin(w, why, true);
	}
	return FB_OK;
}

/* ---- the loop, with the real link and trainer thread -------------------- */

typedef struct wk_loop {
	fb_link *link;
	fb_link_opts opts;
} wk_loop;

static fb_err
loop_send(void *arg, fb_wk *w, const fb_msg *m, const void *payload, size_t len,
    fb_lent *origin, bool seal)
{
	wk_loop *lp = arg;

	return seal
	           ? fb_secure_send_from(lp->link, NULL, w->sess,
	                 fb_wk_msg_round(w, m), m, payload, len, origin)
	           : fb_link_send_from(lp->link, NULL, m, payload, len, origin);
}

static fb_err
loop_train_start(void *arg, fb_wk *w)
{
	return fb_wk_thread_start(w);
}

static void
loop_train_stop(void *arg, fb_wk *w)
{
	fb_wk_thread_stop(w);
}

static fb_err
loop_traffic(void *arg, fb_wk *w, fb_traffic *t)
{
	wk_loop *lp = arg;

	return fb_link_traffic(lp->link, t);
}

static fb_err
loop_relink(void *arg, fb_wk *w, const char *endpoint)
{
	wk_loop *lp = arg;
	fb_link *nl = NULL;
	fb_err rc;

	if ((rc = fb_link_connect(endpoint, &lp->opts, &nl)) != FB_OK) {
		return rc;
	}
	fb_link_close(lp->link);
	lp->link = nl;
	return FB_OK;
}

/* Takes the messages waiting (a bounded number, so the rest of the loop
 * runs between bursts). */
static fb_err
loop_receive(fb_wk *w, wk_loop *lp)
{
	for (int i = 0; i < RECV_PER_WAKE; i++) {
		fb_frame f;
		const char *why = NULL;
		fb_err rc = fb_link_recv(lp->link, 0, -1, NULL, &f, &why);

		if (rc == FB_OK) {
			rc = fb_wk_on_frame(w, &f, fb_now_ms());
			if (rc != FB_OK) {
				return rc;
			}
		} else if (rc == FB_EPROTO) {
			fb_wk_on_bad_frame(w, why, fb_now_ms());
		} else if (rc == FB_ETIMEDOUT || rc == FB_ECLOSED) {
			return FB_OK; /* nothing more now (or a signal) */
		} else {
			return rc;
		}
	}
	return FB_OK;
}

static fb_err
loop_run(fb_wk *w, wk_loop *lp, volatile sig_atomic_t *stop)
{
	fb_err rc = FB_OK;

	while (!*stop && rc == FB_OK) {
		unsigned want = FB_LINK_IN | FB_LINK_WAKE, ready = 0;

		if (fb_wk_wants_out(w)) {
			want |= FB_LINK_OUT;
		}
		rc = fb_link_wait(lp->link, LOOP_WAIT_MS, w->efd, want, &ready);
		if (rc != FB_OK) {
			break;
		}
		if (ready & FB_LINK_CONN) {
			fb_wk_on_link(w, fb_link_conn_up(lp->link),
			    fb_link_conn_gen(lp->link), fb_now_ms());
		}
		if ((ready & FB_LINK_WAKE) && fb_wk_thread_reap(w)) {
			fb_wk_on_trained(w, fb_now_ms());
		}
		if (ready & FB_LINK_IN) {
			rc = loop_receive(w, lp);
		}
		if (rc == FB_OK && (ready & FB_LINK_OUT)) {
			fb_wk_on_writable(w, fb_now_ms());
		}
		if (rc == FB_OK) {
			rc = fb_wk_tick(w, fb_now_ms());
		}
	}
	return rc == FB_ECLOSED ? FB_OK : rc;
}

fb_err
fb_worker_run(const fb_worker_config *cfg, volatile sig_atomic_t *stop)
{
	wk_loop lp = {.link = NULL};
	fb_wk_io io = {
	    .arg = &lp,
	    .send = loop_send,
	    .train_start = loop_train_start,
	    .train_stop = loop_train_stop,
	    .relink = loop_relink,
	    .traffic = loop_traffic,
	};
	fb_wk w;
	fb_err rc;

	lp.opts.max_payload = (256u << 20) + FB_STREAM_CHUNK_OVERHEAD;
	lp.opts.send_timeout_ms = 0; /* sends never wait: worker_impl.h */
	lp.opts.hwm = 16;
	fb_wk_init(&w, cfg, &io);
	if (cfg->security && (rc = fb_wk_load_keys(&w)) != FB_OK) {
		goto out;
	}
	if ((rc = fb_wk_load_shard(&w)) != FB_OK) {
		goto out;
	}
	if ((w.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		fb_log_error("eventfd: %s", strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	/* the masks of a secure update, made on every core (upload.c) */
	{
		uint32_t cpus = fb_pool_cpus(), t = cpus > 1 ? cpus - 1 : 0;
		t = t > FB_WK_BATCH_MAX - 1 ? FB_WK_BATCH_MAX - 1 : t;
		if ((rc = fb_pool_alloc(t, &w.pool)) != FB_OK) {
			goto out;
		}
	}
	if ((rc = fb_link_connect(cfg->coordinator, &lp.opts, &lp.link)) !=
	    FB_OK) {
		goto out;
	}
	fb_log_info("connecting to %s as %s%s", cfg->coordinator, cfg->name,
	    w.secure ? "" : " (security off: unencrypted, unsigned)");
	fb_wk_start(&w, fb_now_ms());
	rc = loop_run(&w, &lp, stop);
	if (*stop) {
		fb_log_info("stopping on signal");
	}
out:
	fb_wk_thread_stop(&w);
	fb_wk_mask_stop(&w); /* its last batch runs on the pool */
	fb_wk_premask_free(&w); /* and so may the mask made ahead */
	fb_link_close(lp.link);
	fb_pool_free(w.pool);
	w.pool = NULL;
	fb_wk_fini(&w);
	if (w.efd >= 0) {
		close(w.efd);
	}
	return rc;
}
