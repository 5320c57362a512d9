/* SPDX-License-Identifier: Apache-2.0 */
/*
 * layout.c -- models known by their layout alone: "init" (the tensors and
 * initial values of a safetensors file, e.g. one `python -m fedbox init`
 * wrote), and the same made from a layout received from the coordinator;
 * the layout's wire form, and the first difference between two layouts.
 *
 * Such a model has no code: it cannot train or evaluate (its
 * forward_backward and evaluate are NULL). Its trainers are processes of
 * the user's own (worker/proc/), which are handed the layout.
 *
 * The wire form (little-endian): a 4-byte magic "FBL1", a 4-byte tensor
 * count, then per tensor a 1-byte name length (1..63), the name, a 1-byte
 * dtype (1: F32, the only one: federated values are float32), a 1-byte
 * rank (1..4) and 8 bytes per dimension. Offsets are implied: the tensors
 * are contiguous in order.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model_impl.h"

#define LAYOUT_MAGIC 0x314c4246u /* "FBL1" */
#define LAYOUT_F32 1

typedef struct layout_model {
	fb_tensor_info *t; /* owned, n entries */
	uint32_t n;
	uint64_t params;
	float *values; /* owned initial values; NULL: from the wire, none */
} layout_model;

static void
layout_free(layout_model *s)
{
	if (s != NULL) {
		fb_free(s->t);
		fb_free(s->values);
		fb_free(s);
	}
}

static fb_err
init_create(const fb_model_spec *spec, void **state)
{
	fb_err rc;
	layout_model *s;

	*state = NULL;
	if (memchr(spec->init, '\0', sizeof(spec->init)) == NULL ||
	    spec->init[0] == '\0') {
		fb_log_error("model init: no file given (model.init)");
		return FB_EINVAL;
	}
	if ((s = fb_calloc(1, sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	rc = fb_safetensors_read_init(spec->init, true, &s->t, &s->n,
	    &s->values);
	if (rc != FB_OK) {
		layout_free(s);
		return rc == FB_EFORMAT ? FB_EINVAL : rc;
	}
	for (uint32_t i = 0; i < s->n; i++) {
		s->params += s->t[i].count;
	}
	*state = s;
	return FB_OK;
}

static void
init_destroy(void *state)
{
	layout_free(state);
}

static uint64_t
init_param_count(const void *state)
{
	return ((const layout_model *)state)->params;
}

static uint32_t
init_tensor_count(const void *state)
{
	return ((const layout_model *)state)->n;
}

static void
init_tensor_info(const void *state, uint32_t i, fb_tensor_info *out)
{
	*out = ((const layout_model *)state)->t[i];
}

/* The file's values whatever the seed; a layout from the wire has none
 * (its model comes from the coordinator each round): zeros. */
static void
init_init(const void *state, float *params, uint64_t seed)
{
	const layout_model *s = state;

	(void)seed;
	if (s->values != NULL) {
		memcpy(params, s->values, (size_t)s->params * 4);
	} else {
		memset(params, 0, (size_t)s->params * 4);
	}
}

static size_t
init_workspace_len(const void *state, uint32_t max_batch)
{
	(void)state;
	(void)max_batch;
	return 0;
}

const fb_model_ops fb_model_init_ops = {
    .abi_version = FB_MODEL_ABI_VERSION,
    .name = "init",
    .create = init_create,
    .destroy = init_destroy,
    .param_count = init_param_count,
    .tensor_count = init_tensor_count,
    .tensor_info = init_tensor_info,
    .init = init_init,
    .workspace_len = init_workspace_len,
    .forward_backward = NULL,
    .evaluate = NULL,
    .cuda = NULL,
};

/* ---- the wire form ------------------------------------------------------ */

fb_err
fb_model_layout_pack(const fb_model *m, uint8_t **out, size_t *len)
{
	uint32_t n = fb_model_tensor_count(m);
	size_t cap = 8 + (size_t)n * (1 + FB_TENSOR_NAME_MAX + 2 + 32);
	uint8_t *b, *p;
	fb_tensor_info ti;

	*out = NULL;
	*len = 0;
	if ((b = fb_alloc(cap)) == NULL) {
		return FB_ENOMEM;
	}
	p = b;
	fb_store_le32(p, LAYOUT_MAGIC);
	fb_store_le32(p + 4, n);
	p += 8;
	for (uint32_t i = 0; i < n; i++) {
		size_t k;
		fb_model_tensor_info(m, i, &ti);
		k = strlen(ti.name); /* 1..63: fb_model_open checked */
		*p++ = (uint8_t)k;
		memcpy(p, ti.name, k);
		p += k;
		*p++ = LAYOUT_F32;
		*p++ = (uint8_t)ti.ndim;
		for (uint32_t d = 0; d < ti.ndim; d++) {
			fb_store_le64(p, ti.shape[d]);
			p += 8;
		}
	}
	*out = b;
	*len = (size_t)(p - b);
	return FB_OK;
}

static int
cmp_name(const void *a, const void *b)
{
	return strcmp(((const fb_tensor_info *)a)->name,
	    ((const fb_tensor_info *)b)->name);
}

/* unpack_layout decodes the wire form into s (tensors allocated). */
static fb_err
unpack_layout(const uint8_t *buf, size_t len, layout_model *s,
    const char **why)
{
	const uint8_t *p = buf, *end = buf + len;
	fb_tensor_info *sorted = NULL;
	uint32_t n;
	fb_err rc = FB_EPROTO;

	*why = "shorter than its count";
	if (len < 8 || fb_load_le32(p) != LAYOUT_MAGIC) {
		*why = "no layout magic";
		goto out;
	}
	n = fb_load_le32(p + 4);
	p += 8;
	/* Each tensor takes at least 12 bytes: the count is bounded by the
	 * bytes that came, before anything is allocated. */
	if (n == 0 || n > FB_MODEL_INIT_TENSORS_MAX || n > (len - 8) / 12) {
		*why = "tensor count 0, over the limit, or beyond its bytes";
		goto out;
	}
	if ((s->t = fb_calloc(n, sizeof(*s->t))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		fb_tensor_info *t = &s->t[i];
		uint32_t k;
		if (end - p < 1 || (k = *p++) < 1 || k >= FB_TENSOR_NAME_MAX ||
		    end - p < (ptrdiff_t)k + 2) {
			*why = "a tensor name is empty, too long or cut";
			goto out;
		}
		for (uint32_t j = 0; j < k; j++) {
			if (p[j] < 0x20 || p[j] == 0x7f) {
				*why = "a tensor name holds a control byte";
				goto out;
			}
		}
		memcpy(t->name, p, k);
		p += k;
		if (*p++ != LAYOUT_F32) {
			*why = "a tensor's dtype is not F32";
			goto out;
		}
		t->ndim = *p++;
		if (t->ndim < 1 || t->ndim > 4 ||
		    end - p < (ptrdiff_t)(8 * t->ndim)) {
			*why = "a tensor's rank is not 1..4, or its shape "
			       "is cut";
			goto out;
		}
		t->count = 1;
		for (uint32_t d = 0; d < t->ndim; d++) {
			t->shape[d] = fb_load_le64(p);
			p += 8;
			if (t->shape[d] == 0 ||
			    t->shape[d] >= FB_MODEL_MAX_PARAMS ||
			    t->count * t->shape[d] >= FB_MODEL_MAX_PARAMS) {
				*why = "a tensor's shape is empty or too large";
				goto out;
			}
			t->count *= t->shape[d];
		}
		t->offset = s->params;
		if (s->params + t->count >= FB_MODEL_MAX_PARAMS) {
			*why = "more than 2^40 parameters";
			goto out;
		}
		s->params += t->count;
		s->n++;
	}
	if (p != end) {
		*why = "trailing bytes after the last tensor";
		goto out;
	}
	if ((sorted = fb_alloc((size_t)n * sizeof(*sorted))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memcpy(sorted, s->t, (size_t)n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_name);
	for (uint32_t i = 1; i < n; i++) {
		if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
			*why = "a tensor name appears twice";
			goto out;
		}
	}
	*why = NULL;
	rc = FB_OK;
out:
	fb_free(sorted);
	return rc;
}

fb_err
fb_model_open_layout(const uint8_t *buf, size_t len,
    const fb_model_spec *spec, fb_model **out)
{
	layout_model *s;
	const char *why = NULL;
	fb_err rc;

	*out = NULL;
	if ((s = fb_calloc(1, sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	if ((rc = unpack_layout(buf, len, s, &why)) != FB_OK) {
		if (why != NULL) {
			fb_log_error("the coordinator's model layout is "
			             "malformed: %s",
			    why);
		}
		layout_free(s);
		return rc;
	}
	return fb_model_open_state(&fb_model_init_ops, s, spec, out);
}

/* ---- comparing layouts -------------------------------------------------- */

static void
tensor_text(const fb_tensor_info *t, char *buf, size_t len)
{
	size_t used;
	int k = snprintf(buf, len, "\"%s\" [", t->name);

	used = k > 0 && (size_t)k < len ? (size_t)k : len - 1;
	for (uint32_t d = 0; d < t->ndim && used < len; d++) {
		k = snprintf(buf + used, len - used, "%s%" PRIu64,
		    d > 0 ? ", " : "", t->shape[d]);
		used += k > 0 ? (size_t)k : 0;
	}
	if (used < len) {
		snprintf(buf + used, len - used, "] F32");
	}
}

bool
fb_model_layout_diff(const fb_model *a, const char *a_name,
    const fb_model *b, const char *b_name, char *why, size_t why_len)
{
	uint32_t na = fb_model_tensor_count(a), nb = fb_model_tensor_count(b);
	char ta[160], tb[160];
	fb_tensor_info x, y;

	why[0] = '\0';
	for (uint32_t i = 0; i < na && i < nb; i++) {
		fb_model_tensor_info(a, i, &x);
		fb_model_tensor_info(b, i, &y);
		if (strcmp(x.name, y.name) != 0 || x.ndim != y.ndim ||
		    memcmp(x.shape, y.shape, x.ndim * sizeof(uint64_t)) != 0) {
			tensor_text(&x, ta, sizeof(ta));
			tensor_text(&y, tb, sizeof(tb));
			snprintf(why, why_len,
			    "tensor %u is %s in %s but %s in %s", i, ta,
			    a_name, tb, b_name);
			return true;
		}
	}
	if (na != nb) {
		int a_more = na > nb;
		fb_model_tensor_info(a_more ? a : b, a_more ? nb : na, &x);
		tensor_text(&x, ta, sizeof(ta));
		snprintf(why, why_len,
		    "%s has %u tensors and %s %u: tensor %u, %s, is only in %s",
		    a_name, na, b_name, nb, a_more ? nb : na, ta,
		    a_more ? a_name : b_name);
		return true;
	}
	return false;
}
