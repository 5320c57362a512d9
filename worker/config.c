/* SPDX-License-Identifier: Apache-2.0 */
/* config.c -- the worker's configuration keys, defaults and checks. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "data/data.h"
#include "proto/proto.h"
#include "worker/trainer.h"
#include "worker/worker.h"

#define F(field) offsetof(fb_worker_config, field)
#define NOB 1, 0
#define MB NULL

static const char *const log_levels[] = {"debug", "info", "warn", "error",
    NULL};
static const char *const datasets[] = {"fashion-mnist", "none", "files",
    NULL};
static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
static const char *const maths[] = {"fp32", "tf32", "bf16", NULL};
static const char *const sa_modes[] = {"required", "optional", NULL};
static const char *const masks_ahead[] = {"auto", "on", "off", NULL};
static const char *const auto_word[] = {"auto", NULL}; /* -1 */
static const char *const forever_word[] = {"forever", NULL}; /* -1 */
/* security.coordinator_key: a value starting so is the key, not a file. */
static const char *const key_line[] = {"fedbox-ed25519 ", NULL};

const fb_cfg_field fb_worker_config_schema[] = {
    {"coordinator", FB_CFG_STRING, F(coordinator), NULL, NOB, MB,
        "coordinator endpoint, e.g. tcp://10.0.0.1:5555 (required)"},
    {"name", FB_CFG_STRING, F(name), NULL, NOB, MB,
        "this worker's name, unique in the federation (required)"},
    {"log_level", FB_CFG_ENUM, F(log_level), "info", NOB, log_levels,
        "least severe log level printed"},
    {"data.dataset", FB_CFG_ENUM, F(dataset), "fashion-mnist", NOB,
        datasets, "training data: fashion-mnist (data.dir), files (this "
        "box's own: data.format, data.train, ...), none = benchmarks (no "
        "training)"},
    {"data.dir", FB_CFG_PATH, F(data_dir), FB_FMNIST_DEFAULT_DIR, NOB,
        MB, "folder with the Fashion-MNIST IDX files"},
    {"data.train", FB_CFG_PATH, F(files.file), "", NOB, MB,
        "files: training data (csv, npz; npy: the features array; idx: "
        "the images)"},
    {"data.train_labels", FB_CFG_PATH, F(files.labels), "", NOB, MB,
        "files, npy and idx: the training labels file"},
    {"data.valid", FB_CFG_PATH, F(files.valid), "", NOB, MB,
        "files: validation data in the same format; empty = none"},
    {"data.valid_labels", FB_CFG_PATH, F(files.valid_labels), "", NOB,
        MB, "files, npy and idx: the validation labels file"},
    {"data.task", FB_CFG_ENUM, F(files.task), "classification", NOB,
        fb_data_task_names, "files: classification (integer labels) or "
        "regression (float targets); must be the model's"},
    {"data.classes", FB_CFG_INT, F(files.classes), "0", 0, 16777216, MB,
        "files, classification: labels must be below this; 0 = max label "
        "+ 1"},
    FB_DATA_CFG_FIELDS("data", fb_worker_config, files),
    {"data.partition", FB_CFG_ENUM, F(partition), "iid", NOB,
        fb_partition_scheme_names,
        "how the training set is split among workers"},
    {"data.alpha", FB_CFG_FLOAT, F(alpha), "0.5", 1e-6, 1e6, MB,
        "dirichlet: concentration (small = more label skew)"},
    {"data.shards_per_worker", FB_CFG_INT, F(shards_per_worker), "2", 1,
        1e6, MB, "shards: label-sorted shards per worker"},
    {"data.index", FB_CFG_INT, F(index), "0", 0, 1e6, MB,
        "this worker's index, 0 .. data.workers-1"},
    {"data.workers", FB_CFG_INT, F(workers), "1", 1, 1e6, MB,
        "number of workers the training set is split among"},
    {"data.seed", FB_CFG_INT, F(partition_seed), "1", 0,
        9007199254740991.0, MB, "partition seed (same on every worker)"},
    {"data.none_samples", FB_CFG_INT, F(none_samples), "1000", 1, 1e12,
        MB, "dataset none: sample count reported to the coordinator"},
    {"train.device", FB_CFG_ENUM, F(device), "auto", NOB, devices,
        "auto (GPUs if present, else CPU), cpu or cuda"},
    {"train.gpus", FB_CFG_INT_LIST, F(gpus), "[]", 0, 1023, MB,
        "CUDA device ids to use; empty = all"},
    {"train.math", FB_CFG_ENUM, F(math), "fp32", NOB, maths,
        "cuda matrix math: fp32, tf32 or bf16"},
    {"train.throttle", FB_CFG_FLOAT, F(throttle), "1", 1, 1000, MB,
        "SIMULATION: train this many times slower (sleeps after steps)"},
    {"train.plugin", FB_CFG_PATH, F(plugin), "", NOB, MB,
        "local path of the plug-in model library (plugin models); the only "
        "code this worker loads: a path the coordinator names is never "
        "used"},
    {"train.init", FB_CFG_PATH, F(init_file), "", NOB, MB,
        "optional: this box's own initial-model file (python -m fedbox "
        "init with the box's model code); a coordinator whose model's "
        "layout differs is refused at the welcome, naming the first "
        "tensor that differs"},
    {"train.command", FB_CFG_STR_LIST, F(command), "[]", NOB, MB,
        "a trainer process instead of the built-in trainer: the program "
        "and its arguments, e.g. [torchrun, --nproc-per-node, \"8\", "
        "train.py] (python/fedbox); empty = built in"},
    {"train.env", FB_CFG_STR_LIST, F(train_env), "[]", NOB, MB,
        "NAME=VALUE pairs added to the trainer process's environment"},
    {"train.workdir", FB_CFG_PATH, F(workdir), "", NOB, MB,
        "the trainer process's working folder; empty = the worker's"},
    {"train.start_timeout", FB_CFG_DURATION, F(start_timeout_ms), "2m",
        100, 8.64e7, MB, "a trainer process that has not connected this "
        "long after it started fails the round and is started again"},
    {"train.task_timeout", FB_CFG_DURATION, F(task_timeout_ms), "1h", 100,
        8.64e8, MB, "a trainer process that has not answered a round's "
        "task this long is stopped (a hang) and the round's training fails"},
    {"train.share_shard", FB_CFG_BOOL, F(share_shard), "false", NOB, MB,
        "SIMULATION: lend the trainer process this worker's shard of "
        "data.* read-only (fedbox.Client.shard), e.g. for fedbox-local"},
    {"transport.connect_timeout", FB_CFG_DURATION, F(connect_timeout_ms),
        "forever", 100, 8.64e7, forever_word,
        "give up when no coordinator answers for this long (at start or "
        "after losing it); forever: keep trying, with backoff"},
    {"transport.send_timeout", FB_CFG_DURATION, F(send_timeout_ms), "30s",
        10, 3600000, MB, "the coordinator's queue staying full this long "
        "(it reads nothing from this worker) makes the worker reconnect; "
        "sends never wait"},
    {"transport.fetch_window", FB_CFG_INT, F(fetch_window), "32", 1,
        FB_FETCH_WINDOW_MAX, MB, "model chunks requested ahead while "
        "downloading: a deeper window hides more of each request's round "
        "trip (the link, the coordinator's loop); the coordinator sends "
        "them without a copy, so it costs the coordinator no memory, but "
        "for its transport.model_cache seal_on_fetch, where it holds at "
        "most the worker's share of its transport.fetch_memory"},
    {"security.enabled", FB_CFG_BOOL, F(security), "true", NOB, MB,
        "encrypt and sign every message; false only for benchmarks"},
    {"security.key", FB_CFG_PATH, F(key), "", NOB, MB,
        "this worker's secret key file (fedbox-keygen), mode 0600"},
    {"security.coordinator_key", FB_CFG_PATH, F(coordinator_key), "",
        NOB, key_line, "the coordinator's public key: its .pub file or the "
        "line itself (fedbox-ed25519 ...)"},
    {"security.secure_aggregation", FB_CFG_ENUM, F(secure_aggregation),
        "required", NOB, sa_modes, "required: this worker's update, sample "
        "count and loss leave it only masked (secure aggregation), and it "
        "skips rounds without; optional: also plain rounds"},
    {"security.peers", FB_CFG_PATH, F(peers), "", NOB, MB,
        "optional: the federation's allowlist file; secure-aggregation "
        "peers whose identity key is not on it are refused (without it "
        "the keys come from the coordinator)"},
    {"security.secagg_min_threshold", FB_CFG_INT,
        F(secagg_min_threshold), "auto", 2, 65536, auto_word,
        "the fewest shares a secure round may need to recover a secret; "
        "rounds asking fewer are skipped; auto = a majority of the round's "
        "neighbourhood, floor((k + 1) / 2) + 1 of its k neighbours and this "
        "worker"},
    {"security.secagg_masks_ahead", FB_CFG_ENUM, F(secagg_masks_ahead),
        "auto", NOB, masks_ahead, "make the secure-aggregation mask ahead: "
        "once the round's masks are fixed (while the model downloads or "
        "the box trains) the whole mask is expanded on the box's cores "
        "into one vector (4 bytes a parameter, kept between rounds), so "
        "that the masked upload only adds it; off = made chunk by chunk "
        "as the update goes up; auto = on unless the trainer's GPU makes "
        "the masks or the vector would take over a quarter of the memory "
        "available"},
    {"debug.dump_updates", FB_CFG_PATH, F(dump_updates), "", NOB, MB,
        "TESTS ONLY: folder where each round's update (plain, encoded and "
        "masked) is written; empty = off"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* endpoint_ok says whether `ep` is an endpoint to connect to:
 * tcp://HOST:PORT (a port number, not *) or ipc://PATH. */
static bool
endpoint_ok(const char *ep)
{
	char scratch[512];
	uint32_t port = 0;

	if (strncmp(ep, "ipc://", 6) == 0) {
		return ep[6] != '\0';
	}
	return fb_endpoint_port(ep, 1, scratch, sizeof(scratch), &port) ==
	    FB_OK && port > 0 && strncmp(ep, "tcp://*:", 8) != 0;
}

/* check_proc checks the trainer-process keys against each other. */
static fb_err
check_proc(const char *path, const fb_worker_config *cfg)
{
	for (size_t i = 0; i < cfg->command.count; i++) {
		if (cfg->command.v[i][0] == '\0') {
			fb_log_error("%s: train.command: entry %zu is empty",
			    path, i);
			return FB_ECONFIG;
		}
	}
	for (size_t i = 0; i < cfg->train_env.count; i++) {
		const char *e = cfg->train_env.v[i];
		if (e[0] == '=' || strchr(e, '=') == NULL) {
			fb_log_error("%s: train.env: \"%s\" is not NAME=VALUE",
			    path, e);
			return FB_ECONFIG;
		}
	}
	if (cfg->command.count > 0) {
		char *exe = NULL;
		fb_err rc = fb_trainer_proc_find(cfg->command.v[0],
		    cfg->workdir, &exe);
		free(exe);
		if (rc != FB_OK) {
			fb_log_error("%s: train.command: cannot run \"%s\"",
			    path, cfg->command.v[0]);
			return FB_ECONFIG;
		}
	}
	if (cfg->command.count == 0 &&
	    (cfg->share_shard || cfg->train_env.count > 0 ||
	        cfg->workdir[0] != '\0')) {
		fb_log_error("%s: train.%s is for a trainer process: set "
		             "train.command too",
		    path, cfg->share_shard ? "share_shard"
		    : cfg->train_env.count > 0 ? "env" : "workdir");
		return FB_ECONFIG;
	}
	return FB_OK;
}

bool
fb_worker_trainer_proc(const fb_worker_config *cfg,
    struct fb_trainer_proc_config *pc, const char **argv, const char **env)
{
	memset(pc, 0, sizeof(*pc));
	if (cfg->command.count == 0) {
		return false;
	}
	for (size_t i = 0; i < cfg->command.count; i++) {
		argv[i] = cfg->command.v[i];
	}
	for (size_t i = 0; i < cfg->train_env.count; i++) {
		env[i] = cfg->train_env.v[i];
	}
	pc->argv = argv;
	pc->argc = (uint32_t)cfg->command.count;
	pc->env = env;
	pc->env_count = (uint32_t)cfg->train_env.count;
	pc->workdir = cfg->workdir;
	pc->start_timeout_ms = cfg->start_timeout_ms;
	pc->task_timeout_ms = cfg->task_timeout_ms;
	pc->share_shard = cfg->share_shard;
	return true;
}

fb_err
fb_worker_config_load(const char *path, fb_worker_config *cfg)
{
	const fb_cfg_field *sch = fb_worker_config_schema;
	fb_cfg_pos *pos = NULL;
	fb_err rc;

	memset(cfg, 0, sizeof(*cfg));
	if ((pos = calloc(fb_cfg_count(sch), sizeof(*pos))) == NULL) {
		fb_log_error("%s: out of memory", path);
		return FB_ENOMEM;
	}
	if ((rc = fb_cfg_load_pos(path, sch, cfg, pos)) != FB_OK) {
		goto out;
	}
	if (!endpoint_ok(cfg->coordinator)) {
		rc = fb_cfg_error(path, sch, pos, "coordinator",
		    "'%.200s' is not an endpoint to connect to: write "
		    "tcp://HOST:PORT (e.g. tcp://10.0.0.1:5555) or ipc://PATH",
		    cfg->coordinator);
	} else if ((rc = fb_data_spec_check(&cfg->files,
	                cfg->dataset == FB_WORKER_DATA_FILES, "data", "train",
	                "train_labels", path)) != FB_OK) {
		/* logged, with the key */
	} else if (cfg->index >= cfg->workers) {
		rc = fb_cfg_error(path, sch, pos, "data.index",
		    "%lld must be below data.workers (%lld)",
		    (long long)cfg->index, (long long)cfg->workers);
	} else if (cfg->name[0] == '\0' || strlen(cfg->name) >= 64) {
		rc = fb_cfg_error(
		    path, sch, pos, "name", "must be 1 to 63 bytes");
	} else if (!cfg->security && cfg->secure_aggregation == 0) {
		rc = fb_cfg_error(path, sch, pos,
		    fb_cfg_given(sch, pos, "security.secure_aggregation")
		        ? "security.secure_aggregation"
		        : "security.enabled",
		    "security.secure_aggregation: required needs "
		    "security.enabled; set it to optional to run without "
		    "security");
	} else if (cfg->gpus.count > 16) {
		rc = fb_cfg_error(path, sch, pos, "train.gpus",
		    "at most 16 devices");
	} else {
		rc = check_proc(path, cfg);
	}
	if (rc != FB_OK) {
		fb_worker_config_fini(cfg);
	}
out:
	free(pos);
	return rc;
}

void
fb_worker_config_fini(fb_worker_config *cfg)
{
	fb_cfg_free(fb_worker_config_schema, cfg);
}
