/* SPDX-License-Identifier: Apache-2.0 */
/*
 * registry.c -- the roster of workers.
 *
 * Admission: in secure mode a worker first completes a signed handshake
 * (its key must be on the allowlist, which fixes its slot and its name),
 * then says hello inside its session; in plain mode a hello is enough and
 * the worker gets a free slot (its old one, when a worker of that name
 * reconnects). Lanes spread new connections over the coordinator's
 * listening ports. The tick sends heartbeats to every worker and drops
 * the ones that stopped talking (transport.liveness_timeout) or stopped
 * reading (transport.send_timeout): both count the bytes the connection
 * moves, not only whole messages, so a worker on a slow link in the
 * middle of a 1 MiB chunk is not mistaken for a dead one. A connection
 * the link saw close drops its worker at once (registry_on_closed).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

const char *const worker_state_names[W_STATE_COUNT_] = {"idle",
    "training", "uploading", "done", "failed"};

worker *
registry_find_peer(coord *c, const fb_peer *p)
{
	registry *r = &c->reg;
	/* Chunks come in runs from one peer: try the last one found first. */
	worker *w = &r->workers[r->last_found < r->cap ? r->last_found : 0];

	if (w->used && fb_peer_equal(&w->peer, p)) {
		return w;
	}
	for (uint32_t i = 0; i < r->cap; i++) {
		if (r->workers[i].used && fb_peer_equal(&r->workers[i].peer, p)) {
			r->last_found = i;
			return &r->workers[i];
		}
	}
	return NULL;
}

uint32_t
registry_live_count(const coord *c)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		n += c->reg.workers[i].used;
	}
	return n;
}

wslot
registry_slot(const coord *c, const worker *w)
{
	return (wslot){(uint32_t)(w - c->reg.workers)};
}

fb_err
coord_send(coord *c, worker *w, const fb_msg *m, const void *payload,
    size_t len, fb_lent *origin)
{
	fb_err rc = c->io.send_worker(c, w, m, payload, len, origin);

	if (rc == FB_EAGAIN && w->full_since_ms == 0) {
		w->full_since_ms = c->now;
	} else if (rc == FB_OK) {
		w->full_since_ms = 0;
	}
	if (rc != FB_OK) {
		fb_log_warn("cannot send %s to %s: %s", fb_msg_type_name(m->type),
		    w->name, fb_strerror(rc));
	}
	return rc;
}

static void
send_quiet(coord *c, const fb_peer *peer, const fb_msg *m)
{
	if (c->io.send_peer(c, peer, m) != FB_OK) {
		fb_log_debug("could not send %s", fb_msg_type_name(m->type));
	}
}

/* A peer gets one REJECT per rate-limit window: the first of its bad
 * messages (guard_drop, which counts them, runs before). A flood of bad
 * frames is not answered frame by frame. */
void
coord_send_reject(coord *c, const fb_peer *peer, const char *reason)
{
	fb_msg m = {.type = FB_MSG_REJECT};

	if (guard_bad_count(c, peer) > 1) {
		return;
	}
	snprintf(m.u.reject.reason, sizeof(m.u.reject.reason), "%s", reason);
	m.u.reject.protocol_version = FB_PROTOCOL_VERSION;
	send_quiet(c, peer, &m);
}

/* The connection authenticated (a sealed message opened, or in plain mode
 * a hello was taken): the link's door lets it stay past its limits. */
void
coord_trust(coord *c, const fb_peer *peer)
{
	if (c->link != NULL) {
		fb_link_peer_trust(c->link, peer);
	}
}

void
registry_forget(coord *c, worker *w, const char *why)
{
	round_worker_failed(c, w, why);
	progress_worker_left(c, w);
	fb_log_info("worker %s removed: %s", w->name, why);
	fb_session_free(w->sess);
	fb_session_free(w->pending);
	fb_session_free(w->prev);
	memset(w, 0, sizeof(*w));
}

/* ---- the allowlist ------------------------------------------------------ */

fb_err
registry_allow_add(coord *c, const fb_pubkey *pk, const char *name)
{
	registry *r = &c->reg;
	uint32_t n = r->allow_count;
	fb_pubkey *keys;
	char(*names)[FB_NAME_MAX];

	for (uint32_t i = 0; i < n; i++) {
		if (fb_pubkey_equal(&r->allow[i], pk) ||
		    strcmp(r->allow_names[i], name) == 0) {
			return FB_EINVAL;
		}
	}
	if ((keys = realloc(r->allow, (n + 1) * sizeof(*keys))) == NULL) {
		return FB_ENOMEM;
	}
	r->allow = keys;
	if ((names = realloc(r->allow_names, (n + 1) * sizeof(*names))) ==
	    NULL) {
		return FB_ENOMEM;
	}
	r->allow_names = names;
	r->allow[n] = *pk;
	snprintf(r->allow_names[n], FB_NAME_MAX, "%s", name);
	r->allow_count = n + 1;
	return FB_OK;
}

/* Adds one allowlist line ("fedbox-ed25519 KEY NAME"). */
static fb_err
allow_line(coord *c, const char *line, const char *where)
{
	fb_pubkey pk;
	char name[FB_COMMENT_MAX];
	fb_err rc;

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
	rc = registry_allow_add(c, &pk, name);
	if (rc == FB_EINVAL) {
		fb_log_error("%s: worker '%s' or its key is listed twice", where,
		    name);
		return FB_ECONFIG;
	}
	return rc;
}

fb_err
registry_load_allowlist(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	char line[FB_PUBLINE_MAX + 64];
	unsigned lineno = 0;
	fb_err rc = FB_OK;
	FILE *f;

	for (size_t i = 0; i < cfg->workers.count; i++) {
		if ((rc = allow_line(c, cfg->workers.v[i], "security.workers")) !=
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
		while (rc == FB_OK && fgets(line, sizeof(line), f) != NULL) {
			char where[4200];
			size_t n = strcspn(line, "\r\n");
			lineno++;
			line[n] = '\0';
			if (line[0] == '\0' || line[0] == '#') {
				continue;
			}
			snprintf(where, sizeof(where), "%s:%u", cfg->allowlist,
			    lineno);
			rc = allow_line(c, line, where);
		}
		fclose(f);
		if (rc != FB_OK) {
			return rc;
		}
	}
	if (c->reg.allow_count == 0) {
		fb_log_error("no worker may join: list their public keys in "
		             "security.allowlist (a file) or security.workers");
		return FB_ECONFIG;
	}
	return FB_OK;
}

fb_err
registry_alloc(coord *c, uint32_t cap)
{
	registry *r = &c->reg;

	r->cap = cap;
	if ((r->workers = calloc(cap, sizeof(*r->workers))) == NULL ||
	    (r->hello_nonces = calloc(HELLO_CACHE, 32)) == NULL) {
		return FB_ENOMEM;
	}
	if (getrandom(r->cookie_key, sizeof(r->cookie_key), 0) !=
	    (ssize_t)sizeof(r->cookie_key)) {
		fb_log_error("no randomness for the handshake cookie key");
		return FB_EIO;
	}
	return FB_OK;
}

void
registry_fini(coord *c)
{
	registry *r = &c->reg;

	for (uint32_t i = 0; r->workers != NULL && i < r->cap; i++) {
		fb_session_free(r->workers[i].sess);
		fb_session_free(r->workers[i].pending);
		fb_session_free(r->workers[i].prev);
	}
	free(r->workers);
	free(r->allow);
	free(r->allow_names);
	free(r->hello_nonces);
	memset(r, 0, sizeof(*r));
}

/* ---- admission ------------------------------------------------------------ */

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
	registry *r = &c->reg;
	fb_msg m = {.type = FB_MSG_REDIRECT};
	uint32_t pick = 0, i;

	if (r->lanes < 2 || lane != 0) {
		return true;
	}
	for (i = 0; i < LANE_SEEN; i++) {
		if (fb_peer_equal(&r->lane_seen[i].peer, peer)) {
			pick = r->lane_seen[i].lane;
			break;
		}
	}
	if (i == LANE_SEEN) {
		pick = r->lane_next++ % r->lanes;
		r->lane_seen[r->lane_seen_next].peer = *peer;
		r->lane_seen[r->lane_seen_next].lane = pick;
		r->lane_seen_next = (r->lane_seen_next + 1) % LANE_SEEN;
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

/* Refuses a hello: sealed over the worker's session in secure mode (a
 * worker heeds no plaintext refusal once it has a session), else plain. */
static void
hello_reject(coord *c, worker *w, const fb_frame *f, const char *reason)
{
	fb_msg m = {.type = FB_MSG_REJECT};

	if (!c->secure || w == NULL || w->sess == NULL) {
		coord_send_reject(c, &f->peer, reason);
		return;
	}
	snprintf(m.u.reject.reason, sizeof(m.u.reject.reason), "%s", reason);
	m.u.reject.protocol_version = FB_PROTOCOL_VERSION;
	w->peer = f->peer;
	(void)coord_send(c, w, &m, NULL, 0, NULL);
}

/* Whether the hello can be taken at all; answers and drops it if not. */
static bool
hello_acceptable(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	char reason[FB_TEXT_MAX];

	if (m->u.hello.protocol_version != FB_PROTOCOL_VERSION) {
		snprintf(reason, sizeof(reason),
		    "protocol version %u is not supported: this coordinator "
		    "speaks version %u (upgrade the worker or coordinator)",
		    m->u.hello.protocol_version, FB_PROTOCOL_VERSION);
		guard_drop(c, DROP_VERSION, "hello from '%s': %s",
		    m->u.hello.name, reason);
		hello_reject(c, w, f, reason);
		return false;
	}
	if (m->u.hello.name[0] == '\0') {
		guard_drop(c, DROP_MALFORMED, "hello without a name");
		hello_reject(c, w, f, "hello needs a name");
		return false;
	}
	if (!c->cfg->sa_enabled &&
	    m->u.hello.num_samples > (uint64_t)c->cfg->sa_max_samples) {
		snprintf(reason, sizeof(reason),
		    "it claims %" PRIu64 " samples, more than "
		    "secure_aggregation.max_samples (%lld), the most one worker "
		    "may weigh: raise that bound if a box really holds more",
		    m->u.hello.num_samples, (long long)c->cfg->sa_max_samples);
		guard_drop(c, DROP_UNEXPECTED, "hello from '%s': %s",
		    m->u.hello.name, reason);
		hello_reject(c, w, f, reason);
		return false;
	}
	if (m->u.hello.num_samples == 0 && !c->cfg->sa_enabled) {
		guard_drop(c, DROP_UNEXPECTED, "hello from '%s' without a sample "
		    "count", m->u.hello.name);
		hello_reject(c, w, f, "this worker keeps its sample "
		    "count private (it requires secure aggregation) but this "
		    "coordinator has secure_aggregation.enabled: false");
		return false;
	}
	return true;
}

/*
 * hello_slot finds the slot a plain-mode hello goes to: its own
 * connection's (w), or a free one, replacing a stale connection of the
 * same name. NULL (answered) when the coordinator is full.
 */
static worker *
hello_slot_plain(coord *c, worker *w, const fb_frame *f)
{
	registry *r = &c->reg;
	const fb_msg *m = &f->msg;

	if (w != NULL && w->session == m->u.hello.session) {
		/* A repeated hello of the same session: welcome it again. */
		return w;
	}
	if (w != NULL) {
		/* The worker lost its session (it thought we were gone). */
		round_worker_failed(c, w, "worker restarted its session");
		return w;
	}
	for (uint32_t i = 0; i < r->cap; i++) {
		if (r->workers[i].used &&
		    strcmp(r->workers[i].name, m->u.hello.name) == 0) {
			/* The same worker on a new connection: its slot (and
			 * its place in the round, if it can still take it) */
			w = &r->workers[i];
			round_worker_failed(c, w, "worker reconnected");
			fb_log_info("worker %s reconnected", w->name);
			w->peer = f->peer;
			w->conn.fd = -1;
			return w;
		}
	}
	for (uint32_t i = 0; i < r->cap && w == NULL; i++) {
		if (!r->workers[i].used) {
			w = &r->workers[i];
		}
	}
	if (w == NULL) {
		coord_send_reject(c, &f->peer, "coordinator is full "
		                               "(transport.max_workers)");
		fb_log_warn("refused %s: already %u workers", m->u.hello.name,
		    r->cap);
		return NULL;
	}
	memset(w, 0, sizeof(*w));
	w->used = true;
	w->peer = f->peer;
	w->id = ++r->next_id;
	return w;
}

/* hello_slot_secure checks the hello's name against the identity whose
 * session opened it (slot w). */
static bool
hello_slot_secure(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	uint32_t id = registry_slot(c, w).v;
	char reason[FB_TEXT_MAX];

	if (strcmp(m->u.hello.name, c->reg.allow_names[id]) != 0) {
		snprintf(reason, sizeof(reason),
		    "this key belongs to worker '%s', not '%s'",
		    c->reg.allow_names[id], m->u.hello.name);
		guard_drop(c, DROP_IDENTITY, "hello: %s", reason);
		hello_reject(c, w, f, reason);
		return false;
	}
	if (!w->used) {
		w->used = true;
		w->id = id;
		w->state = W_IDLE;
	} else if (w->session != m->u.hello.session) {
		round_worker_failed(c, w, "worker restarted its session");
	}
	w->peer = f->peer;
	return true;
}

static void
welcome(coord *c, worker *w)
{
	const fb_coord_config *cfg = c->cfg;
	fb_msg out = {.type = FB_MSG_WELCOME};

	out.u.welcome.protocol_version = FB_PROTOCOL_VERSION;
	out.u.welcome.run_id = c->run_id;
	out.u.welcome.worker_id = w->id;
	out.u.welcome.heartbeat_ms = (uint32_t)cfg->heartbeat_ms;
	out.u.welcome.liveness_ms = (uint32_t)cfg->liveness_ms;
	out.u.welcome.chunk_bytes = c->chunk_elems * 4;
	out.u.welcome.param_count = c->param_count;
	snprintf(out.u.welcome.model.arch, sizeof(out.u.welcome.model.arch),
	    "%s", cfg->model_arch);
	out.u.welcome.model.input_dim = (uint32_t)cfg->input_dim;
	out.u.welcome.model.classes = (uint32_t)cfg->classes;
	out.u.welcome.model.task = (uint32_t)cfg->task;
	out.u.welcome.model.hidden_count = (uint32_t)cfg->hidden.count;
	for (size_t i = 0; i < cfg->hidden.count; i++) {
		out.u.welcome.model.hidden[i] = (uint32_t)cfg->hidden.v[i];
	}
	out.u.welcome.model.synthetic_params = (uint64_t)cfg->synthetic_params;
	snprintf(out.u.welcome.model.plugin,
	    sizeof(out.u.welcome.model.plugin), "%s", cfg->plugin);
	if (coord_send(c, w, &out, c->layout, c->layout_len, NULL) != FB_OK) {
		return;
	}
	coord_trust(c, &w->peer);
	round_rejoin(c, w, c->now);
	if (w->num_samples > 0) {
		fb_log_info("worker %s admitted (id %u, index %u, %" PRIu64
		            " samples, %s); %u connected",
		    w->name, w->id, w->index, w->num_samples,
		    w->backend[0] ? w->backend : "?", registry_live_count(c));
	} else {
		fb_log_info("worker %s admitted (id %u, index %u, %s); %u "
		            "connected",
		    w->name, w->id, w->index, w->backend[0] ? w->backend : "?",
		    registry_live_count(c));
	}
}

/* The other admitted worker with share `index` of the same split of a
 * data set, or NULL. Boxes on their own data (partitions 0) share none. */
static worker *
index_taken(coord *c, const worker *self, uint32_t index, uint32_t parts)
{
	if (parts == 0) {
		return NULL;
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *o = &c->reg.workers[i];
		if (o != self && o->used && o->welcomed && o->index == index &&
		    o->partitions == parts) {
			return o;
		}
	}
	return NULL;
}

/*
 * registry_on_hello admits a worker. Plain mode: `w` is the slot of its
 * connection (or NULL). Secure mode: `w` is the slot of the identity whose
 * session opened this sealed hello, so the name must be the allowlist's.
 */
void
registry_on_hello(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;

	if (c->secure && w != NULL) {
		snprintf(w->hello_name, sizeof(w->hello_name), "%s",
		    m->u.hello.name);
	}
	if (!hello_acceptable(c, c->secure ? w : NULL, f)) {
		return;
	}
	if (!c->secure && w == NULL &&
	    !lane_admit(c, &f->peer, m->u.hello.lane)) {
		return;
	}
	if (c->secure) {
		if (!hello_slot_secure(c, w, f)) {
			return;
		}
	} else if ((w = hello_slot_plain(c, w, f)) == NULL) {
		return;
	}
	{
		worker *o = index_taken(c, w, m->u.hello.worker_index,
		    m->u.hello.partitions);
		if (o != NULL) {
			char reason[FB_TEXT_MAX];
			snprintf(reason, sizeof(reason), "data.index %u of %u is "
			    "worker '%s''s already: each worker needs its own "
			    "share", m->u.hello.worker_index,
			    m->u.hello.partitions, o->name);
			fb_log_error("refused worker '%s': %s", m->u.hello.name,
			    reason);
			guard_drop(c, DROP_IDENTITY, "hello from '%s': %s",
			    m->u.hello.name, reason);
			hello_reject(c, w, f, reason);
			if (!w->welcomed) {
				bool keep_session = c->secure;
				fb_session *sess = w->sess, *pend = w->pending;
				memset(w, 0, sizeof(*w));
				if (keep_session) {
					w->sess = sess;
					w->pending = pend;
				}
			}
			return;
		}
	}
	snprintf(w->name, sizeof(w->name), "%s", m->u.hello.name);
	snprintf(w->backend, sizeof(w->backend), "%s", m->u.hello.backend);
	w->index = m->u.hello.worker_index;
	w->partitions = m->u.hello.partitions;
	w->welcomed = true;
	/* under secure aggregation only the masked sum of weights counts */
	w->num_samples = c->cfg->sa_enabled ? 0 : m->u.hello.num_samples;
	w->session = m->u.hello.session;
	w->last_seen_ms = c->now;
	w->rx_moved_ms = w->tx_moved_ms = c->now;
	w->traffic_ms = 0;
	if (c->link != NULL) {
		w->conn.fd = -1;
		fb_link_last_conn(c->link, &w->conn);
	}
	memset(&w->seen, 0, sizeof(w->seen));
	welcome(c, w);
}

/*
 * Secure mode: an empty handshake asks for a cookie (answered in clear,
 * on the connection's lane); a signed hello carrying one of our cookies
 * gets our reply.
 */
void
registry_on_handshake(coord *c, const fb_frame *f)
{
	registry *r = &c->reg;
	const fb_blob *h = &f->msg.u.handshake.data;
	fb_allowlist al = {r->allow, r->allow_count};
	fb_hs_accept_cfg cfg = {
	    .self = c->self,
	    .run = c->run,
	    .proto_version = FB_PROTOCOL_VERSION,
	    .lookup = fb_allowlist_lookup_cb,
	    .lookup_arg = &al,
	    .cookie_key = r->cookie_key,
	    .now_ms = c->now,
	    .cookie_ms = HS_COOKIE_MS,
	};
	fb_msg out = {.type = FB_MSG_HANDSHAKE};
	fb_session *sess = NULL;
	fb_reject why = FB_REJECT_NONE;
	worker *w;

	if (h->len == 0) {
		/* Anyone may ask: a cookie says only when it was made. */
		if (lane_admit(c, &f->peer, f->msg.u.handshake.lane)) {
			fb_hs_cookie_make(r->cookie_key, c->now,
			    out.u.handshake.data.b);
			out.u.handshake.data.len = FB_HS_COOKIE_LEN;
			send_quiet(c, &f->peer, &out);
		}
		return;
	}
	if (h->len == FB_HS_HELLO_LEN) {
		/* A hello seen before is a replay (its cookie at 68..100,
		 * which only one hello may carry). */
		for (uint32_t i = 0; i < HELLO_CACHE; i++) {
			if (memcmp(r->hello_nonces[i], h->b + 68, 32) == 0) {
				guard_drop(c, DROP_REPLAY, "replayed handshake hello");
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
		if (why == FB_REJECT_REPLAY) {
			/* Signed, but its cookie is not one of this process's
			 * (a hello recorded before a restart) or has expired:
			 * not answered. A worker asks for a new cookie. */
			guard_drop(c, DROP_REPLAY, "handshake hello with a "
			    "cookie this coordinator did not issue or that "
			    "expired (recorded before a restart?)");
			return;
		}
		guard_drop(c, guard_reason_of_reject(why),
		    "handshake refused: %s (key %s)", fb_reject_name(why), fp);
		/* The same answer for an unknown key and for a known key whose
		 * hello does not verify: the allowlist cannot be probed. */
		if (why == FB_REJECT_UNKNOWN_KEY ||
		    why == FB_REJECT_BAD_SIGNATURE) {
			char reason[FB_TEXT_MAX];
			snprintf(reason, sizeof(reason),
			    "key %s is not on this coordinator's allowlist, or the "
			    "hello was not signed with it", fp);
			coord_send_reject(c, &f->peer, reason);
		} else if (why == FB_REJECT_VERSION) {
			coord_send_reject(c, &f->peer,
			    "protocol version not supported");
		}
		return;
	}
	memcpy(r->hello_nonces[r->hello_next], h->b + 68, 32);
	r->hello_next = (r->hello_next + 1) % HELLO_CACHE;
	if (!lane_admit(c, &f->peer, f->msg.u.handshake.lane)) {
		/* It shakes hands again on its lane, with a fresh hello. */
		fb_session_free(sess);
		return;
	}
	w = &r->workers[fb_session_worker_id(sess)];
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

/* ---- heartbeats and liveness ---------------------------------------------- */

/*
 * What w's connection moved since the last look. Looked at only once w has
 * been quiet for a quarter of the liveness timeout, and then every quarter
 * (a system call per look): a worker that talks costs nothing here.
 */
static void
traffic_look(coord *c, worker *w, int64_t now)
{
	int64_t every = c->cfg->liveness_ms / 4;
	/* counts taken before its last message include that message: they
	 * are a new starting point, not proof of bytes since */
	bool stale = w->traffic_ms < w->last_seen_ms;
	bool first = w->traffic_ms == 0;
	fb_traffic tr;
	fb_err rc;

	if (c->io.traffic == NULL || now - w->traffic_ms < every ||
	    (now - w->last_seen_ms < every && w->full_since_ms == 0)) {
		return;
	}
	w->traffic_ms = now;
	if ((rc = c->io.traffic(c, w, &tr)) != FB_OK) {
		if (rc == FB_ECLOSED) {
			w->conn.fd = -1; /* found again by its next message */
		}
		return;
	}
	if (!stale && tr.in != w->seen.in) {
		w->rx_moved_ms = now;
	}
	if (!first && tr.acked != w->seen.acked) {
		w->tx_moved_ms = now;
	}
	w->seen = tr;
}

void
registry_tick(coord *c, int64_t now)
{
	registry *r = &c->reg;
	const fb_coord_config *cfg = c->cfg;

	if (now - r->last_heartbeat_ms >= cfg->heartbeat_ms) {
		fb_msg hb = {.type = FB_MSG_HEARTBEAT};
		hb.u.heartbeat.round = c->rd.number;
		for (uint32_t i = 0; i < r->cap; i++) {
			if (r->workers[i].used) {
				(void)coord_send(c, &r->workers[i], &hb, NULL, 0,
				    NULL);
			}
		}
		r->last_heartbeat_ms = now;
	}
	/* Liveness is in seconds: scanning every slot on every message (up
	 * to transport.max_workers) is wasted; every 10 ms. */
	if (now - r->last_scan_ms < 10) {
		return;
	}
	r->last_scan_ms = now;
	for (uint32_t i = 0; i < r->cap; i++) {
		worker *w = &r->workers[i];
		int64_t heard, acked;
		if (!w->used) {
			continue;
		}
		traffic_look(c, w, now);
		heard = w->last_seen_ms > w->rx_moved_ms ? w->last_seen_ms
		                                         : w->rx_moved_ms;
		acked = w->full_since_ms > w->tx_moved_ms ? w->full_since_ms
		                                          : w->tx_moved_ms;
		if (w->full_since_ms != 0 &&
		    now - acked > cfg->send_timeout_ms) {
			fb_log_warn("worker %s lost: its queue stayed full for "
			            "%.1fs and took no byte "
			            "(transport.send_timeout)", w->name,
			    (double)(now - w->full_since_ms) / 1000.0);
			registry_forget(c, w, "lost (not reading)");
		} else if (now - heard > cfg->liveness_ms) {
			fb_log_warn("worker %s lost: nothing from it for %.1fs "
			            "(not a byte)", w->name,
			    (double)(now - heard) / 1000.0);
			registry_forget(c, w, "lost (liveness timeout)");
		}
	}
}

void
registry_on_closed(coord *c, uint64_t key)
{
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		worker *w = &c->reg.workers[i];
		if (w->used && fb_peer_key(&w->peer) == key) {
			fb_log_warn("worker %s lost: its connection closed",
			    w->name);
			registry_forget(c, w, "lost (connection closed)");
			return;
		}
	}
}
