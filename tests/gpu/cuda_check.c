/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cuda_check.c -- correctness of the CUDA trainer backend on a GPU machine.
 *
 *   cuda_check           all checks (below)
 *   cuda_check --quick   a short run for compute-sanitizer: one small model,
 *                        gradient and 10 training steps, graphs and eager,
 *                        on GPU 0
 *   cuda_check --quick-all  the same on all GPUs (NCCL), plus 1 vs all GPUs
 *
 * Checks: CPU vs CUDA loss and gradient on random data and weights for mlp
 * and logreg, on 1 GPU and on all GPUs (uneven batch split too), by the
 * norm-wise relative error ||g_cuda - g_cpu||_2 / ||g_cpu||_2 < 1e-5 and
 * |l_cuda - l_cpu| / |l_cpu| < 1e-5; graph replay equals eager launches
 * bitwise; 1-GPU vs all-GPU parameters after 100 SGD steps (momentum,
 * weight decay) from the same seed, and CPU backend vs 1 GPU, within the
 * run's fp32 sensitivity: the norm-wise relative difference must be at
 * most 10 x the difference that moving every initial parameter by one ulp
 * makes after the same 100 steps (the larger of 1 GPU and CPU; 1e-6 at
 * least); graph replay equals eager launches bitwise on all GPUs too;
 * logreg (no ReLU, so no fp32 decision flips) CPU vs CUDA on 1 and on all
 * GPUs after 100 steps within 1e-6, plain and with FedProx (prox_mu 0.1,
 * two train() calls sharing the anchor); a model the backend cannot run
 * is refused with FB_ENOTSUP. Labels are int32: the gradient check also
 * runs with 300 classes (beyond a byte) and on a shard that lacks the
 * model's top classes. Regression (one output, mean squared error): CPU
 * vs CUDA loss and gradient for mlp and logreg on 1 and all GPUs, logreg
 * regression training CPU vs CUDA after 100 steps within 1e-6, and a
 * shard whose task differs from the model's is refused.
 *
 * Prints PASS/FAIL lines; exits 1 on any failure. Without a GPU it prints
 * "SKIP: <reason>" and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "model/model.h"
#include "worker/cuda/cuda.h"
#include "worker/trainer.h"

static int failures;

static void
check(int ok, const char *what, const char *detail)
{
	printf("%s: %s%s%s\n", ok ? "PASS" : "FAIL", what,
	    detail[0] ? " -- " : "", detail);
	fflush(stdout);
	if (!ok) {
		failures++;
	}
}

/* Norm-wise relative error and max abs difference of a vs reference b. */
static double
rel_err(const float *a, const float *b, uint64_t n, double *max_abs)
{
	double num = 0.0;
	double den = 0.0;

	*max_abs = 0.0;
	for (uint64_t i = 0; i < n; i++) {
		double d = (double)a[i] - (double)b[i];
		if (!isfinite(a[i])) {
			*max_abs = INFINITY;
			return INFINITY;
		}
		num += d * d;
		den += (double)b[i] * b[i];
		if (fabs(d) > *max_abs) {
			*max_abs = fabs(d);
		}
	}
	return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* A random shard: normal features; classes > 0: uniform labels below it;
 * classes 0: a regression shard with normal targets. */
static fb_err
make_shard(fb_dataset *d, uint32_t count, uint32_t dim, uint32_t classes,
    uint64_t seed)
{
	fb_rng r;

	memset(d, 0, sizeof(*d));
	d->x = fb_alloc((size_t)count * dim * sizeof(float));
	d->y = fb_alloc((size_t)count * sizeof(fb_label));
	if (d->x == NULL || d->y == NULL) {
		fb_free(d->x);
		fb_free(d->y);
		d->x = NULL;
		d->y = NULL;
		return FB_ENOMEM;
	}
	d->count = count;
	d->dim = dim;
	d->classes = classes;
	d->task = classes > 0 ? FB_TASK_CLASSIFICATION : FB_TASK_REGRESSION;
	fb_rng_init(&r, seed, 1);
	for (size_t i = 0; i < (size_t)count * dim; i++) {
		d->x[i] = (float)fb_rng_normal(&r);
	}
	for (uint32_t i = 0; i < count; i++) {
		if (classes > 0) {
			d->y[i].cls = (int32_t)fb_rng_below(&r, classes);
		} else {
			d->y[i].value = (float)fb_rng_normal(&r);
		}
	}
	return FB_OK;
}

/* Learnable targets: a random linear function of the features plus a
 * little noise. */
static void
teacher_targets(fb_dataset *d, uint64_t seed)
{
	fb_rng r;

	fb_rng_init(&r, seed, 5);
	for (uint32_t e = 0; e < d->count; e++) {
		double t = 0.5;
		fb_rng w;
		fb_rng_init(&w, seed, 9); /* the same weights for each row */
		for (uint32_t k = 0; k < d->dim; k++) {
			t += 0.1 * fb_rng_normal(&w) *
			    d->x[(size_t)e * d->dim + k];
		}
		d->y[e].value = (float)(t + 0.01 * fb_rng_normal(&r));
	}
}

/* Learnable labels: argmax of a random linear teacher (a well-posed task,
 * so that training is not a chaotic memorisation of noise). */
static void
teacher_labels(fb_dataset *d, uint64_t seed)
{
	fb_rng r;
	float *w = fb_alloc((size_t)d->classes * d->dim * sizeof(float));

	if (w == NULL) {
		return;
	}
	fb_rng_init(&r, seed, 3);
	for (size_t i = 0; i < (size_t)d->classes * d->dim; i++) {
		w[i] = (float)fb_rng_normal(&r);
	}
	for (uint32_t e = 0; e < d->count; e++) {
		double best = -1e300;
		for (uint32_t c = 0; c < d->classes; c++) {
			double z = 0.0;
			for (uint32_t k = 0; k < d->dim; k++) {
				z += (double)w[(size_t)c * d->dim + k] *
				    d->x[(size_t)e * d->dim + k];
			}
			if (z > best) {
				best = z;
				d->y[e].cls = (int32_t)c;
			}
		}
	}
	fb_free(w);
}

/* classes 0: the regression task (one output). */
static fb_err
open_model(const char *arch, uint32_t in, const uint32_t *hidden,
    uint32_t nh, uint32_t classes, fb_model **m)
{
	fb_model_spec spec;

	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "%s", arch);
	spec.input_dim = in;
	spec.classes = classes > 0 ? classes : 1;
	spec.task = classes > 0 ? FB_TASK_CLASSIFICATION : FB_TASK_REGRESSION;
	spec.hidden_count = nh;
	for (uint32_t i = 0; i < nh; i++) {
		spec.hidden[i] = hidden[i];
	}
	return fb_model_open(&spec, m);
}

/* Random weights: the model's init plus noise, so biases are non-zero. */
static void
random_params(const fb_model *m, float *p, uint64_t seed)
{
	fb_rng r;
	uint64_t n = fb_model_param_count(m);

	fb_model_init_params(m, p, seed);
	fb_rng_init(&r, seed, 7);
	for (uint64_t i = 0; i < n; i++) {
		p[i] += (float)(0.05 * fb_rng_normal(&r));
	}
}

static fb_err
cuda_open_n(const fb_model *m, const fb_dataset *d, uint32_t ngpus,
    int math, uint32_t max_batch, void **st)
{
	fb_trainer_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.device = FB_DEVICE_CUDA;
	cfg.math = math;
	cfg.throttle = 1.0;
	cfg.gpu_count = ngpus; /* 0: all */
	for (uint32_t i = 0; i < ngpus && i < 16; i++) {
		cfg.gpus[i] = (int)i;
	}
	return fb_trainer_cuda_backend_v1()->open(m, d, &cfg, max_batch, st);
}

/*
 * CPU vs CUDA loss and gradient on one random batch; classes 0 is
 * regression. The shard's labels use only the first `shard_classes`
 * classes (a box that lacks the others), or all when it is 0.
 */
static void
check_gradient_on(const char *arch, uint32_t in, const uint32_t *hidden,
    uint32_t nh, uint32_t classes, uint32_t shard_classes, uint32_t batch,
    uint32_t ngpus)
{
	const fb_trainer_backend *be = fb_trainer_cuda_backend_v1();
	fb_model *m = NULL;
	fb_dataset d;
	void *st = NULL;
	void *ws = NULL;
	float *p = NULL, *gc = NULL, *gg = NULL, *xb = NULL;
	fb_label *yb = NULL;
	uint32_t *idx = NULL;
	float lc = 0.0f, lg = 0.0f;
	char what[160], detail[200];
	fb_rng r;
	uint64_t n;
	const fb_model_ops *ops;
	fb_err rc;

	memset(&d, 0, sizeof(d));
	if (classes == 0) {
		snprintf(what, sizeof(what), "%s %u-..-1 regression batch %u "
		    "on %s GPU(s): CPU vs CUDA MSE loss and gradient (fp32)",
		    arch, in, batch, ngpus ? "1" : "all");
	} else {
		snprintf(what, sizeof(what), "%s %u-..-%u batch %u%s on %s "
		    "GPU(s): CPU vs CUDA loss and gradient (fp32)", arch, in,
		    classes, batch, shard_classes ? ", shard lacks the top "
		    "classes," : "", ngpus ? "1" : "all");
	}
	if ((rc = open_model(arch, in, hidden, nh, classes, &m)) != FB_OK ||
	    (rc = make_shard(&d, 3 * batch + 5, in,
	    shard_classes ? shard_classes : classes, 11)) != FB_OK) {
		snprintf(detail, sizeof(detail), "setup: %s", fb_strerror(rc));
		check(0, what, detail);
		goto out;
	}
	n = fb_model_param_count(m);
	ops = fb_model_get_ops(m);
	p = fb_alloc(n * sizeof(float));
	gc = fb_alloc(n * sizeof(float));
	gg = fb_alloc(n * sizeof(float));
	xb = fb_alloc((size_t)batch * in * sizeof(float));
	yb = fb_alloc(batch * sizeof(fb_label));
	idx = fb_alloc(batch * sizeof(uint32_t));
	ws = fb_alloc(ops->workspace_len(fb_model_state(m), batch) + 64);
	if (!p || !gc || !gg || !xb || !yb || !idx || !ws) {
		check(0, what, "out of memory");
		goto out;
	}
	random_params(m, p, 1234 + batch);
	fb_rng_init(&r, 99, batch);
	for (uint32_t b = 0; b < batch; b++) {
		idx[b] = (uint32_t)fb_rng_below(&r, d.count);
		memcpy(xb + (size_t)b * in, d.x + (size_t)idx[b] * in,
		    in * sizeof(float));
		yb[b] = d.y[idx[b]];
	}
	if ((rc = ops->forward_backward(fb_model_state(m), p, xb, yb, batch,
	    gc, &lc, ws)) != FB_OK) {
		snprintf(detail, sizeof(detail), "cpu: %s", fb_strerror(rc));
		check(0, what, detail);
		goto out;
	}
	if ((rc = cuda_open_n(m, &d, ngpus, FB_MATH_FP32, batch, &st)) !=
	    FB_OK || (rc = be->set_params(st, p)) != FB_OK ||
	    (rc = fb_cuda_trainer_gradient(st, idx, batch, gg, &lg)) != FB_OK) {
		snprintf(detail, sizeof(detail), "cuda: %s", fb_strerror(rc));
		check(0, what, detail);
		goto out;
	}
	{
		double max_abs;
		double e = rel_err(gg, gc, n, &max_abs);
		double le = fabs((double)lg - lc) / fabs((double)lc);
		snprintf(detail, sizeof(detail), "loss cpu %.7f cuda %.7f rel "
		    "%.2e; grad norm-wise rel %.2e, max abs %.2e (%llu "
		    "params)", lc, lg, le, e, max_abs, (unsigned long long)n);
		check(e < 1e-5 && le < 1e-5, what, detail);
	}
out:
	if (st != NULL) {
		be->close(st);
	}
	fb_free(p);
	fb_free(gc);
	fb_free(gg);
	fb_free(xb);
	fb_free(yb);
	fb_free(idx);
	fb_free(ws);
	fb_dataset_fini(&d);
	fb_model_close(m);
}

static void
check_gradient(const char *arch, uint32_t in, const uint32_t *hidden,
    uint32_t nh, uint32_t classes, uint32_t batch, uint32_t ngpus)
{
	check_gradient_on(arch, in, hidden, nh, classes, 0, batch, ngpus);
}

/* Train `steps` steps from params p0 with `be`; params out in `p`. */
static fb_err
train_with(const fb_trainer_backend *be, void *st, const float *p0, float *p,
    const fb_train_opts *o, fb_train_stats *stats)
{
	fb_err rc;

	if ((rc = be->set_params(st, p0)) != FB_OK ||
	    (rc = be->train(st, o, stats, NULL)) != FB_OK) {
		return rc;
	}
	return be->get_params(st, p);
}

static void
check_training(int quick, int ngpus_avail)
{
	const fb_trainer_backend *cu = fb_trainer_cuda_backend_v1();
	const fb_trainer_backend *cpu = &fb_trainer_cpu_backend;
	uint32_t hidden[2] = {256, 128};
	uint32_t in = quick ? 64 : 784;
	fb_model *m = NULL;
	fb_dataset d;
	fb_train_opts o;
	fb_train_stats s1, s2, s3, sc;
	fb_trainer_config cfg;
	void *st = NULL;
	float *p0 = NULL, *pa = NULL, *pb = NULL, *pc = NULL, *pd = NULL;
	double floor_e = 0.0, cpu_floor = 0.0, gate;
	char detail[256];
	uint64_t n;
	double e, max_abs;
	fb_err rc;

	memset(&d, 0, sizeof(d));
	memset(&o, 0, sizeof(o));
	o.steps = quick ? 10 : 100;
	o.batch = quick ? 32 : 256;
	o.lr = 0.01f;
	o.momentum = 0.9f;
	o.weight_decay = 1e-4f;
	o.seed = 42;
	o.round = 3;
	o.worker_index = 1;
	if ((rc = open_model("mlp", in, hidden, quick ? 1 : 2, 10, &m)) !=
	    FB_OK || (rc = make_shard(&d, quick ? 100 : 3000, in, 10, 5)) !=
	    FB_OK) {
		snprintf(detail, sizeof(detail), "setup: %s", fb_strerror(rc));
		check(0, "training setup", detail);
		goto out;
	}
	teacher_labels(&d, 17);
	n = fb_model_param_count(m);
	p0 = fb_alloc(n * sizeof(float));
	pa = fb_alloc(n * sizeof(float));
	pb = fb_alloc(n * sizeof(float));
	pc = fb_alloc(n * sizeof(float));
	pd = fb_alloc(n * sizeof(float));
	if (!p0 || !pa || !pb || !pc || !pd) {
		check(0, "training setup", "out of memory");
		goto out;
	}
	fb_model_init_params(m, p0, 7);

	/* 1 GPU with graphs (default), then eager: bitwise equal. */
	if ((rc = cuda_open_n(m, &d, 1, FB_MATH_FP32, o.batch, &st)) !=
	    FB_OK || (rc = train_with(cu, st, p0, pa, &o, &s1)) != FB_OK) {
		snprintf(detail, sizeof(detail), "cuda 1 GPU: %s",
		    fb_strerror(rc));
		check(0, "training on 1 GPU", detail);
		goto out;
	}
	cu->describe(st, detail, sizeof(detail));
	check(strncmp(detail, "cuda: 1 x ", 10) == 0 &&
	    strstr(detail, "(fp32)") != NULL, "describe() names the GPUs",
	    detail);
	cu->close(st);
	st = NULL;
	setenv("FB_CUDA_GRAPHS", "0", 1);
	rc = cuda_open_n(m, &d, 1, FB_MATH_FP32, o.batch, &st);
	unsetenv("FB_CUDA_GRAPHS");
	if (rc != FB_OK || (rc = train_with(cu, st, p0, pb, &o, &s2)) !=
	    FB_OK) {
		snprintf(detail, sizeof(detail), "cuda eager: %s",
		    fb_strerror(rc));
		check(0, "eager training on 1 GPU", detail);
		goto out;
	}
	cu->close(st);
	st = NULL;
	snprintf(detail, sizeof(detail), "%llu steps, loss %.6f vs %.6f",
	    (unsigned long long)o.steps, s1.loss_mean, s2.loss_mean);
	check(memcmp(pa, pb, n * sizeof(float)) == 0 &&
	    s1.loss_mean == s2.loss_mean,
	    "CUDA Graph replay gives bitwise the eager result", detail);

	/*
	 * The fp32 sensitivity of this run: the same training from initial
	 * parameters moved by one unit in the last place, on 1 GPU and on
	 * the CPU backend (pb as scratch). An MLP's ReLUs make it large at
	 * times: a pre-activation within fp32 rounding of 0 goes either way
	 * (784-256-128-10 here: example 173, unit 82 of step 0 is -2.6e-7 in
	 * exact arithmetic, +1.8e-8 in the CPU's fp32), and that one
	 * decision moves the parameters after 100 steps by ~4e-4. Different
	 * fp32 summation orders (CPU, cuBLAS) meet such decisions as a 1-ulp
	 * change does, so the gate is 10 x the larger of the two.
	 */
	for (uint64_t i = 0; i < n; i++) {
		pc[i] = nextafterf(p0[i], (i & 1) ? INFINITY : -INFINITY);
	}
	if ((rc = cuda_open_n(m, &d, 1, FB_MATH_FP32, o.batch, &st)) !=
	    FB_OK || (rc = train_with(cu, st, pc, pb, &o, &s2)) != FB_OK) {
		snprintf(detail, sizeof(detail), "cuda: %s", fb_strerror(rc));
		check(0, "rounding floor run", detail);
		goto out;
	}
	cu->close(st);
	st = NULL;
	floor_e = rel_err(pb, pa, n, &max_abs);
	memset(&cfg, 0, sizeof(cfg));
	cfg.device = FB_DEVICE_CPU;
	cfg.throttle = 1.0;
	if ((rc = cpu->open(m, &d, &cfg, o.batch, &st)) != FB_OK ||
	    (rc = train_with(cpu, st, pc, pb, &o, &sc)) != FB_OK ||
	    (rc = train_with(cpu, st, p0, pc, &o, &sc)) != FB_OK) {
		snprintf(detail, sizeof(detail), "cpu: %s", fb_strerror(rc));
		check(0, "CPU training", detail);
		goto out;
	}
	cpu->close(st);
	st = NULL;
	cpu_floor = rel_err(pb, pc, n, &max_abs);
	gate = 10.0 * (floor_e > cpu_floor ? floor_e : cpu_floor);
	gate = gate > 1e-6 ? gate : 1e-6;
	printf("INFO: 1-ulp change of the initial parameters moves the params "
	    "after %llu steps by norm-wise rel %.2e on 1 GPU, %.2e on the "
	    "CPU; gate = max(10 x the larger, 1e-6) = %.2e\n",
	    (unsigned long long)o.steps, floor_e, cpu_floor, gate);

	/* CPU backend (pc) vs 1 GPU (pa). */
	e = rel_err(pa, pc, n, &max_abs);
	snprintf(detail, sizeof(detail), "%llu steps: params norm-wise rel "
	    "%.2e, max abs %.2e; mean loss cpu %.6f cuda %.6f",
	    (unsigned long long)o.steps, e, max_abs, sc.loss_mean,
	    s1.loss_mean);
	check(e <= gate && fabs(sc.loss_mean - s1.loss_mean) <
	    1e-4 * fabs(sc.loss_mean), "CPU backend vs CUDA 1 GPU after "
	    "training (within the fp32 sensitivity)", detail);

	if (ngpus_avail < 2) {
		printf("SKIP: 1 GPU vs %d GPUs (one GPU visible)\n",
		    ngpus_avail);
		goto out;
	}
	if ((rc = cuda_open_n(m, &d, 0, FB_MATH_FP32, o.batch, &st)) !=
	    FB_OK || (rc = train_with(cu, st, p0, pd, &o, &s3)) != FB_OK) {
		snprintf(detail, sizeof(detail), "cuda all GPUs: %s",
		    fb_strerror(rc));
		check(0, "training on all GPUs", detail);
		goto out;
	}
	cu->close(st);
	st = NULL;
	e = rel_err(pd, pa, n, &max_abs);
	snprintf(detail, sizeof(detail), "%llu steps batch %u: params "
	    "norm-wise rel %.2e, max abs %.2e; mean loss %.7f vs %.7f",
	    (unsigned long long)o.steps, o.batch, e, max_abs, s1.loss_mean,
	    s3.loss_mean);
	check(e <= gate, "1 GPU vs all GPUs from the same seed, within the "
	    "fp32 sensitivity (replicas identical)", detail);

	/* All GPUs again (a second trainer with graphs in this process),
	 * now eager: graph replay with NCCL gives bitwise the same. */
	setenv("FB_CUDA_GRAPHS", "0", 1);
	rc = cuda_open_n(m, &d, 0, FB_MATH_FP32, o.batch, &st);
	unsetenv("FB_CUDA_GRAPHS");
	if (rc != FB_OK || (rc = train_with(cu, st, p0, pb, &o, &s2)) !=
	    FB_OK) {
		snprintf(detail, sizeof(detail), "cuda all GPUs eager: %s",
		    fb_strerror(rc));
		check(0, "eager training on all GPUs", detail);
		goto out;
	}
	cu->close(st);
	st = NULL;
	snprintf(detail, sizeof(detail), "%d GPUs, %llu steps, loss %.7f vs "
	    "%.7f", ngpus_avail, (unsigned long long)o.steps, s3.loss_mean,
	    s2.loss_mean);
	check(memcmp(pd, pb, n * sizeof(float)) == 0 &&
	    s3.loss_mean == s2.loss_mean, "CUDA Graph replay (NCCL captured) "
	    "gives bitwise the eager result on all GPUs", detail);
out:
	if (st != NULL) {
		cu->close(st);
	}
	fb_free(p0);
	fb_free(pa);
	fb_free(pb);
	fb_free(pc);
	fb_free(pd);
	fb_dataset_fini(&d);
	fb_model_close(m);
}

/*
 * logreg has no ReLU, so no fp32 decision can flip and two fp32
 * implementations stay within rounding of each other over 100 steps (numpy
 * fp32 vs fp64 on this setup: 2.3e-7): a tight check of the optimizer,
 * batch order, epoch wrap and batch split over a whole train() call.
 */
/* set_params(p0), then `calls` train() calls of o->steps each (FedProx's
 * anchor must stay the set parameters across them), then get_params. */
static fb_err
train_calls(const fb_trainer_backend *be, void *st, const float *p0,
    float *p, const fb_train_opts *o, int calls, fb_train_stats *stats)
{
	fb_err rc;

	if ((rc = be->set_params(st, p0)) != FB_OK) {
		return rc;
	}
	for (int c = 0; c < calls; c++) {
		if ((rc = be->train(st, o, stats, NULL)) != FB_OK) {
			return rc;
		}
	}
	return be->get_params(st, p);
}

/* classes 0: linear regression (logreg's regression task, MSE). */
static void
check_logreg_training(int ngpus_avail, uint32_t classes)
{
	const fb_trainer_backend *cu = fb_trainer_cuda_backend_v1();
	const fb_trainer_backend *cpu = &fb_trainer_cpu_backend;
	fb_model *m = NULL;
	fb_dataset d;
	fb_train_opts o;
	fb_train_stats sc, sg;
	fb_trainer_config cfg;
	void *st = NULL;
	float *p0 = NULL, *pc = NULL, *pg = NULL;
	char what[160], detail[256];
	uint64_t n;
	fb_err rc;

	memset(&d, 0, sizeof(d));
	memset(&o, 0, sizeof(o));
	o.batch = 256;
	o.lr = 0.01f;
	o.momentum = 0.9f;
	o.weight_decay = 1e-4f;
	o.seed = 42;
	o.round = 3;
	o.worker_index = 1;
	if (open_model("logreg", 784, NULL, 0, classes, &m) != FB_OK ||
	    make_shard(&d, 3000, 784, classes, 5) != FB_OK) {
		check(0, "logreg training setup", "failed");
		goto out;
	}
	if (classes > 0) {
		teacher_labels(&d, 17);
	} else {
		teacher_targets(&d, 17);
	}
	n = fb_model_param_count(m);
	p0 = fb_alloc(n * sizeof(float));
	pc = fb_alloc(n * sizeof(float));
	pg = fb_alloc(n * sizeof(float));
	if (!p0 || !pc || !pg) {
		check(0, "logreg training setup", "out of memory");
		goto out;
	}
	fb_model_init_params(m, p0, 7);
	memset(&cfg, 0, sizeof(cfg));
	cfg.device = FB_DEVICE_CPU;
	cfg.throttle = 1.0;
	/* Plain SGD, 100 steps in one call; then FedProx (mu 0.1), two
	 * calls of 50 steps. */
	for (int prox = 0; prox < 2; prox++) {
		int calls = prox ? 2 : 1;
		o.prox_mu = prox ? 0.1f : 0.0f;
		o.steps = 100 / calls;
		if ((rc = cpu->open(m, &d, &cfg, o.batch, &st)) != FB_OK ||
		    (rc = train_calls(cpu, st, p0, pc, &o, calls, &sc)) !=
		    FB_OK) {
			snprintf(detail, sizeof(detail), "cpu: %s",
			    fb_strerror(rc));
			check(0, "logreg CPU training", detail);
			goto out;
		}
		cpu->close(st);
		st = NULL;
		for (int all = 0; all <= (ngpus_avail > 1); all++) {
			double e, max_abs;
			snprintf(what, sizeof(what), "logreg%s%s CPU backend "
			    "vs CUDA %s GPU(s) after 100 steps (fp32, gate "
			    "1e-6)", classes ? "" : " regression",
			    prox ? " FedProx mu 0.1, 2 x 50 steps," : "",
			    all ? "all" : "1");
			if ((rc = cuda_open_n(m, &d, all ? 0 : 1, FB_MATH_FP32,
			    o.batch, &st)) != FB_OK ||
			    (rc = train_calls(cu, st, p0, pg, &o, calls,
			    &sg)) != FB_OK) {
				snprintf(detail, sizeof(detail), "cuda: %s",
				    fb_strerror(rc));
				check(0, what, detail);
				goto out;
			}
			cu->close(st);
			st = NULL;
			e = rel_err(pg, pc, n, &max_abs);
			snprintf(detail, sizeof(detail), "params norm-wise rel "
			    "%.2e, max abs %.2e; mean loss cpu %.7f cuda %.7f",
			    e, max_abs, sc.loss_mean, sg.loss_mean);
			check(e <= 1e-6, what, detail);
		}
	}
out:
	if (st != NULL) {
		cu->close(st);
	}
	fb_free(p0);
	fb_free(pc);
	fb_free(pg);
	fb_dataset_fini(&d);
	fb_model_close(m);
}

/* A regression shard on a classifier (and the reverse) is refused. */
static void
check_refuses_task_mismatch(void)
{
	fb_model *m = NULL;
	fb_dataset d;
	void *st = NULL;
	fb_err rc;

	for (int reg_model = 0; reg_model < 2; reg_model++) {
		memset(&d, 0, sizeof(d));
		if (open_model("mlp", 8, (const uint32_t[]){4}, 1,
		    reg_model ? 0 : 3, &m) != FB_OK ||
		    make_shard(&d, 10, 8, reg_model ? 3 : 0, 1) != FB_OK) {
			check(0, "task mismatch is refused", "setup failed");
			fb_model_close(m);
			fb_dataset_fini(&d);
			return;
		}
		rc = cuda_open_n(m, &d, 1, FB_MATH_FP32, 4, &st);
		check(rc == FB_EINVAL, reg_model ? "a classification shard "
		    "on a regression model is refused" : "a regression shard "
		    "on a classifier is refused", fb_strerror(rc));
		if (st != NULL) {
			fb_trainer_cuda_backend_v1()->close(st);
			st = NULL;
		}
		fb_dataset_fini(&d);
		fb_model_close(m);
		m = NULL;
	}
}

static void
check_refuses_synthetic(void)
{
	fb_model_spec spec;
	fb_model *m = NULL;
	fb_dataset d;
	void *st = NULL;
	fb_err rc;

	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "synthetic");
	spec.synthetic_params = 1000;
	spec.input_dim = 8;
	spec.classes = 2;
	if (fb_model_open(&spec, &m) != FB_OK ||
	    make_shard(&d, 10, 8, 2, 1) != FB_OK) {
		check(0, "synthetic model is refused", "setup failed");
		fb_model_close(m);
		return;
	}
	rc = cuda_open_n(m, &d, 1, FB_MATH_FP32, 4, &st);
	check(rc == FB_ENOTSUP, "a model without CUDA kernels is refused "
	    "with FB_ENOTSUP", fb_strerror(rc));
	if (st != NULL) {
		fb_trainer_cuda_backend_v1()->close(st);
	}
	fb_dataset_fini(&d);
	fb_model_close(m);
}

int
main(int argc, char **argv)
{
	char why[256] = "";
	int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
	int quick_all = argc > 1 && strcmp(argv[1], "--quick-all") == 0;
	int ngpus;
	uint32_t h2[2] = {40, 30};
	uint32_t h1[1] = {128};

	fb_log_init("cuda_check", FB_LOG_WARN);
	ngpus = fb_cuda_device_count(why, sizeof(why));
	if (ngpus <= 0) {
		printf("SKIP: CUDA backend tests: %s\n", why);
		return 0;
	}
	printf("cuda_check: %d GPU(s)%s\n", ngpus,
	    quick ? ", quick" : quick_all ? ", quick on all GPUs" : "");
	if (quick) {
		check_gradient("mlp", 50, h2, 2, 7, 33, 1);
		check_training(1, 1);
		goto done;
	}
	if (quick_all) {
		check_gradient("mlp", 50, h2, 2, 7, 33, 0);
		check_training(1, ngpus);
		goto done;
	}
	check_gradient("mlp", 50, h2, 2, 7, 64, 1);
	check_gradient("mlp", 784, h1, 1, 10, 256, 1);
	check_gradient("logreg", 784, NULL, 0, 10, 128, 1);
	check_gradient("mlp", 50, h2, 2, 7, 63, 0);
	check_gradient("mlp", 784, h1, 1, 10, 256, 0);
	check_gradient("logreg", 784, NULL, 0, 10, 127, 0);
	check_gradient("mlp", 50, h2, 2, 300, 64, 1);
	check_gradient_on("mlp", 50, h2, 2, 10, 6, 64, 1);
	check_gradient("mlp", 50, h2, 2, 0, 64, 1);
	check_gradient("logreg", 784, NULL, 0, 0, 128, 1);
	check_gradient("mlp", 50, h2, 2, 0, 63, 0);
	check_gradient("logreg", 784, NULL, 0, 0, 127, 0);
	check_refuses_synthetic();
	check_refuses_task_mismatch();
	check_logreg_training(ngpus, 10);
	check_logreg_training(ngpus, 0);
	check_training(0, ngpus);
done:
	printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
	return failures ? 1 : 0;
}
