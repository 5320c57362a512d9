/* SPDX-License-Identifier: Apache-2.0 */
/*
 * coordinator.h -- fedbox-coordinator: admits workers, runs federated
 * rounds, aggregates updates as they stream in, evaluates, and writes the
 * model and metrics after every round.
 */
#ifndef FB_COORDINATOR_COORDINATOR_H
#define FB_COORDINATOR_COORDINATOR_H

#include <stdbool.h>
#include <signal.h>
#include <stdint.h>

#include "aggregation/aggregation.h"
#include "common/config.h"
#include "common/err.h"
#include "data/data.h"

/* round.local_work */
typedef enum fb_local_work {
	FB_WORK_FIXED = 0,       /* local_epochs or local_steps */
	FB_WORK_TIME_BUDGET = 1, /* what fits in round.time_budget */
} fb_local_work;

/* round.stragglers */
typedef enum fb_stragglers {
	FB_STRAGGLERS_DROP = 0, /* the deadline closes the round */
	FB_STRAGGLERS_WAIT = 1, /* the round waits for every selected worker */
} fb_stragglers;

/* round.mode */
typedef enum fb_round_mode {
	FB_MODE_SYNC = 0,  /* rounds: select, train, aggregate, commit */
	FB_MODE_ASYNC = 1, /* buffered (FedBuff): a step every buffer_size
	                    * updates, each worker busy all the time */
} fb_round_mode;

typedef struct fb_coord_config {
	char *listen;             /* ZeroMQ endpoint to bind */
	char *output_dir;         /* metrics.jsonl, model.safetensors */
	int64_t seed;             /* model init, sampling, batch order */
	int log_level;            /* fb_log_level (common/log.h) */
	/* model */
	char *model_arch;
	int64_t input_dim;
	int64_t classes;
	int task;                 /* fb_task (model.task) */
	fb_cfg_int_list hidden;
	int64_t synthetic_params;
	char *plugin;
	char *init;               /* arch init: the safetensors file */
	/* round policy */
	fb_round_mode mode;
	int64_t buffer_size;       /* async: updates per server step */
	int64_t max_staleness;     /* async: older updates are dropped */
	int64_t rounds;
	int64_t workers_per_round; /* 0 = every live worker */
	int64_t min_workers;       /* connected before a round starts */
	int64_t min_updates;       /* complete updates to commit a round */
	int64_t wait_for_workers_ms;
	int64_t deadline_ms;
	double local_epochs;
	int64_t local_steps;       /* > 0 overrides local_epochs */
	int64_t batch_size;
	double lr;
	double momentum;
	double weight_decay;
	int lr_decay;              /* fb_server_lr_decay: round.lr's schedule */
	double lr_final;           /* cosine: fraction of lr at the end */
	double server_lr;
	fb_local_work local_work;
	int64_t time_budget_ms;    /* time_budget: local training time */
	int64_t min_steps;
	int64_t max_steps;
	fb_stragglers stragglers;
	int64_t over_select;       /* extra workers started, first kept */
	double prox_mu;            /* FedProx proximal term on workers */
	/* aggregation */
	fb_rule rule;
	double beta1;
	double beta2;
	double tau;
	int server_lr_decay;       /* fb_server_lr_decay (auto resolved) */
	double server_lr_final;    /* cosine: fraction of server_lr at the end */
	double clip;
	int64_t ingest_threads;    /* -1 = auto; 0 = on the event loop */
	/* evaluation */
	int64_t eval_every;        /* 0 = never */
	bool fed_final;            /* one evaluation-only round at the end */
	char *data_dir;
	int eval_dataset;          /* 0 fashion-mnist (data_dir), 1 files */
	fb_data_spec eval;         /* files: the central evaluation set */
	/* transport */
	uint64_t chunk_size;       /* bytes per payload frame */
	uint64_t upload_window;    /* update bytes in flight, all workers */
	int64_t upload_credits;    /* chunks in flight from one worker, >= 1 */
	int model_cache;           /* fb_model_cache */
	uint64_t fetch_memory;     /* sealed model chunks in flight, all
	                            * workers (model_cache seal_on_fetch) */
	int64_t heartbeat_ms;
	int64_t liveness_ms;
	int64_t send_timeout_ms;
	int64_t max_workers;
	int64_t io_threads;        /* ZeroMQ I/O threads of the socket */
	int64_t lanes;             /* listening ports, one per I/O thread set */
	/* connections before they authenticate (proto.h fb_door_opts) */
	int64_t max_connections;   /* -1 = auto: what the fd limit allows */
	int64_t max_pending;
	int64_t max_pending_per_source;
	int64_t handshake_timeout_ms;
	uint64_t max_pending_bytes;
	uint64_t max_pending_memory;
	int64_t fd_reserve;        /* descriptors kept for our own files */
	/* security */
	bool security;             /* encrypted, signed sessions (default) */
	char *key;                 /* identity secret key file */
	char *allowlist;           /* file of workers' public key lines */
	fb_cfg_str_list workers;   /* the same, inline */
	/* secure aggregation (SecAgg+) */
	bool sa_enabled;
	int64_t sa_threshold;      /* -1 = auto */
	int64_t sa_neighbours;     /* -1 = auto */
	double sa_clip;
	int64_t sa_ring_bits;
	int64_t sa_max_samples;    /* public bound: weight = n / this */
	int64_t sa_setup_ms;       /* each of the key and share phases */
	bool sa_setup_ahead;       /* the next round's setup during this one */
	int64_t sa_unmask_ms;
	int64_t sa_max_uploads;    /* -1 = auto */
	/* monitoring */
	char *metrics_listen;      /* HOST:PORT of GET /metrics; "" = off */
	char *wire_log;            /* tests: JSON lines of what workers send */
} fb_coord_config;

/* transport.model_cache: how the round's encrypted model is served. */
typedef enum fb_model_cache {
	FB_MODEL_CACHE_AUTO = 0,   /* keep up to 128 MiB of model, else seal */
	FB_MODEL_CACHE_KEEP,       /* one ciphertext per round, kept */
	FB_MODEL_CACHE_SEAL,       /* each chunk sealed when it is fetched */
} fb_model_cache;

/* fb_coord_config_schema describes every key (see configs/README.md). */
extern const fb_cfg_field fb_coord_config_schema[];

/*
 * fb_coord_config_load loads and cross-checks a coordinator config file.
 * Errors are logged with file:line:column; returns FB_ECONFIG.
 */
FB_MUST_CHECK fb_err fb_coord_config_load(const char *path,
    fb_coord_config *cfg);
void fb_coord_config_fini(fb_coord_config *cfg);

/* How a run treats what OUTPUT_DIR already holds. */
typedef enum fb_coord_start {
	FB_START_FRESH = 0, /* refuse a folder that holds a run */
	FB_START_RESUME,    /* continue from its checkpoint */
	FB_START_FORCE,     /* start over, removing its checkpoint and metrics */
} fb_coord_start;

/*
 * fb_coordinator_run runs the whole federation per `cfg` and returns when
 * every round is done, *stop becomes non-zero (signal), or a fatal error
 * occurs. OUTPUT_DIR is locked for the run (another coordinator on it is
 * refused) and nothing in it changes before the checks at start passed
 * (config, keys, the listen address). FB_START_RESUME continues from
 * OUTPUT_DIR/checkpoint exactly (model, optimiser state, RNG, round).
 * Blocks. Errors: FB_ECONFIG (bad config, or a folder with a run and
 * neither resume nor force; logged), FB_EFORMAT (corrupt checkpoint),
 * FB_ETIMEDOUT (too few workers came), FB_EZMQ (cannot listen), FB_EIO
 * (cannot write outputs), FB_ERANGE (rounds ran and none committed),
 * FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_coordinator_run(const fb_coord_config *cfg,
    fb_coord_start how, volatile sig_atomic_t *stop);

#endif
