/* SPDX-License-Identifier: Apache-2.0 */
/*
 * unmask.c -- the last step of a secure round, on the coordinator's job
 * thread (job.c): the secrets the included workers revealed are turned
 * into their masks, which are removed from the ring sum on every core of
 * the job pool; then the decoded sums are checked against what honest
 * inputs can produce (a mean inside [-clip, clip], a weight total in
 * (0, included], losses and FedNova normalisers inside their encodings),
 * so that one worker's lying masked input is refused after unmasking,
 * with no single worker's input learnt. secagg.c runs the protocol's
 * phases up to the reveals.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

/* fb_accum_ring settles the sum on its first call after a reset: it is
 * called once, before the threads, which share its pointer. */
typedef struct unmask_arg {
	coord *c;
	const job *j;
	uint32_t *ring;
	atomic_int rc;
} unmask_arg;

static void
unmask_chunk(void *arg, uint32_t k)
{
	unmask_arg *a = arg;
	coord *c = a->c;
	const job *j = a->j;
	uint64_t first = (uint64_t)k * c->chunk_elems;
	fb_err rc = fb_secagg_server_unmask_chunk(j->sa->srv, a->ring + first,
	    first, fb_accum_chunk_len(j->accum, k));

	if (rc != FB_OK) {
		int ok = FB_OK;
		atomic_compare_exchange_strong(&a->rc, &ok, (int)rc);
	}
}

/*
 * sa_check_sums refuses decoded sums that no honest set of inputs gives
 * (a worker's masked input cannot be clipped before the sum, so one
 * malicious input could otherwise move the model without bound): the
 * weight sum must lie in (0, included], and the weighted means of the
 * loss and of FedNova's normaliser within their encodings' bounds (the
 * quantisation bound added).
 */
static fb_err
sa_check_sums(coord *c, job *j, uint32_t included)
{
	const fb_secagg_encodings *e = &j->sa->enc;
	double slack_w = fb_encoding_bound(&e->w, included);

	if (!(j->W > 0) || j->W > (double)included + slack_w) {
		snprintf(j->why, sizeof(j->why), "the included workers' weights "
		    "sum to %.6g, outside (0, %u]: a masked input is not what an "
		    "honest worker sends", j->W, included);
		return FB_ERANGE;
	}
	if (!(fabs(j->loss) <= e->loss.clip * (1 + 1e-6) +
	                           fb_encoding_bound(&e->loss, included) / j->W)) {
		snprintf(j->why, sizeof(j->why), "the weighted train loss %.6g is "
		    "outside its bound %g: a masked input is not what an honest "
		    "worker sends", j->loss, e->loss.clip);
		return FB_ERANGE;
	}
	if (fb_rule_is_fednova(c->cfg->rule) &&
	    !(j->a > 0 && j->a <= e->a.clip * (1 + 1e-6) +
	                              fb_encoding_bound(&e->a, included) / j->W)) {
		snprintf(j->why, sizeof(j->why), "the weighted FedNova normaliser "
		    "%.6g is outside (0, %g]: a masked input is not what an honest "
		    "worker sends", j->a, e->a.clip);
		return FB_ERANGE;
	}
	return FB_OK;
}

typedef struct range_arg {
	coord *c;
	const job *j;
	const uint32_t *ring;
	atomic_uint_fast32_t max_abs; /* of the decoded sums, ring units */
} range_arg;

static void
range_chunk(void *arg, uint32_t k)
{
	range_arg *a = arg;
	coord *c = a->c;
	const job *j = a->j;
	const uint32_t *sum = a->ring + (uint64_t)k * c->chunk_elems;
	uint64_t n = fb_accum_chunk_len(j->accum, k);
	uint32_t m = 0;
	uint_fast32_t seen;

	for (uint64_t i = 0; i < n; i++) {
		int32_t v = (int32_t)sum[i];
		uint32_t mag = v < 0 ? (uint32_t)0 - (uint32_t)v : (uint32_t)v;
		m = mag > m ? mag : m;
	}
	seen = atomic_load(&a->max_abs);
	while (m > seen && !atomic_compare_exchange_weak(&a->max_abs, &seen,
	                       m)) {
	}
}

/*
 * sa_check_mean refuses a decoded sum (sign-extended in the ring) whose
 * mean leaves [-clip, clip] anywhere, beyond the quantisation bound: no
 * honest inputs give one, and so one malicious input moves no coordinate
 * of the mean further than clipping lets any round move it.
 */
static fb_err
sa_check_mean(coord *c, job *j, uint32_t included)
{
	const fb_secagg_encodings *e = &j->sa->enc;
	range_arg a = {.c = c, .j = j};
	double limit = e->x.clip * (j->W + fb_encoding_bound(&e->w, included)) +
	    fb_encoding_bound(&e->x, included);
	double got;

	atomic_init(&a.max_abs, 0);
	a.ring = fb_accum_ring(j->accum);
	fb_pool_for(c->pool, c->chunk_count, range_chunk, &a);
	got = (double)atomic_load(&a.max_abs) / e->x.scale;
	if (got > limit) {
		snprintf(j->why, sizeof(j->why), "the unmasked mean reaches %.6g, "
		    "outside [-%g, %g] (secure_aggregation.clip): a masked input "
		    "is not what an honest worker sends", got / j->W, e->x.clip,
		    e->x.clip);
		return FB_ERANGE;
	}
	return FB_OK;
}

/*
 * sa_unmask reconstructs the round's secrets from the reveals, removes the
 * masks from the accumulator's ring on every core, and decodes the sum
 * into it. On FB_OK the accumulator holds the weighted sum of the included
 * updates, and j->W, j->loss, j->a the decoded sums of weights, weighted
 * train losses and weighted FedNova normalisers. Otherwise j->why says
 * why the round cannot be committed.
 */
fb_err
sa_unmask(coord *c, job *j)
{
	sa_round *sa = j->sa;
	uint32_t included = sa_count(sa, SA_F_INCLUDED);
	uint32_t revealed = sa_count(sa, SA_F_REVEALED);
	unmask_arg a = {.c = c, .j = j};
	fb_err rc;

	if (sa->poisoned != NULL) {
		snprintf(j->why, sizeof(j->why), "%s", sa->poisoned);
		return FB_ERANGE;
	}
	rc = fb_secagg_server_finish(sa->srv);
	if (rc == FB_ERANGE) {
		uint32_t refused = sa_count(sa, SA_F_REFUSED);
		snprintf(j->why, sizeof(j->why), "too few shares to unmask: %u "
		    "of %u included workers answered, %u needed%s", revealed,
		    included, sa->t, refused > 0
		        ? "; some refused to reveal, holding fewer than the "
		          "threshold of confirmations of the included set"
		        : "");
		return rc;
	}
	if (rc != FB_OK) {
		snprintf(j->why, sizeof(j->why), "unmasking failed: %s%s",
		    fb_strerror(rc), rc == FB_EAUTH
		        ? " (a reconstructed secret does not match its "
		          "commitment: corrupt shares)"
		        : "");
		return rc;
	}
	atomic_init(&a.rc, FB_OK);
	a.ring = fb_accum_ring(j->accum);
	fb_pool_for(c->pool, c->chunk_count, unmask_chunk, &a);
	rc = (fb_err)atomic_load(&a.rc);
	if (rc == FB_OK) {
		rc = fb_secagg_server_unmask_chunk(sa->srv, sa->extra,
		    c->param_count, SA_EXTRA);
	}
	if (rc != FB_OK) {
		snprintf(j->why, sizeof(j->why), "unmasking failed: %s",
		    fb_strerror(rc));
		return rc;
	}
	if (fb_secagg_decode_extras(&sa->enc, sa->extra, &j->W, &j->loss,
	        &j->a) != FB_OK) {
		snprintf(j->why, sizeof(j->why), "the included workers' weights "
		    "sum to zero or less: a masked input is not what an honest "
		    "worker sends");
		return FB_ERANGE;
	}
	if (fb_secagg_decode_eval(&sa->enc, sa->extra,
	        (uint64_t)c->cfg->sa_max_samples, included, &j->fed_eval) !=
	    FB_OK) {
		fb_log_warn("round %u: the federated evaluation's sums are out "
		            "of range; none this round", c->rd.number);
	}
	if ((rc = sa_check_sums(c, j, included)) != FB_OK) {
		return rc;
	}
	if ((rc = fb_accum_set_secure_sum(j->accum, &sa->enc.x, j->W)) !=
	    FB_OK) {
		snprintf(j->why, sizeof(j->why), "cannot decode the sum: %s",
		    fb_strerror(rc));
		return rc;
	}
	if ((rc = sa_check_mean(c, j, included)) != FB_OK) {
		return rc;
	}
	fb_log_debug("round %u: unmasked the sum of %u inputs with %u "
	             "workers' shares (%" PRIu64 " mask expansions)",
	    c->rd.number, included, revealed,
	    fb_secagg_server_correction_terms(sa->srv));
	return FB_OK;
}
