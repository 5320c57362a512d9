/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fedbuff_test.c -- unit tests of aggregation/staleness.c, the weights of
 * asynchronous buffered aggregation, and of the buffer as the coordinator
 * builds it (coordinator/async.c): each update added into one accumulator
 * with weight n_i g(s_i) / (limit * n_max), then one server step with
 * fb_fedbuff_weights' scale. Known answers come from an independent numpy
 * reference (tests/vectors/fedbuff.txt, written by
 * tests/gen/fedbuff_vectors.py), held to aggregation.h's quantisation
 * bound plus float32 rounding; and the contract: bad arguments.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "tests/unit/harness.h"

#define VECTORS "tests/vectors/fedbuff.txt"
#define MAXN 64
#define MAXK 8
#define LINE_MAX_ 65536

static void
read_floats(const char *s, float *v, uint32_t n)
{
	char *end;

	for (uint32_t i = 0; i < n; i++) {
		v[i] = strtof(s, &end);
		assert_true(end != s);
		s = end;
	}
}

static void
read_doubles(const char *s, double *v, uint32_t n)
{
	char *end;

	for (uint32_t i = 0; i < n; i++) {
		v[i] = strtod(s, &end);
		assert_true(end != s);
		s = end;
	}
}

static FILE *
vectors(void)
{
	FILE *f = fopen(VECTORS, "r");

	if (f == NULL) {
		fail_msg("%s missing: run tests/gen/fedbuff_vectors.py", VECTORS);
	}
	return f;
}

static void
test_staleness_weight_known_answers(void **state)
{
	FILE *f = vectors();
	static char line[LINE_MAX_];
	uint32_t rows = 0;

	(void)state;
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long s;
		double want;
		if (sscanf(line, "gweight %llu %lf", &s, &want) == 2) {
			assert_true(fabs(fb_staleness_weight(s) - want) <= 1e-15);
			rows++;
		}
	}
	fclose(f);
	assert_int_equal(rows, 7);
}

/* One buffer of a case, as read. */
typedef struct buffer {
	uint32_t k;
	uint64_t n[MAXK], s[MAXK];
	double w[MAXK];
	float u[MAXK][MAXN];
	double scale;
	double expect[MAXN];
} buffer;

/* Adds the buffer's updates as the coordinator does and steps. Returns
 * the largest distance of the model from the reference's. */
static double
run_buffer(fb_accum *acc, fb_server_opt *opt, float *x, uint32_t n,
    const buffer *b, double *bound, double lr, double beta1, double clip)
{
	double w[MAXK], scale = 0, err = 0, wsum = 0;
	uint64_t n_max = 1;
	uint32_t limit = b->k + 4; /* buffer_size + live workers, say */

	fb_accum_reset(acc);
	for (uint32_t i = 0; i < b->k; i++) {
		n_max = b->n[i] > n_max ? b->n[i] : n_max;
	}
	for (uint32_t i = 0; i < b->k; i++) {
		double wi = (double)b->n[i] * fb_staleness_weight(b->s[i]) /
		    ((double)limit * (double)n_max);
		wsum += wi;
		for (uint32_t c = 0; c < fb_accum_chunk_count(acc); c++) {
			uint64_t off = (uint64_t)c *
			    fb_accum_chunk_len(acc, 0);
			assert_int_equal(fb_accum_add(acc, c, b->u[i] + off, wi,
			                     NULL),
			    FB_OK);
		}
	}
	assert_int_equal(fb_fedbuff_weights(b->n, b->s, b->k, w, &scale),
	    FB_OK);
	for (uint32_t i = 0; i < b->k; i++) {
		assert_true(fabs(w[i] - b->w[i]) <= 1e-15);
	}
	assert_true(fabs(scale - b->scale) <= 1e-15);
	assert_int_equal(fb_server_opt_step(opt, acc, x, scale), FB_OK);
	for (uint32_t j = 0; j < n; j++) {
		double d = fabs((double)x[j] - b->expect[j]);
		err = d > err ? d : err;
	}
	/* aggregation.h: the mean within K clip / (2^30 W); times the step
	 * (scale, lr, and avgm's 1 / (1 - beta1) at most), plus float32 */
	*bound += b->k * clip / (1073741824.0 * wsum) * scale * lr /
	    (1.0 - beta1);
	return err;
}

static void
test_buffers_match_numpy(void **state)
{
	FILE *f = vectors();
	static char line[LINE_MAX_];
	static buffer b;
	char name[64] = "", kind[16] = "";
	uint32_t n = 0, chunk = 0, nbuf = 0, cases = 0, steps = 0;
	double clip = 0, lr = 0, beta1 = 0, bound = 0;
	float x[MAXN];
	fb_accum *acc = NULL;
	fb_server_opt *opt = NULL;
	uint32_t got = 0;

	(void)state;
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long ni, si;
		double wi;
		if (sscanf(line, "case %63s %15s", name, kind) == 2) {
			bound = 0;
		} else if (sscanf(line, "dims %u %u %lf %u", &n, &chunk, &clip,
		               &nbuf) == 4) {
			assert_true(n <= MAXN);
		} else if (sscanf(line, "server %lf %lf", &lr, &beta1) == 2) {
			fb_server_opt_params p;
			fb_server_opt_params_default(&p, strcmp(kind, "sgd") == 0
			        ? FB_SERVER_SGD : FB_SERVER_AVGM);
			p.lr = lr;
			p.beta1 = beta1;
			assert_int_equal(fb_accum_alloc(n, chunk, clip, &acc), FB_OK);
			assert_int_equal(fb_server_opt_alloc(&p, n, &opt), FB_OK);
		} else if (strncmp(line, "model ", 6) == 0) {
			read_floats(line + 6, x, n);
		} else if (sscanf(line, "buffer %u", &b.k) == 1) {
			assert_true(b.k <= MAXK);
			got = 0;
		} else if (sscanf(line, "upd %llu %llu %lf", &ni, &si, &wi) == 3) {
			b.n[got] = ni;
			b.s[got] = si;
			b.w[got] = wi;
		} else if (strncmp(line, "send ", 5) == 0) {
			read_floats(line + 5, b.u[got++], n);
		} else if (sscanf(line, "scale %lf", &b.scale) == 1) {
			assert_int_equal(got, b.k);
		} else if (strncmp(line, "expect ", 7) == 0) {
			double err;
			read_doubles(line + 7, b.expect, n);
			err = run_buffer(acc, opt, x, n, &b, &bound, lr, beta1, clip);
			if (err > bound + 1e-6) {
				fail_msg("%s buffer: model off by %.3g (bound %.3g)",
				    name, err, bound);
			}
			steps++;
		} else if (strncmp(line, "end", 3) == 0) {
			fb_accum_free(acc);
			fb_server_opt_free(opt);
			acc = NULL;
			opt = NULL;
			cases++;
		}
	}
	fclose(f);
	assert_int_equal(cases, 4);
	assert_int_equal(steps, 7);
}

/* A fresh buffer is FedAvg: weights n_i / sum n, scale 1. */
static void
test_fresh_buffer_is_fedavg(void **state)
{
	uint64_t n[3] = {100, 300, 600}, s[3] = {0, 0, 0};
	double w[3], fw[3], scale = 0;

	(void)state;
	assert_int_equal(fb_fedbuff_weights(n, s, 3, w, &scale), FB_OK);
	assert_int_equal(fb_fedavg_weights(n, 3, fw), FB_OK);
	for (int i = 0; i < 3; i++) {
		assert_true(fabs(w[i] - fw[i]) <= 1e-15);
	}
	assert_true(fabs(scale - 1.0) <= 1e-15);
}

static void
test_bad_arguments_refused(void **state)
{
	uint64_t n[2] = {5, 0}, s[2] = {0, 0};
	double w[2], scale = 7;

	(void)state;
	assert_int_equal(fb_fedbuff_weights(n, s, 0, w, &scale), FB_EINVAL);
	assert_true(scale == 0);
	scale = 7;
	assert_int_equal(fb_fedbuff_weights(n, s, 2, w, &scale), FB_EINVAL);
	assert_true(scale == 0);
}

FB_TESTS = {
	{"the staleness weight is 1/sqrt(1 + s), as numpy says",
	    test_staleness_weight_known_answers},
	{"buffers added and stepped as the coordinator does match numpy",
	    test_buffers_match_numpy},
	{"a buffer of fresh updates is FedAvg", test_fresh_buffer_is_fedavg},
	{"no updates or a zero sample count is refused",
	    test_bad_arguments_refused},
	{NULL, NULL},
};

FB_TEST_MAIN("fedbuff")
