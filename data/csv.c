/* SPDX-License-Identifier: Apache-2.0 */
/*
 * csv.c -- CSV data files and normalisation files into fb_dataset.
 *
 * A data file has a header row naming the columns, then one example per
 * row: the label column (data.label_column) and numeric feature columns
 * (data.features, or every other column); columns that are neither are
 * ignored and may hold anything. Fields are separated by commas and may be
 * double-quoted ("a, b", with "" for a quote); spaces around a field are
 * dropped; lines may end in CRLF; a UTF-8 byte-order mark and blank lines
 * are skipped. A quoted field cannot span lines.
 *
 * Every used value must be a finite decimal number within float32; a
 * ragged row, text, an empty field (a missing value), NaN or infinity is an
 * error naming file:line:column (the column counts bytes from 1, where the
 * field starts) and the column's name. Rows arrive one at a time into
 * buffers that grow as they fill, so memory follows the file's size.
 */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "data/data_impl.h"

#define ROLE_IGNORED (-1)
#define ROLE_LABEL (-2)
#define NAMES_SHOWN 12 /* header names listed in an error */

typedef struct csv_field {
	char *s;      /* NUL-terminated, unquoted, trimmed; in `line` */
	uint32_t col; /* byte column (from 1) where the field starts */
} csv_field;

typedef struct csv_file {
	const char *path;
	FILE *f;
	char *line; /* getline's buffer (malloc'd by libc) */
	size_t line_cap;
	uint32_t line_len; /* bytes of the current line, without EOL */
	uint64_t lineno;   /* of the current line, from 1 */
	csv_field *fields;
	size_t nfields;
	size_t fields_cap;
} csv_file;

static fb_err
csv_open(csv_file *r, const char *path)
{
	fb_err rc = FB_OK;

	memset(r, 0, sizeof(*r));
	r->path = path;
	if ((r->f = fopen(path, "rb")) == NULL) {
		fb_log_error("%s: cannot open: %s", path, strerror(errno));
		rc = FB_EIO;
	}
	return rc;
}

static void
csv_close(csv_file *r)
{
	if (r->f != NULL) {
		fclose(r->f);
	}
	free(r->line); /* getline's own allocation */
	fb_free(r->fields);
	memset(r, 0, sizeof(*r));
}

static fb_err
add_field(csv_file *r, char *s, size_t col)
{
	void *p = r->fields;

	if (fb_data_grow(&p, &r->fields_cap, r->nfields + 1,
	        sizeof(csv_field)) != FB_OK) {
		fb_log_error(
		    "%s: out of memory for the fields of line %" PRIu64,
		    r->path, r->lineno);
		return FB_ENOMEM;
	}
	r->fields = p;
	r->fields[r->nfields].s = s;
	r->fields[r->nfields].col = (uint32_t)(col + 1);
	r->nfields++;
	return FB_OK;
}

static int
is_blank(char c)
{
	return c == ' ' || c == '\t';
}

/*
 * split cuts the current line into fields in place: each field is
 * NUL-terminated where its separator or trailing blanks were, and quotes
 * are undone.
 */
static fb_err
split(csv_file *r, size_t start)
{
	fb_err rc = FB_OK;
	char *l = r->line;
	size_t n = r->line_len, pos = start;

	r->nfields = 0;
	for (;;) {
		size_t fstart, w, end;
		int more;

		while (pos < n && is_blank(l[pos])) {
			pos++;
		}
		fstart = pos;
		if (pos < n && l[pos] == '"') {
			w = ++pos;
			for (;;) {
				if (pos >= n) {
					fb_log_error(
					    "%s:%" PRIu64 ":%zu: quote "
					    "not closed on this line "
					    "(fields cannot span lines)",
					    r->path, r->lineno, fstart + 1);
					rc = FB_EFORMAT;
					goto out;
				}
				if (l[pos] == '"') {
					if (pos + 1 < n && l[pos + 1] == '"') {
						l[w++] = '"';
						pos += 2;
						continue;
					}
					pos++;
					break;
				}
				l[w++] = l[pos++];
			}
			end = w;
			while (pos < n && is_blank(l[pos])) {
				pos++;
			}
			if (pos < n && l[pos] != ',') {
				fb_log_error("%s:%" PRIu64 ":%zu: text after a "
				             "closing quote",
				    r->path, r->lineno, pos + 1);
				rc = FB_EFORMAT;
				goto out;
			}
			fstart++; /* the value starts after the quote */
		} else {
			while (pos < n && l[pos] != ',') {
				pos++;
			}
			end = pos;
			while (end > fstart && is_blank(l[end - 1])) {
				end--;
			}
		}
		more = pos < n && l[pos] == ',';
		l[end] = '\0';
		if ((rc = add_field(r, l + fstart, fstart)) != FB_OK) {
			goto out;
		}
		if (!more) {
			break;
		}
		pos++;
	}
out:
	return rc;
}

/*
 * csv_next reads the next line that is not blank and splits it; *eof is
 * set (and nothing read) at the end of the file.
 */
static fb_err
csv_next(csv_file *r, int *eof)
{
	fb_err rc = FB_OK;
	ssize_t got;
	size_t start;

	*eof = 0;
	for (;;) {
		errno = 0;
		got = getline(&r->line, &r->line_cap, r->f);
		if (got < 0) {
			if (ferror(r->f)) {
				fb_log_error("%s: read failed: %s", r->path,
				    errno != 0 ? strerror(errno) : "I/O error");
				rc = errno == ENOMEM ? FB_ENOMEM : FB_EIO;
			} else {
				*eof = 1;
			}
			goto out;
		}
		r->lineno++;
		if ((size_t)got > UINT32_MAX / 2) {
			fb_log_error("%s:%" PRIu64 ": line longer than 2 GiB",
			    r->path, r->lineno);
			rc = FB_EFORMAT;
			goto out;
		}
		while (got > 0 &&
		       (r->line[got - 1] == '\n' || r->line[got - 1] == '\r')) {
			got--;
		}
		r->line[got] = '\0';
		r->line_len = (uint32_t)got;
		if (memchr(r->line, '\0', (size_t)got) != NULL) {
			fb_log_error("%s:%" PRIu64
			             ": NUL byte in the line (not "
			             "a text file?)",
			    r->path, r->lineno);
			rc = FB_EFORMAT;
			goto out;
		}
		start = 0;
		if (r->lineno == 1 && got >= 3 &&
		    memcmp(r->line, "\xef\xbb\xbf", 3) == 0) {
			start = 3; /* UTF-8 byte-order mark */
		}
		{
			size_t k = start;
			while (k < (size_t)got && is_blank(r->line[k])) {
				k++;
			}
			if (k == (size_t)got) {
				continue; /* blank line */
			}
		}
		rc = split(r, start);
		goto out;
	}
out:
	return rc;
}

/* has_hex spots "0x..." that strtod would take but a CSV does not mean. */
static int
has_hex(const char *s)
{
	return strchr(s, 'x') != NULL || strchr(s, 'X') != NULL;
}

/*
 * parse_value reads field `f` of column `name` as a finite float32 number;
 * any problem is logged with file:line:column.
 */
static fb_err
parse_value(const csv_file *r, const csv_field *f, const char *name, double *v)
{
	char *end;

	if (f->s[0] == '\0') {
		fb_log_error("%s:%" PRIu64 ":%u: column \"%s\": empty value (a "
		             "missing value?)",
		    r->path, r->lineno, f->col, name);
		return FB_EFORMAT;
	}
	errno = 0;
	*v = strtod(f->s, &end);
	if (end == f->s || *end != '\0' || has_hex(f->s)) {
		fb_log_error("%s:%" PRIu64
		             ":%u: column \"%s\": \"%.40s\" is not "
		             "a number",
		    r->path, r->lineno, f->col, name, f->s);
		return FB_EFORMAT;
	}
	if (isnan(*v)) {
		fb_log_error("%s:%" PRIu64 ":%u: column \"%s\": NaN (a missing "
		             "value?) is not allowed",
		    r->path, r->lineno, f->col, name);
		return FB_EFORMAT;
	}
	if (isinf(*v) && errno != ERANGE) {
		fb_log_error("%s:%" PRIu64
		             ":%u: column \"%s\": infinity is not "
		             "allowed",
		    r->path, r->lineno, f->col, name);
		return FB_EFORMAT;
	}
	if (!isfinite(*v) || fabs(*v) > FLT_MAX) {
		fb_log_error("%s:%" PRIu64
		             ":%u: column \"%s\": %.40s is outside "
		             "the float32 range",
		    r->path, r->lineno, f->col, name, f->s);
		return FB_EFORMAT;
	}
	return FB_OK;
}

/* check_width reports a row whose field count differs from the header's. */
static fb_err
check_width(const csv_file *r, size_t want)
{
	uint32_t col;

	if (r->nfields == want) {
		return FB_OK;
	}
	col = r->nfields > want ? r->fields[want].col : r->line_len + 1;
	fb_log_error("%s:%" PRIu64 ":%u: row has %zu fields, the header has "
	             "%zu",
	    r->path, r->lineno, col, r->nfields, want);
	return FB_EFORMAT;
}

static char *
dup_str(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = fb_alloc(n);

	if (d != NULL) {
		memcpy(d, s, n);
	}
	return d;
}

/* log_header lists the header's names after a "no such column" error. */
static void
log_header(const csv_file *r, const char *const *names, size_t n)
{
	char buf[512];
	size_t used = 0;

	buf[0] = '\0';
	for (size_t c = 0; c < n && c < NAMES_SHOWN; c++) {
		int k = snprintf(buf + used, sizeof(buf) - used, "%s\"%s\"",
		    c > 0 ? ", " : "", names[c]);
		if (k < 0 || (size_t)k >= sizeof(buf) - used) {
			break;
		}
		used += (size_t)k;
	}
	fb_log_error("%s: the header's columns: %s%s", r->path, buf,
	    n > NAMES_SHOWN ? ", ..." : "");
}

/* find_name returns the header column named `name`, or -1. */
static long
find_name(char *const *hdr, size_t n, const char *name)
{
	for (size_t c = 0; c < n; c++) {
		if (strcmp(hdr[c], name) == 0) {
			return (long)c;
		}
	}
	return -1;
}

/*
 * map_columns gives each header column its role (ignored, label, or
 * feature index) and the feature names in order.
 */
static fb_err
map_columns(const csv_file *r, char *const *hdr, const uint32_t *hcol,
    size_t ncols, const fb_data_spec *spec, int *role, uint32_t *dim)
{
	const char *label = spec->label_column;
	long lc;
	uint32_t d = 0;

	if (label == NULL || label[0] == '\0') {
		fb_log_error(
		    "%s: no label column named (label_column)", r->path);
		return FB_EINVAL;
	}
	for (size_t c = 0; c < ncols; c++) {
		role[c] = ROLE_IGNORED;
	}
	if ((lc = find_name(hdr, ncols, label)) < 0) {
		fb_log_error("%s:1: no column \"%s\" (label_column) in the "
		             "header",
		    r->path, label);
		log_header(r, (const char *const *)hdr, ncols);
		return FB_EFORMAT;
	}
	role[lc] = ROLE_LABEL;
	if (spec->features.count > 0) {
		for (size_t i = 0; i < spec->features.count; i++) {
			const char *name = spec->features.v[i];
			long c = find_name(hdr, ncols, name);
			if (c < 0) {
				fb_log_error(
				    "%s:1: no column \"%s\" (listed in "
				    "features) in the header",
				    r->path, name);
				log_header(r, (const char *const *)hdr, ncols);
				return FB_EFORMAT;
			}
			if (role[c] == ROLE_LABEL) {
				fb_log_error(
				    "%s: column \"%s\" is the label "
				    "column; it cannot be a feature too",
				    r->path, name);
				return FB_EINVAL;
			}
			if (role[c] >= 0) {
				fb_log_error("%s: features lists \"%s\" twice",
				    r->path, name);
				return FB_EINVAL;
			}
			role[c] = (int)d++;
		}
	} else {
		for (size_t c = 0; c < ncols; c++) {
			if (role[c] == ROLE_LABEL) {
				continue;
			}
			if (hdr[c][0] == '\0') {
				fb_log_error(
				    "%s:1:%u: column %zu has no name in "
				    "the header (name it, or list the "
				    "feature columns in features)",
				    r->path, hcol[c], c + 1);
				return FB_EFORMAT;
			}
			role[c] = (int)d++;
		}
	}
	if (d == 0) {
		fb_log_error(
		    "%s:1: no feature columns besides the label \"%s\"",
		    r->path, label);
		return FB_EFORMAT;
	}
	/* A name used twice would make the choice of column a guess. */
	for (size_t c = 0; c < ncols; c++) {
		if (role[c] == ROLE_IGNORED) {
			continue;
		}
		for (size_t k = c + 1; k < ncols; k++) {
			if (strcmp(hdr[c], hdr[k]) == 0) {
				fb_log_error("%s:1:%u: column \"%s\" appears "
				             "twice in the header",
				    r->path, hcol[k], hdr[c]);
				return FB_EFORMAT;
			}
		}
	}
	*dim = d;
	return FB_OK;
}

typedef struct csv_header {
	char **names;   /* ncols heap copies */
	uint32_t *cols; /* byte column of each name */
	size_t ncols;
} csv_header;

static void
header_fini(csv_header *h)
{
	if (h->names != NULL) {
		for (size_t c = 0; c < h->ncols; c++) {
			fb_free(h->names[c]);
		}
	}
	fb_free(h->names);
	fb_free(h->cols);
	memset(h, 0, sizeof(*h));
}

/* read_header reads the first line as column names. */
static fb_err
read_header(csv_file *r, csv_header *h)
{
	fb_err rc = FB_OK;
	int eof = 0;

	memset(h, 0, sizeof(*h));
	if ((rc = csv_next(r, &eof)) != FB_OK) {
		goto out;
	}
	if (eof) {
		fb_log_error("%s: empty file (expected a header row)", r->path);
		rc = FB_EFORMAT;
		goto out;
	}
	h->ncols = r->nfields;
	h->names = fb_calloc(h->ncols, sizeof(char *));
	h->cols = fb_calloc(h->ncols, sizeof(uint32_t));
	if (h->names == NULL || h->cols == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (size_t c = 0; c < h->ncols; c++) {
		if ((h->names[c] = dup_str(r->fields[c].s)) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		h->cols[c] = r->fields[c].col;
	}
out:
	if (rc == FB_ENOMEM) {
		fb_log_error("%s: out of memory for the header", r->path);
	}
	if (rc != FB_OK) {
		header_fini(h);
	}
	return rc;
}

fb_err
fb_data_csv_read(const char *path, const fb_data_spec *spec, fb_dataset *out)
{
	fb_err rc = FB_OK;
	csv_file r;
	csv_header h = {NULL, NULL, 0};
	int *role = NULL;
	uint32_t dim = 0;
	void *x = NULL, *y = NULL;
	size_t xcap = 0, ycap = 0;
	uint32_t count = 0;
	char **names = NULL;
	int eof = 0;
	char why[128];

	memset(out, 0, sizeof(*out));
	if ((rc = csv_open(&r, path)) != FB_OK) {
		goto out;
	}
	if ((rc = read_header(&r, &h)) != FB_OK) {
		goto out;
	}
	if ((role = fb_calloc(h.ncols, sizeof(int))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if ((rc = map_columns(
	         &r, h.names, h.cols, h.ncols, spec, role, &dim)) != FB_OK) {
		goto out;
	}
	if ((names = fb_calloc(dim, sizeof(char *))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (size_t c = 0; c < h.ncols; c++) {
		if (role[c] >= 0 &&
		    (names[role[c]] = dup_str(h.names[c])) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
	}
	for (;;) {
		float *xr;
		if ((rc = csv_next(&r, &eof)) != FB_OK) {
			goto out;
		}
		if (eof) {
			break;
		}
		if ((rc = check_width(&r, h.ncols)) != FB_OK) {
			goto out;
		}
		if (count == FB_DATA_MAX_EXAMPLES ||
		    (uint64_t)(count + 1) * dim > FB_DATA_MAX_VALUES) {
			fb_log_error("%s:%" PRIu64 ": more examples than we "
			             "accept (%u rows of %u features)",
			    path, r.lineno, count, dim);
			rc = FB_EFORMAT;
			goto out;
		}
		if (fb_data_grow(&x, &xcap, (size_t)(count + 1) * dim,
		        sizeof(float)) != FB_OK ||
		    fb_data_grow(&y, &ycap, (size_t)count + 1,
		        sizeof(fb_label)) != FB_OK) {
			rc = FB_ENOMEM;
			goto out;
		}
		xr = (float *)x + (size_t)count * dim;
		for (size_t c = 0; c < h.ncols; c++) {
			double v;
			if (role[c] == ROLE_IGNORED) {
				continue;
			}
			if ((rc = parse_value(
			         &r, &r.fields[c], h.names[c], &v)) != FB_OK) {
				goto out;
			}
			if (role[c] >= 0) {
				xr[role[c]] = (float)v;
				continue;
			}
			if (!fb_data_label_check(v, spec->task, spec->classes,
			        why, sizeof(why))) {
				fb_log_error("%s:%" PRIu64 ":%u: label column "
				             "\"%s\": %s %s",
				    path, r.lineno, r.fields[c].col, h.names[c],
				    r.fields[c].s, why);
				rc = FB_EFORMAT;
				goto out;
			}
			fb_data_set_label(v, spec->task, (fb_label *)y + count);
		}
		count++;
	}
	if (count == 0) {
		fb_log_error("%s: no data rows after the header", path);
		rc = FB_EFORMAT;
		goto out;
	}
	out->count = count;
	out->dim = dim;
	out->task = (fb_task)spec->task;
	out->format = FB_DATA_CSV;
	out->norm = FB_NORM_NONE;
	out->raw_count = count;
	out->x = x;
	out->y = y;
	out->names = names;
	x = y = NULL;
	names = NULL;
	fb_data_finish_labels(out, spec->classes);
out:
	if (rc == FB_ENOMEM) {
		fb_log_error("%s: out of memory after %u rows", path, count);
	}
	if (names != NULL) {
		for (uint32_t j = 0; j < dim; j++) {
			fb_free(names[j]);
		}
		fb_free(names);
	}
	fb_free(x);
	fb_free(y);
	fb_free(role);
	header_fini(&h);
	csv_close(&r);
	return rc;
}

fb_err
fb_data_csv_read_norm(
    const char *path, const fb_dataset *ds, float *mean, float *std)
{
	fb_err rc = FB_OK;
	csv_file r;
	csv_header h = {NULL, NULL, 0};
	int seen_mean = 0, seen_std = 0, eof = 0;

	if ((rc = csv_open(&r, path)) != FB_OK) {
		goto out;
	}
	if ((rc = read_header(&r, &h)) != FB_OK) {
		goto out;
	}
	if (h.ncols != (size_t)ds->dim + 1) {
		fb_log_error("%s:1: %zu feature columns after the first, but "
		             "the data has %u features",
		    path, h.ncols - 1, ds->dim);
		rc = FB_EFORMAT;
		goto out;
	}
	for (uint32_t j = 0; j < ds->dim && ds->names != NULL; j++) {
		if (strcmp(h.names[j + 1], ds->names[j]) != 0) {
			fb_log_error("%s:1:%u: column \"%s\", but the data's "
			             "feature %u is \"%s\"",
			    path, h.cols[j + 1], h.names[j + 1], j + 1,
			    ds->names[j]);
			rc = FB_EFORMAT;
			goto out;
		}
	}
	for (;;) {
		float *dst;
		int is_std;
		if ((rc = csv_next(&r, &eof)) != FB_OK) {
			goto out;
		}
		if (eof) {
			break;
		}
		if ((rc = check_width(&r, h.ncols)) != FB_OK) {
			goto out;
		}
		if (strcmp(r.fields[0].s, "mean") == 0) {
			is_std = 0;
		} else if (strcmp(r.fields[0].s, "std") == 0) {
			is_std = 1;
		} else {
			fb_log_error("%s:%" PRIu64 ":%u: rows are \"mean\" and "
			             "\"std\", not \"%.40s\"",
			    path, r.lineno, r.fields[0].col, r.fields[0].s);
			rc = FB_EFORMAT;
			goto out;
		}
		if (is_std ? seen_std : seen_mean) {
			fb_log_error("%s:%" PRIu64 ": a second %s row", path,
			    r.lineno, is_std ? "std" : "mean");
			rc = FB_EFORMAT;
			goto out;
		}
		dst = is_std ? std : mean;
		for (uint32_t j = 0; j < ds->dim; j++) {
			double v;
			const csv_field *f = &r.fields[j + 1];
			if ((rc = parse_value(&r, f, h.names[j + 1], &v)) !=
			    FB_OK) {
				goto out;
			}
			if (is_std && !((float)v > 0.0f)) {
				fb_log_error("%s:%" PRIu64
				             ":%u: column \"%s\": "
				             "std %s must be > 0",
				    path, r.lineno, f->col, h.names[j + 1],
				    f->s);
				rc = FB_EFORMAT;
				goto out;
			}
			dst[j] = (float)v;
		}
		if (is_std) {
			seen_std = 1;
		} else {
			seen_mean = 1;
		}
	}
	if (!seen_mean || !seen_std) {
		fb_log_error("%s: no %s row", path, seen_mean ? "std" : "mean");
		rc = FB_EFORMAT;
		goto out;
	}
out:
	header_fini(&h);
	csv_close(&r);
	return rc;
}
