/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_feed.c -- a test program around the coordinator's Prometheus
 * endpoint (coordinator/metrics_http.h): it serves the endpoint and applies
 * the setter calls read from stdin, one per line, then keeps serving until
 * SIGTERM or SIGINT. Tests drive it with lines made from a real
 * metrics.jsonl and scrape it with a real Prometheus server.
 *
 *   metrics_feed [--listen HOST:PORT] [--max-workers N] < commands
 *
 * Commands (names and phases are single words):
 *   round ROUND ROUNDS PHASE     fb_metrics_set_round
 *   done STATUS SECONDS          fb_metrics_round_done
 *   test ACCURACY LOSS           fb_metrics_set_test (nan: not evaluated)
 *   federated ACCURACY LOSS      fb_metrics_set_federated
 *   bytes UP DOWN                fb_metrics_add_bytes
 *   workers STATE COUNT          fb_metrics_set_workers
 *   rejected REASON COUNT        fb_metrics_add_rejected
 *   worker SLOT NAME STEPS_PER_S fb_metrics_set_worker
 *   steps SLOT STEPS             fb_metrics_add_worker_steps
 *   forget SLOT                  fb_metrics_forget_worker
 * Prints "listening on HOST:PORT port P" first, then "applied N commands"
 * after the end of stdin. Exit status: 0 stopped by a signal, 1 the
 * endpoint did not start or a setter failed, 2 bad usage or a bad line.
 */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "coordinator/metrics_http.h"

static volatile sig_atomic_t stop;

static void
on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* apply runs one command line: false for a line it cannot read, else
 * the setter's result in *rc. */
static bool
apply(fb_metrics *m, const char *line, fb_err *rc)
{
	char cmd[32], a[128], b[128];
	unsigned long long u1 = 0, u2 = 0;
	double d1 = 0, d2 = 0;
	unsigned u = 0;

	*rc = FB_OK;
	if (sscanf(line, "%31s", cmd) != 1) {
		return true; /* blank */
	}
	if (strcmp(cmd, "round") == 0 &&
	    sscanf(line, "%*s %llu %llu %127s", &u1, &u2, a) == 3) {
		*rc = fb_metrics_set_round(m, (uint32_t)u1, (uint32_t)u2, a);
		return true;
	}
	if (strcmp(cmd, "done") == 0 &&
	    sscanf(line, "%*s %127s %lf", a, &d1) == 2) {
		*rc = fb_metrics_round_done(m, a, d1);
		return true;
	}
	if (strcmp(cmd, "test") == 0 &&
	    sscanf(line, "%*s %lf %lf", &d1, &d2) == 2) {
		fb_metrics_set_test(m, d1, d2);
		return true;
	}
	if (strcmp(cmd, "federated") == 0 &&
	    sscanf(line, "%*s %lf %lf", &d1, &d2) == 2) {
		fb_metrics_set_federated(m, d1, d2);
		return true;
	}
	if (strcmp(cmd, "bytes") == 0 &&
	    sscanf(line, "%*s %llu %llu", &u1, &u2) == 2) {
		fb_metrics_add_bytes(m, u1, u2);
		return true;
	}
	if (strcmp(cmd, "workers") == 0 &&
	    sscanf(line, "%*s %127s %llu", a, &u1) == 2) {
		*rc = fb_metrics_set_workers(m, a, (uint32_t)u1);
		return true;
	}
	if (strcmp(cmd, "rejected") == 0 &&
	    sscanf(line, "%*s %127s %llu", a, &u1) == 2) {
		*rc = fb_metrics_add_rejected(m, a, u1);
		return true;
	}
	if (strcmp(cmd, "worker") == 0 &&
	    sscanf(line, "%*s %u %127s %lf", &u, b, &d1) == 3) {
		*rc = fb_metrics_set_worker(m, u, b, d1);
		return true;
	}
	if (strcmp(cmd, "steps") == 0 &&
	    sscanf(line, "%*s %u %llu", &u, &u1) == 2) {
		*rc = fb_metrics_add_worker_steps(m, u, u1);
		return true;
	}
	if (strcmp(cmd, "forget") == 0 && sscanf(line, "%*s %u", &u) == 1) {
		fb_metrics_forget_worker(m, u);
		return true;
	}
	return false;
}

static void
usage(FILE *f)
{
	fprintf(f, "usage: metrics_feed [--listen HOST:PORT] [--max-workers N] "
	           "< commands\n"
	           "Serves the coordinator's Prometheus endpoint with the "
	           "values the commands on\nstdin set (see the top of "
	           "tests/tools/metrics_feed.c), until SIGTERM.\n");
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"max-workers", required_argument, NULL, 'w'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *listen_at = "127.0.0.1:0";
	unsigned long max_workers = 64;
	fb_metrics *m = NULL;
	char line[512];
	unsigned long n = 0, lineno = 0;
	int ch, status = 0;

	fb_log_init("metrics_feed", FB_LOG_INFO);
	while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (ch) {
		case 'l':
			listen_at = optarg;
			break;
		case 'w':
			max_workers = strtoul(optarg, NULL, 10);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || max_workers == 0 || max_workers > 65536) {
		usage(stderr);
		return 2;
	}
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	if (fb_metrics_alloc(listen_at, (uint32_t)max_workers, &m) != FB_OK) {
		return 1;
	}
	printf("listening on %s port %u\n", listen_at,
	    (unsigned)fb_metrics_port(m));
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin) != NULL) {
		fb_err rc = FB_OK;
		lineno++;
		if (!apply(m, line, &rc)) {
			fprintf(stderr,
			    "metrics_feed: line %lu: cannot read: %s", lineno,
			    line);
			status = 2;
			goto out;
		}
		if (rc != FB_OK) {
			fprintf(stderr,
			    "metrics_feed: line %lu failed (%s): %s", lineno,
			    fb_strerror(rc), line);
			status = 1;
			goto out;
		}
		n++;
	}
	printf("applied %lu commands\n", n);
	fflush(stdout);
	while (!stop) {
		pause();
	}
out:
	fb_metrics_free(m);
	return status;
}
