/* SPDX-License-Identifier: Apache-2.0 */
/*
 * train_cpu.c -- the built-in CPU training backend: minibatch SGD with
 * optional momentum and weight decay, single-threaded, deterministic.
 *
 * Everything is allocated once in open (parameters, gradient, momentum
 * buffer, the model's workspace, a gathered batch and the epoch's
 * permutation), so train() allocates nothing. Batches: each train() call
 * starts at position 0 of epoch 0 of the order fb_train_batch_order gives
 * for (seed, round, worker_index); step s takes the examples at positions
 * s*batch .. s*batch+batch-1 of the endless sequence "epoch 0's permutation,
 * then epoch 1's, ...", so the last batch of an epoch wraps into the next
 * epoch's permutation and no example is skipped or dropped. The optimizer
 * follows torch.optim.SGD (dampening 0, no Nesterov): g = grad + wd * w;
 * v = mu * v + g; w -= lr * v, with v zeroed at the start of every train().
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/trainer.h"

typedef struct cpu_state {
	const fb_model *m; /* borrowed */
	const fb_model_ops *ops;
	const void *ms;             /* model state */
	const fb_dataset *shard;    /* borrowed */
	uint32_t max_batch;         /* >= 1 */
	double throttle;            /* >= 1 */
	uint64_t np;                /* parameter count */
	float *params, *grad, *mom; /* np floats each */
	float *anchor;              /* FedProx: params at round start */
	bool anchor_valid;          /* anchor holds the last set params */
	void *ws;                   /* model workspace for max_batch */
	float *xb;                  /* max_batch * dim: the gathered batch */
	fb_label *yb;               /* max_batch labels */
	uint32_t *order;            /* shard->count: the current epoch */
} cpu_state;

static void cpu_close(void *state);

static fb_err
cpu_open(const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, uint32_t max_batch, void **state)
{
	fb_err rc = FB_OK;
	cpu_state *s = NULL;
	size_t ws_len;

	*state = NULL;
	if (fb_model_get_ops(m)->forward_backward == NULL) {
		fb_log_error("trainer: model %s cannot train",
		    fb_model_get_ops(m)->name);
		rc = FB_ENOTSUP;
		goto out;
	}
	if (max_batch < 1 || shard->count < 1 ||
	    shard->dim != fb_model_input_dim(m)) {
		fb_log_error(
		    "trainer: need max_batch >= 1 and a non-empty "
		    "shard of %u features (got max_batch %u, %u examples of "
		    "%u)",
		    fb_model_input_dim(m), max_batch, shard->count, shard->dim);
		rc = FB_EINVAL;
		goto out;
	}
	if (!(cfg->throttle >= 1.0 || cfg->throttle == 0.0) ||
	    !isfinite(cfg->throttle)) {
		fb_log_error(
		    "trainer: throttle must be >= 1 (got %g)", cfg->throttle);
		rc = FB_EINVAL;
		goto out;
	}
	if ((s = fb_calloc(1, sizeof(*s))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	s->m = m;
	s->ops = fb_model_get_ops(m);
	s->ms = fb_model_state(m);
	s->shard = shard;
	s->max_batch = max_batch;
	s->throttle = cfg->throttle < 1.0 ? 1.0 : cfg->throttle;
	s->np = fb_model_param_count(m);
	ws_len = s->ops->workspace_len(s->ms, max_batch);
	s->params = fb_calloc((size_t)s->np, sizeof(float));
	s->grad = fb_calloc((size_t)s->np, sizeof(float));
	s->mom = fb_calloc((size_t)s->np, sizeof(float));
	s->ws = ws_len == SIZE_MAX ? NULL : fb_alloc(ws_len);
	s->xb = fb_calloc((size_t)max_batch * shard->dim, sizeof(float));
	s->yb = fb_calloc(max_batch, sizeof(*s->yb));
	s->order = fb_calloc(shard->count, sizeof(uint32_t));
	if (s->params == NULL || s->grad == NULL || s->mom == NULL ||
	    s->ws == NULL || s->xb == NULL || s->yb == NULL ||
	    s->order == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	*state = s;
	s = NULL;
out:
	cpu_close(s);
	return rc;
}

static void
cpu_close(void *state)
{
	cpu_state *s = state;

	if (s == NULL) {
		return;
	}
	fb_free(s->params);
	fb_free(s->anchor);
	fb_free(s->grad);
	fb_free(s->mom);
	fb_free(s->ws);
	fb_free(s->xb);
	fb_free(s->yb);
	fb_free(s->order);
	fb_free(s);
}

static fb_err
cpu_set_params(void *state, const float *params)
{
	cpu_state *s = state;

	memcpy(s->params, params, (size_t)s->np * sizeof(float));
	s->anchor_valid = false;
	return FB_OK;
}

static fb_err
cpu_get_params(void *state, float *params)
{
	cpu_state *s = state;

	memcpy(params, s->params, (size_t)s->np * sizeof(float));
	return FB_OK;
}

static void
cpu_describe(void *state, char *buf, size_t len)
{
	cpu_state *s = state;

	if (s->throttle > 1.0) {
		snprintf(buf, len,
		    "cpu: 1 thread (fp32), throttle %.2fx "
		    "(simulated)",
		    s->throttle);
	} else {
		snprintf(buf, len, "cpu: 1 thread (fp32)");
	}
}

/*
 * sleep_s sleeps `sec` seconds, resuming after signals, in slices of at
 * most 50 ms so that a cancel during a long simulated slowdown is seen.
 */
static void
sleep_s(double sec, const atomic_int *cancel)
{
	double end = fb_now_s() + sec, left;

	while ((left = end - fb_now_s()) > 0.0 &&
	       (cancel == NULL || atomic_load(cancel) == 0)) {
		struct timespec ts;
		left = left < 0.05 ? left : 0.05;
		ts.tv_sec = 0;
		ts.tv_nsec = (long)(left * 1e9);
		(void)nanosleep(&ts, NULL);
	}
}

static fb_err
check_opts(const cpu_state *s, const fb_train_opts *o)
{
	if (o->steps < 1 || o->batch < 1 || o->batch > s->max_batch ||
	    !(o->lr > 0.0f) || !isfinite(o->lr) || !(o->momentum >= 0.0f) ||
	    !(o->momentum < 1.0f) || !(o->weight_decay >= 0.0f) ||
	    !isfinite(o->weight_decay) || !(o->prox_mu >= 0.0f) ||
	    !isfinite(o->prox_mu)) {
		fb_log_error(
		    "trainer: bad options (steps %llu >= 1, batch %u "
		    "in 1..%u, lr %g > 0, momentum %g in [0, 1), weight "
		    "decay %g >= 0)",
		    (unsigned long long)o->steps, o->batch, s->max_batch,
		    (double)o->lr, (double)o->momentum,
		    (double)o->weight_decay);
		return FB_EINVAL;
	}
	return FB_OK;
}

static fb_err
cpu_train(void *state, const fb_train_opts *opts, fb_train_stats *stats,
    const atomic_int *cancel)
{
	cpu_state *s = state;
	fb_err rc = FB_OK;
	const fb_dataset *d = s->shard;
	uint64_t pos = 0, epoch = UINT64_MAX;
	double t_start = fb_now_s(), loss_sum = 0.0;
	const float lr = opts->lr, mu = opts->momentum, wd = opts->weight_decay;
	const float prox = opts->prox_mu;

	memset(stats, 0, sizeof(*stats));
	if ((rc = check_opts(s, opts)) != FB_OK) {
		goto out;
	}
	if (s->throttle > 1.0) {
		fb_log_debug("trainer: throttle %.2f: sleeping %.2fx each "
		             "step's compute time (simulated slowdown)",
		    s->throttle, s->throttle - 1.0);
	}
	memset(s->mom, 0, (size_t)s->np * sizeof(float));
	if (prox > 0.0f && !s->anchor_valid) {
		if (s->anchor == NULL &&
		    (s->anchor = fb_alloc((size_t)s->np * sizeof(float))) ==
		        NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		memcpy(s->anchor, s->params, (size_t)s->np * sizeof(float));
		s->anchor_valid = true;
	}
	for (uint64_t step = 0; step < opts->steps; step++) {
		double t0 = fb_now_s();
		float loss = 0.0f;

		if (cancel != NULL && atomic_load(cancel) != 0) {
			rc = FB_ECLOSED;
			goto out;
		}
		for (uint32_t b = 0; b < opts->batch; b++, pos++) {
			uint32_t idx;
			if (pos / d->count != epoch) {
				epoch = pos / d->count;
				fb_train_batch_order(opts->seed, opts->round,
				    opts->worker_index, epoch, s->order,
				    d->count);
			}
			idx = s->order[pos % d->count];
			memcpy(s->xb + (size_t)b * d->dim,
			    d->x + (size_t)idx * d->dim,
			    (size_t)d->dim * sizeof(float));
			s->yb[b] = d->y[idx];
		}
		rc = s->ops->forward_backward(s->ms, s->params, s->xb, s->yb,
		    opts->batch, s->grad, &loss, s->ws);
		if (rc != FB_OK) {
			goto out;
		}
		if (prox > 0.0f) {
			/* FedProx: the proximal term's gradient joins the
			 * loss gradient before weight decay and momentum. */
			for (uint64_t i = 0; i < s->np; i++) {
				s->grad[i] += prox * (s->params[i] - s->anchor[i]);
			}
		}
		if (mu > 0.0f) {
			for (uint64_t i = 0; i < s->np; i++) {
				float g = s->grad[i] + wd * s->params[i];
				s->mom[i] = mu * s->mom[i] + g;
				s->params[i] -= lr * s->mom[i];
			}
		} else {
			for (uint64_t i = 0; i < s->np; i++) {
				float g = s->grad[i] + wd * s->params[i];
				s->params[i] -= lr * g;
			}
		}
		loss_sum += loss;
		stats->steps++;
		stats->samples += opts->batch;
		if (s->throttle > 1.0) {
			sleep_s(
			    (s->throttle - 1.0) * (fb_now_s() - t0), cancel);
		}
	}
out:
	if (stats->steps > 0) {
		stats->loss_mean = loss_sum / (double)stats->steps;
	}
	stats->seconds = fb_now_s() - t_start;
	return rc;
}

const fb_trainer_backend fb_trainer_cpu_backend = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .set_params = cpu_set_params,
    .train = cpu_train,
    .get_params = cpu_get_params,
    .describe = cpu_describe,
};
