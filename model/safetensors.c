/* SPDX-License-Identifier: Apache-2.0 */
/*
 * safetensors.c -- model files in the safetensors format, so that PyTorch
 * and numpy users load fedbox models directly.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"__metadata__": {"k": "v"}, "fc1.weight": {"dtype": "F32", "shape":
 * [128, 784], "data_offsets": [begin, end]}, ...}, padded with spaces to a
 * multiple of 8), then the raw little-endian tensor data. Writing never
 * copies the parameters: they are one vector already in tensor order. The
 * reader has its own small strict JSON parser and checks every tensor
 * against the model's layout; tensors may appear in any order in the
 * header and the data (as files written by other tools do) but must tile
 * the data region exactly.
 *
 * fb_safetensors_read_init reads an initial model (model.arch: init) with
 * no model to check against: the file itself is the layout. It reads the
 * whole header (at most FB_MODEL_INIT_HEADER_MAX bytes) before it trusts
 * any of it, checks each entry's dtype, shape and bytes, that the entries
 * tile the data region, then reads the values; on any error it hands back
 * nothing.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes host floats as little-endian data"
#endif

#define HEADER_MAX (100u << 20) /* the format's own limit: 100 MB */
#define META_VALUE_MAX 64

/* ---- writing ---------------------------------------------------------- */

typedef struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
} sbuf;

static void
sb_putn(sbuf *b, const char *s, size_t n)
{
	if (b->oom) {
		return;
	}
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 1024;
		char *p;
		while (cap < b->len + n + 1) {
			cap *= 2;
		}
		if ((p = realloc(b->p, cap)) == NULL) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void
sb_puts(sbuf *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

static void __attribute__((format(printf, 2, 3)))
sb_printf(sbuf *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	int k;

	va_start(ap, fmt);
	k = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	FB_ASSERT(k >= 0 && (size_t)k < sizeof(tmp));
	sb_putn(b, tmp, (size_t)k);
}

/* sb_json_string writes `s` as a JSON string literal. */
static void
sb_json_string(sbuf *b, const char *s)
{
	sb_putn(b, "\"", 1);
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			char esc[2] = {'\\', (char)c};
			sb_putn(b, esc, 2);
		} else if (c == '\n') {
			sb_puts(b, "\\n");
		} else if (c == '\t') {
			sb_puts(b, "\\t");
		} else if (c == '\r') {
			sb_puts(b, "\\r");
		} else if (c < 0x20 || c == 0x7f) {
			sb_printf(b, "\\u%04x", c);
		} else {
			sb_putn(b, (const char *)&c, 1);
		}
	}
	sb_putn(b, "\"", 1);
}

fb_err
fb_model_save_safetensors(const fb_model *m, const float *params,
    const char *path, const char *const (*meta)[2], size_t meta_count)
{
	fb_err rc = FB_OK;
	sbuf h = {0};
	uint8_t len8[8];
	uint32_t n = fb_model_tensor_count(m);
	fb_tensor_info ti;
	fb_iovec pieces[3];

	sb_puts(&h, "{");
	if (meta_count > 0) {
		sb_puts(&h, "\"__metadata__\":{");
		for (size_t i = 0; i < meta_count; i++) {
			sb_puts(&h, i > 0 ? "," : "");
			sb_json_string(&h, meta[i][0]);
			sb_puts(&h, ":");
			sb_json_string(&h, meta[i][1]);
		}
		sb_puts(&h, "}");
	}
	for (uint32_t i = 0; i < n; i++) {
		fb_model_tensor_info(m, i, &ti);
		sb_puts(&h, i > 0 || meta_count > 0 ? "," : "");
		sb_json_string(&h, ti.name);
		sb_puts(&h, ":{\"dtype\":\"F32\",\"shape\":[");
		for (uint32_t d = 0; d < ti.ndim; d++) {
			sb_printf(
			    &h, "%s%" PRIu64, d > 0 ? "," : "", ti.shape[d]);
		}
		sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
		    ti.offset * 4, (ti.offset + ti.count) * 4);
	}
	sb_puts(&h, "}");
	while (!h.oom && h.len % 8 != 0) {
		sb_puts(&h, " ");
	}
	if (h.oom) {
		rc = FB_ENOMEM;
		goto out;
	}
	fb_store_le64(len8, h.len);
	pieces[0] = (fb_iovec){len8, sizeof(len8)};
	pieces[1] = (fb_iovec){h.p, h.len};
	pieces[2] =
	    (fb_iovec){params, (size_t)fb_model_param_count(m) * sizeof(float)};
	rc = fb_file_write_atomic(path, pieces, 3);
out:
	free(h.p);
	return rc;
}

/* ---- reading ---------------------------------------------------------- */

typedef struct parser {
	const char *p, *start, *end;
	const char *path;
	const char *what; /* what the file is not, for errors */
} parser;

/* One tensor entry of a header, as written. */
typedef struct st_entry {
	char name[FB_TENSOR_NAME_MAX];
	int long_name; /* the name did not fit: cut */
	char dtype[16];
	int long_dtype;
	uint32_t ndim; /* 0..8 */
	uint64_t shape[8];
	uint64_t begin, end; /* byte offsets in the data region */
} st_entry;

/* Per model tensor: what the header said about it. */
typedef struct seen {
	int found;
	uint64_t begin; /* byte offset in the data region */
	uint64_t len;   /* bytes */
} seen;

static fb_err __attribute__((format(printf, 2, 3)))
bad(const parser *ps, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fb_log_error("%s: %s: %s (header byte %zu)", ps->path, ps->what, msg,
	    (size_t)(ps->p - ps->start));
	return FB_EFORMAT;
}
static void
skip_ws(parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' ||
	                              *ps->p == '\n' || *ps->p == '\r')) {
		ps->p++;
	}
}

/* accept consumes `c` (after whitespace) if it is next. */
static int
accept(parser *ps, char c)
{
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == c) {
		ps->p++;
		return 1;
	}
	return 0;
}

static fb_err
expect(parser *ps, char c)
{
	if (!accept(ps, c)) {
		return bad(ps, "expected '%c'", c);
	}
	return FB_OK;
}

static int
hexval(char c)
{
	if (c >= '0' && c <= '9') {
		return c - '0';
	}
	if (c >= 'a' && c <= 'f') {
		return c - 'a' + 10;
	}
	if (c >= 'A' && c <= 'F') {
		return c - 'A' + 10;
	}
	return -1;
}

/*
 * parse_string decodes a JSON string into buf (cap bytes, NUL-terminated);
 * *too_long is set when it did not fit (the rest is still consumed).
 */
static fb_err
parse_string(parser *ps, char *buf, size_t cap, int *too_long)
{
	size_t n = 0;

	*too_long = 0;
	buf[0] = '\0';
	if (!accept(ps, '"')) {
		return bad(ps, "expected a string");
	}
	for (;;) {
		char out[4];
		size_t k = 1;
		unsigned char c;
		if (ps->p >= ps->end) {
			return bad(ps, "unterminated string");
		}
		c = (unsigned char)*ps->p++;
		if (c == '"') {
			break;
		}
		if (c < 0x20) {
			return bad(ps, "control character in a string");
		}
		out[0] = (char)c;
		if (c == '\\') {
			if (ps->p >= ps->end) {
				return bad(ps, "unterminated string");
			}
			c = (unsigned char)*ps->p++;
			switch (c) {
			case '"':
			case '\\':
			case '/':
				out[0] = (char)c;
				break;
			case 'b':
				out[0] = '\b';
				break;
			case 'f':
				out[0] = '\f';
				break;
			case 'n':
				out[0] = '\n';
				break;
			case 'r':
				out[0] = '\r';
				break;
			case 't':
				out[0] = '\t';
				break;
			case 'u': {
				unsigned v = 0;
				for (int i = 0; i < 4; i++) {
					int h;
					if (ps->p >= ps->end ||
					    (h = hexval(*ps->p)) < 0) {
						return bad(
						    ps, "bad \\u escape");
					}
					v = v * 16 + (unsigned)h;
					ps->p++;
				}
				/* UTF-8 of the code unit (surrogates are
				 * kept as they are: names are ASCII). */
				if (v < 0x80) {
					out[0] = (char)v;
				} else if (v < 0x800) {
					out[0] = (char)(0xc0 | (v >> 6));
					out[1] = (char)(0x80 | (v & 0x3f));
					k = 2;
				} else {
					out[0] = (char)(0xe0 | (v >> 12));
					out[1] =
					    (char)(0x80 | ((v >> 6) & 0x3f));
					out[2] = (char)(0x80 | (v & 0x3f));
					k = 3;
				}
				break;
			}
			default:
				return bad(ps, "bad escape \\%c", c);
			}
		}
		if (n + k < cap) {
			memcpy(buf + n, out, k);
			n += k;
			buf[n] = '\0';
		} else {
			*too_long = 1;
		}
	}
	return FB_OK;
}

/* parse_u64 reads a non-negative integer below 2^53. */
static fb_err
parse_u64(parser *ps, uint64_t *v)
{
	uint64_t x = 0;
	const char *s;

	skip_ws(ps);
	s = ps->p;
	while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
		x = x * 10 + (uint64_t)(*ps->p - '0');
		if (x >= ((uint64_t)1 << 53)) {
			return bad(ps, "number too large");
		}
		ps->p++;
	}
	if (ps->p == s || (ps->p - s > 1 && *s == '0')) {
		return bad(ps, "expected a non-negative integer");
	}
	*v = x;
	return FB_OK;
}

/* parse_u64_array reads [a, b, ...] of at most `cap` numbers. */
static fb_err
parse_u64_array(parser *ps, uint64_t *v, uint32_t cap, uint32_t *count)
{
	fb_err rc;

	*count = 0;
	if ((rc = expect(ps, '[')) != FB_OK) {
		return rc;
	}
	if (accept(ps, ']')) {
		return FB_OK;
	}
	do {
		uint64_t x = 0;
		if ((rc = parse_u64(ps, &x)) != FB_OK) {
			return rc;
		}
		if (*count >= cap) {
			return bad(ps, "array longer than %u", cap);
		}
		v[(*count)++] = x;
	} while (accept(ps, ','));
	return expect(ps, ']');
}

static fb_err
parse_metadata(parser *ps, uint32_t *round)
{
	fb_err rc;
	char key[64], val[META_VALUE_MAX];
	int long_key, long_val;

	if ((rc = expect(ps, '{')) != FB_OK) {
		return rc;
	}
	if (accept(ps, '}')) {
		return FB_OK;
	}
	do {
		if ((rc = parse_string(ps, key, sizeof(key), &long_key)) !=
		        FB_OK ||
		    (rc = expect(ps, ':')) != FB_OK ||
		    (rc = parse_string(ps, val, sizeof(val), &long_val)) !=
		        FB_OK) {
			return rc;
		}
		if (!long_key && strcmp(key, "fedbox.round") == 0) {
			char *end;
			unsigned long long r;
			errno = 0;
			r = strtoull(val, &end, 10);
			if (long_val || val[0] < '0' || val[0] > '9' ||
			    *end != '\0' || errno != 0 || r > UINT32_MAX) {
				return bad(ps,
				    "fedbox.round \"%s\" is not a "
				    "round number",
				    val);
			}
			*round = (uint32_t)r;
		}
	} while (accept(ps, ','));
	return expect(ps, '}');
}

static void
format_shape(char *buf, size_t len, const uint64_t *shape, uint32_t ndim)
{
	size_t used = 0;

	buf[0] = '\0';
	for (uint32_t d = 0; d < ndim && used < len; d++) {
		int k = snprintf(buf + used, len - used, "%s%" PRIu64,
		    d > 0 ? ", " : "", shape[d]);
		if (k < 0) {
			break;
		}
		used += (size_t)k;
	}
}

/*
 * parse_entry reads one tensor entry's object: its dtype, shape (at most 8
 * dimensions) and data_offsets, each exactly once; nothing is checked
 * against a model here.
 */
static fb_err
parse_entry(parser *ps, st_entry *e)
{
	fb_err rc;
	char key[32];
	int long_key;
	uint64_t offs[2];
	uint32_t noffs = 0;
	int have_dtype = 0, have_shape = 0, have_offs = 0;

	if ((rc = expect(ps, '{')) != FB_OK) {
		return rc;
	}
	do {
		if ((rc = parse_string(ps, key, sizeof(key), &long_key)) !=
		        FB_OK ||
		    (rc = expect(ps, ':')) != FB_OK) {
			return rc;
		}
		if (!long_key && strcmp(key, "dtype") == 0 && !have_dtype) {
			rc = parse_string(
			    ps, e->dtype, sizeof(e->dtype), &e->long_dtype);
			if (rc != FB_OK) {
				return rc;
			}
			have_dtype = 1;
		} else if (!long_key && strcmp(key, "shape") == 0 &&
		           !have_shape) {
			rc = parse_u64_array(ps, e->shape, 8, &e->ndim);
			if (rc != FB_OK) {
				return rc;
			}
			have_shape = 1;
		} else if (!long_key && strcmp(key, "data_offsets") == 0 &&
		           !have_offs) {
			rc = parse_u64_array(ps, offs, 2, &noffs);
			if (rc != FB_OK) {
				return rc;
			}
			if (noffs != 2 || offs[1] < offs[0]) {
				return bad(ps,
				    "tensor %s has bad "
				    "data_offsets",
				    e->name);
			}
			have_offs = 1;
		} else {
			return bad(ps,
			    "tensor %s: unexpected or repeated "
			    "key \"%s\"",
			    e->name, key);
		}
	} while (accept(ps, ','));
	if ((rc = expect(ps, '}')) != FB_OK) {
		return rc;
	}
	if (!have_dtype || !have_shape || !have_offs) {
		return bad(ps, "tensor %s lacks dtype, shape or data_offsets",
		    e->name);
	}
	e->begin = offs[0];
	e->end = offs[1];
	return FB_OK;
}

/*
 * parse_entries parses the whole header: the metadata (its fedbox.round
 * into *round) and each tensor entry, handed to `cb` as it is read.
 */
static fb_err
parse_entries(parser *ps, fb_err (*cb)(parser *, void *, const st_entry *),
    void *ctx, uint32_t *round)
{
	fb_err rc;
	int have_meta = 0;
	st_entry e;

	if ((rc = expect(ps, '{')) != FB_OK) {
		return rc;
	}
	if (!accept(ps, '}')) {
		do {
			memset(&e, 0, sizeof(e));
			rc = parse_string(
			    ps, e.name, sizeof(e.name), &e.long_name);
			if (rc != FB_OK || (rc = expect(ps, ':')) != FB_OK) {
				return rc;
			}
			if (!e.long_name &&
			    strcmp(e.name, "__metadata__") == 0 &&
			    !have_meta) {
				have_meta = 1;
				if ((rc = parse_metadata(ps, round)) != FB_OK) {
					return rc;
				}
				continue;
			}
			if ((rc = parse_entry(ps, &e)) != FB_OK ||
			    (rc = cb(ps, ctx, &e)) != FB_OK) {
				return rc;
			}
		} while (accept(ps, ','));
		if ((rc = expect(ps, '}')) != FB_OK) {
			return rc;
		}
	}
	skip_ws(ps);
	if (ps->p != ps->end) {
		return bad(ps, "trailing bytes after the header object");
	}
	return FB_OK;
}

/* What a model file's tensors are checked against: the model's layout. */
typedef struct match_ctx {
	const fb_model *m;
	seen *sn; /* one per model tensor */
} match_ctx;

/* match_entry checks one entry against the model tensor of its name. */
static fb_err
match_entry(parser *ps, void *ctx, const st_entry *e)
{
	match_ctx *mc = ctx;
	uint32_t n = fb_model_tensor_count(mc->m), i;
	fb_tensor_info ti;

	for (i = 0; i < n; i++) {
		fb_model_tensor_info(mc->m, i, &ti);
		if (!e->long_name && strcmp(ti.name, e->name) == 0) {
			break;
		}
	}
	if (i == n) {
		return bad(ps, "unexpected tensor \"%s%s\"", e->name,
		    e->long_name ? "..." : "");
	}
	if (mc->sn[i].found) {
		return bad(ps, "tensor %s appears twice", e->name);
	}
	if (e->long_dtype || strcmp(e->dtype, "F32") != 0) {
		return bad(ps, "tensor %s has dtype %s, expected F32", e->name,
		    e->dtype);
	}
	if (e->ndim != ti.ndim ||
	    memcmp(e->shape, ti.shape, e->ndim * sizeof(uint64_t)) != 0) {
		char got[128], want[128];
		format_shape(got, sizeof(got), e->shape, e->ndim);
		format_shape(want, sizeof(want), ti.shape, ti.ndim);
		return bad(ps, "tensor %s has shape [%s], expected [%s]",
		    e->name, got, want);
	}
	if (e->end - e->begin != ti.count * 4) {
		return bad(ps,
		    "tensor %s holds %" PRIu64 " bytes, expected "
		    "%" PRIu64,
		    e->name, e->end - e->begin, ti.count * 4);
	}
	mc->sn[i].found = 1;
	mc->sn[i].begin = e->begin;
	mc->sn[i].len = e->end - e->begin;
	return FB_OK;
}

static int
cmp_begin(const void *a, const void *b)
{
	const seen *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* parse_header parses the whole header and fills `sn` (one per tensor). */
static fb_err
parse_header(parser *ps, const fb_model *m, seen *sn, uint32_t *round)
{
	fb_err rc;
	uint32_t n = fb_model_tensor_count(m);
	match_ctx mc = {m, sn};
	fb_tensor_info ti;

	if ((rc = parse_entries(ps, match_entry, &mc, round)) != FB_OK) {
		return rc;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!sn[i].found) {
			fb_model_tensor_info(m, i, &ti);
			return bad(ps, "tensor %s is missing", ti.name);
		}
	}
	return FB_OK;
}

/*
 * Open path and read its safetensors header: the 8-byte little-endian
 * length, then that many bytes into *hdr (fb_alloc'd; the caller frees
 * it and closes *fp, set even on failure once the file opened). Refuses a
 * file that is not regular, shorter than 8 bytes, or whose header length
 * is below 2, above max or past the file's end, each logged with the
 * path; who prefixes the "cannot open" error (a config key, or "").
 */
static fb_err
read_header(const char *path, const char *who, uint64_t max, FILE **fp,
    struct stat *st, char **hdr, uint64_t *hlen)
{
	uint8_t len8[8];
	FILE *f;

	*hdr = NULL;
	f = *fp = fopen(path, "rb");
	if (f == NULL || fstat(fileno(f), st) != 0) {
		fb_log_error("%scannot open %s: %s", who, path,
		    strerror(errno));
		return FB_EIO;
	}
	if (!S_ISREG(st->st_mode)) {
		fb_log_error("%s%s is not a regular file", who, path);
		return FB_EFORMAT;
	}
	if (st->st_size < 8 || fread(len8, 1, 8, f) != 8) {
		fb_log_error("%s: not a safetensors file: shorter than its "
		             "8-byte header length",
		    path);
		return FB_EFORMAT;
	}
	*hlen = fb_load_le64(len8);
	if (*hlen > (uint64_t)st->st_size - 8 || *hlen > max || *hlen < 2) {
		fb_log_error("%s: not a safetensors file: header length "
		             "%" PRIu64 " (the file holds %lld bytes; at most "
		             "%" PRIu64 " accepted)",
		    path, *hlen, (long long)st->st_size, max);
		return FB_EFORMAT;
	}
	if ((*hdr = fb_alloc((size_t)*hlen)) == NULL) {
		return FB_ENOMEM;
	}
	if (fread(*hdr, 1, (size_t)*hlen, f) != *hlen) {
		fb_log_error("%s: cannot read the header: %s", path,
		    ferror(f) ? strerror(errno) : "file shrank");
		return FB_EIO;
	}
	return FB_OK;
}

fb_err
fb_model_load_safetensors(
    const fb_model *m, const char *path, float *params, uint32_t *round)
{
	fb_err rc = FB_OK;
	FILE *f = NULL;
	char *hdr = NULL;
	seen *sn = NULL, *sorted = NULL;
	uint64_t hlen, data_len, want;
	uint32_t n = fb_model_tensor_count(m), found_round = 0;
	struct stat st;
	parser ps = {0};

	if (round != NULL) {
		*round = 0;
	}
	if ((rc = read_header(path, "", HEADER_MAX, &f, &st, &hdr, &hlen)) !=
	    FB_OK) {
		goto out;
	}
	sn = fb_calloc(n, sizeof(*sn));
	sorted = fb_calloc(n, sizeof(*sorted));
	if (sn == NULL || sorted == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	ps = (parser){hdr, hdr, hdr + hlen, path,
	    "not a safetensors file for this model"};
	if ((rc = parse_header(&ps, m, sn, &found_round)) != FB_OK) {
		goto out;
	}
	/* The tensors must tile the data region, and the file end there. */
	data_len = (uint64_t)st.st_size - 8 - hlen;
	want = fb_model_param_count(m) * 4;
	if (data_len != want) {
		fb_log_error("%s: file is %lld bytes; this model needs "
		             "%" PRIu64 " (%" PRIu64 " bytes of data, %" PRIu64
		             " "
		             "present)",
		    path, (long long)st.st_size, 8 + hlen + want, want,
		    data_len);
		rc = FB_EFORMAT;
		goto out;
	}
	memcpy(sorted, sn, n * sizeof(*sn));
	qsort(sorted, n, sizeof(*sorted), cmp_begin);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t at =
		    i == 0 ? 0 : sorted[i - 1].begin + sorted[i - 1].len;
		if (sorted[i].begin != at) {
			fb_log_error("%s: tensor data overlaps or leaves "
			             "gaps (data_offsets)",
			    path);
			rc = FB_EFORMAT;
			goto out;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		fb_tensor_info ti;
		fb_model_tensor_info(m, i, &ti);
		if (fseeko(f, (off_t)(8 + hlen + sn[i].begin), SEEK_SET) != 0 ||
		    fread(params + ti.offset, 4, (size_t)ti.count, f) !=
		        ti.count) {
			fb_log_error("%s: cannot read tensor %s: %s", path,
			    ti.name,
			    ferror(f) ? strerror(errno) : "file shrank");
			rc = FB_EIO;
			goto out;
		}
	}
	if (round != NULL) {
		*round = found_round;
	}
out:
	if (f != NULL) {
		fclose(f);
	}
	fb_free(hdr);
	fb_free(sn);
	fb_free(sorted);
	return rc;
}

/* ---- initial models: the layout and values from the file alone ---------- */

/* What the init reader keeps of the entries: all of them, in header order,
 * up to FB_MODEL_INIT_TENSORS_MAX. */
typedef struct init_ctx {
	st_entry *e;
	uint32_t n, cap;
} init_ctx;

static fb_err
collect_entry(parser *ps, void *ctx, const st_entry *e)
{
	init_ctx *ic = ctx;

	if (e->long_name) {
		return bad(ps, "tensor name \"%s...\" is longer than %d bytes",
		    e->name, FB_TENSOR_NAME_MAX - 1);
	}
	if (e->name[0] == '\0') {
		return bad(ps, "a tensor has an empty name");
	}
	if (ic->n == FB_MODEL_INIT_TENSORS_MAX) {
		return bad(ps, "more than %d tensors",
		    FB_MODEL_INIT_TENSORS_MAX);
	}
	if (ic->n == ic->cap) {
		uint32_t cap = ic->cap ? ic->cap * 2 : 64;
		st_entry *grown;
		if (cap > FB_MODEL_INIT_TENSORS_MAX) {
			cap = FB_MODEL_INIT_TENSORS_MAX;
		}
		if ((grown = realloc(ic->e, cap * sizeof(*grown))) == NULL) {
			return FB_ENOMEM;
		}
		ic->e = grown;
		ic->cap = cap;
	}
	ic->e[ic->n++] = *e;
	return FB_OK;
}

/* The dtypes an initial model may hold, and what becomes of them. */
typedef enum init_kind {
	KIND_FLOAT, /* federated: read as float32 */
	KIND_LOCAL, /* integer or bool: not federated, skipped */
} init_kind;

static const struct {
	const char *name;
	uint32_t size;
	init_kind kind;
} init_dtypes[] = {
    {"F32", 4, KIND_FLOAT},
    {"F16", 2, KIND_FLOAT},
    {"BF16", 2, KIND_FLOAT},
    {"F64", 8, KIND_FLOAT},
    {"BOOL", 1, KIND_LOCAL},
    {"U8", 1, KIND_LOCAL},
    {"I8", 1, KIND_LOCAL},
    {"U16", 2, KIND_LOCAL},
    {"I16", 2, KIND_LOCAL},
    {"U32", 4, KIND_LOCAL},
    {"I32", 4, KIND_LOCAL},
    {"U64", 8, KIND_LOCAL},
    {"I64", 8, KIND_LOCAL},
};

static int
cmp_entry_begin(const void *a, const void *b)
{
	const st_entry *x = *(const st_entry *const *)a;
	const st_entry *y = *(const st_entry *const *)b;
	if (x->begin != y->begin) {
		return x->begin < y->begin ? -1 : 1;
	}
	return x->end < y->end ? -1 : x->end > y->end;
}

static int
cmp_entry_name(const void *a, const void *b)
{
	return strcmp((*(const st_entry *const *)a)->name,
	    (*(const st_entry *const *)b)->name);
}

/* half_to_float widens an IEEE binary16 value exactly. */
static float
half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
	float f;

	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else if (exp != 0) {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		bits = sign;
	} else {
		/* subnormal: man * 2^-24, exact in float */
		f = (float)man * 0x1p-24f;
		memcpy(&bits, &f, 4);
		bits |= sign;
	}
	memcpy(&f, &bits, 4);
	return f;
}

/* read_values reads tensor `e` (dtype index `dt`) into dst as float32,
 * checking that every value is finite. */
static fb_err
read_values(FILE *f, const char *path, uint64_t data_at, const st_entry *e,
    uint32_t dt, float *dst, uint64_t count)
{
	uint8_t buf[8192];
	uint32_t size = init_dtypes[dt].size;
	uint64_t done = 0;

	if (fseeko(f, (off_t)(data_at + e->begin), SEEK_SET) != 0) {
		fb_log_error("%s: cannot seek to tensor %s: %s", path, e->name,
		    strerror(errno));
		return FB_EIO;
	}
	while (done < count) {
		uint64_t k = count - done;
		if (k > sizeof(buf) / size) {
			k = sizeof(buf) / size;
		}
		if (fread(buf, size, (size_t)k, f) != k) {
			fb_log_error("%s: cannot read tensor %s: %s", path,
			    e->name,
			    ferror(f) ? strerror(errno) : "file shrank");
			return FB_EIO;
		}
		for (uint64_t i = 0; i < k; i++) {
			const uint8_t *p = buf + i * size;
			float v;
			if (size == 4) {
				memcpy(&v, p, 4);
			} else if (size == 8) {
				double d;
				memcpy(&d, p, 8);
				v = (float)d;
			} else if (strcmp(init_dtypes[dt].name, "F16") == 0) {
				v = half_to_float(
				    (uint16_t)(p[0] | (uint16_t)p[1] << 8));
			} else { /* BF16: the high half of a float32 */
				uint32_t bits = (uint32_t)p[0] << 16 |
				    (uint32_t)p[1] << 24;
				memcpy(&v, &bits, 4);
			}
			if (!isfinite(v)) {
				fb_log_error("%s: tensor %s: element %" PRIu64
				             " is not finite as float32 "
				             "(NaN, infinite, or an F64 beyond "
				             "float32's range)",
				    path, e->name, done + i);
				return FB_EFORMAT;
			}
			dst[done + i] = v;
		}
		done += k;
	}
	return FB_OK;
}

fb_err
fb_safetensors_read_init(const char *path, bool with_values,
    fb_tensor_info **tensors, uint32_t *count, float **values)
{
	fb_err rc = FB_OK;
	FILE *f = NULL;
	char *hdr = NULL;
	init_ctx ic = {0};
	st_entry **order = NULL;
	fb_tensor_info *ti = NULL;
	float *vals = NULL;
	uint64_t hlen, data_len, at = 0, params = 0;
	uint32_t kept = 0, skipped = 0, k = 0;
	uint32_t *dts = NULL;
	struct stat st;
	parser ps = {0};
	const char *first_local = NULL;

	*tensors = NULL;
	*count = 0;
	if (values != NULL) {
		*values = NULL;
	}
	if ((rc = read_header(path, "model.init: ", FB_MODEL_INIT_HEADER_MAX,
	         &f, &st, &hdr, &hlen)) != FB_OK) {
		goto out;
	}
	ps = (parser){hdr, hdr, hdr + hlen, path,
	    "not a usable initial model"};
	if ((rc = parse_entries(&ps, collect_entry, &ic, NULL)) != FB_OK) {
		goto out;
	}
	ps.p = ps.start; /* later errors are about the whole header */
	if (ic.n == 0) {
		rc = bad(&ps, "it holds no tensors");
		goto out;
	}
	order = fb_calloc(ic.n, sizeof(*order));
	dts = fb_calloc(ic.n, sizeof(*dts));
	if (order == NULL || dts == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < ic.n; i++) {
		order[i] = &ic.e[i];
	}
	qsort(order, ic.n, sizeof(*order), cmp_entry_name);
	for (uint32_t i = 1; i < ic.n; i++) {
		if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
			rc = bad(&ps, "tensor %s appears twice",
			    order[i]->name);
			goto out;
		}
	}
	/* Each entry: a dtype we know, a shape that fits its bytes. */
	for (uint32_t i = 0; i < ic.n; i++) {
		const st_entry *e = &ic.e[i];
		uint64_t n = 1;
		uint32_t d;
		for (d = 0; d < FB_ARRAY_LEN(init_dtypes); d++) {
			if (!e->long_dtype &&
			    strcmp(e->dtype, init_dtypes[d].name) == 0) {
				break;
			}
		}
		if (d == FB_ARRAY_LEN(init_dtypes)) {
			rc = bad(&ps,
			    "tensor %s has dtype %s%s; fedbox federates F32, "
			    "F16, BF16 and F64 tensors (as float32) and skips "
			    "integer and BOOL ones",
			    e->name, e->dtype, e->long_dtype ? "..." : "");
			goto out;
		}
		dts[i] = d;
		for (uint32_t j = 0; j < e->ndim; j++) {
			if (e->shape[j] != 0 &&
			    n > (FB_MODEL_MAX_PARAMS - 1) / e->shape[j]) {
				rc = bad(&ps, "tensor %s has a shape too large",
				    e->name);
				goto out;
			}
			n *= e->shape[j];
		}
		if (e->end - e->begin != n * init_dtypes[d].size) {
			char sh[128];
			format_shape(sh, sizeof(sh), e->shape, e->ndim);
			rc = bad(&ps,
			    "tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
			    "] hold %" PRIu64 " bytes; shape [%s] of %s needs "
			    "%" PRIu64,
			    e->name, e->begin, e->end, e->end - e->begin, sh,
			    e->dtype, n * init_dtypes[d].size);
			goto out;
		}
		if (init_dtypes[d].kind == KIND_LOCAL) {
			skipped++;
			first_local = first_local ? first_local : e->name;
			continue;
		}
		if (e->ndim < 1 || e->ndim > 4) {
			rc = bad(&ps,
			    "tensor %s has rank %u; fedbox federates tensors "
			    "of rank 1 to 4",
			    e->name, e->ndim);
			goto out;
		}
		if (n == 0) {
			rc = bad(&ps, "tensor %s has no elements (a zero in "
			              "its shape)",
			    e->name);
			goto out;
		}
		if (params + n >= FB_MODEL_MAX_PARAMS) {
			rc = bad(&ps, "more than 2^40 parameters");
			goto out;
		}
		params += n;
		kept++;
	}
	if (kept == 0) {
		rc = bad(&ps, "it holds no floating-point tensor (only "
		              "integer or BOOL ones, which are not federated)");
		goto out;
	}
	/* The tensors tile the data region exactly, and the file ends there. */
	data_len = (uint64_t)st.st_size - 8 - hlen;
	for (uint32_t i = 0; i < ic.n; i++) {
		order[i] = &ic.e[i];
	}
	qsort(order, ic.n, sizeof(*order), cmp_entry_begin);
	for (uint32_t i = 0; i < ic.n; i++) {
		if (order[i]->begin != at) {
			rc = bad(&ps,
			    "tensor %s's data begin at byte %" PRIu64
			    " of the data, where %" PRIu64 " was expected "
			    "(data_offsets overlap or leave a gap)",
			    order[i]->name, order[i]->begin, at);
			goto out;
		}
		at = order[i]->end;
	}
	if (at != data_len) {
		rc = bad(&ps,
		    "the tensors cover %" PRIu64 " bytes of data; the file "
		    "holds %" PRIu64,
		    at, data_len);
		goto out;
	}
	/* The layout: the floating tensors in the order of their data. */
	if ((ti = fb_calloc(kept, sizeof(*ti))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if (with_values && (vals = fb_alloc((size_t)params * 4)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	at = 0;
	for (uint32_t i = 0; i < ic.n; i++) {
		const st_entry *e = order[i];
		uint32_t d = dts[e - ic.e];
		if (init_dtypes[d].kind != KIND_FLOAT) {
			continue;
		}
		snprintf(ti[k].name, sizeof(ti[k].name), "%s", e->name);
		ti[k].ndim = e->ndim;
		ti[k].count = 1;
		for (uint32_t j = 0; j < e->ndim; j++) {
			ti[k].shape[j] = e->shape[j];
			ti[k].count *= e->shape[j];
		}
		ti[k].offset = at;
		if (vals != NULL &&
		    (rc = read_values(f, path, 8 + hlen, e, d, vals + at,
		         ti[k].count)) != FB_OK) {
			goto out;
		}
		at += ti[k].count;
		k++;
	}
	if (skipped > 0) {
		fb_log_info("%s: %u integer or BOOL tensor%s (e.g. %s) not "
		            "federated: each trainer keeps its own",
		    path, skipped, skipped == 1 ? "" : "s", first_local);
	}
	*tensors = ti;
	*count = kept;
	ti = NULL;
	if (values != NULL) {
		*values = vals;
		vals = NULL;
	}
out:
	if (f != NULL) {
		fclose(f);
	}
	fb_free(hdr);
	free(ic.e);
	fb_free(order);
	fb_free(dts);
	fb_free(ti);
	fb_free(vals);
	return rc;
}
