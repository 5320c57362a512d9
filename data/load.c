/* SPDX-License-Identifier: Apache-2.0 */
/*
 * load.c -- the one entry point to a box's data: pick the reader for the
 * format, split the training set when simulating several boxes, normalise
 * the features, and say truthfully what was done (fb_dataset_describe).
 *
 * Normalisation is always x = (v - mean[j]) / std[j], computed in float32
 * with a division (not a multiplication by 1/std), so that numpy gives
 * bitwise the same inputs from the constants the description records.
 * Statistics of "own" are the mean and the population standard deviation
 * (ddof 0, as sklearn's StandardScaler) of the training shard, summed in
 * double in example order, then rounded to float32.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "data/data_impl.h"

const char *const fb_data_format_names[] = {"csv", "npy", "npz", "idx", NULL};
const char *const fb_data_norm_names[] = {
    "auto", "own", "file", "scalar", "none", NULL};
const char *const fb_data_task_names[] = {"classification", "regression", NULL};

/* ---- shared pieces ------------------------------------------------------- */

fb_err
fb_data_grow(void **p, size_t *cap, size_t need, size_t elem)
{
	fb_err rc = FB_OK;
	size_t ncap = *cap > 0 ? *cap : 1024;
	void *q;

	if (need <= *cap) {
		goto out;
	}
	while (ncap < need) {
		if (ncap > SIZE_MAX / 2) {
			ncap = need;
			break;
		}
		ncap *= 2;
	}
	if (ncap > SIZE_MAX / elem || (q = fb_alloc(ncap * elem)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if (*p != NULL) {
		memcpy(q, *p, *cap * elem);
		fb_free(*p);
	}
	*p = q;
	*cap = ncap;
out:
	return rc;
}

int
fb_data_label_check(
    double v, int task, int64_t classes, char *why, size_t why_len)
{
	if (task == FB_TASK_REGRESSION) {
		if (!isfinite(v)) {
			snprintf(why, why_len, "is not a finite number");
			return 0;
		}
		if (fabs(v) > FLT_MAX) {
			snprintf(why, why_len, "is outside the float32 range");
			return 0;
		}
		return 1;
	}
	if (!isfinite(v) || v != floor(v)) {
		snprintf(why, why_len,
		    "is not a whole number (class labels "
		    "are integers 0, 1, ...)");
		return 0;
	}
	if (v < 0) {
		snprintf(why, why_len,
		    "is negative (class labels are 0, 1, "
		    "...)");
		return 0;
	}
	if (classes > 0 && v >= (double)classes) {
		snprintf(why, why_len,
		    "is out of range: %" PRId64 " classes take labels "
		    "0..%" PRId64,
		    classes, classes - 1);
		return 0;
	}
	if (v >= (double)FB_DATA_MAX_CLASSES) {
		snprintf(why, why_len,
		    "is out of range: labels must be below "
		    "%u",
		    FB_DATA_MAX_CLASSES);
		return 0;
	}
	return 1;
}

void
fb_data_set_label(double v, int task, fb_label *y)
{
	if (task == FB_TASK_REGRESSION) {
		y->value = (float)v;
	} else {
		y->cls = (int32_t)v;
	}
}

void
fb_data_finish_labels(fb_dataset *ds, int64_t spec_classes)
{
	int32_t max = -1;

	if (ds->task == FB_TASK_REGRESSION) {
		ds->classes = 0;
		return;
	}
	if (spec_classes > 0) {
		ds->classes = (uint32_t)spec_classes;
		return;
	}
	for (uint32_t i = 0; i < ds->count; i++) {
		max = ds->y[i].cls > max ? ds->y[i].cls : max;
	}
	ds->classes = (uint32_t)(max + 1);
}

static void
free_names(char **names, uint32_t n)
{
	if (names == NULL) {
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		fb_free(names[i]);
	}
	fb_free(names);
}

fb_err
fb_data_copy_record(const fb_dataset *src, fb_dataset *dst)
{
	fb_err rc = FB_OK;
	size_t len = (size_t)src->dim * sizeof(float);

	if (src->mean != NULL) {
		dst->mean = fb_alloc(len);
		dst->std = fb_alloc(len);
		if (dst->mean == NULL || dst->std == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		memcpy(dst->mean, src->mean, len);
		memcpy(dst->std, src->std, len);
	}
	if (src->names != NULL) {
		dst->names = fb_calloc(src->dim, sizeof(char *));
		if (dst->names == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		for (uint32_t j = 0; j < src->dim; j++) {
			size_t n = strlen(src->names[j]) + 1;
			if ((dst->names[j] = fb_alloc(n)) == NULL) {
				rc = FB_ENOMEM;
				goto out;
			}
			memcpy(dst->names[j], src->names[j], n);
		}
	}
out:
	if (rc != FB_OK) {
		fb_free(dst->mean);
		fb_free(dst->std);
		free_names(dst->names, src->dim);
		dst->mean = dst->std = NULL;
		dst->names = NULL;
	}
	return rc;
}

void
fb_dataset_fini(fb_dataset *ds)
{
	if (ds == NULL) {
		return;
	}
	fb_free(ds->x);
	fb_free(ds->y);
	fb_free(ds->mean);
	fb_free(ds->std);
	free_names(ds->names, ds->dim);
	memset(ds, 0, sizeof(*ds));
}

fb_err
fb_dataset_subset(
    const fb_dataset *src, const uint32_t *idx, uint32_t count, fb_dataset *out)
{
	fb_err rc = FB_OK;
	fb_dataset ds;

	memset(&ds, 0, sizeof(ds));
	if (out == NULL || src == NULL || src == out ||
	    (count > 0 && idx == NULL)) {
		fb_log_error("dataset: bad subset arguments");
		rc = FB_EINVAL;
		goto out;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (idx[i] >= src->count) {
			fb_log_error("dataset: subset index %u at position "
			             "%u is past the %u examples",
			    (unsigned)idx[i], (unsigned)i,
			    (unsigned)src->count);
			rc = FB_EINVAL;
			goto out;
		}
	}
	ds.count = count;
	ds.dim = src->dim;
	ds.classes = src->classes;
	ds.task = src->task;
	ds.format = src->format;
	ds.norm = src->norm;
	ds.raw_count = src->raw_count;
	ds.x = fb_calloc((size_t)count * src->dim, sizeof(float));
	ds.y = fb_calloc(count, sizeof(*ds.y));
	if (ds.x == NULL || ds.y == NULL ||
	    fb_data_copy_record(src, &ds) != FB_OK) {
		fb_log_error("dataset: out of memory for a subset of %u "
		             "examples",
		    (unsigned)count);
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < count; i++) {
		memcpy(ds.x + (size_t)i * ds.dim,
		    src->x + (size_t)idx[i] * src->dim, ds.dim * sizeof(float));
		ds.y[i] = src->y[idx[i]];
	}
out:
	if (out != NULL && out != src) {
		if (rc == FB_OK) {
			*out = ds;
		} else {
			fb_dataset_fini(&ds);
			memset(out, 0, sizeof(*out));
		}
	}
	return rc;
}

/* ---- normalisation ------------------------------------------------------- */

fb_err
fb_data_normalize(
    fb_dataset *ds, fb_data_norm norm, const float *mean, const float *std)
{
	fb_err rc = FB_OK;
	size_t len = (size_t)ds->dim * sizeof(float);
	float *m = NULL, *s = NULL;

	if ((m = fb_alloc(len)) == NULL || (s = fb_alloc(len)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memcpy(m, mean, len);
	memcpy(s, std, len);
	for (uint32_t i = 0; i < ds->count; i++) {
		float *row = ds->x + (size_t)i * ds->dim;
		for (uint32_t j = 0; j < ds->dim; j++) {
			row[j] = (row[j] - m[j]) / s[j];
		}
	}
	fb_free(ds->mean);
	fb_free(ds->std);
	ds->mean = m;
	ds->std = s;
	ds->norm = norm;
	m = s = NULL;
out:
	fb_free(m);
	fb_free(s);
	return rc;
}

fb_err
fb_data_normalize_scalar(fb_dataset *ds, float mean, float std)
{
	fb_err rc = FB_OK;
	size_t len = (size_t)ds->dim * sizeof(float);
	float *m = NULL, *s = NULL;

	if ((m = fb_alloc(len)) == NULL || (s = fb_alloc(len)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t j = 0; j < ds->dim; j++) {
		m[j] = mean;
		s[j] = std;
	}
	rc = fb_data_normalize(ds, FB_NORM_SCALAR, m, s);
out:
	fb_free(m);
	fb_free(s);
	return rc;
}

/* own_stats computes per-feature mean and population std of ds; a feature
 * with no spread gets std 1 (it is only centred). */
static fb_err
own_stats(const fb_dataset *ds, float *mean, float *std)
{
	fb_err rc = FB_OK;
	double *sum = fb_calloc(ds->dim, sizeof(double));
	double *sq = fb_calloc(ds->dim, sizeof(double));

	if (sum == NULL || sq == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < ds->count; i++) {
		const float *row = ds->x + (size_t)i * ds->dim;
		for (uint32_t j = 0; j < ds->dim; j++) {
			sum[j] += row[j];
		}
	}
	for (uint32_t j = 0; j < ds->dim; j++) {
		sum[j] /= ds->count;
	}
	for (uint32_t i = 0; i < ds->count; i++) {
		const float *row = ds->x + (size_t)i * ds->dim;
		for (uint32_t j = 0; j < ds->dim; j++) {
			double d = row[j] - sum[j];
			sq[j] += d * d;
		}
	}
	for (uint32_t j = 0; j < ds->dim; j++) {
		double sd = sqrt(sq[j] / ds->count);
		mean[j] = (float)sum[j];
		std[j] = sd > 0.0 && (float)sd > 0.0f ? (float)sd : 1.0f;
	}
out:
	fb_free(sum);
	fb_free(sq);
	return rc;
}

/* check_finite refuses features that normalisation pushed past float32
 * (a tiny std in a normalisation file, say). */
static fb_err
check_finite(const fb_dataset *ds, const char *path)
{
	size_t n = (size_t)ds->count * ds->dim;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(ds->x[i])) {
			fb_log_error("%s: feature %zu of example %zu is not "
			             "finite after normalisation (std too "
			             "small for its values?)",
			    path, i % ds->dim, i / ds->dim);
			return FB_EFORMAT;
		}
	}
	return FB_OK;
}

/* ---- the entry point ----------------------------------------------------- */

static int
empty(const char *s)
{
	return s == NULL || s[0] == '\0';
}

/* read_set reads one file (and its labels file) per format. */
static fb_err
read_set(const fb_data_spec *spec, const char *file, const char *labels,
    const char *file_key, const char *labels_key, fb_dataset *out)
{
	fb_err rc = FB_OK;

	memset(out, 0, sizeof(*out));
	if (empty(file)) {
		fb_log_error("dataset: no file named (%s)", file_key);
		rc = FB_EINVAL;
		goto out;
	}
	switch (spec->format) {
	case FB_DATA_CSV:
		rc = fb_data_csv_read(file, spec, out);
		break;
	case FB_DATA_NPZ:
		rc = fb_data_npz_read(file, spec, out);
		break;
	case FB_DATA_NPY:
	case FB_DATA_IDX:
		if (empty(labels)) {
			fb_log_error("dataset: %s data needs a labels file "
			             "(%s) next to %s",
			    fb_data_format_names[spec->format], labels_key,
			    file);
			rc = FB_EINVAL;
			goto out;
		}
		if (spec->format == FB_DATA_NPY) {
			rc = fb_data_npy_read(file, labels, spec, out);
			break;
		}
		if (spec->task == FB_TASK_REGRESSION) {
			fb_log_error("dataset: idx files hold class labels; "
			             "regression needs csv, npy or npz");
			rc = FB_EINVAL;
			goto out;
		}
		if ((rc = fb_data_idx_read(file, labels, out)) != FB_OK) {
			break;
		}
		for (uint32_t i = 0; i < out->count && spec->classes > 0; i++) {
			if (out->y[i].cls >= spec->classes) {
				fb_log_error("%s: label %d of image %u is out "
				             "of range: %" PRId64 " classes "
				             "take labels 0..%" PRId64,
				    labels, (int)out->y[i].cls, i,
				    spec->classes, spec->classes - 1);
				rc = FB_EFORMAT;
				goto out;
			}
		}
		fb_data_finish_labels(out, spec->classes);
		break;
	default:
		fb_log_error("dataset: unknown format %d", spec->format);
		rc = FB_EINVAL;
		break;
	}
out:
	if (rc != FB_OK) {
		fb_dataset_fini(out);
	}
	return rc;
}

static fb_err
check_spec(const fb_data_spec *spec)
{
	fb_err rc = FB_EINVAL;

	if (spec->format < FB_DATA_CSV || spec->format > FB_DATA_IDX) {
		fb_log_error("dataset: unknown format %d", spec->format);
		goto out;
	}
	if (spec->task != FB_TASK_CLASSIFICATION &&
	    spec->task != FB_TASK_REGRESSION) {
		fb_log_error("dataset: unknown task %d", spec->task);
		goto out;
	}
	if (spec->classes < 0 || spec->classes > FB_DATA_MAX_CLASSES ||
	    (spec->classes == 1 && spec->task == FB_TASK_CLASSIFICATION)) {
		fb_log_error("dataset: classes %" PRId64 " (0 = from the "
		             "labels, else 2..%u)",
		    spec->classes, FB_DATA_MAX_CLASSES);
		goto out;
	}
	if (spec->normalize < FB_NORM_AUTO || spec->normalize > FB_NORM_NONE) {
		fb_log_error(
		    "dataset: unknown normalisation %d", spec->normalize);
		goto out;
	}
	if (spec->normalize == FB_NORM_FILE && empty(spec->normalize_file)) {
		fb_log_error("dataset: normalize file needs normalize_file");
		goto out;
	}
	if (spec->normalize == FB_NORM_SCALAR &&
	    (!isfinite(spec->mean) || !(spec->std > 0) ||
	        !isfinite(spec->std) || fabs(spec->mean) > FLT_MAX ||
	        (float)spec->std <= 0.0f || spec->std > FLT_MAX)) {
		fb_log_error("dataset: normalize scalar needs a finite mean "
		             "and a std > 0 within float32 (got %g and %g)",
		    spec->mean, spec->std);
		goto out;
	}
	rc = FB_OK;
out:
	return rc;
}

/* normalize_sets applies the spec's normalisation to train (and valid). */
static fb_err
normalize_sets(const fb_data_spec *spec, fb_dataset *train, fb_dataset *valid)
{
	fb_err rc = FB_OK;
	int mode = spec->normalize;
	size_t len = (size_t)train->dim * sizeof(float);
	float *mean = NULL, *std = NULL;

	if (mode == FB_NORM_AUTO) {
		mode =
		    spec->format == FB_DATA_IDX ? FB_NORM_SCALAR : FB_NORM_OWN;
	}
	if (mode == FB_NORM_NONE) {
		train->norm = FB_NORM_NONE;
		if (valid != NULL) {
			valid->norm = FB_NORM_NONE;
		}
		goto out;
	}
	if ((mean = fb_alloc(len)) == NULL || (std = fb_alloc(len)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	switch (mode) {
	case FB_NORM_OWN:
		rc = own_stats(train, mean, std);
		break;
	case FB_NORM_FILE:
		rc = fb_data_csv_read_norm(
		    spec->normalize_file, train, mean, std);
		break;
	default: /* FB_NORM_SCALAR */
		for (uint32_t j = 0; j < train->dim; j++) {
			mean[j] = (float)spec->mean;
			std[j] = (float)spec->std;
		}
		break;
	}
	if (rc != FB_OK) {
		goto out;
	}
	if ((rc = fb_data_normalize(train, (fb_data_norm)mode, mean, std)) !=
	        FB_OK ||
	    (valid != NULL && (rc = fb_data_normalize(valid, (fb_data_norm)mode,
	                           mean, std)) != FB_OK)) {
		goto out;
	}
	if ((rc = check_finite(train, spec->file)) != FB_OK ||
	    (valid != NULL &&
	        (rc = check_finite(valid, spec->valid)) != FB_OK)) {
		goto out;
	}
out:
	fb_free(mean);
	fb_free(std);
	return rc;
}

/* same_columns checks that the validation set has the training set's
 * features, by name where both have names. */
static fb_err
same_columns(const fb_data_spec *spec, const fb_dataset *t, const fb_dataset *v)
{
	if (v->dim != t->dim) {
		fb_log_error("%s: %u features per example, but the training "
		             "data %s has %u",
		    spec->valid, v->dim, spec->file, t->dim);
		return FB_EFORMAT;
	}
	if (t->classes > 0 && v->task == FB_TASK_CLASSIFICATION) {
		for (uint32_t i = 0; i < v->count; i++) {
			if ((uint32_t)v->y[i].cls >= t->classes) {
				fb_log_error(
				    "%s: label %d of example %u is not "
				    "among the %u classes of the "
				    "training data %s (set classes to "
				    "name them all)",
				    spec->valid, (int)v->y[i].cls, i,
				    t->classes, spec->file);
				return FB_EFORMAT;
			}
		}
	}
	return FB_OK;
}

fb_err
fb_dataset_load(const fb_data_spec *spec, const fb_partition_spec *part,
    fb_dataset *train, fb_dataset *valid)
{
	fb_err rc = FB_OK;
	fb_dataset full, *vp = NULL;
	uint32_t *idx = NULL, n = 0;

	memset(&full, 0, sizeof(full));
	if (train == NULL || spec == NULL) {
		fb_log_error("dataset: load with no spec or no output");
		rc = FB_EINVAL;
		goto out;
	}
	memset(train, 0, sizeof(*train));
	if (valid != NULL) {
		memset(valid, 0, sizeof(*valid));
	}
	if ((rc = check_spec(spec)) != FB_OK) {
		goto out;
	}
	if ((rc = read_set(spec, spec->file, spec->labels, "file", "labels",
	         &full)) != FB_OK) {
		goto out;
	}
	if (valid != NULL && !empty(spec->valid)) {
		if ((rc = read_set(spec, spec->valid, spec->valid_labels,
		         "valid", "valid_labels", valid)) != FB_OK ||
		    (rc = same_columns(spec, &full, valid)) != FB_OK) {
			goto out;
		}
		vp = valid;
	}
	if (part != NULL) {
		uint32_t classes =
		    full.task == FB_TASK_REGRESSION ? 0 : full.classes;
		if ((rc = fb_partition_indices(full.y, full.count, classes,
		         part, &idx, &n)) != FB_OK ||
		    (rc = fb_dataset_subset(&full, idx, n, train)) != FB_OK) {
			goto out;
		}
		fb_dataset_fini(&full);
	} else {
		*train = full;
		memset(&full, 0, sizeof(full));
	}
	rc = normalize_sets(spec, train, vp);
out:
	fb_free(idx);
	fb_dataset_fini(&full);
	if (rc != FB_OK) {
		fb_dataset_fini(train);
		fb_dataset_fini(valid);
	}
	return rc;
}

fb_err
fb_data_spec_check(const fb_data_spec *spec, int used, const char *prefix,
    const char *file_key, const char *labels_key, const char *path)
{
	const char *fmt =
	    spec->format >= FB_DATA_CSV && spec->format <= FB_DATA_IDX
	        ? fb_data_format_names[spec->format]
	        : "?";
	int two_files =
	    spec->format == FB_DATA_NPY || spec->format == FB_DATA_IDX;

	if (!used) {
		if (!empty(spec->file) || !empty(spec->valid)) {
			fb_log_error("%s: %s.%s is set, but %s.dataset is not "
			             "files; set %s.dataset: files to use it",
			    path, prefix,
			    !empty(spec->file) ? file_key : "valid", prefix,
			    prefix);
			return FB_ECONFIG;
		}
		return FB_OK;
	}
	if (empty(spec->file)) {
		fb_log_error("%s: %s.dataset files needs %s.%s", path, prefix,
		    prefix, file_key);
		return FB_ECONFIG;
	}
	if (two_files && empty(spec->labels)) {
		fb_log_error("%s: %s.format %s needs %s.%s (the labels file)",
		    path, prefix, fmt, prefix, labels_key);
		return FB_ECONFIG;
	}
	if (two_files && !empty(spec->valid) && empty(spec->valid_labels)) {
		fb_log_error("%s: %s.format %s needs %s.valid_labels with "
		             "%s.valid",
		    path, prefix, fmt, prefix, prefix);
		return FB_ECONFIG;
	}
	if (spec->format == FB_DATA_CSV && empty(spec->label_column)) {
		fb_log_error("%s: %s.label_column is empty", path, prefix);
		return FB_ECONFIG;
	}
	if (spec->format == FB_DATA_IDX && spec->task == FB_TASK_REGRESSION) {
		fb_log_error("%s: %s.format idx holds class labels; regression "
		             "needs csv, npy or npz",
		    path, prefix);
		return FB_ECONFIG;
	}
	if (spec->normalize == FB_NORM_FILE && empty(spec->normalize_file)) {
		fb_log_error("%s: %s.normalize file needs %s.normalize_file",
		    path, prefix, prefix);
		return FB_ECONFIG;
	}
	if (spec->classes == 1 && spec->task == FB_TASK_CLASSIFICATION) {
		fb_log_error("%s: %s.classes 1: classification needs 2 or more "
		             "(or 0, from the labels)",
		    path, prefix);
		return FB_ECONFIG;
	}
	return FB_OK;
}

fb_err
fb_dataset_load_eval(const fb_data_spec *spec, fb_dataset *out)
{
	return fb_dataset_load(spec, NULL, out, NULL);
}

/* ---- what was done ------------------------------------------------------- */

typedef struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
sb_printf(sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int k;

	if (b->oom) {
		return;
	}
	for (;;) {
		va_start(ap, fmt);
		k = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (k < 0) {
			b->oom = 1;
			return;
		}
		if ((size_t)k < b->cap - b->len) {
			b->len += (size_t)k;
			return;
		}
		{
			void *p = b->p;
			size_t cap = b->cap;
			if (fb_data_grow(&p, &cap, b->len + (size_t)k + 1, 1) !=
			    FB_OK) {
				b->oom = 1;
				return;
			}
			b->p = p;
			b->cap = cap;
		}
	}
}

static void
sb_floats(sbuf *b, const float *v, uint32_t n)
{
	sb_printf(b, "[");
	for (uint32_t j = 0; j < n; j++) {
		sb_printf(b, "%s%.9g", j > 0 ? ", " : "", (double)v[j]);
	}
	sb_printf(b, "]");
}

/* all_same says whether v[0..n) are one value. */
static int
all_same(const float *v, uint32_t n)
{
	for (uint32_t j = 1; j < n; j++) {
		if (v[j] != v[0]) {
			return 0;
		}
	}
	return 1;
}

fb_err
fb_dataset_describe(const fb_data_spec *spec, const fb_dataset *ds, char **out)
{
	fb_err rc = FB_OK;
	sbuf b = {NULL, 0, 0, 0};
	int idx = ds != NULL && ds->format == FB_DATA_IDX;
	const char *v = idx ? "pixel / 255" : "v";
	const char *vj = idx ? "pixel[j] / 255" : "v[j]";

	if (out == NULL || ds == NULL || ds->dim == 0) {
		fb_log_error("dataset: nothing to describe");
		rc = FB_EINVAL;
		goto out;
	}
	*out = NULL;
	if ((b.p = fb_alloc(256)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	b.cap = 256;
	b.p[0] = '\0';
	sb_printf(
	    &b, "%s: %u features", fb_data_format_names[ds->format], ds->dim);
	if (ds->names != NULL) {
		sb_printf(&b, " (");
		for (uint32_t j = 0; j < ds->dim; j++) {
			sb_printf(
			    &b, "%s\"%s\"", j > 0 ? ", " : "", ds->names[j]);
		}
		sb_printf(&b, ") in this order");
	} else if (ds->format == FB_DATA_IDX) {
		sb_printf(&b, " (image pixels, row-major)");
	}
	switch (ds->norm) {
	case FB_NORM_NONE:
		sb_printf(&b, "; x = %s as stored (not normalised)", v);
		break;
	case FB_NORM_SCALAR:
		sb_printf(&b, "; x = (%s - %.9g) / %.9g for every feature", v,
		    (double)ds->mean[0], (double)ds->std[0]);
		break;
	default:
		if (all_same(ds->mean, ds->dim) && all_same(ds->std, ds->dim)) {
			sb_printf(&b,
			    "; x = (%s - %.9g) / %.9g for every "
			    "feature",
			    v, (double)ds->mean[0], (double)ds->std[0]);
		} else {
			sb_printf(&b,
			    "; x[j] = (%s - mean[j]) / std[j], "
			    "mean = ",
			    vj);
			sb_floats(&b, ds->mean, ds->dim);
			sb_printf(&b, ", std = ");
			sb_floats(&b, ds->std, ds->dim);
		}
		if (ds->norm == FB_NORM_OWN) {
			sb_printf(&b,
			    " (own: from this box's %u training "
			    "examples)",
			    ds->count);
		} else {
			sb_printf(&b, " (from %s)",
			    spec != NULL && !empty(spec->normalize_file)
			        ? spec->normalize_file
			        : "a normalisation file");
		}
		break;
	}
	if (ds->format == FB_DATA_CSV && spec != NULL &&
	    !empty(spec->label_column)) {
		sb_printf(&b, "; %s column \"%s\"",
		    ds->task == FB_TASK_REGRESSION ? "target" : "label",
		    spec->label_column);
	}
	if (ds->task == FB_TASK_REGRESSION) {
		sb_printf(&b, "; regression: one float target, mean squared "
		              "error");
	} else {
		sb_printf(&b, "; labels 0..%u", ds->classes - 1);
	}
	if (b.oom) {
		rc = FB_ENOMEM;
		goto out;
	}
	*out = b.p;
	b.p = NULL;
out:
	fb_free(b.p);
	return rc;
}

fb_err
fb_dataset_check_fit(
    const fb_dataset *ds, uint32_t input_dim, fb_task task, uint32_t classes)
{
	if (ds->dim != input_dim) {
		fb_log_error("dataset: %u features per example, but the model "
		             "takes %u",
		    ds->dim, input_dim);
		return FB_EINVAL;
	}
	if (ds->task != task) {
		fb_log_error("dataset: holds %s data, but the model is for %s",
		    fb_data_task_names[ds->task], fb_data_task_names[task]);
		return FB_EINVAL;
	}
	if (task == FB_TASK_REGRESSION) {
		return FB_OK;
	}
	for (uint32_t i = 0; i < ds->count; i++) {
		if (ds->y[i].cls < 0 || (uint32_t)ds->y[i].cls >= classes) {
			fb_log_error("dataset: label %d of example %u is out "
			             "of range: the model has %u classes "
			             "(0..%u)",
			    (int)ds->y[i].cls, i, classes, classes - 1);
			return FB_EINVAL;
		}
	}
	return FB_OK;
}
