/* SPDX-License-Identifier: Apache-2.0 */
/*
 * model.c -- opening models: built-ins by name, plug-ins with dlopen; the
 * getters, a one-line description, and batched evaluation.
 *
 * Whatever the ops come from, fb_model_open checks the layout they report
 * (tensors contiguous, in order, covering the parameter vector) so that the
 * rest of fedbox, safetensors files included, may rely on it.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model_impl.h"

#define EVAL_BATCH 1000

struct fb_model {
	const fb_model_ops *ops;
	void *state; /* owned: ops->create / ops->destroy */
	void *dl;    /* owned: dlopen / dlclose; NULL for built-ins */
	uint64_t params;
	uint32_t input_dim; /* features per example, from the spec */
	uint32_t classes;   /* from the spec */
	fb_task task;       /* from the spec */
};

_Static_assert(sizeof(fb_label) == 4, "labels are 4 bytes on every task");

static const fb_model_ops *const builtins[] = {
    &fb_model_mlp_ops,
    &fb_model_logreg_ops,
    &fb_model_synthetic_ops,
    &fb_model_init_ops,
};

static fb_err
plugin_load(const fb_model_spec *spec, void **dl, const fb_model_ops **ops)
{
	fb_err rc = FB_OK;
	fb_model_plugin_fn fn;
	void *sym;
	const char *path = spec->plugin;

	*dl = NULL;
	*ops = NULL;
	if (memchr(path, '\0', sizeof(spec->plugin)) == NULL ||
	    path[0] == '\0') {
		fb_log_error("model plugin: no plug-in path given");
		rc = FB_EINVAL;
		goto out;
	}
	dlerror();
	if ((*dl = dlopen(path, RTLD_NOW | RTLD_LOCAL)) == NULL) {
		fb_log_error(
		    "model plugin %s: cannot load: %s", path, dlerror());
		rc = FB_EIO;
		goto out;
	}
	if ((sym = dlsym(*dl, FB_MODEL_PLUGIN_SYMBOL)) == NULL) {
		fb_log_error("model plugin %s: no symbol %s: %s", path,
		    FB_MODEL_PLUGIN_SYMBOL, dlerror());
		rc = FB_EIO;
		goto out;
	}
	/* POSIX guarantees this conversion for dlsym results. */
	*(void **)&fn = sym;
	if ((*ops = fn()) == NULL) {
		fb_log_error("model plugin %s: %s() returned NULL", path,
		    FB_MODEL_PLUGIN_SYMBOL);
		rc = FB_EIO;
		goto out;
	}
	if ((*ops)->abi_version != FB_MODEL_ABI_VERSION) {
		fb_log_error("model plugin %s: ABI version %u, fedbox needs "
		             "%d",
		    path, (*ops)->abi_version, FB_MODEL_ABI_VERSION);
		rc = FB_ENOTSUP;
		goto out;
	}
	if ((*ops)->create == NULL || (*ops)->destroy == NULL ||
	    (*ops)->param_count == NULL || (*ops)->tensor_count == NULL ||
	    (*ops)->tensor_info == NULL || (*ops)->init == NULL ||
	    (*ops)->workspace_len == NULL || (*ops)->name == NULL) {
		fb_log_error(
		    "model plugin %s: ops table lacks a required "
		    "entry (name, create, destroy, param_count, tensor_count, "
		    "tensor_info, init, workspace_len)",
		    path);
		rc = FB_EINVAL;
		goto out;
	}
out:
	if (rc != FB_OK && *dl != NULL) {
		dlclose(*dl);
		*dl = NULL;
		*ops = NULL;
	}
	return rc;
}

/* check_layout verifies what the ops report about the parameter vector. */
static fb_err
check_layout(const fb_model *m, const char *what)
{
	uint32_t n = m->ops->tensor_count(m->state);
	uint64_t next = 0;
	fb_tensor_info ti;

	if (m->params < 1 || m->params >= FB_MODEL_MAX_PARAMS || n < 1) {
		fb_log_error("model %s: %" PRIu64 " parameters in %u tensors "
		             "(need 1..2^40-1 in >= 1)",
		    what, m->params, n);
		return FB_EINVAL;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint64_t count = 1;
		m->ops->tensor_info(m->state, i, &ti);
		if (memchr(ti.name, '\0', sizeof(ti.name)) == NULL ||
		    ti.name[0] == '\0' || ti.ndim < 1 || ti.ndim > 4) {
			fb_log_error("model %s: tensor %u has no name or a "
			             "bad rank",
			    what, i);
			return FB_EINVAL;
		}
		for (uint32_t d = 0; d < ti.ndim; d++) {
			if (ti.shape[d] == 0 ||
			    ti.shape[d] >= FB_MODEL_MAX_PARAMS ||
			    count * ti.shape[d] >= FB_MODEL_MAX_PARAMS) {
				fb_log_error("model %s: tensor %s has a bad "
				             "shape",
				    what, ti.name);
				return FB_EINVAL;
			}
			count *= ti.shape[d];
		}
		if (count != ti.count || ti.offset != next) {
			fb_log_error("model %s: tensor %s is not laid out "
			             "contiguously in order",
			    what, ti.name);
			return FB_EINVAL;
		}
		next += count;
	}
	if (next != m->params) {
		fb_log_error("model %s: tensors hold %" PRIu64 " of %" PRIu64
		             " parameters",
		    what, next, m->params);
		return FB_EINVAL;
	}
	return FB_OK;
}

fb_err
fb_model_open(const fb_model_spec *spec, fb_model **out)
{
	fb_err rc = FB_OK;
	fb_model *m = NULL;
	const fb_model_ops *ops = NULL;
	void *dl = NULL;

	*out = NULL;
	if (memchr(spec->arch, '\0', sizeof(spec->arch)) == NULL) {
		fb_log_error("model: arch is not a terminated string");
		rc = FB_EINVAL;
		goto out;
	}
	if (spec->task != FB_TASK_CLASSIFICATION &&
	    spec->task != FB_TASK_REGRESSION) {
		fb_log_error("model: unknown task %u (0 classification, 1 "
		             "regression)",
		    spec->task);
		rc = FB_EINVAL;
		goto out;
	}
	if (strcmp(spec->arch, "plugin") == 0) {
		if ((rc = plugin_load(spec, &dl, &ops)) != FB_OK) {
			goto out;
		}
	} else {
		for (size_t i = 0; i < FB_ARRAY_LEN(builtins); i++) {
			if (strcmp(spec->arch, builtins[i]->name) == 0) {
				ops = builtins[i];
			}
		}
		if (ops == NULL) {
			fb_log_error("model: unknown arch \"%s\" (mlp, logreg, "
			             "synthetic, plugin or init)",
			    spec->arch);
			rc = FB_EINVAL;
			goto out;
		}
	}
	if ((m = fb_calloc(1, sizeof(*m))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	m->ops = ops;
	m->dl = dl;
	dl = NULL;
	if ((rc = ops->create(spec, &m->state)) != FB_OK) {
		m->state = NULL;
		goto out;
	}
	m->params = ops->param_count(m->state);
	if (ops != &fb_model_synthetic_ops) {
		m->input_dim = spec->input_dim;
		m->classes = spec->classes;
		m->task = (fb_task)spec->task;
	}
	if ((rc = check_layout(m, ops->name)) != FB_OK) {
		goto out;
	}
	*out = m;
	m = NULL;
out:
	fb_model_close(m);
	if (dl != NULL) {
		dlclose(dl);
	}
	return rc;
}

fb_err
fb_model_open_state(const fb_model_ops *ops, void *state,
    const fb_model_spec *spec, fb_model **out)
{
	fb_err rc = FB_OK;
	fb_model *m = NULL;

	*out = NULL;
	if ((m = fb_calloc(1, sizeof(*m))) == NULL) {
		ops->destroy(state);
		rc = FB_ENOMEM;
		goto out;
	}
	m->ops = ops;
	m->state = state;
	m->params = ops->param_count(state);
	m->input_dim = spec->input_dim;
	m->classes = spec->classes;
	m->task = (fb_task)spec->task;
	if ((rc = check_layout(m, ops->name)) != FB_OK) {
		goto out;
	}
	*out = m;
	m = NULL;
out:
	fb_model_close(m);
	return rc;
}

void
fb_model_close(fb_model *m)
{
	if (m == NULL) {
		return;
	}
	if (m->state != NULL) {
		m->ops->destroy(m->state);
	}
	if (m->dl != NULL) {
		dlclose(m->dl);
	}
	fb_free(m);
}

const fb_model_ops *
fb_model_get_ops(const fb_model *m)
{
	return m->ops;
}

const void *
fb_model_state(const fb_model *m)
{
	return m->state;
}

uint64_t
fb_model_param_count(const fb_model *m)
{
	return m->params;
}

uint32_t
fb_model_input_dim(const fb_model *m)
{
	return m->input_dim;
}

uint32_t
fb_model_classes(const fb_model *m)
{
	return m->classes;
}

fb_task
fb_model_task(const fb_model *m)
{
	return m->task;
}

uint32_t
fb_model_tensor_count(const fb_model *m)
{
	return m->ops->tensor_count(m->state);
}

void
fb_model_tensor_info(const fb_model *m, uint32_t i, fb_tensor_info *out)
{
	m->ops->tensor_info(m->state, i, out);
}

void
fb_model_init_params(const fb_model *m, float *params, uint64_t seed)
{
	m->ops->init(m->state, params, seed);
}

void
fb_model_describe(const fb_model *m, char *buf, size_t len)
{
	uint32_t n = fb_model_tensor_count(m);
	char dims[512];
	size_t used = 0;
	uint64_t last = 0;
	int chain = 1;
	fb_tensor_info ti;

	/* Widths come from the 2-D tensors when they form a chain
	 * [h1, in], [h2, h1], ... as nn.Linear weights do. */
	dims[0] = '\0';
	for (uint32_t i = 0; i < n && chain; i++) {
		int k;
		fb_model_tensor_info(m, i, &ti);
		if (ti.ndim != 2) {
			continue;
		}
		if (used == 0) {
			k = snprintf(
			    dims, sizeof(dims), "%" PRIu64, ti.shape[1]);
			used = k > 0 ? (size_t)k : 0;
		} else if (ti.shape[1] != last) {
			chain = 0;
			break;
		}
		k = snprintf(
		    dims + used, sizeof(dims) - used, "-%" PRIu64, ti.shape[0]);
		if (k < 0 || (size_t)k >= sizeof(dims) - used) {
			chain = 0;
			break;
		}
		used += (size_t)k;
		last = ti.shape[0];
	}
	if (chain && used > 0) {
		snprintf(buf, len, "%s %s (%" PRIu64 " params)", m->ops->name,
		    dims, m->params);
	} else {
		snprintf(buf, len, "%s (%" PRIu64 " params)", m->ops->name,
		    m->params);
	}
}

fb_err
fb_model_evaluate(const fb_model *m, const float *params, const float *x,
    const fb_label *y, uint32_t count, double *mean_loss, double *accuracy)
{
	fb_err rc = FB_OK;
	void *ws = NULL;
	uint32_t chunk = count < EVAL_BATCH ? count : EVAL_BATCH;
	double loss_sum = 0.0;
	uint64_t correct = 0;
	size_t ws_len;

	*mean_loss = 0.0;
	*accuracy = m->task == FB_TASK_REGRESSION ? NAN : 0.0;
	if (m->ops->evaluate == NULL) {
		rc = FB_ENOTSUP;
		goto out;
	}
	if (count == 0) {
		goto out;
	}
	ws_len = m->ops->workspace_len(m->state, chunk);
	if (ws_len == SIZE_MAX || (ws = fb_alloc(ws_len)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < count; i += chunk) {
		uint32_t b = count - i < chunk ? count - i : chunk;
		const float *xb = x + (size_t)i * m->input_dim;
		rc = m->ops->evaluate(
		    m->state, params, xb, y + i, b, &loss_sum, &correct, ws);
		if (rc != FB_OK) {
			goto out;
		}
	}
	*mean_loss = loss_sum / count;
	*accuracy = m->task == FB_TASK_REGRESSION ? NAN
	                                          : (double)correct / count;
out:
	fb_free(ws);
	return rc;
}
