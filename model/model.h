/* SPDX-License-Identifier: Apache-2.0 */
/*
 * model.h -- the model ABI, the built-in models, and model files.
 *
 * A model is described by an ops table (fb_model_ops). The runtime owns the
 * parameters as one flat float32 vector; the model says how long it is, how
 * it splits into named tensors (PyTorch names and shapes, e.g. fc1.weight as
 * [out, in]), how to initialise it, and how to compute the mean loss and its
 * gradient on a batch, and evaluate a batch. A model has a task: classification
 * (int32 class labels, softmax cross-entropy over `classes` logits) or
 * regression (one float target per example, one output, mean squared error).
 * Built-ins: "mlp" (hidden layers with ReLU), "logreg" (no hidden layer:
 * softmax regression, or linear regression for the regression task), both
 * for either task, "synthetic" (a flat vector for benchmarks; it cannot
 * train), and "init": a model known only by its layout and initial values,
 * read from a safetensors file (e.g. `python -m fedbox init` wrote it); it
 * has no code, so it cannot train or evaluate here: trainer processes do.
 * A user model is a shared library exporting FB_MODEL_PLUGIN_SYMBOL,
 * returning its ops.
 *
 * This header is the ABI for plug-ins: it depends only on common/err.h and
 * the C standard library.
 */
#ifndef FB_MODEL_MODEL_H
#define FB_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Version 2: labels are fb_label (int32 classes or float targets), and the
 * spec carries a task. A version-1 plug-in is refused by its abi_version. */
#define FB_MODEL_ABI_VERSION 2
#define FB_MODEL_PLUGIN_SYMBOL "fb_model_plugin_v1"
#define FB_MODEL_MAX_HIDDEN 16
#define FB_TENSOR_NAME_MAX 64

/* fb_task says what a model's outputs are and which loss trains them. */
typedef enum fb_task {
	FB_TASK_CLASSIFICATION = 0, /* `classes` logits, softmax xent */
	FB_TASK_REGRESSION = 1,     /* one output, mean squared error */
} fb_task;

/*
 * fb_label is one example's target. The model's task says which member
 * holds it: `cls` for classification (0 .. classes - 1), `value` for
 * regression (a finite float). Four bytes either way, so the runtime
 * gathers batches of labels without knowing the task.
 */
typedef union fb_label {
	int32_t cls;
	float value;
} fb_label;

typedef struct fb_model_spec {
	char arch[32];          /* "mlp", "logreg", "synthetic", "plugin",
	                         * "init" */
	uint32_t input_dim;     /* features per example, e.g. 784 */
	uint32_t classes;       /* classification: classes >= 2, e.g. 10;
	                         * regression: outputs, exactly 1 */
	uint32_t task;          /* fb_task */
	uint32_t hidden[FB_MODEL_MAX_HIDDEN]; /* mlp hidden widths */
	uint32_t hidden_count;  /* mlp: >= 1 */
	uint64_t synthetic_params; /* synthetic: vector length >= 1 */
	char plugin[256];       /* plugin: path of the shared library */
	char init[256];         /* init: path of the safetensors file (last,
	                         * so older plug-ins read the same fields) */
} fb_model_spec;

typedef struct fb_tensor_info {
	char name[FB_TENSOR_NAME_MAX]; /* e.g. "fc1.weight" */
	uint32_t ndim;                 /* 1..4 */
	uint64_t shape[4];
	uint64_t offset; /* first element in the flat parameter vector */
	uint64_t count;  /* product of shape */
} fb_tensor_info;

struct fb_model_cuda_ops; /* device entry points; see model/cuda (optional) */

typedef struct fb_model_ops {
	uint32_t abi_version; /* FB_MODEL_ABI_VERSION */
	const char *name;
	/* create parses `spec` into a model instance (immutable afterwards,
	 * so one instance serves several threads with their own workspace). */
	fb_err (*create)(const fb_model_spec *spec, void **state);
	void (*destroy)(void *state);
	uint64_t (*param_count)(const void *state);
	uint32_t (*tensor_count)(const void *state);
	void (*tensor_info)(const void *state, uint32_t i, fb_tensor_info *out);
	/* init writes initial parameters derived only from `seed`. */
	void (*init)(const void *state, float *params, uint64_t seed);
	/* workspace_len: bytes of scratch forward_backward/evaluate need for
	 * batches up to max_batch. */
	size_t (*workspace_len)(const void *state, uint32_t max_batch);
	/* forward_backward: grad (param_count floats, overwritten) = gradient
	 * of the mean loss over the batch; *loss = that mean loss. `y` holds
	 * `batch` labels of the spec's task; one out of range (or a
	 * non-finite target) is FB_EINVAL. NULL for models that cannot train
	 * (FB_ENOTSUP is reported by the runtime). */
	fb_err (*forward_backward)(const void *state, const float *params,
	    const float *x, const fb_label *y, uint32_t batch, float *grad,
	    float *loss, void *ws);
	/* evaluate adds the batch's summed loss (regression: summed squared
	 * error) to *loss_sum and, for classification, its correct
	 * predictions to *correct. NULL when the model cannot evaluate. */
	fb_err (*evaluate)(const void *state, const float *params,
	    const float *x, const fb_label *y, uint32_t batch, double *loss_sum,
	    uint64_t *correct, void *ws);
	/* cuda: device entry points, or NULL for a CPU-only model. */
	const struct fb_model_cuda_ops *cuda;
} fb_model_ops;

/* A plug-in exports: const fb_model_ops *fb_model_plugin_v1(void); (the
 * symbol keeps its name across ABI versions so that an old plug-in is
 * refused with its version, not as a library without the entry point). */
typedef const fb_model_ops *(*fb_model_plugin_fn)(void);

/* ---- runtime side (not needed by plug-ins) ---- */

typedef struct fb_model fb_model; /* an ops table bound to an instance */

/*
 * fb_model_open creates the model `spec` names (a built-in, or a plug-in
 * loaded with dlopen from spec->plugin). Errors: FB_EINVAL (unknown arch,
 * bad shape; logged), FB_EIO (plug-in cannot be loaded), FB_ENOTSUP (ABI
 * version mismatch), FB_ENOMEM. The caller owns *out on FB_OK.
 */
FB_MUST_CHECK fb_err fb_model_open(const fb_model_spec *spec, fb_model **out);
/* fb_model_close frees the model; NULL is a no-op. */
void fb_model_close(fb_model *m);

const fb_model_ops *fb_model_get_ops(const fb_model *m);
const void *fb_model_state(const fb_model *m);
uint64_t fb_model_param_count(const fb_model *m);
/* fb_model_input_dim and fb_model_classes return the spec's input_dim and
 * classes (what x rows and labels must match; 0 for "synthetic"). */
uint32_t fb_model_input_dim(const fb_model *m);
uint32_t fb_model_classes(const fb_model *m);
/* fb_model_task returns the spec's task (classification for "synthetic"). */
fb_task fb_model_task(const fb_model *m);
uint32_t fb_model_tensor_count(const fb_model *m);
void fb_model_tensor_info(const fb_model *m, uint32_t i, fb_tensor_info *out);
void fb_model_init_params(const fb_model *m, float *params, uint64_t seed);
/* fb_model_describe writes e.g. "mlp 784-128-10 (101770 params)". */
void fb_model_describe(const fb_model *m, char *buf, size_t len);

/*
 * fb_model_evaluate runs the model over `count` examples (x: count rows of
 * fb_model_input_dim floats; y: count labels of the model's task) in
 * batches and returns the mean loss and the accuracy. For regression the
 * mean loss is the mean squared error and *accuracy is NAN (there is none:
 * callers report the MSE instead). Errors: FB_ENOTSUP (the model cannot
 * evaluate), FB_EINVAL (a label out of range, logged), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_model_evaluate(const fb_model *m, const float *params,
    const float *x, const fb_label *y, uint32_t count, double *mean_loss,
    double *accuracy);

/*
 * fb_model_save_safetensors writes `params` as a safetensors file (one F32
 * tensor per fb_tensor_info, little-endian, with `__metadata__` holding the
 * `meta_count` key/value string pairs of `meta`), atomically: temp file,
 * fsync, rename. Errors: FB_EIO, FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_model_save_safetensors(const fb_model *m,
    const float *params, const char *path, const char *const (*meta)[2],
    size_t meta_count);

/*
 * fb_model_load_safetensors reads a file written for the same model layout
 * into `params` (param_count floats). Names, dtypes, shapes and offsets must
 * match; anything else is FB_EFORMAT with a log line saying what differs.
 * If `round` is non-NULL and the metadata holds "fedbox.round", it is
 * stored there (else 0).
 */
FB_MUST_CHECK fb_err fb_model_load_safetensors(const fb_model *m,
    const char *path, float *params, uint32_t *round);

/*
 * fb_model_layout_pack writes m's layout (names and shapes, in order; every
 * tensor float32) in its wire form into *out (fb_alloc'd, the caller frees
 * it with fb_free), *len bytes: about 10 + name length + 8 x rank bytes a
 * tensor. Errors: FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_model_layout_pack(const fb_model *m, uint8_t **out,
    size_t *len);

/*
 * fb_model_open_layout makes an "init" model from a layout in wire form
 * (from a peer: every field is checked, at most 65536 tensors, names
 * unique, and nothing is allocated beyond what `len` bytes can describe),
 * with spec's input_dim, classes and task. It has no initial values
 * (fb_model_init_params writes zeros). Errors: FB_EPROTO (malformed,
 * logged), FB_EINVAL, FB_ENOMEM. The caller owns *out on FB_OK.
 */
FB_MUST_CHECK fb_err fb_model_open_layout(const uint8_t *buf, size_t len,
    const fb_model_spec *spec, fb_model **out);

/*
 * fb_model_layout_diff compares the layouts of a and b (names, ranks,
 * shapes, in order) and returns whether they differ; if so `why` gets one
 * sentence naming the first tensor that differs, with its name and shape
 * on each side (or the first one only one side has), each side called by
 * a_name / b_name (e.g. "the coordinator's model"). Never fails.
 */
bool fb_model_layout_diff(const fb_model *a, const char *a_name,
    const fb_model *b, const char *b_name, char *why, size_t why_len);

#endif
