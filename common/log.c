/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.c -- leveled logging. Each line is formatted into one buffer and
 * written with a single write(2), so lines from threads never interleave.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

static const char *log_prog = "fedbox";
static fb_log_level log_min = FB_LOG_INFO;
static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void
fb_log_init(const char *prog, fb_log_level level)
{
	log_prog = prog;
	log_min = level;
}

int
fb_log_level_parse(const char *s)
{
	static const char *const names[] = {"debug", "info", "warn", "error"};
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(s, names[i]) == 0) {
			return i;
		}
	}
	return -1;
}

void
fb_log(fb_log_level level, const char *fmt, ...)
{
	char line[2048];
	struct timeval tv;
	struct tm tm;
	size_t n;
	va_list ap;
	int k;

	if (level < log_min) {
		return;
	}
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	k = snprintf(line + n, sizeof(line) - n, ".%03dZ %s %s ",
	    (int)(tv.tv_usec / 1000), log_prog, level_names[level]);
	if (k > 0) {
		n += (size_t)k;
	}
	va_start(ap, fmt);
	k = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	if (k > 0) {
		n += (size_t)k < sizeof(line) - n - 1 ? (size_t)k
		                                      : sizeof(line) - n - 2;
	}
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, n) < 0) {
		/* Nowhere left to report it. */
	}
}
