/* SPDX-License-Identifier: Apache-2.0 */
/*
 * npy.c -- NumPy .npy arrays into fb_dataset.
 *
 * A .npy file is the magic "\x93NUMPY", a version (1.0, 2.0 or 3.0), the
 * length of a header, the header (a Python dict literal such as
 * {'descr': '<f4', 'fortran_order': False, 'shape': (569, 30), }) and then
 * exactly the array's bytes. Features may be float32, float64 or uint8 in
 * either byte order, of shape (examples, ...) (the trailing dimensions are
 * flattened row-major; a 2-D array may be in Fortran order); labels are an
 * integer array of shape (examples,) or (examples, 1), or for regression
 * also float32/float64. Anything else, a size that does not match the
 * shape, or a NaN or infinity among the features, is refused with the
 * array's name. The header is parsed by a small reader of that literal
 * (strings, booleans, integer tuples), not evaluated.
 */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "data/data_impl.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_DIMS 8
#define NPY_MAX_HEADER (1u << 20) /* bytes of header text we accept */

typedef struct npy_header {
	char kind;     /* 'f', 'u', 'i', 'b' */
	int big;       /* big-endian elements */
	uint32_t size; /* bytes per element: 1, 2, 4, 8 */
	char descr[16];
	int fortran;
	uint32_t ndim;
	uint64_t shape[NPY_MAX_DIMS];
	size_t data_off; /* bytes before the elements */
} npy_header;

static uint64_t load_u(const uint8_t *p, uint32_t size, int big);

/* ---- the header literal -------------------------------------------------- */

typedef struct lit {
	const char *p, *end;
	const char *name; /* array, for messages */
} lit;

static void
lit_ws(lit *l)
{
	while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' ||
	                            *l->p == '\n' || *l->p == '\r')) {
		l->p++;
	}
}

static int
lit_accept(lit *l, char c)
{
	lit_ws(l);
	if (l->p < l->end && *l->p == c) {
		l->p++;
		return 1;
	}
	return 0;
}

/* lit_string reads '...' or "..." (no escapes: dtype names have none). */
static int
lit_string(lit *l, char *buf, size_t cap)
{
	char q;
	size_t n = 0;

	lit_ws(l);
	if (l->p >= l->end || (*l->p != '\'' && *l->p != '"')) {
		return 0;
	}
	q = *l->p++;
	while (l->p < l->end && *l->p != q) {
		if (*l->p == '\\' || n + 1 >= cap) {
			return 0;
		}
		buf[n++] = *l->p++;
	}
	if (l->p >= l->end) {
		return 0;
	}
	l->p++;
	buf[n] = '\0';
	return 1;
}

static int
lit_word(lit *l, const char *w)
{
	size_t n = strlen(w);

	lit_ws(l);
	if ((size_t)(l->end - l->p) >= n && memcmp(l->p, w, n) == 0) {
		l->p += n;
		return 1;
	}
	return 0;
}

static int
lit_uint(lit *l, uint64_t *v)
{
	uint64_t x = 0;
	int any = 0;

	lit_ws(l);
	while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
		uint64_t d = (uint64_t)(*l->p - '0');
		if (x > (UINT64_MAX - d) / 10) {
			return 0;
		}
		x = x * 10 + d;
		l->p++;
		any = 1;
	}
	/* Python 2 era headers wrote 569L. */
	if (any && l->p < l->end && *l->p == 'L') {
		l->p++;
	}
	*v = x;
	return any;
}

static fb_err
bad_header(const lit *l, const char *what)
{
	fb_log_error("%s: malformed .npy header (%s)", l->name, what);
	return FB_EFORMAT;
}

static fb_err
parse_descr(const char *name, const char *d, npy_header *h)
{
	size_t n = strlen(d);
	char order, kind;
	unsigned long size;
	char *end;

	if (n < 3) {
		goto bad;
	}
	order = d[0];
	kind = d[1];
	errno = 0;
	size = strtoul(d + 2, &end, 10);
	if (*end != '\0' || errno != 0 ||
	    (order != '<' && order != '>' && order != '|' && order != '=')) {
		goto bad;
	}
	if ((kind != 'f' && kind != 'u' && kind != 'i' && kind != 'b') ||
	    (size != 1 && size != 2 && size != 4 && size != 8) ||
	    (kind == 'f' && size < 4) || (kind == 'b' && size != 1)) {
		goto bad;
	}
	h->kind = kind;
	h->size = (uint32_t)size;
	h->big = order == '>';
	snprintf(h->descr, sizeof(h->descr), "%s", d);
	return FB_OK;
bad:
	fb_log_error("%s: dtype '%s' is not supported (features: float32, "
	             "float64 or uint8; labels: integers, or floats for "
	             "regression)",
	    name, d);
	return FB_EFORMAT;
}

static fb_err
parse_header(const uint8_t *buf, size_t len, const char *name, npy_header *h)
{
	fb_err rc = FB_OK;
	uint32_t hlen;
	size_t pre;
	lit l;
	int have_descr = 0, have_order = 0, have_shape = 0;
	char key[32], sval[64];

	memset(h, 0, sizeof(*h));
	if (len < 10 || memcmp(buf, NPY_MAGIC, 6) != 0) {
		fb_log_error(
		    "%s: not a .npy array (no \\x93NUMPY magic)", name);
		return FB_EFORMAT;
	}
	if (buf[6] == 1) {
		hlen = (uint32_t)buf[8] | (uint32_t)buf[9] << 8;
		pre = 10;
	} else if (buf[6] == 2 || buf[6] == 3) {
		if (len < 12) {
			fb_log_error("%s: truncated .npy header", name);
			return FB_EFORMAT;
		}
		hlen = (uint32_t)load_u(buf + 8, 4, 0);
		pre = 12;
	} else {
		fb_log_error("%s: .npy format version %u.%u is not supported "
		             "(1.0, 2.0, 3.0)",
		    name, buf[6], buf[7]);
		return FB_EFORMAT;
	}
	if (hlen > NPY_MAX_HEADER || hlen > len - pre) {
		fb_log_error("%s: truncated .npy header (%u bytes claimed, %zu "
		             "in the file)",
		    name, hlen, len - pre);
		return FB_EFORMAT;
	}
	h->data_off = pre + hlen;
	l.p = (const char *)buf + pre;
	l.end = l.p + hlen;
	l.name = name;
	if (!lit_accept(&l, '{')) {
		return bad_header(&l, "no '{'");
	}
	while (!lit_accept(&l, '}')) {
		if (!lit_string(&l, key, sizeof(key)) || !lit_accept(&l, ':')) {
			return bad_header(&l, "expected 'key':");
		}
		if (strcmp(key, "descr") == 0) {
			if (!lit_string(&l, sval, sizeof(sval))) {
				fb_log_error("%s: dtype is not a plain type "
				             "(structured arrays are not "
				             "supported)",
				    name);
				return FB_EFORMAT;
			}
			if ((rc = parse_descr(name, sval, h)) != FB_OK) {
				return rc;
			}
			have_descr = 1;
		} else if (strcmp(key, "fortran_order") == 0) {
			if (lit_word(&l, "True")) {
				h->fortran = 1;
			} else if (!lit_word(&l, "False")) {
				return bad_header(&l, "fortran_order");
			}
			have_order = 1;
		} else if (strcmp(key, "shape") == 0) {
			if (!lit_accept(&l, '(')) {
				return bad_header(&l, "shape is not a tuple");
			}
			while (!lit_accept(&l, ')')) {
				if (h->ndim == NPY_MAX_DIMS ||
				    !lit_uint(&l, &h->shape[h->ndim])) {
					return bad_header(&l, "shape");
				}
				h->ndim++;
				if (lit_accept(&l, ')')) {
					break;
				}
				if (!lit_accept(&l, ',')) {
					return bad_header(&l, "shape");
				}
			}
			have_shape = 1;
		} else {
			return bad_header(&l, "unknown key");
		}
		if (!lit_accept(&l, ',')) {
			if (!lit_accept(&l, '}')) {
				return bad_header(&l, "expected ',' or '}'");
			}
			break;
		}
	}
	if (!have_descr || !have_order || !have_shape) {
		return bad_header(&l, "descr, fortran_order or shape missing");
	}
	return FB_OK;
}

/* ---- elements ------------------------------------------------------------ */

static uint64_t
load_u(const uint8_t *p, uint32_t size, int big)
{
	uint64_t v = 0;

	for (uint32_t b = 0; b < size; b++) {
		uint32_t k = big ? b : size - 1 - b;
		v = v << 8 | p[k];
	}
	return v;
}

/* element reads element `i` as a double (exact for every integer that can
 * be a label and for every float). */
static double
element(const npy_header *h, const uint8_t *data, uint64_t i)
{
	const uint8_t *p = data + i * h->size;
	uint64_t u = load_u(p, h->size, h->big);

	switch (h->kind) {
	case 'f':
		if (h->size == 4) {
			uint32_t w = (uint32_t)u;
			float f;
			memcpy(&f, &w, 4);
			return f;
		} else {
			double d;
			memcpy(&d, &u, 8);
			return d;
		}
	case 'i': {
		uint32_t bits = 8 * h->size;
		if (bits < 64 && (u >> (bits - 1)) != 0) {
			return (
			    double)(int64_t)(u | ~((UINT64_C(1) << bits) - 1));
		}
		return (double)(int64_t)u;
	}
	default: /* 'u', 'b' */
		return (double)u;
	}
}

static void
format_shape(const npy_header *h, char *buf, size_t cap)
{
	size_t used = 0;

	buf[0] = '\0';
	used += (size_t)snprintf(buf, cap, "(");
	for (uint32_t d = 0; d < h->ndim && used < cap; d++) {
		used += (size_t)snprintf(buf + used, cap - used, "%s%" PRIu64,
		    d > 0 ? ", " : "", h->shape[d]);
	}
	if (used < cap) {
		snprintf(buf + used, cap - used, h->ndim == 1 ? ",)" : ")");
	}
}

fb_err
fb_data_npy_parse(const uint8_t *buf, size_t len, const char *name, int labels,
    const fb_data_spec *spec, fb_dataset *out)
{
	fb_err rc = FB_OK;
	npy_header h;
	uint64_t count, per = 1, total, bytes;
	const uint8_t *data;
	char shape[128];
	char why[128];
	float *x = NULL;
	fb_label *y = NULL;

	if ((rc = parse_header(buf, len, name, &h)) != FB_OK) {
		goto out;
	}
	format_shape(&h, shape, sizeof(shape));
	if (labels) {
		if (h.ndim != 1 && !(h.ndim == 2 && h.shape[1] == 1)) {
			fb_log_error("%s (labels): shape %s; labels need shape "
			             "(examples,)",
			    name, shape);
			rc = FB_EFORMAT;
			goto out;
		}
		if (h.kind == 'f' && spec->task != FB_TASK_REGRESSION) {
			fb_log_error("%s (labels): dtype '%s' is floating "
			             "point; classification needs integer "
			             "labels (or task regression)",
			    name, h.descr);
			rc = FB_EFORMAT;
			goto out;
		}
	} else {
		if (h.ndim < 2) {
			fb_log_error("%s (features): shape %s; features need "
			             "shape (examples, features), e.g. "
			             "x.reshape(-1, 1) for one feature",
			    name, shape);
			rc = FB_EFORMAT;
			goto out;
		}
		if (h.kind == 'i' || h.kind == 'b' ||
		    (h.kind == 'u' && h.size != 1)) {
			fb_log_error("%s (features): dtype '%s' is not "
			             "supported (float32, float64 or uint8)",
			    name, h.descr);
			rc = FB_EFORMAT;
			goto out;
		}
		if (h.fortran && h.ndim > 2) {
			fb_log_error("%s (features): Fortran order with %u "
			             "dimensions is not supported (save it "
			             "with np.ascontiguousarray)",
			    name, h.ndim);
			rc = FB_EFORMAT;
			goto out;
		}
	}
	count = h.shape[0];
	for (uint32_t d = 1; d < h.ndim; d++) {
		if (h.shape[d] != 0 && per > FB_DATA_MAX_VALUES / h.shape[d]) {
			per = FB_DATA_MAX_VALUES + 1;
			break;
		}
		per *= h.shape[d];
	}
	if (count == 0 || per == 0) {
		fb_log_error("%s: shape %s holds no examples", name, shape);
		rc = FB_EFORMAT;
		goto out;
	}
	if (count > FB_DATA_MAX_EXAMPLES || per > FB_DATA_MAX_VALUES ||
	    count * per > FB_DATA_MAX_VALUES) {
		fb_log_error(
		    "%s: shape %s is more than we accept", name, shape);
		rc = FB_EFORMAT;
		goto out;
	}
	total = count * per;
	bytes = total * h.size;
	if (len - h.data_off != bytes) {
		fb_log_error("%s: shape %s of '%s' is %" PRIu64 " bytes, but "
		             "%zu follow the header (%s)",
		    name, shape, h.descr, bytes, len - h.data_off,
		    len - h.data_off < bytes ? "truncated" : "trailing bytes");
		rc = FB_EFORMAT;
		goto out;
	}
	data = buf + h.data_off;
	if (labels) {
		if ((y = fb_alloc((size_t)count * sizeof(*y))) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		for (uint64_t i = 0; i < count; i++) {
			double v = element(&h, data, i);
			if (!fb_data_label_check(v, spec->task, spec->classes,
			        why, sizeof(why))) {
				fb_log_error("%s (labels): element %" PRIu64
				             " is %.17g: it %s",
				    name, i, v, why);
				rc = FB_EFORMAT;
				goto out;
			}
			fb_data_set_label(v, spec->task, &y[i]);
		}
		out->y = y;
		y = NULL;
		out->count = (uint32_t)count;
		goto out;
	}
	if ((x = fb_alloc((size_t)total * sizeof(float))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < count; i++) {
		for (uint64_t j = 0; j < per; j++) {
			/* Fortran order: (i, j) is element j * count + i. */
			uint64_t k = h.fortran ? j * count + i : i * per + j;
			double v = element(&h, data, k);
			if (!isfinite(v) || fabs(v) > FLT_MAX) {
				fb_log_error("%s (features): element [%" PRIu64
				             ", %" PRIu64 "] is %s",
				    name, i, j,
				    isnan(v)   ? "NaN"
				    : isinf(v) ? "infinite"
				               : "outside the float32 range");
				rc = FB_EFORMAT;
				goto out;
			}
			x[i * per + j] = (float)v;
		}
	}
	out->x = x;
	x = NULL;
	out->count = (uint32_t)count;
	out->dim = (uint32_t)per;
out:
	if (rc == FB_ENOMEM) {
		fb_log_error("%s: out of memory", name);
	}
	fb_free(x);
	fb_free(y);
	return rc;
}

/* ---- files --------------------------------------------------------------- */

/* read_file reads a whole regular file into a new fb_alloc buffer. */
static fb_err
read_file(const char *path, uint8_t **buf, size_t *len)
{
	fb_err rc = FB_OK;
	struct stat st;
	int fd;
	size_t got = 0;

	*buf = NULL;
	*len = 0;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		fb_log_error("%s: cannot open: %s", path, strerror(errno));
		return FB_EIO;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		fb_log_error("%s: not a regular file", path);
		rc = FB_EIO;
		goto out;
	}
	if ((uint64_t)st.st_size > SIZE_MAX - 1 ||
	    (*buf = fb_alloc((size_t)st.st_size + 1)) == NULL) {
		fb_log_error("%s: out of memory for %lld bytes", path,
		    (long long)st.st_size);
		rc = FB_ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, *buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0) {
			fb_log_error("%s: read failed: %s", path,
			    n < 0 ? strerror(errno) : "file shrank");
			rc = FB_EIO;
			goto out;
		}
		got += (size_t)n;
	}
	*len = got;
out:
	if (rc != FB_OK) {
		fb_free(*buf);
		*buf = NULL;
	}
	close(fd);
	return rc;
}

fb_err
fb_data_npy_join(const char *xname, fb_dataset *xs, const char *yname,
    fb_dataset *ys, const fb_data_spec *spec, fb_dataset *out)
{
	if (xs->count != ys->count) {
		fb_log_error("%s has %u examples but %s has %u labels", xname,
		    xs->count, yname, ys->count);
		return FB_EFORMAT;
	}
	out->count = xs->count;
	out->dim = xs->dim;
	out->x = xs->x;
	out->y = ys->y;
	xs->x = NULL;
	ys->y = NULL;
	out->task = (fb_task)spec->task;
	out->norm = FB_NORM_NONE;
	out->raw_count = out->count;
	fb_data_finish_labels(out, spec->classes);
	return FB_OK;
}

fb_err
fb_data_npy_read(const char *x_path, const char *y_path,
    const fb_data_spec *spec, fb_dataset *out)
{
	fb_err rc = FB_OK;
	uint8_t *buf = NULL;
	size_t len = 0;
	fb_dataset xs, ys;

	memset(&xs, 0, sizeof(xs));
	memset(&ys, 0, sizeof(ys));
	memset(out, 0, sizeof(*out));
	if ((rc = read_file(x_path, &buf, &len)) != FB_OK ||
	    (rc = fb_data_npy_parse(buf, len, x_path, 0, spec, &xs)) != FB_OK) {
		goto out;
	}
	fb_free(buf);
	buf = NULL;
	if ((rc = read_file(y_path, &buf, &len)) != FB_OK ||
	    (rc = fb_data_npy_parse(buf, len, y_path, 1, spec, &ys)) != FB_OK) {
		goto out;
	}
	if ((rc = fb_data_npy_join(x_path, &xs, y_path, &ys, spec, out)) !=
	    FB_OK) {
		goto out;
	}
	out->format = FB_DATA_NPY;
out:
	fb_free(buf);
	fb_free(xs.x);
	fb_free(ys.y);
	return rc;
}
