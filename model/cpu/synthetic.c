/* SPDX-License-Identifier: Apache-2.0 */
/*
 * synthetic.c -- the "synthetic" model: a flat vector of synthetic_params
 * floats named "weight", initialised to zeros. It exists so that benchmarks
 * and protocol tests can move models of any size; it cannot train or
 * evaluate (forward_backward and evaluate are NULL).
 */
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model_impl.h"

typedef struct synthetic_state {
	uint64_t count; /* 1 .. 2^40 - 1 */
} synthetic_state;

static fb_err
synthetic_create(const fb_model_spec *spec, void **state)
{
	synthetic_state *s;

	*state = NULL;
	if (spec->synthetic_params < 1 ||
	    spec->synthetic_params >= FB_MODEL_MAX_PARAMS) {
		fb_log_error("model synthetic: synthetic_params must be in "
		             "1..2^40-1 (got %llu)",
		    (unsigned long long)spec->synthetic_params);
		return FB_EINVAL;
	}
	if ((s = fb_calloc(1, sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	s->count = spec->synthetic_params;
	*state = s;
	return FB_OK;
}

static void
synthetic_destroy(void *state)
{
	fb_free(state);
}

static uint64_t
synthetic_param_count(const void *state)
{
	const synthetic_state *s = state;
	return s->count;
}

static uint32_t
synthetic_tensor_count(const void *state)
{
	return 1;
}

static void
synthetic_tensor_info(const void *state, uint32_t i, fb_tensor_info *out)
{
	const synthetic_state *s = state;

	FB_ASSERT(i == 0);
	memset(out, 0, sizeof(*out));
	strcpy(out->name, "weight");
	out->ndim = 1;
	out->shape[0] = s->count;
	out->offset = 0;
	out->count = s->count;
}

static void
synthetic_init(const void *state, float *params, uint64_t seed)
{
	const synthetic_state *s = state;

	memset(params, 0, (size_t)s->count * sizeof(float));
}

static size_t
synthetic_workspace_len(const void *state, uint32_t max_batch)
{
	return 0;
}

const fb_model_ops fb_model_synthetic_ops = {
    .abi_version = FB_MODEL_ABI_VERSION,
    .name = "synthetic",
    .create = synthetic_create,
    .destroy = synthetic_destroy,
    .param_count = synthetic_param_count,
    .tensor_count = synthetic_tensor_count,
    .tensor_info = synthetic_tensor_info,
    .init = synthetic_init,
    .workspace_len = synthetic_workspace_len,
    .forward_backward = NULL,
    .evaluate = NULL,
    .cuda = NULL,
};
