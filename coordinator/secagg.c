/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg.c -- the coordinator's side of secure aggregation (SecAgg+,
 * crypto.h), one instance per round.
 *
 * Alongside training: the selected workers' signed key adverts are
 * collected (up to secure_aggregation.setup_timeout) and each advertiser
 * gets its neighbours'; then their sealed share batches, each worker
 * getting the shares addressed to it. Masked inputs stream in through
 * upload.c into the accumulator's ring. After the round closes the
 * included workers are sent the included set, which each signs; each
 * confirmer gets its neighbours' signatures (the consistency check: a
 * worker reveals only once t of its neighbourhood confirmed the set it
 * was told) and answers with its shares, or a refusal. Once they
 * answered (each step up to unmask_timeout) the job thread reconstructs
 * the secrets, removes the masks on every core, and checks the decoded
 * sums against what honest inputs can produce (unmask.c).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

#ifdef FB_TEST_LIAR
/*
 * Test build only (tests/fedbox-coordinator-liar, never installed): a
 * coordinator that lies, to test the workers against it on live
 * processes. FB_TEST_LIE picks the lie, told once, in the first secure
 * round:
 *   included (or unset)  in the consistency check, it tells the first
 *       included worker that the last included one dropped (so that
 *       worker would reveal the other's mask key while the rest reveal
 *       its self-mask seed), and takes and relays that worker's
 *       confirmation of the false set as if it verified;
 *   terms  its RoundStart tells every worker but slot 0's a max_samples
 *       1000 times the round's, to weigh their inputs down and read slot
 *       0's nearly alone in the sum;
 *   staleness  (secure async; upload.c) the first upload of the run is
 *       credited as round.max_staleness + 1 steps stale, to weigh that
 *       input below the bound its cohort was told.
 */
static uint32_t liar_slot = UINT32_MAX;

bool
liar_tells(const char *lie)
{
	const char *e = getenv("FB_TEST_LIE");

	return strcmp(e != NULL && e[0] != '\0' ? e : "included", lie) == 0;
}
#endif

const char *const sa_phase_names[SA_PHASE_COUNT_] = {"off", "key adverts",
    "share distribution", "masked inputs", "confirmation", "unmasking"};

void
sa_free(sa_round *sa)
{
	fb_secagg_server_free(sa->srv);
	free(sa->slot_worker);
	free(sa->flags);
	free(sa->adv);
	free(sa->shares);
	free(sa->share_len);
	free(sa->confirm);
	free(sa->slot_id);
	free(sa->slot_session);
	memset(sa, 0, sizeof(*sa)); /* phase SA_OFF */
}

uint32_t
sa_count(const sa_round *sa, unsigned flag)
{
	uint32_t n = 0;
	for (uint32_t s = 0; s < sa->n; s++) {
		n += (sa->flags[s] & flag) != 0;
	}
	return n;
}

static worker *
sa_worker(coord *c, uint32_t slot)
{
	return &c->reg.workers[c->sa->slot_worker[slot]];
}

void
sa_assign(coord *c, uint32_t slot, uint32_t ws)
{
	c->sa->slot_worker[slot] = ws;
	c->reg.workers[ws].sa_slot = slot;
}

/* Whether slot's worker is still taking part in the round. */
static bool
sa_in_round(coord *c, uint32_t slot)
{
	const worker *w;

	if (c->sa->slot_worker[slot] == UINT32_MAX) {
		return false; /* secure async: a slot nobody took */
	}
	w = sa_worker(c, slot);
	if (c->sa->ahead) {
		/* set up ahead: still here, the same worker in the same
		 * session (a new one has none of that setup), not left */
		return w->used && w->id == c->sa->slot_id[slot] &&
		       w->session == c->sa->slot_session[slot] &&
		       !(c->sa->flags[slot] & SA_F_OUT);
	}
	/* (secure async: a member that moved on to another task is out) */
	return w->used && round_of(c, w) == c->sa->p.round &&
	    (w->state == W_TRAINING || w->state == W_UPLOADING ||
	        w->state == W_DONE);
}

/*
 * sa_a_bound is the public bound on a worker's FedNova ||a_i||_1 this
 * round: that of the most local steps the round policy can give (1 for
 * the other rules).
 */
double
sa_a_bound(const coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	double steps, a = 1.0;

	if (!fb_rule_is_fednova(cfg->rule)) {
		return 1.0;
	}
	steps = cfg->local_steps > 0
	    ? (double)cfg->local_steps
	    : ceil(cfg->local_epochs * (double)cfg->sa_max_samples /
	          (double)cfg->batch_size);
	if (cfg->local_work == FB_WORK_TIME_BUDGET &&
	    (double)cfg->max_steps > steps) {
		steps = (double)cfg->max_steps;
	}
	if (fb_fednova_a_norm((uint64_t)(steps < 1 ? 1 : steps), cfg->momentum,
	        cfg->lr, cfg->prox_mu, &a) != FB_OK) {
		return 1.0;
	}
	return a * (1 + 1e-6);
}

/* sa_params picks the round's graph seed, degree and threshold. */
static fb_err
sa_params(coord *c, uint32_t round, uint32_t n, const char **why)
{
	const fb_coord_config *cfg = c->cfg;
	sa_round *sa = c->sa;
	/* auto (-1 in the config) is 0 for the library */
	uint32_t tcfg = cfg->sa_threshold > 0 ? (uint32_t)cfg->sa_threshold : 0;
	uint32_t kcfg = cfg->sa_neighbours > 0 ? (uint32_t)cfg->sa_neighbours
	                                       : FB_SECAGG_DEGREE_AUTO;
	fb_secagg_graph *g = NULL;
	fb_err rc;

	sa->p.run = c->run;
	sa->p.round = round;
	sa->p.n = n;
	if (getrandom(sa->p.graph_seed, sizeof(sa->p.graph_seed), 0) !=
	    (ssize_t)sizeof(sa->p.graph_seed)) {
		*why = "no randomness for the neighbour graph";
		return FB_EIO;
	}
	rc = fb_secagg_graph_alloc(n, kcfg, tcfg, sa->p.graph_seed, round,
	    &g);
	if (rc != FB_OK) {
		*why = "cannot build the neighbour graph";
		return rc;
	}
	sa->k = fb_secagg_graph_degree(g);
	fb_secagg_graph_free(g);
	sa->t = tcfg != 0 ? tcfg : fb_secagg_threshold_default(sa->k);
	if (sa->t > sa->k + 1) {
		*why = "secure_aggregation.threshold exceeds a neighbourhood "
		       "(neighbours + 1) in this round: lower it, raise "
		       "secure_aggregation.neighbours, or add workers";
		return FB_ERANGE;
	}
	sa->n = n;
	sa->p.degree = sa->k;
	sa->p.threshold = sa->t;
	return FB_OK;
}

/*
 * sa_begin sets up the round's secure aggregation over the n selected
 * workers (cand[s] gets slot s): graph randomness, degree, threshold and
 * the encodings, which every worker derives the same way from RoundStart.
 * On failure *why says what is wrong and the round cannot run.
 */
fb_err
sa_begin(coord *c, uint32_t round, const uint32_t *cand, uint32_t n,
    const char **why)
{
	const fb_coord_config *cfg = c->cfg;
	sa_round *sa = c->sa;
	fb_err rc;

	sa_free(sa);
	if (n < 2) {
		*why = "secure aggregation needs at least 2 workers in a round";
		return FB_ERANGE;
	}
	if (n > FB_SECAGG_MAX_WORKERS) {
		*why = "more workers in one round than secure aggregation takes";
		return FB_ERANGE;
	}
	if ((rc = sa_params(c, round, n, why)) != FB_OK) {
		return rc;
	}
	if (fb_secagg_encodings_init(&sa->enc, (uint32_t)cfg->sa_ring_bits, n,
	        cfg->sa_clip, sa_a_bound(c)) != FB_OK) {
		*why = "no overflow-free encoding for this many workers: raise "
		       "secure_aggregation.ring_bits or lower "
		       "secure_aggregation.clip";
		return FB_ERANGE;
	}
	if ((c->sa_seen == NULL &&
	        (rc = fb_secagg_keys_alloc(&c->sa_seen)) != FB_OK) ||
	    (rc = fb_secagg_server_alloc_keys(&sa->p, c->sa_seen,
	         &sa->srv)) != FB_OK) {
		*why = "cannot start the secure-aggregation server";
		return rc;
	}
	sa->slot_worker = calloc(n, sizeof(*sa->slot_worker));
	sa->flags = calloc(n, 1);
	sa->adv = calloc(n, FB_SECAGG_ADV_LEN);
	sa->shares = calloc((size_t)n * sa->k, FB_SECAGG_SHARE_MSG_LEN);
	sa->share_len = calloc(n, sizeof(*sa->share_len));
	sa->confirm = calloc(n, FB_SECAGG_CONFIRM_LEN);
	if (sa->slot_worker == NULL || sa->flags == NULL || sa->adv == NULL ||
	    sa->shares == NULL || sa->share_len == NULL ||
	    sa->confirm == NULL) {
		sa_free(sa);
		*why = "out of memory";
		return FB_ENOMEM;
	}
	for (uint32_t s = 0; s < n; s++) {
		/* secure async: the slots are given as the tasks go out */
		sa->slot_worker[s] = cand != NULL ? cand[s] : UINT32_MAX;
		if (cand != NULL) {
			c->reg.workers[cand[s]].sa_slot = s;
		}
	}
	sa->phase = SA_ADVERTS;
	sa->phase_end_ms = c->now + cfg->sa_setup_ms;
	return FB_OK;
}

/* Fills the RoundStart fields of secure aggregation for worker w. */
void
sa_round_start(const coord *c, const worker *w, fb_msg *m)
{
	const sa_round *sa = c->sa;

	m->u.round_start.secagg = true;
	m->u.round_start.sa_slot = w->sa_slot;
	m->u.round_start.sa_n = sa->n;
	m->u.round_start.sa_degree = sa->k;
	m->u.round_start.sa_threshold = sa->t;
	memcpy(m->u.round_start.sa_graph_seed.b, sa->p.graph_seed, 32);
	m->u.round_start.sa_graph_seed.len = 32;
	m->u.round_start.sa_ring_bits = sa->enc.x.bits;
	m->u.round_start.sa_clip = sa->enc.x.clip;
	m->u.round_start.sa_max_samples = (uint64_t)c->cfg->sa_max_samples;
#ifdef FB_TEST_LIAR
	if (liar_tells("terms") && sa->p.round == 1 && w->sa_slot != 0) {
		m->u.round_start.sa_max_samples *= 1000;
		fb_log_warn("test liar: round %u: %s is told max_samples %" PRIu64,
		    sa->p.round, w->name, m->u.round_start.sa_max_samples);
	}
#endif
	m->u.round_start.sa_a_bound = sa->enc.a.clip;
	m->u.round_start.sa_max_staleness =
	    cohorts_on(c) ? (uint32_t)c->cfg->max_staleness : 0;
	m->u.round_start.sa_set_up = c->rd.set_up_ahead && sa == &c->sa_sync;
}

/* SecAgg slot `slot`'s whole masked input is in the sum (its worker may
 * have left since). A masked input cut off midway never reaches the sum
 * (upload.c keeps each apart until whole): its worker is a dropout. */
void
sa_note_included(coord *c, uint32_t slot)
{
	if (slot >= c->sa->n || (c->sa->flags[slot] & SA_F_INCLUDED)) {
		return;
	}
	if (fb_secagg_server_set_included(c->sa->srv, slot) != FB_OK) {
		c->sa->poisoned = "a masked input could not be recorded";
	}
	c->sa->flags[slot] |= SA_F_INCLUDED;
}

/* The sum starts again (upload.c, max_uploads 0): no masked input is in
 * it now. Only while the inputs stream in, before any confirmation. */
void
sa_inputs_again(coord *c)
{
	sa_round *sa = c->sa;

	if (sa->phase != SA_INPUT) {
		return;
	}
	if (fb_secagg_server_clear_included(sa->srv) != FB_OK) {
		sa->poisoned = "the included set could not be emptied";
	}
	for (uint32_t s = 0; s < sa->n; s++) {
		sa->flags[s] = (uint8_t)(sa->flags[s] & ~SA_F_INCLUDED);
	}
	pthread_mutex_lock(&c->extra_mu);
	memset(sa->extra, 0, sizeof(sa->extra));
	pthread_mutex_unlock(&c->extra_mu);
}

static fb_err sa_send(coord *c, worker *w, fb_secagg_phase phase,
    uint32_t count, const void *data, size_t len);

fb_err
sa_ask_again(coord *c, worker *w)
{
	return sa_send(c, w, FB_SA_AGAIN, 0, NULL, 0);
}

bool
sa_member_pending(coord *c, uint32_t slot)
{
	return sa_in_round(c, slot) && !(c->sa->flags[slot] & SA_F_INCLUDED);
}

/* Whether the round takes confirmations and reveals now: sync rounds in
 * their UNMASK phase; a cohort in its own (sa->phase says which). */
static bool
sa_unmasking(const coord *c)
{
	return cohorts_on(c) || c->rd.phase == PHASE_UNMASK;
}

/*
 * w cannot go on in c->sa: out of its round (round_cancel), or, for an
 * instance set up ahead, out of that setup only (its round is another:
 * it sits the next one out).
 */
static void
sa_leave(coord *c, uint32_t slot, const char *why)
{
	worker *w = sa_worker(c, slot);

	if (!c->sa->ahead) {
		round_cancel(c, w, why);
		return;
	}
	fb_log_warn("round %u (set up ahead): %s leaves its setup: %s",
	    c->sa->p.round, w->name, why);
	c->sa->flags[slot] |= SA_F_OUT;
}

/* A send to slot's worker failed: as sa_leave (it is failing anyway). */
static void
sa_send_failed(coord *c, uint32_t slot, const char *why)
{
	if (!c->sa->ahead) {
		round_worker_failed(c, sa_worker(c, slot), why);
		return;
	}
	sa_leave(c, slot, why);
}

static drop_reason
sa_drop_reason(fb_err rc)
{
	return rc == FB_EAUTH ? DROP_BAD_SIGNATURE
	    : rc == FB_ESTALE ? DROP_STALE_ROUND
	                      : DROP_MALFORMED;
}

static void
on_advert(coord *c, worker *w, const fb_frame *f)
{
	sa_round *sa = c->sa;
	uint32_t slot = w->sa_slot;
	fb_err rc;

	if (sa->phase != SA_ADVERTS || (sa->flags[slot] & SA_F_ADV)) {
		guard_drop(c, DROP_UNEXPECTED, "key advert from %s in the %s "
		    "phase", w->name, sa_phase_names[sa->phase]);
		return;
	}
	rc = fb_secagg_server_add_advert(sa->srv, slot, &c->reg.allow[w->id],
	    f->payload, f->payload_len);
	if (rc != FB_OK) {
		guard_drop(c, sa_drop_reason(rc), "key advert from %s: %s",
		    w->name, fb_strerror(rc));
		sa_leave(c, slot, "bad secure-aggregation key advert");
		return;
	}
	memcpy(sa->adv + (size_t)slot * FB_SECAGG_ADV_LEN, f->payload,
	    FB_SECAGG_ADV_LEN);
	sa->flags[slot] |= SA_F_ADV;
}

static void
on_shares(coord *c, worker *w, const fb_frame *f)
{
	sa_round *sa = c->sa;
	uint32_t slot = w->sa_slot;
	fb_err rc;

	if (sa->phase != SA_SHARES || !(sa->flags[slot] & SA_F_ADV) ||
	    (sa->flags[slot] & SA_F_SHARED)) {
		guard_drop(c, DROP_UNEXPECTED, "shares from %s in the %s phase",
		    w->name, sa_phase_names[sa->phase]);
		return;
	}
	if (f->payload_len > (size_t)sa->k * FB_SECAGG_SHARE_MSG_LEN) {
		guard_drop(c, DROP_WRONG_SIZE, "%zu bytes of shares from %s",
		    f->payload_len, w->name);
		sa_leave(c, slot, "bad secure-aggregation shares");
		return;
	}
	rc = fb_secagg_server_add_shares(sa->srv, slot, f->payload,
	    f->payload_len);
	if (rc != FB_OK) {
		guard_drop(c, sa_drop_reason(rc), "shares from %s: %s", w->name,
		    fb_strerror(rc));
		sa_leave(c, slot, "bad secure-aggregation shares");
		return;
	}
	memcpy(sa->shares + (size_t)slot * sa->k * FB_SECAGG_SHARE_MSG_LEN,
	    f->payload, f->payload_len);
	sa->share_len[slot] = (uint32_t)f->payload_len;
	sa->flags[slot] |= SA_F_SHARED;
}

static void
on_confirm(coord *c, worker *w, const fb_frame *f)
{
	sa_round *sa = c->sa;
	uint32_t slot = w->sa_slot;
	fb_err rc;

	if (sa->phase != SA_CONFIRM || !sa_unmasking(c) ||
	    !(sa->flags[slot] & SA_F_INCLUDED) ||
	    (sa->flags[slot] &
	        (SA_F_CONFIRMED | SA_F_REFUSED | SA_F_DISCARDED))) {
		guard_drop(c, DROP_UNEXPECTED, "confirmation from %s in the %s "
		    "phase", w->name, sa_phase_names[sa->phase]);
		return;
	}
	rc = fb_secagg_server_add_confirm(sa->srv, slot, f->payload,
	    f->payload_len);
#ifdef FB_TEST_LIAR
	if (rc == FB_EAUTH && slot == liar_slot &&
	    f->payload_len == FB_SECAGG_CONFIRM_LEN) {
		fb_log_warn("test liar: round %u: relaying %s's confirmation "
		            "of the false set", c->rd.number, w->name);
		rc = FB_OK;
	}
#endif
	if (rc != FB_OK) {
		/* a signature over another set than the one sent: not what
		 * an honest worker answers (or the set was changed on the
		 * way, which the session rules out) */
		guard_drop(c, sa_drop_reason(rc), "confirmation of the "
		    "included set from %s: %s", w->name, fb_strerror(rc));
		if (rc == FB_EAUTH) {
			/* not waited for, and never asked for shares */
			sa->flags[slot] |= SA_F_DISCARDED;
		}
		return;
	}
	memcpy(sa->confirm + (size_t)slot * FB_SECAGG_CONFIRM_LEN, f->payload,
	    FB_SECAGG_CONFIRM_LEN);
	sa->flags[slot] |= SA_F_CONFIRMED;
}

static void
on_refuse(coord *c, worker *w)
{
	sa_round *sa = c->sa;
	uint32_t slot = w->sa_slot;

	if ((sa->phase != SA_CONFIRM && sa->phase != SA_UNMASK) ||
	    !(sa->flags[slot] & SA_F_INCLUDED) ||
	    (sa->flags[slot] & (SA_F_REVEALED | SA_F_REFUSED))) {
		guard_drop(c, DROP_UNEXPECTED, "refusal to reveal from %s in "
		    "the %s phase", w->name, sa_phase_names[sa->phase]);
		return;
	}
	fb_log_warn("round %u: %s will not reveal its shares: it holds fewer "
	            "than %u confirmations of the included set it was sent",
	    sa->p.round, w->name, sa->t);
	sa->flags[slot] |= SA_F_REFUSED;
}

static void
on_reveal(coord *c, worker *w, const fb_frame *f)
{
	sa_round *sa = c->sa;
	uint32_t slot = w->sa_slot;
	fb_err rc;

	if (sa->phase != SA_UNMASK || !sa_unmasking(c) ||
	    !(sa->flags[slot] & SA_F_CONFIRMED) ||
	    (sa->flags[slot] & (SA_F_REVEALED | SA_F_REFUSED))) {
		guard_drop(c, DROP_UNEXPECTED, "reveal from %s in the %s phase",
		    w->name, sa_phase_names[sa->phase]);
		return;
	}
	rc = fb_secagg_server_add_reveal(sa->srv, slot, f->payload,
	    f->payload_len);
	if (rc != FB_OK) {
		guard_drop(c, sa_drop_reason(rc), "reveal from %s: %s", w->name,
		    fb_strerror(rc));
		return;
	}
	sa->flags[slot] |= SA_F_REVEALED;
}

static void ahead_on_message(coord *c, worker *w, const fb_frame *f);

void
sa_on_message(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;

	if (cohorts_on(c)) {
		cohort_on_secagg(c, w, f);
		return;
	}
	if (m->u.secagg.ahead) {
		/* a step of the round set up ahead: never of another instance,
		 * even of the same round (set up afresh when it began) */
		if (c->sa_ahead.phase == SA_OFF ||
		    m->u.secagg.round != c->sa_ahead.p.round) {
			guard_drop(c, DROP_STALE_ROUND, "secure-aggregation "
			    "step %u of round %u set up ahead, from %s: no such "
			    "setup now", m->u.secagg.phase, m->u.secagg.round,
			    w->name);
			return;
		}
		ahead_on_message(c, w, f);
		return;
	}
	if (!round_open_for(c, m->u.secagg.round)) {
		guard_drop(c, DROP_STALE_ROUND, "secure-aggregation message for "
		    "round %u from %s (round %u is open)", m->u.secagg.round,
		    w->name, c->rd.number);
		return;
	}
	if (c->sa->phase == SA_OFF || !(w->state == W_TRAINING ||
	                                 w->state == W_UPLOADING ||
	                                 w->state == W_DONE)) {
		guard_drop(c, DROP_UNEXPECTED, "secure-aggregation message from "
		    "%s, which is %s", w->name, worker_state_names[w->state]);
		return;
	}
	sa_handle(c, w, f);
}

void
sa_handle(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;

	switch (m->u.secagg.phase) {
	case FB_SA_ADVERT:
		on_advert(c, w, f);
		return;
	case FB_SA_SHARES:
		on_shares(c, w, f);
		return;
	case FB_SA_CONFIRM:
		on_confirm(c, w, f);
		return;
	case FB_SA_REVEAL:
		on_reveal(c, w, f);
		return;
	case FB_SA_REFUSE:
		on_refuse(c, w);
		return;
	default:
		guard_drop(c, DROP_UNEXPECTED, "secure-aggregation step %u from "
		    "%s", m->u.secagg.phase, w->name);
		return;
	}
}

static fb_err
sa_send(coord *c, worker *w, fb_secagg_phase phase, uint32_t count,
    const void *data, size_t len)
{
	fb_msg m = {.type = FB_MSG_SECAGG};
	m.u.secagg.round = c->sa->p.round;
	m.u.secagg.phase = phase;
	m.u.secagg.count = count;
	m.u.secagg.ahead = c->sa->ahead;
	return coord_send(c, w, &m, data, len, NULL);
}

/* Writes slot s's neighbours' entries (slot, identity key, advert) into
 * buf; returns how many. */
static uint32_t
peer_entries(coord *c, const uint32_t *nb, uint8_t *buf)
{
	sa_round *sa = c->sa;
	uint32_t cnt = 0;

	for (uint32_t i = 0; i < sa->k; i++) {
		uint32_t j = nb[i];
		uint8_t *e = buf + (size_t)cnt * FB_SECAGG_PEER_ENTRY_LEN;
		if (!(sa->flags[j] & SA_F_ADV)) {
			continue;
		}
		e[0] = (uint8_t)j;
		e[1] = (uint8_t)(j >> 8);
		e[2] = (uint8_t)(j >> 16);
		e[3] = (uint8_t)(j >> 24);
		memcpy(e + 4, c->reg.allow[sa_worker(c, j)->id].b, FB_PUBKEY_LEN);
		memcpy(e + 4 + FB_PUBKEY_LEN,
		    sa->adv + (size_t)j * FB_SECAGG_ADV_LEN, FB_SECAGG_ADV_LEN);
		cnt++;
	}
	return cnt;
}

/* Key adverts are in (or late): each advertiser gets its neighbours'. */
static void
sa_send_peers(coord *c, int64_t now)
{
	sa_round *sa = c->sa;
	const fb_secagg_graph *g = fb_secagg_server_graph(sa->srv);
	uint32_t *nb = calloc(sa->k + 1, sizeof(*nb));
	uint8_t *buf = calloc(sa->k + 1, FB_SECAGG_PEER_ENTRY_LEN);
	uint32_t sent = 0;

	for (uint32_t s = 0; s < sa->n; s++) {
		worker *w;
		uint32_t cnt;
		if (!sa_in_round(c, s)) {
			continue;
		}
		w = sa_worker(c, s);
		if (!(sa->flags[s] & SA_F_ADV)) {
			sa_leave(c, s, "no secure-aggregation key advert "
			               "within secure_aggregation.setup_timeout");
			continue;
		}
		if (nb == NULL || buf == NULL ||
		    fb_secagg_graph_neighbours(g, s, nb) != FB_OK) {
			sa_leave(c, s, "out of memory");
			continue;
		}
		cnt = peer_entries(c, nb, buf);
		if (sa_send(c, w, FB_SA_PEERS, cnt, buf,
		        (size_t)cnt * FB_SECAGG_PEER_ENTRY_LEN) != FB_OK) {
			sa_send_failed(c, s, "key adverts could not be sent");
			continue;
		}
		sent++;
	}
	free(nb);
	free(buf);
	fb_log_debug("round %u: %u key adverts relayed", sa->p.round, sent);
	sa->phase = SA_SHARES;
	sa->phase_end_ms = now + c->cfg->sa_setup_ms;
}

/* Copies the shares addressed to slot s into buf; returns how many. */
static uint32_t
shares_for(const sa_round *sa, uint32_t s, uint8_t *buf)
{
	uint32_t cnt = 0;

	for (uint32_t j = 0; j < sa->n; j++) {
		const uint8_t *batch = sa->shares +
		    (size_t)j * sa->k * FB_SECAGG_SHARE_MSG_LEN;
		if (j == s || !(sa->flags[j] & SA_F_SHARED)) {
			continue;
		}
		for (uint32_t off = 0; off < sa->share_len[j];
		     off += FB_SECAGG_SHARE_MSG_LEN) {
			uint32_t from = 0, to = 0;
			if (fb_secagg_share_msg_peek(batch + off,
			        FB_SECAGG_SHARE_MSG_LEN, &from, &to) == FB_OK &&
			    to == s && cnt <= sa->k) {
				memcpy(buf + (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN,
				    batch + off, FB_SECAGG_SHARE_MSG_LEN);
				cnt++;
			}
		}
	}
	return cnt;
}

/* Shares are in (or late): each sharer gets the shares addressed to it. */
static void
sa_relay_shares(coord *c)
{
	sa_round *sa = c->sa;
	uint8_t *buf = calloc(sa->k + 1, FB_SECAGG_SHARE_MSG_LEN);
	uint32_t sent = 0;

	for (uint32_t s = 0; s < sa->n; s++) {
		worker *w;
		uint32_t cnt;
		if (!sa_in_round(c, s) || !(sa->flags[s] & SA_F_ADV)) {
			continue;
		}
		w = sa_worker(c, s);
		if (!(sa->flags[s] & SA_F_SHARED)) {
			sa_leave(c, s, "no secure-aggregation shares within "
			               "secure_aggregation.setup_timeout");
			continue;
		}
		cnt = buf != NULL ? shares_for(sa, s, buf) : 0;
		if (buf == NULL ||
		    sa_send(c, w, FB_SA_RELAY, cnt, buf,
		        (size_t)cnt * FB_SECAGG_SHARE_MSG_LEN) != FB_OK) {
			sa_send_failed(c, s, "shares could not be relayed");
			continue;
		}
		sent++;
	}
	free(buf);
	fb_log_debug("round %u: shares relayed to %u workers", sa->p.round,
	    sent);
	sa->phase = SA_INPUT;
}

/* Moves the setup phases on once every worker answered or time is up. */
void
sa_advance(coord *c, int64_t now)
{
	sa_round *sa = c->sa;
	unsigned need = sa->phase == SA_ADVERTS ? 0 : SA_F_ADV;
	unsigned have = sa->phase == SA_ADVERTS ? SA_F_ADV : SA_F_SHARED;
	bool waiting = false;

	if (sa->phase != SA_ADVERTS && sa->phase != SA_SHARES) {
		return;
	}
	for (uint32_t s = 0; s < sa->n && !waiting; s++) {
		waiting = sa_in_round(c, s) && (sa->flags[s] & need) == need &&
		    !(sa->flags[s] & have);
	}
	if (waiting && now < sa->phase_end_ms) {
		return;
	}
	if (sa->phase == SA_ADVERTS) {
		sa_send_peers(c, now);
	} else {
		sa_relay_shares(c);
	}
}

/* The round is closed: every included worker still here is sent the
 * included set, to sign (the consistency check). */
void
sa_request_confirms(coord *c, int64_t now)
{
	sa_round *sa = c->sa;
	uint8_t *inc = calloc(sa->n, 1);

	sa->phase = SA_CONFIRM;
	sa->phase_end_ms = now + c->cfg->sa_unmask_ms;
	if (inc == NULL) {
		return; /* nobody asked: too few confirm, the round aborts */
	}
	fb_secagg_server_included(sa->srv, inc);
	for (uint32_t s = 0; s < sa->n; s++) {
		if ((sa->flags[s] & SA_F_INCLUDED) && sa_worker(c, s)->used) {
#ifdef FB_TEST_LIAR
			uint32_t last = UINT32_MAX;
			for (uint32_t j = s + 1; j < sa->n; j++) {
				last = inc[j] ? j : last;
			}
			if (liar_slot == UINT32_MAX && last != UINT32_MAX &&
			    liar_tells("included")) {
				liar_slot = s;
				inc[last] = 0;
				fb_log_warn("test liar: round %u: %s is told that "
				            "%s dropped", c->rd.number,
				    sa_worker(c, s)->name,
				    sa_worker(c, last)->name);
				(void)sa_send(c, sa_worker(c, s),
				    FB_SA_INCLUDED, sa->n, inc, sa->n);
				inc[last] = 1;
				continue;
			}
#endif
			(void)sa_send(c, sa_worker(c, s), FB_SA_INCLUDED, sa->n,
			    inc, sa->n);
		}
	}
	free(inc);
}

/* Whether an included worker still here has neither confirmed the set
 * nor refused. */
bool
sa_confirms_pending(const coord *c)
{
	const sa_round *sa = c->sa;

	for (uint32_t s = 0; s < sa->n; s++) {
		if ((sa->flags[s] & SA_F_INCLUDED) &&
		    !(sa->flags[s] &
		        (SA_F_CONFIRMED | SA_F_REFUSED | SA_F_DISCARDED)) &&
		    c->reg.workers[sa->slot_worker[s]].used) {
			return true;
		}
	}
	return false;
}

/*
 * The confirmations are in (or late): each confirmer still here gets its
 * neighbours' confirmations, which ask it for its shares. FB_ERANGE (and
 * nothing sent) when fewer than t workers confirmed: no worker would
 * reveal, and the round cannot be unmasked.
 */
fb_err
sa_request_reveals(coord *c, int64_t now)
{
	sa_round *sa = c->sa;
	const fb_secagg_graph *g = fb_secagg_server_graph(sa->srv);
	uint32_t *nb = NULL;
	uint8_t *buf = NULL;
	fb_err rc = FB_OK;

	sa->phase = SA_UNMASK;
	sa->phase_end_ms = now + c->cfg->sa_unmask_ms;
	if (sa_count(sa, SA_F_CONFIRMED) < sa->t) {
		return FB_ERANGE;
	}
	nb = calloc(sa->k + 1, sizeof(*nb));
	buf = calloc(sa->k + 1, FB_SECAGG_CONFIRM_LEN);
	if (nb == NULL || buf == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t s = 0; s < sa->n; s++) {
		uint32_t cnt = 0;
		if (!(sa->flags[s] & SA_F_CONFIRMED) ||
		    !sa_worker(c, s)->used ||
		    fb_secagg_graph_neighbours(g, s, nb) != FB_OK) {
			continue;
		}
		for (uint32_t i = 0; i < sa->k; i++) {
			size_t from = (size_t)nb[i] * FB_SECAGG_CONFIRM_LEN;
			size_t to = (size_t)cnt * FB_SECAGG_CONFIRM_LEN;
			if (sa->flags[nb[i]] & SA_F_CONFIRMED) {
				memcpy(buf + to, sa->confirm + from,
				    FB_SECAGG_CONFIRM_LEN);
				cnt++;
			}
		}
		(void)sa_send(c, sa_worker(c, s), FB_SA_CONFIRMS, cnt, buf,
		    (size_t)cnt * FB_SECAGG_CONFIRM_LEN);
	}
out:
	free(nb);
	free(buf);
	return rc;
}

/* Whether a confirmer still here has neither revealed nor refused. */
bool
sa_reveals_pending(const coord *c)
{
	const sa_round *sa = c->sa;

	for (uint32_t s = 0; s < sa->n; s++) {
		if ((sa->flags[s] & SA_F_CONFIRMED) &&
		    !(sa->flags[s] & (SA_F_REVEALED | SA_F_REFUSED)) &&
		    c->reg.workers[sa->slot_worker[s]].used) {
			return true;
		}
	}
	return false;
}

/* Whether fewer than t confirmers revealed or still may: then no secret
 * can be reconstructed, and waiting longer is pointless. */
bool
sa_reveals_hopeless(const coord *c)
{
	const sa_round *sa = c->sa;
	uint32_t may = 0;

	for (uint32_t s = 0; s < sa->n; s++) {
		may += (sa->flags[s] & SA_F_CONFIRMED) &&
		    !(sa->flags[s] & SA_F_REFUSED) &&
		    ((sa->flags[s] & SA_F_REVEALED) ||
		        c->reg.workers[sa->slot_worker[s]].used);
	}
	return may < sa->t;
}

/* ---- the next round set up ahead (secure_aggregation.setup_ahead) ------- */

/*
 * What this changes, and what not: round r + 1's SecAgg instance is made
 * (fresh graph seed, degree and threshold; the workers' fresh keys,
 * adverts and shares) by the same steps as in a round, only while round r
 * still runs, among the workers live then. Nothing of round r's instance
 * is reused, so no reveal of round r bears on it (crypto.h, "Key
 * lifetimes"), and its messages are bound to round r + 1 like any of
 * that round. The coordinator learns the same things, sooner: who sent
 * its keys and shares. At round r + 1's start it selects the members
 * still here whose shares went out (U2); one lost since is a dropout of
 * that round, recovered as any other.
 */

/* Whether worker w has slot *slot in the instance set up ahead. */
static bool
ahead_member(const coord *c, const worker *w, uint32_t *slot)
{
	const sa_round *sa = &c->sa_ahead;
	uint32_t s = w->ahead_slot;

	if (sa->slot_id == NULL || s >= sa->n ||
	    sa->slot_worker[s] != registry_slot(c, w).v ||
	    sa->slot_id[s] != w->id || sa->slot_session[s] != w->session) {
		return false;
	}
	*slot = s;
	return true;
}

/* w's advert or shares for the round set up ahead: handled as in a
 * round, with c->sa that instance and w->sa_slot its slot there. */
static void
ahead_on_message(coord *c, worker *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	sa_round *prev = c->sa;
	uint32_t slot = 0, own;

	if (!ahead_member(c, w, &slot) ||
	    (c->sa_ahead.flags[slot] & SA_F_OUT) ||
	    (m->u.secagg.phase != FB_SA_ADVERT &&
	        m->u.secagg.phase != FB_SA_SHARES)) {
		guard_drop(c, DROP_UNEXPECTED, "secure-aggregation step %u of "
		    "round %u (set up ahead) from %s", m->u.secagg.phase,
		    m->u.secagg.round, w->name);
		return;
	}
	own = w->sa_slot;
	c->sa = &c->sa_ahead;
	w->sa_slot = slot;
	sa_handle(c, w, f);
	w->sa_slot = own;
	c->sa = prev;
}

/*
 * How long a round runs before the next one is set up while it runs. The
 * setup's messages take each process's loop for a while (adverts in and
 * out, shares made and relayed: 1-2 ms a round on 2 vCPUs at 4 workers);
 * during a round of a few ms (a small model's download, masked upload and
 * reveals) that time is the round's own, so such a round's successor is
 * set up once the round's sum is in, while its step and checkpoint run
 * (the next round waits for a setup under way, sa_ahead_pending). A round
 * that runs longer (training) has its successor set up while it trains.
 */
#define AHEAD_AFTER_MS 50

/* Whether the next round should be set up at `now`: sync secure rounds of
 * every live worker, a next round to come, this round's own setup done
 * (its masked inputs may come), and it has run AHEAD_AFTER_MS or its sum
 * is in. */
static bool
ahead_wanted(const coord *c, int64_t now)
{
	const fb_coord_config *cfg = c->cfg;
	const round_state *rd = &c->rd;

	if (!cfg->sa_enabled || !cfg->sa_setup_ahead || !c->secure ||
	    cfg->mode != FB_MODE_SYNC || cfg->workers_per_round > 0 ||
	    rd->final ||
	    (rd->number >= (uint32_t)cfg->rounds && !cfg->fed_final)) {
		return false;
	}
	switch (rd->phase) {
	case PHASE_TRAIN:
	case PHASE_OVERTIME:
		return c->sa_sync.phase >= SA_INPUT &&
		       now - rd->started_ms >= AHEAD_AFTER_MS;
	case PHASE_UNMASK:
		return now - rd->started_ms >= AHEAD_AFTER_MS;
	case PHASE_AGGREGATE:
	case PHASE_RECORD:
		return true;
	default:
		return false;
	}
}

/* Starts round rd.number + 1's instance among the workers live now: each
 * gets its slot and the round's parameters (FB_SA_SETUP) and answers with
 * its advert. */
static void
ahead_start(coord *c, int64_t now)
{
	uint32_t round = c->rd.number + 1, n = 0;
	uint32_t *cand = calloc(c->reg.cap > 0 ? c->reg.cap : 1, sizeof(*cand));
	sa_round *prev = c->sa, *sa = &c->sa_ahead;
	uint8_t payload[FB_SA_SETUP_MAX];
	const char *why = NULL;
	fb_err rc;

	if (cand == NULL) {
		return;
	}
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		if (c->reg.workers[i].used) {
			cand[n++] = i;
		}
	}
	if (n < 2) {
		free(cand);
		return; /* the round will wait for workers, and set up then */
	}
	c->sa = sa;
	if ((rc = sa_begin(c, round, NULL, n, &why)) == FB_OK &&
	    ((sa->slot_id = calloc(n, sizeof(*sa->slot_id))) == NULL ||
	        (sa->slot_session = calloc(n, sizeof(*sa->slot_session))) ==
	            NULL)) {
		why = "out of memory";
		rc = FB_ENOMEM;
	}
	if (rc != FB_OK) {
		fb_log_warn("round %u: cannot set round %u up ahead (%s); it "
		            "sets up when it starts",
		    c->rd.number, round, why != NULL ? why : fb_strerror(rc));
		sa_free(sa);
		c->sa = prev;
		free(cand);
		return;
	}
	sa->ahead = true;
	sa->phase_end_ms = now + c->cfg->sa_setup_ms;
	for (uint32_t s = 0; s < n; s++) {
		worker *w = &c->reg.workers[cand[s]];
		fb_msg m = {.type = FB_MSG_ROUND_START};
		size_t len = 0;

		sa->slot_worker[s] = cand[s];
		sa->slot_id[s] = w->id;
		sa->slot_session[s] = w->session;
		w->ahead_slot = s;
		sa_round_start(c, w, &m);
		m.u.round_start.sa_slot = s; /* its slot in this instance */
		if (fb_sa_setup_pack(&m, payload, sizeof(payload), &len) !=
		        FB_OK ||
		    sa_send(c, w, FB_SA_SETUP, 1, payload, len) != FB_OK) {
			sa->flags[s] |= SA_F_OUT;
		}
	}
	fb_log_debug("round %u: round %u set up ahead among %u workers "
	             "(%u neighbours, threshold %u)",
	    c->rd.number, round, n, sa->k, sa->t);
	c->sa = prev;
	free(cand);
}

void
sa_ahead_step(coord *c, int64_t now)
{
	round_state *rd = &c->rd;
	sa_round *prev;
	/* the round it may be for: the next, or, waiting to start, this */
	uint32_t next = rd->number + (rd->phase == PHASE_IDLE ? 0 : 1);

	if (c->sa_ahead.phase != SA_OFF && c->sa_ahead.p.round != next) {
		sa_free(&c->sa_ahead); /* its round began without it */
	}
	if (c->sa_ahead.phase == SA_OFF && rd->ahead_tried != rd->number + 1 &&
	    ahead_wanted(c, now)) {
		rd->ahead_tried = rd->number + 1;
		ahead_start(c, now);
	}
	if (c->sa_ahead.phase == SA_ADVERTS || c->sa_ahead.phase == SA_SHARES) {
		prev = c->sa;
		c->sa = &c->sa_ahead;
		sa_advance(c, now);
		c->sa = prev;
	}
}

bool
sa_ahead_pending(const coord *c)
{
	const sa_round *sa = &c->sa_ahead;

	return (sa->phase == SA_ADVERTS || sa->phase == SA_SHARES) &&
	       sa->p.round == c->rd.number;
}

int64_t
sa_ahead_next_timer(const coord *c, int64_t now, int64_t next)
{
	const sa_round *sa = &c->sa_ahead;
	const round_state *rd = &c->rd;
	int64_t at = rd->started_ms + AHEAD_AFTER_MS;

	/* a round's wait to set the next one up ends on its own */
	if (sa->phase == SA_OFF && rd->ahead_tried != rd->number + 1 &&
	    now < at && !ahead_wanted(c, now) && ahead_wanted(c, at) &&
	    at - now < next) {
		next = at - now;
	}
	if ((sa->phase == SA_ADVERTS || sa->phase == SA_SHARES) &&
	    sa->phase_end_ms - now < next) {
		next = sa->phase_end_ms - now;
	}
	return next;
}

/*
 * Taken only when it covers every live worker: each a member whose shares
 * went out, in the session it set up in (one that came back since has a
 * new session and none of that setup). A worker that joined or came back
 * since, or that left the setup, would otherwise sit the round out; then
 * the round sets up as before, with everyone.
 */
bool
sa_ahead_adopt(coord *c, int64_t now)
{
	round_state *rd = &c->rd;
	sa_round *sa = &c->sa_ahead, *prev = c->sa;
	uint32_t members = 0, live = 0, nsel = 0;
	const char *why = NULL;

	if (sa->phase == SA_OFF) {
		return false;
	}
	c->sa = sa;
	for (uint32_t s = 0; s < sa->n && sa->phase == SA_INPUT; s++) {
		members += sa_in_round(c, s) && (sa->flags[s] & SA_F_SHARED);
	}
	c->sa = prev;
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		live += c->reg.workers[i].used;
	}
	if (sa->p.round != rd->number) {
		why = ""; /* another round's: dropped without a word */
	} else if (sa->phase != SA_INPUT) {
		why = "did not finish in time";
	} else if (members < live) {
		why = "leaves out a worker that joined, came back or left it "
		      "since";
	} else if (members < sa->t || members < 2) {
		why = "kept too few workers";
	}
	if (why != NULL) {
		if (why[0] != '\0') {
			fb_log_info("round %u: its secure-aggregation setup made "
			            "ahead %s; setting it up now",
			    rd->number, why);
		}
		sa_free(sa);
		return false;
	}
	/* the selection: every live member whose shares went out */
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		c->reg.workers[i].state = W_IDLE;
		c->reg.workers[i].fail_reason = NULL;
	}
	c->sa = sa;
	for (uint32_t s = 0; s < sa->n; s++) {
		if (sa_in_round(c, s) && (sa->flags[s] & SA_F_SHARED)) {
			rd->sel[nsel] = sa->slot_worker[s];
			rd->sel_id[nsel] = sa->slot_id[s];
			nsel++;
		}
	}
	c->sa = prev;
	rd->target_updates = nsel;
	rd->nsel = nsel;
	for (uint32_t k = 0; k < nsel; k++) {
		round_task_reset(c, &c->reg.workers[rd->sel[k]],
		    (uint32_t)((uint64_t)k * c->chunk_count / nsel));
	}
	/* the instance is the round's now */
	sa_free(&c->sa_sync);
	c->sa_sync = *sa;
	memset(sa, 0, sizeof(*sa));
	c->sa_sync.ahead = false;
	free(c->sa_sync.slot_id);
	free(c->sa_sync.slot_session);
	c->sa_sync.slot_id = NULL;
	c->sa_sync.slot_session = NULL;
	for (uint32_t k = 0; k < nsel; k++) {
		worker *w = &c->reg.workers[rd->sel[k]];
		w->sa_slot = w->ahead_slot;
	}
	c->sa = &c->sa_sync;
	rd->set_up_ahead = true;
	fb_log_debug("round %u: secure aggregation set up ahead, %u of %u "
	             "workers",
	    rd->number, nsel, c->sa_sync.n);
	(void)now;
	return true;
}
