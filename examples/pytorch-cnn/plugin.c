/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plugin.c -- the pytorch-cnn example's model as the coordinator knows it:
 * its tensors (names, shapes, order, exactly as model.py's Net has them in
 * state_dict()) and their initial values, drawn like PyTorch's defaults
 * for Conv2d and Linear (uniform in +-1/sqrt(fan_in), weights and biases).
 * It cannot train or evaluate: the workers' trainer processes
 * (examples/pytorch-cnn/train.py) do the training, and
 * examples/pytorch-cnn/evaluate.py evaluates the exported model.
 *
 *   model: { arch: plugin, plugin: build/examples/pytorch-cnn.so }
 *
 * The workers load the same file (train.plugin) so that each checks its
 * trainer's tensors against it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct cnn_tensor {
	const char *name;
	uint32_t ndim;
	uint64_t shape[4];
	uint32_t fan_in; /* inputs per output: the init's bound */
} cnn_tensor;

static const cnn_tensor cnn_tensors[] = {
    {"conv1.weight", 4, {32, 1, 5, 5}, 1 * 5 * 5},
    {"conv1.bias", 1, {32}, 1 * 5 * 5},
    {"conv2.weight", 4, {64, 32, 5, 5}, 32 * 5 * 5},
    {"conv2.bias", 1, {64}, 32 * 5 * 5},
    {"fc1.weight", 2, {256, 3136}, 3136},
    {"fc1.bias", 1, {256}, 3136},
    {"fc2.weight", 2, {10, 256}, 256},
    {"fc2.bias", 1, {10}, 256},
};
#define CNN_TENSORS (sizeof(cnn_tensors) / sizeof(cnn_tensors[0]))

static uint64_t
cnn_count(uint32_t i)
{
	uint64_t n = 1;
	for (uint32_t d = 0; d < cnn_tensors[i].ndim; d++) {
		n *= cnn_tensors[i].shape[d];
	}
	return n;
}

static int cnn_instance;

static fb_err
cnn_create(const fb_model_spec *spec, void **state)
{
	*state = NULL;
	if (spec->input_dim != 784 || spec->classes != 10) {
		fprintf(stderr,
		    "pytorch-cnn: model.input_dim must be 784 and "
		    "model.classes 10 (got %u, %u)\n",
		    spec->input_dim, spec->classes);
		return FB_EINVAL;
	}
	*state = &cnn_instance; /* nothing to allocate: the table is all */
	return FB_OK;
}

static void
cnn_destroy(void *state)
{
	(void)state;
}

static uint64_t
cnn_param_count(const void *state)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < CNN_TENSORS; i++) {
		n += cnn_count(i);
	}
	return n;
}

static uint32_t
cnn_tensor_count(const void *state)
{
	return (uint32_t)CNN_TENSORS;
}

static void
cnn_tensor_info(const void *state, uint32_t i, fb_tensor_info *out)
{
	uint64_t off = 0;

	memset(out, 0, sizeof(*out));
	for (uint32_t j = 0; j < i; j++) {
		off += cnn_count(j);
	}
	snprintf(out->name, sizeof(out->name), "%s", cnn_tensors[i].name);
	out->ndim = cnn_tensors[i].ndim;
	memcpy(out->shape, cnn_tensors[i].shape, sizeof(out->shape));
	out->offset = off;
	out->count = cnn_count(i);
}

/* splitmix64, enough for initial weights. */
static uint64_t
cnn_rng(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static void
cnn_init(const void *state, float *params, uint64_t seed)
{
	uint64_t x = seed ^ 0x636e6eULL; /* "cnn" */
	uint64_t at = 0;

	for (uint32_t i = 0; i < CNN_TENSORS; i++) {
		double bound = 1.0 / sqrt((double)cnn_tensors[i].fan_in);
		for (uint64_t k = 0; k < cnn_count(i); k++) {
			double u = (double)(cnn_rng(&x) >> 11) * 0x1.0p-53;
			params[at++] = (float)((2.0 * u - 1.0) * bound);
		}
	}
}

static size_t
cnn_workspace_len(const void *state, uint32_t max_batch)
{
	return 0;
}

static const fb_model_ops cnn_ops = {
    .abi_version = FB_MODEL_ABI_VERSION,
    .name = "pytorch-cnn",
    .create = cnn_create,
    .destroy = cnn_destroy,
    .param_count = cnn_param_count,
    .tensor_count = cnn_tensor_count,
    .tensor_info = cnn_tensor_info,
    .init = cnn_init,
    .workspace_len = cnn_workspace_len,
    .forward_backward = NULL,
    .evaluate = NULL,
    .cuda = NULL,
};

const fb_model_ops *fb_model_plugin_v1(void);

const fb_model_ops *
fb_model_plugin_v1(void)
{
	return &cnn_ops;
}
