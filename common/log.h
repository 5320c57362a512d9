/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.h -- leveled logging to stderr or a file, as text or JSON lines.
 *
 * Text lines look like `2026-11-30T01:02:03.456Z coordinator INFO message`;
 * JSON lines are one object each, `{"time": "2026-11-30T01:02:03.456Z",
 * "level": "info", "program": "coordinator", "message": "..."}`, with the
 * strings escaped so that every line parses whatever bytes the message
 * holds (invalid UTF-8 becomes U+FFFD). Logging is thread-safe (one
 * write(2) per line, O_APPEND for files). Secrets never go here.
 */
#ifndef FB_COMMON_LOG_H
#define FB_COMMON_LOG_H

#include "common/err.h"

typedef enum fb_log_level {
	FB_LOG_DEBUG = 0,
	FB_LOG_INFO,
	FB_LOG_WARN,
	FB_LOG_ERROR,
} fb_log_level;

typedef enum fb_log_format {
	FB_LOG_TEXT = 0,
	FB_LOG_JSON,
} fb_log_format;

/* fb_log_init sets the program name shown on each line and the level. The
 * name is not copied: it must outlive the logging. Not thread-safe with
 * fb_log: call it before other threads start. */
void fb_log_init(const char *prog, fb_log_level level);

/* fb_log_level_parse maps "debug|info|warn|error" to a level; -1 if none. */
int fb_log_level_parse(const char *s);

/* fb_log_format_parse maps "text|json" to a format; -1 if none. */
int fb_log_format_parse(const char *s);

/*
 * fb_log_output sends the lines that follow to the file `path` (opened
 * for appending, created with mode 0644 if absent; NULL = stderr) in
 * `format`. A file opened by an earlier call is closed. Not thread-safe
 * with fb_log: call it before other threads start. On failure (FB_EIO:
 * the file cannot be opened, the reason logged where lines went so far)
 * the output stays as it was.
 */
FB_MUST_CHECK fb_err fb_log_output(const char *path, fb_log_format format);

/* fb_log writes one line at `level` when it is at least the level set;
 * longer messages are cut at about 2 KiB. Thread-safe. */
void fb_log(fb_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * fb_log_last_error returns the message (without time, program or level,
 * cut at FB_LOG_LAST_MAX - 1 bytes) of the last error-level line the
 * calling thread logged since it last called fb_log_clear_error, or ""
 * if none; errors are kept even when the level set hides them. The text
 * is the thread's own, valid until its next fb_log call. So a thread
 * whose work failed can say why to someone else.
 */
#define FB_LOG_LAST_MAX 256
const char *fb_log_last_error(void);
void fb_log_clear_error(void);

#define fb_log_debug(...) fb_log(FB_LOG_DEBUG, __VA_ARGS__)
#define fb_log_info(...) fb_log(FB_LOG_INFO, __VA_ARGS__)
#define fb_log_warn(...) fb_log(FB_LOG_WARN, __VA_ARGS__)
#define fb_log_error(...) fb_log(FB_LOG_ERROR, __VA_ARGS__)

#endif
