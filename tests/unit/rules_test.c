/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rules_test.c -- unit tests of aggregation/rules.c: FedNova's normaliser
 * and the server optimisers (FedAvg, FedAvgM, FedAdam, FedYogi, and FedNova
 * composed with them) against known answers from an independent numpy
 * reference (tests/vectors/rules.txt, written by tests/gen/rules_vectors.py),
 * held to aggregation.h's quantisation bound carried through each rule's
 * state plus the float32 rounding of params and state; the normaliser
 * checked against the local recurrence itself; the server learning rate's
 * schedule against the reference's long double table; and the contract:
 * zero-weight chunks, state across rounds, names, bad arguments.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "common/util.h"
#include "tests/unit/accum_read.h"
#include "tests/unit/harness.h"

#define VECTORS "tests/vectors/rules.txt"
#define MAX_ANORM 64

/* ---- the known-answer file ---------------------------------------------- */

typedef struct rworker {
	uint64_t n;
	uint64_t tau;
	double a_norm;
	uint32_t sent; /* chunks 0 .. sent-1 were sent */
	double p;
	float *update; /* nova only */
	float *send;
} rworker;

typedef struct rround {
	rworker *w; /* k */
	double lr;  /* the reference's server lr of this round */
	double tau_eff;
	double *expect;
} rround;

typedef struct rcase {
	char name[96];
	char kind[16];
	int nova;
	uint64_t n, chunk;
	double clip;
	uint32_t k, rounds;
	double server[4]; /* lr beta1 beta2 tau */
	char decay[16];   /* the lr schedule: none, cosine */
	double lr_final;
	uint64_t lr_rounds;
	double local[3];  /* lr momentum mu */
	float *model;
	rround *r;
} rcase;

typedef struct anorm_row {
	uint64_t tau;
	double rho, lr, mu, norm;
} anorm_row;

typedef struct lrsched_row {
	char decay[16];
	double lr, f, want;
	uint64_t rounds, t;
} lrsched_row;

typedef struct vfile {
	rcase *cases;
	size_t ncases;
	anorm_row anorm[MAX_ANORM];
	size_t nanorm;
	lrsched_row lrsched[MAX_ANORM];
	size_t nlrsched;
} vfile;

static void
parse_doubles(char *rest, double *out, uint64_t count)
{
	char *save = NULL;
	uint64_t i = 0;
	for (char *t = strtok_r(rest, " \n", &save); t != NULL;
	     t = strtok_r(NULL, " \n", &save)) {
		char *end;
		assert_true(i < count);
		out[i++] = strtod(t, &end);
		assert_true(*end == '\0');
	}
	assert_int_equal(i, count);
}

static float *
parse_floats(char *rest, uint64_t count)
{
	double *d = calloc(count, sizeof(*d));
	float *f = calloc(count, sizeof(*f));
	assert_true(d != NULL && f != NULL);
	parse_doubles(rest, d, count);
	for (uint64_t i = 0; i < count; i++) {
		f[i] = (float)d[i];
		assert_true((double)f[i] == d[i]); /* written exactly */
	}
	free(d);
	return f;
}

static void
rcase_fini(rcase *c)
{
	for (uint32_t r = 0; c->r != NULL && r < c->rounds; r++) {
		for (uint32_t i = 0; c->r[r].w != NULL && i < c->k; i++) {
			free(c->r[r].w[i].update);
			free(c->r[r].w[i].send);
		}
		free(c->r[r].w);
		free(c->r[r].expect);
	}
	free(c->r);
	free(c->model);
	memset(c, 0, sizeof(*c));
}

static void
vfile_free(vfile *v)
{
	for (size_t i = 0; i < v->ncases; i++) {
		rcase_fini(&v->cases[i]);
	}
	free(v->cases);
	free(v);
}

/* load_vectors reads the whole file; the caller frees with vfile_free. */
static vfile *
load_vectors(void)
{
	FILE *fp = fopen(VECTORS, "r");
	char *line = NULL;
	size_t cap = 0;
	vfile *v = calloc(1, sizeof(*v));
	rcase *c = NULL;
	rround *rr = NULL;
	rworker *w = NULL;
	uint32_t nround = 0, nworker = 0;

	assert_non_null(v);
	if (fp == NULL) {
		fail_msg("cannot open %s (tests run from the repo root)",
		    VECTORS);
	}
	while (getline(&line, &cap, fp) > 0) {
		char *sp = strchr(line, ' ');
		char *rest = sp != NULL ? sp + 1 : line + strlen(line);
		if (line[0] == '#' || line[0] == '\n') {
			continue;
		}
		if (strncmp(line, "anorm ", 6) == 0) {
			unsigned long long tau;
			anorm_row *a = &v->anorm[v->nanorm];
			assert_true(v->nanorm < MAX_ANORM);
			assert_int_equal(sscanf(rest, "%llu %lf %lf %lf %lf",
			                     &tau, &a->rho, &a->lr, &a->mu,
			                     &a->norm),
			    5);
			a->tau = tau;
			v->nanorm++;
		} else if (strncmp(line, "lrsched ", 8) == 0) {
			unsigned long long rounds, t;
			lrsched_row *l = &v->lrsched[v->nlrsched];
			assert_true(v->nlrsched < MAX_ANORM);
			assert_int_equal(sscanf(rest, "%15s %lf %lf %llu %llu %lf",
			                     l->decay, &l->lr, &l->f, &rounds, &t,
			                     &l->want),
			    6);
			l->rounds = rounds;
			l->t = t;
			v->nlrsched++;
		} else if (strncmp(line, "case ", 5) == 0) {
			v->cases = realloc(v->cases,
			    (v->ncases + 1) * sizeof(*v->cases));
			assert_non_null(v->cases);
			c = &v->cases[v->ncases++];
			memset(c, 0, sizeof(*c));
			assert_int_equal(sscanf(rest, "%95s %15s %d", c->name,
			                     c->kind, &c->nova),
			    3);
			strcpy(c->decay, "none");
			c->lr_rounds = 1;
			nround = 0;
		} else if (strncmp(line, "dims ", 5) == 0) {
			unsigned long long n, ch;
			assert_non_null(c);
			assert_int_equal(sscanf(rest, "%llu %llu %lf %u %u", &n,
			                     &ch, &c->clip, &c->k, &c->rounds),
			    5);
			c->n = n;
			c->chunk = ch;
			c->r = calloc(c->rounds, sizeof(*c->r));
			assert_non_null(c->r);
		} else if (strncmp(line, "server ", 7) == 0) {
			parse_doubles(rest, c->server, 4);
		} else if (strncmp(line, "schedule ", 9) == 0) {
			unsigned long long rounds;
			assert_non_null(c);
			assert_int_equal(sscanf(rest, "%15s %lf %llu", c->decay,
			                     &c->lr_final, &rounds),
			    3);
			c->lr_rounds = rounds;
		} else if (strncmp(line, "lr ", 3) == 0) {
			assert_non_null(rr);
			parse_doubles(rest, &rr->lr, 1);
		} else if (strncmp(line, "local ", 6) == 0) {
			parse_doubles(rest, c->local, 3);
		} else if (strncmp(line, "model ", 6) == 0) {
			c->model = parse_floats(rest, c->n);
		} else if (strncmp(line, "round ", 6) == 0) {
			assert_true(nround < c->rounds);
			rr = &c->r[nround++];
			rr->w = calloc(c->k, sizeof(*rr->w));
			rr->expect = calloc(c->n, sizeof(*rr->expect));
			assert_true(rr->w != NULL && rr->expect != NULL);
			nworker = 0;
		} else if (strncmp(line, "worker ", 7) == 0) {
			unsigned long long n, tau;
			assert_true(rr != NULL && nworker < c->k);
			w = &rr->w[nworker++];
			assert_int_equal(sscanf(rest, "%llu %llu %lf %u", &n,
			                     &tau, &w->a_norm, &w->sent),
			    4);
			w->n = n;
			w->tau = tau;
		} else if (strncmp(line, "weight ", 7) == 0) {
			parse_doubles(rest, &w->p, 1);
		} else if (strncmp(line, "update ", 7) == 0) {
			w->update = parse_floats(rest, c->n);
		} else if (strncmp(line, "send ", 5) == 0) {
			w->send = parse_floats(rest, c->n);
		} else if (strncmp(line, "taueff ", 7) == 0) {
			assert_int_equal(nworker, c->k);
			parse_doubles(rest, &rr->tau_eff, 1);
		} else if (strncmp(line, "expect ", 7) == 0) {
			parse_doubles(rest, rr->expect, c->n);
		} else if (strncmp(line, "end", 3) == 0) {
			assert_int_equal(nround, c->rounds);
			c = NULL;
		} else {
			fail_msg("%s: unknown line: %.40s", VECTORS, line);
		}
	}
	free(line);
	fclose(fp);
	assert_true(v->ncases > 0 && v->nanorm > 0 && v->nlrsched > 0);
	return v;
}

/* ---- helpers ------------------------------------------------------------ */

/* ulpf is the float32 spacing at |v|: a bound on one float rounding. */
static double
ulpf(double v)
{
	float f = (float)fabs(v);
	return (double)nextafterf(f, INFINITY) - (double)f;
}

static fb_server_lr_decay
decay_of(const char *name)
{
	fb_server_lr_decay d = FB_LR_DECAY_COUNT_;

	for (int i = 0; fb_server_lr_decay_names[i] != NULL; i++) {
		if (strcmp(name, fb_server_lr_decay_names[i]) == 0) {
			d = (fb_server_lr_decay)i;
		}
	}
	if (d == FB_LR_DECAY_COUNT_) {
		fail_msg("unknown lr schedule %s", name);
	}
	return d;
}

static fb_server_opt_kind
kind_of(const char *name)
{
	static const char *const names[] = {"sgd", "avgm", "adam", "yogi"};
	for (int i = 0; i < 4; i++) {
		if (strcmp(name, names[i]) == 0) {
			return (fb_server_opt_kind)i;
		}
	}
	fail_msg("unknown optimiser kind %s", name);
	return FB_SERVER_SGD;
}

static double
rel_diff(double a, double b)
{
	return fabs(a - b) / fmax(fabs(b), DBL_MIN);
}

/* ---- known answers ------------------------------------------------------ */

/*
 * Carries an error bound per coordinate through the rule: the mean is
 * within K * clip / (2^30 * W) (aggregation.h) of the reference's, times
 * scale; each state and parameter store rounds to float32 (one ulp); m, v
 * and x then propagate those errors as the update rules do. Returns the
 * largest error / bound seen.
 */
static double
check_case(const rcase *c)
{
	fb_server_opt_params sp;
	fb_server_opt *opt = NULL;
	fb_accum *a = NULL;
	uint32_t nchunks;
	uint64_t n = c->n;
	float *x = malloc(n * sizeof(*x));
	float *prev_x = malloc(n * sizeof(*prev_x));
	float *prev_m = malloc(n * sizeof(*prev_m));
	float *prev_v = malloc(n * sizeof(*prev_v));
	float *buf = malloc(n * sizeof(*buf));
	float *meanf = malloc(n * sizeof(*meanf));
	double *ex = calloc(n, sizeof(*ex));
	double *em = calloc(n, sizeof(*em));
	double *ev = calloc(n, sizeof(*ev));
	double *p = calloc(c->k, sizeof(*p));
	double *an = calloc(c->k, sizeof(*an));
	uint64_t *counts = calloc(c->k, sizeof(*counts));
	uint32_t *senders;
	float *m, *v;
	double worst = 0;

	assert_true(x && prev_x && prev_m && prev_v && buf && meanf && ex &&
	    em && ev && p && an && counts);
	fb_server_opt_params_default(&sp, kind_of(c->kind));
	sp.lr = c->server[0];
	sp.beta1 = c->server[1];
	sp.beta2 = c->server[2];
	sp.tau = c->server[3];
	sp.decay = decay_of(c->decay);
	sp.lr_final = c->lr_final;
	sp.rounds = c->lr_rounds;
	assert_int_equal(fb_server_opt_alloc(&sp, n, &opt), FB_OK);
	assert_int_equal(fb_accum_alloc(n, c->chunk, c->clip, &a), FB_OK);
	nchunks = fb_accum_chunk_count(a);
	senders = calloc(nchunks, sizeof(*senders));
	assert_non_null(senders);
	fb_server_opt_state(opt, &m, &v);
	memcpy(x, c->model, n * sizeof(*x));
	for (uint64_t j = 0; j < n; j++) {
		ev[j] = ulpf(sp.tau * sp.tau); /* v starts at float(tau^2) */
	}

	for (uint32_t r = 0; r < c->rounds; r++) {
		const rround *rr = &c->r[r];
		double tau_eff = 1.0, tau_rel = 0.0;

		for (uint32_t i = 0; i < c->k; i++) {
			counts[i] = rr->w[i].n;
		}
		assert_int_equal(fb_fedavg_weights(counts, c->k, p), FB_OK);
		for (uint32_t i = 0; i < c->k; i++) {
			const rworker *w = &rr->w[i];
			assert_true(rel_diff(p[i], w->p) <= 2 * DBL_EPSILON);
			if (!c->nova) {
				continue;
			}
			assert_int_equal(fb_fednova_a_norm(w->tau, c->local[1],
			                     c->local[0], c->local[2], &an[i]),
			    FB_OK);
			if (rel_diff(an[i], w->a_norm) > 1e-12) {
				fail_msg("%s: a_norm(%llu) %.17g want %.17g",
				    c->name, (unsigned long long)w->tau, an[i],
				    w->a_norm);
			}
			/* the worker's own d_i: the reference's within 1 ulp */
			memcpy(buf, w->update, n * sizeof(*buf));
			assert_int_equal(
			    fb_fednova_normalise(buf, n, an[i]), FB_OK);
			for (uint64_t j = 0; j < n; j++) {
				assert_true(fabs((double)buf[j] - w->send[j]) <=
				    ulpf(w->send[j]));
			}
		}
		if (c->nova) {
			assert_int_equal(
			    fb_fednova_tau_eff(p, an, c->k, &tau_eff), FB_OK);
			tau_rel = rel_diff(tau_eff, rr->tau_eff);
			assert_true(tau_rel <= 1e-12);
		}

		fb_accum_reset(a);
		memset(senders, 0, nchunks * sizeof(*senders));
		for (uint32_t i = 0; i < c->k; i++) {
			const rworker *w = &rr->w[i];
			for (uint32_t ch = 0; ch < w->sent; ch++) {
				assert_int_equal(fb_accum_add(a, ch,
				                     w->send + ch * c->chunk,
				                     p[i], NULL),
				    FB_OK);
				senders[ch]++;
			}
		}
		for (uint32_t ch = 0; ch < nchunks; ch++) {
			assert_int_equal(fb_accum_mean_chunk(a, ch,
			                     meanf + ch * c->chunk),
			    FB_OK);
		}
		memcpy(prev_x, x, n * sizeof(*x));
		if (m != NULL) {
			memcpy(prev_m, m, n * sizeof(*m));
		}
		if (v != NULL) {
			memcpy(prev_v, v, n * sizeof(*v));
		}
		/* this round's server lr: the reference's */
		fb_server_opt_set_round(opt, r + 1);
		if (rel_diff(fb_server_opt_lr(opt), rr->lr) > 1e-14) {
			fail_msg("%s round %u: server lr %.17g want %.17g",
			    c->name, r, fb_server_opt_lr(opt), rr->lr);
		}
		assert_int_equal(fb_server_opt_step(opt, a, x, tau_eff), FB_OK);

		for (uint64_t j = 0; j < n; j++) {
			uint32_t ch = (uint32_t)(j / c->chunk);
			double wsum = fb_accum_chunk_weight(a, ch);
			double lr = fb_server_opt_lr(opt), b1 = sp.beta1,
			       b2 = sp.beta2;
			double d, dabs, ed, err, bound;

			if (senders[ch] == 0) {
				/* nobody sent it: untouched, bit for bit */
				assert_true(x[j] == prev_x[j]);
				assert_true(m == NULL || m[j] == prev_m[j]);
				assert_true(v == NULL || v[j] == prev_v[j]);
			} else {
				d = tau_eff * (double)meanf[j];
				ed = tau_eff * senders[ch] * c->clip /
				        (ldexp(1.0, 30) * wsum) +
				    (tau_rel + 8 * DBL_EPSILON) * fabs(d);
				/* |D|, allowing for the mean's rounding */
				dabs = fabs(d) + tau_eff * ulpf(meanf[j]) + ed;
				switch (sp.kind) {
				case FB_SERVER_SGD:
					ex[j] += lr * ed;
					break;
				case FB_SERVER_AVGM:
					em[j] = b1 * em[j] + ed + ulpf(m[j]);
					ex[j] += lr * em[j];
					break;
				default: {
					double e2 = 2 * dabs * ed + ed * ed;
					em[j] = b1 * em[j] + (1 - b1) * ed +
					    ulpf(m[j]);
					if (sp.kind == FB_SERVER_YOGI) {
						/* no sign flip in the bound */
						double gap = fabs(
						    (double)prev_v[j] - d * d);
						assert_true(gap > 2 * (ev[j] +
						    e2 + 2 * dabs * tau_eff *
						    ulpf(meanf[j])));
						ev[j] += (1 - b2) * e2 +
						    ulpf(v[j]);
					} else {
						ev[j] = b2 * ev[j] +
						    (1 - b2) * e2 + ulpf(v[j]);
					}
					double vlo = fmax((double)v[j] - ev[j],
					    0.0);
					double sv = sqrt(vlo) + sp.tau;
					double dsq = ev[j] /
					    (sqrt((double)v[j]) + sqrt(vlo));
					double mhi = fabs((double)m[j]) + em[j];
					ex[j] += lr * (em[j] / sv +
					    mhi * dsq / (sv * sv) +
					    8 * DBL_EPSILON * mhi / sv);
					break;
				}
				}
				ex[j] += ulpf(x[j]);
			}
			err = fabs((double)x[j] - rr->expect[j]);
			bound = ex[j] * (1 + 1e-9) + 4 * DBL_EPSILON *
			    fabs(rr->expect[j]);
			worst = fmax(worst, err / fmax(bound, DBL_MIN));
			if (err > bound) {
				fail_msg("%s round %u [%llu]: x %.9g want "
				         "%.17g (err %.3g, bound %.3g)",
				    c->name, r, (unsigned long long)j,
				    (double)x[j], rr->expect[j], err, bound);
			}
		}
	}
	fb_server_opt_free(opt);
	fb_accum_free(a);
	free(senders);
	free(x);
	free(prev_x);
	free(prev_m);
	free(prev_v);
	free(buf);
	free(meanf);
	free(ex);
	free(em);
	free(ev);
	free(p);
	free(an);
	free(counts);
	return worst;
}

static void
test_vectors_within_bound(void **state)
{
	vfile *v = load_vectors();
	bool seen[FB_SERVER_KIND_COUNT_] = {false};
	bool nova = false;

	for (size_t i = 0; i < v->ncases; i++) {
		double worst = check_case(&v->cases[i]);
		printf("  %-40s error/bound %.3f\n", v->cases[i].name, worst);
		seen[kind_of(v->cases[i].kind)] = true;
		nova |= v->cases[i].nova != 0;
	}
	for (int k = 0; k < FB_SERVER_KIND_COUNT_; k++) {
		assert_true(seen[k]);
	}
	assert_true(nova);
	vfile_free(v);
}

/* The schedule alone, against the reference's long double values: the
 * first round at lr, the last just above lr * f, past the end lr * f. */
static void
test_lr_schedule_matches_reference(void **state)
{
	vfile *v = load_vectors();
	bool cosine = false;

	for (size_t i = 0; i < v->nlrsched; i++) {
		const lrsched_row *l = &v->lrsched[i];
		fb_server_opt_params sp;
		double got;

		fb_server_opt_params_default(&sp, FB_SERVER_AVGM);
		sp.lr = l->lr;
		sp.decay = decay_of(l->decay);
		sp.lr_final = l->f;
		sp.rounds = l->rounds;
		got = fb_server_lr_at(&sp, l->t);
		cosine |= sp.decay == FB_LR_DECAY_COSINE;
		/* relative where it can be; an exact 0 must come out 0 */
		if (l->want == 0 ? got != 0
		                 : rel_diff(got, l->want) > 4 * DBL_EPSILON) {
			fail_msg("lr_at(%s, lr %g, f %g, R %llu, t %llu) = "
			         "%.17g, want %.17g", l->decay, l->lr, l->f,
			    (unsigned long long)l->rounds,
			    (unsigned long long)l->t, got, l->want);
		}
	}
	assert_true(cosine);
	vfile_free(v);
}

/* A scheduled optimiser steps round r exactly as a constant one whose lr is
 * the schedule's lr of round r; set_round changes the lr and nothing else. */
static void
test_scheduled_step_is_the_constant_step_at_its_lr(void **state)
{
	enum { N = 40, CHUNK = 16, ROUNDS = 5 };
	static float g[N], xs[N], xc[N];
	fb_accum *a = NULL;

	for (int j = 0; j < N; j++) {
		g[j] = (float)cos(j * 0.71) * 0.25f;
	}
	assert_int_equal(fb_accum_alloc(N, CHUNK, 1.0, &a), FB_OK);
	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		assert_int_equal(fb_accum_add(a, c, g + (uint64_t)c * CHUNK, 0.5,
		                     NULL),
		    FB_OK);
	}
	for (int k = 0; k < FB_SERVER_KIND_COUNT_; k++) {
		fb_server_opt_params ps, pc;
		fb_server_opt *os = NULL;
		float *ms, *vs;

		fb_server_opt_params_default(&ps, (fb_server_opt_kind)k);
		ps.decay = FB_LR_DECAY_COSINE;
		ps.lr_final = 0.05;
		ps.rounds = ROUNDS;
		assert_int_equal(fb_server_opt_alloc(&ps, N, &os), FB_OK);
		/* before any set_round: round 1's lr, the full one */
		assert_true(fb_server_opt_lr(os) == ps.lr);
		for (int j = 0; j < N; j++) {
			xs[j] = xc[j] = (float)j * 0.01f;
		}
		for (uint32_t r = 1; r <= ROUNDS + 1; r++) {
			fb_server_opt *oc = NULL;
			float *mc, *vc;

			/* a constant optimiser at round r's lr, given the
			 * scheduled one's state */
			pc = ps;
			pc.decay = FB_LR_DECAY_NONE;
			pc.lr = fb_server_lr_at(&ps, r);
			assert_true(pc.lr > 0 && pc.lr <= ps.lr);
			assert_int_equal(fb_server_opt_alloc(&pc, N, &oc), FB_OK);
			fb_server_opt_state(os, &ms, &vs);
			fb_server_opt_state(oc, &mc, &vc);
			if (ms != NULL) {
				memcpy(mc, ms, N * sizeof(*ms));
			}
			if (vs != NULL) {
				memcpy(vc, vs, N * sizeof(*vs));
			}
			fb_server_opt_set_round(os, r);
			assert_true(fb_server_opt_lr(os) == pc.lr);
			assert_int_equal(fb_server_opt_step(os, a, xs, 1.0), FB_OK);
			assert_int_equal(fb_server_opt_step(oc, a, xc, 1.0), FB_OK);
			assert_memory_equal(xs, xc, sizeof(xs));
			if (ms != NULL) {
				assert_memory_equal(ms, mc, N * sizeof(*ms));
			}
			fb_server_opt_free(oc);
		}
		/* past the end it stays at lr * f; the lr falls monotonically */
		assert_true(fb_server_lr_at(&ps, ROUNDS + 7) ==
		    ps.lr * ps.lr_final);
		for (uint32_t r = 1; r < ROUNDS; r++) {
			assert_true(fb_server_lr_at(&ps, r + 1) <
			    fb_server_lr_at(&ps, r));
		}
		fb_server_opt_free(os);
	}
	fb_accum_free(a);
}

static void
test_anorm_table(void **state)
{
	vfile *v = load_vectors();
	for (size_t i = 0; i < v->nanorm; i++) {
		const anorm_row *r = &v->anorm[i];
		double got = 0;
		assert_int_equal(fb_fednova_a_norm(r->tau, r->rho, r->lr, r->mu,
		                     &got),
		    FB_OK);
		if (rel_diff(got, r->norm) > 1e-12) {
			fail_msg("a_norm(%llu, %g, %g, %g) = %.17g, want %.17g",
			    (unsigned long long)r->tau, r->rho, r->lr, r->mu,
			    got, r->norm);
		}
	}
	vfile_free(v);
}

/* ---- the normaliser against the local recurrence ------------------------ */

/*
 * local_run runs tau steps of PyTorch SGD (v = rho v + g + mu (x - x0);
 * x -= lr v) on a scalar. The loss gradient at step s is h (x - c) when
 * impulse < 0 (a quadratic h/2 (x - c)^2), else 1 at step `impulse` and 0
 * elsewhere. Records the loss gradients in g (tau) when non-NULL; returns
 * x0 - x_tau.
 */
static double
local_run(uint64_t tau, double rho, double lr, double mu, double h, double c,
    int64_t impulse, double *g)
{
	/* x0 = 0 for impulses, so that x0 - x does not cancel */
	double x0 = impulse < 0 ? 0.75 : 0.0, x = x0, vel = 0;
	for (uint64_t s = 0; s < tau; s++) {
		double gs = impulse < 0 ? h * (x - c)
		                        : (double)((int64_t)s == impulse);
		if (g != NULL) {
			g[s] = gs;
		}
		vel = rho * vel + gs + mu * (x - x0);
		x -= lr * vel;
	}
	return x0 - x;
}

static void
test_anorm_matches_recurrence(void **state)
{
	static const double cfg[][3] = {
	    /* rho, lr, mu */
	    {0.0, 0.1, 0.0},
	    {0.9, 0.05, 0.0},
	    {0.99, 0.01, 0.0},
	    {0.0, 0.05, 0.1},
	    {0.0, 0.2, 4.0},
	    {0.9, 0.05, 0.1},
	    {0.9, 0.05, 0.5}, /* oscillating: some a_s < 0 */
	    {0.5, 0.2, 2.0},
	};
	static const uint64_t taus[] = {1, 2, 7, 33, 80};
	double a[80], g[80];
	bool negative_seen = false;

	for (size_t ci = 0; ci < FB_ARRAY_LEN(cfg); ci++) {
		double rho = cfg[ci][0], lr = cfg[ci][1], mu = cfg[ci][2];
		for (size_t ti = 0; ti < FB_ARRAY_LEN(taus); ti++) {
			uint64_t tau = taus[ti];
			double l1 = 0, got = 0, recon = 0, delta;
			for (uint64_t s = 0; s < tau; s++) {
				/* a_s by definition: the response to a unit
				 * loss gradient at step s */
				a[s] = local_run(tau, rho, lr, mu, 0, 0,
				           (int64_t)s, NULL) /
				    lr;
				l1 += fabs(a[s]);
				negative_seen |= a[s] < 0;
				/* the paper's closed forms where they exist */
				double left = (double)(tau - s);
				if (mu == 0) {
					double e = (1 - pow(rho, left)) /
					    (1 - rho);
					assert_true(rel_diff(a[s], e) <= 1e-12);
				} else if (rho == 0) {
					double e = pow(1 - lr * mu, left - 1);
					assert_true(rel_diff(a[s], e) <= 1e-12);
				}
			}
			assert_int_equal(fb_fednova_a_norm(tau, rho, lr, mu,
			                     &got),
			    FB_OK);
			if (rel_diff(got, l1) > 1e-12) {
				fail_msg("rho %g lr %g mu %g tau %llu: a_norm "
				         "%.17g, recurrence %.17g",
				    rho, lr, mu, (unsigned long long)tau, got,
				    l1);
			}
			/* a real run on a quadratic: update = lr sum a_s g_s */
			delta = local_run(tau, rho, lr, mu, 1.7, -2.0, -1, g);
			for (uint64_t s = 0; s < tau; s++) {
				recon += lr * a[s] * g[s];
			}
			assert_true(fabs(recon - delta) <=
			    1e-12 * (fabs(delta) + lr));
		}
	}
	assert_true(negative_seen);
}

/* ---- contract ----------------------------------------------------------- */

static void
fill_normal(fb_rng *rng, float *x, uint64_t n, double sd)
{
	for (uint64_t j = 0; j < n; j++) {
		x[j] = (float)(fb_rng_normal(rng) * sd);
	}
}

static void
add_all(fb_accum *a, const float *x, double w)
{
	uint64_t off = 0;
	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		uint64_t len = fb_accum_chunk_len(a, c);
		assert_int_equal(fb_accum_add(a, c, x + off, w, NULL), FB_OK);
		off += len;
	}
}

static void
test_fednova_equal_tau_is_fedavg(void **state)
{
	enum { K = 3, N = 40, CH = 16, TAU = 7 };
	static float u[K][N], d[K][N];
	uint64_t counts[K] = {120, 45, 300};
	double p[K], an[K], tau_eff = 0, clip = 8.0;
	float xa[N], xn[N];
	fb_accum *aa = NULL, *an_acc = NULL;
	fb_server_opt *opt = NULL;
	fb_server_opt_params sp;
	fb_rng rng;

	fb_rng_init(&rng, 11, 0);
	assert_int_equal(fb_fedavg_weights(counts, K, p), FB_OK);
	assert_int_equal(fb_accum_alloc(N, CH, clip, &aa), FB_OK);
	assert_int_equal(fb_accum_alloc(N, CH, clip, &an_acc), FB_OK);
	for (int i = 0; i < K; i++) {
		fill_normal(&rng, u[i], N, 1.0);
		memcpy(d[i], u[i], sizeof(d[i]));
		assert_int_equal(fb_fednova_a_norm(TAU, 0, 0.1, 0, &an[i]),
		    FB_OK);
		assert_true(an[i] == TAU);
		assert_int_equal(fb_fednova_normalise(d[i], N, an[i]), FB_OK);
		add_all(aa, u[i], p[i]);
		add_all(an_acc, d[i], p[i]);
	}
	assert_int_equal(fb_fednova_tau_eff(p, an, K, &tau_eff), FB_OK);
	assert_true(fabs(tau_eff - TAU) <= 4 * DBL_EPSILON * TAU);
	fill_normal(&rng, xa, N, 1.0);
	memcpy(xn, xa, sizeof(xn));
	fb_server_opt_params_default(&sp, FB_SERVER_SGD);
	sp.lr = 0.5;
	assert_int_equal(fb_server_opt_alloc(&sp, N, &opt), FB_OK);
	assert_int_equal(fb_server_opt_step(opt, aa, xa, 1.0), FB_OK);
	assert_int_equal(fb_server_opt_step(opt, an_acc, xn, tau_eff), FB_OK);
	for (int j = 0; j < N; j++) {
		double umax = 0;
		for (int i = 0; i < K; i++) {
			umax = fmax(umax, fabs(u[i][j]));
		}
		/* both quantisations (FedNova's scaled by tau), d_i's float
		 * rounding, and each result's float rounding */
		double tol = sp.lr * (1 + TAU) * K * clip / ldexp(1.0, 30) +
		    sp.lr * umax * ldexp(1.0, -23) + ulpf(xa[j]) + ulpf(xn[j]);
		assert_true(fabs((double)xa[j] - xn[j]) <= tol);
	}
	fb_server_opt_free(opt);
	fb_accum_free(aa);
	fb_accum_free(an_acc);
}

static void
test_zero_weight_chunks_untouched(void **state)
{
	enum { N = 20, CH = 8 };
	fb_server_opt_params sp;
	fb_server_opt *opt = NULL;
	fb_accum *a = NULL;
	float x[N], before_x[N], before_m[N], before_v[N], u[N];
	float *m, *v;
	fb_rng rng;

	fb_rng_init(&rng, 5, 0);
	for (int kind = 0; kind < FB_SERVER_KIND_COUNT_; kind++) {
		fb_server_opt_params_default(&sp, (fb_server_opt_kind)kind);
		assert_int_equal(fb_server_opt_alloc(&sp, N, &opt), FB_OK);
		assert_int_equal(fb_accum_alloc(N, CH, 4.0, &a), FB_OK);
		fb_server_opt_state(opt, &m, &v);
		fill_normal(&rng, x, N, 1.0);
		/* round 1: everyone sends everything (state moves) */
		fill_normal(&rng, u, N, 1.0);
		add_all(a, u, 1.0);
		assert_int_equal(fb_server_opt_step(opt, a, x, 1.0), FB_OK);
		/* round 2: only chunk 1 arrives */
		fb_accum_reset(a);
		fill_normal(&rng, u, N, 1.0);
		assert_int_equal(fb_accum_add(a, 1, u + CH, 0.5, NULL), FB_OK);
		memcpy(before_x, x, sizeof(x));
		if (m != NULL) {
			memcpy(before_m, m, sizeof(before_m));
		}
		if (v != NULL) {
			memcpy(before_v, v, sizeof(before_v));
		}
		assert_int_equal(fb_server_opt_step(opt, a, x, 1.0), FB_OK);
		for (int j = 0; j < N; j++) {
			bool inside = j >= CH && j < 2 * CH;
			assert_true((x[j] != before_x[j]) == inside);
			if (m != NULL) {
				assert_true((m[j] != before_m[j]) == inside);
			}
			if (v != NULL && !inside) {
				assert_true(v[j] == before_v[j]);
			}
		}
		fb_server_opt_free(opt);
		fb_accum_free(a);
	}
}

static void
test_state_persists_across_rounds(void **state)
{
	enum { N = 5 };
	fb_server_opt_params sp;
	fb_server_opt *opt = NULL;
	fb_accum *a = NULL;
	float x[N] = {0}, u[N] = {0.5f, -0.25f, 1.0f, -1.0f, 0.125f};
	float *m, *v;

	/* avgm: a steady D moves x by lr D, then lr (1 + beta) D */
	fb_server_opt_params_default(&sp, FB_SERVER_AVGM);
	sp.lr = 0.5;
	sp.beta1 = 0.5;
	assert_int_equal(fb_server_opt_alloc(&sp, N, &opt), FB_OK);
	fb_server_opt_state(opt, &m, &v);
	assert_non_null(m);
	assert_null(v);
	assert_int_equal(fb_accum_alloc(N, 2, 2.0, &a), FB_OK);
	add_all(a, u, 1.0);
	for (int r = 0; r < 2; r++) {
		assert_int_equal(fb_server_opt_step(opt, a, x, 1.0), FB_OK);
	}
	for (int j = 0; j < N; j++) {
		/* the values are exact in the ring: no quantisation here */
		assert_true(m[j] == 1.5f * u[j]);
		assert_true(x[j] == -0.5f * 2.5f * u[j]);
	}
	fb_server_opt_reset(opt);
	for (int j = 0; j < N; j++) {
		assert_true(m[j] == 0.0f);
	}
	fb_server_opt_free(opt);

	/* adam: m after two rounds is (1 - b1)(1 + b1) D, v from tau^2 */
	fb_server_opt_params_default(&sp, FB_SERVER_ADAM);
	assert_int_equal(fb_server_opt_alloc(&sp, N, &opt), FB_OK);
	fb_server_opt_state(opt, &m, &v);
	assert_true(m != NULL && v != NULL);
	for (int j = 0; j < N; j++) {
		assert_true(v[j] == (float)(sp.tau * sp.tau));
	}
	memset(x, 0, sizeof(x));
	for (int r = 0; r < 2; r++) {
		assert_int_equal(fb_server_opt_step(opt, a, x, 1.0), FB_OK);
	}
	for (int j = 0; j < N; j++) {
		double b1 = sp.beta1, b2 = sp.beta2, d = u[j];
		double em = (1 - b1) * (1 + b1) * d;
		double tau2 = sp.tau * sp.tau;
		double ev = b2 * b2 * tau2 + (1 - b2) * (1 + b2) * d * d;
		assert_true(fabs(m[j] - em) <= ulpf(em));
		assert_true(fabs(v[j] - ev) <= 2 * ulpf(ev));
	}
	fb_server_opt_reset(opt);
	for (int j = 0; j < N; j++) {
		assert_true(m[j] == 0.0f);
		assert_true(v[j] == (float)(sp.tau * sp.tau));
	}
	fb_server_opt_free(opt);
	fb_accum_free(a);
}

static void
test_mean_chunk_matches_mean(void **state)
{
	enum { N = 21, CH = 6 };
	fb_accum *a = NULL;
	float u[N], full[N], part[CH];
	fb_rng rng;

	fb_rng_init(&rng, 3, 0);
	assert_int_equal(fb_accum_alloc(N, CH, 4.0, &a), FB_OK);
	fill_normal(&rng, u, N, 1.0);
	for (uint32_t c = 0; c < 3; c++) { /* chunk 3 gets nothing */
		assert_int_equal(fb_accum_add(a, c, u + c * CH, 0.25, NULL),
		    FB_OK);
	}
	accum_mean(a, full);
	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		uint64_t len = fb_accum_chunk_len(a, c);
		assert_int_equal(fb_accum_mean_chunk(a, c, part), FB_OK);
		assert_memory_equal(part, full + c * CH, len * sizeof(float));
	}
	assert_true(full[N - 1] == 0.0f);
	assert_int_equal(fb_accum_mean_chunk(a, 4, part), FB_EINVAL);
	fb_accum_free(a);
}

static void
test_rule_names(void **state)
{
	fb_rule r;
	static const fb_server_opt_kind kinds[] = {FB_SERVER_SGD,
	    FB_SERVER_SGD, FB_SERVER_AVGM, FB_SERVER_ADAM, FB_SERVER_YOGI};

	assert_string_equal(fb_rule_names[FB_RULE_FEDAVG], "fedavg");
	assert_string_equal(fb_rule_names[FB_RULE_FEDNOVA], "fednova");
	assert_string_equal(fb_rule_names[FB_RULE_FEDAVGM], "fedavgm");
	assert_string_equal(fb_rule_names[FB_RULE_FEDADAM], "fedadam");
	assert_string_equal(fb_rule_names[FB_RULE_FEDYOGI], "fedyogi");
	assert_null(fb_rule_names[FB_RULE_COUNT_]);
	for (int i = 0; i < FB_RULE_COUNT_; i++) {
		assert_int_equal(fb_rule_parse(fb_rule_names[i], &r), FB_OK);
		assert_int_equal(r, i);
		assert_int_equal(fb_rule_server_kind(r), kinds[i]);
		assert_int_equal(fb_rule_is_fednova(r), i == FB_RULE_FEDNOVA);
	}
	assert_int_equal(fb_rule_parse("FedAvg", &r), FB_EINVAL);
	assert_int_equal(fb_rule_parse("fedavg ", &r), FB_EINVAL);
	assert_int_equal(fb_rule_parse("", &r), FB_EINVAL);
	assert_int_equal(fb_rule_parse(NULL, &r), FB_EINVAL);
	assert_int_equal(r, FB_RULE_FEDAVG);
}

static void
test_bad_arguments_rejected(void **state)
{
	fb_server_opt_params sp;
	fb_server_opt *opt = (fb_server_opt *)&sp; /* must be reset */
	fb_accum *a = NULL, *b = NULL;
	double norm = 1, te = 1, p[2] = {0.5, 0.5}, an[2] = {3, 4};
	float x[8] = {0};

	/* a_norm */
	assert_int_equal(fb_fednova_a_norm(0, 0, 0.1, 0, &norm), FB_EINVAL);
	assert_true(norm == 0);
	assert_int_equal(fb_fednova_a_norm(5, -0.1, 0.1, 0, &norm), FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, 1.0, 0.1, 0, &norm), FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, NAN, 0.1, 0, &norm), FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, 0, 0.1, -1, &norm), FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, 0, 0.1, INFINITY, &norm),
	    FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, 0, 0, 0.1, &norm), FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, 0, 10, 0.1, &norm), FB_EINVAL);
	assert_int_equal(fb_fednova_a_norm(5, 0.9, NAN, 0.1, &norm),
	    FB_EINVAL);
	/* lr is irrelevant without a proximal term */
	assert_int_equal(fb_fednova_a_norm(5, 0, 0, 0, &norm), FB_OK);
	assert_true(norm == 5);
	/* normalise, tau_eff */
	assert_int_equal(fb_fednova_normalise(x, 8, 0), FB_EINVAL);
	assert_int_equal(fb_fednova_normalise(x, 8, -2), FB_EINVAL);
	assert_int_equal(fb_fednova_normalise(x, 8, NAN), FB_EINVAL);
	assert_int_equal(fb_fednova_tau_eff(p, an, 0, &te), FB_EINVAL);
	assert_true(te == 0);
	p[1] = 0;
	assert_int_equal(fb_fednova_tau_eff(p, an, 2, &te), FB_EINVAL);
	p[1] = 0.5;
	an[0] = NAN;
	assert_int_equal(fb_fednova_tau_eff(p, an, 2, &te), FB_EINVAL);
	an[0] = 3;
	assert_int_equal(fb_fednova_tau_eff(p, an, 2, &te), FB_OK);
	assert_true(te == 3.5);
	/* optimiser parameters */
	fb_server_opt_params_default(&sp, FB_SERVER_ADAM);
	assert_int_equal(fb_server_opt_alloc(&sp, 0, &opt), FB_EINVAL);
	assert_null(opt);
	sp.lr = 0;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	sp.lr = INFINITY;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	fb_server_opt_params_default(&sp, FB_SERVER_ADAM);
	sp.beta1 = 1.0;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	fb_server_opt_params_default(&sp, FB_SERVER_YOGI);
	sp.beta2 = -0.5;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	fb_server_opt_params_default(&sp, FB_SERVER_ADAM);
	sp.tau = 0;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	sp.tau = NAN;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	fb_server_opt_params_default(&sp, FB_SERVER_AVGM);
	sp.beta1 = NAN;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	fb_server_opt_params_default(&sp, FB_SERVER_SGD);
	sp.kind = FB_SERVER_KIND_COUNT_;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	/* the lr schedule */
	fb_server_opt_params_default(&sp, FB_SERVER_AVGM);
	sp.decay = FB_LR_DECAY_COUNT_;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	sp.decay = FB_LR_DECAY_COSINE;
	sp.rounds = 0;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	sp.rounds = 40;
	sp.lr_final = -0.1;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	sp.lr_final = 1.5;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	sp.lr_final = NAN;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_EINVAL);
	assert_null(opt);
	/* without a schedule its fields are not read */
	sp.decay = FB_LR_DECAY_NONE;
	sp.rounds = 0;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_OK);
	fb_server_opt_free(opt);
	opt = NULL;
	/* sgd ignores the betas */
	fb_server_opt_params_default(&sp, FB_SERVER_SGD);
	sp.beta1 = 7;
	assert_int_equal(fb_server_opt_alloc(&sp, 8, &opt), FB_OK);
	/* step: wrong geometry or scale changes nothing */
	assert_int_equal(fb_accum_alloc(7, 4, 1.0, &a), FB_OK);
	assert_int_equal(fb_accum_alloc(8, 4, 1.0, &b), FB_OK);
	x[0] = 0.5f;
	assert_int_equal(fb_accum_add(b, 0, x, 1.0, NULL), FB_OK);
	assert_int_equal(fb_server_opt_step(opt, a, x, 1.0), FB_EINVAL);
	assert_int_equal(fb_server_opt_step(opt, b, x, 0), FB_EINVAL);
	assert_int_equal(fb_server_opt_step(opt, b, x, -1), FB_EINVAL);
	assert_int_equal(fb_server_opt_step(opt, b, x, NAN), FB_EINVAL);
	assert_int_equal(fb_server_opt_step(opt, b, x, INFINITY), FB_EINVAL);
	assert_true(x[0] == 0.5f);
	assert_int_equal(fb_server_opt_step(opt, b, x, 1.0), FB_OK);
	assert_true(x[0] == 0.0f);
	fb_server_opt_free(opt);
	fb_server_opt_free(NULL);
	fb_accum_free(a);
	fb_accum_free(b);
}

/* A step taken in disjoint chunk ranges (as threads take it) is bitwise
 * the whole step, for every server rule, over two rounds of state. */
static void
test_step_by_ranges_is_the_whole_step(void **state)
{
	enum { N = 1000, CHUNK = 64 };
	static float x[N], p1[N], p2[N];
	fb_accum *a = NULL;

	for (int j = 0; j < N; j++) {
		x[j] = (float)sin(j * 0.37) * 0.5f;
	}
	assert_int_equal(fb_accum_alloc(N, CHUNK, 1.0, &a), FB_OK);
	for (int k = 0; k < FB_SERVER_KIND_COUNT_; k++) {
		fb_server_opt_params op;
		fb_server_opt *o1 = NULL, *o2 = NULL;
		uint32_t nc = fb_accum_chunk_count(a);
		fb_server_opt_params_default(&op, (fb_server_opt_kind)k);
		assert_int_equal(fb_server_opt_alloc(&op, N, &o1), FB_OK);
		assert_int_equal(fb_server_opt_alloc(&op, N, &o2), FB_OK);
		for (int j = 0; j < N; j++) {
			p1[j] = p2[j] = (float)j * 0.01f;
		}
		for (int round = 0; round < 2; round++) {
			fb_accum_reset(a);
			for (uint32_t c = 0; c < nc; c++) {
				assert_int_equal(fb_accum_add(a, c,
				                     x + (uint64_t)c * CHUNK, 0.75, NULL),
				    FB_OK);
			}
			assert_int_equal(fb_server_opt_step(o1, a, p1, 1.5), FB_OK);
			/* ranges 3, 7, 5, ... out of order */
			for (uint32_t c0 = nc; c0 > 0;) {
				uint32_t len = c0 >= 3 ? 3 : c0;
				c0 -= len;
				assert_int_equal(fb_server_opt_step_chunks(o2, a, p2,
				                     1.5, c0, len),
				    FB_OK);
			}
			assert_memory_equal(p1, p2, sizeof(p1));
		}
		assert_int_equal(fb_server_opt_step_chunks(o2, a, p2, 1.5, nc, 1),
		    FB_EINVAL);
		assert_int_equal(fb_server_opt_step_chunks(o2, a, p2, 1.5,
		                     nc + 1, 0),
		    FB_EINVAL);
		fb_server_opt_free(o1);
		fb_server_opt_free(o2);
	}
	fb_accum_free(a);
}

FB_TESTS = {
	{"rules match the numpy reference within the quantisation bound",
	    test_vectors_within_bound},
	{"fednova normaliser matches the reference table", test_anorm_table},
	{"fednova normaliser matches the local sgd recurrence",
	    test_anorm_matches_recurrence},
	{"fednova with equal tau and no momentum equals fedavg",
	    test_fednova_equal_tau_is_fedavg},
	{"chunks with zero weight leave params and state untouched",
	    test_zero_weight_chunks_untouched},
	{"server state persists across rounds until reset",
	    test_state_persists_across_rounds},
	{"mean by chunk equals the full mean", test_mean_chunk_matches_mean},
	{"a step taken in chunk ranges is bitwise the whole step",
	    test_step_by_ranges_is_the_whole_step},
	{"rule names parse and pick their server optimiser", test_rule_names},
	{"server lr schedule matches the reference table",
	    test_lr_schedule_matches_reference},
	{"a scheduled step is the constant step at its round's lr",
	    test_scheduled_step_is_the_constant_step_at_its_lr},
	{"bad arguments are rejected", test_bad_arguments_rejected},
	{NULL, NULL},
};

FB_TEST_MAIN("rules")
