/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trainer.h -- local training on a worker's shard, behind backends.
 *
 * The trainer owns the working copy of the parameters, the gradient and the
 * optimizer state, and runs minibatch SGD (optional momentum, weight decay)
 * for a given number of steps. Backends: "cpu" (built in) and "cuda"
 * (build/libfedbox-cuda.so, loaded at run time so that the same worker
 * binary runs on machines without CUDA). Both compute the same function.
 *
 * Batch order is a pure function of (seed, round, worker index): each epoch
 * is a fresh permutation of the shard; a step takes the next `batch`
 * examples, wrapping into the next epoch. Same seed and config on the CPU
 * backend give bitwise-identical parameters.
 */
#ifndef FB_WORKER_TRAINER_H
#define FB_WORKER_TRAINER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"

typedef struct fb_train_opts {
	uint64_t steps;     /* local SGD steps this round, >= 1 */
	uint32_t batch;     /* examples per step for the whole box, >= 1 */
	float lr;           /* > 0 */
	float momentum;     /* [0, 1); 0 = plain SGD; state reset each round */
	float weight_decay; /* >= 0, L2 added to the gradient */
	float prox_mu;      /* >= 0: FedProx, mu * (w - w_start) added to the
	                     * gradient (w_start = the params set last) */
	uint64_t seed;      /* batch-order seed (federation seed) */
	uint32_t round;     /* mixes into the batch order */
	uint32_t worker_index;
} fb_train_opts;

typedef struct fb_train_stats {
	uint64_t steps;   /* steps done */
	uint64_t samples; /* examples processed */
	double loss_mean; /* mean training loss over the steps */
	double seconds;   /* wall time of the steps */
} fb_train_stats;

typedef struct fb_trainer_config {
	int device;          /* fb_trainer_device */
	int gpus[16];        /* cuda: device ids; gpu_count == 0 means all */
	uint32_t gpu_count;
	int math;            /* fb_trainer_math: fp32, tf32, bf16 (cuda) */
	double throttle;     /* >= 1: simulated slowdown factor (1 = none) */
} fb_trainer_config;

typedef enum fb_trainer_device {
	FB_DEVICE_AUTO = 0,
	FB_DEVICE_CPU,
	FB_DEVICE_CUDA,
} fb_trainer_device;

typedef enum fb_trainer_math {
	FB_MATH_FP32 = 0,
	FB_MATH_TF32,
	FB_MATH_BF16,
} fb_trainer_math;

/* A backend: the cpu one is built in, the cuda one comes from a .so. */
typedef struct fb_trainer_backend {
	const char *name; /* "cpu", "cuda" */
	fb_err (*open)(const fb_model *m, const fb_dataset *shard,
	    const fb_trainer_config *cfg, uint32_t max_batch, void **state);
	void (*close)(void *state);
	/* set_params copies the global model (host, param_count floats). */
	fb_err (*set_params)(void *state, const float *params);
	/* train runs opts->steps steps; it stops early, returning
	 * FB_ECLOSED, when *cancel (may be NULL; set by another thread)
	 * becomes non-zero. */
	fb_err (*train)(void *state, const fb_train_opts *opts,
	    fb_train_stats *stats, const atomic_int *cancel);
	/* get_params copies the local parameters to host memory. */
	fb_err (*get_params)(void *state, float *params);
	/* describe writes e.g. "cuda: 2 x NVIDIA H200 (fp32)". */
	void (*describe)(void *state, char *buf, size_t len);
	/* mask_apply (optional: NULL when the backend has no device of its
	 * own; the cpu backend) is fb_mask_apply computed on the backend's
	 * first device: the same result bit for bit, the same checks in the
	 * same order (FB_ERANGE, then FB_EINVAL; v untouched on those), plus
	 * FB_ECUDA (logged), after which v[0..count) may hold some elements
	 * masked and others not: make them again. The keystream never
	 * reaches host memory; the seeds are wiped from the device and host
	 * copies before it returns. Blocks until v is written. Thread-safe:
	 * calls on one state from several threads take the device in turn;
	 * it may run while train() runs on another thread. */
	fb_err (*mask_apply)(void *state, uint32_t *v, uint64_t offset,
	    uint64_t count, const fb_mask_term *terms, uint32_t nterms,
	    uint32_t round);
} fb_trainer_backend;

typedef struct fb_trainer fb_trainer;

/*
 * fb_trainer_open picks the backend per cfg->device (auto: cuda when the
 * CUDA backend library loads and reports at least one device, else cpu,
 * logging which and why) and prepares it for `shard`. The trainer borrows
 * `m` and `shard`; both must outlive it. Errors: FB_EINVAL, FB_ENOMEM,
 * FB_ENOTSUP (cuda requested but unavailable; logged with the reason),
 * FB_ECUDA/FB_ENCCL.
 */
FB_MUST_CHECK fb_err fb_trainer_open(const fb_model *m,
    const fb_dataset *shard, const fb_trainer_config *cfg, uint32_t max_batch,
    fb_trainer **out);
void fb_trainer_close(fb_trainer *t);
FB_MUST_CHECK fb_err fb_trainer_set_params(fb_trainer *t, const float *params);
FB_MUST_CHECK fb_err fb_trainer_train(fb_trainer *t, const fb_train_opts *opts,
    fb_train_stats *stats, const atomic_int *cancel);
FB_MUST_CHECK fb_err fb_trainer_get_params(fb_trainer *t, float *params);
const char *fb_trainer_backend_name(const fb_trainer *t);
void fb_trainer_describe(const fb_trainer *t, char *buf, size_t len);
/*
 * fb_trainer_mask_apply is fb_mask_apply (crypto.h) on the backend's device
 * through its mask_apply op (contract above: same result bit for bit,
 * thread-safe). FB_ENOTSUP, v untouched, when the backend has none (cpu):
 * the caller masks on the host. fb_trainer_has_mask says which it is.
 */
FB_MUST_CHECK fb_err fb_trainer_mask_apply(fb_trainer *t, uint32_t *v,
    uint64_t offset, uint64_t count, const fb_mask_term *terms,
    uint32_t nterms, uint32_t round);
bool fb_trainer_has_mask(const fb_trainer *t);

/* The built-in CPU backend (also used directly by tests). */
extern const fb_trainer_backend fb_trainer_cpu_backend;

/* Symbol the CUDA backend library exports:
 * const fb_trainer_backend *fb_trainer_cuda_backend_v1(void); */
#define FB_TRAINER_CUDA_SYMBOL "fb_trainer_cuda_backend_v1"
#define FB_TRAINER_CUDA_LIBRARY "libfedbox-cuda.so"

/*
 * fb_train_batch_order fills `order` (shard_count entries) with the
 * permutation of epoch `epoch` for (seed, round, worker_index). Shared by
 * the backends so that they consume examples in the same order.
 */
void fb_train_batch_order(uint64_t seed, uint32_t round, uint32_t worker_index,
    uint64_t epoch, uint32_t *order, uint32_t shard_count);

#endif
