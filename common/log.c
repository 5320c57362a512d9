/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.c -- leveled logging. Each line is formatted into one buffer and
 * written with a single write(2), so lines from threads never interleave;
 * a log file is opened with O_APPEND, so that several processes (or a
 * rotation by copy and truncate) may share it. The JSON form escapes the
 * message and the program name byte by byte: quotes, backslashes and
 * control bytes as JSON escapes, valid UTF-8 as is, any other byte as
 * U+FFFD.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

#define LOG_MSG_MAX 2048 /* message bytes kept */
#define LOG_PROG_MAX 128 /* program name bytes shown */

static const char *log_prog = "fedbox";
static fb_log_level log_min = FB_LOG_INFO;
static int log_fd = STDERR_FILENO;
static fb_log_format log_format = FB_LOG_TEXT;
static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
static const char *const level_words[] = {"debug", "info", "warn", "error"};

void
fb_log_init(const char *prog, fb_log_level level)
{
	log_prog = prog;
	log_min = level;
}

int
fb_log_level_parse(const char *s)
{
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(s, level_words[i]) == 0) {
			return i;
		}
	}
	return -1;
}

int
fb_log_format_parse(const char *s)
{
	if (strcmp(s, "text") == 0) {
		return FB_LOG_TEXT;
	}
	if (strcmp(s, "json") == 0) {
		return FB_LOG_JSON;
	}
	return -1;
}

fb_err
fb_log_output(const char *path, fb_log_format format)
{
	int fd = STDERR_FILENO;

	if (path != NULL) {
		fd = open(
		    path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0) {
			fb_log_error("cannot open the log file %s: %s", path,
			    strerror(errno));
			return FB_EIO;
		}
	}
	if (log_fd != STDERR_FILENO) {
		close(log_fd);
	}
	log_fd = fd;
	log_format = format;
	return FB_OK;
}

/* utf8_len is the length of the valid UTF-8 sequence at s (n bytes
 * left), 0 if the bytes there are not one. */
static size_t
utf8_len(const unsigned char *s, size_t n)
{
	size_t len;
	unsigned cp;

	if (s[0] < 0x80) {
		return 1;
	} else if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		len = 2;
		cp = s[0] & 0x1fu;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		len = 3;
		cp = s[0] & 0x0fu;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		len = 4;
		cp = s[0] & 0x07u;
	} else {
		return 0;
	}
	if (len > n) {
		return 0;
	}
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80) {
			return 0;
		}
		cp = (cp << 6) | (s[i] & 0x3fu);
	}
	/* No overlong forms, no surrogates, nothing past U+10FFFF. */
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
		return 0;
	}
	return len;
}

/* json_str appends `s` (n bytes) to out[*pos..cap) as a quoted JSON
 * string; out has room for 6 bytes per input byte plus the quotes. */
static void
json_str(char *out, size_t *pos, const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t p = *pos;

	out[p++] = '"';
	for (size_t i = 0; i < n;) {
		unsigned char c = u[i];
		size_t len;

		if (c == '"' || c == '\\') {
			out[p++] = '\\';
			out[p++] = (char)c;
			i++;
		} else if (c == '\n') {
			memcpy(out + p, "\\n", 2);
			p += 2;
			i++;
		} else if (c == '\t') {
			memcpy(out + p, "\\t", 2);
			p += 2;
			i++;
		} else if (c < 0x20 || c == 0x7f) {
			p += (size_t)sprintf(out + p, "\\u%04x", c);
			i++;
		} else if ((len = utf8_len(u + i, n - i)) > 0) {
			memcpy(out + p, u + i, len);
			p += len;
			i += len;
		} else {
			memcpy(out + p, "\\ufffd", 6);
			p += 6;
			i++;
		}
	}
	out[p++] = '"';
	*pos = p;
}

/* The last error this thread logged (fb_log_last_error). */
static _Thread_local char last_error[FB_LOG_LAST_MAX];

const char *
fb_log_last_error(void)
{
	return last_error;
}

void
fb_log_clear_error(void)
{
	last_error[0] = '\0';
}

void
fb_log(fb_log_level level, const char *fmt, ...)
{
	char msg[LOG_MSG_MAX];
	char stamp[40];
	/* JSON escapes take at most 6 bytes per byte. */
	char line[6 * (LOG_MSG_MAX + LOG_PROG_MAX) + 128];
	struct timeval tv;
	struct tm tm;
	size_t n, mlen;
	va_list ap;
	int k;

	if (level < log_min && level < FB_LOG_ERROR) {
		return;
	}
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(stamp + n, sizeof(stamp) - n, ".%03dZ",
	    (int)(tv.tv_usec / 1000));
	va_start(ap, fmt);
	k = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	mlen = k < 0                     ? 0
	    : (size_t)k < sizeof(msg) ? (size_t)k
	                              : sizeof(msg) - 1;
	if (level >= FB_LOG_ERROR) {
		snprintf(last_error, sizeof(last_error), "%.*s", (int)mlen, msg);
	}
	if (level < log_min) {
		return;
	}
	if (log_format == FB_LOG_JSON) {
		n = (size_t)snprintf(line, sizeof(line),
		    "{\"time\": \"%s\", \"level\": \"%s\", \"program\": ",
		    stamp, level_words[level]);
		json_str(line, &n, log_prog, strnlen(log_prog, LOG_PROG_MAX));
		memcpy(line + n, ", \"message\": ", 13);
		n += 13;
		json_str(line, &n, msg, mlen);
		line[n++] = '}';
	} else {
		n = (size_t)snprintf(line, sizeof(line), "%s %.*s %s %.*s",
		    stamp, LOG_PROG_MAX, log_prog, level_names[level],
		    (int)mlen, msg);
		if (n >= sizeof(line) - 1) {
			n = sizeof(line) - 2;
		}
	}
	line[n++] = '\n';
	if (write(log_fd, line, n) < 0) {
		/* Nowhere left to report it. */
	}
}
