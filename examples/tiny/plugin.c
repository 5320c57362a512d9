/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plugin.c -- "tiny-tanh", an example of a user's own model as a plug-in.
 *
 * A two-layer network input_dim -> 32 -> classes with tanh between the
 * layers and softmax cross-entropy on the logits (hidden[0] overrides the
 * width when the spec gives one); a classifier only, so it refuses the
 * regression task. It is built as a shared library on its
 * own (build/examples/tiny.so) and talks to fedbox only through the ABI in
 * model/model.h: it links none of fedbox's libraries, so it carries its own
 * random generator and plain loops. Load it with
 *
 *   model: { arch: plugin, plugin: build/examples/tiny.so }
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define TINY_HIDDEN 32

typedef struct tiny_state {
	uint32_t in, hid, out;
	uint64_t w1, b1, w2, b2, params; /* flat offsets, count */
} tiny_state;

/* splitmix64: enough for initial weights. */
static uint64_t
tiny_rng(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static fb_err
tiny_create(const fb_model_spec *spec, void **state)
{
	tiny_state *s;
	uint32_t hid = spec->hidden_count >= 1 ? spec->hidden[0] : TINY_HIDDEN;

	*state = NULL;
	if (spec->task != FB_TASK_CLASSIFICATION) {
		fprintf(stderr, "tiny-tanh: classification only\n");
		return FB_EINVAL;
	}
	if (spec->input_dim < 1 || spec->input_dim > (1u << 24) ||
	    spec->classes < 2 || spec->classes > 65536 || hid < 1 ||
	    hid > 4096) {
		fprintf(stderr, "tiny-tanh: bad shape %u-%u-%u\n",
		    spec->input_dim, hid, spec->classes);
		return FB_EINVAL;
	}
	if ((s = calloc(1, sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	s->in = spec->input_dim;
	s->hid = hid;
	s->out = spec->classes;
	s->w1 = 0;
	s->b1 = s->w1 + (uint64_t)s->hid * s->in;
	s->w2 = s->b1 + s->hid;
	s->b2 = s->w2 + (uint64_t)s->out * s->hid;
	s->params = s->b2 + s->out;
	*state = s;
	return FB_OK;
}

static void
tiny_destroy(void *state)
{
	free(state);
}

static uint64_t
tiny_param_count(const void *state)
{
	const tiny_state *s = state;
	return s->params;
}

static uint32_t
tiny_tensor_count(const void *state)
{
	return 4;
}

static void
tiny_tensor_info(const void *state, uint32_t i, fb_tensor_info *out)
{
	const tiny_state *s = state;
	uint32_t rows = i < 2 ? s->hid : s->out;
	uint32_t cols = i < 2 ? s->in : s->hid;

	memset(out, 0, sizeof(*out));
	snprintf(out->name, sizeof(out->name), "fc%u.%s", i / 2 + 1,
	    i % 2 == 0 ? "weight" : "bias");
	out->ndim = i % 2 == 0 ? 2 : 1;
	out->shape[0] = rows;
	out->shape[1] = i % 2 == 0 ? cols : 0;
	out->count = i % 2 == 0 ? (uint64_t)rows * cols : rows;
	out->offset = i == 0 ? s->w1 : i == 1 ? s->b1 : i == 2 ? s->w2 : s->b2;
}

static void
tiny_init(const void *state, float *params, uint64_t seed)
{
	const tiny_state *s = state;
	uint64_t x = seed ^ 0x74696e79ULL; /* "tiny" */
	double b1 = 1.0 / sqrt((double)s->in), b2 = 1.0 / sqrt((double)s->hid);

	for (uint64_t p = 0; p < s->params; p++) {
		double u = (double)(tiny_rng(&x) >> 11) * 0x1.0p-53;
		double bound = p < s->w2 ? b1 : b2;
		params[p] = (float)((2.0 * u - 1.0) * bound);
	}
}

/* Workspace: hidden activations and their gradient, one row of logits. */
static size_t
tiny_workspace_len(const void *state, uint32_t max_batch)
{
	const tiny_state *s = state;
	return ((size_t)2 * max_batch * s->hid + s->out) * sizeof(float);
}

static void
tiny_hidden(const tiny_state *s, const float *params, const float *x,
    uint32_t n, float *h)
{
	for (uint32_t i = 0; i < n; i++) {
		const float *xi = x + (size_t)i * s->in;
		for (uint32_t j = 0; j < s->hid; j++) {
			const float *w = params + s->w1 + (size_t)j * s->in;
			float a = params[s->b1 + j];
			for (uint32_t k = 0; k < s->in; k++) {
				a += w[k] * xi[k];
			}
			h[(size_t)i * s->hid + j] = tanhf(a);
		}
	}
}

/* tiny_logits computes row i's logits into z; returns -log softmax[y]
 * and leaves softmax in z. */
static double
tiny_logits(const tiny_state *s, const float *params, const float *hi,
    uint32_t y, float *z)
{
	float m;
	double sum = 0.0;

	for (uint32_t c = 0; c < s->out; c++) {
		const float *w = params + s->w2 + (size_t)c * s->hid;
		float a = params[s->b2 + c];
		for (uint32_t j = 0; j < s->hid; j++) {
			a += w[j] * hi[j];
		}
		z[c] = a;
	}
	m = z[0];
	for (uint32_t c = 1; c < s->out; c++) {
		m = z[c] > m ? z[c] : m;
	}
	for (uint32_t c = 0; c < s->out; c++) {
		sum += exp((double)(z[c] - m));
	}
	{
		double loss = (double)m + log(sum) - (double)z[y];
		for (uint32_t c = 0; c < s->out; c++) {
			z[c] = (float)(exp((double)(z[c] - m)) / sum);
		}
		return loss;
	}
}

static fb_err
tiny_forward_backward(const void *state, const float *params, const float *x,
    const fb_label *y, uint32_t n, float *grad, float *loss, void *ws)
{
	const tiny_state *s = state;
	float *h = ws, *dh = h + (size_t)n * s->hid,
	      *z = dh + (size_t)n * s->hid;
	double total = 0.0;

	*loss = 0.0f;
	if (n == 0) {
		return FB_EINVAL;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (y[i].cls < 0 || (uint32_t)y[i].cls >= s->out) {
			return FB_EINVAL;
		}
	}
	memset(grad, 0, (size_t)s->params * sizeof(float));
	tiny_hidden(s, params, x, n, h);
	memset(dh, 0, (size_t)n * s->hid * sizeof(float));
	for (uint32_t i = 0; i < n; i++) {
		const float *hi = h + (size_t)i * s->hid;
		float *dhi = dh + (size_t)i * s->hid;
		total += tiny_logits(s, params, hi, (uint32_t)y[i].cls, z);
		z[y[i].cls] -= 1.0f;
		for (uint32_t c = 0; c < s->out; c++) {
			float d = z[c] / (float)n;
			const float *w = params + s->w2 + (size_t)c * s->hid;
			float *gw = grad + s->w2 + (size_t)c * s->hid;
			grad[s->b2 + c] += d;
			for (uint32_t j = 0; j < s->hid; j++) {
				gw[j] += d * hi[j];
				dhi[j] += d * w[j];
			}
		}
		for (uint32_t j = 0; j < s->hid; j++) {
			/* tanh' = 1 - tanh^2 */
			float d = dhi[j] * (1.0f - hi[j] * hi[j]);
			const float *xi = x + (size_t)i * s->in;
			float *gw = grad + s->w1 + (size_t)j * s->in;
			grad[s->b1 + j] += d;
			for (uint32_t k = 0; k < s->in; k++) {
				gw[k] += d * xi[k];
			}
		}
	}
	*loss = (float)(total / n);
	return FB_OK;
}

static fb_err
tiny_evaluate(const void *state, const float *params, const float *x,
    const fb_label *y, uint32_t n, double *loss_sum, uint64_t *correct,
    void *ws)
{
	const tiny_state *s = state;
	float *h = ws, *z = h + (size_t)2 * n * s->hid;

	for (uint32_t i = 0; i < n; i++) {
		if (y[i].cls < 0 || (uint32_t)y[i].cls >= s->out) {
			return FB_EINVAL;
		}
	}
	tiny_hidden(s, params, x, n, h);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t best = 0;
		*loss_sum += tiny_logits(s, params, h + (size_t)i * s->hid,
		    (uint32_t)y[i].cls, z);
		for (uint32_t c = 1; c < s->out; c++) {
			best = z[c] > z[best] ? c : best;
		}
		*correct += best == (uint32_t)y[i].cls;
	}
	return FB_OK;
}

static const fb_model_ops tiny_ops = {
    .abi_version = FB_MODEL_ABI_VERSION,
    .name = "tiny-tanh",
    .create = tiny_create,
    .destroy = tiny_destroy,
    .param_count = tiny_param_count,
    .tensor_count = tiny_tensor_count,
    .tensor_info = tiny_tensor_info,
    .init = tiny_init,
    .workspace_len = tiny_workspace_len,
    .forward_backward = tiny_forward_backward,
    .evaluate = tiny_evaluate,
    .cuda = NULL,
};

/* The plug-in's one export; fedbox finds it with dlsym. */
const fb_model_ops *fb_model_plugin_v1(void);

const fb_model_ops *
fb_model_plugin_v1(void)
{
	return &tiny_ops;
}
