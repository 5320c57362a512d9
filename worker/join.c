/* SPDX-License-Identifier: Apache-2.0 */
/*
 * join.c -- how a worker joins a run: the signed handshake (secure mode),
 * the hello, the coordinator's welcome (and the model it names), redirects
 * to a lane's port, rejoining when the coordinator is gone, and the keys
 * this worker trusts (its own, the pinned coordinator's, security.peers).
 *
 * The welcome names the model and carries its layout; a plug-in model is
 * loaded only from the path in this worker's own train.plugin, never from
 * a path the network sent. A worker whose own model (native, or
 * train.init's file) has another layout refuses the run, naming the first
 * tensor that differs, and tells the coordinator so.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/worker_impl.h"

void
fb_wk_new_session(fb_wk *w)
{
	if (getrandom(&w->session, sizeof(w->session), 0) !=
	    (ssize_t)sizeof(w->session)) {
		w->session ^= (uint64_t)fb_now_ms() * 0x9e3779b97f4a7c15ULL;
	}
}

void
fb_wk_send_hello(fb_wk *w)
{
	fb_msg m = {.type = FB_MSG_HELLO};

	m.u.hello.protocol_version = FB_PROTOCOL_VERSION;
	snprintf(m.u.hello.name, sizeof(m.u.hello.name), "%s", w->cfg->name);
	m.u.hello.worker_index = (uint32_t)w->cfg->index;
	/* data.index names a share of a data set split data.workers ways
	 * (a simulation), or, on the box's own files taken whole, nothing */
	m.u.hello.partitions = w->cfg->dataset == 1 ||
	        (w->cfg->dataset == FB_WORKER_DATA_FILES && w->cfg->workers <= 1)
	    ? 0 : (uint32_t)w->cfg->workers;
	/* Required secure aggregation keeps the sample count private: only
	 * the masked sum of all workers' weights reaches the coordinator. */
	m.u.hello.num_samples =
	    w->cfg->secure_aggregation == 0 ? 0 : fb_wk_samples(w);
	snprintf(m.u.hello.backend, sizeof(m.u.hello.backend), "%s",
	    w->backend[0] ? w->backend : "not yet chosen");
	snprintf(m.u.hello.software, sizeof(m.u.hello.software), "fedbox %s",
	    FB_VERSION);
	m.u.hello.session = w->session;
	m.u.hello.lane = w->lane;
	w->last_hello_ms = w->now;
	w->join_due = false;
	w->join_queued = true;
	if (fb_wk_send_now(w, &m, NULL, 0, NULL) == FB_EAGAIN) {
		/* on room, while a connection is up; else at the retry */
		w->join_queued = false;
		w->join_due = w->link_up;
		fb_log_debug("hello not sent: %s (resent later)",
		    w->link_up ? "the queue is full" : "no connection");
	}
}

/*
 * Secure mode: a fresh handshake. It starts with an empty one, asking the
 * coordinator for a cookie, which the signed hello then carries (a hello
 * is only taken with a cookie of the coordinator's current process).
 */
void
fb_wk_send_handshake(fb_wk *w)
{
	fb_msg m = {.type = FB_MSG_HANDSHAKE};

	fb_handshake_free(w->hs);
	w->hs = NULL;
	m.u.handshake.data.len = 0;
	m.u.handshake.lane = w->lane;
	w->cookie_wait = true;
	w->last_hello_ms = w->now;
	w->join_due = false;
	w->join_queued = true;
	if (fb_wk_send_now(w, &m, NULL, 0, NULL) == FB_EAGAIN) {
		/* on room, while a connection is up; else at the retry */
		w->join_queued = false;
		w->join_due = w->link_up;
		fb_log_debug("handshake not sent: %s (resent later)",
		    w->link_up ? "the queue is full" : "no connection");
	}
}

/* The coordinator's cookie: our signed hello, with a new ephemeral key. */
static void
send_signed_hello(fb_wk *w, const fb_blob *cookie)
{
	fb_msg m = {.type = FB_MSG_HANDSHAKE};
	fb_err rc;

	w->cookie_wait = false;
	rc = fb_handshake_start(w->self, &w->coord_pk, FB_PROTOCOL_VERSION,
	    cookie->b, m.u.handshake.data.b, &w->hs);
	if (rc != FB_OK) {
		fb_log_warn("cannot start a handshake: %s", fb_strerror(rc));
		return;
	}
	m.u.handshake.data.len = FB_HS_HELLO_LEN;
	m.u.handshake.lane = w->lane;
	w->last_hello_ms = w->now;
	if (fb_wk_send_now(w, &m, NULL, 0, NULL) == FB_EAGAIN) {
		/* a new cookie, and this again, as soon as there is room */
		w->join_due = w->link_up;
		fb_log_debug("signed hello not sent: %s (resent later)",
		    w->link_up ? "the queue is full" : "no connection");
	}
}

void
fb_wk_join_backoff(fb_wk *w)
{
	int64_t r = w->join_retry_ms > 0 ? w->join_retry_ms
	                                 : FB_WK_JOIN_RETRY_MS;

	/* the upper half of the interval, drawn at random: workers that
	 * lost the coordinator together do not come back in step */
	w->next_join_ms = w->now + r / 2 +
	    (int64_t)fb_rng_below(&w->jitter, (uint64_t)(r / 2) + 1);
	w->join_retry_ms = r * 2 > FB_WK_JOIN_RETRY_MAX_MS
	    ? FB_WK_JOIN_RETRY_MAX_MS
	    : r * 2;
}

void
fb_wk_join_resend(fb_wk *w)
{
	if (w->secure && w->sess == NULL) {
		fb_wk_send_handshake(w);
	} else {
		fb_wk_send_hello(w);
	}
}

void
fb_wk_join(fb_wk *w)
{
	w->phase = FB_WK_JOINING;
	w->join_retry_ms = FB_WK_JOIN_RETRY_MS;
	fb_wk_join_backoff(w);
	if (w->secure) {
		fb_session_free(w->sess);
		w->sess = NULL;
	}
	fb_wk_join_resend(w);
}

void
fb_wk_on_handshake_reply(fb_wk *w, const fb_msg *m)
{
	fb_reject why = FB_REJECT_NONE;
	fb_session *s = NULL;

	if (!w->secure || w->sess != NULL) {
		return;
	}
	if (m->u.handshake.data.len == FB_HS_COOKIE_LEN) {
		if (w->cookie_wait) {
			send_signed_hello(w, &m->u.handshake.data);
		} else {
			fb_log_debug(
			    "dropped a handshake cookie: none asked for");
		}
		return;
	}
	if (w->hs == NULL) {
		return;
	}
	if (fb_handshake_finish(w->hs, m->u.handshake.data.b,
	        m->u.handshake.data.len, &s, &why) != FB_OK) {
		fb_log_warn("handshake reply refused: %s%s",
		    fb_reject_name(why),
		    why == FB_REJECT_UNPINNED_KEY
		        ? " (the coordinator's key is not the one in "
		          "security.coordinator_key)"
		        : "");
		return;
	}
	fb_handshake_free(w->hs);
	w->hs = NULL;
	w->sess = s;
	fb_log_info("secure session established (worker id %u; ciphers: %s)",
	    fb_session_worker_id(s), fb_crypto_ciphers());
	fb_wk_send_hello(w);
}

/*
 * Nothing is in flight before a welcome, and after a rejoin the old run's
 * messages are void, so dropping the old link's queue loses nothing.
 */
void
fb_wk_move_link(fb_wk *w, const char *endpoint, uint32_t lane)
{
	if (w->io->relink(w->io->arg, w, endpoint) != FB_OK) {
		fb_log_warn(
		    "cannot connect to %s: staying where we are", endpoint);
		return;
	}
	fb_wk_outbox_clear(w);
	w->full_since_ms = 0;
	w->lane = lane;
	w->lane_since_ms = w->now;
	/* a new link: no connection yet, its own count */
	w->link_up = false;
	w->link_gen = 0;
	w->join_queued = false;
	memset(&w->seen, 0, sizeof(w->seen));
	fb_wk_join(w);
}

/* A Redirect (before the welcome, on the listen port): go to that lane. */
void
fb_wk_on_redirect(fb_wk *w, const fb_msg *m)
{
	char ep[FB_TEXT_MAX + 16];

	if (w->welcomed || w->lane != 0) {
		fb_log_debug("dropped a redirect: already on lane %u%s",
		    w->lane, w->welcomed ? ", admitted" : "");
		return;
	}
	if (m->u.redirect.lane == 0 || m->u.redirect.lane == FB_WK_LANE_STAY ||
	    m->u.redirect.port == 0 || m->u.redirect.port > 65535) {
		fb_log_warn("dropped a redirect to lane %u, port %u: not a "
		            "lane's port",
		    m->u.redirect.lane, m->u.redirect.port);
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
	            "connecting to %s",
	    m->u.redirect.lane, ep);
	fb_wk_move_link(w, ep, m->u.redirect.lane);
}

void
fb_wk_rejoin(fb_wk *w, const char *why, bool new_link)
{
	fb_log_warn("%s: reconnecting", why);
	fb_wk_round_leave(w);
	fb_wk_outbox_clear(w);
	w->welcomed = false;
	w->phase = FB_WK_JOINING;
	fb_wk_new_session(w);
	w->hello_since_ms = w->now;
	w->note_gap_ms = FB_WK_NOTE_FIRST_MS;
	w->next_note_ms = w->now + w->note_gap_ms;
	w->full_since_ms = 0;
	w->full = false;
	if (w->lane != 0 || new_link) {
		/* The coordinator may have restarted with other lanes: ask its
		 * listen port again (and on a fresh connection). */
		fb_wk_move_link(w, w->cfg->coordinator, 0);
	} else {
		fb_wk_join(w);
	}
}

/*
 * The model the welcome names, as this worker will build it. A plug-in is
 * code: it comes only from train.plugin, whatever path the coordinator
 * names (its own, on its host). An "init" model is its layout alone, from
 * the welcome. Errors: FB_ECONFIG (logged).
 */
static fb_err
welcome_spec(const fb_wk *w, const fb_wire_model_spec *ws, fb_model_spec *spec)
{
	memset(spec, 0, sizeof(*spec));
	snprintf(spec->arch, sizeof(spec->arch), "%s", ws->arch);
	spec->input_dim = ws->input_dim;
	spec->classes = ws->classes;
	spec->hidden_count = ws->hidden_count;
	memcpy(spec->hidden, ws->hidden, sizeof(uint32_t) * ws->hidden_count);
	spec->synthetic_params = ws->synthetic_params;
	spec->task = ws->task;
	if (strcmp(ws->arch, "plugin") == 0 && w->cfg->plugin[0] == '\0') {
		fb_log_error(
		    "the coordinator's model is a plug-in (its "
		    "model.plugin is '%s' on its host), and this worker "
		    "loads only a library its own config names: set "
		    "train.plugin to the local path of that model's "
		    "library",
		    ws->plugin);
		return FB_ECONFIG;
	}
	snprintf(spec->plugin, sizeof(spec->plugin), "%s", w->cfg->plugin);
	return FB_OK;
}

/*
 * our_layout compares the coordinator's layout with the model this box
 * has of its own: train.init's file, else (a native model) the one built
 * from the spec. *differs says whether they differ, `why` how. A
 * malformed train.init file is FB_ECONFIG (logged).
 */
static fb_err
our_layout(const fb_wk *w, const fb_model_spec *spec, const fb_model *theirs,
    const fb_model *built, bool *differs, char *why, size_t why_len)
{
	fb_model_spec own = *spec;
	fb_model *mine = NULL;
	fb_err rc = FB_OK;

	*differs = false;
	if (built != NULL) {
		*differs = fb_model_layout_diff(theirs,
		    "the coordinator's model", built, "this worker's", why,
		    why_len);
		if (*differs) {
			goto out;
		}
	}
	if (w->cfg->init_file[0] == '\0') {
		goto out;
	}
	snprintf(own.arch, sizeof(own.arch), "init");
	if (strlen(w->cfg->init_file) >= sizeof(own.init)) {
		fb_log_error("train.init: the path is longer than %zu bytes",
		    sizeof(own.init) - 1);
		rc = FB_ECONFIG;
		goto out;
	}
	snprintf(own.init, sizeof(own.init), "%s", w->cfg->init_file);
	if ((rc = fb_model_open(&own, &mine)) != FB_OK) {
		fb_log_error("train.init: %s is not a usable initial model",
		    w->cfg->init_file);
		rc = rc == FB_ENOMEM ? rc : FB_ECONFIG;
		goto out;
	}
	*differs = fb_model_layout_diff(theirs, "the coordinator's model",
	    mine, "this worker's", why, why_len);
	if (*differs) {
		fb_log_error("train.init %s describes another model than the "
		             "coordinator's",
		    w->cfg->init_file);
	}
out:
	fb_model_close(mine);
	return rc;
}

/*
 * refuse tells the coordinator (a RoundFailed of round 0) that this worker
 * refuses the run, and stops the worker once that had time to leave.
 */
static void
refuse(fb_wk *w, const char *why)
{
	fb_msg m = {.type = FB_MSG_ROUND_FAILED};

	fb_log_error("refusing the coordinator's run: %s", why);
	m.u.round_failed.round = 0;
	snprintf(m.u.round_failed.reason, sizeof(m.u.round_failed.reason),
	    "its model's layout differs: %.200s", why);
	if (fb_wk_send_now(w, &m, NULL, 0, NULL) != FB_OK) {
		fb_log_warn("the refusal could not be sent");
	}
	w->phase = FB_WK_DONE;
	w->refused_ms = w->now > 0 ? w->now : 1;
}

/* The first welcome builds the model and its buffers; a later one (a new
 * run) must name a model of the same size. *refused is set when the
 * layouts differ (the coordinator is told; the worker stops). */
static fb_err
welcome_model(fb_wk *w, const fb_frame *f, bool *refused)
{
	const fb_msg *m = &f->msg;
	fb_model_spec spec, spec_none = {.arch = "init"};
	fb_model *theirs = NULL, *built = NULL;
	char why[FB_TEXT_MAX] = "";
	bool differs = false;
	fb_err rc = FB_OK;

	*refused = false;
	if (w->model != NULL) {
		/* A new run: its model must be the one we hold. */
		if ((rc = fb_model_open_layout(f->payload, f->payload_len,
		         &spec_none, &theirs)) != FB_OK) {
			return rc == FB_ENOMEM ? rc : FB_EPROTO;
		}
		if (fb_model_param_count(theirs) != m->u.welcome.param_count ||
		    fb_model_layout_diff(theirs, "the new run's model",
		        w->model, "the one this worker holds", why,
		        sizeof(why))) {
			fb_log_error(
			    "the coordinator's new run has a different "
			    "model (%s); restart this worker",
			    why[0] ? why : "another parameter count");
			rc = FB_EPROTO;
		}
		fb_model_close(theirs);
		return rc;
	}
	if ((rc = welcome_spec(w, &m->u.welcome.model, &spec)) != FB_OK) {
		return rc;
	}
	if ((rc = fb_model_open_layout(f->payload, f->payload_len, &spec,
	         &theirs)) != FB_OK) {
		return rc == FB_ENOMEM ? rc : FB_EPROTO;
	}
	if (fb_model_param_count(theirs) != m->u.welcome.param_count) {
		fb_log_error("the coordinator's layout holds %" PRIu64
		             " parameters, its welcome says %" PRIu64,
		    fb_model_param_count(theirs), m->u.welcome.param_count);
		rc = FB_EPROTO;
		goto out;
	}
	if (strcmp(spec.arch, "init") != 0) {
		if ((rc = fb_model_open(&spec, &built)) != FB_OK) {
			fb_log_error("cannot create the coordinator's model "
			             "(%s): %s",
			    spec.arch, fb_strerror(rc));
			goto out;
		}
	}
	rc = our_layout(w, &spec, theirs, built, &differs, why, sizeof(why));
	if (rc != FB_OK) {
		goto out;
	}
	if (differs) {
		refuse(w, why);
		*refused = true;
		goto out;
	}
	if (built != NULL) {
		w->model = built;
		built = NULL;
	} else {
		w->model = theirs;
		theirs = NULL;
	}
	if ((fb_model_input_dim(w->model) == 0) != (w->cfg->dataset == 1)) {
		/* "synthetic" reads no data, and only it may go without. */
		fb_log_error("the coordinator's model is %s, but this worker %s",
		    spec.arch,
		    w->cfg->dataset == 1
		        ? "has no data (data.dataset: none)"
		        : "loads data: a synthetic model reads none; set "
		          "data.dataset: none in this worker's config");
		rc = FB_EINVAL;
		goto out;
	}
	if (w->cfg->dataset != 1 &&
	    (rc = fb_dataset_check_fit(&w->shard, fb_model_input_dim(w->model),
	         fb_model_task(w->model), fb_model_classes(w->model))) !=
	        FB_OK) {
		fb_log_error("this box's data does not fit the coordinator's "
		             "model");
		goto out;
	}
	w->param_count = m->u.welcome.param_count;
	w->global = fb_alloc(w->param_count * 4);
	if (w->global == NULL ||
	    fb_lent_new(w->param_count * 4, &w->local_lent) != FB_OK) {
		rc = FB_ENOMEM;
		goto out;
	}
	w->local = fb_lent_data(w->local_lent);
out:
	if (rc != FB_OK && rc != FB_ENOMEM && w->model != NULL) {
		fb_model_close(w->model);
		w->model = NULL;
	}
	fb_model_close(theirs);
	fb_model_close(built);
	return rc;
}

fb_err
fb_wk_on_welcome(fb_wk *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	char desc[128];
	bool refused = false;
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
	if (w->chunk_bytes != 0 && w->chunk_bytes != m->u.welcome.chunk_bytes) {
		fb_log_error(
		    "the coordinator's new run has another chunk size; "
		    "restart this worker");
		return FB_EPROTO;
	}
	if ((rc = welcome_model(w, f, &refused)) != FB_OK || refused) {
		return rc;
	}
	fb_wk_round_leave(w); /* a new run: nothing of the old one goes on */
	fb_wk_sa_ahead_free(w);
	w->welcomed = true;
	w->admitted = w->admitted || w->secure;
	w->run_id = m->u.welcome.run_id;
	w->heartbeat_ms = m->u.welcome.heartbeat_ms;
	w->liveness_ms = m->u.welcome.liveness_ms;
	w->chunk_bytes = m->u.welcome.chunk_bytes;
	w->phase = FB_WK_IDLE;
	fb_model_describe(w->model, desc, sizeof(desc));
	fb_log_info("admitted as worker %u of run %016" PRIx64 "; model %s",
	    m->u.welcome.worker_id, w->run_id, desc);
	return FB_OK;
}

/* security.peers: an allowlist file (public key lines, # comments). */
static fb_err
load_peers(fb_wk *w, const char *path)
{
	char line[512];
	unsigned lineno = 0;
	fb_err rc = FB_OK;
	FILE *f = fopen(path, "r");

	if (f == NULL) {
		fb_log_error("security.peers: cannot read %s", path);
		return FB_ECONFIG;
	}
	while (rc == FB_OK && fgets(line, sizeof(line), f) != NULL) {
		char name[FB_COMMENT_MAX];
		fb_pubkey pk, *grown;
		size_t n = strcspn(line, "\r\n");
		lineno++;
		line[n] = '\0';
		if (line[0] == '\0' || line[0] == '#') {
			continue;
		}
		if (fb_pubkey_parse(line, &pk, name, sizeof(name)) != FB_OK) {
			fb_log_error("%s:%u: not a fedbox public key line",
			    path, lineno);
			rc = FB_ECONFIG;
			break;
		}
		grown = realloc(w->peers, (w->peer_count + 1) * sizeof(*grown));
		if (grown == NULL) {
			rc = FB_ENOMEM;
			break;
		}
		w->peers = grown;
		w->peers[w->peer_count++] = pk;
	}
	fclose(f);
	if (rc == FB_OK && w->peer_count == 0) {
		fb_log_error("security.peers: %s lists no keys", path);
		rc = FB_ECONFIG;
	}
	return rc;
}

fb_err
fb_wk_load_keys(fb_wk *w)
{
	const fb_worker_config *cfg = w->cfg;
	char comment[FB_COMMENT_MAX];
	fb_err rc;

	if (cfg->key[0] == '\0' || cfg->coordinator_key[0] == '\0') {
		fb_log_error(
		    "security.key and security.coordinator_key are "
		    "required (make a key with fedbox-keygen -o NAME), "
		    "or set security.enabled: false");
		return FB_ECONFIG;
	}
	if ((rc = fb_identity_load(cfg->key, &w->self)) != FB_OK) {
		return rc == FB_ENOMEM ? rc : FB_ECONFIG;
	}
	/* The pinned key: a public key line, or a file holding one. */
	if (strncmp(cfg->coordinator_key, "fedbox-ed25519 ", 15) == 0) {
		rc = fb_pubkey_parse(cfg->coordinator_key, &w->coord_pk,
		    comment, sizeof(comment));
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
