/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.c -- schema-driven YAML configuration over libyaml.
 *
 * The loader walks libyaml's event stream (not its document tree) with the
 * dotted path of the current mapping in a buffer. Every key is looked up in
 * the schema as it arrives, so an unknown key, a mapping where a value
 * belongs or a value where a mapping belongs stops the walk at once: nesting
 * can never go deeper than the schema's, whatever the input. Aliases are
 * refused (no billion laughs, no shared nodes); anchors and tags are ignored.
 *
 * Only this file includes <yaml.h>. Every error is logged exactly once, as
 * `FILE:LINE:COL: KEY: what is wrong` with 1-based line and column.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <yaml.h>

#include "common/config.h"
#include "common/log.h"

#define CFG_PATH_MAX 256        /* longest dotted key in a schema */
#define CFG_FILE_MAX (4u << 20) /* config files are small; refuse more */
#define CFG_ECHO_MAX 48         /* value text quoted back in messages */
#define CFG_MSG_MAX 1024

/* Where a key was first seen (for duplicate detection) and where its value
 * starts (for the programs' own cross-checks, fb_cfg_load_pos). */
typedef struct cfg_seen {
	bool seen;
	yaml_mark_t mark;
	yaml_mark_t value_mark;
} cfg_seen;

/* A section (dotted prefix) already entered: schema[field].key[0..len). */
typedef struct cfg_section {
	size_t field;
	size_t len;
	yaml_mark_t mark;
} cfg_section;

typedef struct cfg_ctx {
	const char *name; /* file name shown in messages */
	const char *base; /* folder relative paths resolve against, or NULL */
	const char *src;  /* the document, to place reader errors */
	size_t src_len;
	const fb_cfg_field *schema;
	size_t nfields;
	void *out;
	yaml_parser_t parser;
	bool parser_ok;
	yaml_event_t ev;
	bool have_ev;
	char path[CFG_PATH_MAX + 1]; /* dotted path of the current mapping */
	cfg_seen *seen;              /* one per field */
	cfg_section *sections;
	size_t nsections, cap_sections;
} cfg_ctx;

static const char *const type_names[] = {
    [FB_CFG_INT] = "int",
    [FB_CFG_FLOAT] = "float",
    [FB_CFG_BOOL] = "bool",
    [FB_CFG_STRING] = "string",
    [FB_CFG_DURATION] = "duration",
    [FB_CFG_SIZE] = "size",
    [FB_CFG_ENUM] = "enum",
    [FB_CFG_INT_LIST] = "list of int",
    [FB_CFG_STR_LIST] = "list of string",
    [FB_CFG_PATH] = "path",
};

static const char duration_hint[] =
    "a number with unit ms, s, m or h, e.g. 30s";
static const char size_hint[] = "an integer with unit B, KiB, MiB, GiB, TiB, "
                                "kB, MB, GB or TB, e.g. 4MiB";

/* ---- small helpers --------------------------------------------------- */

static void *
field_ptr(void *out, const fb_cfg_field *f)
{
	return (char *)out + f->offset;
}

static size_t
type_size(fb_cfg_type t)
{
	switch (t) {
	case FB_CFG_INT:
	case FB_CFG_DURATION:
		return sizeof(int64_t);
	case FB_CFG_FLOAT:
		return sizeof(double);
	case FB_CFG_BOOL:
		return sizeof(bool);
	case FB_CFG_STRING:
	case FB_CFG_PATH:
		return sizeof(char *);
	case FB_CFG_SIZE:
		return sizeof(uint64_t);
	case FB_CFG_ENUM:
		return sizeof(int);
	case FB_CFG_INT_LIST:
		return sizeof(fb_cfg_int_list);
	case FB_CFG_STR_LIST:
		return sizeof(fb_cfg_str_list);
	}
	FB_ASSERT(!"unknown fb_cfg_type");
	return 0;
}

static bool
has_bounds(const fb_cfg_field *f)
{
	return f->min <= f->max;
}

static char *
str_dup(const char *s, size_t len)
{
	char *p = malloc(len + 1);
	if (p != NULL) {
		memcpy(p, s, len);
		p[len] = '\0';
	}
	return p;
}

/*
 * echo writes `s` (of `len` bytes) for quoting in a message: at most
 * CFG_ECHO_MAX characters, control bytes and quotes escaped, so that binary
 * garbage cannot break a log line.
 */
static const char *
echo(char *buf, size_t size, const char *s, size_t len)
{
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (n + 8 >= size || i >= CFG_ECHO_MAX) {
			memcpy(buf + n, "...", 4);
			return buf;
		}
		if (ch < 0x20 || ch == 0x7f || ch == '\'') {
			n += (size_t)snprintf(buf + n, size - n, "\\x%02x", ch);
		} else {
			buf[n++] = (char)ch;
		}
	}
	buf[n] = '\0';
	return buf;
}

/* edit_distance is Levenshtein's, or a big number for long strings. */
static size_t
edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t row[65];
	if (la > 64 || lb > 64) {
		return SIZE_MAX;
	}
	for (size_t j = 0; j <= lb; j++) {
		row[j] = j;
	}
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t best = diag + (a[i - 1] != b[j - 1]);
			if (row[j] + 1 < best) {
				best = row[j] + 1;
			}
			if (row[j - 1] + 1 < best) {
				best = row[j - 1] + 1;
			}
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* A plausible typo: a small edit, and not most of the word. */
static bool
close_enough(const char *typed, const char *name, size_t *best)
{
	size_t d = edit_distance(typed, name);
	size_t len = strlen(name);
	if (d == 0 || d > 2 || d * 3 > len || d >= *best) {
		return false;
	}
	*best = d;
	return true;
}

/* fmt_bound prints a bound of field `f` in the field's own units. */
static const char *
fmt_bound(char *buf, size_t size, const fb_cfg_field *f, double v)
{
	static const struct {
		const char *unit;
		double scale;
	} dur[] = {{"h", 3600000.0}, {"m", 60000.0}, {"s", 1000.0}},
	  sz[] = {{"TiB", 1099511627776.0}, {"GiB", 1073741824.0},
	      {"MiB", 1048576.0}, {"KiB", 1024.0}};

	if (f->type == FB_CFG_DURATION && v > 0 && v < 9e15 && v == floor(v)) {
		for (size_t i = 0; i < sizeof(dur) / sizeof(dur[0]); i++) {
			if (fmod(v, dur[i].scale) == 0) {
				snprintf(buf, size, "%.0f%s", v / dur[i].scale,
				    dur[i].unit);
				return buf;
			}
		}
		snprintf(buf, size, "%.0fms", v);
		return buf;
	}
	if (f->type == FB_CFG_DURATION && v == 0) {
		snprintf(buf, size, "0s");
		return buf;
	}
	if (f->type == FB_CFG_SIZE && v > 0 && v < 1.8e19 && v == floor(v)) {
		for (size_t i = 0; i < sizeof(sz) / sizeof(sz[0]); i++) {
			if (fmod(v, sz[i].scale) == 0) {
				snprintf(buf, size, "%.0f%s", v / sz[i].scale,
				    sz[i].unit);
				return buf;
			}
		}
	}
	if (v == floor(v) && fabs(v) < 9e15) {
		snprintf(buf, size, "%.0f", v);
	} else {
		snprintf(buf, size, "%g", v);
	}
	return buf;
}

/* ---- value parsers ------------------------------------------------------ */

/* parse_int accepts [+-]digits; FB_ERANGE when it does not fit int64. */
static fb_err
parse_int(const char *s, int64_t *v)
{
	bool neg = false;
	uint64_t acc = 0, limit;

	*v = 0;
	if (*s == '+' || *s == '-') {
		neg = *s == '-';
		s++;
	}
	if (!isdigit((unsigned char)*s)) {
		return FB_EINVAL;
	}
	limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	for (; isdigit((unsigned char)*s); s++) {
		unsigned d = (unsigned)(*s - '0');
		if (acc > (limit - d) / 10) {
			while (isdigit((unsigned char)*s)) {
				s++;
			}
			return *s == '\0' ? FB_ERANGE : FB_EINVAL;
		}
		acc = acc * 10 + d;
	}
	if (*s != '\0') {
		return FB_EINVAL;
	}
	if (neg) {
		*v = acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc;
	} else {
		*v = (int64_t)acc;
	}
	return FB_OK;
}

static fb_err
parse_float(const char *s, double *v)
{
	char *end = NULL;
	double x;

	*v = 0;
	if (*s == '\0' || isspace((unsigned char)*s)) {
		return FB_EINVAL;
	}
	errno = 0;
	x = strtod(s, &end);
	if (end == s || *end != '\0') {
		return FB_EINVAL;
	}
	if (!isfinite(x)) {
		return FB_ERANGE;
	}
	*v = x;
	return FB_OK;
}

static fb_err
parse_bool(const char *s, bool *v)
{
	static const char *const yes[] = {"true", "yes", "on"};
	static const char *const no[] = {"false", "no", "off"};

	*v = false;
	for (size_t i = 0; i < 3; i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*v = true;
			return FB_OK;
		}
		if (strcasecmp(s, no[i]) == 0) {
			return FB_OK;
		}
	}
	return FB_EINVAL;
}

/* parse_digits reads a run of decimal digits; FB_ERANGE past UINT64_MAX. */
static fb_err
parse_digits(const char **sp, uint64_t *v)
{
	const char *s = *sp;
	uint64_t acc = 0;
	bool over = false;

	*v = 0;
	if (!isdigit((unsigned char)*s)) {
		return FB_EINVAL;
	}
	for (; isdigit((unsigned char)*s); s++) {
		unsigned d = (unsigned)(*s - '0');
		if (acc > (UINT64_MAX - d) / 10) {
			over = true;
		} else {
			acc = acc * 10 + d;
		}
	}
	*sp = s;
	*v = acc;
	return over ? FB_ERANGE : FB_OK;
}

fb_err
fb_parse_duration_ms(const char *s, int64_t *ms)
{
	static const struct {
		const char *name;
		uint64_t ms;
	} units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
	fb_err rc = FB_OK;
	fb_err over;
	uint64_t whole = 0, frac = 0, frac_scale = 1, unit = 0, frac_ms;

	*ms = 0;
	if (s == NULL) {
		rc = FB_EINVAL;
		goto out;
	}
	over = parse_digits(&s, &whole);
	if (over == FB_EINVAL) {
		rc = FB_EINVAL;
		goto out;
	}
	if (*s == '.') {
		s++;
		if (!isdigit((unsigned char)*s)) {
			rc = FB_EINVAL;
			goto out;
		}
		/* Twelve digits are exact in integers and far below 1 ms. */
		for (; isdigit((unsigned char)*s); s++) {
			if (frac_scale < 1000000000000ULL) {
				frac = frac * 10 + (uint64_t)(*s - '0');
				frac_scale *= 10;
			}
		}
	}
	while (*s == ' ') {
		s++;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(s, units[i].name) == 0) {
			unit = units[i].ms;
		}
	}
	if (unit == 0) {
		rc = FB_EINVAL; /* no unit, or an unknown one */
		goto out;
	}
	frac_ms = (frac * unit + frac_scale / 2) / frac_scale;
	if (over == FB_ERANGE ||
	    whole > ((uint64_t)INT64_MAX - frac_ms) / unit) {
		rc = FB_ERANGE;
		goto out;
	}
	*ms = (int64_t)(whole * unit + frac_ms);
out:
	return rc;
}

fb_err
fb_parse_size(const char *s, uint64_t *bytes)
{
	static const struct {
		const char *name;
		uint64_t mult;
	} units[] = {
	    {"", 1},
	    {"B", 1},
	    {"KiB", 1ULL << 10},
	    {"MiB", 1ULL << 20},
	    {"GiB", 1ULL << 30},
	    {"TiB", 1ULL << 40},
	    {"kB", 1000ULL},
	    {"MB", 1000000ULL},
	    {"GB", 1000000000ULL},
	    {"TB", 1000000000000ULL},
	};
	fb_err rc = FB_OK;
	fb_err over;
	uint64_t n = 0, mult = 0;

	*bytes = 0;
	if (s == NULL) {
		rc = FB_EINVAL;
		goto out;
	}
	over = parse_digits(&s, &n);
	if (over == FB_EINVAL) {
		rc = FB_EINVAL;
		goto out;
	}
	while (*s == ' ') {
		s++;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(s, units[i].name) == 0) {
			mult = units[i].mult;
		}
	}
	if (mult == 0) {
		rc = FB_EINVAL;
		goto out;
	}
	if (over == FB_ERANGE || n > UINT64_MAX / mult) {
		rc = FB_ERANGE;
		goto out;
	}
	*bytes = n * mult;
out:
	return rc;
}

/* ---- errors ------------------------------------------------------------- */

static fb_err cfg_fail(cfg_ctx *c, yaml_mark_t m, const char *key,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* cfg_fail logs the one message of a failed load and returns FB_ECONFIG. */
static fb_err
cfg_fail(cfg_ctx *c, yaml_mark_t m, const char *key, const char *fmt, ...)
{
	char msg[CFG_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (key != NULL && key[0] != '\0') {
		fb_log_error("%s:%zu:%zu: %s: %s", c->name, m.line + 1,
		    m.column + 1, key, msg);
	} else {
		fb_log_error(
		    "%s:%zu:%zu: %s", c->name, m.line + 1, m.column + 1, msg);
	}
	return FB_ECONFIG;
}

static fb_err
cfg_nomem(cfg_ctx *c)
{
	fb_log_error(
	    "%s: out of memory while loading the configuration", c->name);
	return FB_ENOMEM;
}

/* parser_fail reports why libyaml stopped. */
static fb_err
parser_fail(cfg_ctx *c)
{
	yaml_parser_t *p = &c->parser;
	yaml_mark_t m = p->problem_mark;
	const char *problem = p->problem != NULL ? p->problem : "bad YAML";

	switch (p->error) {
	case YAML_MEMORY_ERROR:
		return cfg_nomem(c);
	case YAML_READER_ERROR:
		/* The reader gives a byte offset; turn it into line:col. */
		memset(&m, 0, sizeof(m));
		for (size_t i = 0; i < p->problem_offset && i < c->src_len;
		     i++) {
			unsigned char ch = (unsigned char)c->src[i];
			if (ch == '\n') {
				m.line++;
				m.column = 0;
			} else if ((ch & 0xc0) != 0x80) {
				m.column++;
			}
		}
		if (p->problem_value != -1) {
			return cfg_fail(c, m, NULL,
			    "not a valid YAML file: %s (byte 0x%02x)", problem,
			    (unsigned)p->problem_value & 0xffu);
		}
		return cfg_fail(
		    c, m, NULL, "not a valid YAML file: %s", problem);
	default:
		if (p->context != NULL) {
			return cfg_fail(c, m, NULL,
			    "YAML syntax error: %s (%s at line %zu)", problem,
			    p->context, p->context_mark.line + 1);
		}
		return cfg_fail(c, m, NULL, "YAML syntax error: %s", problem);
	}
}

/* ---- event stream ------------------------------------------------------- */

static fb_err
next_event(cfg_ctx *c)
{
	if (c->have_ev) {
		yaml_event_delete(&c->ev);
		c->have_ev = false;
	}
	if (!yaml_parser_parse(&c->parser, &c->ev)) {
		return parser_fail(c);
	}
	c->have_ev = true;
	return FB_OK;
}

static const char *
event_noun(const yaml_event_t *ev)
{
	switch (ev->type) {
	case YAML_MAPPING_START_EVENT:
		return "a mapping";
	case YAML_SEQUENCE_START_EVENT:
		return "a sequence";
	case YAML_SCALAR_EVENT:
		return "a single value";
	case YAML_ALIAS_EVENT:
		return "an alias";
	default:
		return "nothing";
	}
}

/* A plain empty, ~ or null scalar is YAML's null: "no value here". */
static bool
event_is_null(const yaml_event_t *ev)
{
	const char *v = (const char *)ev->data.scalar.value;
	if (ev->type != YAML_SCALAR_EVENT ||
	    ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
		return false;
	}
	return strcmp(v, "") == 0 || strcmp(v, "~") == 0 ||
	       strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 ||
	       strcmp(v, "NULL") == 0;
}

static fb_err
alias_fail(cfg_ctx *c, const char *key)
{
	char e[4 * CFG_ECHO_MAX];
	const char *a = (const char *)c->ev.data.alias.anchor;
	return cfg_fail(c, c->ev.start_mark, key,
	    "aliases (*%s) are not supported; write the value out",
	    echo(e, sizeof(e), a, strlen(a)));
}

/* ---- schema lookups ----------------------------------------------------- */

static const fb_cfg_field *
find_field(const cfg_ctx *c, const char *path)
{
	for (size_t i = 0; i < c->nfields; i++) {
		if (strcmp(c->schema[i].key, path) == 0) {
			return &c->schema[i];
		}
	}
	return NULL;
}

/* find_section returns the first field under `path.`, or SIZE_MAX. */
static size_t
find_section(const cfg_ctx *c, const char *path)
{
	size_t len = strlen(path);
	for (size_t i = 0; i < c->nfields; i++) {
		const char *k = c->schema[i].key;
		if (strncmp(k, path, len) == 0 && k[len] == '.') {
			return i;
		}
	}
	return SIZE_MAX;
}

/*
 * known_keys lists the names directly under `prefix` ("" for the top
 * level), in schema order, into `buf`, and a close name to `typed` (a
 * probable typo) into `*suggest`.
 */
static void
known_keys(const cfg_ctx *c, const char *prefix, const char *typed, char *buf,
    size_t size, char *suggest, size_t suggest_size)
{
	size_t plen = strlen(prefix), n = 0, best = SIZE_MAX;
	bool full = false;

	buf[0] = '\0';
	suggest[0] = '\0';
	for (size_t i = 0; i < c->nfields; i++) {
		const char *k = c->schema[i].key, *name, *dot;
		size_t nlen;
		bool dup = false;
		char tmp[CFG_PATH_MAX + 1];

		if (plen > 0 &&
		    (strncmp(k, prefix, plen) != 0 || k[plen] != '.')) {
			continue;
		}
		name = plen > 0 ? k + plen + 1 : k;
		dot = strchr(name, '.');
		nlen = dot != NULL ? (size_t)(dot - name) : strlen(name);
		for (size_t j = 0; j < i && !dup; j++) {
			const char *o = c->schema[j].key;
			dup = strncmp(o, k, (size_t)(name - k) + nlen) == 0 &&
			      (o[(name - k) + nlen] == '.' ||
			          o[(name - k) + nlen] == '\0');
		}
		if (dup) {
			continue;
		}
		memcpy(tmp, name, nlen);
		tmp[nlen] = '\0';
		if (close_enough(typed, tmp, &best)) {
			snprintf(suggest, suggest_size, "%s", tmp);
		}
		if (full) {
			continue;
		}
		if (n + nlen + 8 >= size) {
			snprintf(buf + n, size - n, ", ...");
			full = true;
			continue;
		}
		n += (size_t)snprintf(
		    buf + n, size - n, "%s%s", n > 0 ? ", " : "", tmp);
	}
}

/* ---- setting values ----------------------------------------------------- */

static void
value_zero(void *out, const fb_cfg_field *f)
{
	memset(field_ptr(out, f), 0, type_size(f->type));
}

static void
value_release(void *out, const fb_cfg_field *f)
{
	if (f->type == FB_CFG_STRING || f->type == FB_CFG_PATH) {
		char **p = field_ptr(out, f);
		free(*p);
		*p = NULL;
	} else if (f->type == FB_CFG_STR_LIST) {
		fb_cfg_str_list *l = field_ptr(out, f);
		size_t n =
		    l->count < FB_CFG_MAX_LIST ? l->count : FB_CFG_MAX_LIST;
		for (size_t i = 0; i < n; i++) {
			free(l->v[i]);
		}
		memset(l, 0, sizeof(*l));
	} else if (f->type == FB_CFG_INT_LIST) {
		memset(field_ptr(out, f), 0, sizeof(fb_cfg_int_list));
	}
}

static fb_err
range_fail(cfg_ctx *c, yaml_mark_t m, const char *key, const fb_cfg_field *f,
    const char *shown)
{
	char lo[64], hi[64];
	return cfg_fail(c, m, key, "%s is out of range (%s to %s)", shown,
	    fmt_bound(lo, sizeof(lo), f, f->min),
	    fmt_bound(hi, sizeof(hi), f, f->max));
}

/*
 * set_int parses one integer for an INT field or an INT_LIST element and
 * checks its bounds. `key` is what messages call it.
 */
static fb_err
set_int(cfg_ctx *c, yaml_mark_t m, const char *key, const fb_cfg_field *f,
    const char *text, size_t len, int64_t *v)
{
	char e[4 * CFG_ECHO_MAX];
	fb_err rc = parse_int(text, v);

	if (rc == FB_ERANGE) {
		return cfg_fail(c, m, key, "'%s' does not fit a 64-bit integer",
		    echo(e, sizeof(e), text, len));
	}
	if (rc != FB_OK && f->type == FB_CFG_INT && f->names != NULL) {
		char words[128] = "";
		for (int i = 0; f->names[i] != NULL; i++) {
			size_t n = strlen(words);
			snprintf(words + n, sizeof(words) - n, "%s%s",
			    i > 0 ? " or " : "", f->names[i]);
		}
		return cfg_fail(c, m, key, "'%s' is neither %s nor a whole "
		    "decimal number", echo(e, sizeof(e), text, len), words);
	}
	if (rc != FB_OK) {
		return cfg_fail(c, m, key,
		    "bad integer '%s' (a whole decimal number, e.g. 42)",
		    echo(e, sizeof(e), text, len));
	}
	if (has_bounds(f) && ((double)*v < f->min || (double)*v > f->max)) {
		snprintf(e, sizeof(e), "%lld", (long long)*v);
		return range_fail(c, m, key, f, e);
	}
	return FB_OK;
}

static fb_err
set_duration(cfg_ctx *c, yaml_mark_t m, const char *key, const fb_cfg_field *f,
    const char *text, size_t len)
{
	char e[4 * CFG_ECHO_MAX];
	int64_t ms = 0;
	double num = 0;
	fb_err rc = fb_parse_duration_ms(text, &ms);

	echo(e, sizeof(e), text, len);
	if (rc == FB_ERANGE) {
		return cfg_fail(c, m, key, "duration '%s' is too long", e);
	}
	if (rc != FB_OK && text[0] == '-') {
		return cfg_fail(c, m, key, "duration '%s' is negative", e);
	}
	if (rc != FB_OK && parse_float(text, &num) == FB_OK) {
		return cfg_fail(c, m, key,
		    "duration '%s' has no unit (write e.g. %ss or %sms)", e, e,
		    e);
	}
	if (rc != FB_OK && f->names != NULL && f->names[0] != NULL) {
		return cfg_fail(c, m, key, "bad duration '%s' (%s; or %s)", e,
		    duration_hint, f->names[0]);
	}
	if (rc != FB_OK) {
		return cfg_fail(
		    c, m, key, "bad duration '%s' (%s)", e, duration_hint);
	}
	if (has_bounds(f) && ((double)ms < f->min || (double)ms > f->max)) {
		char q[4 * CFG_ECHO_MAX + 2];
		snprintf(q, sizeof(q), "'%s'", e);
		return range_fail(c, m, key, f, q);
	}
	*(int64_t *)field_ptr(c->out, f) = ms;
	return FB_OK;
}

static fb_err
set_size(cfg_ctx *c, yaml_mark_t m, const char *key, const fb_cfg_field *f,
    const char *text, size_t len)
{
	char e[4 * CFG_ECHO_MAX];
	uint64_t bytes = 0;
	fb_err rc = fb_parse_size(text, &bytes);

	echo(e, sizeof(e), text, len);
	if (rc == FB_ERANGE) {
		return cfg_fail(c, m, key, "size '%s' is too large", e);
	}
	if (rc != FB_OK) {
		return cfg_fail(c, m, key, "bad size '%s' (%s)", e, size_hint);
	}
	if (has_bounds(f) &&
	    ((double)bytes < f->min || (double)bytes > f->max)) {
		char q[4 * CFG_ECHO_MAX + 2];
		snprintf(q, sizeof(q), "'%s'", e);
		return range_fail(c, m, key, f, q);
	}
	*(uint64_t *)field_ptr(c->out, f) = bytes;
	return FB_OK;
}

static fb_err
set_enum(cfg_ctx *c, yaml_mark_t m, const char *key, const fb_cfg_field *f,
    const char *text, size_t len)
{
	char e[4 * CFG_ECHO_MAX], list[CFG_MSG_MAX / 2], hint[96] = "";
	size_t n = 0, best = SIZE_MAX;

	for (int i = 0; f->names[i] != NULL; i++) {
		if (strcmp(text, f->names[i]) == 0) {
			*(int *)field_ptr(c->out, f) = i;
			return FB_OK;
		}
	}
	list[0] = '\0';
	for (int i = 0; f->names[i] != NULL; i++) {
		if (n + strlen(f->names[i]) + 8 < sizeof(list)) {
			n += (size_t)snprintf(list + n, sizeof(list) - n,
			    "%s%s", i > 0 ? ", " : "", f->names[i]);
		}
		if (close_enough(text, f->names[i], &best)) {
			snprintf(hint, sizeof(hint), " (did you mean '%s'?)",
			    f->names[i]);
		}
	}
	return cfg_fail(c, m, key, "'%s' is not one of %s%s",
	    echo(e, sizeof(e), text, len), list, hint);
}

/*
 * set_path stores path `text` into field `f`: a relative one joined to the
 * config file's folder when there is one, anything else as written.
 */
static fb_err
set_path(cfg_ctx *c, const fb_cfg_field *f, const char *text, size_t len)
{
	char **p = field_ptr(c->out, f);
	char *s = NULL;
	bool keep = c->base == NULL || len == 0 || text[0] == '/';

	for (int i = 0; !keep && f->names != NULL && f->names[i] != NULL;
	     i++) {
		keep = strncmp(text, f->names[i], strlen(f->names[i])) == 0;
	}
	if (keep) {
		s = str_dup(text, len);
	} else {
		size_t blen = strlen(c->base);
		/* "./x" names x in the folder too; drop the noise. */
		while (len > 2 && text[0] == '.' && text[1] == '/') {
			text += 2;
			len -= 2;
		}
		if ((s = malloc(blen + 1 + len + 1)) != NULL) {
			memcpy(s, c->base, blen);
			s[blen] = '/';
			memcpy(s + blen + 1, text, len + 1);
		}
	}
	if (s == NULL) {
		return cfg_nomem(c);
	}
	free(*p);
	*p = s;
	return FB_OK;
}

/*
 * set_scalar parses `text` (a scalar of `len` bytes) into field `f`, which
 * is not a list type.
 */
static fb_err
set_scalar(cfg_ctx *c, yaml_mark_t m, const char *key, const fb_cfg_field *f,
    const char *text, size_t len)
{
	char e[4 * CFG_ECHO_MAX];
	void *p = field_ptr(c->out, f);
	fb_err rc;

	if (strlen(text) != len) {
		return cfg_fail(c, m, key, "value contains a NUL byte");
	}
	switch (f->type) {
	case FB_CFG_INT: {
		int64_t v = 0;
		for (int i = 0; f->names != NULL && f->names[i] != NULL; i++) {
			if (strlen(f->names[i]) == len &&
			    memcmp(text, f->names[i], len) == 0) {
				*(int64_t *)p = -1 - i; /* a word: -1, -2, ... */
				return FB_OK;
			}
		}
		if ((rc = set_int(c, m, key, f, text, len, &v)) != FB_OK) {
			return rc;
		}
		*(int64_t *)p = v;
		return FB_OK;
	}
	case FB_CFG_FLOAT: {
		double v = 0;
		echo(e, sizeof(e), text, len);
		rc = parse_float(text, &v);
		if (rc == FB_ERANGE) {
			return cfg_fail(
			    c, m, key, "'%s' is not a finite number", e);
		}
		if (rc != FB_OK) {
			return cfg_fail(
			    c, m, key, "bad number '%s' (e.g. 0.5 or 1e-3)", e);
		}
		if (has_bounds(f) && (v < f->min || v > f->max)) {
			char q[4 * CFG_ECHO_MAX + 2];
			snprintf(q, sizeof(q), "'%s'", e);
			return range_fail(c, m, key, f, q);
		}
		*(double *)p = v;
		return FB_OK;
	}
	case FB_CFG_BOOL:
		if (parse_bool(text, (bool *)p) != FB_OK) {
			return cfg_fail(c, m, key,
			    "'%s' is not a boolean (true/false, yes/no, "
			    "on/off)",
			    echo(e, sizeof(e), text, len));
		}
		return FB_OK;
	case FB_CFG_STRING: {
		char *s = str_dup(text, len);
		if (s == NULL) {
			return cfg_nomem(c);
		}
		free(*(char **)p);
		*(char **)p = s;
		return FB_OK;
	}
	case FB_CFG_PATH:
		return set_path(c, f, text, len);
	case FB_CFG_DURATION:
		for (int i = 0; f->names != NULL && f->names[i] != NULL; i++) {
			if (strlen(f->names[i]) == len &&
			    memcmp(text, f->names[i], len) == 0) {
				*(int64_t *)p = -1 - i; /* as INT's words */
				return FB_OK;
			}
		}
		return set_duration(c, m, key, f, text, len);
	case FB_CFG_SIZE:
		return set_size(c, m, key, f, text, len);
	case FB_CFG_ENUM:
		return set_enum(c, m, key, f, text, len);
	case FB_CFG_INT_LIST:
	case FB_CFG_STR_LIST:
		break;
	}
	FB_ASSERT(!"set_scalar on a list field");
	return FB_EINVAL;
}

/*
 * parse_list reads the elements of a sequence whose start event is current,
 * up to and including its end event, into list field `f`.
 */
static fb_err
parse_list(cfg_ctx *c, const char *key, const fb_cfg_field *f)
{
	fb_err rc = FB_OK;
	char ekey[CFG_PATH_MAX + 32];
	size_t count = 0;

	value_release(c->out, f);
	for (;;) {
		const char *text;
		size_t len;

		if ((rc = next_event(c)) != FB_OK) {
			goto out;
		}
		if (c->ev.type == YAML_SEQUENCE_END_EVENT) {
			break;
		}
		snprintf(ekey, sizeof(ekey), "%s[%zu]", key, count);
		if (c->ev.type == YAML_ALIAS_EVENT) {
			rc = alias_fail(c, ekey);
			goto out;
		}
		if (c->ev.type != YAML_SCALAR_EVENT) {
			rc = cfg_fail(c, c->ev.start_mark, ekey,
			    "expected a single %s, found %s",
			    f->type == FB_CFG_INT_LIST ? "integer" : "string",
			    event_noun(&c->ev));
			goto out;
		}
		if (count == FB_CFG_MAX_LIST) {
			rc = cfg_fail(c, c->ev.start_mark, key,
			    "too many elements (at most %d)", FB_CFG_MAX_LIST);
			goto out;
		}
		if (event_is_null(&c->ev)) {
			rc = cfg_fail(
			    c, c->ev.start_mark, ekey, "element has no value");
			goto out;
		}
		text = (const char *)c->ev.data.scalar.value;
		len = c->ev.data.scalar.length;
		if (strlen(text) != len) {
			rc = cfg_fail(c, c->ev.start_mark, ekey,
			    "value contains a NUL byte");
			goto out;
		}
		if (f->type == FB_CFG_INT_LIST) {
			fb_cfg_int_list *l = field_ptr(c->out, f);
			rc = set_int(c, c->ev.start_mark, ekey, f, text, len,
			    &l->v[count]);
			if (rc != FB_OK) {
				goto out;
			}
			l->count = ++count;
		} else {
			fb_cfg_str_list *l = field_ptr(c->out, f);
			if ((l->v[count] = str_dup(text, len)) == NULL) {
				rc = cfg_nomem(c);
				goto out;
			}
			l->count = ++count;
		}
	}
out:
	return rc;
}

/*
 * parse_value handles the current event as the value of field `f`: a
 * scalar, a sequence for list fields, or null (keep the default).
 */
static fb_err
parse_value(cfg_ctx *c, const char *key, const fb_cfg_field *f)
{
	bool list = f->type == FB_CFG_INT_LIST || f->type == FB_CFG_STR_LIST;
	yaml_event_t *ev = &c->ev;

	if (ev->type == YAML_ALIAS_EVENT) {
		return alias_fail(c, key);
	}
	if (event_is_null(ev)) {
		if (f->def == NULL) {
			return cfg_fail(c, ev->start_mark, key,
			    "no value given (this key is required)");
		}
		return FB_OK; /* null: keep the default */
	}
	if (list) {
		if (ev->type != YAML_SEQUENCE_START_EVENT) {
			return cfg_fail(c, ev->start_mark, key,
			    "expected a %s such as [a, b], found %s",
			    type_names[f->type], event_noun(ev));
		}
		return parse_list(c, key, f);
	}
	if (ev->type != YAML_SCALAR_EVENT) {
		return cfg_fail(c, ev->start_mark, key,
		    "expected a single %s value, found %s",
		    f->type == FB_CFG_ENUM ? "name" : type_names[f->type],
		    event_noun(ev));
	}
	return set_scalar(c, ev->start_mark, key, f,
	    (const char *)ev->data.scalar.value, ev->data.scalar.length);
}

/* ---- the walk ----------------------------------------------------------- */

static fb_err
enter_section(cfg_ctx *c, size_t field, yaml_mark_t m)
{
	size_t len = strlen(c->path);
	for (size_t i = 0; i < c->nsections; i++) {
		const cfg_section *s = &c->sections[i];
		if (s->len == len &&
		    strncmp(c->schema[s->field].key, c->path, len) == 0) {
			return cfg_fail(c, m, c->path,
			    "duplicate key (first given at line %zu)",
			    s->mark.line + 1);
		}
	}
	FB_ASSERT(c->nsections < c->cap_sections);
	c->sections[c->nsections].field = field;
	c->sections[c->nsections].len = len;
	c->sections[c->nsections].mark = m;
	c->nsections++;
	return FB_OK;
}

static fb_err parse_mapping(cfg_ctx *c);

/*
 * parse_key handles one key of the mapping at c->path; the key's scalar
 * event is current. On return c->path is as it was.
 */
static fb_err
parse_key(cfg_ctx *c)
{
	fb_err rc = FB_OK;
	size_t plen = strlen(c->path);
	const char *text = (const char *)c->ev.data.scalar.value;
	size_t len = c->ev.data.scalar.length;
	yaml_mark_t km = c->ev.start_mark;
	const fb_cfg_field *f = NULL;
	size_t section = SIZE_MAX;
	char shown[CFG_PATH_MAX + 4 * CFG_ECHO_MAX + 2];

	{
		char e[4 * CFG_ECHO_MAX];
		snprintf(shown, sizeof(shown), "%s%s%s", c->path,
		    plen > 0 ? "." : "",
		    len > 0 ? echo(e, sizeof(e), text, len) : "''");
	}
	if (event_is_null(&c->ev)) {
		rc = cfg_fail(
		    c, km, c->path, "a key must be a name, found an empty key");
		goto out;
	}
	if (memchr(text, '.', len) != NULL) {
		rc = cfg_fail(c, km, shown,
		    "dotted keys are not accepted; nest the names as "
		    "mappings instead");
		goto out;
	}
	if (strlen(text) == len && plen + 1 + len <= CFG_PATH_MAX) {
		snprintf(c->path + plen, sizeof(c->path) - plen, "%s%s",
		    plen > 0 ? "." : "", text);
		f = find_field(c, c->path);
		if (f == NULL) {
			section = find_section(c, c->path);
		}
	}
	if (f == NULL && section == SIZE_MAX) {
		char list[CFG_MSG_MAX / 2], sug[CFG_PATH_MAX + 1];
		char hint[CFG_PATH_MAX + 32] = "";
		c->path[plen] = '\0';
		known_keys(c, c->path, strlen(text) == len ? text : "", list,
		    sizeof(list), sug, sizeof(sug));
		if (sug[0] != '\0') {
			snprintf(
			    hint, sizeof(hint), "; did you mean '%s'?", sug);
		}
		if (plen > 0) {
			rc = cfg_fail(c, km, shown,
			    "unknown key%s (known keys under '%s': %s)", hint,
			    c->path, list);
		} else {
			rc = cfg_fail(c, km, shown,
			    "unknown key%s (known keys: %s)", hint, list);
		}
		goto out;
	}
	if (f != NULL) {
		cfg_seen *s = &c->seen[f - c->schema];
		if (s->seen) {
			rc = cfg_fail(c, km, f->key,
			    "duplicate key (first given at line %zu)",
			    s->mark.line + 1);
			goto out;
		}
		s->seen = true;
		s->mark = km;
		if ((rc = next_event(c)) != FB_OK) {
			goto out;
		}
		s->value_mark = c->ev.start_mark;
		rc = parse_value(c, f->key, f);
		goto out;
	}
	if ((rc = enter_section(c, section, km)) != FB_OK) {
		goto out;
	}
	if ((rc = next_event(c)) != FB_OK) {
		goto out;
	}
	if (c->ev.type == YAML_MAPPING_START_EVENT) {
		rc = parse_mapping(c);
	} else if (c->ev.type == YAML_ALIAS_EVENT) {
		rc = alias_fail(c, c->path);
	} else if (!event_is_null(&c->ev)) {
		/* A null section (all its keys commented out) is empty. */
		char list[CFG_MSG_MAX / 2], sug[4], e[4 * CFG_ECHO_MAX + 2];
		known_keys(
		    c, c->path, "", list, sizeof(list), sug, sizeof(sug));
		if (c->ev.type == YAML_SCALAR_EVENT) {
			e[0] = '\'';
			echo(e + 1, sizeof(e) - 2,
			    (const char *)c->ev.data.scalar.value,
			    c->ev.data.scalar.length);
			strcat(e, "'");
		} else {
			snprintf(e, sizeof(e), "%s", event_noun(&c->ev));
		}
		rc = cfg_fail(c, c->ev.start_mark, c->path,
		    "expected a mapping of keys (%s), found %s", list, e);
	}
out:
	c->path[plen] = '\0';
	return rc;
}

/* parse_mapping reads keys until the end of the mapping that is current. */
static fb_err
parse_mapping(cfg_ctx *c)
{
	fb_err rc = FB_OK;

	for (;;) {
		if ((rc = next_event(c)) != FB_OK) {
			goto out;
		}
		switch (c->ev.type) {
		case YAML_MAPPING_END_EVENT:
			goto out;
		case YAML_SCALAR_EVENT:
			rc = parse_key(c);
			break;
		case YAML_ALIAS_EVENT:
			rc = alias_fail(c, c->path);
			break;
		default:
			rc = cfg_fail(c, c->ev.start_mark, c->path,
			    "a key must be a name, found %s",
			    event_noun(&c->ev));
			break;
		}
		if (rc != FB_OK) {
			goto out;
		}
	}
out:
	return rc;
}

/* parse_document walks the whole stream: zero or one document. */
static fb_err
parse_document(cfg_ctx *c)
{
	fb_err rc = FB_OK;

	if ((rc = next_event(c)) != FB_OK) { /* stream start */
		goto out;
	}
	if ((rc = next_event(c)) != FB_OK) {
		goto out;
	}
	if (c->ev.type == YAML_STREAM_END_EVENT) {
		goto out; /* empty, or only comments: all defaults */
	}
	if ((rc = next_event(c)) != FB_OK) { /* the root node */
		goto out;
	}
	if (c->ev.type == YAML_MAPPING_START_EVENT) {
		rc = parse_mapping(c);
	} else if (c->ev.type == YAML_ALIAS_EVENT) {
		rc = alias_fail(c, NULL);
	} else if (!event_is_null(&c->ev)) {
		rc = cfg_fail(c, c->ev.start_mark, NULL,
		    "the top level must be a mapping of keys, found %s",
		    event_noun(&c->ev));
	}
	if (rc != FB_OK) {
		goto out;
	}
	if ((rc = next_event(c)) != FB_OK) { /* document end */
		goto out;
	}
	if ((rc = next_event(c)) != FB_OK) {
		goto out;
	}
	if (c->ev.type == YAML_DOCUMENT_START_EVENT) {
		rc = cfg_fail(c, c->ev.start_mark, NULL,
		    "a second YAML document; a config holds exactly one");
	}
out:
	return rc;
}

static fb_err
check_required(cfg_ctx *c)
{
	char more[CFG_MSG_MAX / 2];
	const fb_cfg_field *first = NULL;
	size_t n = 0;

	more[0] = '\0';
	for (size_t i = 0; i < c->nfields; i++) {
		const fb_cfg_field *f = &c->schema[i];
		if (f->def != NULL || c->seen[i].seen) {
			continue;
		}
		if (first == NULL) {
			first = f;
		} else if (n + strlen(f->key) + 8 < sizeof(more)) {
			n += (size_t)snprintf(more + n, sizeof(more) - n,
			    "%s%s", n > 0 ? ", " : "", f->key);
		}
	}
	if (first == NULL) {
		return FB_OK;
	}
	if (n > 0) {
		fb_log_error("%s: %s: required key is missing (also missing: "
		             "%s)",
		    c->name, first->key, more);
	} else {
		fb_log_error(
		    "%s: %s: required key is missing", c->name, first->key);
	}
	return FB_ECONFIG;
}

/* ---- schema checks and defaults ----------------------------------------- */

static size_t
schema_check(const fb_cfg_field *schema, size_t *depth_sum)
{
	size_t n = 0;

	*depth_sum = 0;
	for (; schema[n].key != NULL; n++) {
		const fb_cfg_field *f = &schema[n];
		size_t len = strlen(f->key);
		FB_ASSERT(len > 0 && len <= CFG_PATH_MAX);
		FB_ASSERT(f->key[0] != '.' && f->key[len - 1] != '.' &&
		          strstr(f->key, "..") == NULL);
		FB_ASSERT((unsigned)f->type <= FB_CFG_PATH);
		FB_ASSERT(f->type != FB_CFG_ENUM ||
		          (f->names != NULL && f->names[0] != NULL));
		for (const char *d = f->key; (d = strchr(d, '.')) != NULL;
		     d++) {
			(*depth_sum)++;
		}
		for (size_t j = 0; j < n; j++) {
			const char *o = schema[j].key;
			size_t olen = strlen(o);
			/* No duplicates, and no key that is also a section. */
			FB_ASSERT(strcmp(o, f->key) != 0);
			FB_ASSERT(
			    !(olen < len && strncmp(o, f->key, olen) == 0 &&
			        f->key[olen] == '.'));
			FB_ASSERT(
			    !(len < olen && strncmp(o, f->key, len) == 0 &&
			        o[len] == '.'));
		}
	}
	return n;
}

/* list_default parses a list field's default ("[256, 128]") with libyaml. */
static fb_err
list_default(cfg_ctx *d, const fb_cfg_field *f)
{
	fb_err rc;

	if ((rc = next_event(d)) != FB_OK || /* stream start */
	    (rc = next_event(d)) != FB_OK) {
		return rc;
	}
	if (d->ev.type == YAML_STREAM_END_EVENT) {
		return FB_OK; /* "": empty list */
	}
	if ((rc = next_event(d)) != FB_OK) {
		return rc;
	}
	if (event_is_null(&d->ev)) {
		return FB_OK;
	}
	if (d->ev.type != YAML_SEQUENCE_START_EVENT) {
		return cfg_fail(
		    d, d->ev.start_mark, f->key, "default is not a sequence");
	}
	return parse_list(d, f->key, f);
}

static fb_err
apply_defaults(const fb_cfg_field *schema, size_t n, void *out)
{
	fb_err rc = FB_OK;

	for (size_t i = 0; i < n && rc == FB_OK; i++) {
		const fb_cfg_field *f = &schema[i];
		cfg_ctx d;
		yaml_mark_t zero;

		if (f->def == NULL) {
			continue;
		}
		memset(&d, 0, sizeof(d));
		memset(&zero, 0, sizeof(zero));
		d.name = "(schema default)";
		d.src = f->def;
		d.src_len = strlen(f->def);
		d.schema = schema;
		d.nfields = n;
		d.out = out;
		if (f->type != FB_CFG_INT_LIST && f->type != FB_CFG_STR_LIST) {
			rc = set_scalar(
			    &d, zero, f->key, f, f->def, strlen(f->def));
			FB_ASSERT(rc == FB_OK || rc == FB_ENOMEM);
			continue;
		}
		if (!yaml_parser_initialize(&d.parser)) {
			rc = cfg_nomem(&d);
			break;
		}
		yaml_parser_set_input_string(
		    &d.parser, (const unsigned char *)f->def, d.src_len);
		rc = list_default(&d, f);
		if (d.have_ev) {
			yaml_event_delete(&d.ev);
		}
		yaml_parser_delete(&d.parser);
		/* A default that does not parse is a bug in the schema. */
		FB_ASSERT(rc == FB_OK || rc == FB_ENOMEM);
	}
	return rc;
}

/* ---- public API ---------------------------------------------------------- */

void
fb_cfg_free(const fb_cfg_field *schema, void *out)
{
	if (schema == NULL || out == NULL) {
		return;
	}
	for (const fb_cfg_field *f = schema; f->key != NULL; f++) {
		value_release(out, f);
	}
}

/* load_doc is fb_cfg_load_string with relative paths resolved in `base`
 * (none when NULL), recording positions in `pos` (or not, when NULL). */
static fb_err
load_doc(const char *name, const char *base, const char *yaml, size_t len,
    const fb_cfg_field *schema, void *out, fb_cfg_pos *pos)
{
	fb_err rc = FB_OK;
	cfg_ctx c;
	size_t depth_sum = 0;

	FB_ASSERT(schema != NULL && out != NULL);
	FB_ASSERT(yaml != NULL || len == 0);
	memset(&c, 0, sizeof(c));
	c.name = name != NULL ? name : "(config)";
	c.base = base;
	c.src = yaml != NULL ? yaml : "";
	c.src_len = len;
	c.schema = schema;
	c.out = out;
	c.nfields = schema_check(schema, &depth_sum);
	for (size_t i = 0; i < c.nfields; i++) {
		value_zero(out, &schema[i]);
	}
	if ((rc = apply_defaults(schema, c.nfields, out)) != FB_OK) {
		goto out;
	}
	c.seen = calloc(c.nfields + 1, sizeof(*c.seen));
	c.cap_sections = depth_sum;
	c.sections = calloc(depth_sum + 1, sizeof(*c.sections));
	if (c.seen == NULL || c.sections == NULL) {
		rc = cfg_nomem(&c);
		goto out;
	}
	if (!yaml_parser_initialize(&c.parser)) {
		rc = cfg_nomem(&c);
		goto out;
	}
	c.parser_ok = true;
	yaml_parser_set_input_string(
	    &c.parser, (const unsigned char *)c.src, len);
	if ((rc = parse_document(&c)) != FB_OK) {
		goto out;
	}
	if ((rc = check_required(&c)) != FB_OK) {
		goto out;
	}
	for (size_t i = 0; pos != NULL && i < c.nfields; i++) {
		const cfg_seen *s = &c.seen[i];
		pos[i].line = s->seen ? s->value_mark.line + 1 : 0;
		pos[i].column = s->seen ? s->value_mark.column + 1 : 0;
	}
out:
	if (c.have_ev) {
		yaml_event_delete(&c.ev);
	}
	if (c.parser_ok) {
		yaml_parser_delete(&c.parser);
	}
	free(c.seen);
	free(c.sections);
	if (rc != FB_OK) {
		fb_cfg_free(schema, out);
	}
	return rc;
}

fb_err
fb_cfg_load_string(const char *name, const char *yaml, size_t len,
    const fb_cfg_field *schema, void *out)
{
	return load_doc(name, NULL, yaml, len, schema, out, NULL);
}

/*
 * config_folder returns the absolute folder of file `path` (heap), or NULL
 * after logging why. The working directory is joined as it is (getcwd), and
 * the file's own name is dropped; links are not resolved.
 */
static char *
config_folder(const char *path)
{
	const char *slash = strrchr(path, '/');
	int dlen = slash != NULL ? (int)(slash - path) : 0;
	char *cwd = NULL, *dir = NULL;
	size_t size;

	if (path[0] == '/') {
		/* "/c.yaml" lives in "/": keep the one slash. */
		return str_dup(path, dlen > 0 ? (size_t)dlen : 1);
	}
	if ((cwd = getcwd(NULL, 0)) == NULL) {
		fb_log_error("%s: cannot tell the working directory that the "
		             "config's relative paths resolve against: %s",
		    path, strerror(errno));
		return NULL;
	}
	if (dlen == 0) {
		return cwd;
	}
	size = strlen(cwd) + 1 + (size_t)dlen + 1;
	if ((dir = malloc(size)) == NULL) {
		fb_log_error("%s: out of memory", path);
	} else {
		snprintf(dir, size, "%s%s%.*s", cwd,
		    strcmp(cwd, "/") == 0 ? "" : "/", dlen, path);
	}
	free(cwd);
	return dir;
}

fb_err
fb_cfg_load(const char *path, const fb_cfg_field *schema, void *out)
{
	return fb_cfg_load_pos(path, schema, out, NULL);
}

fb_err
fb_cfg_load_pos(const char *path, const fb_cfg_field *schema, void *out,
    fb_cfg_pos *pos)
{
	fb_err rc = FB_OK;
	FILE *fp = NULL;
	char *buf = NULL, *base = NULL;
	size_t len = 0, cap = 0;

	FB_ASSERT(path != NULL && schema != NULL && out != NULL);
	/* Leave `out` in its freed state whatever happens below. */
	for (const fb_cfg_field *f = schema; f->key != NULL; f++) {
		value_zero(out, f);
	}
	if ((fp = fopen(path, "rb")) == NULL) {
		fb_log_error(
		    "%s: cannot open config file: %s", path, strerror(errno));
		rc = FB_ECONFIG;
		goto out;
	}
	for (;;) {
		size_t got;
		if (len == cap) {
			char *nb;
			if (cap >= CFG_FILE_MAX) {
				fb_log_error("%s: config file is larger than "
				             "%u MiB",
				    path, CFG_FILE_MAX >> 20);
				rc = FB_ECONFIG;
				goto out;
			}
			cap = cap == 0 ? 4096 : cap * 2;
			if ((nb = realloc(buf, cap + 1)) == NULL) {
				fb_log_error("%s: out of memory", path);
				rc = FB_ENOMEM;
				goto out;
			}
			buf = nb;
		}
		got = fread(buf + len, 1, cap - len, fp);
		len += got;
		if (got == 0) {
			break;
		}
	}
	if (ferror(fp)) {
		fb_log_error(
		    "%s: cannot read config file: %s", path, strerror(errno));
		rc = FB_ECONFIG;
		goto out;
	}
	if ((base = config_folder(path)) == NULL) {
		rc = FB_ECONFIG;
		goto out;
	}
	rc = load_doc(path, base, buf, len, schema, out, pos);
out:
	if (fp != NULL) {
		fclose(fp);
	}
	free(buf);
	free(base);
	return rc;
}

size_t
fb_cfg_count(const fb_cfg_field *schema)
{
	size_t n = 0;

	while (schema[n].key != NULL) {
		n++;
	}
	return n;
}

/* pos_of finds `key`'s entry in `pos`; a key not in the schema is a bug. */
static const fb_cfg_pos *
pos_of(const fb_cfg_field *schema, const fb_cfg_pos *pos, const char *key,
    const fb_cfg_field **field)
{
	for (size_t i = 0; schema[i].key != NULL; i++) {
		if (strcmp(schema[i].key, key) == 0) {
			*field = &schema[i];
			return &pos[i];
		}
	}
	FB_ASSERT(!"fb_cfg: key not in the schema");
	return NULL;
}

bool
fb_cfg_given(const fb_cfg_field *schema, const fb_cfg_pos *pos,
    const char *key)
{
	const fb_cfg_field *f = NULL;

	return pos_of(schema, pos, key, &f)->line > 0;
}

fb_err
fb_cfg_error(const char *path, const fb_cfg_field *schema,
    const fb_cfg_pos *pos, const char *key, const char *fmt, ...)
{
	const fb_cfg_field *f = NULL;
	const fb_cfg_pos *p = pos_of(schema, pos, key, &f);
	char msg[CFG_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (p->line > 0) {
		fb_log_error("%s:%zu:%zu: %s: %s", path, p->line, p->column,
		    key, msg);
	} else {
		fb_log_error("%s: %s: %s (not set: the default is %s)", path,
		    key, msg,
		    f->def == NULL || f->def[0] == '\0' ? "empty" : f->def);
	}
	return FB_ECONFIG;
}

/* md_cell writes `s` into a Markdown table cell, escaping pipes. */
static void
md_cell(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s == '|') {
			fputs("\\|", f);
		} else if (*s == '\n') {
			fputc(' ', f);
		} else {
			fputc(*s, f);
		}
	}
}

void
fb_cfg_print_reference(FILE *fp, const fb_cfg_field *schema)
{
	fputs("| key | type | default | description |\n", fp);
	fputs("|---|---|---|---|\n", fp);
	for (const fb_cfg_field *f = schema; f->key != NULL; f++) {
		fprintf(fp, "| `%s` | ", f->key);
		if (f->type == FB_CFG_ENUM) {
			fputs("one of: ", fp);
			for (int i = 0; f->names[i] != NULL; i++) {
				fprintf(
				    fp, "%s%s", i > 0 ? ", " : "", f->names[i]);
			}
		} else {
			fputs(type_names[f->type], fp);
		}
		if (has_bounds(f) && f->type != FB_CFG_BOOL &&
		    f->type != FB_CFG_ENUM && f->type != FB_CFG_STRING &&
		    f->type != FB_CFG_PATH &&
		    f->type != FB_CFG_STR_LIST) {
			char lo[64], hi[64];
			fprintf(fp, ", %s to %s",
			    fmt_bound(lo, sizeof(lo), f, f->min),
			    fmt_bound(hi, sizeof(hi), f, f->max));
		}
		for (int i = 0; (f->type == FB_CFG_INT ||
		                    f->type == FB_CFG_DURATION) &&
		     f->names != NULL && f->names[i] != NULL; i++) {
			fprintf(fp, " or %s", f->names[i]);
		}
		fputs(" | ", fp);
		if (f->def == NULL) {
			fputs("(required)", fp);
		} else if (f->def[0] == '\0') {
			fputs("`\"\"`", fp);
		} else {
			fputc('`', fp);
			md_cell(fp, f->def);
			fputc('`', fp);
		}
		fputs(" | ", fp);
		md_cell(fp, f->doc != NULL ? f->doc : "");
		fputs(" |\n", fp);
	}
}
