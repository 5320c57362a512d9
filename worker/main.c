/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c -- fedbox-worker's command line: options, where the log goes,
 * the config, and the exit status (0 done, 1 failure, 2 bad usage or
 * config).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/trainer.h"
#include "worker/worker.h"

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: fedbox-worker --config FILE [--log-file PATH] "
	    "[--log-format text|json]\n"
	    "       fedbox-worker --config-reference\n"
	    "\n"
	    "Trains on this box's shard of the data for a fedbox coordinator:\n"
	    "connects, and for each round fetches the global model, trains\n"
	    "locally (on the GPUs when there are any) and sends its update.\n"
	    "\n"
	    "  -c, --config FILE       worker YAML config (required)\n"
	    "      --log-file PATH     append the log to PATH instead of "
	    "stderr\n"
	    "      --log-format F      text (default) or json: one object per "
	    "line\n"
	    "                          with time, level, program, message\n"
	    "      --config-reference  print every config key with its default\n"
	    "  -h, --help              this help\n"
	    "  -V, --version           print the version\n"
	    "\n"
	    "Exit status: 0 run finished (or stopped by SIGINT/SIGTERM),\n"
	    "1 failure (refused, coordinator unreachable, ...), 2 bad usage "
	    "or config.\n");
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"config-reference", no_argument, NULL, 'R'},
	    {"log-file", required_argument, NULL, 'L'},
	    {"log-format", required_argument, NULL, 'F'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const char *config = NULL, *log_file = NULL, *log_format = "text";
	fb_worker_config cfg;
	fb_err rc;
	int ch;

	fb_log_init("worker", FB_LOG_INFO);
	while ((ch = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			config = optarg;
			break;
		case 'R':
			fb_cfg_print_reference(stdout, fb_worker_config_schema);
			return 0;
		case 'L':
			log_file = optarg;
			break;
		case 'F':
			log_format = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("fedbox-worker %s\n", FB_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || config == NULL) {
		fprintf(stderr, "fedbox-worker: %s\n",
		    config == NULL ? "--config FILE is required"
		                   : "unexpected argument");
		usage(stderr);
		return 2;
	}
	if (fb_log_format_parse(log_format) < 0) {
		fprintf(stderr,
		    "fedbox-worker: --log-format %s: text or json\n",
		    log_format);
		return 2;
	}
	if (fb_log_output(log_file,
	        (fb_log_format)fb_log_format_parse(log_format)) != FB_OK) {
		return 2;
	}
	if (fb_worker_config_load(config, &cfg) != FB_OK) {
		if (log_file != NULL) {
			fprintf(stderr,
			    "fedbox-worker: bad config %s (the reason is in "
			    "%s)\n", config, log_file);
		}
		return 2;
	}
	{
		static char prog[80]; /* the logger keeps the pointer */
		snprintf(prog, sizeof(prog), "worker[%s]", cfg.name);
		fb_log_init(prog, (fb_log_level)cfg.log_level);
	}
	fb_tune_malloc((size_t)1 << 20);
	rc = fb_worker_run(&cfg, fb_stop_on_signals());
	fb_worker_config_fini(&cfg);
	if (rc == FB_ECONFIG) {
		return 2;
	}
	return rc == FB_OK ? 0 : 1;
}
