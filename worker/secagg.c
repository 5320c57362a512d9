/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg.c -- the worker's side of secure aggregation (SecAgg+, the
 * protocol is in crypto/crypto.h): at round start a signed key advert;
 * from the neighbours' adverts, sealed shares of our two secrets; from
 * the shares relayed to us, the masks, after which the masked update may
 * go; then our signature of the included set the coordinator sends, and
 * once the neighbours' signatures of that same set are in (at least the
 * threshold, ours counted: the consistency check), our shares of the
 * neighbours' secrets (never both of one neighbour's), or a refusal.
 *
 * Before anything is made, the round's threshold must be at least this
 * worker's floor (security.secagg_min_threshold; auto: a majority of the
 * round's neighbourhood), and each identity key may sign for one
 * neighbour slot only (crypto's add_advert).
 *
 * The messages go through the outbox, so a full queue delays them without
 * reordering them; what they carry is sealed when the link takes it.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/worker_impl.h"

/* Exchanges the instance (and its round's fields) kept in `o` with w's. */
static void
sa_swap(fb_wk *w, fb_wk_sa_state *o)
{
	fb_wk_sa_state mine = {w->sa, w->sa_round, w->sa_phase, w->sa_n,
	    w->sa_t, w->sa_again, w->sa_weight, w->sa_max_samples,
	    w->sa_max_staleness, w->enc};

	w->sa = o->sa;
	w->sa_round = o->round;
	w->sa_phase = o->phase;
	w->sa_n = o->n;
	w->sa_t = o->t;
	w->sa_again = o->again;
	w->sa_weight = o->weight;
	w->sa_max_samples = o->max_samples;
	w->sa_max_staleness = o->max_staleness;
	w->enc = o->enc;
	*o = mine;
}

void
fb_wk_sa_end(fb_wk *w)
{
	fb_wk_mask_wait(w); /* a batch made ahead reads w->sa */
	fb_wk_premask_drop(w);
	fb_secagg_worker_free(w->sa);
	w->sa = NULL;
	w->sa_phase = FB_WK_SA_OFF;
	if (w->phase == FB_WK_WAITING && !w->sa_swapped) {
		w->phase = FB_WK_IDLE;
	}
}

void
fb_wk_sa_hold(fb_wk *w)
{
	fb_wk_sa_state *h = &w->sa_held[w->sa_held_next];

	if (w->sa == NULL || w->phase != FB_WK_IDLE ||
	    (w->sa_phase != FB_WK_SA_MASKING &&
	        w->sa_phase != FB_WK_SA_CONFIRMED)) {
		return; /* no masked input of it went up */
	}
	fb_wk_mask_wait(w);
	fb_wk_premask_drop(w);
	for (uint32_t i = 0; i < FB_WK_SA_HELD; i++) {
		/* one instance a round: an older one of the same round (a
		 * coordinator that restarted) is stale */
		fb_wk_sa_state *o = &w->sa_held[i];
		if (o->sa != NULL && o->round == w->sa_round) {
			fb_secagg_worker_free(o->sa);
			memset(o, 0, sizeof(*o));
		}
	}
	fb_secagg_worker_free(h->sa); /* the oldest: its cohort is long done */
	memset(h, 0, sizeof(*h));
	sa_swap(w, h); /* it is held; w has none */
	w->sa_held_next = (w->sa_held_next + 1) % FB_WK_SA_HELD;
}

void
fb_wk_sa_held_free(fb_wk *w)
{
	for (uint32_t i = 0; i < FB_WK_SA_HELD; i++) {
		fb_secagg_worker_free(w->sa_held[i].sa);
		memset(&w->sa_held[i], 0, sizeof(w->sa_held[i]));
	}
}

static fb_err
sa_send(fb_wk *w, fb_secagg_phase phase, uint32_t count, const void *data,
    size_t len)
{
	fb_msg m = {.type = FB_MSG_SECAGG};

	m.u.secagg.round = w->sa_round;
	m.u.secagg.phase = phase;
	m.u.secagg.count = count;
	m.u.secagg.ahead = w->in_ahead;
	return fb_wk_send_ctl(w, &m, data, len);
}

/* Leaves the round: secure aggregation cannot go on for us. For the
 * next round's instance set up ahead (in w->sa for the moment), only that
 * setup is left: the round it is for has not begun. */
static void
sa_abandon(fb_wk *w, const char *why)
{
	if (w->in_ahead) {
		fb_log_warn("round %u (set up ahead): %s; leaving that setup",
		    w->sa_round, why);
		w->sa_phase = FB_WK_SA_OFF; /* freed once swapped back */
		return;
	}
	fb_log_warn("round %u: %s; leaving the round", w->sa_round, why);
	fb_wk_round_fail(w, w->sa_round, why);
}

/*
 * The threshold floor: a coordinator that asks for fewer shares than a
 * majority of each neighbourhood (or than security.secagg_min_threshold)
 * could reconstruct both of one worker's secrets from two halves of its
 * neighbours, told different included sets. The degree is the actual one,
 * as the graph derives it from n and the requested degree.
 */
static fb_err
sa_floor_check(const fb_wk *w, const fb_msg *m)
{
	fb_secagg_graph *g = NULL;
	uint32_t n = m->u.round_start.sa_n, t = m->u.round_start.sa_threshold;
	uint32_t k, floor;

	if (fb_secagg_graph_alloc(n, m->u.round_start.sa_degree, t,
	        m->u.round_start.sa_graph_seed.b, w->sa_round, &g) != FB_OK) {
		fb_log_warn("round %u: unusable secure-aggregation graph; "
		            "skipping the round",
		    w->sa_round);
		return FB_EPROTO;
	}
	k = fb_secagg_graph_degree(g);
	fb_secagg_graph_free(g);
	floor = w->cfg->secagg_min_threshold > 0
	            ? (uint32_t)w->cfg->secagg_min_threshold
	            : fb_secagg_threshold_default(k);
	if (t < floor) {
		fb_log_error("round %u: the coordinator's secure-aggregation "
		             "threshold %u (of %u neighbours + this worker) is "
		             "below this worker's floor of %u "
		             "(security.secagg_min_threshold%s); skipping the "
		             "round",
		    w->sa_round, t, k, floor,
		    w->cfg->secagg_min_threshold > 0
		        ? ""
		        : ": auto, a majority of the neighbourhood");
		return FB_ERANGE;
	}
	return FB_OK;
}

/* The round's public parameters, as this worker can use them. */
static fb_err
sa_check(fb_wk *w, const fb_msg *m)
{
	uint32_t n = m->u.round_start.sa_n;
	uint64_t maxs = m->u.round_start.sa_max_samples;

	if (!w->secure) {
		fb_log_error("round %u: secure aggregation needs security "
		             "(security.enabled); skipping the round",
		    w->sa_round);
		return FB_ENOTSUP;
	}
	if (m->u.round_start.sa_graph_seed.len != 32 || n < 2 ||
	    m->u.round_start.sa_slot >= n || maxs == 0 ||
	    fb_secagg_encodings_init(&w->enc, m->u.round_start.sa_ring_bits, n,
	        m->u.round_start.sa_clip,
	        m->u.round_start.sa_a_bound) != FB_OK) {
		fb_log_warn("round %u: unusable secure-aggregation parameters; "
		            "skipping the round",
		    w->sa_round);
		return FB_EPROTO;
	}
	if (sa_floor_check(w, m) != FB_OK) {
		return FB_ERANGE;
	}
	if (fb_wk_samples(w) > maxs) {
		fb_log_error("round %u: this worker has %" PRIu64
		             " samples, more "
		             "than the coordinator's secure_aggregation."
		             "max_samples (%" PRIu64 "); skipping the round",
		    w->sa_round, fb_wk_samples(w), maxs);
		return FB_ERANGE;
	}
	return FB_OK;
}

/* Starts round `round`'s instance from its parameters (RoundStart's
 * secure-aggregation fields) in w->sa and sends our advert. */
static fb_err
sa_start_round(fb_wk *w, uint32_t round, const fb_msg *m)
{
	fb_secagg_params p;
	uint8_t adv[FB_SECAGG_ADV_LEN];
	size_t cap = w->chunk_bytes > 4 * FB_SECAGG_EXTRA ? w->chunk_bytes
	                                                  : 4 * FB_SECAGG_EXTRA;
	fb_err rc;

	w->sa_round = round;
	if ((rc = sa_check(w, m)) != FB_OK) {
		return rc;
	}
	memset(&p, 0, sizeof(p));
	fb_session_run_id(w->sess, &p.run);
	p.round = w->sa_round;
	p.n = m->u.round_start.sa_n;
	p.degree = m->u.round_start.sa_degree;
	p.threshold = m->u.round_start.sa_threshold;
	memcpy(p.graph_seed, m->u.round_start.sa_graph_seed.b, 32);
	/* a neighbour told other terms cannot open our shares, nor we its */
	fb_secagg_bind_terms(&p, &(fb_secagg_terms){
	    .ring_bits = m->u.round_start.sa_ring_bits,
	    .clip = m->u.round_start.sa_clip,
	    .max_samples = m->u.round_start.sa_max_samples,
	    .a_bound = m->u.round_start.sa_a_bound,
	    .max_staleness = m->u.round_start.sa_max_staleness});
	if ((w->sa_keys == NULL &&
	        (rc = fb_secagg_keys_alloc(&w->sa_keys)) != FB_OK) ||
	    (rc = fb_secagg_worker_alloc_keys(&p, m->u.round_start.sa_slot,
	         w->sa_keys, &w->sa)) != FB_OK ||
	    (rc = fb_secagg_worker_advertise(w->sa, w->self, adv)) != FB_OK) {
		fb_log_warn("round %u: cannot start secure aggregation: %s",
		    w->sa_round, fb_strerror(rc));
		return rc;
	}
	/* Public keys, for the record (tests/integration/secagg.sh checks
	 * that s_pk never comes back in another round, and that c_pk is the
	 * session's). */
	fb_log_debug("round %u: secure-aggregation keys of this round: c_pk "
	             "%02x%02x%02x%02x%02x%02x%02x%02x.., s_pk "
	             "%02x%02x%02x%02x%02x%02x%02x%02x..",
	    w->sa_round, adv[28], adv[29], adv[30], adv[31], adv[32], adv[33],
	    adv[34], adv[35], adv[60], adv[61], adv[62], adv[63], adv[64],
	    adv[65], adv[66], adv[67]);
	if (w->encbuf == NULL && (w->encbuf = fb_alloc(cap)) == NULL) {
		return FB_ENOMEM;
	}
	w->sa_n = p.n;
	w->sa_again = 0;
	w->sa_t = p.threshold;
	w->sa_weight =
	    (double)fb_wk_samples(w) / (double)m->u.round_start.sa_max_samples;
	w->sa_max_samples = m->u.round_start.sa_max_samples;
	w->sa_max_staleness = m->u.round_start.sa_max_staleness;
	w->sa_phase = FB_WK_SA_ADVERTISED;
	return sa_send(w, FB_SA_ADVERT, 1, adv, sizeof(adv));
}

/* Swaps held instance h with w's, and back. */
static void
held_swap(fb_wk *w, fb_wk_sa_state *h)
{
	sa_swap(w, h);
	w->sa_swapped = !w->sa_swapped;
}

/* Swaps the instance set up ahead with w's, and back. */
static void
ahead_swap(fb_wk *w)
{
	sa_swap(w, &w->ahead.st);
	w->in_ahead = !w->in_ahead;
}

void
fb_wk_sa_ahead_free(fb_wk *w)
{
	if (w->ahead.st.sa == NULL) {
		return;
	}
	fb_wk_premask_drop_sa(w, w->ahead.st.sa);
	fb_secagg_worker_free(w->ahead.st.sa);
	memset(&w->ahead, 0, sizeof(w->ahead));
}

/* Back from a message of the instance set up ahead: an abandoned setup
 * is dropped. */
static void
ahead_leave(fb_wk *w)
{
	ahead_swap(w);
	if (w->ahead.st.sa != NULL && w->ahead.st.phase == FB_WK_SA_OFF) {
		fb_wk_sa_ahead_free(w);
	}
}

/*
 * The coordinator sets a later round up now (secure_aggregation.
 * setup_ahead): the same checks and the same fresh keys as at a
 * RoundStart, and our advert for that round; its PEERS and RELAY come
 * while the current round runs, and its RoundStart takes the instance.
 */
static void
on_setup(fb_wk *w, const fb_frame *f)
{
	const fb_msg *sm = &f->msg;
	fb_msg rs = {.type = FB_MSG_ROUND_START};
	uint32_t round = sm->u.secagg.round;
	fb_err rc;

	if (!w->welcomed || round <= w->round ||
	    sm->u.secagg.count != 1 ||
	    fb_sa_setup_unpack(f->payload, f->payload_len, &rs) != FB_OK) {
		fb_log_warn("malformed or unexpected secure-aggregation setup "
		            "of round %u (this worker is at round %u): ignored",
		    round, w->round);
		return;
	}
	rs.u.round_start.round = round;
	fb_wk_mask_wait(w); /* a batch made ahead reads w->sa */
	fb_wk_sa_ahead_free(w); /* an older setup: superseded */
	w->ahead.params = rs;
	ahead_swap(w);
	rc = sa_start_round(w, round, &rs);
	if (rc != FB_OK) {
		fb_log_warn("round %u (set up ahead): cannot take part: %s",
		    round, fb_strerror(rc));
		fb_secagg_worker_free(w->sa);
		w->sa = NULL;
		w->sa_phase = FB_WK_SA_OFF;
	}
	ahead_leave(w);
}

/* Whether RoundStart `m` describes the instance set up ahead. */
static bool
ahead_matches(const fb_wk *w, const fb_msg *m)
{
	const fb_msg *a = &w->ahead.params;

	return w->ahead.st.sa != NULL && w->ahead.st.round == m->u.round_start.round &&
	       w->ahead.st.phase == FB_WK_SA_MASKING &&
	       a->u.round_start.sa_slot == m->u.round_start.sa_slot &&
	       a->u.round_start.sa_n == m->u.round_start.sa_n &&
	       a->u.round_start.sa_degree == m->u.round_start.sa_degree &&
	       a->u.round_start.sa_threshold == m->u.round_start.sa_threshold &&
	       a->u.round_start.sa_ring_bits == m->u.round_start.sa_ring_bits &&
	       a->u.round_start.sa_clip == m->u.round_start.sa_clip &&
	       a->u.round_start.sa_max_samples ==
	           m->u.round_start.sa_max_samples &&
	       a->u.round_start.sa_a_bound == m->u.round_start.sa_a_bound &&
	       a->u.round_start.sa_max_staleness ==
	           m->u.round_start.sa_max_staleness &&
	       a->u.round_start.sa_graph_seed.len ==
	           m->u.round_start.sa_graph_seed.len &&
	       memcmp(a->u.round_start.sa_graph_seed.b,
	           m->u.round_start.sa_graph_seed.b,
	           m->u.round_start.sa_graph_seed.len) == 0;
}

void
fb_wk_sa_ahead_check(fb_wk *w, const fb_msg *rs)
{
	if (w->ahead.st.sa == NULL || w->ahead.st.round > rs->u.round_start.round) {
		return;
	}
	if (rs->u.round_start.secagg && rs->u.round_start.sa_set_up &&
	    ahead_matches(w, rs)) {
		return; /* fb_wk_sa_start takes it */
	}
	fb_wk_mask_wait(w);
	fb_wk_sa_ahead_free(w);
}

void
fb_wk_sa_ahead_premask(fb_wk *w)
{
	if (w->ahead.st.sa == NULL || w->ahead.st.phase != FB_WK_SA_MASKING ||
	    (w->phase != FB_WK_IDLE && w->phase != FB_WK_DONE)) {
		return;
	}
	fb_wk_mask_wait(w);
	ahead_swap(w);
	fb_wk_premask_start(w);
	ahead_swap(w);
}

fb_err
fb_wk_sa_start(fb_wk *w, const fb_msg *m)
{
	if (!m->u.round_start.sa_set_up) {
		return sa_start_round(w, w->round, m);
	}
	/* its keys and shares went during the round before */
	w->sa_round = w->round;
	if (!ahead_matches(w, m)) {
		fb_log_error("round %u: the coordinator set its secure "
		             "aggregation up ahead, but this worker holds no "
		             "finished setup of it",
		    w->round);
		return FB_EPROTO;
	}
	fb_wk_mask_wait(w);
	fb_wk_sa_end(w); /* (the round before's, if any is left) */
	ahead_swap(w);
	w->in_ahead = false;
	memset(&w->ahead, 0, sizeof(w->ahead));
	fb_log_debug("round %u: secure aggregation set up ahead", w->round);
	fb_wk_premask_start(w); /* what the last round left, or all */
	return FB_OK;
}

/* Whether security.peers (if set) lists `pk`. */
static bool
peer_known(const fb_wk *w, const fb_pubkey *pk)
{
	bool known = w->peers == NULL;

	for (uint32_t j = 0; !known && j < w->peer_count; j++) {
		known = fb_pubkey_equal(&w->peers[j], pk);
	}
	return known;
}

/* The neighbours' adverts: take those we accept, send our shares. */
static void
on_peers(fb_wk *w, const fb_frame *f, uint32_t cnt)
{
	uint8_t *out = NULL;
	size_t out_len = 0, cap;
	fb_err rc;

	if (w->sa_phase != FB_WK_SA_ADVERTISED || cnt >= w->sa_n ||
	    f->payload_len != (size_t)cnt * FB_SECAGG_PEER_ENTRY_LEN) {
		sa_abandon(w, "malformed or unexpected key adverts");
		return;
	}
	for (uint32_t i = 0; i < cnt; i++) {
		const uint8_t *e =
		    f->payload + (size_t)i * FB_SECAGG_PEER_ENTRY_LEN;
		fb_pubkey pk;
		memcpy(pk.b, e + 4, FB_PUBKEY_LEN);
		if (!peer_known(w, &pk)) {
			char fp[FB_FINGERPRINT_SIZE];
			fb_pubkey_fingerprint(&pk, fp);
			fb_log_warn(
			    "round %u: key advert signed by %s, which is "
			    "not in security.peers: refused",
			    w->sa_round, fp);
			continue;
		}
		rc = fb_secagg_worker_add_advert(
		    w->sa, &pk, e + 4 + FB_PUBKEY_LEN, FB_SECAGG_ADV_LEN);
		if (rc != FB_OK) {
			fb_log_warn("round %u: key advert of worker slot %u "
			            "refused: %s",
			    w->sa_round, (unsigned)e[0] | (unsigned)e[1] << 8,
			    rc == FB_EAUTH
			        ? "its signature or run does not verify, or "
			          "its "
			          "identity key already signs for another slot "
			          "(one identity, one neighbour)"
			        : fb_strerror(rc));
		}
	}
	cap = (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN + 1;
	if ((out = malloc(cap)) == NULL) {
		sa_abandon(w, "out of memory");
		return;
	}
	rc = fb_secagg_worker_make_shares(w->sa, out, cap, &out_len);
	if (rc == FB_OK) {
		w->sa_phase = FB_WK_SA_SHARED;
		rc = sa_send(w, FB_SA_SHARES,
		    (uint32_t)(out_len / FB_SECAGG_SHARE_MSG_LEN), out,
		    out_len);
		if (rc != FB_OK) {
			sa_abandon(w, "the shares could not be sent");
		} else {
			fb_log_debug("round %u: shares sent for %u neighbours",
			    w->sa_round,
			    (uint32_t)(out_len / FB_SECAGG_SHARE_MSG_LEN));
		}
	} else {
		sa_abandon(
		    w, rc == FB_ERANGE
		           ? "too few neighbours for the secure-aggregation "
		             "threshold"
		           : "cannot make the secure-aggregation shares");
	}
	fb_wipe(out, cap);
	free(out);
}

/* The shares addressed to us: fix the masks; a waiting update goes. */
static void
on_relay(fb_wk *w, const fb_frame *f, uint32_t cnt)
{
	fb_err rc;

	if (w->sa_phase != FB_WK_SA_SHARED ||
	    f->payload_len != (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN) {
		sa_abandon(w, "malformed or unexpected relayed shares");
		return;
	}
	for (uint32_t i = 0; i < cnt; i++) {
		const uint8_t *msg =
		    f->payload + (size_t)i * FB_SECAGG_SHARE_MSG_LEN;
		rc = fb_secagg_worker_add_share(w->sa, msg,
		    FB_SECAGG_SHARE_MSG_LEN);
		if (rc == FB_EAUTH) {
			/* (bytes 24..28: the sender's index, little-endian) */
			fb_log_warn("round %u: the shares of the neighbour in "
			            "slot %u do not open (%s): it was told "
			            "other round terms than this worker "
			            "(max_samples, clip, ...), or its shares "
			            "were altered; it counts as not having "
			            "shared",
			    w->sa_round,
			    (uint32_t)msg[24] | (uint32_t)msg[25] << 8 |
			        (uint32_t)msg[26] << 16 |
			        (uint32_t)msg[27] << 24,
			    fb_strerror(rc));
		} else if (rc != FB_OK) {
			fb_log_warn("round %u: a relayed share was refused: %s",
			    w->sa_round, fb_strerror(rc));
		}
	}
	fb_wipe(f->payload, f->payload_len);
	if ((rc = fb_secagg_worker_mask_begin(w->sa)) != FB_OK) {
		sa_abandon(w, rc == FB_ERANGE
		                  ? "too few neighbours shared for the "
		                    "secure-aggregation "
		                    "threshold"
		                  : "cannot fix the secure-aggregation masks");
		return;
	}
	w->sa_phase = FB_WK_SA_MASKING;
	fb_log_clear_error();
	if (w->in_ahead) {
		/* the next round's: its mask is made once this round's
		 * update is up (fb_wk_sa_ahead_premask) */
		if (w->phase == FB_WK_IDLE || w->phase == FB_WK_DONE) {
			fb_wk_premask_start(w);
		}
		return;
	}
	if (w->phase != FB_WK_WAITING) {
		/* still fetching or training: the mask is made meanwhile */
		fb_wk_premask_start(w);
		return;
	}
	if (fb_wk_upload_start(w, w->stats.seconds, w->stats.loss_mean,
	        w->stats.steps) != FB_OK) {
		fb_log_warn("round %u: update not delivered", w->sa_round);
		fb_wk_round_fail(w, w->sa_round, fb_log_last_error());
	}
}

/* Tells the coordinator we will not reveal, and leaves secure
 * aggregation for this round (our secrets stay ours). */
static void
sa_refuse(fb_wk *w, const char *why)
{
	fb_log_warn("round %u: %s: not revealing our shares", w->sa_round, why);
	if (sa_send(w, FB_SA_REFUSE, 0, NULL, 0) != FB_OK) {
		fb_log_debug(
		    "round %u: the refusal could not be sent", w->sa_round);
	}
	fb_wk_sa_end(w);
}

/* The included set: sign it (once; the same set again gets the same
 * signature). */
static void
on_included(fb_wk *w, const fb_frame *f, uint32_t cnt)
{
	uint8_t out[FB_SECAGG_CONFIRM_LEN];
	fb_err rc;

	if ((w->sa_phase != FB_WK_SA_MASKING &&
	        w->sa_phase != FB_WK_SA_CONFIRMED) ||
	    cnt != w->sa_n || f->payload_len != w->sa_n) {
		fb_log_warn(
		    "round %u: malformed or unexpected included set", w->sa_round);
		return;
	}
	rc = fb_secagg_worker_confirm(w->sa, w->self, f->payload, w->sa_n, out);
	if (rc != FB_OK) {
		sa_refuse(
		    w, rc == FB_EPROTO
		           ? "the included set leaves us out, holds fewer "
		             "than the threshold, or differs from the one "
		             "we signed"
		           : "cannot sign the included set");
		return;
	}
	w->sa_phase = FB_WK_SA_CONFIRMED;
	if (sa_send(w, FB_SA_CONFIRM, 1, out, sizeof(out)) != FB_OK) {
		fb_log_warn(
		    "round %u: the confirmation could not be sent", w->sa_round);
	}
}

/* The neighbours' confirmations: with enough of them for our set, reveal
 * our shares for unmasking; else refuse. */
static void
on_confirms(fb_wk *w, const fb_frame *f, uint32_t cnt)
{
	uint8_t *out = NULL;
	size_t out_len = 0, cap;
	uint32_t other = 0, bad = 0;
	fb_err rc;

	if (w->sa_phase != FB_WK_SA_CONFIRMED || cnt >= w->sa_n ||
	    f->payload_len != (size_t)cnt * FB_SECAGG_CONFIRM_LEN) {
		fb_log_warn("round %u: malformed or unexpected confirmations",
		    w->sa_round);
		return;
	}
	for (uint32_t i = 0; i < cnt; i++) {
		rc = fb_secagg_worker_add_confirm(w->sa,
		    f->payload + (size_t)i * FB_SECAGG_CONFIRM_LEN,
		    FB_SECAGG_CONFIRM_LEN);
		other += rc == FB_EAUTH;
		bad += rc != FB_OK && rc != FB_EAUTH;
	}
	if (other > 0 || bad > 0) {
		fb_log_warn(
		    "round %u: %u confirmations of the included set do not "
		    "verify against the set we signed (another set, or "
		    "another key), %u are malformed or not from an "
		    "included neighbour",
		    w->sa_round, other, bad);
	}
	cap = FB_SECAGG_REVEAL_HEADER_LEN +
	      (size_t)w->sa_n * FB_SECAGG_REVEAL_ENTRY_LEN;
	if ((out = malloc(cap)) == NULL) {
		fb_log_warn("round %u: out of memory for the unmasking shares",
		    w->sa_round);
		return;
	}
	rc = fb_secagg_worker_reveal(w->sa, out, cap, &out_len);
	if (rc == FB_OK) {
		if (sa_send(w, FB_SA_REVEAL, 1, out, out_len) == FB_OK) {
			fb_log_debug(
			    "round %u: unmasking shares sent", w->sa_round);
		}
	} else if (rc == FB_ERANGE) {
		char why[160];
		snprintf(why, sizeof(why),
		    "only %u of the %u confirmations of the included set the "
		    "threshold needs (ours counted)",
		    fb_secagg_worker_confirmations(w->sa), w->sa_t);
		sa_refuse(w, why);
	} else {
		fb_log_warn("round %u: unmasking request refused: %s", w->sa_round,
		    fb_strerror(rc));
	}
	fb_wipe(out, cap);
	free(out);
}

/*
 * The coordinator's sum started again (its secure_aggregation.max_uploads
 * 0: another worker's upload was cut off midway inside it): our masked
 * input goes up again in a new stream. The same bytes: the encoding is
 * seeded from the round and the masks are fixed, so a coordinator that
 * asks gets nothing it did not have. At most once for each other slot of
 * the round: each restart takes a worker out, so an honest coordinator
 * needs no more.
 */
static void
on_again(fb_wk *w)
{
	if (w->sa_phase != FB_WK_SA_MASKING ||
	    (w->phase != FB_WK_UPLOADING && w->phase != FB_WK_IDLE)) {
		fb_log_warn("round %u: asked for the masked input again while "
		            "%s: ignored",
		    w->sa_round, fb_wk_phase_name(w->phase));
		return;
	}
	if (w->sa_again + 1 >= w->sa_n) {
		fb_log_warn("round %u: asked for the masked input again more "
		            "than %u time%s: ignored",
		    w->sa_round, w->sa_n - 1, w->sa_n == 2 ? "" : "s");
		return;
	}
	w->sa_again++;
	fb_log_warn("round %u: the coordinator lost a cut-off upload inside "
	            "its sum; sending our masked input again",
	    w->sa_round);
	fb_log_clear_error();
	if (fb_wk_upload_start(w, w->stats.seconds, w->stats.loss_mean,
	        w->stats.steps) != FB_OK) {
		fb_log_warn("round %u: update not delivered", w->sa_round);
		fb_wk_round_fail(w, w->sa_round, fb_log_last_error());
	}
}

void
fb_wk_on_secagg(fb_wk *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	uint32_t cnt = m->u.secagg.count;

	if (m->u.secagg.phase == FB_SA_SETUP && m->u.secagg.ahead) {
		on_setup(w, f);
		return;
	}
	if (m->u.secagg.ahead) {
		/* of the round set up ahead: never of another instance */
		if (w->ahead.st.sa == NULL || m->u.secagg.round != w->ahead.st.round ||
		    (m->u.secagg.phase != FB_SA_PEERS &&
		        m->u.secagg.phase != FB_SA_RELAY)) {
			fb_log_debug("dropped a secure-aggregation step %u of "
			             "round %u set up ahead: no such setup here",
			    m->u.secagg.phase, m->u.secagg.round);
			return;
		}
		fb_wk_mask_wait(w); /* a batch made ahead reads w->sa */
		ahead_swap(w);
		if (m->u.secagg.phase == FB_SA_PEERS) {
			on_peers(w, f, cnt);
		} else {
			on_relay(w, f, cnt);
		}
		ahead_leave(w);
		return;
	}
	if (w->sa == NULL || m->u.secagg.round != w->sa_round) {
		/* secure async: the unmasking of an earlier task's cohort */
		for (uint32_t i = 0; i < FB_WK_SA_HELD; i++) {
			fb_wk_sa_state *h = &w->sa_held[i];
			if (h->sa == NULL || h->round != m->u.secagg.round ||
			    (m->u.secagg.phase != FB_SA_INCLUDED &&
			        m->u.secagg.phase != FB_SA_CONFIRMS)) {
				continue;
			}
			fb_wk_mask_wait(w); /* a batch made ahead reads w->sa */
			held_swap(w, h);
			if (m->u.secagg.phase == FB_SA_INCLUDED) {
				on_included(w, f, cnt);
				held_swap(w, h);
				return;
			}
			on_confirms(w, f, cnt);
			held_swap(w, h);
			/* revealed (or refused): its secrets are done with */
			fb_secagg_worker_free(h->sa);
			memset(h, 0, sizeof(*h));
			return;
		}
		fb_log_debug("dropped a secure-aggregation message of round %u",
		    m->u.secagg.round);
		return;
	}
	switch (m->u.secagg.phase) {
	case FB_SA_PEERS:
		on_peers(w, f, cnt);
		return;
	case FB_SA_RELAY:
		on_relay(w, f, cnt);
		return;
	case FB_SA_INCLUDED:
		on_included(w, f, cnt);
		return;
	case FB_SA_CONFIRMS:
		on_confirms(w, f, cnt);
		return;
	case FB_SA_AGAIN:
		on_again(w);
		return;
	default:
		fb_log_warn("unexpected secure-aggregation step %u from the "
		            "coordinator",
		    m->u.secagg.phase);
		return;
	}
}

/* The masks on the trainer's device (the CUDA backend's mask_apply). */
static fb_err
trainer_masks(void *ctx, uint32_t *v, uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms, uint32_t round)
{
	return fb_trainer_mask_apply(ctx, v, offset, count, terms, nterms,
	    round);
}

/*
 * The stochastic rounding is seeded from the round, not secret: the masks
 * are what hides the input. They are made on the trainer's GPU when its
 * backend offers it (the same words as fb_mask_apply's), else on the host.
 */
fb_err
fb_wk_sa_encode_chunk(fb_wk *w, const float *x, uint64_t off, uint64_t count,
    double loss, uint64_t *clipped, FILE *enc_dump, FILE *mask_dump,
    uint32_t *out)
{
	uint64_t seed = w->seed ^ ((uint64_t)w->sa_round * 0x9e3779b97f4a7c15ULL) ^
	                (((uint64_t)w->cfg->index + 1) * 0xc2b2ae3d27d4eb4fULL);
	fb_secagg_eval ev;
	const uint32_t *mask;
	fb_err rc;

	fb_wk_sa_eval(w, &ev);
	rc = off < w->param_count
	         ? fb_encode_chunk(&w->enc.x, x + off, count, w->sa_weight, off,
	               seed, out, clipped)
	         : fb_secagg_encode_extras(&w->enc, w->sa_weight, loss,
	               w->a_norm, &ev, off, seed, out);
	if (rc != FB_OK) {
		return rc;
	}
	/* (the dumps are in element order: chunks go up rotated) */
	if (enc_dump != NULL &&
	    fseeko(enc_dump, (off_t)(off * 4), SEEK_SET) == 0) {
		fwrite(out, 4, count, enc_dump);
	}
	if ((mask = fb_wk_premask_get(w, off, count)) != NULL) {
		/* made ahead: the same words as masking here (mod 2^32) */
		for (uint64_t i = 0; i < count; i++) {
			out[i] += mask[i];
		}
		rc = FB_OK;
	} else {
		rc = w->trainer != NULL && fb_trainer_has_mask(w->trainer)
	         ? fb_secagg_worker_mask_chunk_on(w->sa, out, off, count,
	               trainer_masks, w->trainer)
	         : fb_secagg_worker_mask_chunk(w->sa, out, off, count);
	}
	if (rc == FB_OK && mask_dump != NULL &&
	    fseeko(mask_dump, (off_t)(off * 4), SEEK_SET) == 0) {
		fwrite(out, 4, count, mask_dump);
	}
	return rc;
}
