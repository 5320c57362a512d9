/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aggregation_test.c -- unit tests of aggregation/: the fixed-point
 * streaming accumulator against known answers from an independent numpy
 * reference (tests/vectors/fedavg.txt, written by tests/gen/
 * fedavg_vectors.py), held to the quantisation bound that aggregation.h
 * documents, and its contract: order independence, chunking, refusal of
 * NaN/Inf and of weight sums above 1, clipping counts, per-chunk weights,
 * apply, reset, large-magnitude stress and fb_fedavg_weights, and adds
 * from many threads at once into the same chunks.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "common/util.h"
#include "tests/unit/accum_read.h"
#include "tests/unit/harness.h"

#define VECTORS "tests/vectors/fedavg.txt"

/* ---- the known-answer file ---------------------------------------------- */

typedef struct vcase {
	char name[96];
	char kind[32];
	uint32_t k;
	uint64_t n;
	uint64_t chunk;
	double clip;
	double lr;
	uint64_t *counts; /* NULL when the weights are given directly */
	double *w;
	float *x; /* k * n, update i at x + i * n */
	float *model;
	uint64_t clipped;
	double *mean;
	double *applied;
} vcase;

static void
vcase_fini(vcase *c)
{
	free(c->counts);
	free(c->w);
	free(c->x);
	free(c->model);
	free(c->mean);
	free(c->applied);
	memset(c, 0, sizeof(*c));
}

/* Parses `count` numbers after the keyword into doubles. */
static void
parse_doubles(char *rest, double *out, uint64_t count)
{
	char *save = NULL;
	uint64_t i = 0;
	for (char *t = strtok_r(rest, " \n", &save); t != NULL;
	     t = strtok_r(NULL, " \n", &save)) {
		assert_true(i < count);
		char *end;
		out[i++] = strtod(t, &end);
		assert_true(*end == '\0');
	}
	assert_int_equal(i, count);
}

static void
parse_floats(char *rest, float *out, uint64_t count)
{
	double *d = calloc(count, sizeof(*d));
	assert_non_null(d);
	parse_doubles(rest, d, count);
	for (uint64_t i = 0; i < count; i++) {
		out[i] = (float)d[i];
		/* float32 values must be written exactly */
		assert_true((double)out[i] == d[i]);
	}
	free(d);
}

/* load_cases reads every case of the vector file; the caller frees. */
static vcase *
load_cases(size_t *ncases)
{
	FILE *fp = fopen(VECTORS, "r");
	char *line = NULL;
	size_t cap = 0;
	vcase *cases = NULL, *c = NULL;
	size_t n = 0;
	uint32_t updates = 0;

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
		if (strncmp(line, "case ", 5) == 0) {
			cases = realloc(cases, (n + 1) * sizeof(*cases));
			assert_non_null(cases);
			c = &cases[n++];
			memset(c, 0, sizeof(*c));
			assert_int_equal(
			    sscanf(rest, "%95s %31s", c->name, c->kind), 2);
			updates = 0;
			continue;
		}
		assert_non_null(c);
		if (strncmp(line, "dims ", 5) == 0) {
			unsigned long long nn, ch;
			assert_int_equal(sscanf(rest, "%u %llu %llu %lf %lf",
			                     &c->k, &nn, &ch, &c->clip, &c->lr),
			    5);
			c->n = nn;
			c->chunk = ch;
			c->w = calloc(c->k, sizeof(*c->w));
			c->x = calloc(c->k * c->n, sizeof(*c->x));
			c->model = calloc(c->n, sizeof(*c->model));
			c->mean = calloc(c->n, sizeof(*c->mean));
			c->applied = calloc(c->n, sizeof(*c->applied));
			assert_true(c->w && c->x && c->model && c->mean &&
			    c->applied);
		} else if (strncmp(line, "counts ", 7) == 0) {
			if (rest[0] != '-') {
				char *save = NULL;
				uint32_t i = 0;
				c->counts = calloc(c->k, sizeof(*c->counts));
				assert_non_null(c->counts);
				for (char *t = strtok_r(rest, " \n", &save);
				     t != NULL; t = strtok_r(NULL, " \n", &save)) {
					assert_true(i < c->k);
					c->counts[i++] = strtoull(t, NULL, 10);
				}
				assert_int_equal(i, c->k);
			}
		} else if (strncmp(line, "weights ", 8) == 0) {
			parse_doubles(rest, c->w, c->k);
		} else if (strncmp(line, "update ", 7) == 0) {
			assert_true(updates < c->k);
			parse_floats(rest, c->x + updates * c->n, c->n);
			updates++;
		} else if (strncmp(line, "model ", 6) == 0) {
			parse_floats(rest, c->model, c->n);
		} else if (strncmp(line, "clipped ", 8) == 0) {
			c->clipped = strtoull(rest, NULL, 10);
		} else if (strncmp(line, "mean ", 5) == 0) {
			parse_doubles(rest, c->mean, c->n);
		} else if (strncmp(line, "applied ", 8) == 0) {
			parse_doubles(rest, c->applied, c->n);
		} else if (strncmp(line, "end", 3) == 0) {
			assert_int_equal(updates, c->k);
			c = NULL;
		} else {
			fail_msg("%s: unknown line: %.40s", VECTORS, line);
		}
	}
	free(line);
	fclose(fp);
	assert_true(n > 0);
	*ncases = n;
	return cases;
}

static void
free_cases(vcase *cases, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		vcase_fini(&cases[i]);
	}
	free(cases);
}

/* ---- helpers ------------------------------------------------------------ */

/* Half the float32 spacing at |v|: the rounding of a float result. */
static double
half_ulpf(double v)
{
	float f = (float)fabs(v);
	return 0.5 * ((double)nextafterf(f, INFINITY) - (double)f);
}

/*
 * quant_bound is aggregation.h's bound for one coordinate: K * clip /
 * (2^30 * W), W the chunk's weight sum, plus the float32 rounding of the
 * result (at the larger of the two values compared) and a few double
 * roundings.
 */
static double
quant_bound(uint32_t k, double clip, double w, double expect, double got)
{
	double m = fmax(fabs(expect), fabs(got));
	return (double)k * clip / (ldexp(1.0, 30) * w) + half_ulpf(m) +
	    8 * DBL_EPSILON * m;
}

/* add_update adds every chunk of update `x` (count floats) with weight w. */
static void
add_update(fb_accum *a, const float *x, double w, uint64_t *clipped)
{
	uint64_t off = 0;
	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		uint64_t len = fb_accum_chunk_len(a, c);
		/* a copy of exactly the chunk's size, so ASan sees overreads */
		float *chunk = malloc(len * sizeof(*chunk));
		assert_non_null(chunk);
		memcpy(chunk, x + off, len * sizeof(*chunk));
		assert_int_equal(fb_accum_add(a, c, chunk, w, clipped), FB_OK);
		free(chunk);
		off += len;
	}
}

/* Checks a case: mean and apply against the reference, within the bound.
 * Returns the largest error / bound seen. */
static double
check_case(const vcase *c, bool assert_bound)
{
	fb_accum *a = NULL;
	float *mean = calloc(c->n, sizeof(*mean));
	float *params = calloc(c->n, sizeof(*params));
	uint64_t clipped = 0;
	double worst = 0;

	assert_true(mean && params);
	assert_int_equal(fb_accum_alloc(c->n, c->chunk, c->clip, &a), FB_OK);
	if (c->counts != NULL) {
		double *w = calloc(c->k, sizeof(*w));
		assert_non_null(w);
		assert_int_equal(fb_fedavg_weights(c->counts, c->k, w), FB_OK);
		for (uint32_t i = 0; i < c->k; i++) {
			/* n_i / sum(n): numpy and C must agree to an ulp */
			assert_true(fabs(w[i] - c->w[i]) <=
			    2 * DBL_EPSILON * c->w[i]);
		}
		free(w);
	}
	for (uint32_t i = 0; i < c->k; i++) {
		add_update(a, c->x + (uint64_t)i * c->n, c->w[i], &clipped);
	}
	if (assert_bound) {
		assert_int_equal(clipped, c->clipped);
	}
	accum_mean(a, mean);
	memcpy(params, c->model, c->n * sizeof(*params));
	accum_sgd_step(a, params, c->lr);
	for (uint64_t j = 0; j < c->n; j++) {
		uint32_t ch = (uint32_t)(j / c->chunk);
		double w = fb_accum_chunk_weight(a, ch);
		double b = quant_bound(c->k, c->clip, w, c->mean[j], mean[j]);
		double e = fabs((double)mean[j] - c->mean[j]);
		double ba = c->lr * (double)c->k * c->clip /
		        (ldexp(1.0, 30) * w) +
		    half_ulpf(fmax(fabs(c->applied[j]), fabs(params[j]))) +
		    8 * DBL_EPSILON * fabs(c->applied[j]);
		double ea = fabs((double)params[j] - c->applied[j]);
		worst = fmax(worst, e / b);
		worst = fmax(worst, ea / ba);
		if (assert_bound && (e > b || ea > ba)) {
			fail_msg("%s[%llu]: mean %.9g want %.17g (err %.3g, "
			         "bound %.3g); applied %.9g want %.17g (err "
			         "%.3g, bound %.3g)",
			    c->name, (unsigned long long)j, (double)mean[j],
			    c->mean[j], e, b, (double)params[j],
			    c->applied[j], ea, ba);
		}
	}
	fb_accum_free(a);
	free(mean);
	free(params);
	return worst;
}

/* ---- tests -------------------------------------------------------------- */

static void
test_vectors_within_bound(void **state)
{
	size_t n = 0, checked = 0;
	vcase *cases = load_cases(&n);
	for (size_t i = 0; i < n; i++) {
		if (strcmp(cases[i].kind, "normal") != 0) {
			continue;
		}
		double worst = check_case(&cases[i], true);
		assert_true(worst <= 1.0);
		checked++;
	}
	assert_true(checked >= 6);
	free_cases(cases, n);
}

/*
 * The header's bound is stated against "the exact weighted mean", and the
 * caller passes weights w; the accumulator truncates them to w_q. The
 * adversarial vector makes both the truncation and the rounding push the
 * same way, with tiny weights, to check whether the bound still holds for
 * the weights the caller gave.
 */
static void
test_adversarial_vector_within_bound(void **state)
{
	size_t n = 0;
	bool found = false;
	double worst = 0;
	vcase *cases = load_cases(&n);
	for (size_t i = 0; i < n; i++) {
		if (strcmp(cases[i].kind, "adversarial") != 0) {
			continue;
		}
		found = true;
		worst = fmax(worst, check_case(&cases[i], false));
	}
	free_cases(cases, n);
	assert_true(found);
	if (worst > 1.0) {
		fail_msg("error is %.3f x the header's quantisation bound "
		         "(weights truncated to 2^-32 are not covered by it)",
		    worst);
	}
}

/* fb_ring_add wraps mod 2^32, at every length (vector body and tail). */
static void
test_ring_add(void **state)
{
	uint32_t sum[67], v[67], want[67];

	for (uint64_t n = 0; n <= 67; n++) {
		for (uint32_t j = 0; j < 67; j++) {
			sum[j] = 0xfffffff0u + j * 977u;
			v[j] = 0x20u + j * 0x01000193u;
			want[j] = j < n ? sum[j] + v[j] : sum[j];
		}
		fb_ring_add(sum, v, n);
		assert_memory_equal(sum, want, sizeof(sum));
	}
}

static void
test_order_independent(void **state)
{
	enum { K = 6, N = 29, CH = 8 };
	static float x[K][N];
	double w[K];
	uint64_t counts[K] = {5, 17, 1, 300, 42, 9};
	float ref[N], got[N];
	int perm[K] = {0, 1, 2, 3, 4, 5};
	fb_rng rng;
	int perms = 0;

	fb_rng_init(&rng, 7, 0);
	for (int i = 0; i < K; i++) {
		for (int j = 0; j < N; j++) {
			x[i][j] = (float)(fb_rng_normal(&rng) * 3.0);
		}
	}
	assert_int_equal(fb_fedavg_weights(counts, K, w), FB_OK);
	/* every permutation (Heap's algorithm, iterative) */
	int cnt[K] = {0};
	int i = 0;
	for (;;) {
		fb_accum *a = NULL;
		assert_int_equal(fb_accum_alloc(N, CH, 4.0, &a), FB_OK);
		for (int p = 0; p < K; p++) {
			add_update(a, x[perm[p]], w[perm[p]], NULL);
		}
		accum_mean(a, perms == 0 ? ref : got);
		if (perms > 0) {
			assert_memory_equal(ref, got, sizeof(ref));
		}
		fb_accum_free(a);
		perms++;
		while (i < K && cnt[i] >= i) {
			cnt[i] = 0;
			i++;
		}
		if (i >= K) {
			break;
		}
		int s = i % 2 == 0 ? 0 : cnt[i];
		int t = perm[s];
		perm[s] = perm[i];
		perm[i] = t;
		cnt[i]++;
		i = 0;
	}
	assert_int_equal(perms, 720);
}

static void
test_chunk_boundaries(void **state)
{
	fb_accum *a = NULL;
	float x[10], mean[10];

	assert_int_equal(fb_accum_alloc(10, 4, 8.0, &a), FB_OK);
	assert_int_equal(fb_accum_chunk_count(a), 3);
	assert_int_equal(fb_accum_chunk_len(a, 0), 4);
	assert_int_equal(fb_accum_chunk_len(a, 1), 4);
	assert_int_equal(fb_accum_chunk_len(a, 2), 2);
	assert_int_equal(fb_accum_chunk_len(a, 3), 0);
	for (int j = 0; j < 10; j++) {
		x[j] = (float)j - 4.5f;
	}
	add_update(a, x, 1.0, NULL);
	accum_mean(a, mean);
	for (int j = 0; j < 10; j++) {
		assert_true(fabs(mean[j] - x[j]) <=
		    quant_bound(1, 8.0, 1.0, x[j], mean[j]));
	}
	/* a chunk index past the end is refused */
	assert_int_equal(fb_accum_add(a, 3, x, 0.5, NULL), FB_EINVAL);
	fb_accum_free(a);

	/* one chunk exactly; count a multiple of the chunk size */
	assert_int_equal(fb_accum_alloc(8, 8, 1.0, &a), FB_OK);
	assert_int_equal(fb_accum_chunk_count(a), 1);
	assert_int_equal(fb_accum_chunk_len(a, 0), 8);
	fb_accum_free(a);
	assert_int_equal(fb_accum_alloc(12, 4, 1.0, &a), FB_OK);
	assert_int_equal(fb_accum_chunk_count(a), 3);
	assert_int_equal(fb_accum_chunk_len(a, 2), 4);
	fb_accum_free(a);
}

static void
test_chunk_larger_than_count(void **state)
{
	fb_accum *a = NULL;
	uint64_t big[] = {6, 1000, UINT64_MAX / 2, UINT64_MAX - 2, UINT64_MAX};
	for (size_t i = 0; i < FB_ARRAY_LEN(big); i++) {
		assert_int_equal(fb_accum_alloc(5, big[i], 1.0, &a), FB_OK);
		uint32_t nc = fb_accum_chunk_count(a);
		uint64_t len0 = fb_accum_chunk_len(a, 0);
		fb_accum_free(a);
		if (nc != 1 || len0 != 5) {
			fail_msg("count 5, chunk_elems %llu: %u chunks, first "
			         "of %llu elements (want 1 of 5)",
			    (unsigned long long)big[i], nc,
			    (unsigned long long)len0);
		}
	}
}

static void
test_bad_alloc_arguments(void **state)
{
	fb_accum *a = (fb_accum *)&a; /* must be reset to NULL */
	assert_int_equal(fb_accum_alloc(0, 4, 1.0, &a), FB_EINVAL);
	assert_null(a);
	assert_int_equal(fb_accum_alloc(4, 0, 1.0, &a), FB_EINVAL);
	assert_int_equal(fb_accum_alloc(4, 4, 0.0, &a), FB_EINVAL);
	assert_int_equal(fb_accum_alloc(4, 4, -1.0, &a), FB_EINVAL);
	assert_int_equal(fb_accum_alloc(4, 4, NAN, &a), FB_EINVAL);
	assert_int_equal(fb_accum_alloc(4, 4, INFINITY, &a), FB_EINVAL);
	assert_null(a);
	fb_accum_free(NULL);
}

static void
test_nonfinite_refused(void **state)
{
	fb_accum *a = NULL;
	float good[6] = {1, 2, 3, -1, -2, -3}, bad[6], mean[6];
	float poison[] = {NAN, INFINITY, -INFINITY, -NAN};
	uint64_t clipped = 0;

	assert_int_equal(fb_accum_alloc(6, 6, 2.0, &a), FB_OK);
	for (size_t p = 0; p < FB_ARRAY_LEN(poison); p++) {
		for (int pos = 0; pos < 6; pos += 5) {
			memcpy(bad, good, sizeof(bad));
			bad[pos] = poison[p];
			assert_int_equal(fb_accum_add(a, 0, bad, 0.5, &clipped),
			    FB_EINVAL);
			assert_true(fb_accum_chunk_weight(a, 0) == 0.0);
		}
	}
	assert_int_equal(clipped, 0);
	accum_mean(a, mean);
	for (int j = 0; j < 6; j++) {
		assert_true(mean[j] == 0.0f);
	}
	/* the refused chunks left nothing: a good one now gives its values */
	assert_int_equal(fb_accum_add(a, 0, good, 1.0, &clipped), FB_OK);
	assert_int_equal(clipped, 2);
	accum_mean(a, mean);
	for (int j = 0; j < 6; j++) {
		double want = fmax(-2.0, fmin(2.0, good[j]));
		assert_true(fabs(mean[j] - want) <=
		    quant_bound(1, 2.0, 1.0, want, mean[j]));
	}
	fb_accum_free(a);
}

static void
test_weight_sum_above_one_refused(void **state)
{
	fb_accum *a = NULL;
	float x[3] = {1, 1, 1}, y[3] = {-1, -1, -1}, mean[3];

	assert_int_equal(fb_accum_alloc(3, 3, 1.0, &a), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, x, 0.6, NULL), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, y, 0.5, NULL), FB_ERANGE);
	assert_true(fabs(fb_accum_chunk_weight(a, 0) - 0.6) < 1e-9);
	accum_mean(a, mean);
	for (int j = 0; j < 3; j++) {
		assert_true(fabs(mean[j] - 1.0) <=
		    quant_bound(1, 1.0, 0.6, 1.0, mean[j]));
	}
	/* exactly up to 1 is fine; a further tiny weight is not */
	assert_int_equal(fb_accum_add(a, 0, y, 0.4, NULL), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, y, 1e-6, NULL), FB_ERANGE);
	assert_true(fb_accum_chunk_weight(a, 0) <= 1.0);
	/* weights outside (0, 1] */
	assert_int_equal(fb_accum_add(a, 0, x, 0.0, NULL), FB_EINVAL);
	assert_int_equal(fb_accum_add(a, 0, x, -0.1, NULL), FB_EINVAL);
	assert_int_equal(fb_accum_add(a, 0, x, 1.5, NULL), FB_EINVAL);
	assert_int_equal(fb_accum_add(a, 0, x, NAN, NULL), FB_EINVAL);
	fb_accum_reset(a);
	assert_int_equal(fb_accum_add(a, 0, x, 1.0000001, NULL), FB_EINVAL);
	assert_true(fb_accum_chunk_weight(a, 0) == 0.0);
	/* a weight below 2^-32 cannot be represented; nothing is added */
	assert_int_not_equal(fb_accum_add(a, 0, x, 1e-12, NULL), FB_OK);
	assert_true(fb_accum_chunk_weight(a, 0) == 0.0);
	fb_accum_free(a);
}

static void
test_clipped_counted(void **state)
{
	fb_accum *a = NULL;
	float x[8] = {0.5f, 1.0f, 1.0000001f, -1.0f, -1.0000001f, 7, -1e30f,
	    0};
	float mean[8];
	uint64_t clipped = 5; /* increased, not overwritten */

	assert_int_equal(fb_accum_alloc(8, 3, 1.0, &a), FB_OK);
	add_update(a, x, 0.25, &clipped);
	assert_int_equal(clipped, 5 + 4);
	add_update(a, x, 0.25, NULL);
	accum_mean(a, mean);
	for (int j = 0; j < 8; j++) {
		double want = fmax(-1.0, fmin(1.0, x[j]));
		assert_true(fabs(mean[j] - want) <=
		    quant_bound(2, 1.0, 0.5, want, mean[j]));
	}
	fb_accum_free(a);
}

static void
test_per_chunk_weights(void **state)
{
	fb_accum *a = NULL;
	float u[4] = {1, 2, 3, 4}, v[4] = {-3, -2, -1, 0}, mean[4];
	float params[4] = {10, 10, 10, 10};

	assert_int_equal(fb_accum_alloc(4, 2, 8.0, &a), FB_OK);
	/* u sends both chunks, v only chunk 0 (it was lost mid-stream) */
	assert_int_equal(fb_accum_add(a, 0, u, 0.5, NULL), FB_OK);
	assert_int_equal(fb_accum_add(a, 1, u + 2, 0.5, NULL), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, v, 0.25, NULL), FB_OK);
	assert_true(fabs(fb_accum_chunk_weight(a, 0) - 0.75) < 1e-9);
	assert_true(fabs(fb_accum_chunk_weight(a, 1) - 0.5) < 1e-9);
	accum_mean(a, mean);
	double want[4] = {(0.5 * 1 + 0.25 * -3) / 0.75,
	    (0.5 * 2 + 0.25 * -2) / 0.75, 3, 4};
	for (int j = 0; j < 4; j++) {
		double w = j < 2 ? 0.75 : 0.5;
		int k = j < 2 ? 2 : 1;
		assert_true(fabs(mean[j] - want[j]) <=
		    quant_bound(k, 8.0, w, want[j], mean[j]));
	}
	accum_sgd_step(a, params, 0.5);
	for (int j = 0; j < 4; j++) {
		double w = j < 2 ? 0.75 : 0.5;
		int k = j < 2 ? 2 : 1;
		double exp = 10 - 0.5 * want[j];
		assert_true(fabs(params[j] - exp) <=
		    0.5 * quant_bound(k, 8.0, w, 0, 0) + half_ulpf(exp) * 2);
	}
	fb_accum_free(a);
}

static void
test_apply_leaves_empty_chunks(void **state)
{
	fb_accum *a = NULL;
	float u[5] = {0.25f, -0.5f, 1, 1, 1}, mean[5];
	float params[5] = {1, 2, 3, 4, 5};

	assert_int_equal(fb_accum_alloc(5, 2, 1.0, &a), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, u, 1.0, NULL), FB_OK);
	accum_sgd_step(a, params, 2.0);
	assert_true(fabs(params[0] - 0.5) <= 1e-6);
	assert_true(fabs(params[1] - 3.0) <= 1e-6);
	/* chunks 1 and 2 received nothing: untouched, mean 0 */
	assert_true(params[2] == 3 && params[3] == 4 && params[4] == 5);
	accum_mean(a, mean);
	assert_true(mean[2] == 0 && mean[3] == 0 && mean[4] == 0);
	fb_accum_free(a);
}

static void
test_reset_clears(void **state)
{
	fb_accum *a = NULL;
	float x[7] = {1, -1, 0.5f, 2, -2, 0.25f, 3}, mean[7];

	assert_int_equal(fb_accum_alloc(7, 3, 4.0, &a), FB_OK);
	add_update(a, x, 1.0, NULL);
	fb_accum_reset(a);
	for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
		assert_true(fb_accum_chunk_weight(a, c) == 0.0);
	}
	accum_mean(a, mean);
	for (int j = 0; j < 7; j++) {
		assert_true(mean[j] == 0.0f);
	}
	/* a full weight fits again after the reset */
	for (int j = 0; j < 7; j++) {
		x[j] = -x[j];
	}
	add_update(a, x, 1.0, NULL);
	accum_mean(a, mean);
	for (int j = 0; j < 7; j++) {
		assert_true(fabs(mean[j] - x[j]) <=
		    quant_bound(1, 4.0, 1.0, x[j], mean[j]));
	}
	fb_accum_free(a);
}

/* Every update at +clip (or -clip), weights summing to 1 over 1000
 * updates: the sum sits at the top of the ring and must not wrap. */
static void
stress(double clip, float sign, const double *w, uint32_t k)
{
	enum { N = 37 };
	fb_accum *a = NULL;
	float x[N], mean[N], params[N];
	uint64_t clipped = 0;

	for (int j = 0; j < N; j++) {
		x[j] = sign * (float)clip * (j % 2 == 0 ? 1.0f : 4.0f);
	}
	assert_int_equal(fb_accum_alloc(N, 16, clip, &a), FB_OK);
	for (uint32_t i = 0; i < k; i++) {
		add_update(a, x, w[i], &clipped);
	}
	{
		/* clamping is at the exact (double) clip, so (float)clip
		 * itself counts when it rounds above clip */
		uint64_t over = 0;
		for (int j = 0; j < N; j++) {
			over += fabs((double)x[j]) > clip;
		}
		assert_int_equal(clipped, (uint64_t)k * over);
	}
	accum_mean(a, mean);
	for (int j = 0; j < N; j++) {
		double want = sign * clip;
		double b = quant_bound(k, clip,
		    fb_accum_chunk_weight(a, (uint32_t)(j / 16)), want,
		    mean[j]);
		if (!(fabs(mean[j] - want) <= b)) {
			fail_msg("clip %g sign %g: mean[%d] = %.9g, want %g "
			         "within %.3g",
			    clip, (double)sign, j, (double)mean[j], want, b);
		}
		params[j] = 0;
	}
	accum_sgd_step(a, params, 1.0);
	for (int j = 0; j < N; j++) {
		assert_true(fabs(params[j] + sign * clip) <= 1e-5 * clip);
	}
	fb_accum_free(a);
}

static void
test_large_magnitude_stress(void **state)
{
	enum { K = 1000 };
	static uint64_t ones[K];
	static double w[K];
	double clips[] = {1.0, 16.0, 0.1, 1e6};

	for (int i = 0; i < K; i++) {
		ones[i] = 1;
	}
	assert_int_equal(fb_fedavg_weights(ones, K, w), FB_OK);
	for (size_t c = 0; c < FB_ARRAY_LEN(clips); c++) {
		stress(clips[c], 1.0f, w, K);
		stress(clips[c], -1.0f, w, K);
	}
	/* exact multiples of 2^-32 that sum to exactly 1: 2^32 = 1000 *
	 * 4294967 + 296 */
	for (int i = 0; i < K; i++) {
		w[i] = ldexp(i < 296 ? 4294968.0 : 4294967.0, -32);
	}
	for (size_t c = 0; c < FB_ARRAY_LEN(clips); c++) {
		stress(clips[c], 1.0f, w, K);
		stress(clips[c], -1.0f, w, K);
	}
}

static void
test_fedavg_weights(void **state)
{
	uint64_t n[4] = {1, 3, 0, 4};
	double w[4] = {-1, -1, -1, -1};
	uint64_t big[3] = {UINT64_MAX / 4, UINT64_MAX / 4, UINT64_MAX / 2};

	assert_int_equal(fb_fedavg_weights(n, 4, w), FB_EINVAL);
	assert_int_equal(fb_fedavg_weights(n, 0, w), FB_EINVAL);
	n[2] = 2;
	assert_int_equal(fb_fedavg_weights(n, 4, w), FB_OK);
	assert_true(w[0] == 0.1 && w[2] == 0.2 && w[3] == 0.4);
	assert_true(fabs(w[1] - 0.3) <= DBL_EPSILON);
	assert_int_equal(fb_fedavg_weights(big, 3, w), FB_OK);
	assert_true(fabs(w[0] - 0.25) < 1e-15 && fabs(w[2] - 0.5) < 1e-15);
	assert_true(w[0] + w[1] + w[2] <= 1.0 + 2 * DBL_EPSILON);
	n[0] = 5;
	assert_int_equal(fb_fedavg_weights(n, 1, w), FB_OK);
	assert_true(w[0] == 1.0);
}

/*
 * A value in (clip, (float)clip] -- clip 0.1 is not a float32 -- must be
 * clamped to clip like any value beyond it (and counted).
 */
static void
test_clip_not_a_float_is_honoured(void **state)
{
	fb_accum *a = NULL;
	float x[2] = {0.1f, -0.1f}; /* 0.1f > 0.1 */
	float y[2] = {-0.099999994f, 0.099999994f};
	float mean[2];
	uint64_t clipped = 0;

	assert_true((double)x[0] > 0.1);
	assert_int_equal(fb_accum_alloc(2, 2, 0.1, &a), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, x, 0.5, &clipped), FB_OK);
	assert_int_equal(fb_accum_add(a, 0, y, 0.5, &clipped), FB_OK);
	accum_mean(a, mean);
	fb_accum_free(a);
	for (int j = 0; j < 2; j++) {
		double want = 0.5 * (j == 0 ? 0.1 : -0.1) + 0.5 * (double)y[j];
		if (!(fabs(mean[j] - want) <=
		        quant_bound(2, 0.1, 1.0, want, mean[j]))) {
			fail_msg("mean[%d] = %.9g, want %.9g within %.3g "
			         "(clamped at (float)clip, not clip)",
			    j, (double)mean[j], want,
			    quant_bound(2, 0.1, 1.0, want, mean[j]));
		}
	}
	assert_int_equal(clipped, 2);

	/* and the known-answer case with clip 3.3 */
	size_t n = 0, found = 0;
	vcase *cases = load_cases(&n);
	for (size_t i = 0; i < n; i++) {
		if (strcmp(cases[i].kind, "clip_not_float32") == 0) {
			(void)check_case(&cases[i], true);
			found++;
		}
	}
	assert_true(found > 0);
	free_cases(cases, n);
}

/* ---- adds from many threads at once --------------------------------------- */

enum { CT_THREADS = 8, CT_PER = 3, CT_K = CT_THREADS * CT_PER };

static pthread_barrier_t start_line; /* run_together's threads wait here */

/* Runs fn on n threads at once, the i-th on (char *)args + i * size (they
 * wait at start_line first), and returns when all have finished. */
static void
run_together(uint32_t n, void *(*fn)(void *), void *args, size_t size)
{
	pthread_t th[CT_THREADS];

	assert_true(n <= CT_THREADS);
	assert_int_equal(pthread_barrier_init(&start_line, NULL, n), 0);
	for (uint32_t i = 0; i < n; i++) {
		assert_int_equal(pthread_create(&th[i], NULL, fn,
		    (char *)args + i * size), 0);
	}
	for (uint32_t i = 0; i < n; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
	}
	pthread_barrier_destroy(&start_line);
}

typedef struct ct_arg {
	fb_accum *a;
	const float *x;       /* CT_K updates of n floats */
	const uint32_t *v;    /* or CT_K ring vectors (x NULL) */
	const double *w;
	uint64_t n;
	uint32_t first;       /* this thread adds updates first.. +CT_PER-1 */
	fb_err rc[CT_PER];    /* the first failure per update, else FB_OK */
	uint64_t clipped;
} ct_arg;

/* Adds CT_PER whole updates, chunk by chunk, after the barrier. cmocka's
 * asserts are for the main thread only: results go back in the arg. */
static void *
ct_main(void *p)
{
	ct_arg *t = p;
	pthread_barrier_wait(&start_line);
	for (uint32_t u = 0; u < CT_PER; u++) {
		uint64_t i = t->first + u, off = 0;
		t->rc[u] = FB_OK;
		for (uint32_t c = 0; c < fb_accum_chunk_count(t->a); c++) {
			uint64_t len = fb_accum_chunk_len(t->a, c);
			fb_err rc = t->x != NULL
			    ? fb_accum_add(t->a, c, t->x + i * t->n + off,
			          t->w[i], &t->clipped)
			    : fb_accum_ring_add(t->a, c, t->v + i * t->n + off,
			          len);
			if (rc != FB_OK && t->rc[u] == FB_OK) {
				t->rc[u] = rc;
			}
			off += len;
		}
	}
	return NULL;
}

/* Runs CT_THREADS threads over the updates; fails on any error. */
static void
ct_run(fb_accum *a, const float *x, const uint32_t *v, const double *w,
    uint64_t n, uint64_t *clipped)
{
	ct_arg args[CT_THREADS];

	for (uint32_t i = 0; i < CT_THREADS; i++) {
		args[i] = (ct_arg){.a = a, .x = x, .v = v, .w = w, .n = n,
		    .first = i * CT_PER};
	}
	run_together(CT_THREADS, ct_main, args, sizeof(*args));
	*clipped = 0;
	for (uint32_t i = 0; i < CT_THREADS; i++) {
		for (uint32_t u = 0; u < CT_PER; u++) {
			assert_int_equal(args[i].rc[u], FB_OK);
		}
		*clipped += args[i].clipped;
	}
}

static void
test_concurrent_adds(void **state)
{
	/* One chunk of 13 parts (the one-chunk model), then chunks of 3
	 * parts with more updates than chunks: the sums (floats, then ring
	 * elements) are the same bits as adding one update after another. */
	static const uint64_t chunk_elems[] = {1u << 18, 20000};
	const uint64_t n = 100003;
	float *x = calloc(CT_K * n, sizeof(*x));
	uint32_t *v = calloc(CT_K * n, sizeof(*v));
	float *ref = calloc(n, sizeof(*ref)), *got = calloc(n, sizeof(*got));
	uint64_t counts[CT_K];
	double w[CT_K];
	fb_rng rng;

	assert_non_null(x);
	assert_non_null(v);
	assert_non_null(ref);
	assert_non_null(got);
	fb_rng_init(&rng, 11, 0);
	for (uint64_t j = 0; j < CT_K * n; j++) {
		x[j] = (float)(fb_rng_normal(&rng) * 2.0);
		v[j] = (uint32_t)fb_rng_u64(&rng);
	}
	for (uint32_t i = 0; i < CT_K; i++) {
		counts[i] = 100 + 37 * i;
	}
	assert_int_equal(fb_fedavg_weights(counts, CT_K, w), FB_OK);
	for (size_t s = 0; s < sizeof(chunk_elems) / sizeof(*chunk_elems);
	     s++) {
		fb_accum *serial = NULL, *a = NULL;
		uint64_t clip_ref = 0, clip_got = 0;
		assert_int_equal(fb_accum_alloc(n, chunk_elems[s], 4.0, &serial),
		    FB_OK);
		assert_int_equal(fb_accum_alloc(n, chunk_elems[s], 4.0, &a),
		    FB_OK);
		for (uint32_t i = 0; i < CT_K; i++) {
			add_update(serial, x + i * n, w[i], &clip_ref);
		}
		accum_mean(serial, ref);
		for (int rep = 0; rep < 10; rep++) {
			fb_accum_reset(a);
			ct_run(a, x, NULL, w, n, &clip_got);
			accum_mean(a, got);
			assert_memory_equal(ref, got, n * sizeof(*ref));
			assert_true(clip_got == clip_ref);
		}
		/* ring elements: the sum mod 2^32 of all CT_K vectors */
		fb_accum_reset(a);
		ct_run(a, NULL, v, w, n, &clip_got);
		for (uint64_t j = 0; j < n; j++) {
			uint32_t want = 0;
			for (uint32_t i = 0; i < CT_K; i++) {
				want += v[i * n + j];
			}
			if (fb_accum_ring(a)[j] != want) {
				fail_msg("ring element %llu: %u, want %u",
				    (unsigned long long)j, fb_accum_ring(a)[j],
				    want);
			}
		}
		fb_accum_free(serial);
		fb_accum_free(a);
	}
	free(x);
	free(v);
	free(ref);
	free(got);
}

typedef struct wr_arg {
	fb_accum *a;
	const float *x;
	fb_err rc;
} wr_arg;

static void *
wr_main(void *p)
{
	wr_arg *t = p;
	pthread_barrier_wait(&start_line);
	t->rc = fb_accum_add(t->a, 0, t->x, 0.25, NULL);
	return NULL;
}

static void
test_concurrent_weight_limit(void **state)
{
	/* Eight threads add weight 1/4 into one chunk at once: exactly four
	 * get in, the others are refused with nothing added, every time. */
	enum { T = 8, N = 40000 };
	static float x[N];
	float mean[N];

	for (uint32_t j = 0; j < N; j++) {
		x[j] = (float)j / N - 0.5f;
	}
	for (int rep = 0; rep < 50; rep++) {
		wr_arg args[T];
		fb_accum *a = NULL;
		int ok = 0, refused = 0;

		assert_int_equal(fb_accum_alloc(N, N, 1.0, &a), FB_OK);
		for (int i = 0; i < T; i++) {
			args[i] = (wr_arg){.a = a, .x = x};
		}
		run_together(T, wr_main, args, sizeof(*args));
		for (int i = 0; i < T; i++) {
			ok += args[i].rc == FB_OK;
			refused += args[i].rc == FB_ERANGE;
		}
		assert_int_equal(ok, 4);
		assert_int_equal(refused, 4);
		assert_true(fb_accum_chunk_weight(a, 0) == 1.0);
		accum_mean(a, mean);
		for (uint32_t j = 0; j < N; j++) {
			assert_true(fabs(mean[j] - x[j]) <=
			    quant_bound(4, 1.0, 1.0, 1.0, mean[j]));
		}
		fb_accum_free(a);
	}
}

/* The documented encoding in plain scalar C: round_half_away(w_q *
 * clamp(x, -clip, clip) * 2^30 / clip), w_q = w rounded down to 2^-32. */
static uint32_t
ref_encode(float x, double w, double clip)
{
	double wq = floor(w * 4294967296.0) / 4294967296.0;
	double v = x > clip ? clip : x < -clip ? -clip : x;
	return (uint32_t)(int32_t)round(v * (wq * (ldexp(1.0, 30) / clip)));
}

/*
 * The adds are built for several instruction sets and the loader picks
 * one (accum.c). Whichever runs here must give the ring sums of the
 * scalar definition bit for bit, at every length (vector bodies and
 * tails), with clamping, exact .5 ties and signs, so that sums agree
 * across machines.
 */
static void
test_add_bits_match_scalar(void **state)
{
	static const struct {
		double clip, w1, w2;
	} cases[] = {
	    {1073741824.0, 1.0, 0}, /* scale 1, weight 1: q = round(x) */
	    {3.7, 0.3, 0.7},
	    {16.0, 0.125, 0.5},
	    {1e-3, 0.9, 0.1},
	};
	static const uint64_t lens[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33,
	    63, 65, 4099};
	uint64_t seed = 0x9e3779b97f4a7c15ull;

	(void)state;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
			uint64_t n = lens[l];
			float *x1 = malloc(n * sizeof(*x1));
			float *x2 = malloc(n * sizeof(*x2));
			fb_accum *a = NULL;
			double clip = cases[c].clip;

			assert_non_null(x1);
			assert_non_null(x2);
			for (uint64_t j = 0; j < n; j++) {
				/* uniform in (-1.5 clip, 1.5 clip); every
				 * fourth a half-integer for the ties of the
				 * first case */
				seed = seed * 6364136223846793005ull +
				    1442695040888963407ull;
				double u = (double)(seed >> 11) * 0x1p-53;
				x1[j] = (float)((u * 3 - 1.5) * clip);
				x2[j] = (float)(-(u * 2 - 1) * clip);
				if (j % 4 == 1) {
					x1[j] = (float)(j % 64) - 31.5f;
				}
			}
			assert_int_equal(fb_accum_alloc(n, n, clip, &a), FB_OK);
			assert_int_equal(fb_accum_add(a, 0, x1, cases[c].w1,
			    NULL), FB_OK);
			if (cases[c].w2 > 0) {
				assert_int_equal(fb_accum_add(a, 0, x2,
				    cases[c].w2, NULL), FB_OK);
			}
			const uint32_t *sum = fb_accum_ring(a);
			for (uint64_t j = 0; j < n; j++) {
				uint32_t want = ref_encode(x1[j], cases[c].w1,
				    clip);
				if (cases[c].w2 > 0) {
					want += ref_encode(x2[j], cases[c].w2,
					    clip);
				}
				if (sum[j] != want) {
					fail_msg("clip %g, length %" PRIu64
					    ", element %" PRIu64 ": sum %08x, "
					    "scalar %08x", clip, n, j, sum[j],
					    want);
				}
			}
			fb_accum_free(a);
			free(x1);
			free(x2);
		}
	}
}

/* ---- adds over many parts, inline and handed to a runner ---------------- */

/* A chunk of four full parts (accum.c: parts of 8192 elements at least)
 * and a short fifth one. */
#define MP_N (4 * 8192 + 3)
#define PAR_THREADS 3

/* The ways fb_accum_add may run a chunk's parts (fb_accum_set_parallel). */
enum { RUN_INLINE, RUN_BACKWARDS, RUN_THREADS, RUN_MODES };

/* Runs the pieces last first on the calling thread, so that parts after
 * a refused one run before it. */
static void
par_backwards(void *ctx, uint32_t n, void (*fn)(void *arg, uint32_t i),
    void *arg)
{
	(void)ctx;
	for (uint32_t i = n; i-- > 0;) {
		fn(arg, i);
	}
}

typedef struct par_pool {
	void (*fn)(void *arg, uint32_t i);
	void *arg;
	uint32_t n;
	_Atomic uint32_t next;
} par_pool;

static void *
par_worker(void *p)
{
	par_pool *pp = p;
	uint32_t i;

	while ((i = atomic_fetch_add(&pp->next, 1)) < pp->n) {
		pp->fn(pp->arg, i);
	}
	return NULL;
}

/* Runs the pieces on PAR_THREADS threads and the caller, each taking the
 * next piece, as the coordinator's ingest pool does. */
static void
par_threads(void *ctx, uint32_t n, void (*fn)(void *arg, uint32_t i),
    void *arg)
{
	par_pool pp = {.fn = fn, .arg = arg, .n = n};
	pthread_t th[PAR_THREADS];

	(void)ctx;
	for (int i = 0; i < PAR_THREADS; i++) {
		assert_int_equal(pthread_create(&th[i], NULL, par_worker, &pp),
		    0);
	}
	par_worker(&pp);
	for (int i = 0; i < PAR_THREADS; i++) {
		assert_int_equal(pthread_join(th[i], NULL), 0);
	}
}

static void
set_run_mode(fb_accum *a, int mode)
{
	fb_accum_set_parallel(a, mode == RUN_BACKWARDS ? par_backwards
	                         : mode == RUN_THREADS ? par_threads
	                                               : NULL,
	    NULL);
}

/* mp_fill writes values uniform in (-1.5 clip, 1.5 clip), so about a
 * third are clamped. */
static void
mp_fill(float *x, uint64_t n, double clip, uint64_t *seed)
{
	for (uint64_t j = 0; j < n; j++) {
		*seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
		x[j] = (float)(((double)(*seed >> 11) * 0x1p-53 * 3 - 1.5) *
		    clip);
	}
}

/* The scalar definition of the sums of adds of x[0..k) with weights w,
 * and the number of clamped coordinates. */
static void
mp_reference(const float *const *x, const double *w, uint32_t k,
    uint64_t n, double clip, uint32_t *want, uint64_t *clipped)
{
	*clipped = 0;
	for (uint64_t j = 0; j < n; j++) {
		want[j] = 0;
		for (uint32_t i = 0; i < k; i++) {
			want[j] += ref_encode(x[i][j], w[i], clip);
			*clipped += fabs((double)x[i][j]) > clip;
		}
	}
}

/* Two updates of n values for weights w (seeded), and their reference
 * sums and clamp count; free with mp_pair_free. */
static uint32_t *
mp_pair(float *x[2], const double w[2], uint64_t n, double clip,
    uint64_t seed, uint64_t *want_clipped)
{
	uint32_t *want = malloc(n * sizeof(*want));

	assert_non_null(want);
	for (int i = 0; i < 2; i++) {
		assert_non_null(x[i] = malloc(n * sizeof(*x[i])));
		mp_fill(x[i], n, clip, &seed);
	}
	mp_reference((const float *const *)x, w, 2, n, clip, want,
	    want_clipped);
	return want;
}

static void
mp_pair_free(float *x[2], uint32_t *want)
{
	free(x[0]);
	free(x[1]);
	free(want);
}

static void
test_multipart_bits_match_scalar(void **state)
{
	/* Three chunks of MP_N (the last 5 elements), every run mode. */
	const uint64_t count = 2 * MP_N + 5;
	const double clip = 3.7, w[2] = {0.3, 0.7};
	float *x[2];
	uint64_t want_clipped;
	uint32_t *want = mp_pair(x, w, count, clip, 42, &want_clipped);

	(void)state;
	for (int mode = 0; mode < RUN_MODES; mode++) {
		fb_accum *a = NULL;
		uint64_t clipped = 0;

		assert_int_equal(fb_accum_alloc(count, MP_N, clip, &a), FB_OK);
		set_run_mode(a, mode);
		/* a round before, so that the first adds find old sums */
		for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
			assert_int_equal(fb_accum_add(a, c,
			    x[1] + (uint64_t)c * MP_N, 1.0, NULL), FB_OK);
		}
		fb_accum_reset(a);
		for (int i = 0; i < 2; i++) {
			for (uint32_t c = 0; c < fb_accum_chunk_count(a); c++) {
				assert_int_equal(fb_accum_add(a, c,
				    x[i] + (uint64_t)c * MP_N, w[i], &clipped),
				    FB_OK);
			}
		}
		assert_memory_equal(fb_accum_ring(a), want,
		    count * sizeof(*want));
		assert_int_equal(clipped, want_clipped);
		fb_accum_free(a);
	}
	mp_pair_free(x, want);
}

/*
 * A NaN or an infinity in the first, a middle or the last part of a chunk
 * (its first or last element included) refuses the chunk, however its
 * parts run: the sum is the same bytes as before the add, and the weight
 * and the clip count are unchanged, so a later add may still take the
 * weight up to 1.
 */
static void
test_refused_chunk_leaves_sum(void **state)
{
	static const uint64_t pos[] = {0, 8192 + 100, 2 * 8192 - 1,
	    4 * 8192, MP_N - 1};
	static const float poison[] = {NAN, INFINITY, -INFINITY, -NAN};
	const double clip = 2.0, w[2] = {0.25, 0.75};
	float *x[2], *bad = malloc(MP_N * sizeof(*bad));
	uint32_t *before = malloc(MP_N * sizeof(*before));
	uint64_t want_clipped;
	uint32_t *want = mp_pair(x, w, MP_N, clip, 7, &want_clipped);

	(void)state;
	assert_true(bad != NULL && before != NULL);
	for (int mode = 0; mode < RUN_MODES; mode++) {
		fb_accum *a = NULL;
		uint64_t clipped = 0, clipped0;

		assert_int_equal(fb_accum_alloc(MP_N, MP_N, clip, &a), FB_OK);
		set_run_mode(a, mode);
		assert_int_equal(fb_accum_add(a, 0, x[0], w[0], &clipped),
		    FB_OK);
		memcpy(before, fb_accum_ring(a), MP_N * sizeof(*before));
		clipped0 = clipped;
		/* Each poison at each place, and again: the parts start at a
		 * different place on each add. */
		for (int rep = 0; rep < 3; rep++) {
			for (size_t p = 0; p < FB_ARRAY_LEN(pos); p++) {
				memcpy(bad, x[1], MP_N * sizeof(*bad));
				bad[pos[p]] = poison[(p + rep) %
				    FB_ARRAY_LEN(poison)];
				assert_int_equal(fb_accum_add(a, 0, bad, w[1],
				    &clipped), FB_EINVAL);
				assert_memory_equal(fb_accum_ring(a), before,
				    MP_N * sizeof(*before));
				assert_true(fb_accum_chunk_weight(a, 0) ==
				    w[0]);
				assert_int_equal(clipped, clipped0);
			}
		}
		assert_int_equal(fb_accum_add(a, 0, x[1], w[1], &clipped),
		    FB_OK);
		assert_true(fb_accum_chunk_weight(a, 0) == 1.0);
		assert_memory_equal(fb_accum_ring(a), want,
		    MP_N * sizeof(*want));
		assert_int_equal(clipped, want_clipped);
		fb_accum_free(a);
	}
	free(bad);
	free(before);
	mp_pair_free(x, want);
}

/*
 * After a reset, chunks nobody adds into read as zero whatever the last
 * round left there, through every reader; a refused first add leaves its
 * chunk reading zero; a ring add into a chunk of a new round replaces
 * the old sums.
 */
static void
test_reset_then_partial_round(void **state)
{
	const uint64_t count = 2 * MP_N + 5;
	const double clip = 3.7;
	float *x = malloc(count * sizeof(*x)), *out = malloc(count *
	    sizeof(*out)), *params = malloc(count * sizeof(*params));
	float *zero = calloc(count, sizeof(*zero));
	uint32_t *v = malloc(MP_N * sizeof(*v));
	uint64_t seed = 99;

	(void)state;
	assert_true(x && out && params && zero && v);
	mp_fill(x, count, clip, &seed);
	for (uint64_t j = 0; j < MP_N; j++) {
		v[j] = (uint32_t)(j * 2654435761u);
	}
	for (int mode = 0; mode < RUN_MODES; mode++) {
		fb_accum *a = NULL;
		const uint32_t *ring;
		double scale = ldexp(1.0, 30) / clip;

		assert_int_equal(fb_accum_alloc(count, MP_N, clip, &a), FB_OK);
		set_run_mode(a, mode);
		add_update(a, x, 1.0, NULL);
		fb_accum_reset(a);
		/* a refused first add into chunk 0, a good one into 1 */
		x[2 * 8192 + 5] = NAN;
		assert_int_equal(fb_accum_add(a, 0, x, 0.5, NULL), FB_EINVAL);
		x[2 * 8192 + 5] = 0.25f;
		assert_int_equal(fb_accum_add(a, 1, x + MP_N, 0.5, NULL),
		    FB_OK);
		accum_mean(a, out);
		assert_memory_equal(out, zero, MP_N * sizeof(*out));
		assert_memory_equal(out + 2 * MP_N, zero, 5 * sizeof(*out));
		for (uint64_t j = 0; j < MP_N; j++) {
			float want = (float)((double)(int32_t)ref_encode(
			    x[MP_N + j], 0.5, clip) * (1.0 / (0.5 * scale)));
			assert_true(memcmp(&out[MP_N + j], &want,
			    sizeof(want)) == 0);
		}
		assert_int_equal(fb_accum_mean_chunk(a, 0, out), FB_OK);
		assert_memory_equal(out, zero, MP_N * sizeof(*out));
		memcpy(params, x, count * sizeof(*params));
		accum_sgd_step(a, params, 1.0);
		assert_memory_equal(params, x, MP_N * sizeof(*params));
		assert_memory_equal(params + 2 * MP_N, x + 2 * MP_N,
		    5 * sizeof(*params));
		ring = fb_accum_ring(a);
		for (uint64_t j = 0; j < count; j++) {
			uint32_t want = j >= MP_N && j < 2 * MP_N
			    ? ref_encode(x[j], 0.5, clip) : 0;
			assert_int_equal(ring[j], want);
		}
		/* a ring add into chunk 2 of a new round, then chunk 0 */
		fb_accum_reset(a);
		assert_int_equal(fb_accum_ring_add(a, 2, v, 5), FB_OK);
		assert_int_equal(fb_accum_ring_add(a, 0, v, MP_N), FB_OK);
		assert_int_equal(fb_accum_ring_add(a, 0, v, MP_N), FB_OK);
		ring = fb_accum_ring(a);
		for (uint64_t j = 0; j < count; j++) {
			uint32_t want = j < MP_N ? 2 * v[j]
			    : j >= 2 * MP_N ? v[j - 2 * MP_N] : 0;
			assert_int_equal(ring[j], want);
		}
		fb_accum_free(a);
	}
	free(x);
	free(out);
	free(params);
	free(zero);
	free(v);
}

static void
test_ring_add_checks_size(void **state)
{
	fb_accum *a = NULL;
	uint32_t v[10] = {0};

	assert_int_equal(fb_accum_alloc(10, 4, 1.0, &a), FB_OK);
	assert_int_equal(fb_accum_ring_add(a, 0, v, 4), FB_OK);
	assert_int_equal(fb_accum_ring_add(a, 2, v, 2), FB_OK);
	assert_int_equal(fb_accum_ring_add(a, 2, v, 4), FB_EINVAL);
	assert_int_equal(fb_accum_ring_add(a, 0, v, 3), FB_EINVAL);
	assert_int_equal(fb_accum_ring_add(a, 3, v, 1), FB_EINVAL);
	fb_accum_free(a);
}

/* ---- federated evaluation ---------------------------------------------- */

/* Four workers' validation sets as individual examples (loss, right or
 * not): the union's mean loss and accuracy straight from the examples,
 * against the tally of the four per-worker means. */
#define EV_W 4
static const uint32_t ev_sizes[EV_W] = {7, 130, 1, 862};

static void
ev_examples(uint32_t w, uint32_t k, double *loss, int *right)
{
	uint64_t h = (uint64_t)(w + 1) * 0x9e3779b97f4a7c15ULL ^
	             (uint64_t)(k + 1) * 0xc2b2ae3d27d4eb4fULL;
	h ^= h >> 29;
	*loss = (double)(h % 100000) / 25000.0;
	*right = (h >> 20) % 10 < 3 + w;
}

static void
test_eval_tally_is_the_unions_mean(void **state)
{
	fb_eval_tally t;
	fb_eval_mean m;
	double all_loss = 0, all_right = 0, n_all = 0, f1 = 0, n_f1 = 0;
	char names[2][FB_EVAL_NAME_MAX] = {"f1", "auc"};

	fb_eval_tally_init(&t);
	for (uint32_t w = 0; w < EV_W; w++) {
		double ls = 0, rs = 0, v[2];
		for (uint32_t k = 0; k < ev_sizes[w]; k++) {
			double l;
			int r;
			ev_examples(w, k, &l, &r);
			ls += l;
			rs += r;
			all_loss += l;
			all_right += r;
		}
		n_all += ev_sizes[w];
		v[0] = 0.1 * (w + 1);
		v[1] = 0.5;
		if (w != 2) { /* worker 2 reports no f1 */
			f1 += ev_sizes[w] * v[0];
			n_f1 += ev_sizes[w];
		}
		assert_int_equal(fb_eval_tally_add(&t, ev_sizes[w],
		                     ls / ev_sizes[w], rs / ev_sizes[w],
		                     w == 2 ? 0 : 2,
		                     (const char(*)[FB_EVAL_NAME_MAX])names, v),
		    FB_OK);
	}
	/* a worker without validation data adds nothing */
	assert_int_equal(fb_eval_tally_add(&t, 0, NAN, NAN, 0, NULL, NULL),
	    FB_OK);
	fb_eval_tally_mean(&t, &m);
	assert_int_equal(m.reports, EV_W);
	assert_true(m.examples == n_all);
	assert_true(fabs(m.loss - all_loss / n_all) < 1e-12);
	assert_true(fabs(m.accuracy - all_right / n_all) < 1e-12);
	assert_int_equal(m.metric_count, 2);
	assert_string_equal(m.name[0], "f1");
	assert_true(fabs(m.metric[0] - f1 / n_f1) < 1e-12);
	assert_true(fabs(m.metric[1] - 0.5) < 1e-12);
	/* and not the unweighted mean of the workers' accuracies */
	{
		double u = 0;
		for (uint32_t w = 0; w < EV_W; w++) {
			double rs = 0, l;
			int r;
			for (uint32_t k = 0; k < ev_sizes[w]; k++) {
				ev_examples(w, k, &l, &r);
				rs += r;
			}
			u += rs / ev_sizes[w] / EV_W;
		}
		assert_true(fabs(m.accuracy - u) > 1e-3);
	}
}

static void
test_eval_tally_refuses_bad_reports(void **state)
{
	fb_eval_tally t, before;
	char names[FB_EVAL_METRICS_MAX + 1][FB_EVAL_NAME_MAX];
	double v[FB_EVAL_METRICS_MAX + 1] = {0};
	char dup[2][FB_EVAL_NAME_MAX] = {"a", "a"};
	char empty[1][FB_EVAL_NAME_MAX] = {""};

	fb_eval_tally_init(&t);
	for (uint32_t k = 0; k <= FB_EVAL_METRICS_MAX; k++) {
		snprintf(names[k], sizeof(names[k]), "m%u", k);
	}
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 0.5, 3,
	                     (const char(*)[32])names, v),
	    FB_OK);
	before = t;
	assert_int_equal(fb_eval_tally_add(&t, 10, NAN, 0.5, 0, NULL, NULL),
	    FB_EINVAL);
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 1.5, 0, NULL, NULL),
	    FB_EINVAL);
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, -0.1, 0, NULL, NULL),
	    FB_EINVAL);
	assert_int_equal(fb_eval_tally_add(&t, 10, INFINITY, 0.5, 0, NULL,
	                     NULL),
	    FB_EINVAL);
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 0.5, 2,
	                     (const char(*)[32])dup, v),
	    FB_EINVAL);
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 0.5, 1,
	                     (const char(*)[32])empty, v),
	    FB_EINVAL);
	v[0] = NAN;
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 0.5, 1,
	                     (const char(*)[32])names, v),
	    FB_EINVAL);
	v[0] = 0;
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 0.5,
	                     FB_EVAL_METRICS_MAX + 1, (const char(*)[32])names,
	                     v),
	    FB_EINVAL);
	/* 3 names held, 6 new ones: more than the round can hold */
	assert_int_equal(fb_eval_tally_add(&t, 10, 1.0, 0.5, 6,
	                     (const char(*)[32])(names + 3), v),
	    FB_ERANGE);
	assert_memory_equal(&t, &before, sizeof(t));
}

/* The secure path: the four workers' extra coordinates summed in the ring
 * (the masks cancel in the sum) decode to the union's means. */
static void
test_eval_secure_sums_decode_to_the_union(void **state)
{
	fb_secagg_encodings e;
	uint32_t sum[FB_SECAGG_EXTRA] = {0}, out[FB_SECAGG_EXTRA];
	fb_eval_mean m;
	double all_loss = 0, all_right = 0, n_all = 0;
	const uint64_t max_samples = 5000;

	assert_int_equal(fb_secagg_encodings_init(&e, 32, EV_W, 4.0, 100.0),
	    FB_OK);
	for (uint32_t w = 0; w < EV_W; w++) {
		double ls = 0, rs = 0;
		fb_secagg_eval ev;
		for (uint32_t k = 0; k < ev_sizes[w]; k++) {
			double l;
			int r;
			ev_examples(w, k, &l, &r);
			ls += l;
			rs += r;
		}
		all_loss += ls;
		all_right += rs;
		n_all += ev_sizes[w];
		ev.v = (double)ev_sizes[w] / (double)max_samples;
		ev.loss = ls / ev_sizes[w];
		ev.accuracy = rs / ev_sizes[w];
		assert_int_equal(fb_secagg_encode_extras(&e, 0.1, 1.0, 1.0, &ev,
		                     1000, 99 + w, out),
		    FB_OK);
		for (uint32_t k = 0; k < FB_SECAGG_EXTRA; k++) {
			sum[k] += out[k];
		}
	}
	assert_int_equal(fb_secagg_decode_eval(&e, sum, max_samples, EV_W, &m),
	    FB_OK);
	assert_int_equal(m.reports, EV_W);
	assert_true(m.examples == n_all);
	/* bounds: EV_W units of 1/S over V = n_all / max_samples */
	assert_true(fabs(m.accuracy - all_right / n_all) <
	            EV_W * 1.01 / e.ev_acc.scale / (n_all / max_samples));
	assert_true(fabs(m.loss - all_loss / n_all) <
	            EV_W * 1.01 / e.ev_loss.scale / (n_all / max_samples));
	assert_int_equal(m.metric_count, 0);
	/* nobody with validation data: no evaluation, not an error */
	memset(sum, 0, sizeof(sum));
	assert_int_equal(fb_secagg_decode_eval(&e, sum, max_samples, EV_W, &m),
	    FB_OK);
	assert_int_equal(m.reports, 0);
	/* an accuracy sum no honest inputs give is refused */
	assert_int_equal(fb_encode_scalar(&e.ev_w, 1.0, 0.1, 0, 1, &sum[3]),
	    FB_OK);
	assert_int_equal(fb_encode_scalar(&e.ev_acc, 1.0, 0.9, 0, 1, &sum[5]),
	    FB_OK);
	assert_int_equal(fb_secagg_decode_eval(&e, sum, max_samples, EV_W, &m),
	    FB_ERANGE);
	/* v above 1 (more examples than max_samples) cannot be encoded */
	{
		fb_secagg_eval big = {.v = 1.5, .loss = 1, .accuracy = 1};
		assert_int_equal(fb_secagg_encode_extras(&e, 0.1, 1.0, 1.0,
		                     &big, 1000, 1, out),
		    FB_ERANGE);
	}
}

FB_TESTS = {
	{"federated evaluation: the tally is the union's mean",
	    test_eval_tally_is_the_unions_mean},
	{"federated evaluation: bad reports are refused, nothing added",
	    test_eval_tally_refuses_bad_reports},
	{"federated evaluation: secure sums decode to the union's means",
	    test_eval_secure_sums_decode_to_the_union},
    {"known answers from the numpy reference are within the header's bound",
        test_vectors_within_bound},
    {"adversarial tiny weights stay within the header's bound",
        test_adversarial_vector_within_bound},
    {"ring adds wrap mod 2^32 at every length", test_ring_add},
    {"adds give the scalar definition's sums bit for bit, ties and clamps "
     "included", test_add_bits_match_scalar},
    {"the result is bitwise the same for every order of updates",
        test_order_independent},
    {"chunks split the vector and the last one is shorter",
        test_chunk_boundaries},
    {"a chunk size larger than the vector gives one chunk",
        test_chunk_larger_than_count},
    {"bad sizes and clips are refused", test_bad_alloc_arguments},
    {"NaN or infinity in a chunk is refused and nothing is added",
        test_nonfinite_refused},
    {"weights summing above one are refused", test_weight_sum_above_one_refused},
    {"clipped coordinates are counted", test_clipped_counted},
    {"a chunk sent by only some updates is averaged over those",
        test_per_chunk_weights},
    {"apply moves params by lr times the mean and skips empty chunks",
        test_apply_leaves_empty_chunks},
    {"reset clears sums and weights", test_reset_clears},
    {"a thousand updates at the clip do not overflow",
        test_large_magnitude_stress},
    {"fedavg weights are sample shares and zero counts are refused",
        test_fedavg_weights},
    {"a clip that is not a float32 is honoured exactly",
        test_clip_not_a_float_is_honoured},
    {"adds from eight threads into the same chunks give the serial sum",
        test_concurrent_adds},
    {"concurrent adds never take a chunk's weight above one",
        test_concurrent_weight_limit},
    {"adds over many parts give the scalar sums bit for bit, inline and "
     "in parallel", test_multipart_bits_match_scalar},
    {"a NaN or infinity in any part leaves the sum's bytes, the weight and "
     "the clip count as they were, inline and in parallel",
        test_refused_chunk_leaves_sum},
    {"after a reset, chunks nobody adds into read as zero through every "
     "reader, a refused first add included", test_reset_then_partial_round},
    {"a ring add of the wrong length or chunk is refused",
        test_ring_add_checks_size},
    {NULL, NULL},
};

FB_TEST_MAIN("aggregation")
