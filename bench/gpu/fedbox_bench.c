/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fedbox_bench.c -- throughput of the CUDA trainer backend on the rows of
 * issue 5, plus NCCL bus bandwidth inside the training step against a bare
 * ncclAllReduce of the same size on the same communicators.
 *
 *   fedbox_bench --gpus N [--rows abc[n]] [--math fp32,tf32] [--seconds S]
 *
 * With 'n' in --rows and more than one GPU, each row is also run (fp32)
 * with FB_CUDA_BUCKET_MB=0: one all-reduce after the backward, no overlap
 * (ROW lines with fw=fedbox-nooverlap).
 *
 * Rows: (a) 784-512-256-10, batch 256 per GPU; (b) 784-4096x3-10, batch
 * 4096 per GPU; (c) 784-8192x4-10, batch 1024 per GPU. Synthetic data
 * (normal features, uniform labels) of 4 x the global batch, uploaded once;
 * SGD lr 1e-3, momentum 0.9. Prints one "ROW" line per (row, math):
 * samples/s over the timed steps (after 10 warm-up steps), the in-step
 * all-reduce time and bus bandwidth (200 profiled steps, GPU timestamps
 * around each bucket's ncclAllReduce; "last" = each step, the GPU that
 * waited least for its peers) and the bare one (50 back-to-back calls on
 * the whole gradient, same communicators, same stream, same buffer).
 * --repeat N runs every row N times (new trainer each time).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "model/model.h"
#include "worker/cuda/cuda.h"
#include "worker/trainer.h"

typedef struct row {
	char name;
	uint32_t hidden[4];
	uint32_t nh;
	uint32_t batch_per_gpu;
} row;

static const row rows[] = {
	{'a', {512, 256}, 2, 256},
	{'b', {4096, 4096, 4096}, 3, 4096},
	{'c', {8192, 8192, 8192, 8192}, 4, 1024},
};

static fb_err
make_shard(fb_dataset *d, uint32_t count, uint32_t dim, uint32_t classes)
{
	fb_rng r;

	memset(d, 0, sizeof(*d));
	d->x = fb_alloc((size_t)count * dim * sizeof(float));
	d->y = fb_alloc((size_t)count * sizeof(*d->y));
	if (d->x == NULL || d->y == NULL) {
		fb_free(d->x);
		fb_free(d->y);
		return FB_ENOMEM;
	}
	d->count = count;
	d->dim = dim;
	d->classes = classes;
	fb_rng_init(&r, 1, 2);
	for (size_t i = 0; i < (size_t)count * dim; i++) {
		d->x[i] = (float)(2.0 * fb_rng_uniform(&r) - 1.0);
	}
	for (uint32_t i = 0; i < count; i++) {
		d->y[i].cls = (int32_t)fb_rng_below(&r, classes);
	}
	return FB_OK;
}

/* Mirrors the backend's default: graphs on unless FB_CUDA_GRAPHS=0. */
static int
graphs_on(void)
{
	const char *env = getenv("FB_CUDA_GRAPHS");

	return env == NULL || strcmp(env, "0") != 0;
}

static fb_err
bench_row(const row *rw, uint32_t gpus, int math, double seconds)
{
	const fb_trainer_backend *be = fb_trainer_cuda_backend_v1();
	fb_model_spec spec;
	fb_model *m = NULL;
	fb_dataset d;
	fb_trainer_config cfg;
	fb_train_opts o;
	fb_train_stats st;
	fb_train_stats pst;
	fb_cuda_profile prof;
	void *state = NULL;
	float *p = NULL;
	uint32_t B = rw->batch_per_gpu * gpus;
	double per, bare_ms = 0.0, bare_bw = 0.0, sps;
	char desc[128];
	fb_err rc;

	memset(&d, 0, sizeof(d));
	memset(&prof, 0, sizeof(prof));
	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "mlp");
	spec.input_dim = 784;
	spec.classes = 10;
	spec.hidden_count = rw->nh;
	memcpy(spec.hidden, rw->hidden, sizeof(rw->hidden));
	if ((rc = fb_model_open(&spec, &m)) != FB_OK ||
	    (rc = make_shard(&d, 4 * B, 784, 10)) != FB_OK) {
		goto out;
	}
	if ((p = fb_alloc(fb_model_param_count(m) * sizeof(float))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	fb_model_init_params(m, p, 1);
	memset(&cfg, 0, sizeof(cfg));
	cfg.device = FB_DEVICE_CUDA;
	cfg.math = math;
	cfg.throttle = 1.0;
	cfg.gpu_count = gpus;
	for (uint32_t i = 0; i < gpus; i++) {
		cfg.gpus[i] = (int)i;
	}
	if ((rc = be->open(m, &d, &cfg, B, &state)) != FB_OK ||
	    (rc = be->set_params(state, p)) != FB_OK) {
		goto out;
	}
	be->describe(state, desc, sizeof(desc));
	memset(&o, 0, sizeof(o));
	o.batch = B;
	o.lr = 1e-3f;
	o.momentum = 0.9f;
	o.seed = 1;
	o.steps = 10;
	if ((rc = be->train(state, &o, &st, NULL)) != FB_OK) {
		goto out;
	}
	/* A second short run for the per-step estimate (no capture). */
	o.steps = 10;
	if ((rc = be->train(state, &o, &st, NULL)) != FB_OK) {
		goto out;
	}
	per = st.seconds / (double)st.steps;
	o.steps = (uint64_t)(seconds / per);
	if (o.steps < 20) {
		o.steps = 20;
	}
	if ((rc = be->train(state, &o, &st, NULL)) != FB_OK) {
		goto out;
	}
	sps = (double)st.samples / st.seconds;
	if (gpus > 1) {
		fb_cuda_trainer_set_profile(state, 1);
		o.steps = 200;
		if ((rc = be->train(state, &o, &pst, NULL)) != FB_OK) {
			goto out;
		}
		fb_cuda_trainer_get_profile(state, &prof);
		fb_cuda_trainer_set_profile(state, 0);
		if ((rc = fb_cuda_trainer_bare_allreduce(state,
		    fb_model_param_count(m), 50, &bare_ms, &bare_bw)) !=
		    FB_OK) {
			goto out;
		}
	}
	printf("ROW fw=%s row=%c gpus=%u math=%s batch_per_gpu=%u "
	    "params=%llu samples_s=%.1f step_ms=%.4f steps=%llu loss=%.4f "
	    "instep_ms=%.4f instep_last_ms=%.4f instep_calls=%.2f "
	    "instep_busbw=%.1f instep_last_busbw=%.1f "
	    "bare_ms=%.4f bare_busbw=%.1f graphs=%s desc=\"%s\"\n",
	    getenv("FB_CUDA_BUCKET_MB") != NULL ? "fedbox-nooverlap" :
	    "fedbox", rw->name, gpus,
	    math == FB_MATH_TF32 ? "tf32" : math == FB_MATH_BF16 ? "bf16" :
	    "fp32", rw->batch_per_gpu,
	    (unsigned long long)fb_model_param_count(m), sps,
	    1e3 * st.seconds / (double)st.steps,
	    (unsigned long long)st.steps, st.loss_mean,
	    prof.steps ? prof.allreduce_ms / (double)prof.steps : 0.0,
	    prof.steps ? prof.allreduce_last_ms / (double)prof.steps : 0.0,
	    prof.steps ? (double)prof.calls / (double)prof.steps : 0.0,
	    prof.busbw_gbs, prof.busbw_last_gbs, bare_ms, bare_bw,
	    graphs_on() ? "on" : "off", desc);
	fflush(stdout);
out:
	if (rc != FB_OK) {
		printf("ROW fw=fedbox row=%c gpus=%u math=%s error=%s\n",
		    rw->name, gpus, math == FB_MATH_TF32 ? "tf32" :
		    math == FB_MATH_BF16 ? "bf16" : "fp32",
		    fb_strerror(rc));
		fflush(stdout);
	}
	if (state != NULL) {
		be->close(state);
	}
	fb_free(p);
	fb_dataset_fini(&d);
	fb_model_close(m);
	return rc;
}

int
main(int argc, char **argv)
{
	uint32_t gpus = 1;
	const char *which = "abc";
	const char *maths = "fp32,tf32";
	double seconds = 2.0;
	int repeat = 1;
	char why[256] = "";
	int n;
	int failed = 0;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--gpus") == 0) {
			gpus = (uint32_t)atoi(argv[i + 1]);
		} else if (strcmp(argv[i], "--rows") == 0) {
			which = argv[i + 1];
		} else if (strcmp(argv[i], "--math") == 0) {
			maths = argv[i + 1];
		} else if (strcmp(argv[i], "--seconds") == 0) {
			seconds = atof(argv[i + 1]);
		} else if (strcmp(argv[i], "--repeat") == 0) {
			repeat = atoi(argv[i + 1]);
		} else {
			fprintf(stderr, "usage: fedbox_bench --gpus N "
			    "[--rows abc] [--math fp32,tf32] [--seconds S] "
			    "[--repeat N]\n");
			return 2;
		}
	}
	fb_log_init("fedbox_bench", FB_LOG_WARN);
	n = fb_cuda_device_count(why, sizeof(why));
	if (n <= 0 || gpus < 1 || gpus > (uint32_t)n || gpus > 16) {
		printf("SKIP: fedbox_bench --gpus %u: %s (%d visible)\n", gpus,
		    n <= 0 ? why : "not enough GPUs", n);
		return 0;
	}
	for (size_t k = 0; k < (size_t)repeat * 3; k++) {
		size_t r = k % 3;
		if (strchr(which, rows[r].name) == NULL) {
			continue;
		}
		for (int math = FB_MATH_FP32; math <= FB_MATH_BF16; math++) {
			static const char *const names[] = {"fp32", "tf32",
			    "bf16"};
			if (strstr(maths, names[math]) == NULL) {
				continue;
			}
			if (bench_row(&rows[r], gpus, math, seconds) == FB_OK) {
				continue;
			}
			/* Once more without CUDA Graphs, so that a capture
			 * problem still leaves a measurement (flagged). */
			setenv("FB_CUDA_GRAPHS", "0", 1);
			failed |= bench_row(&rows[r], gpus, math, seconds) !=
			    FB_OK;
			unsetenv("FB_CUDA_GRAPHS");
			failed = 1;
		}
		if (gpus > 1 && strchr(which, 'n') != NULL) {
			/* The same rows with one all-reduce after the whole
			 * backward: what overlapping buys. */
			setenv("FB_CUDA_BUCKET_MB", "0", 1);
			failed |= bench_row(&rows[r], gpus, FB_MATH_FP32,
			    seconds / 2) != FB_OK;
			unsetenv("FB_CUDA_BUCKET_MB");
		}
	}
	return failed ? 1 : 0;
}
