/* SPDX-License-Identifier: Apache-2.0 */
/*
 * model_test.c -- the built-in models, the plug-in ABI and model files.
 *
 * Gradients are checked against central finite differences of an
 * independent double-precision forward pass written here (softmax
 * cross-entropy for classification, squared error for regression); losses
 * against values worked out by hand; safetensors files against tampering.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model.h"
#include "tests/unit/harness.h"

/* The example plug-in of this build (tests/run exports FB_BUILD: build,
 * or build/san-* for a sanitizer build, which makes its own). */
static const char *
plugin_path(void)
{
	static char path[256];
	const char *b = getenv("FB_BUILD");

	snprintf(path, sizeof(path), "%s/examples/tiny.so",
	    b != NULL && *b != '\0' ? b : "build");
	return path;
}

static fb_model_spec
spec_mlp(uint32_t in, const uint32_t *hidden, uint32_t hc, uint32_t classes)
{
	fb_model_spec s;
	memset(&s, 0, sizeof(s));
	strcpy(s.arch, hc > 0 ? "mlp" : "logreg");
	s.input_dim = in;
	s.classes = classes;
	for (uint32_t i = 0; i < hc; i++) {
		s.hidden[i] = hidden[i];
	}
	s.hidden_count = hc;
	return s;
}

static fb_model_spec
spec_plugin(uint32_t in, uint32_t classes)
{
	fb_model_spec s;
	memset(&s, 0, sizeof(s));
	strcpy(s.arch, "plugin");
	snprintf(s.plugin, sizeof(s.plugin), "%s", plugin_path());
	s.input_dim = in;
	s.classes = classes;
	return s;
}

static fb_model *
open_ok(const fb_model_spec *s)
{
	fb_model *m = NULL;
	assert_int_equal(fb_model_open(s, &m), FB_OK);
	assert_non_null(m);
	return m;
}

static fb_model_spec
spec_regression(uint32_t in, const uint32_t *hidden, uint32_t hc)
{
	fb_model_spec s = spec_mlp(in, hidden, hc, 1);
	s.task = FB_TASK_REGRESSION;
	return s;
}

/* random_batch: normal features; labels below `classes`, or for classes 0
 * normal regression targets (scaled by 3, so errors are not small). */
static void
random_batch(uint32_t n, uint32_t dim, uint32_t classes, uint64_t seed,
    float *x, fb_label *y)
{
	fb_rng r;
	fb_rng_init(&r, seed, 7);
	for (size_t i = 0; i < (size_t)n * dim; i++) {
		x[i] = (float)fb_rng_normal(&r);
	}
	for (uint32_t i = 0; i < n; i++) {
		if (classes > 0) {
			y[i].cls = (int32_t)fb_rng_below(&r, classes);
		} else {
			y[i].value = (float)(3.0 * fb_rng_normal(&r));
		}
	}
}

/*
 * ref_loss is an independent forward pass in double over any chain of
 * nn.Linear layers described by the model's 2-D/1-D tensor pairs, with
 * `act` (0 ReLU, 1 tanh) between them: the mean softmax cross-entropy, or
 * for a regression model the mean of (output - target)^2.
 */
static double
ref_loss(const fb_model *m, const double *p, const float *x, const fb_label *y,
    uint32_t n, int act)
{
	uint32_t tc = fb_model_tensor_count(m);
	double total = 0.0;
	double *a = calloc(4096, sizeof(double)),
	       *b = calloc(4096, sizeof(double));

	assert_non_null(a);
	assert_non_null(b);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t width = fb_model_input_dim(m);
		double mx, sum = 0.0;
		for (uint32_t k = 0; k < width; k++) {
			a[k] = x[(size_t)i * width + k];
		}
		for (uint32_t t = 0; t < tc; t += 2) {
			fb_tensor_info w, bias;
			fb_model_tensor_info(m, t, &w);
			fb_model_tensor_info(m, t + 1, &bias);
			assert_int_equal(w.shape[1], width);
			for (uint64_t o = 0; o < w.shape[0]; o++) {
				double s = p[bias.offset + o];
				for (uint64_t k = 0; k < w.shape[1]; k++) {
					s += p[w.offset + o * w.shape[1] + k] *
					     a[k];
				}
				if (t + 2 < tc) {
					s = act == 0 ? (s > 0 ? s : 0)
					             : tanh(s);
				}
				b[o] = s;
			}
			width = (uint32_t)w.shape[0];
			memcpy(a, b, width * sizeof(double));
		}
		if (fb_model_task(m) == FB_TASK_REGRESSION) {
			double e = a[0] - (double)y[i].value;
			assert_int_equal(width, 1);
			total += e * e;
			continue;
		}
		mx = a[0];
		for (uint32_t c = 1; c < width; c++) {
			mx = a[c] > mx ? a[c] : mx;
		}
		for (uint32_t c = 0; c < width; c++) {
			sum += exp(a[c] - mx);
		}
		total += mx + log(sum) - a[y[i].cls];
	}
	free(a);
	free(b);
	return total / n;
}

/*
 * check_gradient compares forward_backward's gradient with central
 * differences of ref_loss on `probe` parameters (all when 0).
 */
static void
check_gradient(const fb_model_spec *spec, uint32_t n, uint32_t probe, int act)
{
	fb_model *m = open_ok(spec);
	const fb_model_ops *ops = fb_model_get_ops(m);
	uint64_t np = fb_model_param_count(m);
	uint32_t dim = spec->input_dim;
	float *p = malloc(np * sizeof(float)), *g = malloc(np * sizeof(float));
	double *pd = malloc(np * sizeof(double));
	float *x = malloc((size_t)n * dim * sizeof(float));
	fb_label *y = malloc(n * sizeof(*y));
	void *ws = fb_alloc(ops->workspace_len(fb_model_state(m), n));
	float loss;
	uint64_t checks = probe == 0 ? np : probe;
	fb_rng r;
	double worst = 0.0;

	assert_true(p && g && pd && x && y && ws);
	fb_model_init_params(m, p, 11);
	random_batch(n, dim,
	    spec->task == FB_TASK_REGRESSION ? 0 : spec->classes, 5, x, y);
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, n, g, &loss, ws),
	    FB_OK);
	for (uint64_t i = 0; i < np; i++) {
		pd[i] = p[i];
	}
	assert_true(fabs(loss - ref_loss(m, pd, x, y, n, act)) < 1e-5);
	fb_rng_init(&r, 3, 0);
	for (uint64_t c = 0; c < checks; c++) {
		uint64_t i = probe == 0 ? c : fb_rng_below(&r, np);
		double eps = 1e-5, keep = pd[i], lp, lm, fd, err;
		pd[i] = keep + eps;
		lp = ref_loss(m, pd, x, y, n, act);
		pd[i] = keep - eps;
		lm = ref_loss(m, pd, x, y, n, act);
		pd[i] = keep;
		fd = (lp - lm) / (2 * eps);
		err = fabs(g[i] - fd) / (1e-3 * fabs(fd) + 1e-5);
		worst = err > worst ? err : worst;
		if (err > 1.0) {
			fprintf(stderr, "param %llu: grad %.8g, fd %.8g\n",
			    (unsigned long long)i, g[i], fd);
		}
	}
	assert_true(worst <= 1.0);
	fb_free(ws);
	free(p);
	free(g);
	free(pd);
	free(x);
	free(y);
	fb_model_close(m);
}

static void
test_mlp_gradient(void **state)
{
	static const uint32_t h[] = {7, 5};
	fb_model_spec s = spec_mlp(20, h, 2, 3);
	check_gradient(&s, 6, 0, 0);
}

static void
test_logreg_gradient(void **state)
{
	fb_model_spec s = spec_mlp(30, NULL, 0, 4);
	check_gradient(&s, 9, 0, 0);
}

static void
test_big_mlp_gradient(void **state)
{
	static const uint32_t h[] = {33};
	fb_model_spec s = spec_mlp(784, h, 1, 10);
	check_gradient(&s, 13, 200, 0);
}

static void
test_many_classes_gradient(void **state)
{
	/* 300 classes: labels beyond a byte travel as int32. */
	static const uint32_t h[] = {6};
	fb_model_spec s = spec_mlp(5, h, 1, 300);
	check_gradient(&s, 40, 400, 0);
}

static void
test_mlp_regression_gradient(void **state)
{
	static const uint32_t h[] = {7, 5};
	fb_model_spec s = spec_regression(20, h, 2);
	check_gradient(&s, 6, 0, 0);
}

static void
test_logreg_regression_gradient(void **state)
{
	fb_model_spec s = spec_regression(30, NULL, 0);
	check_gradient(&s, 9, 0, 0);
}

static void
test_hand_regression_loss(void **state)
{
	/* linear regression 2 -> 1 with w = (1, -1), b = 0.5:
	 * x = (1, 2), t = 1:    z = -0.5, e = -1.5
	 * x = (3, 0), t = -0.5: z = 3.5,  e = 4
	 * loss = (2.25 + 16) / 2 = 9.125; dL/db = 2 mean(e) = 2.5,
	 * dL/dw = 2 mean(e x) = (-1.5 + 12, -3) = (10.5, -3). */
	fb_model_spec s = spec_regression(2, NULL, 0);
	fb_model *m = open_ok(&s);
	const fb_model_ops *ops = fb_model_get_ops(m);
	float p[3] = {1, -1, 0.5f}, g[3], loss;
	float x[4] = {1, 2, 3, 0};
	fb_label y[2] = {{.value = 1.0f}, {.value = -0.5f}};
	void *ws = fb_alloc(ops->workspace_len(fb_model_state(m), 2));
	double mse, acc;

	assert_int_equal(fb_model_param_count(m), 3);
	assert_int_equal(fb_model_task(m), FB_TASK_REGRESSION);
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_OK);
	assert_true(fabs(loss - 9.125) < 1e-6);
	assert_true(fabs(g[0] - 10.5) < 1e-5);
	assert_true(fabs(g[1] + 3.0) < 1e-5);
	assert_true(fabs(g[2] - 2.5) < 1e-5);
	assert_int_equal(fb_model_evaluate(m, p, x, y, 2, &mse, &acc), FB_OK);
	assert_true(fabs(mse - 9.125) < 1e-6);
	assert_true(isnan(acc)); /* regression has no accuracy */
	fb_free(ws);
	fb_model_close(m);
}

static void
test_bad_targets(void **state)
{
	fb_model_spec s = spec_regression(2, NULL, 0);
	fb_model *m = open_ok(&s);
	const fb_model_ops *ops = fb_model_get_ops(m);
	float p[3] = {0}, g[3], x[4] = {0}, loss;
	fb_label y[2] = {{.value = 1.0f}, {.value = NAN}};
	void *ws = fb_alloc(ops->workspace_len(fb_model_state(m), 2));
	double mse, acc;

	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_EINVAL);
	y[1].value = INFINITY;
	assert_int_equal(fb_model_evaluate(m, p, x, y, 2, &mse, &acc),
	    FB_EINVAL);
	y[1].value = -2.0f;
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_OK);
	fb_free(ws);
	fb_model_close(m);
}

static void
test_hand_loss(void **state)
{
	/* logreg 2 -> 2 with W = I, b = (0, 0.5):
	 * x = (1, 2), y = 0: z = (1, 2.5), loss = log(1 + e^1.5)
	 * x = (0, 0), y = 1: z = (0, 0.5), loss = log(1 + e^-0.5)
	 * and dL/db0 = mean(softmax0 - onehot0). */
	fb_model_spec s = spec_mlp(2, NULL, 0, 2);
	fb_model *m = open_ok(&s);
	const fb_model_ops *ops = fb_model_get_ops(m);
	float p[6] = {1, 0, 0, 1, 0, 0.5f}, g[6], loss;
	float x[4] = {1, 2, 0, 0};
	fb_label y[2] = {{.cls = 0}, {.cls = 1}};
	void *ws = fb_alloc(ops->workspace_len(fb_model_state(m), 2));
	double want = (log(1 + exp(1.5)) + log(1 + exp(-0.5))) / 2;
	double s0a = 1 / (1 + exp(1.5)), s0b = 1 / (1 + exp(0.5));
	double mean_loss, acc;

	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_OK);
	assert_true(fabs(loss - want) < 1e-6);
	assert_true(fabs(g[4] - ((s0a - 1) + s0b) / 2) < 1e-6);
	assert_true(fabs(g[5] + g[4]) < 1e-6);
	assert_int_equal(
	    fb_model_evaluate(m, p, x, y, 2, &mean_loss, &acc), FB_OK);
	assert_true(fabs(mean_loss - want) < 1e-6);
	/* example 1 predicts class 1 (wrong), example 2 class 1 (right) */
	assert_true(fabs(acc - 0.5) < 1e-12);
	fb_free(ws);
	fb_model_close(m);
}

static void
test_init_deterministic(void **state)
{
	static const uint32_t h[] = {128};
	fb_model_spec s = spec_mlp(784, h, 1, 10);
	fb_model *m = open_ok(&s);
	uint64_t np = fb_model_param_count(m);
	float *a = malloc(np * 4), *b = malloc(np * 4), *c = malloc(np * 4);
	fb_tensor_info ti;

	fb_model_init_params(m, a, 42);
	fb_model_init_params(m, b, 42);
	fb_model_init_params(m, c, 43);
	assert_memory_equal(a, b, np * 4);
	assert_memory_not_equal(a, c, np * 4);
	/* fc1 within 1/sqrt(784), fc2 within 1/sqrt(128), not all tiny */
	fb_model_tensor_info(m, 0, &ti);
	for (uint64_t i = 0; i < 102400; i++) {
		double bound = i < 100480 ? 1 / 28.0 : 1 / sqrt(128.0);
		assert_true(i >= np || fabs(a[i]) <= bound);
	}
	{
		double mx = 0;
		for (uint64_t i = 0; i < ti.count; i++) {
			mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
		}
		assert_true(mx > 0.9 / 28.0);
	}
	free(a);
	free(b);
	free(c);
	fb_model_close(m);
}

static void
test_forward_bitwise(void **state)
{
	static const uint32_t h[] = {128, 37};
	fb_model_spec s = spec_mlp(784, h, 2, 10);
	fb_model *m = open_ok(&s);
	const fb_model_ops *ops = fb_model_get_ops(m);
	uint64_t np = fb_model_param_count(m);
	size_t wl = ops->workspace_len(fb_model_state(m), 67);
	float *p = malloc(np * 4), *g1 = malloc(np * 4), *g2 = malloc(np * 4);
	float *x = malloc(67 * 784 * 4), l1, l2;
	fb_label y[67];
	void *w1 = fb_alloc(wl), *w2 = fb_alloc(wl);

	memset(w2, 0x5a, wl); /* a dirty workspace must not matter */
	fb_model_init_params(m, p, 1);
	random_batch(67, 784, 10, 2, x, y);
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 67, g1, &l1, w1),
	    FB_OK);
	memset(g2, 0x77, np * 4);
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 67, g2, &l2, w2),
	    FB_OK);
	assert_memory_equal(g1, g2, np * 4);
	assert_memory_equal(&l1, &l2, sizeof(l1));
	fb_free(w1);
	fb_free(w2);
	free(p);
	free(g1);
	free(g2);
	free(x);
	fb_model_close(m);
}

static void
test_bad_labels(void **state)
{
	static const uint32_t h[] = {4};
	fb_model_spec s = spec_mlp(3, h, 1, 3);
	fb_model *m = open_ok(&s);
	const fb_model_ops *ops = fb_model_get_ops(m);
	float p[64], g[64], x[6] = {0}, loss;
	fb_label y[2] = {{.cls = 2}, {.cls = 3}};
	void *ws = fb_alloc(ops->workspace_len(fb_model_state(m), 2));
	double ml, acc;

	assert_true(fb_model_param_count(m) <= 64);
	fb_model_init_params(m, p, 1);
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_EINVAL);
	assert_int_equal(
	    fb_model_evaluate(m, p, x, y, 2, &ml, &acc), FB_EINVAL);
	y[1].cls = 255;
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_EINVAL);
	y[1].cls = -1; /* negative int32 labels too */
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_EINVAL);
	assert_int_equal(
	    fb_model_evaluate(m, p, x, y, 2, &ml, &acc), FB_EINVAL);
	y[1].cls = 0;
	assert_int_equal(
	    ops->forward_backward(fb_model_state(m), p, x, y, 2, g, &loss, ws),
	    FB_OK);
	fb_free(ws);
	fb_model_close(m);
}

static void
test_describe_and_counts(void **state)
{
	static const uint32_t h[] = {128};
	fb_model_spec s = spec_mlp(784, h, 1, 10);
	fb_model *m = open_ok(&s);
	char buf[128];
	fb_tensor_info ti;

	assert_int_equal(fb_model_param_count(m), 101770);
	assert_int_equal(fb_model_tensor_count(m), 4);
	fb_model_describe(m, buf, sizeof(buf));
	assert_string_equal(buf, "mlp 784-128-10 (101770 params)");
	fb_model_tensor_info(m, 2, &ti);
	assert_string_equal(ti.name, "fc2.weight");
	assert_int_equal(ti.ndim, 2);
	assert_int_equal(ti.shape[0], 10);
	assert_int_equal(ti.shape[1], 128);
	assert_int_equal(ti.offset, 100480);
	fb_model_tensor_info(m, 3, &ti);
	assert_string_equal(ti.name, "fc2.bias");
	assert_int_equal(ti.offset, 101760);
	fb_model_close(m);

	s = spec_mlp(784, NULL, 0, 10);
	m = open_ok(&s);
	fb_model_describe(m, buf, sizeof(buf));
	assert_string_equal(buf, "logreg 784-10 (7850 params)");
	fb_model_close(m);

	memset(&s, 0, sizeof(s));
	strcpy(s.arch, "synthetic");
	s.synthetic_params = 1000;
	m = open_ok(&s);
	fb_model_describe(m, buf, sizeof(buf));
	assert_string_equal(buf, "synthetic (1000 params)");
	fb_model_tensor_info(m, 0, &ti);
	assert_string_equal(ti.name, "weight");
	assert_int_equal(ti.shape[0], 1000);
	assert_null(fb_model_get_ops(m)->forward_backward);
	{
		float p[1000];
		fb_label one = {.cls = 1};
		double ml, acc;
		fb_model_init_params(m, p, 9);
		for (int i = 0; i < 1000; i++) {
			assert_true(p[i] == 0.0f);
		}
		assert_int_equal(
		    fb_model_evaluate(m, p, p, &one, 1, &ml, &acc),
		    FB_ENOTSUP);
	}
	fb_model_close(m);
}

static void
test_bad_specs(void **state)
{
	static const uint32_t h[] = {8, 0};
	fb_model_spec s = spec_mlp(10, h, 1, 3);
	fb_model *m = (fb_model *)&s;

	strcpy(s.arch, "transformer");
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	assert_null(m);
	s = spec_mlp(10, h, 1, 1);
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s = spec_mlp(0, h, 1, 3);
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s = spec_mlp(10, h, 2, 3); /* width 0 */
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s = spec_mlp(10, h, 1, 3);
	s.hidden_count = 0; /* mlp needs a hidden layer */
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s.hidden_count = FB_MODEL_MAX_HIDDEN + 1;
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s = spec_mlp(4000000000u, h, 1, 3);
	s.hidden[0] = 4000000000u; /* 1.6e19 weights */
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	memset(&s, 0, sizeof(s));
	strcpy(s.arch, "synthetic");
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s.synthetic_params = (uint64_t)1 << 41;
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	assert_null(m);
	/* regression has exactly one output; tasks are 0 or 1 */
	s = spec_regression(10, h, 1);
	s.classes = 2;
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s.classes = 0;
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	s = spec_mlp(10, h, 1, 3);
	s.task = 2;
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	assert_null(m);
	/* the example plug-in is a classifier only */
	s = spec_plugin(10, 1);
	s.task = FB_TASK_REGRESSION;
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	assert_null(m);
}

static char *
tmp_path(const char *name)
{
	static char buf[8][600];
	static int k;
	char *p = buf[k++ % 8];
	snprintf(p, 600, "%s/%s", fb_test_tmpdir(), name);
	return p;
}

static uint8_t *
slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *b;
	long n;
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc((size_t)n + 1);
	assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return b;
}

static void
spit(const char *path, const void *b, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, len, f), len);
	fclose(f);
}

static void
test_safetensors_roundtrip(void **state)
{
	static const uint32_t h[] = {128};
	fb_model_spec s = spec_mlp(784, h, 1, 10);
	fb_model *m = open_ok(&s);
	uint64_t np = fb_model_param_count(m);
	float *a = malloc(np * 4), *b = malloc(np * 4);
	const char *const meta[][2] = {
	    {"fedbox.round", "17"},
	    {"note", "quote \" back\\slash\nnewline\ttab \x01"},
	};
	const char *path = tmp_path("rt.safetensors");
	uint32_t round = 99;
	size_t len;
	uint8_t *file;

	fb_model_init_params(m, a, 5);
	a[0] = -0.0f;
	a[1] = 1e-42f; /* subnormal survives */
	assert_int_equal(fb_model_save_safetensors(m, a, path, meta, 2), FB_OK);
	memset(b, 0xff, np * 4);
	assert_int_equal(fb_model_load_safetensors(m, path, b, &round), FB_OK);
	assert_memory_equal(a, b, np * 4);
	assert_int_equal(round, 17);
	file = slurp(path, &len);
	assert_int_equal(fb_load_le64(file) % 8, 0);
	assert_int_equal(len, 8 + fb_load_le64(file) + np * 4);
	assert_non_null(strstr((char *)file + 8,
	    "\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[128,784]"));
	assert_non_null(strstr((char *)file + 8,
	    "quote \\\" back\\\\slash\\nnewline\\ttab \\u0001"));
	free(file);
	/* a long value (a data set's description: 784 means and stds) is
	 * kept whole, and the file still loads (--resume) */
	{
		size_t n = 784 * 2 * 16 + 64;
		char *big = malloc(n);
		const char *const meta2[][2] = {{"fedbox.preprocessing", big},
		    {"fedbox.round", "18"}};
		assert_non_null(big);
		memset(big, 'x', n - 1);
		big[n - 1] = '\0';
		assert_int_equal(
		    fb_model_save_safetensors(m, a, path, meta2, 2), FB_OK);
		assert_int_equal(
		    fb_model_load_safetensors(m, path, b, &round), FB_OK);
		assert_int_equal(round, 18);
		assert_memory_equal(a, b, np * 4);
		file = slurp(path, &len);
		assert_non_null(strstr((char *)file + 8, big));
		free(file);
		free(big);
	}
	/* no metadata: round reads 0 */
	assert_int_equal(fb_model_save_safetensors(m, a, path, NULL, 0), FB_OK);
	assert_int_equal(fb_model_load_safetensors(m, path, b, &round), FB_OK);
	assert_int_equal(round, 0);
	assert_memory_equal(a, b, np * 4);
	free(a);
	free(b);
	fb_model_close(m);
}

/* A file as other tools write it: keys in another order, data of fc1.bias
 * before fc1.weight, whitespace in the header. */
static void
test_safetensors_foreign_order(void **state)
{
	fb_model_spec s = spec_mlp(2, NULL, 0, 2);
	fb_model *m = open_ok(&s);
	const char hdr[] =
	    "{ \"fc1.bias\": {\"shape\": [2], \"dtype\": \"F32\""
	    ", \"data_offsets\": [0, 8]}, \"__metadata__\": {\"format\": "
	    "\"pt\"}, \"fc1.weight\": {\"dtype\": \"F32\", \"shape\": [2, 2],"
	    " \"data_offsets\": [8, 24]}}";
	float data[6] = {5, 6, 1, 2, 3, 4}, p[6];
	uint8_t buf[512];
	size_t hl = sizeof(hdr) - 1;
	const char *path = tmp_path("foreign.safetensors");

	fb_store_le64(buf, hl);
	memcpy(buf + 8, hdr, hl);
	memcpy(buf + 8 + hl, data, sizeof(data));
	spit(path, buf, 8 + hl + sizeof(data));
	assert_int_equal(fb_model_load_safetensors(m, path, p, NULL), FB_OK);
	assert_true(p[0] == 1 && p[3] == 4 && p[4] == 5 && p[5] == 6);
	fb_model_close(m);
}

static void
test_safetensors_rejects(void **state)
{
	static const uint32_t h[] = {16};
	static const uint32_t h2[] = {17};
	fb_model_spec s = spec_mlp(20, h, 1, 3);
	fb_model_spec s2 = spec_mlp(20, h2, 1, 3);
	fb_model *m = open_ok(&s), *m2 = open_ok(&s2);
	uint64_t np = fb_model_param_count(m);
	float *p = malloc(np * 4), *q = malloc(np * 4 + 64);
	const char *good = tmp_path("good.safetensors");
	const char *badp = tmp_path("bad.safetensors");
	size_t len;
	uint8_t *file, *copy;
	char *at;

	fb_model_init_params(m, p, 1);
	assert_int_equal(fb_model_save_safetensors(m, p, good, NULL, 0), FB_OK);
	file = slurp(good, &len);
	copy = malloc(len + 16);

	/* truncated: data short by one byte, and inside the header */
	spit(badp, file, len - 1);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	spit(badp, file, 20);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	spit(badp, file, 5);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* trailing bytes */
	memcpy(copy, file, len);
	memset(copy + len, 0, 4);
	spit(badp, copy, len + 4);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* wrong shape: a model with 17 hidden units reads the 16 file */
	assert_int_equal(
	    fb_model_load_safetensors(m2, good, q, NULL), FB_EFORMAT);
	/* wrong dtype */
	memcpy(copy, file, len);
	at = strstr((char *)copy + 8, "F32");
	assert_non_null(at);
	memcpy(at, "F16", 3);
	spit(badp, copy, len);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* shifted offsets */
	memcpy(copy, file, len);
	at = strstr((char *)copy + 8, "[0,1280]");
	assert_non_null(at);
	memcpy(at, "[4,1284]", 8);
	spit(badp, copy, len);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* renamed tensor */
	memcpy(copy, file, len);
	at = strstr((char *)copy + 8, "fc2.bias");
	memcpy(at, "fc9", 3);
	spit(badp, copy, len);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* garbage header */
	memcpy(copy, file, len);
	memset(copy + 8, '#', 16);
	spit(badp, copy, len);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* header length beyond the file, and absurd */
	memcpy(copy, file, len);
	fb_store_le64(copy, len);
	spit(badp, copy, len);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	fb_store_le64(copy, UINT64_MAX);
	spit(badp, copy, len);
	assert_int_equal(
	    fb_model_load_safetensors(m, badp, q, NULL), FB_EFORMAT);
	/* missing file */
	assert_int_equal(fb_model_load_safetensors(
	                     m, tmp_path("absent.safetensors"), q, NULL),
	    FB_EIO);
	/* the good file still loads */
	assert_int_equal(fb_model_load_safetensors(m, good, q, NULL), FB_OK);
	assert_memory_equal(p, q, np * 4);
	free(file);
	free(copy);
	free(p);
	free(q);
	fb_model_close(m);
	fb_model_close(m2);
}

static void
test_plugin_loads(void **state)
{
	fb_model_spec s = spec_plugin(784, 10);
	fb_model *m = open_ok(&s);
	char buf[128];

	fb_model_describe(m, buf, sizeof(buf));
	assert_string_equal(buf, "tiny-tanh 784-32-10 (25450 params)");
	fb_model_close(m);
	s = spec_plugin(784, 10);
	check_gradient(&s, 7, 200, 1);
	s = spec_plugin(12, 3);
	check_gradient(&s, 5, 0, 1);
}

static void
test_bad_plugin(void **state)
{
	fb_model_spec s = spec_plugin(784, 10);
	fb_model *m = NULL;

	strcpy(s.plugin, "build/examples/no-such-plugin.so");
	assert_int_equal(fb_model_open(&s, &m), FB_EIO);
	assert_null(m);
	/* a library without the symbol */
	strcpy(s.plugin, "libm.so.6");
	assert_int_equal(fb_model_open(&s, &m), FB_EIO);
	/* not a library at all */
	strcpy(s.plugin, "model/model.h");
	assert_int_equal(fb_model_open(&s, &m), FB_EIO);
	s.plugin[0] = '\0';
	assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
	assert_null(m);
}

static void
test_gemm_speed(void **state)
{
	static const uint32_t h[] = {128};
	fb_model_spec s = spec_mlp(784, h, 1, 10);
	fb_model *m = open_ok(&s);
	const fb_model_ops *ops = fb_model_get_ops(m);
	uint64_t np = fb_model_param_count(m);
	float *p = malloc(np * 4), *g = malloc(np * 4);
	float *x = malloc(64 * 784 * 4), loss;
	fb_label y[64];
	void *ws = fb_alloc(ops->workspace_len(fb_model_state(m), 64));
	double flops = 2.0 * 64 * (2.0 * 784 * 128 + 3.0 * 128 * 10);
	double t0, t;
	int iters = 0;

	fb_model_init_params(m, p, 1);
	random_batch(64, 784, 10, 3, x, y);
	t0 = fb_now_s();
	do {
		assert_int_equal(ops->forward_backward(fb_model_state(m), p, x,
		                     y, 64, g, &loss, ws),
		    FB_OK);
		iters++;
	} while ((t = fb_now_s() - t0) < 0.5);
	printf("# speed: mlp 784-128-10 batch 64 forward+backward: %.3f ms "
	       "per step, %.2f GFLOP/s\n",
	    t / iters * 1e3, flops * iters / t / 1e9);
	fb_free(ws);
	free(p);
	free(g);
	free(x);
	fb_model_close(m);
}

/* ---- initial models (model.arch: init) --------------------------------- */

/* write_st writes a safetensors file of header `hdr` (as is) and `data`. */
static void
write_st(const char *path, const char *hdr, const void *data, size_t len)
{
	size_t hl = strlen(hdr);
	uint8_t *buf = malloc(8 + hl + len + 1);

	assert_non_null(buf);
	fb_store_le64(buf, hl);
	memcpy(buf + 8, hdr, hl);
	if (len > 0) {
		memcpy(buf + 8 + hl, data, len);
	}
	spit(path, buf, 8 + hl + len);
	free(buf);
}

static fb_model_spec
spec_init(const char *path)
{
	fb_model_spec s;
	memset(&s, 0, sizeof(s));
	strcpy(s.arch, "init");
	snprintf(s.init, sizeof(s.init), "%s", path);
	s.input_dim = 784;
	s.classes = 10;
	return s;
}

/* open_init_bad: the file at `path` is refused, with nothing returned,
 * and the error names `want`. */
static void
open_init_bad(const char *path, fb_err want_rc, const char *want)
{
	fb_model_spec s = spec_init(path);
	fb_model *m = (fb_model *)&s; /* must come back NULL */

	fb_log_clear_error();
	assert_int_equal(fb_model_open(&s, &m), want_rc);
	assert_null(m);
	if (strstr(fb_log_last_error(), want) == NULL) {
		fprintf(stderr, "error \"%s\" lacks \"%s\"\n",
		    fb_log_last_error(), want);
		fail();
	}
}

static void
test_init_file_good(void **state)
{
	/* Header order differs from data order; the layout follows the data:
	 * b.weight (F16), b.bias (BF16), n.running_mean (F64), then a.x
	 * (F32); n.num_batches_tracked (I64) is skipped. */
	const char hdr[] =
	    "{\"__metadata__\":{\"fedbox.model\":\"m.py:Net\"},"
	    "\"a.x\":{\"dtype\":\"F32\",\"shape\":[2,1,1,1],"
	    "\"data_offsets\":[32,40]},"
	    "\"b.weight\":{\"dtype\":\"F16\",\"shape\":[2,2],"
	    "\"data_offsets\":[0,8]},"
	    "\"n.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],"
	    "\"data_offsets\":[40,48]},"
	    "\"b.bias\":{\"dtype\":\"BF16\",\"shape\":[2],"
	    "\"data_offsets\":[8,12]},"
	    "\"n.running_mean\":{\"dtype\":\"F64\",\"shape\":[2],"
	    "\"data_offsets\":[12,28]},"
	    "\"pad\":{\"dtype\":\"U8\",\"shape\":[4],"
	    "\"data_offsets\":[28,32]}}";
	uint8_t data[48];
	/* F16 1.0, -2.0, 0.5, 65504; BF16 3.0, -0.25 */
	const uint16_t f16[4] = {0x3c00, 0xc000, 0x3800, 0x7bff};
	const uint16_t bf16[2] = {0x4040, 0xbe80};
	const double f64[2] = {0.125, -1e30};
	const float f32[2] = {7.5f, -8.0f};
	const int64_t nbt = 12345;
	const char *path = tmp_path("init-good.safetensors");
	fb_model_spec s = spec_init(path);
	fb_model *m;
	fb_tensor_info ti;
	float p[10];
	char desc[128];

	memcpy(data, f16, 8);
	memcpy(data + 8, bf16, 4);
	memcpy(data + 12, f64, 16);
	memset(data + 28, 7, 4);
	memcpy(data + 32, f32, 8);
	memcpy(data + 40, &nbt, 8);
	write_st(path, hdr, data, sizeof(data));
	m = open_ok(&s);
	assert_int_equal(fb_model_param_count(m), 10);
	assert_int_equal(fb_model_tensor_count(m), 4);
	fb_model_tensor_info(m, 0, &ti);
	assert_string_equal(ti.name, "b.weight");
	assert_int_equal(ti.ndim, 2);
	assert_int_equal(ti.offset, 0);
	fb_model_tensor_info(m, 1, &ti);
	assert_string_equal(ti.name, "b.bias");
	assert_int_equal(ti.offset, 4);
	fb_model_tensor_info(m, 2, &ti);
	assert_string_equal(ti.name, "n.running_mean");
	assert_int_equal(ti.offset, 6);
	fb_model_tensor_info(m, 3, &ti);
	assert_string_equal(ti.name, "a.x");
	assert_int_equal(ti.ndim, 4);
	assert_int_equal(ti.offset, 8);
	/* the values, whatever the seed */
	fb_model_init_params(m, p, 99);
	assert_true(p[0] == 1.0f && p[1] == -2.0f && p[2] == 0.5f &&
	            p[3] == 65504.0f);
	assert_true(p[4] == 3.0f && p[5] == -0.25f);
	assert_true(p[6] == 0.125f && p[7] == (float)-1e30);
	assert_true(p[8] == 7.5f && p[9] == -8.0f);
	/* no code: it neither trains nor evaluates */
	assert_null(fb_model_get_ops(m)->forward_backward);
	assert_null(fb_model_get_ops(m)->evaluate);
	fb_model_describe(m, desc, sizeof(desc));
	assert_non_null(strstr(desc, "init"));
	assert_non_null(strstr(desc, "10 params"));
	fb_model_close(m);
}

static void
test_init_file_rejects(void **state)
{
	const char *path = tmp_path("init-bad.safetensors");
	float four[4] = {1, 2, 3, 4};
	uint8_t buf[64];
	char hdr[512];
	static const struct {
		const char *hdr;  /* a tensor or two; data: four floats */
		const char *want; /* in the error */
	} cases[] = {
	    {"{\"t\":{\"dtype\":\"C64\",\"shape\":[2],"
	     "\"data_offsets\":[0,16]}}",
	        "tensor t has dtype C64"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[3],"
	     "\"data_offsets\":[0,16]}}",
	        "tensor t: data_offsets [0, 16] hold 16 bytes; shape [3]"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
	     "\"data_offsets\":[0,8]},\"u\":{\"dtype\":\"F32\","
	     "\"shape\":[2],\"data_offsets\":[4,12]}}",
	        "tensor u's data begin at byte 4"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
	     "\"data_offsets\":[0,8]},\"u\":{\"dtype\":\"F32\","
	     "\"shape\":[1],\"data_offsets\":[12,16]}}",
	        "tensor u's data begin at byte 12"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[3],"
	     "\"data_offsets\":[0,12]}}",
	        "the tensors cover 12 bytes of data; the file holds 16"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],"
	     "\"data_offsets\":[0,4]},\"u\":{\"dtype\":\"F32\","
	     "\"shape\":[3],\"data_offsets\":[4,16]}}",
	        "tensor t has rank 0"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],"
	     "\"data_offsets\":[0,16]}}",
	        "tensor t has rank 5"},
	    {"{\"z\":{\"dtype\":\"F32\",\"shape\":[0,2],"
	     "\"data_offsets\":[0,0]},\"t\":{\"dtype\":\"F32\","
	     "\"shape\":[4],\"data_offsets\":[0,16]}}",
	        "tensor z has no elements"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],"
	     "\"data_offsets\":[0,8]},\"t\":{\"dtype\":\"F32\","
	     "\"shape\":[2],\"data_offsets\":[8,16]}}",
	        "tensor t appears twice"},
	    {"{\"t\":{\"dtype\":\"I32\",\"shape\":[4],"
	     "\"data_offsets\":[0,16]}}",
	        "no floating-point tensor"},
	    {"{\"__metadata__\":{}}", "it holds no tensors"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],"
	     "\"data_offsets\":[0,16]}", "expected '}'"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4]}}",
	        "tensor t lacks dtype, shape or data_offsets"},
	    {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],"
	     "\"data_offsets\":[16,0]}}",
	        "tensor t has bad data_offsets"},
	    {"{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
	        "is longer than 63 bytes"},
	};
	float nan4[4] = {1, 2, NAN, 4};
	const double big[2] = {1.0, 1e300};

	for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
		write_st(path, cases[i].hdr, four, sizeof(four));
		open_init_bad(path, FB_EINVAL, cases[i].want);
		/* each error names the file too */
		assert_non_null(strstr(fb_log_last_error(), path));
	}
	/* a NaN, and an F64 beyond float32: named with the element */
	snprintf(hdr, sizeof(hdr), "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],"
	                           "\"data_offsets\":[0,16]}}");
	write_st(path, hdr, nan4, sizeof(nan4));
	open_init_bad(path, FB_EINVAL, "tensor w: element 2 is not finite");
	snprintf(hdr, sizeof(hdr), "{\"d\":{\"dtype\":\"F64\",\"shape\":[2],"
	                           "\"data_offsets\":[0,16]}}");
	write_st(path, hdr, big, sizeof(big));
	open_init_bad(path, FB_EINVAL, "tensor d: element 1 is not finite");
	/* header lengths: past the file, over the limit, too short a file */
	fb_store_le64(buf, 1000);
	memcpy(buf + 8, "{}", 2);
	spit(path, buf, 10);
	open_init_bad(path, FB_EINVAL, "header length 1000");
	fb_store_le64(buf, (uint64_t)1 << 40);
	spit(path, buf, 10);
	open_init_bad(path, FB_EINVAL, "header length 1099511627776");
	spit(path, buf, 5);
	open_init_bad(path, FB_EINVAL, "shorter than its 8-byte header");
	/* absent, and not a file */
	open_init_bad(tmp_path("init-absent.safetensors"), FB_EIO,
	    "cannot open");
	open_init_bad(fb_test_tmpdir(), FB_EINVAL, "not a regular file");
	{
		fb_model_spec s = spec_init("");
		fb_model *m = NULL;
		assert_int_equal(fb_model_open(&s, &m), FB_EINVAL);
		assert_null(m);
	}
}

/* The wire form of a layout: it round-trips, and every way of bending it
 * is refused without a model. */
static void
test_layout_wire(void **state)
{
	static const uint32_t h[] = {5};
	fb_model_spec s = spec_mlp(6, h, 1, 3);
	fb_model *m = open_ok(&s), *back = NULL, *other;
	uint8_t *b = NULL, *bent;
	size_t n = 0;
	char why[512];
	fb_model_spec s2 = spec_mlp(6, (const uint32_t[]){4}, 1, 3);

	assert_int_equal(fb_model_layout_pack(m, &b, &n), FB_OK);
	assert_int_equal(fb_model_open_layout(b, n, &s, &back), FB_OK);
	assert_false(fb_model_layout_diff(m, "a", back, "b", why,
	    sizeof(why)));
	assert_int_equal(fb_model_param_count(back), fb_model_param_count(m));
	fb_model_close(back);
	bent = malloc(n + 8);
	/* truncated anywhere, or one byte more: refused */
	for (size_t k = 0; k < n; k++) {
		back = (fb_model *)&s;
		assert_int_equal(fb_model_open_layout(b, k, &s, &back),
		    FB_EPROTO);
		assert_null(back);
	}
	memcpy(bent, b, n);
	bent[n] = 0;
	assert_int_equal(fb_model_open_layout(bent, n + 1, &s, &back),
	    FB_EPROTO);
	/* a count beyond its bytes (nothing allocated for it) */
	memcpy(bent, b, n);
	fb_store_le32(bent + 4, 1000000);
	assert_int_equal(fb_model_open_layout(bent, n, &s, &back), FB_EPROTO);
	/* a duplicate name: fc2.bias renamed fc1.bias */
	memcpy(bent, b, n);
	assert_non_null(memmem(bent, n, "fc2.bias", 8));
	memcpy((uint8_t *)memmem(bent, n, "fc2.bias", 8) + 2, "1", 1);
	assert_int_equal(fb_model_open_layout(bent, n, &s, &back), FB_EPROTO);
	/* a zero dimension, a rank of 5, a dtype that is not F32 */
	memcpy(bent, b, n);
	fb_store_le64(bent + 21, 0);
	assert_int_equal(fb_model_open_layout(bent, n, &s, &back), FB_EPROTO);
	memcpy(bent, b, n);
	bent[20] = 5;
	assert_int_equal(fb_model_open_layout(bent, n, &s, &back), FB_EPROTO);
	memcpy(bent, b, n);
	bent[19] = 2;
	assert_int_equal(fb_model_open_layout(bent, n, &s, &back), FB_EPROTO);
	/* the first difference is named, with the shape on each side */
	other = open_ok(&s2);
	assert_true(fb_model_layout_diff(m, "the coordinator's model", other,
	    "this worker's", why, sizeof(why)));
	assert_string_equal(why,
	    "tensor 0 is \"fc1.weight\" [5, 6] F32 in the coordinator's model "
	    "but \"fc1.weight\" [4, 6] F32 in this worker's");
	fb_model_close(other);
	s2 = spec_mlp(6, (const uint32_t[]){5, 2}, 2, 3);
	other = open_ok(&s2);
	assert_true(fb_model_layout_diff(m, "a", other, "b", why,
	    sizeof(why)));
	assert_non_null(strstr(why, "tensor 2 is \"fc2.weight\" [3, 5] F32 "
	                            "in a but \"fc2.weight\" [2, 5] F32 in b"));
	fb_model_close(other);
	free(bent);
	fb_free(b);
	fb_model_close(m);
}

FB_TESTS = {
    {"mlp gradient matches finite differences", test_mlp_gradient},
    {"logreg gradient matches finite differences", test_logreg_gradient},
    {"784-33-10 gradient matches on 200 sampled parameters",
        test_big_mlp_gradient},
    {"300-class gradient matches (int32 labels)",
        test_many_classes_gradient},
    {"mlp regression gradient matches finite differences of the MSE",
        test_mlp_regression_gradient},
    {"logreg regression gradient matches finite differences of the MSE",
        test_logreg_regression_gradient},
    {"regression loss and MSE equal the hand-computed values",
        test_hand_regression_loss},
    {"non-finite regression targets are rejected", test_bad_targets},
    {"loss equals the hand-computed value", test_hand_loss},
    {"init is deterministic by seed and in bounds", test_init_deterministic},
    {"forward and backward are bitwise deterministic", test_forward_bitwise},
    {"labels at or above classes are rejected", test_bad_labels},
    {"describe and parameter counts match PyTorch", test_describe_and_counts},
    {"bad model specs are rejected", test_bad_specs},
    {"safetensors survive save and load bitwise", test_safetensors_roundtrip},
    {"safetensors in another tensor order load",
        test_safetensors_foreign_order},
    {"damaged or mismatched safetensors are rejected",
        test_safetensors_rejects},
    {"an init file gives the layout in data order and its values",
        test_init_file_good},
    {"each kind of bad init file is refused, naming the file and fault",
        test_init_file_rejects},
    {"layouts survive the wire, bent ones are refused, diffs are named",
        test_layout_wire},
    {"plug-in loads and its gradient is right", test_plugin_loads},
    {"bad plug-in paths fail cleanly", test_bad_plugin},
    {"gemm speed is reported", test_gemm_speed},
    {NULL, NULL},
};

FB_TEST_MAIN("model")
