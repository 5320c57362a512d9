/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker_test.c -- the trainer: determinism, batch order, the optimizer
 * against hand-computed steps, learning on real Fashion-MNIST, cancel,
 * throttle, and backend selection.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "data/data.h"
#include "model/model.h"
#include "tests/unit/harness.h"
#include "worker/trainer.h"

static fb_model *
open_mlp(uint32_t in, uint32_t hidden, uint32_t classes)
{
	fb_model_spec s;
	fb_model *m = NULL;

	memset(&s, 0, sizeof(s));
	strcpy(s.arch, hidden > 0 ? "mlp" : "logreg");
	s.input_dim = in;
	s.classes = classes;
	s.hidden[0] = hidden;
	s.hidden_count = hidden > 0;
	assert_int_equal(fb_model_open(&s, &m), FB_OK);
	return m;
}

/* random_set makes a learnable random data set: label = argmax of the
 * first `classes` features. */
static void
random_set(fb_dataset *d, uint32_t count, uint32_t dim, uint32_t classes,
    uint64_t seed)
{
	fb_rng r;

	memset(d, 0, sizeof(*d));
	d->count = count;
	d->dim = dim;
	d->classes = classes;
	d->x = fb_calloc((size_t)count * dim, sizeof(float));
	d->y = fb_calloc(count, sizeof(*d->y));
	assert_non_null(d->x);
	assert_non_null(d->y);
	fb_rng_init(&r, seed, 1);
	for (uint32_t i = 0; i < count; i++) {
		float *x = d->x + (size_t)i * dim;
		uint32_t best = 0;
		for (uint32_t k = 0; k < dim; k++) {
			x[k] = (float)fb_rng_normal(&r);
		}
		for (uint32_t c = 1; c < classes; c++) {
			best = x[c] > x[best] ? c : best;
		}
		d->y[i].cls = (int32_t)best;
	}
}

static fb_trainer_config
cpu_cfg(double throttle)
{
	fb_trainer_config c;
	memset(&c, 0, sizeof(c));
	c.device = FB_DEVICE_CPU;
	c.throttle = throttle;
	return c;
}

static fb_train_opts
opts_of(uint64_t steps, uint32_t batch, float lr, float mu, float wd)
{
	fb_train_opts o;
	memset(&o, 0, sizeof(o));
	o.steps = steps;
	o.batch = batch;
	o.lr = lr;
	o.momentum = mu;
	o.weight_decay = wd;
	o.seed = 1234;
	o.round = 3;
	o.worker_index = 1;
	return o;
}

/* run trains from seed-7 init and returns the parameters (heap). */
static float *
run(const fb_model *m, const fb_dataset *d, const fb_train_opts *o,
    fb_train_stats *st)
{
	fb_trainer_config c = cpu_cfg(1.0);
	fb_trainer *t = NULL;
	uint64_t np = fb_model_param_count(m);
	float *p = malloc(np * sizeof(float));

	assert_non_null(p);
	fb_model_init_params(m, p, 7);
	assert_int_equal(fb_trainer_open(m, d, &c, o->batch, &t), FB_OK);
	assert_string_equal(fb_trainer_backend_name(t), "cpu");
	assert_int_equal(fb_trainer_set_params(t, p), FB_OK);
	assert_int_equal(fb_trainer_train(t, o, st, NULL), FB_OK);
	assert_int_equal(fb_trainer_get_params(t, p), FB_OK);
	fb_trainer_close(t);
	return p;
}

static void
test_bitwise_reproducible(void **state)
{
	fb_model *m = open_mlp(50, 24, 5);
	fb_dataset d;
	fb_train_opts o = opts_of(40, 16, 0.05f, 0.9f, 1e-4f);
	fb_train_stats s1, s2;
	uint64_t np = fb_model_param_count(m);
	float *a, *b, *c;

	random_set(&d, 300, 50, 5, 1);
	a = run(m, &d, &o, &s1);
	b = run(m, &d, &o, &s2);
	assert_memory_equal(a, b, np * sizeof(float));
	assert_memory_equal(&s1.loss_mean, &s2.loss_mean, sizeof(double));
	assert_int_equal(s1.steps, 40);
	assert_int_equal(s1.samples, 640);
	o.round++; /* another round, another batch order */
	c = run(m, &d, &o, &s2);
	assert_memory_not_equal(a, c, np * sizeof(float));
	free(a);
	free(b);
	free(c);
	fb_dataset_fini(&d);
	fb_model_close(m);
}

static void
test_batch_order(void **state)
{
	enum { N = 1000 };
	uint32_t *a = malloc(N * 4), *b = malloc(N * 4);
	uint8_t *seen = malloc(N);

	for (uint64_t e = 0; e < 3; e++) {
		fb_train_batch_order(9, 2, 1, e, a, N);
		memset(seen, 0, N);
		for (uint32_t i = 0; i < N; i++) {
			assert_true(a[i] < N);
			assert_int_equal(seen[a[i]], 0);
			seen[a[i]] = 1;
		}
		fb_train_batch_order(9, 2, 1, e, b, N);
		assert_memory_equal(a, b, N * 4);
		fb_train_batch_order(9, 2, 1, e + 1, b, N);
		assert_memory_not_equal(a, b, N * 4);
		fb_train_batch_order(9, 2, 0, e, b, N);
		assert_memory_not_equal(a, b, N * 4);
		fb_train_batch_order(9, 3, 1, e, b, N);
		assert_memory_not_equal(a, b, N * 4);
		fb_train_batch_order(10, 2, 1, e, b, N);
		assert_memory_not_equal(a, b, N * 4);
	}
	/* a one-example shard is fine */
	fb_train_batch_order(9, 2, 1, 0, a, 1);
	assert_int_equal(a[0], 0);
	free(a);
	free(b);
	free(seen);
}

/*
 * The hand-computed step: logreg 2 -> 2 on two examples (one batch of
 * both), softmax by formula in double.
 */
static void
hand_grad(const float *w, const fb_dataset *d, double *g)
{
	memset(g, 0, 6 * sizeof(double));
	for (uint32_t i = 0; i < d->count; i++) {
		const float *x = d->x + 2 * i;
		double z0 = w[0] * x[0] + w[1] * x[1] + w[4];
		double z1 = w[2] * x[0] + w[3] * x[1] + w[5];
		double p1 = 1 / (1 + exp(z0 - z1)), p0 = 1 - p1;
		double d0 = (p0 - (d->y[i].cls == 0)) / d->count;
		double d1 = (p1 - (d->y[i].cls == 1)) / d->count;
		g[0] += d0 * x[0];
		g[1] += d0 * x[1];
		g[2] += d1 * x[0];
		g[3] += d1 * x[1];
		g[4] += d0;
		g[5] += d1;
	}
}

static void
test_sgd_step_by_hand(void **state)
{
	fb_model *m = open_mlp(2, 0, 2);
	float xs[4] = {1.0f, -2.0f, 0.5f, 3.0f};
	fb_label ys[2] = {{.cls = 1}, {.cls = 0}};
	fb_dataset d = {.count = 2, .dim = 2, .classes = 2, .x = xs, .y = ys};
	float w0[6] = {0.3f, -0.2f, 0.1f, 0.4f, 0.05f, -0.05f}, w[6];
	double g[6], want[6], v[6];
	fb_trainer_config c = cpu_cfg(1.0);
	fb_trainer *t = NULL;
	fb_train_opts o = opts_of(1, 2, 0.5f, 0.0f, 0.01f);
	fb_train_stats st;

	assert_int_equal(fb_trainer_open(m, &d, &c, 2, &t), FB_OK);
	/* plain SGD with weight decay: w -= lr (g + wd w) */
	assert_int_equal(fb_trainer_set_params(t, w0), FB_OK);
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_OK);
	assert_int_equal(fb_trainer_get_params(t, w), FB_OK);
	hand_grad(w0, &d, g);
	for (int i = 0; i < 6; i++) {
		want[i] = w0[i] - 0.5 * (g[i] + 0.01 * w0[i]);
		assert_true(fabs(w[i] - want[i]) < 1e-6);
	}
	/* momentum 0.9 over two steps, PyTorch style: v = mu v + g;
	 * w -= lr v, starting from v = 0 in every train() call. */
	o = opts_of(2, 2, 0.5f, 0.9f, 0.0f);
	for (int call = 0; call < 2; call++) {
		float cur[6];
		assert_int_equal(fb_trainer_set_params(t, w0), FB_OK);
		assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_OK);
		assert_int_equal(fb_trainer_get_params(t, w), FB_OK);
		memcpy(cur, w0, sizeof(cur));
		memset(v, 0, sizeof(v));
		for (int step = 0; step < 2; step++) {
			hand_grad(cur, &d, g);
			for (int i = 0; i < 6; i++) {
				v[i] = 0.9 * v[i] + g[i];
				cur[i] = (float)(cur[i] - 0.5 * v[i]);
			}
		}
		for (int i = 0; i < 6; i++) {
			assert_true(fabs(w[i] - cur[i]) < 1e-6);
		}
	}
	fb_trainer_close(t);
	fb_model_close(m);
}

static void
test_fmnist_learns(void **state)
{
	const char *dir = fb_test_fmnist_dir();
	fb_dataset all, sub;
	fb_model *m;
	fb_trainer *t = NULL;
	fb_trainer_config c = cpu_cfg(1.0);
	fb_train_opts o = opts_of(200, 64, 0.05f, 0.9f, 0.0f);
	fb_train_stats st;
	uint32_t *idx;
	uint64_t np;
	float *p;
	double loss0, acc0, loss1, acc1;

	if (dir == NULL) {
		printf("# skipped: no Fashion-MNIST (dataset-fashion-mnist)\n");
		skip();
	}
	assert_int_equal(fb_dataset_load_fmnist(dir, 1, &all), FB_OK);
	idx = malloc(6000 * sizeof(uint32_t));
	for (uint32_t i = 0; i < 6000; i++) {
		idx[i] = i * 10; /* spread over the whole training file */
	}
	assert_int_equal(fb_dataset_subset(&all, idx, 6000, &sub), FB_OK);
	fb_dataset_fini(&all);
	m = open_mlp(784, 128, 10);
	np = fb_model_param_count(m);
	p = malloc(np * sizeof(float));
	fb_model_init_params(m, p, 1);
	assert_int_equal(
	    fb_model_evaluate(m, p, sub.x, sub.y, sub.count, &loss0, &acc0),
	    FB_OK);
	assert_int_equal(fb_trainer_open(m, &sub, &c, 64, &t), FB_OK);
	assert_int_equal(fb_trainer_set_params(t, p), FB_OK);
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_OK);
	assert_int_equal(fb_trainer_get_params(t, p), FB_OK);
	assert_int_equal(
	    fb_model_evaluate(m, p, sub.x, sub.y, sub.count, &loss1, &acc1),
	    FB_OK);
	printf("# fmnist 6000: loss %.3f -> %.3f, accuracy %.3f -> %.3f, "
	       "%.1f ms per step\n",
	    loss0, loss1, acc0, acc1, st.seconds / (double)st.steps * 1e3);
	assert_int_equal(st.steps, 200);
	assert_true(loss1 < loss0 * 0.5);
	assert_true(acc1 > 0.70);
	fb_trainer_close(t);
	free(p);
	free(idx);
	fb_dataset_fini(&sub);
	fb_model_close(m);
}

typedef struct canceller {
	atomic_int *flag;
	int delay_ms;
} canceller;

static void *
cancel_later(void *arg)
{
	canceller *c = arg;
	fb_sleep_ms(c->delay_ms);
	atomic_store(c->flag, 1);
	return NULL;
}

static void
test_cancel(void **state)
{
	fb_model *m = open_mlp(100, 64, 10);
	fb_dataset d;
	fb_trainer_config c = cpu_cfg(1.0);
	fb_trainer *t = NULL;
	fb_train_opts o = opts_of(100000000, 32, 0.01f, 0.0f, 0.0f);
	fb_train_stats st;
	atomic_int flag = 1;
	canceller cc = {&flag, 50};
	pthread_t th;
	float *p = malloc(fb_model_param_count(m) * sizeof(float));

	random_set(&d, 200, 100, 10, 2);
	fb_model_init_params(m, p, 1);
	assert_int_equal(fb_trainer_open(m, &d, &c, 32, &t), FB_OK);
	assert_int_equal(fb_trainer_set_params(t, p), FB_OK);
	assert_int_equal(fb_trainer_train(t, &o, &st, &flag), FB_ECLOSED);
	assert_int_equal(st.steps, 0);
	atomic_store(&flag, 0);
	assert_int_equal(pthread_create(&th, NULL, cancel_later, &cc), 0);
	assert_int_equal(fb_trainer_train(t, &o, &st, &flag), FB_ECLOSED);
	pthread_join(th, NULL);
	assert_true(st.steps > 0 && st.steps < o.steps);
	assert_int_equal(st.samples, st.steps * 32);
	fb_trainer_close(t);
	free(p);
	fb_dataset_fini(&d);
	fb_model_close(m);
}

static double
timed(const fb_model *m, const fb_dataset *d, double throttle)
{
	fb_trainer_config c = cpu_cfg(throttle);
	fb_trainer *t = NULL;
	fb_train_opts o = opts_of(40, 64, 0.01f, 0.0f, 0.0f);
	fb_train_stats st;
	float *p = malloc(fb_model_param_count(m) * sizeof(float));
	char desc[128];

	fb_model_init_params(m, p, 1);
	assert_int_equal(fb_trainer_open(m, d, &c, 64, &t), FB_OK);
	fb_trainer_describe(t, desc, sizeof(desc));
	assert_true(throttle <= 1.0 || strstr(desc, "simulated") != NULL);
	assert_int_equal(fb_trainer_set_params(t, p), FB_OK);
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_OK);
	fb_trainer_close(t);
	free(p);
	return st.seconds;
}

static void
test_throttle(void **state)
{
	fb_model *m = open_mlp(784, 128, 10);
	fb_dataset d;
	double t1 = 1e9, t3 = 1e9;

	/* Interleaved, best of three: the machine may be busy with other
	 * work, and the fastest run of each is the least disturbed. */
	random_set(&d, 512, 784, 10, 3);
	for (int i = 0; i < 3; i++) {
		double a = timed(m, &d, 1.0);
		double b = timed(m, &d, 3.0);
		t1 = a < t1 ? a : t1;
		t3 = b < t3 ? b : t3;
	}
	printf("# throttle: %.3f s at 1x, %.3f s at 3x (%.2fx)\n", t1, t3,
	    t3 / t1);
	fb_dataset_fini(&d);
	fb_model_close(m);
	assert_true(t3 > 1.8 * t1);
	assert_true(t3 < 8.0 * t1);
}

static void
test_backend_choice(void **state)
{
	fb_model *m = open_mlp(10, 4, 3);
	fb_dataset d;
	fb_trainer_config c = cpu_cfg(1.0);
	fb_trainer *t = (fb_trainer *)&c;

	random_set(&d, 20, 10, 3, 4);
	setenv("FEDBOX_CUDA_LIB", "/nonexistent/libfedbox-cuda.so", 1);
	c.device = FB_DEVICE_CUDA;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_ENOTSUP);
	assert_null(t);
	c.device = FB_DEVICE_AUTO;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_OK);
	assert_string_equal(fb_trainer_backend_name(t), "cpu");
	fb_trainer_close(t);
	/* a library without the symbol is refused the same way */
	setenv("FEDBOX_CUDA_LIB", "libm.so.6", 1);
	c.device = FB_DEVICE_CUDA;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_ENOTSUP);
	c.device = 7;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_EINVAL);
	unsetenv("FEDBOX_CUDA_LIB");
	fb_dataset_fini(&d);
	fb_model_close(m);
}

static void
test_bad_inputs(void **state)
{
	fb_model *m = open_mlp(10, 4, 3), *syn = NULL;
	fb_model_spec s;
	fb_dataset d;
	fb_trainer_config c = cpu_cfg(1.0);
	fb_trainer *t = NULL;
	fb_train_opts o = opts_of(1, 9, 0.1f, 0.0f, 0.0f);
	fb_train_stats st;

	random_set(&d, 20, 10, 3, 5);
	/* a model that cannot train */
	memset(&s, 0, sizeof(s));
	strcpy(s.arch, "synthetic");
	s.synthetic_params = 100;
	assert_int_equal(fb_model_open(&s, &syn), FB_OK);
	assert_int_equal(fb_trainer_open(syn, &d, &c, 8, &t), FB_ENOTSUP);
	/* a shard of another width */
	d.dim = 9;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_EINVAL);
	d.dim = 10;
	c.throttle = 0.5;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_EINVAL);
	c.throttle = 1.0;
	assert_int_equal(fb_trainer_open(m, &d, &c, 8, &t), FB_OK);
	/* batch above max_batch, bad lr, bad momentum */
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_EINVAL);
	o.batch = 8;
	o.lr = 0.0f;
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_EINVAL);
	o.lr = 0.1f;
	o.momentum = 1.0f;
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_EINVAL);
	/* a label beyond the model's classes */
	o.momentum = 0.0f;
	o.steps = 10;
	memset(d.y, 7, d.count);
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_EINVAL);
	fb_trainer_close(t);
	fb_dataset_fini(&d);
	fb_model_close(syn);
	fb_model_close(m);
}

/* Distance moved from the start by `steps` steps with proximal term mu. */
static double
moved(const fb_model *m, const fb_dataset *d, float prox)
{
	fb_trainer_config c = cpu_cfg(1.0);
	fb_trainer *t = NULL;
	fb_train_opts o = opts_of(30, 16, 0.05f, 0.0f, 0.0f);
	fb_train_stats st;
	uint64_t n = fb_model_param_count(m);
	float *p0 = malloc(n * sizeof(float)), *p = malloc(n * sizeof(float));
	double d2 = 0;

	assert_true(p0 != NULL && p != NULL);
	o.prox_mu = prox;
	fb_model_init_params(m, p0, 5);
	assert_int_equal(fb_trainer_open(m, d, &c, 16, &t), FB_OK);
	assert_int_equal(fb_trainer_set_params(t, p0), FB_OK);
	assert_int_equal(fb_trainer_train(t, &o, &st, NULL), FB_OK);
	assert_int_equal(fb_trainer_get_params(t, p), FB_OK);
	for (uint64_t i = 0; i < n; i++) {
		d2 += ((double)p[i] - p0[i]) * ((double)p[i] - p0[i]);
	}
	fb_trainer_close(t);
	free(p0);
	free(p);
	return sqrt(d2);
}

static void
test_prox_pulls_back(void **state)
{
	fb_model *m = open_mlp(20, 8, 4);
	fb_dataset d;
	double free_run, held;

	random_set(&d, 256, 20, 4, 9);
	free_run = moved(m, &d, 0.0f);
	held = moved(m, &d, 10.0f);
	printf("# prox: moved %.4f without, %.4f with mu = 10\n", free_run,
	    held);
	fb_dataset_fini(&d);
	fb_model_close(m);
	assert_true(free_run > 0);
	assert_true(held < 0.5 * free_run);
}

FB_TESTS = {
    {"two runs from one seed give bitwise identical parameters",
        test_bitwise_reproducible},
    {"batch order is a seeded permutation per epoch", test_batch_order},
    {"sgd and momentum steps match hand computation", test_sgd_step_by_hand},
    {"training on 6000 fashion-mnist examples learns", test_fmnist_learns},
    {"cancel flag stops training early", test_cancel},
    {"throttle 3 makes training about 3x slower", test_throttle},
    {"cuda without its library is unsupported and auto falls back",
        test_backend_choice},
    {"bad models, shards and options are rejected", test_bad_inputs},
    {"a FedProx proximal term keeps the parameters near the start",
        test_prox_pulls_back},
    {NULL, NULL},
};

FB_TEST_MAIN("worker")
