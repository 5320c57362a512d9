/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_http_test.c -- the coordinator's Prometheus endpoint
 * (coordinator/metrics_http.h) over a real socket: a small HTTP/1.0 client
 * in this file scrapes it and checks the exposition text line by line
 * (HELP and TYPE for every family, label escaping, cumulative histogram
 * buckets, series that appear and go), the status codes of other paths and
 * methods, the listen-address checks, a taken port, a stalled client, and
 * setters racing scrapes on threads (run it under SAN=thread).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coordinator/metrics_http.h"
#include "tests/unit/harness.h"

/* ---- a small HTTP client ------------------------------------------------ */

typedef struct http_reply {
	int status;
	char *head; /* status line and headers */
	char *body;
} http_reply;

static int
dial(uint16_t port)
{
	struct sockaddr_in a;
	int s = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(s >= 0);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	return s;
}

/* request sends `req` verbatim and reads the reply until the server
 * closes (HTTP/1.0), at most 5 s. */
static http_reply
request(uint16_t port, const char *req)
{
	http_reply r = {0};
	size_t len = 0, cap = 1 << 16;
	char *buf = malloc(cap + 1);
	char *sep;
	int s = dial(port);

	assert_non_null(buf);
	assert_int_equal(
	    send(s, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
	for (;;) {
		struct pollfd p = {.fd = s, .events = POLLIN};
		ssize_t n;
		assert_int_equal(poll(&p, 1, 5000), 1);
		if (len == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
			assert_non_null(buf);
		}
		n = recv(s, buf + len, cap - len, 0);
		assert_true(n >= 0);
		if (n == 0) {
			break;
		}
		len += (size_t)n;
	}
	close(s);
	buf[len] = '\0';
	sep = strstr(buf, "\r\n\r\n");
	assert_non_null(sep);
	*sep = '\0';
	r.head = buf;
	r.body = sep + 4;
	assert_int_equal(sscanf(buf, "HTTP/1.%*d %d", &r.status), 1);
	return r;
}

static http_reply
get(uint16_t port, const char *path)
{
	char req[256];

	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
	return request(port, req);
}

static void
reply_free(http_reply *r)
{
	free(r->head);
	memset(r, 0, sizeof(*r));
}

/* has_line says whether `text` holds `line` as a whole line. */
static int
has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
		if ((p == text || p[-1] == '\n') &&
		    (p[n] == '\n' || p[n] == '\0')) {
			return 1;
		}
	}
	return 0;
}

#define assert_line(text, line)                                                \
	do {                                                                   \
		if (!has_line((text), (line))) {                               \
			print_error("missing line: %s\n--- in:\n%s\n", (line), \
			    (text));                                           \
			fail();                                                \
		}                                                              \
	} while (0)

#define assert_no_line(text, line)                                             \
	do {                                                                   \
		if (has_line((text), (line))) {                                \
			print_error("unexpected line: %s\n", (line));          \
			fail();                                                \
		}                                                              \
	} while (0)

/*
 * check_format checks every line of an exposition: a HELP, then a TYPE
 * for each family, before its samples; sample names made of
 * [a-zA-Z0-9_:] and belonging to the family in force (with _bucket, _sum,
 * _count for histograms); labels as name="value" with only \\, \" and \n
 * escapes; a value that strtod reads whole (or NaN, +Inf, -Inf); the text
 * ending in a line feed. Returns the number of samples.
 */
static int
check_format(const char *text)
{
	char family[128] = "", type[16] = "";
	int samples = 0;
	const char *p = text;

	assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
	while (*p != '\0') {
		const char *end = strchr(p, '\n');
		char line[1024], name[128];
		size_t n = (size_t)(end - p), k = 0;

		assert_non_null(end);
		assert_true(n < sizeof(line));
		memcpy(line, p, n);
		line[n] = '\0';
		p = end + 1;
		if (strncmp(line, "# HELP ", 7) == 0) {
			assert_int_equal(sscanf(line + 7, "%127s", family), 1);
			type[0] = '\0';
			continue;
		}
		if (strncmp(line, "# TYPE ", 7) == 0) {
			char tname[128];
			assert_int_equal(
			    sscanf(line + 7, "%127s %15s", tname, type), 2);
			assert_string_equal(tname, family);
			assert_true(strcmp(type, "gauge") == 0 ||
			            strcmp(type, "counter") == 0 ||
			            strcmp(type, "histogram") == 0);
			continue;
		}
		assert_true(line[0] != '#');
		assert_true(type[0] != '\0'); /* a sample needs its TYPE */
		while (line[k] != '\0' && line[k] != '{' && line[k] != ' ') {
			char c = line[k];
			assert_true(
			    (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			    (c >= '0' && c <= '9') || c == '_' || c == ':');
			name[k] = c;
			k++;
			assert_true(k < sizeof(name));
		}
		name[k] = '\0';
		if (strcmp(type, "histogram") == 0) {
			char b[160], s[160], c[160];
			snprintf(b, sizeof(b), "%s_bucket", family);
			snprintf(s, sizeof(s), "%s_sum", family);
			snprintf(c, sizeof(c), "%s_count", family);
			assert_true(strcmp(name, b) == 0 ||
			            strcmp(name, s) == 0 ||
			            strcmp(name, c) == 0);
		} else {
			assert_string_equal(name, family);
		}
		if (line[k] == '{') {
			k++;
			for (;;) {
				while (line[k] != '=' && line[k] != '\0') {
					assert_true(
					    line[k] != '"' && line[k] != ',');
					k++;
				}
				assert_int_equal(line[k], '=');
				assert_int_equal(line[k + 1], '"');
				k += 2;
				while (line[k] != '"') {
					assert_true(line[k] != '\0');
					if (line[k] == '\\') {
						char e = line[k + 1];
						assert_true(e == '\\' ||
						            e == '"' ||
						            e == 'n');
						k++;
					}
					k++;
				}
				k++;
				if (line[k] == ',') {
					k++;
					continue;
				}
				assert_int_equal(line[k], '}');
				k++;
				break;
			}
		}
		assert_int_equal(line[k], ' ');
		{
			const char *v = line + k + 1;
			char *vend;
			if (strcmp(v, "NaN") != 0 && strcmp(v, "+Inf") != 0 &&
			    strcmp(v, "-Inf") != 0) {
				errno = 0;
				(void)strtod(v, &vend);
				assert_true(vend != v && *vend == '\0');
			}
		}
		samples++;
	}
	return samples;
}

static fb_metrics *
start(uint32_t max_workers)
{
	fb_metrics *m = NULL;

	assert_int_equal(
	    fb_metrics_alloc("127.0.0.1:0", max_workers, &m), FB_OK);
	assert_non_null(m);
	assert_true(fb_metrics_port(m) > 0);
	return m;
}

/* ---- cases ------------------------------------------------------------ */

static void
test_values_shown(void **state)
{
	fb_metrics *m = start(8);
	http_reply r;

	(void)state;
	assert_int_equal(fb_metrics_set_round(m, 3, 20, "waiting"), FB_OK);
	assert_int_equal(fb_metrics_set_round(m, 3, 20, "training"), FB_OK);
	fb_metrics_set_test(m, 0.8512, 0.4137);
	fb_metrics_set_federated(m, 0.9, 0.25);
	fb_metrics_add_bytes(m, 1000, 2000);
	fb_metrics_add_bytes(m, 24, 48);
	assert_int_equal(fb_metrics_set_workers(m, "live", 4), FB_OK);
	assert_int_equal(fb_metrics_set_workers(m, "training", 3), FB_OK);
	assert_int_equal(fb_metrics_set_workers(m, "live", 5), FB_OK);
	assert_int_equal(fb_metrics_add_rejected(m, "bad_mac", 2), FB_OK);
	assert_int_equal(fb_metrics_add_rejected(m, "bad_mac", 1), FB_OK);
	assert_int_equal(fb_metrics_add_rejected(m, "replay", 0), FB_OK);
	assert_int_equal(fb_metrics_round_done(m, "ok", 2.7), FB_OK);
	assert_int_equal(fb_metrics_set_worker(m, 0, "box-0", 725.5), FB_OK);
	assert_int_equal(fb_metrics_add_worker_steps(m, 0, 100), FB_OK);
	assert_int_equal(fb_metrics_add_worker_steps(m, 0, 17), FB_OK);
	assert_int_equal(fb_metrics_set_worker(m, 5, "box-5", 12), FB_OK);

	r = get(fb_metrics_port(m), "/metrics");
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(
	    r.head, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
	check_format(r.body);
	assert_line(r.body, "# TYPE fedbox_round gauge");
	assert_line(r.body, "fedbox_round 3");
	assert_line(r.body, "fedbox_rounds_planned 20");
	assert_line(r.body, "fedbox_round_phase{phase=\"waiting\"} 0");
	assert_line(r.body, "fedbox_round_phase{phase=\"training\"} 1");
	assert_line(r.body, "# TYPE fedbox_rounds_total counter");
	assert_line(r.body, "fedbox_rounds_total{status=\"ok\"} 1");
	assert_line(r.body, "fedbox_test_accuracy 0.8512");
	assert_line(r.body, "fedbox_test_loss 0.4137");
	assert_line(r.body, "fedbox_federated_accuracy 0.9");
	assert_line(r.body, "fedbox_federated_loss 0.25");
	assert_line(r.body, "fedbox_upload_bytes_total 1024");
	assert_line(r.body, "fedbox_download_bytes_total 2048");
	assert_line(r.body, "fedbox_workers{state=\"live\"} 5");
	assert_line(r.body, "fedbox_workers{state=\"training\"} 3");
	assert_line(
	    r.body, "fedbox_rejected_messages_total{reason=\"bad_mac\"} 3");
	assert_line(
	    r.body, "fedbox_rejected_messages_total{reason=\"replay\"} 0");
	assert_line(
	    r.body, "fedbox_worker_steps_per_second{worker=\"box-0\"} 725.5");
	assert_line(
	    r.body, "fedbox_worker_steps_per_second{worker=\"box-5\"} 12");
	assert_line(r.body, "fedbox_worker_steps_total{worker=\"box-0\"} 117");
	/* box-5 reported no steps (a secure round): no such series. */
	assert_null(
	    strstr(r.body, "fedbox_worker_steps_total{worker=\"box-5\""));
	assert_non_null(strstr(r.body, "\nfedbox_start_time_seconds 1"));
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_every_family_has_help_and_type(void **state)
{
	static const char *const families[] = {"fedbox_round gauge",
	    "fedbox_rounds_planned gauge", "fedbox_round_phase gauge",
	    "fedbox_rounds_total counter",
	    "fedbox_round_duration_seconds histogram",
	    "fedbox_test_accuracy gauge", "fedbox_test_loss gauge",
	    "fedbox_federated_accuracy gauge", "fedbox_federated_loss gauge",
	    "fedbox_upload_bytes_total counter",
	    "fedbox_download_bytes_total counter", "fedbox_workers gauge",
	    "fedbox_rejected_messages_total counter",
	    "fedbox_worker_steps_per_second gauge",
	    "fedbox_worker_steps_total counter",
	    "fedbox_start_time_seconds gauge"};
	fb_metrics *m = start(1);
	http_reply r;
	char line[160];

	(void)state;
	r = get(fb_metrics_port(m), "/metrics");
	assert_int_equal(r.status, 200);
	check_format(r.body);
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
		char name[80];
		snprintf(line, sizeof(line), "# TYPE %s", families[i]);
		assert_line(r.body, line);
		sscanf(families[i], "%79s", name);
		snprintf(line, sizeof(line), "# HELP %s ", name);
		assert_non_null(strstr(r.body, line));
	}
	/* Nothing evaluated yet: no accuracy sample, round 0. */
	assert_null(strstr(r.body, "\nfedbox_test_accuracy "));
	assert_line(r.body, "fedbox_round 0");
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_label_escaping(void **state)
{
	fb_metrics *m = start(2);
	http_reply r;
	char long_name[200];

	(void)state;
	assert_int_equal(fb_metrics_add_rejected(m, "a\\b\"c\nd", 1), FB_OK);
	assert_int_equal(fb_metrics_set_worker(m, 1, "w \"one\"", 1.5), FB_OK);
	memset(long_name, 'x', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	assert_int_equal(fb_metrics_set_worker(m, 0, long_name, 2), FB_OK);
	r = get(fb_metrics_port(m), "/metrics");
	check_format(r.body);
	assert_line(r.body,
	    "fedbox_rejected_messages_total{reason=\"a\\\\b\\\"c\\nd\"} 1");
	assert_line(r.body,
	    "fedbox_worker_steps_per_second{worker=\"w \\\"one\\\"\"} 1.5");
	/* Cut at FB_METRICS_LABEL_MAX - 1 bytes. */
	{
		char want[200];
		snprintf(want, sizeof(want),
		    "fedbox_worker_steps_per_second{worker=\"%.*s\"} 2",
		    FB_METRICS_LABEL_MAX - 1, long_name);
		assert_line(r.body, want);
	}
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_histogram_cumulative(void **state)
{
	fb_metrics *m = start(1);
	http_reply r;

	(void)state;
	assert_int_equal(fb_metrics_round_done(m, "ok", 0.3), FB_OK);
	assert_int_equal(fb_metrics_round_done(m, "ok", 0.5), FB_OK);
	assert_int_equal(fb_metrics_round_done(m, "failed", 4), FB_OK);
	assert_int_equal(fb_metrics_round_done(m, "ok", 7200), FB_OK);
	r = get(fb_metrics_port(m), "/metrics");
	check_format(r.body);
	/* le is inclusive: 0.5 falls in the 0.5 bucket. */
	assert_line(
	    r.body, "fedbox_round_duration_seconds_bucket{le=\"0.5\"} 2");
	assert_line(r.body, "fedbox_round_duration_seconds_bucket{le=\"1\"} 2");
	assert_line(
	    r.body, "fedbox_round_duration_seconds_bucket{le=\"2.5\"} 2");
	assert_line(r.body, "fedbox_round_duration_seconds_bucket{le=\"5\"} 3");
	assert_line(
	    r.body, "fedbox_round_duration_seconds_bucket{le=\"3600\"} 3");
	assert_line(
	    r.body, "fedbox_round_duration_seconds_bucket{le=\"+Inf\"} 4");
	assert_line(r.body, "fedbox_round_duration_seconds_sum 7204.8");
	assert_line(r.body, "fedbox_round_duration_seconds_count 4");
	assert_line(r.body, "fedbox_rounds_total{status=\"ok\"} 3");
	assert_line(r.body, "fedbox_rounds_total{status=\"failed\"} 1");
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_series_come_and_go(void **state)
{
	fb_metrics *m = start(4);
	http_reply r;

	(void)state;
	fb_metrics_set_test(m, 0.5, 1.25);
	fb_metrics_set_test(m, NAN, 1.5);
	assert_int_equal(fb_metrics_set_worker(m, 2, "a", 10), FB_OK);
	assert_int_equal(fb_metrics_add_worker_steps(m, 2, 50), FB_OK);
	/* The slot passes to another worker: its counter starts over. */
	assert_int_equal(fb_metrics_set_worker(m, 2, "b", 20), FB_OK);
	assert_int_equal(fb_metrics_add_worker_steps(m, 2, 5), FB_OK);
	assert_int_equal(fb_metrics_set_worker(m, 3, "c", 30), FB_OK);
	fb_metrics_forget_worker(m, 3);
	fb_metrics_forget_worker(m, 3); /* a free slot: no-op */
	r = get(fb_metrics_port(m), "/metrics");
	check_format(r.body);
	assert_null(strstr(r.body, "\nfedbox_test_accuracy "));
	assert_line(r.body, "fedbox_test_loss 1.5");
	assert_null(strstr(r.body, "worker=\"a\""));
	assert_line(r.body, "fedbox_worker_steps_per_second{worker=\"b\"} 20");
	assert_line(r.body, "fedbox_worker_steps_total{worker=\"b\"} 5");
	assert_null(strstr(r.body, "worker=\"c\""));
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_async_series(void **state)
{
	static const uint32_t step1[] = {0, 1, 3};
	static const uint32_t step2[] = {9, 40};
	fb_metrics *m = start(1), *s = start(1);
	http_reply r;

	(void)state;
	/* A synchronous run shows none of the async families. */
	r = get(fb_metrics_port(m), "/metrics");
	check_format(r.body);
	assert_null(strstr(r.body, "fedbox_model_version"));
	assert_null(strstr(r.body, "fedbox_async_"));
	reply_free(&r);

	/* Started: every series at zero, no cohort family in plain async. */
	fb_metrics_async_start(m, false);
	r = get(fb_metrics_port(m), "/metrics");
	check_format(r.body);
	assert_line(r.body, "# TYPE fedbox_model_version gauge");
	assert_line(r.body, "fedbox_model_version 0");
	assert_line(r.body, "# TYPE fedbox_async_updates_total counter");
	assert_line(
	    r.body, "fedbox_async_updates_total{outcome=\"applied\"} 0");
	assert_line(r.body,
	    "fedbox_async_updates_total{outcome=\"dropped_stale\"} 0");
	assert_line(
	    r.body, "fedbox_async_updates_total{outcome=\"superseded\"} 0");
	assert_line(
	    r.body, "# TYPE fedbox_async_update_staleness histogram");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"+Inf\"} 0");
	assert_line(r.body, "fedbox_async_update_staleness_count 0");
	assert_null(strstr(r.body, "fedbox_async_cohorts_failed_total"));
	reply_free(&r);

	/* Two steps and a failed one: counts add, buckets are cumulative
	 * with an inclusive le, the version is the last step's. */
	fb_metrics_async_step(m, 1, step1, 3, 0, 1);
	fb_metrics_async_step(m, 2, step2, 2, 2, 0);
	fb_metrics_async_step(m, 2, NULL, 0, 1, 0);
	r = get(fb_metrics_port(m), "/metrics");
	check_format(r.body);
	assert_line(r.body, "fedbox_model_version 2");
	assert_line(
	    r.body, "fedbox_async_updates_total{outcome=\"applied\"} 5");
	assert_line(r.body,
	    "fedbox_async_updates_total{outcome=\"dropped_stale\"} 3");
	assert_line(
	    r.body, "fedbox_async_updates_total{outcome=\"superseded\"} 1");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"0\"} 1");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"1\"} 2");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"2\"} 2");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"4\"} 3");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"8\"} 3");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"16\"} 4");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"32\"} 4");
	assert_line(
	    r.body, "fedbox_async_update_staleness_bucket{le=\"+Inf\"} 5");
	assert_line(r.body, "fedbox_async_update_staleness_sum 53");
	assert_line(r.body, "fedbox_async_update_staleness_count 5");
	reply_free(&r);

	/* Secure async: the failed cohorts' counter, from zero. */
	fb_metrics_async_start(s, true);
	r = get(fb_metrics_port(s), "/metrics");
	check_format(r.body);
	assert_line(r.body, "# TYPE fedbox_async_cohorts_failed_total counter");
	assert_line(r.body, "fedbox_async_cohorts_failed_total 0");
	reply_free(&r);
	fb_metrics_cohort_failed(s);
	fb_metrics_cohort_failed(s);
	r = get(fb_metrics_port(s), "/metrics");
	check_format(r.body);
	assert_line(r.body, "fedbox_async_cohorts_failed_total 2");
	reply_free(&r);
	fb_metrics_free(m);
	fb_metrics_free(s);
}

static void
test_bad_setter_arguments(void **state)
{
	fb_metrics *m = start(2);
	char name[16];
	http_reply r;

	(void)state;
	assert_int_equal(fb_metrics_set_worker(m, 2, "x", 1), FB_EINVAL);
	assert_int_equal(fb_metrics_set_worker(m, 0, "", 1), FB_EINVAL);
	assert_int_equal(fb_metrics_add_worker_steps(m, 1, 1), FB_EINVAL);
	assert_int_equal(fb_metrics_set_workers(m, "", 1), FB_EINVAL);
	assert_int_equal(fb_metrics_add_rejected(m, NULL, 1), FB_EINVAL);
	for (int i = 0; i < FB_METRICS_MAX_LABELS; i++) {
		snprintf(name, sizeof(name), "reason%d", i);
		assert_int_equal(fb_metrics_add_rejected(m, name, 1), FB_OK);
	}
	assert_int_equal(
	    fb_metrics_add_rejected(m, "one_too_many", 1), FB_ENOMEM);
	/* Known values still count. */
	assert_int_equal(fb_metrics_add_rejected(m, "reason0", 1), FB_OK);
	r = get(fb_metrics_port(m), "/metrics");
	assert_int_equal(check_format(r.body) > FB_METRICS_MAX_LABELS, 1);
	assert_line(
	    r.body, "fedbox_rejected_messages_total{reason=\"reason0\"} 2");
	assert_null(strstr(r.body, "one_too_many"));
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_other_paths_and_methods(void **state)
{
	fb_metrics *m = start(1);
	uint16_t port = fb_metrics_port(m);
	http_reply r;

	(void)state;
	r = get(port, "/");
	assert_int_equal(r.status, 404);
	assert_non_null(strstr(r.body, "/metrics"));
	reply_free(&r);
	r = get(port, "/metrics/../etc/passwd");
	assert_int_equal(r.status, 404);
	reply_free(&r);
	r = request(port, "POST /metrics HTTP/1.0\r\nHost: x\r\n"
	                  "Content-Length: 5\r\n\r\nhello");
	assert_int_equal(r.status, 405);
	assert_non_null(strstr(r.head, "Allow: GET, HEAD"));
	reply_free(&r);
	r = request(port, "HEAD /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
	assert_int_equal(r.status, 200);
	assert_string_equal(r.body, "");
	reply_free(&r);
	r = request(port, "this is not http\r\n\r\n");
	assert_int_equal(r.status / 100, 4);
	reply_free(&r);
	fb_metrics_free(m);
}

static void
test_listen_forms(void **state)
{
	static const char *const good[] = {"127.0.0.1:9464", "0.0.0.0:0",
	    "localhost:9464", "[::1]:9464", "[::]:80", "host.example:65535"};
	static const char *const bad[] = {"", "9464", ":9464", "127.0.0.1",
	    "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:94a4", "::1:9464",
	    "[::1]9464", "[]:9464", "tcp://127.0.0.1:9464", "a b:1",
	    "127.0.0.1:999999"};
	fb_metrics *m = (fb_metrics *)&m;

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		assert_int_equal(fb_metrics_listen_check(good[i]), FB_OK);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (fb_metrics_listen_check(bad[i]) != FB_EINVAL) {
			print_error("accepted: '%s'\n", bad[i]);
			fail();
		}
	}
	assert_int_equal(fb_metrics_alloc("9464", 1, &m), FB_EINVAL);
	assert_null(m);
	assert_int_equal(fb_metrics_alloc("127.0.0.1:0", 0, &m), FB_EINVAL);
	assert_null(m);
	/* An address of no interface here (TEST-NET-1). */
	assert_int_equal(fb_metrics_alloc("192.0.2.1:0", 1, &m), FB_EIO);
	assert_null(m);
	fb_metrics_free(NULL);
}

static void
test_port_taken_then_freed(void **state)
{
	fb_metrics *a = start(1), *b = (fb_metrics *)&b;
	char addr[64];

	(void)state;
	snprintf(
	    addr, sizeof(addr), "127.0.0.1:%u", (unsigned)fb_metrics_port(a));
	assert_int_equal(fb_metrics_alloc(addr, 1, &b), FB_EIO);
	assert_null(b);
	fb_metrics_free(a);
	/* free closed the socket: the same port binds again. */
	assert_int_equal(fb_metrics_alloc(addr, 1, &b), FB_OK);
	{
		http_reply r = get(fb_metrics_port(b), "/metrics");
		assert_int_equal(r.status, 200);
		reply_free(&r);
	}
	fb_metrics_free(b);
}

static void
test_ipv6_loopback(void **state)
{
	fb_metrics *m = NULL;
	struct sockaddr_in6 a;
	int s = socket(AF_INET6, SOCK_STREAM, 0);

	(void)state;
	if (s < 0) {
		skip();
	}
	memset(&a, 0, sizeof(a));
	a.sin6_family = AF_INET6;
	a.sin6_addr = in6addr_loopback;
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(s);
		skip(); /* no IPv6 loopback here */
	}
	close(s);
	assert_int_equal(fb_metrics_alloc("[::1]:0", 1, &m), FB_OK);
	s = socket(AF_INET6, SOCK_STREAM, 0);
	a.sin6_port = htons(fb_metrics_port(m));
	assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	{
		const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
		char buf[64] = "";
		assert_int_equal(send(s, req, sizeof(req) - 1, MSG_NOSIGNAL),
		    (ssize_t)sizeof(req) - 1);
		assert_true(recv(s, buf, sizeof(buf) - 1, MSG_WAITALL) > 12);
		assert_int_equal(strncmp(buf, "HTTP/1.0 200", 12) == 0 ||
		                     strncmp(buf, "HTTP/1.1 200", 12) == 0,
		    1);
	}
	close(s);
	fb_metrics_free(m);
}

static void
test_stalled_client_does_not_block(void **state)
{
	fb_metrics *m = start(1);
	int stalled = dial(fb_metrics_port(m));
	http_reply r;

	(void)state;
	/* Half a request, never finished. */
	assert_int_equal(send(stalled, "GET /met", 8, MSG_NOSIGNAL), 8);
	r = get(fb_metrics_port(m), "/metrics");
	assert_int_equal(r.status, 200);
	reply_free(&r);
	close(stalled);
	fb_metrics_free(m);
}

/* Setters on two threads while a third scrapes: every scrape is well
 * formed and its counters never go backwards. */
typedef struct race {
	fb_metrics *m;
	atomic_int stop;
} race;

static void *
setter_thread(void *arg)
{
	race *r = arg;
	uint32_t i = 0;

	while (!atomic_load(&r->stop)) {
		char name[16];
		snprintf(name, sizeof(name), "w%u", i % 8);
		(void)fb_metrics_set_round(
		    r->m, i, 1000, i % 2 ? "training" : "unmasking");
		fb_metrics_add_bytes(r->m, 1, 2);
		(void)fb_metrics_add_rejected(r->m, "bad_mac", 1);
		(void)fb_metrics_set_worker(r->m, i % 8, name, i);
		if (i % 5 == 0) {
			fb_metrics_forget_worker(r->m, (i + 3) % 8);
		}
		(void)fb_metrics_round_done(r->m, "ok", (double)(i % 50));
		fb_metrics_set_test(r->m, (double)(i % 100) / 100, 1);
		i++;
	}
	return NULL;
}

static unsigned long long
sample(const char *body, const char *prefix)
{
	const char *p = strstr(body, prefix);

	assert_non_null(p);
	return strtoull(p + strlen(prefix), NULL, 10);
}

static void
test_setters_race_scrapes(void **state)
{
	race r = {.m = start(8)};
	pthread_t t[2];
	unsigned long long last_up = 0, last_count = 0;

	(void)state;
	atomic_init(&r.stop, 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(
		    pthread_create(&t[i], NULL, setter_thread, &r), 0);
	}
	for (int i = 0; i < 30; i++) {
		http_reply h = get(fb_metrics_port(r.m), "/metrics");
		unsigned long long up, count;
		assert_int_equal(h.status, 200);
		check_format(h.body);
		up = sample(h.body, "\nfedbox_upload_bytes_total ");
		count =
		    sample(h.body, "\nfedbox_round_duration_seconds_count ");
		assert_true(up >= last_up);
		assert_true(count >= last_count);
		/* The +Inf bucket is the count, in one consistent copy. */
		assert_int_equal(
		    sample(h.body,
		        "fedbox_round_duration_seconds_bucket{le=\"+Inf\"} "),
		    count);
		last_up = up;
		last_count = count;
		reply_free(&h);
	}
	atomic_store(&r.stop, 1);
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
	}
	assert_true(last_up > 0);
	fb_metrics_free(r.m);
}

FB_TESTS = {
    {"a scrape shows every value set, as text format 0.0.4", test_values_shown},
    {"every family has its HELP and TYPE, unset gauges no sample",
        test_every_family_has_help_and_type},
    {"label values are escaped and cut", test_label_escaping},
    {"histogram buckets are cumulative with an inclusive le",
        test_histogram_cumulative},
    {"series come and go with NaN, new names and forgotten slots",
        test_series_come_and_go},
    {"async: model version, updates by outcome, staleness, cohorts",
        test_async_series},
    {"bad setter arguments and full label sets are refused",
        test_bad_setter_arguments},
    {"other paths get 404, other methods 405, garbage 4xx",
        test_other_paths_and_methods},
    {"only HOST:PORT listen addresses are accepted", test_listen_forms},
    {"a taken port is refused; free releases it", test_port_taken_then_freed},
    {"an IPv6 loopback address serves too", test_ipv6_loopback},
    {"a stalled client does not block a scrape",
        test_stalled_client_does_not_block},
    {"setters racing scrapes give consistent text", test_setters_race_scrapes},
    {NULL, NULL},
};

FB_TEST_MAIN("metrics_http")
