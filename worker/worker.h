/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.h -- fedbox-worker: loads this box's shard, connects to the
 * coordinator, and for each round fetches the global model, trains locally
 * (worker/trainer.h) and streams its update back.
 */
#ifndef FB_WORKER_WORKER_H
#define FB_WORKER_WORKER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "data/data.h"

/* data.dataset: files, this box's own data (fb_dataset_load). */
#define FB_WORKER_DATA_FILES 2

typedef struct fb_worker_config {
	char *coordinator;        /* ZeroMQ endpoint to connect to */
	char *name;               /* unique in the federation */
	int log_level;
	/* data */
	int dataset;              /* 0 fashion-mnist, 1 none (benchmarks),
	                           * 2 files (FB_WORKER_DATA_FILES) */
	char *data_dir;
	fb_data_spec files;       /* dataset files: this box's own data */
	int partition;            /* fb_partition_scheme */
	double alpha;
	int64_t shards_per_worker;
	int64_t index;
	int64_t workers;
	int64_t partition_seed;
	int64_t none_samples;     /* dataset none: samples claimed */
	/* training */
	int device;               /* fb_trainer_device */
	fb_cfg_int_list gpus;
	int math;                 /* fb_trainer_math */
	double throttle;
	char *plugin;             /* local path of a plug-in model */
	char *init_file;          /* train.init: this box's copy of the
	                           * model's initial safetensors file */
	/* training in a trainer process (worker/proc/) */
	fb_cfg_str_list command;  /* program and arguments; empty: built in */
	fb_cfg_str_list train_env; /* NAME=VALUE for the trainer */
	char *workdir;            /* its working folder; "": ours */
	int64_t start_timeout_ms;
	int64_t task_timeout_ms;
	bool share_shard;         /* lend it data.*'s shard (simulations) */
	/* transport */
	int64_t connect_timeout_ms; /* -1: forever */
	int64_t send_timeout_ms;
	int64_t fetch_window;
	/* security */
	bool security;
	char *key;                /* this worker's secret key file */
	char *coordinator_key;    /* pinned key: .pub file or the line */
	int secure_aggregation;   /* 0 required, 1 optional */
	char *peers;              /* optional: allowlist of peers' keys */
	int64_t secagg_min_threshold; /* -1 auto: a neighbourhood majority */
	int secagg_masks_ahead;   /* fb_worker_masks_ahead */
	char *dump_updates;       /* debug: folder for each round's update */
} fb_worker_config;

/* security.secagg_masks_ahead (the enum's order is the config's). */
typedef enum fb_worker_masks_ahead {
	FB_WORKER_MASKS_AHEAD_AUTO = 0,
	FB_WORKER_MASKS_AHEAD_ON,
	FB_WORKER_MASKS_AHEAD_OFF,
} fb_worker_masks_ahead;

extern const fb_cfg_field fb_worker_config_schema[];

/* fb_worker_config_load loads and cross-checks a worker config; errors are
 * logged with file:line:column and give FB_ECONFIG. */
FB_MUST_CHECK fb_err fb_worker_config_load(const char *path,
    fb_worker_config *cfg);
void fb_worker_config_fini(fb_worker_config *cfg);

struct fb_trainer_proc_config;
/*
 * fb_worker_trainer_proc fills `pc` from cfg's train.command keys and says
 * whether a trainer process is configured. `pc` borrows cfg's strings and
 * `argv`/`env` (FB_CFG_MAX_LIST entries each, caller's storage).
 */
bool fb_worker_trainer_proc(const fb_worker_config *cfg,
    struct fb_trainer_proc_config *pc, const char **argv, const char **env);

/*
 * fb_worker_run connects and serves rounds until the coordinator says the
 * run is over (FB_OK), *stop becomes non-zero (FB_OK), the coordinator
 * refuses us or stays unreachable (FB_ECLOSED / FB_ETIMEDOUT), or a local
 * failure. Blocks.
 */
FB_MUST_CHECK fb_err fb_worker_run(const fb_worker_config *cfg,
    volatile sig_atomic_t *stop);

#endif
