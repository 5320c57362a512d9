/* SPDX-License-Identifier: Apache-2.0 */
/*
 * open.c -- opening the CUDA trainer: the model's Linear layers and
 * all-reduce buckets from the built-in model, one replica per GPU (streams,
 * cuBLAS, NCCL, device buffers, the shard uploaded once), and closing it
 * all again in the right order (graphs before communicators).
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

void
fb_cuda_close(void *state)
{
	cuda_trainer *t = state;

	if (t == NULL) {
		return;
	}
	/* Graphs that captured NCCL calls hold the communicators' persistent
	 * work until they are destroyed, and ncclCommFinalize waits for it:
	 * destroy them first. */
	for (uint32_t i = 0; i < t->ngpus; i++) {
		replica *r = &t->rep[i];
		if (r->graph != NULL && cudaSetDevice(r->dev) == cudaSuccess) {
			cudaStreamSynchronize(r->stream);
			cudaGraphExecDestroy(r->graph);
			r->graph = NULL;
			cudaDeviceSynchronize();
		}
	}
	/* O5: communicators are finalized (together: they are peers driven
	 * from this one thread), then destroyed. */
	if (t->ngpus > 1 && t->rep[0].nccl != NULL) {
		ncclGroupStart();
		for (uint32_t i = 0; i < t->ngpus; i++) {
			if (t->rep[i].nccl != NULL) {
				ncclCommFinalize(t->rep[i].nccl);
			}
		}
		ncclGroupEnd();
		for (uint32_t i = 0; i < t->ngpus; i++) {
			if (t->rep[i].nccl != NULL) {
				ncclCommDestroy(t->rep[i].nccl);
				t->rep[i].nccl = NULL;
			}
		}
	}
	for (uint32_t i = 0; i < t->ngpus; i++) {
		replica *r = &t->rep[i];
		if (cudaSetDevice(r->dev) != cudaSuccess) {
			continue;
		}
		if (r->stream != NULL) {
			cudaStreamSynchronize(r->stream);
		}
		if (r->graph != NULL) {
			cudaGraphExecDestroy(r->graph);
		}
		for (uint32_t b = 0; b < MAX_LAYERS; b++) {
			if (r->ev_ready[b] != NULL) {
				cudaEventDestroy(r->ev_ready[b]);
			}
		}
		if (r->ev_comm_done != NULL) {
			cudaEventDestroy(r->ev_comm_done);
		}
		if (r->blas != NULL) {
			cublasDestroy(r->blas);
		}
		cudaFree(r->buf);
		cudaFree(r->anchor);
		cudaFree(r->x);
		cudaFree(r->y);
		cudaFree(r->idx);
		cudaFree(r->step);
		cudaFree(r->losses);
		cudaFree(r->sum);
		cudaFree(r->act);
		cudaFree(r->blas_ws);
		cudaFreeHost(r->losses_host);
		cudaFree(r->stamps);
		cudaFreeHost(r->stamps_host);
		if (r->comm != NULL) {
			cudaStreamDestroy(r->comm);
		}
		if (r->stream != NULL) {
			cudaStreamDestroy(r->stream);
		}
	}
	fb_cuda_mask_free(t->mask);
	pthread_mutex_destroy(&t->mask_mu);
	cudaFreeHost(t->hidx);
	free(t->order);
	free(t);
}

/* Reads the model's tensors as a chain of Linear layers (weight [out, in]
 * then bias [out]); anything else is not ours to run. */
static fb_err
parse_layers(cuda_trainer *t, const fb_model *m, const fb_dataset *shard)
{
	fb_err rc = FB_OK;
	const fb_model_ops *ops = fb_model_get_ops(m);
	uint32_t nt = fb_model_tensor_count(m);
	uint32_t prev = shard->dim;
	int contiguous = 1;
	uint64_t bucket_bytes;
	const char *env;

	if (ops != &fb_model_mlp_ops && ops != &fb_model_logreg_ops) {
		fb_log_warn("cuda: model '%s' has no CUDA implementation (the "
		    "CUDA backend runs the built-in mlp and logreg)",
		    ops != NULL && ops->name != NULL ? ops->name : "?");
		rc = FB_ENOTSUP;
		goto out;
	}
	if (nt == 0 || nt % 2 != 0 || nt / 2 > MAX_LAYERS) {
		fb_log_error("cuda: model '%s': %u tensors, expected "
		    "weight/bias pairs", ops->name, nt);
		rc = FB_ENOTSUP;
		goto out;
	}
	t->nlayers = nt / 2;
	t->width_max = 0;
	for (uint32_t l = 0; l < t->nlayers; l++) {
		fb_tensor_info wi;
		fb_tensor_info bi;
		layer *ly = &t->layers[l];

		fb_model_tensor_info(m, 2 * l, &wi);
		fb_model_tensor_info(m, 2 * l + 1, &bi);
		if (wi.ndim != 2 || bi.ndim != 1 || wi.shape[1] != prev ||
		    bi.shape[0] != wi.shape[0] || wi.shape[0] > UINT32_MAX ||
		    wi.offset + wi.count > t->p ||
		    bi.offset + bi.count > t->p) {
			fb_log_error("cuda: model '%s': tensor %s/%s is not a "
			    "Linear layer taking %u inputs", ops->name, wi.name,
			    bi.name, prev);
			rc = FB_ENOTSUP;
			goto out;
		}
		ly->in = prev;
		ly->out = (uint32_t)wi.shape[0];
		ly->w_off = wi.offset;
		ly->b_off = bi.offset;
		contiguous &= ly->b_off == ly->w_off + (uint64_t)ly->in *
		    ly->out;
		if (l > 0) {
			contiguous &= ly->w_off == t->layers[l - 1].b_off +
			    t->layers[l - 1].out;
		}
		if (ly->in > t->width_max) {
			t->width_max = ly->in;
		}
		prev = ly->out;
	}
	t->task = fb_model_task(m);
	if (shard->task != t->task) {
		fb_log_error("cuda: the shard holds %s labels, the model is "
		    "for %s", shard->task == FB_TASK_REGRESSION ?
		    "regression" : "class", t->task == FB_TASK_REGRESSION ?
		    "regression" : "classification");
		rc = FB_EINVAL;
		goto out;
	}
	/* A box may lack the top classes; its labels only need to fit. */
	if (t->task == FB_TASK_REGRESSION ? prev != 1 :
	    shard->classes > prev) {
		fb_log_error("cuda: model has %u outputs, shard needs %u",
		    prev, t->task == FB_TASK_REGRESSION ? 1 : shard->classes);
		rc = FB_EINVAL;
		goto out;
	}
	/* The loss kernels index by label: check them all once here. */
	for (uint32_t i = 0; i < shard->count; i++) {
		const fb_label *y = &shard->y[i];
		if (t->task == FB_TASK_REGRESSION ? !isfinite(y->value) :
		    y->cls < 0 || (uint32_t)y->cls >= prev) {
			fb_log_error("cuda: label of example %u does not fit "
			    "the model's %u outputs", i, prev);
			rc = FB_EINVAL;
			goto out;
		}
	}

	/* Buckets, from the last layer down (the order of the backward).
	 * FB_CUDA_BUCKET_MB overrides the size; 0 = one all-reduce after
	 * the whole backward (no overlap). */
	env = getenv("FB_CUDA_BUCKET_MB");
	bucket_bytes = env != NULL ? strtoull(env, NULL, 10) << 20 :
	    BUCKET_BYTES;
	t->nbuckets = 0;
	if (!contiguous || bucket_bytes == 0 ||
	    t->p * sizeof(float) < 2 * bucket_bytes) {
		t->buckets[0].last_layer = 0;
		t->buckets[0].off = 0;
		t->buckets[0].count = t->p;
		t->nbuckets = 1;
	} else {
		uint32_t hi = t->nlayers - 1;
		uint64_t bytes = 0;
		for (uint32_t l = t->nlayers; l-- > 0;) {
			const layer *ly = &t->layers[l];
			bytes += ((uint64_t)ly->in + 1) * ly->out *
			    sizeof(float);
			if (bytes >= bucket_bytes || l == 0) {
				bucket *b = &t->buckets[t->nbuckets++];
				b->last_layer = l;
				b->off = ly->w_off;
				b->count = t->layers[hi].b_off +
				    t->layers[hi].out - ly->w_off;
				bytes = 0;
				hi = l - 1;
			}
		}
	}
out:
	return rc;
}

static fb_err
replica_open(cuda_trainer *t, replica *r, const fb_dataset *shard)
{
	fb_err rc = FB_OK;
	size_t act_len = 0;
	size_t off;
	uint32_t rm = t->rows_max;

	FB_CUDA_TRY(cudaSetDevice(r->dev), rc, out);
	(void)cudaGetLastError(); /* launchers report the last error */
	FB_CUDA_TRY(cudaStreamCreateWithFlags(&r->stream,
	    cudaStreamNonBlocking), rc, out);
	FB_CUDA_TRY(cudaStreamCreateWithFlags(&r->comm,
	    cudaStreamNonBlocking), rc, out);
	FB_CUBLAS_TRY(cublasCreate(&r->blas), rc, out);
	FB_CUBLAS_TRY(cublasSetStream(r->blas, r->stream), rc, out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->blas_ws, BLAS_WS_LEN), rc, out);
	FB_CUBLAS_TRY(cublasSetWorkspace(r->blas, r->blas_ws, BLAS_WS_LEN), rc,
	    out);
	FB_CUDA_TRY(cudaEventCreateWithFlags(&r->ev_comm_done,
	    cudaEventDisableTiming), rc, out);
	for (uint32_t b = 0; b < MAX_LAYERS; b++) {
		FB_CUDA_TRY(cudaEventCreateWithFlags(&r->ev_ready[b],
		    cudaEventDisableTiming), rc, out);
	}

	FB_CUDA_TRY(cudaMalloc((void **)&r->buf, 3 * t->p_pad * sizeof(float)), rc,
	    out);
	FB_CUDA_TRY(cudaMemset(r->buf, 0, 3 * t->p_pad * sizeof(float)), rc,
	    out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->x, (size_t)shard->count * shard->dim *
	    sizeof(float)), rc, out);
	FB_CUDA_TRY(cudaMemcpy(r->x, shard->x, (size_t)shard->count *
	    shard->dim * sizeof(float), cudaMemcpyHostToDevice), rc, out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->y, (size_t)shard->count *
	    sizeof(fb_label)), rc, out);
	FB_CUDA_TRY(cudaMemcpy(r->y, shard->y, (size_t)shard->count *
	    sizeof(fb_label), cudaMemcpyHostToDevice), rc, out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->idx, (size_t)IDX_CAP * sizeof(uint32_t)),
	    rc, out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->step, sizeof(uint32_t)), rc, out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->losses, CHUNK_MAX * sizeof(float)), rc,
	    out);
	FB_CUDA_TRY(cudaMalloc((void **)&r->sum, sizeof(*r->sum)), rc, out);
	FB_CUDA_TRY(cudaHostAlloc((void **)&r->losses_host,
	    CHUNK_MAX * sizeof(float), cudaHostAllocPortable), rc, out);
	if (t->ngpus > 1) {
		size_t len = (size_t)CHUNK_MAX * STAMPS * sizeof(*r->stamps);
		FB_CUDA_TRY(cudaMalloc((void **)&r->stamps, len), rc, out);
		FB_CUDA_TRY(cudaMemset(r->stamps, 0, len), rc, out);
		FB_CUDA_TRY(cudaHostAlloc((void **)&r->stamps_host, len,
		    cudaHostAllocPortable), rc, out);
	}

	/* Activations: a[0..L], 2 backward buffers, dlogits, rowloss, ones,
	 * labels; each piece starts PAD-aligned. */
#define ROUND(n) (((size_t)(n) + PAD - 1) / PAD * PAD)
	act_len += ROUND((size_t)rm * t->layers[0].in);
	for (uint32_t l = 0; l < t->nlayers; l++) {
		act_len += ROUND((size_t)rm * t->layers[l].out);
	}
	act_len += 2 * ROUND((size_t)rm * t->width_max);
	act_len += ROUND((size_t)rm * t->layers[t->nlayers - 1].out);
	act_len += 3 * ROUND(rm); /* rowloss, ones, labels (4 bytes each) */
	FB_CUDA_TRY(cudaMalloc((void **)&r->act, act_len * sizeof(float)), rc, out);
	off = 0;
	r->a[0] = r->act + off;
	off += ROUND((size_t)rm * t->layers[0].in);
	for (uint32_t l = 0; l < t->nlayers; l++) {
		r->a[l + 1] = r->act + off;
		off += ROUND((size_t)rm * t->layers[l].out);
	}
	for (int k = 0; k < 2; k++) {
		r->dbuf[k] = r->act + off;
		off += ROUND((size_t)rm * t->width_max);
	}
	r->dlogits = r->act + off;
	off += ROUND((size_t)rm * t->layers[t->nlayers - 1].out);
	r->rowloss = r->act + off;
	off += ROUND(rm);
	r->ones = r->act + off;
	off += ROUND(rm);
	r->yb = (fb_label *)(r->act + off);
#undef ROUND
	FB_CUDA_TRY(fb_cuda_fill(r->ones, rm, 1.0f, r->stream), rc, out);
	FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
out:
	return rc;
}

fb_err
fb_cuda_open(const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, uint32_t max_batch, void **state)
{
	fb_err rc = FB_OK;
	cuda_trainer *t = NULL;
	int ndev = 0;
	int devs[MAX_GPUS];
	ncclComm_t comms[MAX_GPUS];
	cudaError_t e;
	struct cudaDeviceProp prop;
	const char *env;

	*state = NULL;
	e = cudaGetDeviceCount(&ndev);
	if (e != cudaSuccess) {
		fb_log_warn("cuda: unavailable: %s", cudaGetErrorString(e));
		rc = FB_ENOTSUP;
		goto out;
	}
	if (ndev <= 0) {
		fb_log_warn("cuda: unavailable: no CUDA device visible");
		rc = FB_ENOTSUP;
		goto out;
	}
	if (shard == NULL || shard->count == 0 || max_batch == 0 ||
	    max_batch > IDX_CAP ||
	    cfg->math < FB_MATH_FP32 || cfg->math > FB_MATH_BF16 ||
	    cfg->gpu_count > MAX_GPUS) {
		fb_log_error("cuda: bad shard, batch, math or gpu list");
		rc = FB_EINVAL;
		goto out;
	}
	if ((t = calloc(1, sizeof(*t))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	pthread_mutex_init(&t->mask_mu, NULL);
	t->model = m;
	t->shard = shard;
	t->p = fb_model_param_count(m);
	t->p_pad = (t->p + PAD - 1) / PAD * PAD;
	t->max_batch = max_batch;
	t->math = cfg->math;
	t->compute = cfg->math == FB_MATH_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 :
	    cfg->math == FB_MATH_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF :
	    CUBLAS_COMPUTE_32F;
	env = getenv("FB_CUDA_CHUNK_STEPS");
	t->chunk_fixed = env != NULL ? (uint32_t)strtoul(env, NULL, 10) : 0;
	if (t->chunk_fixed > CHUNK_MAX) {
		t->chunk_fixed = CHUNK_MAX;
	}

	if (cfg->gpu_count == 0) {
		t->ngpus = (uint32_t)(ndev < MAX_GPUS ? ndev : MAX_GPUS);
		for (uint32_t i = 0; i < t->ngpus; i++) {
			devs[i] = (int)i;
		}
	} else {
		t->ngpus = cfg->gpu_count;
		for (uint32_t i = 0; i < t->ngpus; i++) {
			devs[i] = cfg->gpus[i];
			if (devs[i] < 0 || devs[i] >= ndev) {
				fb_log_error("cuda: gpu %d does not exist "
				    "(%d visible)", devs[i], ndev);
				rc = FB_EINVAL;
				goto out;
			}
			for (uint32_t k = 0; k < i; k++) {
				if (devs[k] == devs[i]) {
					fb_log_error("cuda: gpu %d listed "
					    "twice", devs[i]);
					rc = FB_EINVAL;
					goto out;
				}
			}
		}
	}
	/* CUDA Graphs: on unless FB_CUDA_GRAPHS=0. */
	env = getenv("FB_CUDA_GRAPHS");
	t->use_graphs = env == NULL || strcmp(env, "0") != 0;
	/* FB_CUDA_GATE=0 lets each GPU launch as soon as its own capture is
	 * done (for diagnosis only: that is how the multi-GPU graph hang
	 * was reproduced). */
	env = getenv("FB_CUDA_GATE");
	t->gate_launch = env == NULL || strcmp(env, "0") != 0;
	if ((rc = parse_layers(t, m, shard)) != FB_OK) {
		t->ngpus = 0; /* nothing allocated yet */
		goto out;
	}
	t->rows_max = (max_batch + t->ngpus - 1) / t->ngpus;
	if ((t->order = malloc((size_t)shard->count * sizeof(uint32_t))) ==
	    NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < t->ngpus; i++) {
		t->rep[i].dev = devs[i];
		t->rep[i].rank = (int)i;
		if ((rc = replica_open(t, &t->rep[i], shard)) != FB_OK) {
			goto out;
		}
	}
	FB_CUDA_TRY(cudaSetDevice(devs[0]), rc, out);
	FB_CUDA_TRY(cudaHostAlloc((void **)&t->hidx,
	    (size_t)IDX_CAP * sizeof(uint32_t), cudaHostAllocPortable), rc,
	    out);
	FB_CUDA_TRY(cudaGetDeviceProperties(&prop, devs[0]), rc, out);
	snprintf(t->gpu_name, sizeof(t->gpu_name), "%s", prop.name);
	if (t->ngpus > 1) {
		/* Connect every peer at init rather than at a first call
		 * that may be under graph capture. Captured and uncaptured
		 * collectives are never outstanding together here (every job
		 * ends synchronized), so NCCL's graph-mixing support, which
		 * adds cross-graph event nodes to each captured step, is
		 * turned off. The user's values win; both are read by NCCL
		 * once per process. */
		setenv("NCCL_RUNTIME_CONNECT", "0", 0);
		setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 0);
		FB_NCCL_TRY(ncclCommInitAll(comms, (int)t->ngpus, devs), rc,
		    out);
		for (uint32_t i = 0; i < t->ngpus; i++) {
			t->rep[i].nccl = comms[i];
		}
	}
	fb_log_info("cuda: %u x %s (%s), %llu params, batch <= %u, "
	    "%u all-reduce bucket(s), graphs %s", t->ngpus, t->gpu_name,
	    fb_cuda_math_names[t->math], (unsigned long long)t->p, max_batch,
	    t->nbuckets, t->use_graphs ? "on" : "off");
	*state = t;
	t = NULL;
out:
	fb_cuda_close(t);
	return rc;
}
