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
 * A third backend, "process", hands local training to a program of the
 * user's (train.command, e.g. a PyTorch script under torchrun): the worker
 * starts and watches it, and they talk over a private Unix socket while the
 * parameters travel through shared memory (worker/proc/). Keys, masks and
 * the update's protection stay in the worker.
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
	bool evaluate_only; /* trainer processes: only the evaluation (the
	                     * run's final one); no training, no parameters
	                     * back. Native backends are not asked. */
} fb_train_opts;

/*
 * The federated evaluation of the round's global model on the box's own
 * validation data, made before training. Trainer processes report it (the
 * script evaluates); for the native backends the worker evaluates
 * data.valid itself.
 */
#define FB_TRAIN_METRICS_MAX 8  /* = FB_WIRE_METRICS_MAX */
#define FB_TRAIN_METRIC_NAME 32 /* bytes incl. NUL, = FB_WIRE_METRIC_NAME */

typedef struct fb_train_eval {
	uint64_t examples; /* validation examples; 0: no evaluation */
	double loss;       /* their mean loss (regression: squared error) */
	double accuracy;   /* their accuracy in [0, 1]; NaN: none */
	uint32_t metric_count; /* <= FB_TRAIN_METRICS_MAX */
	char name[FB_TRAIN_METRICS_MAX][FB_TRAIN_METRIC_NAME];
	double value[FB_TRAIN_METRICS_MAX]; /* finite */
} fb_train_eval;

typedef struct fb_train_stats {
	uint64_t steps;   /* steps done */
	uint64_t samples; /* examples processed */
	double loss_mean; /* mean training loss over the steps */
	double seconds;   /* wall time of the steps */
	/* Trainer processes report these two; native backends leave 0. */
	uint64_t examples; /* training examples the box holds: the update's
	                    * FedAvg weight as the trainer counts it */
	double a_norm;     /* FedNova's ||a||_1 of the trainer's optimizer;
	                    * 0: not reported (SGD with momentum assumed) */
	fb_train_eval eval; /* trainer processes: the global model's
	                     * evaluation; native backends leave it 0 */
} fb_train_stats;

/*
 * A trainer process: the program train.command names, started by the
 * worker (worker/proc/). Strings are copied by fb_trainer_open.
 */
typedef struct fb_trainer_proc_config {
	const char *const *argv;  /* command and its arguments; argc >= 1 */
	uint32_t argc;
	const char *const *env;   /* NAME=VALUE added to its environment */
	uint32_t env_count;
	const char *workdir;      /* its working folder; NULL or "": ours */
	int64_t start_timeout_ms; /* > 0: start to authenticated connection */
	int64_t task_timeout_ms;  /* > 0: a task unanswered this long is a
	                           * hang: the trainer is killed */
	bool share_shard;         /* lend it the worker's shard, read-only */
	uint32_t copy_threads;    /* threads of the parameters' copies; 0:
	                           * auto (half the CPUs, at most 8, one per
	                           * 32 MiB) */
} fb_trainer_proc_config;

typedef struct fb_trainer_config {
	int device;          /* fb_trainer_device */
	int gpus[16];        /* cuda: device ids; gpu_count == 0 means all */
	uint32_t gpu_count;
	int math;            /* fb_trainer_math: fp32, tf32, bf16 (cuda) */
	double throttle;     /* >= 1: simulated slowdown factor (1 = none) */
	/* A trainer process instead of cpu/cuda; NULL: the native backends. */
	const fb_trainer_proc_config *proc;
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

/* A backend: cpu and process are built in, cuda comes from a .so. */
typedef struct fb_trainer_backend {
	const char *name; /* "cpu", "cuda", "process" */
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
	/* get_params copies the local parameters to host memory. The process
	 * backend checks them as it copies: a NaN or infinity is FB_ERANGE,
	 * a failed local training like an error from train. */
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
 * fb_trainer_open picks the backend: a trainer process when cfg->proc (or
 * the process default) names a command, else per cfg->device (auto: cuda
 * when the CUDA backend library loads and reports at least one device,
 * else cpu, logging which and why), and prepares it for `shard`. The
 * trainer borrows `m` and `shard`; both must outlive it. A trainer process
 * is started here without waiting for it (train waits). Errors: FB_EINVAL,
 * FB_ENOMEM, FB_ENOTSUP (cuda requested but unavailable; logged with the
 * reason), FB_ECUDA/FB_ENCCL, FB_EIO (a trainer process cannot start).
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

/*
 * The trainer-process backend (worker/proc/trainer_proc.c). Its open reads
 * cfg->proc, which must be non-NULL. Its train sends the task and waits for
 * the trainer's answer, checking *cancel, the trainer's exit and
 * task_timeout_ms; a crash, a hang, or an answer with the wrong layout,
 * size or values fails (FB_EIO, FB_ETIMEDOUT, FB_EPROTO, FB_ERANGE; logged
 * with the detail) and the next set_params starts a fresh trainer.
 */
extern const fb_trainer_backend fb_trainer_proc_backend;

/*
 * fb_trainer_proc_find resolves a trainer's program as execvp would: a name
 * without a slash through PATH, one with a slash relative to `workdir`
 * (NULL or "": ours). *out is its path (caller frees with free()). Errors:
 * FB_EINVAL (not found or not an executable file; logged, naming
 * train.command), FB_ENOMEM. Reads the file system; thread-safe.
 */
FB_MUST_CHECK fb_err fb_trainer_proc_find(const char *argv0,
    const char *workdir, char **out);

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
