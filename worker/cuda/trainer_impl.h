/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trainer_impl.h -- private to the CUDA backend's three files: the
 * trainer's state (one replica per GPU), the job threads that run chunks
 * of steps on every GPU at once (step.c), the trainer's opening and
 * closing (open.c); backend.c holds the backend's table and the rest. See
 * backend.c for the design.
 */
#ifndef FB_WORKER_CUDA_TRAINER_IMPL_H
#define FB_WORKER_CUDA_TRAINER_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
/* nccl.h declares some functions as f() (not prototypes). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "common/err.h"
#include "model/model.h"
#include "worker/cuda/cuda.h"
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
 * A gate is a barrier for the job threads of one fb_cuda_run_jobs that can be
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


/* Names of t->math (FB_CUDA_MATH_*), for the log and describe(). */
extern const char *const fb_cuda_math_names[3];

/* Seconds on the monotonic clock. */
double fb_cuda_now(void);

/*
 * Run jobs[0..t->ngpus) at once, one host thread per GPU (the last on the
 * calling thread), and wait for all. Returns the first error of a job
 * that failed (jobs that stopped at a broken gate report nothing of their
 * own), FB_OK when every job succeeded.
 */
fb_err fb_cuda_run_jobs(cuda_trainer *t, job *jobs);

/* After a profiled chunk of n steps: add each step's all-reduce time (the
 * sum over buckets, from the device timestamps) to t's profile sums. */
void fb_cuda_profile_collect(cuda_trainer *t, uint32_t n);

/* Split a global batch of `batch` rows over the GPUs as evenly as
 * possible (each replica's rows and row_off; the first GPUs take the
 * extra rows). Returns whether the split changed. */
int fb_cuda_split_batch(cuda_trainer *t, uint32_t batch);

/* The backend's open and close (the table of fb_trainer_cuda_backend_v1,
 * trainer.h): open uploads the shard to every GPU and makes one replica
 * each; close frees all of it (NULL is a no-op). */
fb_err fb_cuda_open(const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, uint32_t max_batch, void **state);
void fb_cuda_close(void *state);

#endif
