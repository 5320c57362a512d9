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
 * global batch is split evenly across GPUs; each scales its gradient by 1/global_batch so that the NCCL all-reduced SUM is
 * the gradient of the mean loss. For models above 2 x BUCKET_BYTES, the
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

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
/* nccl.h declares some functions as f() (not prototypes). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "common/err.h"
#include "common/log.h"
#include "model/model.h"
#include "worker/cuda/cuda.h"
#include "worker/cuda/cuda_impl.h"
#include "worker/cuda/mask_impl.h"
#include "worker/trainer.h"

/* The built-in ops tables (model/model_impl.h, exported by the host
 * program): the CUDA kernels implement exactly these two functions, so a
 * plug-in that merely calls itself "mlp" is not run here. */
extern const fb_model_ops fb_model_mlp_ops;
extern const fb_model_ops fb_model_logreg_ops;

#define MAX_GPUS 16
#define MAX_LAYERS (FB_MODEL_MAX_HIDDEN + 1)
#define IDX_CAP (1u << 21)        /* batch indices held per GPU */
#define CHUNK_MAX 4096u           /* steps per chunk */
#define CHUNK_SECONDS 0.2         /* target wall time of a chunk */
#define BUCKET_BYTES (16u << 20)  /* all-reduce bucket, overlap mode */
#define BLAS_WS_LEN (32u << 20)   /* cuBLAS workspace (graph capture) */
#define PAD 64u                   /* floats; keeps 16-byte alignment */
#define STAMPS (2 * MAX_LAYERS)   /* profiling: timestamps per step */

typedef struct layer {
	uint32_t in;
	uint32_t out;
	uint64_t w_off; /* floats into the parameter vector: [out, in] */
	uint64_t b_off; /* [out] */
} layer;

/* A bucket is all-reduced right after the backward of `last_layer`. */
typedef struct bucket {
	uint32_t last_layer;
	uint64_t off;   /* floats into the gradient */
	uint64_t count; /* floats */
} bucket;

typedef struct replica {
	int dev; /* O5: every buffer and handle below belongs to this device */
	int rank;
	cudaStream_t stream;   /* compute */
	cudaStream_t comm;     /* gradient all-reduce */
	cublasHandle_t blas;
	ncclComm_t nccl;       /* NULL with one GPU */
	float *buf;            /* params | grads | momentum */
	float *anchor;         /* FedProx: params at the first train() after
	                        * set_params (p_pad floats; on first use) */
	float *x;              /* shard features, count x dim */
	fb_label *y;           /* shard labels */
	uint32_t *idx;         /* IDX_CAP batch indices of the chunk */
	uint32_t *step;        /* step within the chunk (device counter) */
	float *losses;         /* CHUNK_MAX per-step partial losses */
	unsigned long long *sum; /* replica checksum */
	float *act;            /* activations, one allocation */
	float *a[MAX_LAYERS + 1]; /* a[0] = batch x, a[l+1] = layer l out */
	float *dbuf[2];        /* backward ping-pong, rows_max x width_max */
	float *dlogits;
	float *rowloss;
	float *ones;           /* rows_max ones (bias gradient by gemv) */
	fb_label *yb;          /* batch labels */
	void *blas_ws;
	cudaEvent_t ev_ready[MAX_LAYERS]; /* bucket gradients are ready */
	cudaEvent_t ev_comm_done;
	cudaGraphExec_t graph;
	int graph_ok;          /* graph matches the trainer's graph key */
	int warm;              /* an eager step ran (NCCL connected) */
	float *losses_host;    /* pinned, CHUNK_MAX */
	/* Profiling: %globaltimer before and after each bucket's all-reduce,
	 * CHUNK_MAX steps x STAMPS (ns), and its pinned copy. */
	unsigned long long *stamps;
	unsigned long long *stamps_host;
	uint32_t rows;         /* this GPU's slice of the batch */
	uint32_t row_off;
} replica;

typedef struct cuda_trainer {
	const fb_model *model;
	const fb_dataset *shard;
	uint64_t p;      /* param_count */
	uint64_t p_pad;  /* p rounded up to PAD */
	fb_task task;
	uint32_t nlayers;
	layer layers[MAX_LAYERS];
	uint32_t nbuckets;
	bucket buckets[MAX_LAYERS];
	uint32_t max_batch;
	uint32_t rows_max;  /* ceil(max_batch / GPUs) */
	uint32_t width_max; /* widest layer input */
	int math;
	cublasComputeType_t compute;
	int use_graphs;
	int gate_launch;      /* FB_CUDA_GATE: all capture before any launch */
	int profile;
	uint32_t chunk_fixed; /* FB_CUDA_CHUNK_STEPS; 0 = adaptive */
	uint32_t ngpus;
	replica rep[MAX_GPUS];
	char gpu_name[256];
	uint32_t *hidx;  /* pinned, IDX_CAP */
	uint32_t *order; /* shard->count, epoch permutation */
	/* Profiling sums (fb_cuda_profile), over profiled steps. */
	uint64_t prof_steps;
	uint64_t prof_calls;   /* all-reduce calls per GPU */
	uint64_t prof_bytes;   /* bytes all-reduced per GPU */
	double prof_ms_mean;   /* all-reduce time, mean over GPUs */
	double prof_ms_last;   /* ... of the GPU that waited least */
	/* The captured step depends on these. */
	uint32_t key_batch;
	float key_lr;
	float key_mu;
	float key_wd;
	float key_prox;
	int anchor_valid;  /* rep[].anchor holds the last set params */
	fb_cuda_mask *mask; /* SecAgg masks on rep[0]'s GPU; at first use */
	pthread_mutex_t mask_mu; /* one mask_apply at a time; guards mask */
} cuda_trainer;

typedef struct step_args {
	uint32_t batch; /* global */
	float lr;
	float mu;
	float wd;
	float prox;     /* FedProx mu; 0 = off */
	int update;     /* 0: gradient only (no SGD, no step counter) */
} step_args;

enum { JOB_CHUNK, JOB_GRAD, JOB_BARE };

/*
 * A gate is a barrier for the job threads of one run_jobs that can be
 * broken: a thread that fails before its NCCL work breaks it, and the
 * others then return instead of launching collectives that would wait
 * forever for the failed GPU.
 */
typedef struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t parties;
	uint32_t arrived;
	uint32_t generation;
	int broken;
} gate;

typedef struct job {
	cuda_trainer *t;
	replica *r;
	gate *gate;
	int kind;
	step_args a;
	uint32_t steps;       /* chunk: steps to run */
	int reset_momentum;   /* chunk: first of a train() call */
	uint64_t count;       /* bare: floats */
	uint32_t iters;       /* bare */
	double ms;            /* bare: mean ms a call */
	int aborted;          /* left at a broken gate (another job failed) */
	fb_err rc;
} job;

static const char *const math_names[] = {"fp32", "tf32", "bf16"};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static fb_err
gemm(const cuda_trainer *t, replica *r, cublasOperation_t ta,
    cublasOperation_t tb, uint32_t m, uint32_t n, uint32_t k, const float *A,
    uint32_t lda, const float *B, uint32_t ldb, float *C, uint32_t ldc)
{
	fb_err rc = FB_OK;
	const float one = 1.0f;
	const float zero = 0.0f;

	FB_CUBLAS_TRY(cublasGemmEx(r->blas, ta, tb, (int)m, (int)n, (int)k,
	    &one, A, CUDA_R_32F, (int)lda, B, CUDA_R_32F, (int)ldb, &zero, C,
	    CUDA_R_32F, (int)ldc, t->compute, CUBLAS_GEMM_DEFAULT), rc, out);
out:
	return rc;
}

/*
 * bucket_allreduce enqueues the all-reduce of bucket `b` on stream `s`,
 * with a timestamp on each side while profiling a training step.
 */
static fb_err
bucket_allreduce(cuda_trainer *t, replica *r, uint32_t b,
    const uint32_t *stepp, cudaStream_t s)
{
	fb_err rc = FB_OK;
	const bucket *bk = &t->buckets[b];
	float *g = r->buf + t->p_pad + bk->off;
	int stamp = t->profile && stepp != NULL;

	if (stamp) {
		FB_CUDA_TRY(fb_cuda_stamp(r->stamps, stepp, 2 * b, STAMPS, s),
		    rc, out);
	}
	FB_NCCL_TRY(ncclAllReduce(g, g, bk->count, ncclFloat, ncclSum,
	    r->nccl, s), rc, out);
	if (stamp) {
		FB_CUDA_TRY(fb_cuda_stamp(r->stamps, stepp, 2 * b + 1, STAMPS,
		    s), rc, out);
	}
out:
	return rc;
}

/*
 * replica_step enqueues one step on r->stream (also under graph capture):
 * gather, forward, loss, backward with bucketed all-reduce, and with
 * a->update the SGD update and the step counter. Row-major activations
 * [rows, width] are column-major [width, rows] to cuBLAS, so Y = X W^T is
 * gemm(T, N) with W as stored; see the comments at each call.
 */
static fb_err
replica_step(cuda_trainer *t, replica *r, const step_args *a)
{
	fb_err rc = FB_OK;
	uint32_t L = t->nlayers;
	uint32_t rows = r->rows;
	uint32_t *stepp = a->update ? r->step : NULL;
	float *w = r->buf;
	float *g = r->buf + t->p_pad;
	float *v = r->buf + 2 * t->p_pad;
	float scale = 1.0f / (float)a->batch;
	const float one = 1.0f;
	const float zero = 0.0f;
	const float *dz;
	uint32_t nb = 0;

	FB_CUDA_TRY(fb_cuda_gather(r->x, (const uint32_t *)r->y, r->idx,
	    stepp, a->batch, r->row_off, rows, t->layers[0].in, r->a[0],
	    (uint32_t *)r->yb, r->stream), rc, out);
	for (uint32_t l = 0; l < L; l++) {
		const layer *ly = &t->layers[l];
		/* a[l+1]^T [out, rows] = W [out, in] . a[l]^T [in, rows] */
		if ((rc = gemm(t, r, CUBLAS_OP_T, CUBLAS_OP_N, ly->out, rows,
		    ly->in, w + ly->w_off, ly->in, r->a[l], ly->in, r->a[l + 1],
		    ly->out)) != FB_OK) {
			goto out;
		}
		FB_CUDA_TRY(fb_cuda_bias_act(r->a[l + 1], w + ly->b_off, rows,
		    ly->out, l + 1 < L, r->stream), rc, out);
	}
	if (t->task == FB_TASK_REGRESSION) {
		FB_CUDA_TRY(fb_cuda_squared_error(r->a[L], &r->yb[0].value,
		    rows, scale, r->dlogits, r->rowloss, r->stream), rc, out);
	} else {
		FB_CUDA_TRY(fb_cuda_softmax_xent(r->a[L], &r->yb[0].cls, rows,
		    t->layers[L - 1].out, scale, r->dlogits, r->rowloss,
		    r->stream), rc, out);
	}
	FB_CUDA_TRY(fb_cuda_loss_reduce(r->rowloss, rows, scale, stepp,
	    r->losses, r->stream), rc, out);

	dz = r->dlogits;
	for (uint32_t l = L; l-- > 0;) {
		const layer *ly = &t->layers[l];
		/* dW^T [in, out] = a[l]^T [in, rows] . dZ [rows, out] */
		if ((rc = gemm(t, r, CUBLAS_OP_N, CUBLAS_OP_T, ly->in, ly->out,
		    rows, r->a[l], ly->in, dz, ly->out, g + ly->w_off,
		    ly->in)) != FB_OK) {
			goto out;
		}
		/* db [out] = dZ^T [out, rows] . ones [rows] */
		FB_CUBLAS_TRY(cublasSgemv(r->blas, CUBLAS_OP_N, (int)ly->out,
		    (int)rows, &one, dz, (int)ly->out, r->ones, 1, &zero,
		    g + ly->b_off, 1), rc, out);
		if (t->ngpus > 1 && nb < t->nbuckets &&
		    t->buckets[nb].last_layer == l) {
			if (t->nbuckets == 1) {
				/* One all-reduce after the whole backward: on
				 * the compute stream itself, as a bare
				 * all-reduce runs (no cross-stream events). */
				rc = bucket_allreduce(t, r, nb, stepp,
				    r->stream);
			} else {
				FB_CUDA_TRY(cudaEventRecord(r->ev_ready[nb],
				    r->stream), rc, out);
				FB_CUDA_TRY(cudaStreamWaitEvent(r->comm,
				    r->ev_ready[nb], 0), rc, out);
				rc = bucket_allreduce(t, r, nb, stepp, r->comm);
			}
			if (rc != FB_OK) {
				goto out;
			}
			nb++;
		}
		if (l > 0) {
			float *dn = r->dbuf[l & 1];
			/* dA^T [in, rows] = W^T [in, out] . dZ^T [out, rows] */
			if ((rc = gemm(t, r, CUBLAS_OP_N, CUBLAS_OP_N, ly->in,
			    rows, ly->out, w + ly->w_off, ly->in, dz, ly->out,
			    dn, ly->in)) != FB_OK) {
				goto out;
			}
			FB_CUDA_TRY(fb_cuda_relu_bwd(dn, r->a[l],
			    (size_t)rows * ly->in, r->stream), rc, out);
			dz = dn;
		}
	}
	if (t->ngpus > 1 && t->nbuckets > 1) {
		FB_CUDA_TRY(cudaEventRecord(r->ev_comm_done, r->comm), rc, out);
		FB_CUDA_TRY(cudaStreamWaitEvent(r->stream, r->ev_comm_done, 0),
		    rc, out);
	}
	if (a->update) {
		FB_CUDA_TRY(fb_cuda_sgd(w, g, v, a->prox != 0.0f ? r->anchor :
		    NULL, t->p_pad, a->lr, a->mu, a->wd, a->prox,
		    r->step, r->stream), rc, out);
	}
out:
	return rc;
}

static fb_err
replica_capture(cuda_trainer *t, replica *r, const step_args *a)
{
	fb_err rc = FB_OK;
	cudaGraph_t graph = NULL;
	cudaError_t e;

	if (r->graph != NULL) {
		cudaGraphExecDestroy(r->graph);
		r->graph = NULL;
	}
	r->graph_ok = 0;
	FB_CUDA_TRY(cudaStreamBeginCapture(r->stream,
	    cudaStreamCaptureModeThreadLocal), rc, out);
	rc = replica_step(t, r, a);
	/* End the capture on every path, or the stream stays capturing. */
	e = cudaStreamEndCapture(r->stream, &graph);
	if (rc != FB_OK) {
		goto out;
	}
	FB_CUDA_TRY(e, rc, out);
	FB_CUDA_TRY(cudaGraphInstantiate(&r->graph, graph, 0), rc, out);
	/* Upload now, while no collective is in flight anywhere, rather
	 * than inside the first launch. */
	FB_CUDA_TRY(cudaGraphUpload(r->graph, r->stream), rc, out);
	r->graph_ok = 1;
out:
	if (graph != NULL) {
		cudaGraphDestroy(graph);
	}
	if (rc != FB_OK) {
		(void)cudaGetLastError(); /* do not leak into later calls */
	}
	return rc;
}

static void
gate_init(gate *g, uint32_t parties)
{
	memset(g, 0, sizeof(*g));
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->parties = parties;
}

static void
gate_fini(gate *g)
{
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
}

/* gate_wait returns 1 once all parties arrived, 0 if the gate broke. */
static int
gate_wait(gate *g)
{
	int ok;

	pthread_mutex_lock(&g->mu);
	if (g->broken) {
		ok = 0;
	} else if (++g->arrived == g->parties) {
		g->arrived = 0;
		g->generation++;
		pthread_cond_broadcast(&g->cv);
		ok = 1;
	} else {
		uint32_t gen = g->generation;
		while (gen == g->generation && !g->broken) {
			pthread_cond_wait(&g->cv, &g->mu);
		}
		ok = gen != g->generation;
	}
	pthread_mutex_unlock(&g->mu);
	return ok;
}

static void
gate_break(gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->broken = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/*
 * chunk_prepare: everything of a chunk before its first step: the batch
 * indices, the step counter, momentum, and (graphs) the eager warm-up step
 * and the capture. It ends idle (synchronized), so that no collective is
 * in flight while any GPU captures, instantiates or frees.
 */
static fb_err
chunk_prepare(job *j)
{
	cuda_trainer *t = j->t;
	replica *r = j->r;
	fb_err rc = FB_OK;

	FB_CUDA_TRY(cudaMemcpyAsync(r->idx, t->hidx,
	    (size_t)j->steps * j->a.batch * sizeof(uint32_t),
	    cudaMemcpyHostToDevice, r->stream), rc, out);
	FB_CUDA_TRY(cudaMemsetAsync(r->step, 0, sizeof(uint32_t), r->stream),
	    rc, out);
	if (j->reset_momentum) {
		FB_CUDA_TRY(cudaMemsetAsync(r->buf + 2 * t->p_pad, 0,
		    t->p_pad * sizeof(float), r->stream), rc, out);
	}
	if (t->use_graphs && !r->graph_ok) {
		/* An eager gradient-only step first, so that every lazy
		 * set-up (cuBLAS, NCCL) happens outside the capture; its
		 * results are overwritten by step 0. */
		if (!r->warm) {
			step_args w = j->a;
			w.update = 0;
			if ((rc = replica_step(t, r, &w)) != FB_OK) {
				goto out;
			}
			FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
			r->warm = 1;
		}
		if ((rc = replica_capture(t, r, &j->a)) != FB_OK) {
			goto out;
		}
	}
	FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
out:
	return rc;
}

static void *
job_main(void *arg)
{
	job *j = arg;
	cuda_trainer *t = j->t;
	replica *r = j->r;
	fb_err rc = FB_OK;
	float *g = r->buf + t->p_pad;
	cudaEvent_t e0 = NULL;
	cudaEvent_t e1 = NULL;

	/* Every job thread exists before any NCCL work starts. */
	if (!gate_wait(j->gate)) {
		j->aborted = 1;
		goto out;
	}
	FB_CUDA_TRY(cudaSetDevice(r->dev), rc, fail);
	switch (j->kind) {
	case JOB_CHUNK:
		rc = chunk_prepare(j);
		if (rc != FB_OK) {
			goto fail;
		}
		/*
		 * Capture, instantiation and the memory NCCL frees for
		 * replaced graphs are done on every GPU before any GPU
		 * launches a step: a collective waiting for a peer must
		 * never sit on one GPU while the peer's thread is inside a
		 * CUDA call that can wait for the device (the multi-GPU
		 * graph hang).
		 */
		if (t->gate_launch && !gate_wait(j->gate)) {
			j->aborted = 1;
			goto out;
		}
		for (uint32_t s = 0; s < j->steps; s++) {
			if (t->use_graphs) {
				FB_CUDA_TRY(cudaGraphLaunch(r->graph,
				    r->stream), rc, out);
			} else if ((rc = replica_step(t, r, &j->a)) != FB_OK) {
				goto out;
			}
		}
		FB_CUDA_TRY(cudaMemcpyAsync(r->losses_host, r->losses,
		    (size_t)j->steps * sizeof(float), cudaMemcpyDeviceToHost,
		    r->stream), rc, out);
		if (t->profile && t->ngpus > 1) {
			FB_CUDA_TRY(cudaMemcpyAsync(r->stamps_host, r->stamps,
			    (size_t)j->steps * STAMPS * sizeof(*r->stamps),
			    cudaMemcpyDeviceToHost, r->stream), rc, out);
		}
		break;
	case JOB_GRAD:
		FB_CUDA_TRY(cudaMemcpyAsync(r->idx, t->hidx,
		    (size_t)j->a.batch * sizeof(uint32_t),
		    cudaMemcpyHostToDevice, r->stream), rc, out);
		if ((rc = replica_step(t, r, &j->a)) != FB_OK) {
			goto out;
		}
		FB_CUDA_TRY(cudaMemcpyAsync(r->losses_host, r->losses,
		    sizeof(float), cudaMemcpyDeviceToHost, r->stream), rc, out);
		break;
	case JOB_BARE:
		FB_CUDA_TRY(cudaEventCreate(&e0), rc, out);
		FB_CUDA_TRY(cudaEventCreate(&e1), rc, out);
		for (uint32_t i = 0; i < 5 + j->iters; i++) {
			if (i == 5) {
				FB_CUDA_TRY(cudaEventRecord(e0, r->stream), rc,
				    out);
			}
			FB_NCCL_TRY(ncclAllReduce(g, g, j->count, ncclFloat,
			    ncclSum, r->nccl, r->stream), rc, out);
		}
		FB_CUDA_TRY(cudaEventRecord(e1, r->stream), rc, out);
		FB_CUDA_TRY(cudaEventSynchronize(e1), rc, out);
		{
			float ms = 0.0f;
			FB_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1), rc, out);
			j->ms = ms / (double)j->iters;
		}
		break;
	default:
		break;
	}
	FB_CUDA_TRY(cudaStreamSynchronize(r->stream), rc, out);
	goto out;
fail:
	/* Failed before launching anything: let the others stop too. */
	gate_break(j->gate);
out:
	if (e0 != NULL) {
		cudaEventDestroy(e0);
	}
	if (e1 != NULL) {
		cudaEventDestroy(e1);
	}
	j->rc = rc;
	return NULL;
}

/*
 * run_jobs runs jobs[0..ngpus) at once, one host thread per GPU (the last
 * on the calling thread), and returns the first error of a job that
 * failed (jobs that stopped at a broken gate report nothing of their own).
 */
static fb_err
run_jobs(cuda_trainer *t, job *jobs)
{
	fb_err rc = FB_OK;
	pthread_t th[MAX_GPUS];
	int started[MAX_GPUS] = {0};
	uint32_t n = t->ngpus;
	int aborted = 0;
	gate g;

	gate_init(&g, n);
	for (uint32_t i = 0; i < n; i++) {
		jobs[i].gate = &g;
	}
	for (uint32_t i = 0; i + 1 < n; i++) {
		if (pthread_create(&th[i], NULL, job_main, &jobs[i]) != 0) {
			/* Rare. No job has started NCCL work (they wait at
			 * the first gate): stop them all. */
			fb_log_error("cuda: pthread_create failed for GPU %d",
			    t->rep[i].dev);
			gate_break(&g);
			rc = FB_ENOMEM;
			break;
		}
		started[i] = 1;
	}
	if (rc == FB_OK) {
		job_main(&jobs[n - 1]);
	}
	for (uint32_t i = 0; i + 1 < n; i++) {
		if (started[i]) {
			pthread_join(th[i], NULL);
		}
	}
	gate_fini(&g);
	for (uint32_t i = 0; i < n && rc == FB_OK; i++) {
		if (jobs[i].rc != FB_OK) {
			rc = jobs[i].rc;
		}
		aborted |= jobs[i].aborted;
	}
	if (rc == FB_OK && aborted) {
		rc = FB_ECUDA; /* cannot happen: a breaker reports an error */
	}
	return rc;
}

/* After a profiled chunk of `n` steps: each step's all-reduce time (the
 * sum over buckets) on every GPU, from the device timestamps. */
static void
profile_collect(cuda_trainer *t, uint32_t n)
{
	uint64_t bytes = 0;

	if (!t->profile || t->ngpus < 2) {
		return;
	}
	for (uint32_t b = 0; b < t->nbuckets; b++) {
		bytes += t->buckets[b].count * sizeof(float);
	}
	for (uint32_t s = 0; s < n; s++) {
		double sum = 0.0;
		double least = 0.0;
		for (uint32_t i = 0; i < t->ngpus; i++) {
			const unsigned long long *st =
			    t->rep[i].stamps_host + (size_t)s * STAMPS;
			double ns = 0.0;
			for (uint32_t b = 0; b < t->nbuckets; b++) {
				ns += (double)(st[2 * b + 1] - st[2 * b]);
			}
			sum += ns;
			least = i == 0 || ns < least ? ns : least;
		}
		t->prof_ms_mean += sum / t->ngpus * 1e-6;
		t->prof_ms_last += least * 1e-6;
		t->prof_calls += t->nbuckets;
		t->prof_bytes += bytes;
		t->prof_steps++;
	}
}

/* Split `batch` rows as evenly as possible; the first GPUs take the extra
 * rows. Returns whether the split changed. */
static int
split_batch(cuda_trainer *t, uint32_t batch)
{
	uint32_t off = 0;
	int changed = 0;

	for (uint32_t i = 0; i < t->ngpus; i++) {
		replica *r = &t->rep[i];
		uint32_t rows = batch / t->ngpus + (i < batch % t->ngpus);
		changed |= r->rows != rows || r->row_off != off;
		r->rows = rows;
		r->row_off = off;
		off += rows;
	}
	return changed;
}

static void
cuda_close(void *state)
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

static fb_err
cuda_open(const fb_model *m, const fb_dataset *shard,
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
	    math_names[t->math], (unsigned long long)t->p, max_batch,
	    t->nbuckets, t->use_graphs ? "on" : "off");
	*state = t;
	t = NULL;
out:
	cuda_close(t);
	return rc;
}

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
	double t0 = now_s();
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
	if (split_batch(t, B) || t->key_batch != B || t->key_lr != a.lr ||
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
		c0 = now_s();
		if ((rc = run_jobs(t, jobs)) != FB_OK) {
			break;
		}
		profile_collect(t, n);
		for (uint32_t s = 0; s < n; s++) {
			double l = 0.0;
			for (uint32_t i = 0; i < t->ngpus; i++) {
				l += t->rep[i].losses_host[s];
			}
			loss_total += l;
		}
		done += n;
		if (t->chunk_fixed == 0) {
			double per = (now_s() - c0) / n;
			double want = per > 0.0 ? CHUNK_SECONDS / per : 1e9;
			chunk = want < 1.0 ? 1 : want > CHUNK_MAX ? CHUNK_MAX :
			    (uint32_t)want;
		}
	}
	st->steps = done;
	st->samples = done * B;
	st->loss_mean = done > 0 ? loss_total / (double)done : 0.0;
	st->seconds = now_s() - t0;
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
	    math_names[t->math]);
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
	.open = cuda_open,
	.close = cuda_close,
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
	if (split_batch(t, batch)) {
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
	if ((rc = run_jobs(t, jobs)) != FB_OK) {
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
	if ((rc = run_jobs(t, jobs)) != FB_OK) {
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
