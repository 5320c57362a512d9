/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.h -- schema-driven YAML configuration.
 *
 * A program describes its configuration as a table of fields (dotted key,
 * type, offset into its own struct, default, bounds, one line of doc). The
 * loader fills the struct from a YAML file: defaults first, then the file.
 * Unknown keys, wrong types, bad units and out-of-range values are errors
 * that name file:line:column and the key, logged once, and the call returns
 * FB_ECONFIG. The same table prints the reference documentation, so docs and
 * defaults cannot drift apart.
 *
 * Value syntax:
 *   duration: integer or decimal with unit ms, s, m, h ("30s", "1.5s",
 *             "250ms"); a bare number is refused (units are mandatory).
 *   size:     integer with unit B, KiB, MiB, GiB, TiB, kB, MB, GB ("4MiB");
 *             a bare integer means bytes.
 *   bool:     true/false (also yes/no, on/off).
 *   enum:     one of the names in the field's list.
 *   int list: a YAML sequence of integers ("[256, 128]").
 *   string list: a YAML sequence of strings.
 *   path:     a string naming a file or folder. A relative path written in
 *             a config file resolves against the folder of that file, not
 *             the working directory ("keys/box-0.key" in
 *             /etc/fedbox/worker.yaml is /etc/fedbox/keys/box-0.key);
 *             absolute paths, "" and the defaults are kept as written.
 *
 * A YAML null (`key:`, `key: ~`, `key: null`) keeps the default; for a
 * required field it is an error. A quoted empty string ("") is a value. A
 * section left null (all its keys commented out) is empty. Dotted keys
 * (`round.deadline: 30s` at the top level) and aliases (*name) are refused;
 * anchors and tags are ignored. An empty file, or one holding only comments,
 * gives all defaults.
 */
#ifndef FB_COMMON_CONFIG_H
#define FB_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

typedef enum fb_cfg_type {
	FB_CFG_INT,      /* int64_t, bounds min..max */
	FB_CFG_FLOAT,    /* double, bounds min..max */
	FB_CFG_BOOL,     /* bool */
	FB_CFG_STRING,   /* char * (heap; fb_cfg_free releases it); "" allowed */
	FB_CFG_DURATION, /* int64_t milliseconds, bounds in ms */
	FB_CFG_SIZE,     /* uint64_t bytes, bounds in bytes */
	FB_CFG_ENUM,     /* int: index into `names` */
	FB_CFG_INT_LIST, /* fb_cfg_int_list; each element within min..max */
	FB_CFG_STR_LIST, /* fb_cfg_str_list */
	FB_CFG_PATH,     /* char * as FB_CFG_STRING; relative values written
	                  * in a file resolve against the file's folder */
} fb_cfg_type;

#define FB_CFG_MAX_LIST 64

typedef struct fb_cfg_int_list {
	int64_t v[FB_CFG_MAX_LIST];
	size_t count;
} fb_cfg_int_list;

typedef struct fb_cfg_str_list {
	char *v[FB_CFG_MAX_LIST]; /* heap strings; fb_cfg_free releases them */
	size_t count;
} fb_cfg_str_list;

typedef struct fb_cfg_field {
	const char *key;          /* dotted path, e.g. "round.deadline" */
	fb_cfg_type type;
	size_t offset;            /* offsetof() into the target struct */
	const char *def;          /* default as YAML scalar text; NULL: required */
	double min, max;          /* inclusive bounds; ignored when min > max */
	const char *const *names; /* FB_CFG_ENUM: NULL-terminated names;
	                           * FB_CFG_INT, FB_CFG_DURATION: words
	                           * also accepted, stored as -1, -2, ...
	                           * (e.g. "auto", "forever");
	                           * FB_CFG_PATH: prefixes of values that are
	                           * not paths, kept as written (e.g. a key
	                           * line given instead of its file) */
	const char *doc;          /* one-line description for the reference */
} fb_cfg_field;

/*
 * fb_cfg_load reads YAML file `path` into `out` according to `schema`
 * (terminated by an entry with key == NULL). Every field is first set to its
 * default; a field without default (def == NULL) must appear in the file.
 * The top level must be a mapping; nested mappings form dotted keys.
 * On error the message (file:line:column, key, what is wrong) is logged with
 * fb_log_error and FB_ECONFIG is returned (also for a file that cannot be
 * read; FB_ENOMEM when memory runs out); `out` is then freed with
 * fb_cfg_free and must not be used. `out` is overwritten: free a previous
 * load first. Relative FB_CFG_PATH values resolve against the absolute
 * folder of `path` (the working directory joined with a relative `path`'s
 * folder; symbolic links are not followed). Not thread-safe with respect
 * to `out`.
 */
FB_MUST_CHECK fb_err fb_cfg_load(const char *path, const fb_cfg_field *schema,
    void *out);

/* fb_cfg_load_string is fb_cfg_load on an in-memory document; `name` stands
 * for the file name in messages. With no file there is no folder: FB_CFG_PATH
 * values are kept as written. */
FB_MUST_CHECK fb_err fb_cfg_load_string(const char *name, const char *yaml,
    size_t len, const fb_cfg_field *schema, void *out);

/* Where a key's value was given: 1-based line and column; both 0 when the
 * key was not in the file (its default applies). */
typedef struct fb_cfg_pos {
	size_t line;
	size_t column;
} fb_cfg_pos;

/*
 * fb_cfg_load_pos is fb_cfg_load that also records where each key's value
 * was given, so that a program's own cross-checks can name file:line:column
 * too: pos[i] is for schema[i], and `pos` has one entry per schema field.
 * `pos` is written on FB_OK only. Errors as fb_cfg_load.
 */
FB_MUST_CHECK fb_err fb_cfg_load_pos(const char *path,
    const fb_cfg_field *schema, void *out, fb_cfg_pos *pos);

/* fb_cfg_count is the number of fields in `schema` (entries before the
 * terminating key == NULL). */
size_t fb_cfg_count(const fb_cfg_field *schema);

/*
 * fb_cfg_error logs one configuration error about `key` of file `path`,
 * placed by `pos` (from fb_cfg_load_pos over `schema`):
 * `FILE:LINE:COL: KEY: message` when the key was in the file, else
 * `FILE: KEY: message (not set: the default is DEFAULT)`. Returns FB_ECONFIG,
 * so that a check reads `rc = fb_cfg_error(...)`. `key` must be in `schema`.
 */
fb_err fb_cfg_error(const char *path, const fb_cfg_field *schema,
    const fb_cfg_pos *pos, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* fb_cfg_given says whether `key` (in `schema`) was set in the file. */
bool fb_cfg_given(const fb_cfg_field *schema, const fb_cfg_pos *pos,
    const char *key);

/* fb_cfg_free releases the strings and lists that a load allocated in `out`
 * and zeroes them. Safe on a zeroed struct and after a failed load. */
void fb_cfg_free(const fb_cfg_field *schema, void *out);

/* fb_cfg_print_reference writes a Markdown table (key, type, default, doc)
 * of `schema` to `f`. */
void fb_cfg_print_reference(FILE *f, const fb_cfg_field *schema);

/* Value parsers shared with command-line handling. Each returns FB_EINVAL
 * on a malformed value, a missing or unknown unit or a sign, and FB_ERANGE
 * when the value does not fit. Durations are rounded to whole ms. */
FB_MUST_CHECK fb_err fb_parse_duration_ms(const char *s, int64_t *ms);
FB_MUST_CHECK fb_err fb_parse_size(const char *s, uint64_t *bytes);

#endif
