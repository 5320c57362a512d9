/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rules.c -- the aggregation rules applied to the accumulator's mean:
 * FedNova's normaliser and effective step count (Wang et al. 2020), and the
 * server optimisers FedAvg, FedAvgM, FedAdam and FedYogi (Reddi et al. 2021,
 * Algorithm 2) with an optional cosine schedule of the server learning rate
 * over the run. aggregation.h states the math and the sign convention.
 *
 * The server step reads the fixed-point sums of each chunk directly (the
 * layout comes from aggregation_impl.h) and updates params and state one
 * coordinate at a time in double, so the coordinator needs no model-sized
 * buffer besides params and the optimiser's own state.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "aggregation/aggregation_impl.h"
#include "common/util.h"

struct fb_server_opt {
	fb_server_opt_params p;
	double lr;      /* this round's, fb_server_lr_at(p, round) */
	uint64_t count; /* model floats, > 0 */
	float *m;       /* count floats; NULL for sgd */
	float *v;       /* count floats; adam and yogi only */
};

/* Up to this many steps the momentum normaliser is summed term by term. */
#define MOMENTUM_DIRECT_MAX (1u << 20)

const char *const fb_rule_names[] = {
	"fedavg",
	"fednova",
	"fedavgm",
	"fedadam",
	"fedyogi",
	NULL,
};

const char *const fb_server_lr_decay_names[] = {
	"none",
	"cosine",
	NULL,
};

/* ---- reading the accumulator -------------------------------------------- */

/*
 * chunk_inv returns the factor that turns chunk `chunk`'s ring sums into
 * its weighted mean, 1 / (W * S), or 0 when the chunk has no weight.
 */
static double
chunk_inv(const fb_accum *a, uint32_t chunk)
{
	double w = fb_accum_chunk_weight(a, chunk);
	return w > 0 ? 1.0 / (w * a->scale) : 0.0;
}

fb_err
fb_accum_mean_chunk(const fb_accum *a, uint32_t chunk, float *out)
{
	fb_err rc = FB_OK;
	const uint32_t *sum;
	uint64_t n;
	double inv;

	if (chunk >= a->chunks) {
		rc = FB_EINVAL;
		goto out;
	}
	n = fb_accum_chunk_len(a, chunk);
	sum = a->sum + (uint64_t)chunk * a->chunk_elems;
	inv = chunk_inv(a, chunk);
	for (uint32_t p = 0; (uint64_t)p * a->part_elems < n; p++) {
		uint64_t len, off = accum_part_span(a, n, p, &len);
		/* A stale part reads as zero (aggregation_impl.h): 0 * inv. */
		if (accum_part_stale(a, chunk, p)) {
			memset(out + off, 0, len * sizeof(*out));
			continue;
		}
		for (uint64_t j = off; j < off + len; j++) {
			out[j] = (float)((double)(int32_t)sum[j] * inv);
		}
	}
out:
	return rc;
}

/* ---- FedNova ------------------------------------------------------------ */

/*
 * a_norm_both sums |a_s| with both momentum and a proximal term: the
 * response of (x - x_global, velocity) to a unit gradient, run forward one
 * step at a time (see aggregation.h). Each |a_s| is the response after
 * tau - s steps, so one pass over j = 1 .. tau gives the whole sum. Once the
 * state has decayed below 1e-300 the remaining terms cannot change the sum.
 */
static double
a_norm_both(uint64_t tau, double rho, double lr, double mu)
{
	double e = -lr, v = 1.0; /* state after the gradient's own step */
	double total = 0.0;

	for (uint64_t j = 1; j <= tau; j++) {
		total += fabs(e) / lr;
		if (fabs(e) + fabs(v) < 1e-300) {
			break;
		}
		/* next homogeneous step: v' = rho v + mu e, e' = e - lr v' */
		double vn = rho * v + mu * e;
		e = e - lr * vn;
		v = vn;
	}
	return total;
}

/*
 * a_norm_momentum is sum_{j=1..tau} (1 - rho^j) / (1 - rho). The closed
 * form (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho) cancels badly
 * when tau (1 - rho) is small, so short runs sum the (positive) terms
 * directly: t_j = rho t_(j-1) + 1 is (1 - rho^j) / (1 - rho).
 */
static double
a_norm_momentum(uint64_t tau, double rho)
{
	double t = (double)tau;
	double total = 0.0, term = 0.0;

	if (tau <= MOMENTUM_DIRECT_MAX) {
		for (uint64_t j = 1; j <= tau; j++) {
			term = rho * term + 1.0;
			total += term;
		}
		return total;
	}
	/* expm1 keeps 1 - rho^tau accurate */
	return (t + rho * expm1(t * log(rho)) / (1 - rho)) / (1 - rho);
}

fb_err
fb_fednova_a_norm(uint64_t tau, double momentum, double lr, double prox_mu,
    double *norm)
{
	fb_err rc = FB_OK;
	double r;

	*norm = 0.0;
	if (tau == 0 || !(momentum >= 0 && momentum < 1) ||
	    !(prox_mu >= 0 && isfinite(prox_mu))) {
		rc = FB_EINVAL;
		goto out;
	}
	if (prox_mu > 0 && !(lr > 0 && isfinite(lr) && lr * prox_mu < 1)) {
		rc = FB_EINVAL;
		goto out;
	}
	if (momentum == 0 && prox_mu == 0) {
		r = (double)tau;
	} else if (prox_mu == 0) {
		r = a_norm_momentum(tau, momentum);
	} else if (momentum == 0) {
		/* sum_{j=0..tau-1} (1 - lr mu)^j */
		double q = lr * prox_mu;
		r = -expm1((double)tau * log1p(-q)) / q;
	} else {
		r = a_norm_both(tau, momentum, lr, prox_mu);
	}
	if (!(r > 0) || !isfinite(r)) {
		rc = FB_EINVAL;
		goto out;
	}
	*norm = r;
out:
	return rc;
}

fb_err
fb_fednova_normalise(float *update, uint64_t count, double a_norm)
{
	fb_err rc = FB_OK;

	if (!(a_norm > 0) || !isfinite(a_norm)) {
		rc = FB_EINVAL;
		goto out;
	}
	for (uint64_t j = 0; j < count; j++) {
		update[j] = (float)((double)update[j] / a_norm);
	}
out:
	return rc;
}

fb_err
fb_fednova_tau_eff(const double *p, const double *a_norm, uint32_t count,
    double *tau_eff)
{
	fb_err rc = FB_OK;
	double sp = 0.0, spa = 0.0;

	*tau_eff = 0.0;
	if (count == 0) {
		rc = FB_EINVAL;
		goto out;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (!(p[i] > 0) || !isfinite(p[i]) || !(a_norm[i] > 0) ||
		    !isfinite(a_norm[i])) {
			rc = FB_EINVAL;
			goto out;
		}
		sp += p[i];
		spa += p[i] * a_norm[i];
	}
	if (!isfinite(spa)) {
		rc = FB_EINVAL;
		goto out;
	}
	*tau_eff = spa / sp;
out:
	return rc;
}

/* ---- server optimisers -------------------------------------------------- */

void
fb_server_opt_params_default(fb_server_opt_params *p, fb_server_opt_kind kind)
{
	memset(p, 0, sizeof(*p));
	p->kind = kind;
	p->lr = kind == FB_SERVER_ADAM || kind == FB_SERVER_YOGI ? 0.01 : 1.0;
	p->beta1 = 0.9;
	p->beta2 = 0.99;
	p->tau = 1e-3;
	p->decay = FB_LR_DECAY_NONE;
	p->lr_final = 0.0;
	p->rounds = 1;
}

double
fb_server_lr_at(const fb_server_opt_params *p, uint64_t round)
{
	double t, c, f = p->lr_final;

	if (p->decay == FB_LR_DECAY_NONE) {
		return p->lr;
	}
	if (round > p->rounds) {
		return p->lr * f;
	}
	/* t = (round - 1) / R in [0, 1): round 1 gets lr, round R just above
	 * lr f. (1 + cos(pi t)) / 2 = cos^2(pi t / 2) = sin^2(pi (1 - t) / 2):
	 * the cosine for t <= 1/2 and the sine after keep every round's value
	 * to a few ulps, where 1 + cos(pi t) would cancel near t = 1. */
	if (round == 0) {
		round = 1;
	}
	t = (double)(round - 1) / (double)p->rounds;
	c = 2 * (round - 1) <= p->rounds
	        ? cos(M_PI_2 * t)
	        : sin(M_PI_2 * ((double)(p->rounds - round + 1) /
	                          (double)p->rounds));
	return p->lr * (f + (1.0 - f) * c * c);
}

static bool
params_ok(const fb_server_opt_params *p)
{
	bool adaptive = p->kind == FB_SERVER_ADAM || p->kind == FB_SERVER_YOGI;

	if ((unsigned)p->kind >= FB_SERVER_KIND_COUNT_ || !(p->lr > 0) ||
	    !isfinite(p->lr)) {
		return false;
	}
	if (p->kind != FB_SERVER_SGD && !(p->beta1 >= 0 && p->beta1 < 1)) {
		return false;
	}
	if (adaptive && (!(p->beta2 >= 0 && p->beta2 < 1) || !(p->tau > 0) ||
	                    !isfinite(p->tau) || !isfinite(p->tau * p->tau))) {
		return false;
	}
	if ((unsigned)p->decay >= FB_LR_DECAY_COUNT_) {
		return false;
	}
	if (p->decay != FB_LR_DECAY_NONE &&
	    (!(p->lr_final >= 0 && p->lr_final <= 1) || p->rounds == 0)) {
		return false;
	}
	return true;
}

fb_err
fb_server_opt_alloc(const fb_server_opt_params *p, uint64_t count,
    fb_server_opt **out)
{
	fb_err rc = FB_OK;
	fb_server_opt *opt = NULL;

	*out = NULL;
	if (!params_ok(p) || count == 0 || count > SIZE_MAX / sizeof(float)) {
		rc = FB_EINVAL;
		goto out;
	}
	if ((opt = calloc(1, sizeof(*opt))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	opt->p = *p;
	opt->lr = fb_server_lr_at(p, 1);
	opt->count = count;
	if (p->kind != FB_SERVER_SGD &&
	    (opt->m = fb_alloc(count * sizeof(float))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if ((p->kind == FB_SERVER_ADAM || p->kind == FB_SERVER_YOGI) &&
	    (opt->v = fb_alloc(count * sizeof(float))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	fb_server_opt_reset(opt);
	*out = opt;
	opt = NULL;
out:
	fb_server_opt_free(opt);
	return rc;
}

void
fb_server_opt_free(fb_server_opt *opt)
{
	if (opt == NULL) {
		return;
	}
	fb_free(opt->m);
	fb_free(opt->v);
	free(opt);
}

void
fb_server_opt_reset(fb_server_opt *opt)
{
	if (opt->m != NULL) {
		memset(opt->m, 0, opt->count * sizeof(float));
	}
	if (opt->v != NULL) {
		float v0 = (float)(opt->p.tau * opt->p.tau);
		for (uint64_t j = 0; j < opt->count; j++) {
			opt->v[j] = v0;
		}
	}
}

void
fb_server_opt_set_round(fb_server_opt *opt, uint64_t round)
{
	opt->lr = fb_server_lr_at(&opt->p, round);
}

double
fb_server_opt_lr(const fb_server_opt *opt)
{
	return opt->lr;
}

void
fb_server_opt_state(fb_server_opt *opt, float **m, float **v)
{
	*m = opt->m;
	*v = opt->v;
}

/*
 * step_chunk applies the optimiser to the n coordinates starting at `first`,
 * whose aggregated update is D_j = sum[j] * k (k = scale / (W S)).
 */
static void
step_chunk(fb_server_opt *opt, const uint32_t *sum, double k, uint64_t first,
    uint64_t n, float *params)
{
	const fb_server_opt_params *p = &opt->p;
	float *x = params + first;
	float *m = opt->m != NULL ? opt->m + first : NULL;
	float *v = opt->v != NULL ? opt->v + first : NULL;
	double lr = opt->lr, b1 = p->beta1, b2 = p->beta2, tau = p->tau;

	switch (p->kind) {
	case FB_SERVER_SGD:
		for (uint64_t j = 0; j < n; j++) {
			double d = (double)(int32_t)sum[j] * k;
			x[j] = (float)((double)x[j] - lr * d);
		}
		break;
	case FB_SERVER_AVGM:
		for (uint64_t j = 0; j < n; j++) {
			double d = (double)(int32_t)sum[j] * k;
			double mj = b1 * (double)m[j] + d;
			m[j] = (float)mj;
			x[j] = (float)((double)x[j] - lr * mj);
		}
		break;
	case FB_SERVER_ADAM:
	case FB_SERVER_YOGI:
		for (uint64_t j = 0; j < n; j++) {
			double d = (double)(int32_t)sum[j] * k;
			double d2 = d * d;
			double mj = b1 * (double)m[j] + (1 - b1) * d;
			double vj = (double)v[j];
			if (p->kind == FB_SERVER_ADAM) {
				vj = b2 * vj + (1 - b2) * d2;
			} else {
				double s = vj > d2 ? 1.0 : vj < d2 ? -1.0 : 0.0;
				vj -= (1 - b2) * d2 * s;
			}
			m[j] = (float)mj;
			v[j] = (float)vj;
			double step = lr * mj / (sqrt(vj) + tau);
			x[j] = (float)((double)x[j] - step);
		}
		break;
	default:
		FB_ASSERT(!"unknown server optimiser");
	}
}

fb_err
fb_server_opt_step_chunks(fb_server_opt *opt, const fb_accum *a,
    float *params, double scale, uint32_t first_chunk, uint32_t chunks)
{
	fb_err rc = FB_OK;

	if (!(scale > 0) || !isfinite(scale) || a->count != opt->count ||
	    first_chunk > a->chunks || chunks > a->chunks - first_chunk) {
		rc = FB_EINVAL;
		goto out;
	}
	for (uint32_t c = first_chunk; c < first_chunk + chunks; c++) {
		double inv = chunk_inv(a, c);
		uint64_t first = (uint64_t)c * a->chunk_elems;
		if (inv == 0) {
			continue; /* nobody reported: params and state stay */
		}
		step_chunk(opt, a->sum + first, scale * inv, first,
		    fb_accum_chunk_len(a, c), params);
	}
out:
	return rc;
}

fb_err
fb_server_opt_step(fb_server_opt *opt, const fb_accum *a, float *params,
    double scale)
{
	return fb_server_opt_step_chunks(opt, a, params, scale, 0, a->chunks);
}

/* ---- rule names --------------------------------------------------------- */

fb_err
fb_rule_parse(const char *name, fb_rule *rule)
{
	fb_err rc = FB_EINVAL;

	*rule = FB_RULE_FEDAVG;
	if (name == NULL) {
		goto out;
	}
	for (int i = 0; fb_rule_names[i] != NULL; i++) {
		if (strcmp(name, fb_rule_names[i]) == 0) {
			*rule = (fb_rule)i;
			rc = FB_OK;
			goto out;
		}
	}
out:
	return rc;
}

fb_server_opt_kind
fb_rule_server_kind(fb_rule rule)
{
	switch (rule) {
	case FB_RULE_FEDAVGM:
		return FB_SERVER_AVGM;
	case FB_RULE_FEDADAM:
		return FB_SERVER_ADAM;
	case FB_RULE_FEDYOGI:
		return FB_SERVER_YOGI;
	default:
		return FB_SERVER_SGD;
	}
}

bool
fb_rule_is_fednova(fb_rule rule)
{
	return rule == FB_RULE_FEDNOVA;
}
