/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend.c -- the CUDA trainer backend: data-parallel minibatch SGD of the
 * built-in Linear/ReLU models (mlp, logreg) on all of a box's GPUs.
 *
 * Per GPU ("replica") one device buffer holds parameters | gradients |
 * momentum (3 x param_count floats, padded to 64); the shard is uploaded
 * once at open; each step gathers its rows on the device from indices
 * that the host computes per chunk of steps with fb_train_batch_order.
 * Matrix products are cuBLAS (fp32, or TF32/BF16 tensor-core math on
 * request); bias, ReLU, the loss (softmax cross-entropy, or squared error
 * for regression) and the SGD update are our kernels (kernels.cu). The
 * global batch is split evenly across GPUs; each scales its gradient by
 * 1/global_batch so that the NCCL all-reduced SUM is the gradient of the
 * mean loss. For models above 2 x BUCKET_BYTES, the
 * all-reduce of each bucket of layers is issued on a second stream as soon
 * as its backward is done, overlapping the rest of the backward pass.
 *
 * Threads: one host thread per GPU for each chunk of steps. Each thread
 * drives one communicator, so NCCL calls need no group and a thread can
 * capture its whole step (NCCL included) into a CUDA Graph, the supported
 * one-rank-per-thread pattern; launch work also runs in parallel instead of
 * serially on one thread. The threads meet at a gate once every GPU has
 * captured (and instantiated, uploaded, synchronized), so that no GPU has
 * a collective in flight while another GPU's thread is still in a CUDA
 * call that could wait for its device. With one bucket (models up to
 * 2 x BUCKET_BYTES) the all-reduce runs on the compute stream, as a bare
 * one does; buckets overlapping the backward use a second stream.
 *
 * The files: this one holds the backend's table, train(), the parameters,
 * the masks and the test hooks; step.c the step, its graph and the job
 * threads; open.c the opening and closing; trainer_impl.h their state.
 * Chunks are sized to about 0.2 s, and the host
 * checks `cancel` between chunks, where all GPUs are idle and agree on the
 * step count (a per-GPU check could leave one rank waiting in NCCL).
 * Teardown destroys every graph before finalizing the communicators: NCCL
 * (>= 2.26) polls at finalize until no graph that captured the
 * communicator is alive.
 *
 * Symbols used from the host program (-rdynamic): fb_log,
 * fb_model_get_ops, fb_model_param_count, fb_model_tensor_count,
 * fb_model_tensor_info, fb_model_task, fb_train_batch_order,
 * fb_model_mlp_ops, fb_model_logreg_ops.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "worker/cuda/cuda_impl.h"
#include "worker/cuda/trainer_impl.h"

const char *const fb_cuda_math_names[3] = {"fp32", "tf32", "bf16"};

static fb_err
cuda_set_params(void *state, const float *params)
{
	fb_err rc = FB_OK;
	cuda_trainer *t = state;

	for (uint32_t i = 0; i < t->ngpus; i++) {
		replica *r = &t->rep[i];
		FB_CUDA_TRY(cudaSetDevice(r->dev), rc, out);
		FB_CUDA_TRY(cudaMemcpyAsync(r->buf, params,
		    t->p * sizeof(float), cudaMemcpyHostToDevice, r->stream),
		    rc, out);
		FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
	}
	t->anchor_valid = 0;
out:
	return rc;
}

static fb_err
cuda_get_params(void *state, float *params)
{
	fb_err rc = FB_OK;
	cuda_trainer *t = state;
	replica *r = &t->rep[0];

	FB_CUDA_TRY(cudaSetDevice(r->dev), rc, out);
	FB_CUDA_TRY(cudaMemcpyAsync(params, r->buf, t->p * sizeof(float),
	    cudaMemcpyDeviceToHost, r->stream), rc, out);
	FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
out:
	return rc;
}

/* Identical replicas: every GPU's parameters have GPU 0's checksum. */
static fb_err
check_replicas(cuda_trainer *t)
{
	fb_err rc = FB_OK;
	unsigned long long sums[MAX_GPUS];

	if (t->ngpus < 2) {
		goto out;
	}
	for (uint32_t i = 0; i < t->ngpus; i++) {
		replica *r = &t->rep[i];
		FB_CUDA_TRY(cudaSetDevice(r->dev), rc, out);
		FB_CUDA_TRY(cudaMemsetAsync(r->sum, 0, sizeof(*r->sum),
		    r->stream), rc, out);
		FB_CUDA_TRY(fb_cuda_checksum(r->buf, t->p, r->sum, r->stream),
		    rc, out);
		FB_CUDA_TRY(cudaMemcpyAsync(&sums[i], r->sum, sizeof(sums[i]),
		    cudaMemcpyDeviceToHost, r->stream), rc, out);
		FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
		if (sums[i] != sums[0]) {
			fb_log_error("cuda: replicas differ after training: "
			    "GPU %d checksum %016llx, GPU %d %016llx", r->dev,
			    sums[i], t->rep[0].dev, sums[0]);
			rc = FB_ECUDA;
			goto out;
		}
	}
out:
	return rc;
}

/*
 * FedProx's anchor is the parameters as set, as on the CPU backend: copied
 * on each GPU at the first train() with prox_mu > 0 after set_params. The
 * first allocation invalidates the graphs (they hold the pointer).
 */
static fb_err
anchor_update(cuda_trainer *t)
{
	fb_err rc = FB_OK;

	if (t->anchor_valid) {
		goto out;
	}
	for (uint32_t i = 0; i < t->ngpus; i++) {
		replica *r = &t->rep[i];
		FB_CUDA_TRY(cudaSetDevice(r->dev), rc, out);
		if (r->anchor == NULL) {
			FB_CUDA_TRY(cudaMalloc((void **)&r->anchor,
			    t->p_pad * sizeof(float)), rc, out);
			r->graph_ok = 0;
		}
		FB_CUDA_TRY(cudaMemcpyAsync(r->anchor, r->buf,
		    t->p_pad * sizeof(float), cudaMemcpyDeviceToDevice,
		    r->stream), rc, out);
		FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
	}
	t->anchor_valid = 1;
out:
	return rc;
}

static fb_err
cuda_train(void *state, const fb_train_opts *o, fb_train_stats *st,
    const atomic_int *cancel)
{
	fb_err rc = FB_OK;
	cuda_trainer *t = state;
	uint32_t B = o->batch;
	uint32_t N = t->shard->count;
	uint64_t done = 0;
	uint64_t epoch = 0;
	uint32_t pos = 0;
	uint32_t chunk = t->chunk_fixed ? t->chunk_fixed : 16;
	double loss_total = 0.0;
	double t0 = fb_cuda_now();
	job jobs[MAX_GPUS];
	step_args a;

	memset(st, 0, sizeof(*st));
	memset(&a, 0, sizeof(a));
	if (o->steps == 0 || B == 0 || B > t->max_batch || B < t->ngpus ||
	    !(o->lr > 0.0f) || o->momentum < 0.0f || o->momentum >= 1.0f ||
	    o->weight_decay < 0.0f || !(o->prox_mu >= 0.0f) ||
	    !isfinite(o->prox_mu)) {
		fb_log_error("cuda: bad train options (batch %u, max %u, "
		    "%u GPUs)", B, t->max_batch, t->ngpus);
		rc = FB_EINVAL;
		goto out;
	}
	a.batch = B;
	a.lr = o->lr;
	a.mu = o->momentum;
	a.wd = o->weight_decay;
	a.prox = o->prox_mu;
	a.update = 1;
	if (a.prox > 0.0f && (rc = anchor_update(t)) != FB_OK) {
		goto out;
	}
	if (fb_cuda_split_batch(t, B) || t->key_batch != B || t->key_lr != a.lr ||
	    t->key_mu != a.mu || t->key_wd != a.wd || t->key_prox != a.prox) {
		for (uint32_t i = 0; i < t->ngpus; i++) {
			t->rep[i].graph_ok = 0;
		}
		t->key_batch = B;
		t->key_lr = a.lr;
		t->key_mu = a.mu;
		t->key_wd = a.wd;
		t->key_prox = a.prox;
	}
	fb_train_batch_order(o->seed, o->round, o->worker_index, 0, t->order,
	    N);

	while (done < o->steps) {
		uint64_t left = o->steps - done;
		uint32_t n = chunk;
		double c0;

		if (cancel != NULL && atomic_load(cancel)) {
			rc = FB_ECLOSED;
			break;
		}
		if (n > left) {
			n = (uint32_t)left;
		}
		if ((uint64_t)n * B > IDX_CAP) {
			n = IDX_CAP / B;
		}
		/* Positions done*B .. of the endless stream of epochs. */
		for (uint64_t i = 0; i < (uint64_t)n * B; i++) {
			if (pos == N) {
				epoch++;
				pos = 0;
				fb_train_batch_order(o->seed, o->round,
				    o->worker_index, epoch, t->order, N);
			}
			t->hidx[i] = t->order[pos++];
		}
		for (uint32_t i = 0; i < t->ngpus; i++) {
			memset(&jobs[i], 0, sizeof(jobs[i]));
			jobs[i].t = t;
			jobs[i].r = &t->rep[i];
			jobs[i].kind = JOB_CHUNK;
			jobs[i].a = a;
			jobs[i].steps = n;
			jobs[i].reset_momentum = done == 0;
		}
		c0 = fb_cuda_now();
		if ((rc = fb_cuda_run_jobs(t, jobs)) != FB_OK) {
			break;
		}
		fb_cuda_profile_collect(t, n);
		for (uint32_t s = 0; s < n; s++) {
			double l = 0.0;
			for (uint32_t i = 0; i < t->ngpus; i++) {
				l += t->rep[i].losses_host[s];
			}
			loss_total += l;
		}
		done += n;
		if (t->chunk_fixed == 0) {
			double per = (fb_cuda_now() - c0) / n;
			double want = per > 0.0 ? CHUNK_SECONDS / per : 1e9;
			chunk = want < 1.0 ? 1 : want > CHUNK_MAX ? CHUNK_MAX :
			    (uint32_t)want;
		}
	}
	st->steps = done;
	st->samples = done * B;
	st->loss_mean = done > 0 ? loss_total / (double)done : 0.0;
	st->seconds = fb_cuda_now() - t0;
	if (rc == FB_OK || rc == FB_ECLOSED) {
		fb_err rc2 = check_replicas(t);
		if (rc2 != FB_OK) {
			rc = rc2;
		}
	}
out:
	return rc;
}

static void
cuda_describe(void *state, char *buf, size_t len)
{
	cuda_trainer *t = state;

	snprintf(buf, len, "cuda: %u x %s (%s)", t->ngpus, t->gpu_name,
	    fb_cuda_math_names[t->math]);
}

/* The mask state comes at the first call, on the first GPU. */
static fb_err
cuda_mask_state(cuda_trainer *t, fb_cuda_mask **out)
{
	fb_err rc = FB_OK;

	if (t->mask == NULL) {
		rc = fb_cuda_mask_alloc(t->rep[0].dev, &t->mask);
		if (rc == FB_OK) {
			fb_log_info("cuda: secure-aggregation masks on GPU %d",
			    t->rep[0].dev);
		}
	}
	*out = t->mask;
	return rc;
}

static fb_err
cuda_mask_apply(void *state, uint32_t *v, uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms, uint32_t round)
{
	cuda_trainer *t = state;
	fb_err rc;
	fb_cuda_mask *m = NULL;

	/* A bad call fails as fb_mask_apply does, before any CUDA state is
	 * made; so does a call with nothing to do. */
	if ((rc = fb_cuda_mask_check(offset, count, terms, nterms)) != FB_OK ||
	    count == 0 || nterms == 0) {
		return rc;
	}
	/* Callers may be several threads (the worker masks a batch of chunks
	 * on its pool): their calls take the GPU in turn. */
	pthread_mutex_lock(&t->mask_mu);
	if ((rc = cuda_mask_state(t, &m)) == FB_OK) {
		rc = fb_cuda_mask_apply(m, v, offset, count, terms, nterms,
		    round);
	}
	pthread_mutex_unlock(&t->mask_mu);
	return rc;
}

static const fb_trainer_backend cuda_backend = {
	.name = "cuda",
	.open = fb_cuda_open,
	.close = fb_cuda_close,
	.set_params = cuda_set_params,
	.train = cuda_train,
	.get_params = cuda_get_params,
	.describe = cuda_describe,
	.mask_apply = cuda_mask_apply,
};

const fb_trainer_backend *
fb_trainer_cuda_backend_v1(void)
{
	return &cuda_backend;
}

int
fb_cuda_device_count(char *why, size_t len)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		snprintf(why, len, "%s", cudaGetErrorString(e));
		return 0;
	}
	if (n == 0) {
		snprintf(why, len, "no CUDA device visible");
	}
	return n;
}

fb_err
fb_cuda_trainer_gradient(void *state, const uint32_t *idx, uint32_t batch,
    float *grad, float *loss)
{
	fb_err rc = FB_OK;
	cuda_trainer *t = state;
	job jobs[MAX_GPUS];
	replica *r0 = &t->rep[0];
	double l = 0.0;

	*loss = 0.0f;
	if (batch == 0 || batch > t->max_batch || batch < t->ngpus ||
	    batch > IDX_CAP) {
		rc = FB_EINVAL;
		goto out;
	}
	for (uint32_t i = 0; i < batch; i++) {
		if (idx[i] >= t->shard->count) {
			rc = FB_EINVAL;
			goto out;
		}
		t->hidx[i] = idx[i];
	}
	if (fb_cuda_split_batch(t, batch)) {
		for (uint32_t i = 0; i < t->ngpus; i++) {
			t->rep[i].graph_ok = 0;
		}
	}
	for (uint32_t i = 0; i < t->ngpus; i++) {
		memset(&jobs[i], 0, sizeof(jobs[i]));
		jobs[i].t = t;
		jobs[i].r = &t->rep[i];
		jobs[i].kind = JOB_GRAD;
		jobs[i].a.batch = batch;
		jobs[i].a.update = 0;
	}
	if ((rc = fb_cuda_run_jobs(t, jobs)) != FB_OK) {
		goto out;
	}
	for (uint32_t i = 0; i < t->ngpus; i++) {
		l += t->rep[i].losses_host[0];
	}
	*loss = (float)l;
	FB_CUDA_TRY(cudaSetDevice(r0->dev), rc, out);
	FB_CUDA_TRY(cudaMemcpy(grad, r0->buf + t->p_pad, t->p * sizeof(float),
	    cudaMemcpyDeviceToHost), rc, out);
out:
	return rc;
}

void
fb_cuda_trainer_set_profile(void *state, int on)
{
	cuda_trainer *t = state;

	t->profile = on != 0;
	for (uint32_t i = 0; i < t->ngpus; i++) {
		t->rep[i].graph_ok = 0; /* recapture with or without stamps */
	}
	t->prof_steps = 0;
	t->prof_calls = 0;
	t->prof_bytes = 0;
	t->prof_ms_mean = 0.0;
	t->prof_ms_last = 0.0;
}

static double
busbw(uint32_t n, uint64_t bytes, double ms)
{
	return ms > 0.0 ? 2.0 * (n - 1) / n * (double)bytes / (ms * 1e-3) /
	    1e9 : 0.0;
}

void
fb_cuda_trainer_get_profile(void *state, fb_cuda_profile *out)
{
	cuda_trainer *t = state;
	uint32_t n = t->ngpus;

	memset(out, 0, sizeof(*out));
	out->ranks = n;
	out->steps = t->prof_steps;
	out->calls = t->prof_calls;
	out->bytes = t->prof_bytes;
	out->allreduce_ms = t->prof_ms_mean;
	out->allreduce_last_ms = t->prof_ms_last;
	if (n > 1) {
		out->busbw_gbs = busbw(n, out->bytes, out->allreduce_ms);
		out->busbw_last_gbs = busbw(n, out->bytes,
		    out->allreduce_last_ms);
	}
}

fb_err
fb_cuda_trainer_bare_allreduce(void *state, uint64_t count, uint32_t iters,
    double *ms, double *busbw_gbs)
{
	fb_err rc = FB_OK;
	cuda_trainer *t = state;
	job jobs[MAX_GPUS];
	double sum = 0.0;
	uint32_t n = t->ngpus;

	*ms = 0.0;
	*busbw_gbs = 0.0;
	if (n < 2) {
		rc = FB_ENOTSUP;
		goto out;
	}
	if (count == 0 || count > t->p_pad || iters == 0) {
		rc = FB_EINVAL;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		memset(&jobs[i], 0, sizeof(jobs[i]));
		jobs[i].t = t;
		jobs[i].r = &t->rep[i];
		jobs[i].kind = JOB_BARE;
		jobs[i].count = count;
		jobs[i].iters = iters;
	}
	if ((rc = fb_cuda_run_jobs(t, jobs)) != FB_OK) {
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		sum += jobs[i].ms;
	}
	*ms = sum / n;
	*busbw_gbs = busbw(n, count * sizeof(float), *ms);
out:
	return rc;
}

void
fb_cuda_trainer_mask_stats(void *state, fb_cuda_mask_stats *out)
{
	cuda_trainer *t = state;

	fb_cuda_mask_get_stats(t->mask, out);
}

fb_err
fb_cuda_trainer_mask_kernel(void *state, uint64_t count, uint32_t nterms,
    uint32_t iters, double *seconds)
{
	fb_err rc;
	fb_cuda_mask *m = NULL;

	*seconds = 0.0;
	if ((rc = cuda_mask_state(state, &m)) != FB_OK) {
		return rc;
	}
	return fb_cuda_mask_time_kernel(m, count, nterms, iters, seconds);
}

fb_err
fb_cuda_host_register(void *p, size_t len)
{
	fb_err rc = FB_OK;

	FB_CUDA_TRY(cudaHostRegister(p, len, cudaHostRegisterPortable), rc,
	    out);
out:
	return rc;
}

void
fb_cuda_host_unregister(void *p)
{
	cudaError_t e = cudaHostUnregister(p);

	if (e != cudaSuccess) {
		fb_log_warn("cuda: cudaHostUnregister: %s",
		    cudaGetErrorString(e));
	}
}
