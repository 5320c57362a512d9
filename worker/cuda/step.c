/* SPDX-License-Identifier: Apache-2.0 */
/*
 * step.c -- the CUDA trainer's steps: one step of a replica (forward,
 * backward, the bucketed all-reduce, the SGD update), its capture into a
 * CUDA Graph, and the job threads that run a chunk of steps on every GPU
 * at once, meeting at a breakable gate (backend.c has the design).
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

double
fb_cuda_now(void)
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
 * fb_cuda_run_jobs runs jobs[0..ngpus) at once, one host thread per GPU (the last
 * on the calling thread), and returns the first error of a job that
 * failed (jobs that stopped at a broken gate report nothing of their own).
 */
fb_err
fb_cuda_run_jobs(cuda_trainer *t, job *jobs)
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
void
fb_cuda_profile_collect(cuda_trainer *t, uint32_t n)
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
int
fb_cuda_split_batch(cuda_trainer *t, uint32_t batch)
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
