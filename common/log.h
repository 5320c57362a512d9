/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.h -- leveled logging to stderr.
 *
 * Lines look like `2026-11-30T01:02:03.456Z coordinator INFO message`.
 * Logging is thread-safe (one write(2) per line). Secrets never go here.
 */
#ifndef FB_COMMON_LOG_H
#define FB_COMMON_LOG_H

typedef enum fb_log_level {
	FB_LOG_DEBUG = 0,
	FB_LOG_INFO,
	FB_LOG_WARN,
	FB_LOG_ERROR,
} fb_log_level;

/* fb_log_init sets the program name shown on each line and the level. */
void fb_log_init(const char *prog, fb_log_level level);

/* fb_log_level_parse maps "debug|info|warn|error" to a level; -1 if none. */
int fb_log_level_parse(const char *s);

void fb_log(fb_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define fb_log_debug(...) fb_log(FB_LOG_DEBUG, __VA_ARGS__)
#define fb_log_info(...) fb_log(FB_LOG_INFO, __VA_ARGS__)
#define fb_log_warn(...) fb_log(FB_LOG_WARN, __VA_ARGS__)
#define fb_log_error(...) fb_log(FB_LOG_ERROR, __VA_ARGS__)

#endif
