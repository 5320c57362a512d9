/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c -- fedbox-coordinator's command line: options, where the log
 * goes, the config, and the exit status (0 done, 1 failure, 2 bad usage or
 * config).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator.h"

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: fedbox-coordinator --config FILE [--resume | --force]\n"
	    "                          [--log-file PATH] [--log-format text|json]\n"
	    "       fedbox-coordinator --config-reference\n"
	    "\n"
	    "Runs federated training rounds: admits fedbox-worker processes,\n"
	    "sends them the global model, aggregates their updates (FedAvg,\n"
	    "weighted by sample count; by secure aggregation unless\n"
	    "secure_aggregation.enabled is false, so that it learns only the\n"
	    "weighted sum) and writes OUTPUT_DIR/metrics.jsonl and\n"
	    "OUTPUT_DIR/model.safetensors after every round.\n"
	    "\n"
	    "  -c, --config FILE       coordinator YAML config (required)\n"
	    "  -r, --resume            continue from OUTPUT_DIR/checkpoint: the\n"
	    "                          model, optimiser state, RNG and round\n"
	    "  -f, --force             start over in an OUTPUT_DIR that holds a\n"
	    "                          run (its checkpoint and metrics go)\n"
	    "      --log-file PATH     append the log to PATH instead of "
	    "stderr\n"
	    "      --log-format F      text (default) or json: one object per "
	    "line\n"
	    "                          with time, level, program, message\n"
	    "      --config-reference  print every config key with its default\n"
	    "  -h, --help              this help\n"
	    "  -V, --version           print the version\n"
	    "\n"
	    "Exit status: 0 done (or stopped by SIGINT/SIGTERM), 1 failure,\n"
	    "2 bad usage or config.\n");
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"resume", no_argument, NULL, 'r'},
	    {"force", no_argument, NULL, 'f'},
	    {"config-reference", no_argument, NULL, 'R'},
	    {"log-file", required_argument, NULL, 'L'},
	    {"log-format", required_argument, NULL, 'F'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const char *config = NULL, *log_file = NULL, *log_format = "text";
	fb_coord_start how = FB_START_FRESH;
	fb_coord_config cfg;
	fb_err rc;
	int ch;

	fb_log_init("coordinator", FB_LOG_INFO);
	while ((ch = getopt_long(argc, argv, "c:rfhV", opts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			config = optarg;
			break;
		case 'r':
		case 'f':
			if (how != FB_START_FRESH) {
				fprintf(stderr, "fedbox-coordinator: --resume and "
				                "--force exclude each other\n");
				return 2;
			}
			how = ch == 'r' ? FB_START_RESUME : FB_START_FORCE;
			break;
		case 'R':
			fb_cfg_print_reference(stdout, fb_coord_config_schema);
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
			printf("fedbox-coordinator %s\n", FB_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || config == NULL) {
		fprintf(stderr, "fedbox-coordinator: %s\n",
		    config == NULL ? "--config FILE is required"
		                   : "unexpected argument");
		usage(stderr);
		return 2;
	}
	if (fb_log_format_parse(log_format) < 0) {
		fprintf(stderr, "fedbox-coordinator: --log-format %s: text or "
		                "json\n", log_format);
		return 2;
	}
	if (fb_log_output(log_file,
	        (fb_log_format)fb_log_format_parse(log_format)) != FB_OK) {
		return 2;
	}
	if (fb_coord_config_load(config, &cfg) != FB_OK) {
		if (log_file != NULL) {
			fprintf(stderr,
			    "fedbox-coordinator: bad config %s (the reason is "
			    "in %s)\n", config, log_file);
		}
		return 2;
	}
	fb_log_init("coordinator", (fb_log_level)cfg.log_level);
	fb_tune_malloc((size_t)cfg.chunk_size);
	rc = fb_coordinator_run(&cfg, how, fb_stop_on_signals());
	fb_coord_config_fini(&cfg);
	if (rc == FB_ECONFIG) {
		return 2;
	}
	return rc == FB_OK ? 0 : 1;
}
