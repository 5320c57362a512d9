/* SPDX-License-Identifier: Apache-2.0 */
/* config.c -- the coordinator's configuration keys, defaults and checks. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "aggregation/aggregation.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/metrics_http.h"
#include "proto/proto.h"

#define F(field) offsetof(fb_coord_config, field)
#define NOB 1, 0 /* no bounds */

static const char *const log_levels[] = {"debug", "info", "warn", "error",
    NULL};
static const char *const local_works[] = {"fixed", "time_budget", NULL};
static const char *const straggler_modes[] = {"drop", "wait", NULL};
static const char *const round_modes[] = {"sync", "async", NULL};
static const char *const auto_word[] = {"auto", NULL}; /* -1 */
/* fb_model_cache's names in its order */
static const char *const model_caches[] = {"auto", "keep", "seal_on_fetch",
    NULL};
static const char *const eval_sets[] = {"fashion-mnist", "files", NULL};
/* fb_server_lr_decay's names in its order, then "auto" (stored as
 * FB_LR_DECAY_COUNT_ and resolved by the rule in cross_check) */
static const char *const lr_decays[] = {"none", "cosine", "auto", NULL};
#define MB NULL

const fb_cfg_field fb_coord_config_schema[] = {
    {"listen", FB_CFG_STRING, F(listen), "tcp://0.0.0.0:5555", NOB, MB,
        "ZeroMQ endpoint the coordinator binds (ROUTER socket)"},
    {"output_dir", FB_CFG_PATH, F(output_dir), "runs/fedbox", NOB, MB,
        "folder for metrics.jsonl and model.safetensors (created)"},
    {"seed", FB_CFG_INT, F(seed), "1", 0, 9007199254740991.0, MB,
        "seed of the model init, worker sampling and batch order"},
    {"log_level", FB_CFG_ENUM, F(log_level), "info", NOB, log_levels,
        "least severe log level printed"},
    {"model.arch", FB_CFG_STRING, F(model_arch), "mlp", NOB, MB,
        "mlp, logreg, synthetic (benchmarks), plugin, or init (a model "
        "known by its layout alone: model.init)"},
    {"model.input_dim", FB_CFG_INT, F(input_dim), "784", 1, 1e8, MB,
        "features per example"},
    {"model.classes", FB_CFG_INT, F(classes), "10", 1, 65536, MB,
        "output classes (regression: 1, its one output)"},
    {"model.task", FB_CFG_ENUM, F(task), "classification", NOB,
        fb_data_task_names, "classification (softmax cross-entropy over "
        "model.classes) or regression (one output, mean squared error)"},
    {"model.hidden", FB_CFG_INT_LIST, F(hidden), "[128]", 1, 1e7, MB,
        "mlp hidden layer widths"},
    {"model.synthetic_params", FB_CFG_INT, F(synthetic_params), "0", 0,
        4e9, MB, "synthetic: number of float32 parameters"},
    {"model.plugin", FB_CFG_PATH, F(plugin), "", NOB, MB,
        "plugin: path of the model's shared library"},
    {"model.init", FB_CFG_PATH, F(init), "", NOB, MB,
        "init: safetensors file of the model's tensors and initial values "
        "(python -m fedbox init); its F32/F16/BF16/F64 tensors are "
        "federated as float32, integer ones skipped"},
    {"round.mode", FB_CFG_ENUM, F(mode), "sync", NOB, round_modes,
        "sync (rounds: every selected worker trains from one model, the "
        "round closes, the server steps) or async (buffered: each worker "
        "gets a new task as soon as it is free, the server steps every "
        "round.buffer_size updates, each weighted 1/sqrt(1 + staleness))"},
    {"round.buffer_size", FB_CFG_INT, F(buffer_size), "2", 1, 1e6, MB,
        "async: complete updates that make one server step (with secure "
        "aggregation: the members of each cohort, at least 2)"},
    {"round.max_staleness", FB_CFG_INT, F(max_staleness), "8", 0, 1e6, MB,
        "async: an update trained from a model more than this many server "
        "steps old is dropped (counted as dropped_stale; with secure "
        "aggregation the task is cancelled once it is that old, a dropout "
        "of its cohort)"},
    {"round.rounds", FB_CFG_INT, F(rounds), "20", 1, 1e6, MB,
        "rounds to run (async: server steps)"},
    {"round.workers_per_round", FB_CFG_INT, F(workers_per_round), "0", 0,
        1e6, MB, "workers sampled each round; 0 = every live worker"},
    {"round.min_workers", FB_CFG_INT, F(min_workers), "auto", 1, 1e6,
        auto_word, "live workers needed before a round starts; auto = 2 "
        "with secure aggregation (a secure round needs two masked "
        "inputs), else 1"},
    {"round.min_updates", FB_CFG_INT, F(min_updates), "1", 1, 1e6, MB,
        "complete updates needed to commit a round"},
    {"round.wait_for_workers", FB_CFG_DURATION, F(wait_for_workers_ms),
        "10m", 0, 8.64e7, MB,
        "how long to wait for min_workers before giving up"},
    {"round.deadline", FB_CFG_DURATION, F(deadline_ms), "5m", 100, 8.64e7,
        MB, "a round closes this long after it starts, with what it has"},
    {"round.local_epochs", FB_CFG_FLOAT, F(local_epochs), "1", 0, 1e4, MB,
        "local work: passes over each worker's shard per round"},
    {"round.local_steps", FB_CFG_INT, F(local_steps), "0", 0, 1e9, MB,
        "local work in SGD steps; > 0 overrides local_epochs"},
    {"round.batch_size", FB_CFG_INT, F(batch_size), "64", 1, 1e6, MB,
        "examples per SGD step (per worker box)"},
    {"round.lr", FB_CFG_FLOAT, F(lr), "0.05", 0, 100, MB,
        "workers' SGD learning rate"},
    {"round.momentum", FB_CFG_FLOAT, F(momentum), "0.9", 0, 0.999, MB,
        "workers' SGD momentum (state reset each round)"},
    {"round.weight_decay", FB_CFG_FLOAT, F(weight_decay), "0", 0, 1, MB,
        "workers' L2 weight decay"},
    {"round.lr_decay", FB_CFG_ENUM, F(lr_decay), "none", NOB,
        fb_server_lr_decay_names, "schedule of round.lr, the workers' "
        "learning rate, that the coordinator sends with each task: none, "
        "or cosine, the shape of aggregation.server_lr_decay (round t of "
        "R = round.rounds trains with lr * (f + (1 - f) (1 + cos(pi (t - "
        "1) / R)) / 2), f = round.lr_final; async: t is the server step "
        "the task trains towards, its model version + 1)"},
    {"round.lr_final", FB_CFG_FLOAT, F(lr_final), "0", 0, 1, MB,
        "round.lr_decay cosine: the fraction of round.lr the schedule "
        "falls to by the last round"},
    {"round.server_lr", FB_CFG_FLOAT, F(server_lr), "1", 0, 100, MB,
        "server learning rate (fedadam/fedyogi want ~0.01)"},
    {"round.local_work", FB_CFG_ENUM, F(local_work), "fixed", NOB,
        local_works, "fixed (local_epochs/local_steps) or time_budget "
        "(steps from each worker's measured speed)"},
    {"round.time_budget", FB_CFG_DURATION, F(time_budget_ms), "10s", 10,
        8.64e7, MB, "time_budget: local training time each worker gets"},
    {"round.min_steps", FB_CFG_INT, F(min_steps), "1", 1, 1e9, MB,
        "time_budget: fewest local steps assigned"},
    {"round.max_steps", FB_CFG_INT, F(max_steps), "100000", 1, 1e9, MB,
        "time_budget: most local steps assigned"},
    {"round.stragglers", FB_CFG_ENUM, F(stragglers), "drop", NOB,
        straggler_modes, "at the deadline: drop (close with those done) "
        "or wait (for every selected worker still alive)"},
    {"round.over_select", FB_CFG_INT, F(over_select), "0", 0, 1e6, MB,
        "extra workers started each round; the first finishers are kept"},
    {"round.prox_mu", FB_CFG_FLOAT, F(prox_mu), "0", 0, 1e3, MB,
        "FedProx: proximal term mu/2 |x - x_global|^2 on the workers"},
    {"aggregation.rule", FB_CFG_ENUM, F(rule), "fedavg", NOB, fb_rule_names,
        "server rule: fedavg, fednova, fedavgm, fedadam or fedyogi"},
    {"aggregation.beta1", FB_CFG_FLOAT, F(beta1), "0.9", 0, 0.999999, MB,
        "fedavgm: server momentum; fedadam/fedyogi: first moment decay"},
    {"aggregation.beta2", FB_CFG_FLOAT, F(beta2), "0.99", 0, 0.999999, MB,
        "fedadam/fedyogi: second moment decay"},
    {"aggregation.tau", FB_CFG_FLOAT, F(tau), "0.001", 1e-12, 10, MB,
        "fedadam/fedyogi: adaptivity (epsilon)"},
    {"aggregation.server_lr_decay", FB_CFG_ENUM, F(server_lr_decay), "auto",
        NOB, lr_decays, "schedule of round.server_lr over round.rounds: "
        "none, or cosine (round t of R steps with server_lr * (f + (1 - f) "
        "(1 + cos(pi (t - 1) / R)) / 2), f = server_lr_final); auto = "
        "cosine for fedavgm, fedadam and fedyogi, none for fedavg and "
        "fednova"},
    {"aggregation.server_lr_final", FB_CFG_FLOAT, F(server_lr_final), "0",
        0, 1, MB, "cosine: the fraction of round.server_lr the schedule "
        "falls to by the last round"},
    {"aggregation.clip", FB_CFG_FLOAT, F(clip), "16", 1e-6, 1e6, MB,
        "update coordinates are clamped to [-clip, clip] (fixed point)"},
    {"aggregation.ingest_threads", FB_CFG_INT, F(ingest_threads), "auto",
        0, 256, auto_word, "threads that decrypt and add updates: a "
        "worker's chunks in order on one thread at a time, idle threads "
        "helping with the adds of a worker whose chunks queue up; auto = "
        "CPUs - 1 (at most 16; 0 with 2 CPUs or fewer); 0 = on the event "
        "loop"},
    {"evaluation.every", FB_CFG_INT, F(eval_every), "1", 0, 1e6, MB,
        "evaluate on the test set every N rounds (and the last); 0 = never"},
    {"evaluation.federated_final", FB_CFG_BOOL, F(fed_final), "false", NOB,
        MB, "after the last round, one evaluation-only round: the workers "
        "evaluate the final model on their validation data (no training; "
        "the model is not changed), written as a last metrics line with "
        "\"final\": true"},
    {"evaluation.data_dir", FB_CFG_PATH, F(data_dir),
        "/usr/share/datasets/fashion-mnist", NOB, MB,
        "folder with the Fashion-MNIST t10k IDX files"},
    {"evaluation.dataset", FB_CFG_ENUM, F(eval_dataset), "fashion-mnist",
        NOB, eval_sets, "central evaluation set: fashion-mnist "
        "(evaluation.data_dir) or files (evaluation.file, format, ...)"},
    {"evaluation.file", FB_CFG_PATH, F(eval.file), "", NOB, MB,
        "files: the evaluation data (csv, npz; npy: the features array; "
        "idx: the images)"},
    {"evaluation.labels", FB_CFG_PATH, F(eval.labels), "", NOB, MB,
        "files, npy and idx: the evaluation labels file"},
    FB_DATA_CFG_FIELDS("evaluation", fb_coord_config, eval),
    {"transport.chunk_size", FB_CFG_SIZE, F(chunk_size), "1MiB", 4096,
        268435456, MB, "bytes per tensor chunk on the wire"},
    {"transport.heartbeat", FB_CFG_DURATION, F(heartbeat_ms), "1s", 10,
        600000, MB, "interval of liveness messages each way"},
    {"transport.liveness_timeout", FB_CFG_DURATION, F(liveness_ms), "10s",
        50, 3600000, MB, "a worker silent this long is declared lost"},
    {"transport.send_timeout", FB_CFG_DURATION, F(send_timeout_ms), "30s",
        10, 3600000, MB, "a worker whose send queue stays full this long is dropped (sends "
        "never wait)"},
    {"transport.upload_window", FB_CFG_SIZE, F(upload_window), "64MiB",
        4096, 1099511627776.0, MB, "update bytes on their way to the "
        "coordinator at once, all workers together: a worker sends a "
        "chunk only with the coordinator's credit, so what the uploads "
        "hold does not grow with the worker count (each worker holds at "
        "most transport.upload_credits chunks' worth)"},
    {"transport.upload_credits", FB_CFG_INT, F(upload_credits), "32", 1,
        1024, MB, "update chunks one worker may have on their way at once "
        "(within transport.upload_window): it is topped up at half, so "
        "the round trip of a credit is hidden behind the other half"},
    {"transport.model_cache", FB_CFG_ENUM, F(model_cache), "auto", NOB,
        model_caches, "security on: how the round's encrypted model is "
        "served; keep = encrypted once into one ciphertext that every "
        "worker fetches (one more model's worth of memory, the fastest); "
        "seal_on_fetch = each chunk sealed again from the model when a "
        "worker fetches it, on threads beside the loop (the same bytes "
        "under the same round key; memory: transport.fetch_memory); auto "
        "= keep for a model up to 128 MiB, else seal_on_fetch"},
    {"transport.fetch_memory", FB_CFG_SIZE, F(fetch_memory), "64MiB",
        4096, 1099511627776.0, MB, "model_cache seal_on_fetch: sealed model "
        "chunks on their way to the workers at once, all workers together "
        "(at least one chunk, at most 1024 chunks); each worker holds at "
        "most its share of it (this / the workers admitted), so one that "
        "stops reading pins no more"},
    {"transport.max_workers", FB_CFG_INT, F(max_workers), "1024", 1, 65536,
        MB, "most workers admitted at once"},
    {"transport.io_threads", FB_CFG_INT, F(io_threads), "auto", 1, 64,
        auto_word, "ZeroMQ I/O threads moving the socket's bytes (one moves "
        "~5 GB/s); auto = 2 on hosts with 8 or more CPUs, else 1 "
        "(bench/RESULTS.md)"},
    {"transport.lanes", FB_CFG_INT, F(lanes), "auto", 1, 64, auto_word,
        "listening ports: listen's port and the next lanes - 1, each served "
        "by its own I/O threads; workers are sent to them in turn, so their "
        "bytes spread evenly; auto = io_threads (1 for non-tcp endpoints)"},
    {"transport.max_connections", FB_CFG_INT, F(max_connections), "auto",
        1, 1048576, auto_word, "connections held at once, authenticated or "
        "not; auto = as many as the file-descriptor limit (soft limit "
        "raised to the hard one at start) leaves after transport.fd_reserve"},
    {"transport.max_pending", FB_CFG_INT, F(max_pending), "256", 1, 65536,
        MB, "connections not yet authenticated, at once; when full, a new "
        "one takes the place of one that had its chance (from the address "
        "holding most), or is closed"},
    {"transport.max_pending_per_source", FB_CFG_INT,
        F(max_pending_per_source), "16", 1, 65536, MB,
        "connections not yet authenticated from one address, at once; more "
        "are closed"},
    {"transport.handshake_timeout", FB_CFG_DURATION,
        F(handshake_timeout_ms), "10s", 100, 3600000, MB,
        "a connection that has not authenticated this long after it opened "
        "is closed (also the ZMTP greeting's limit)"},
    {"transport.max_pending_bytes", FB_CFG_SIZE, F(max_pending_bytes),
        "64KiB", 1024, 1073741824, MB, "bytes a connection may send before "
        "it authenticates: past them it is closed once two of its messages "
        "were handled, or past them plus chunk_size at any time (checked "
        "every 20ms)"},
    {"transport.max_pending_memory", FB_CFG_SIZE, F(max_pending_memory),
        "32MiB", 65536, 68719476736.0, MB, "memory connections not yet "
        "authenticated may hold together; each may hold a frame of "
        "chunk_size in progress, so at most this / chunk_size of them are "
        "pending (also bounded by transport.max_pending)"},
    {"transport.fd_reserve", FB_CFG_INT, F(fd_reserve), "64", 8, 65536, MB,
        "file descriptors connections never take, kept for the "
        "coordinator's own files (model, metrics)"},
    {"security.enabled", FB_CFG_BOOL, F(security), "true", NOB, MB,
        "encrypt and sign every message; false only for benchmarks"},
    {"security.key", FB_CFG_PATH, F(key), "", NOB, MB,
        "the coordinator's secret key file (fedbox-keygen), mode 0600"},
    {"security.allowlist", FB_CFG_PATH, F(allowlist), "", NOB, MB,
        "file of admitted workers' public key lines (comment = name)"},
    {"security.workers", FB_CFG_STR_LIST, F(workers), "[]", NOB, MB,
        "admitted workers' public key lines, inline"},
    {"secure_aggregation.enabled", FB_CFG_BOOL, F(sa_enabled), "true", NOB,
        MB, "the coordinator learns only the weighted sum of the updates "
        "(SecAgg+); needs security.enabled"},
    {"secure_aggregation.threshold", FB_CFG_INT, F(sa_threshold),
        "auto", 2, 65536, auto_word, "shares needed to recover a secret; auto = "
        "a majority of each neighbourhood (floor(k/2) + 1 of k + 1)"},
    {"secure_aggregation.neighbours", FB_CFG_INT, F(sa_neighbours),
        "auto", 1, 65535, auto_word, "masking neighbours per worker; auto = "
        "O(log n) (SecAgg+), n - 1 or more = complete graph (SecAgg)"},
    {"secure_aggregation.clip", FB_CFG_FLOAT, F(sa_clip), "4", 1e-6, 1e6,
        MB, "update coordinates are clamped to [-clip, clip] before the "
        "fixed-point encoding"},
    {"secure_aggregation.ring_bits", FB_CFG_INT, F(sa_ring_bits), "32", 16,
        32, MB, "encoding ring Z_2^bits (fewer bits: coarser encoding)"},
    {"secure_aggregation.max_samples", FB_CFG_INT, F(sa_max_samples),
        "1000000", 1, 1e15, MB, "public bound on a worker's sample count; "
        "its weight is samples / max_samples"},
    {"secure_aggregation.setup_timeout", FB_CFG_DURATION, F(sa_setup_ms),
        "30s", 10, 8.64e7, MB, "how long each key and share phase waits "
        "for the workers"},
    {"secure_aggregation.setup_ahead", FB_CFG_BOOL, F(sa_setup_ahead),
        "true", NOB, MB, "sync rounds: set the next round up (fresh keys "
        "and shares, among the workers live then) while this one runs, so "
        "that a round's masked inputs need no setup round trips; a worker "
        "that joins meanwhile is in the round after; off with "
        "round.workers_per_round (the sample is drawn at the round's "
        "start)"},
    {"secure_aggregation.max_uploads", FB_CFG_INT, F(sa_max_uploads),
        "auto", 0, 65536, auto_word, "masked uploads under way at once: "
        "each is kept apart (one model's worth, 4 bytes a parameter) until "
        "it is whole, so a worker cut off mid-upload is a dropout like any "
        "other; the others wait for credit; 0 = none kept apart: every "
        "upload at once, straight into the sum (no memory per upload), "
        "and a worker cut off mid-upload makes the others send theirs "
        "again; auto = what fits in 256 MiB, 2 to 64, or 0 for a model "
        "over 128 MiB"},
    {"secure_aggregation.unmask_timeout", FB_CFG_DURATION, F(sa_unmask_ms),
        "30s", 10, 8.64e7, MB, "how long unmasking waits for the "
        "survivors' shares"},
    {"metrics.listen", FB_CFG_STRING, F(metrics_listen), "", NOB, MB,
        "HOST:PORT where a Prometheus endpoint serves GET /metrics (plain "
        "HTTP, no authentication: bind to localhost or a monitoring "
        "network); empty = off"},
    {"debug.wire_log", FB_CFG_PATH, F(wire_log), "", NOB, MB,
        "TESTS ONLY: file to which every message decoded from a worker is "
        "appended as a JSON line (fields, not secrets); empty = off"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* listen_ok says whether `ep` is an endpoint the ROUTER socket can bind
 * and workers on other hosts can reach: tcp://HOST:PORT or ipc://PATH. */
static bool
listen_ok(const char *ep)
{
	char scratch[512];

	if (strncmp(ep, "ipc://", 6) == 0) {
		return ep[6] != '\0';
	}
	return fb_endpoint_port(ep, 1, scratch, sizeof(scratch), NULL) ==
	    FB_OK;
}

/* eval_files_fail checks that the evaluation folder holds the test set;
 * on failure it logs why (naming the missing path) and returns
 * FB_ECONFIG. */
static fb_err
eval_files_fail(const char *path, const fb_cfg_pos *pos, const char *dir)
{
	static const char *const files[] = {"t10k-images-idx3-ubyte.gz",
	    "t10k-labels-idx1-ubyte.gz"};
	static const char hint[] = "install Debian's dataset-fashion-mnist, "
	                           "point evaluation.data_dir at the IDX "
	                           "files, or set evaluation.every: 0";
	struct stat st;
	char file[4096];

	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		return fb_cfg_error(path, fb_coord_config_schema, pos,
		    "evaluation.data_dir", "%s %s; %s", dir,
		    stat(dir, &st) != 0 ? "does not exist" : "is not a folder",
		    hint);
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		int n = snprintf(file, sizeof(file), "%s/%s", dir, files[i]);
		if (n < 0 || (size_t)n >= sizeof(file)) {
			return fb_cfg_error(path, fb_coord_config_schema, pos,
			    "evaluation.data_dir", "folder name too long");
		}
		if (access(file, R_OK) != 0) {
			return fb_cfg_error(path, fb_coord_config_schema, pos,
			    "evaluation.data_dir", "%s: %s; %s", file,
			    strerror(errno), hint);
		}
	}
	return FB_OK;
}

/* at_fault is the key to name for a clash of keys a and b: the one the
 * file sets (a when both or neither are set). */
static const char *
at_fault(const fb_cfg_pos *pos, const char *a, const char *b)
{
	const fb_cfg_field *sch = fb_coord_config_schema;

	return !fb_cfg_given(sch, pos, a) && fb_cfg_given(sch, pos, b) ? b : a;
}

/* async_check refuses what round.mode: async cannot honour, naming both
 * keys: secure cohorts of fewer than 2 (or with masked inputs straight
 * into the sum), and the sync round's selection, straggler and final-round
 * keys, which have no meaning when nobody waits for anybody. */
static fb_err
async_check(const char *path, const fb_cfg_pos *pos, fb_coord_config *cfg)
{
	const fb_cfg_field *sch = fb_coord_config_schema;
	const char *key = NULL, *why = NULL;

	if (cfg->mode != FB_MODE_ASYNC) {
		return FB_OK;
	}
	if (cfg->sa_enabled && cfg->buffer_size < 2) {
		key = at_fault(pos, "round.buffer_size",
		    "secure_aggregation.enabled");
		why = "round.buffer_size must be at least 2 with round.mode: "
		      "async and secure_aggregation.enabled: true (each buffer "
		      "is one secure-aggregation cohort, which needs 2 members "
		      "or more)";
	} else if (cfg->sa_enabled && cfg->sa_max_uploads == 0) {
		key = "secure_aggregation.max_uploads";
		why = "0 is not run with round.mode: async (each cohort's "
		      "masked inputs are kept apart until whole); leave it at "
		      "auto or set it above 0";
	} else if (cfg->workers_per_round > 0) {
		key = "round.workers_per_round";
		why = "has no meaning with round.mode: async (every free worker "
		      "gets a task); leave it at 0";
	} else if (cfg->over_select > 0) {
		key = "round.over_select";
		why = "has no meaning with round.mode: async (no round waits "
		      "for its last workers); leave it at 0";
	} else if (cfg->stragglers == FB_STRAGGLERS_WAIT) {
		key = "round.stragglers";
		why = "wait has no meaning with round.mode: async (a step needs "
		      "round.buffer_size updates from anyone); use drop";
	} else if (cfg->fed_final) {
		key = "evaluation.federated_final";
		why = "is not run with round.mode: async; set it to false";
	} else if (cfg->min_updates > cfg->buffer_size) {
		key = at_fault(pos, "round.min_updates", "round.buffer_size");
		why = "round.min_updates exceeds round.buffer_size with "
		      "round.mode: async: a step at the deadline could never "
		      "have enough";
	}
	if (key == NULL) {
		return FB_OK;
	}
	return fb_cfg_error(path, sch, pos, key, "%s", why);
}

/* cross_check refuses combinations of keys that can never work, naming
 * the key at fault with its place in the file. */
static fb_err
cross_check(const char *path, const fb_cfg_pos *pos, fb_coord_config *cfg)
{
	const fb_cfg_field *sch = fb_coord_config_schema;
	fb_err rc = FB_OK;

	/* min_workers auto: a secure round needs two masked inputs. */
	if (cfg->min_workers < 0) {
		cfg->min_workers = cfg->sa_enabled ? 2 : 1;
	}
	/* server_lr_decay auto: the server optimisers anneal, FedAvg's and
	 * FedNova's plain step stays as it was. */
	if (cfg->server_lr_decay == FB_LR_DECAY_COUNT_) {
		cfg->server_lr_decay =
		    fb_rule_server_kind(cfg->rule) == FB_SERVER_SGD
		        ? FB_LR_DECAY_NONE
		        : FB_LR_DECAY_COSINE;
	}
	if (cfg->liveness_ms <= cfg->heartbeat_ms) {
		rc = fb_cfg_error(path, sch, pos,
		    at_fault(pos, "transport.liveness_timeout",
		        "transport.heartbeat"),
		    "transport.liveness_timeout (%lldms) must be longer than "
		    "transport.heartbeat (%lldms)",
		    (long long)cfg->liveness_ms, (long long)cfg->heartbeat_ms);
	} else if (cfg->chunk_size % 4 != 0) {
		rc = fb_cfg_error(path, sch, pos, "transport.chunk_size",
		    "must be a multiple of 4 bytes (float32)");
	} else if (cfg->upload_window < cfg->chunk_size) {
		rc = fb_cfg_error(path, sch, pos,
		    at_fault(pos, "transport.upload_window",
		        "transport.chunk_size"),
		    "transport.upload_window (%llu bytes) must hold at least "
		    "one chunk (transport.chunk_size, %llu bytes): no update "
		    "could go up",
		    (unsigned long long)cfg->upload_window,
		    (unsigned long long)cfg->chunk_size);
	} else if (!listen_ok(cfg->listen)) {
		rc = fb_cfg_error(path, sch, pos, "listen",
		    "'%.200s' is not an endpoint to listen on: write "
		    "tcp://HOST:PORT (e.g. tcp://0.0.0.0:5555) or ipc://PATH",
		    cfg->listen);
	} else if (cfg->sa_enabled && cfg->security &&
	    cfg->min_workers < 2) {
		rc = fb_cfg_error(path, sch, pos, "round.min_workers",
		    "%lld with secure aggregation on: a secure round needs at "
		    "least 2 workers and could never commit; set it to 2 or "
		    "more (or secure_aggregation.enabled: false)",
		    (long long)cfg->min_workers);
	} else if (cfg->sa_enabled && cfg->security &&
	    cfg->workers_per_round == 1) {
		rc = fb_cfg_error(path, sch, pos, "round.workers_per_round",
		    "1 with secure aggregation on: a secure round needs at "
		    "least 2 workers and could never commit; set it to 2 or "
		    "more, or 0 for every live worker");
	} else if (cfg->min_updates > cfg->min_workers &&
	    cfg->workers_per_round == 0) {
		rc = fb_cfg_error(path, sch, pos, "round.min_updates",
		    "%lld exceeds round.min_workers (%lld): rounds could never "
		    "commit", (long long)cfg->min_updates,
		    (long long)cfg->min_workers);
	} else if (cfg->workers_per_round > 0 &&
	    cfg->min_updates > cfg->workers_per_round) {
		rc = fb_cfg_error(path, sch, pos, "round.min_updates",
		    "%lld exceeds round.workers_per_round (%lld)",
		    (long long)cfg->min_updates,
		    (long long)cfg->workers_per_round);
	} else if (cfg->local_steps == 0 && !(cfg->local_epochs > 0)) {
		rc = fb_cfg_error(path, sch, pos, "round.local_epochs",
		    "must be > 0 when round.local_steps is 0");
	} else if (cfg->min_steps > cfg->max_steps) {
		rc = fb_cfg_error(path, sch, pos, "round.min_steps",
		    "exceeds round.max_steps");
	} else if (cfg->server_lr <= 0) {
		rc = fb_cfg_error(path, sch, pos, "round.server_lr",
		    "must be > 0");
	} else if (cfg->lr <= 0) {
		rc = fb_cfg_error(path, sch, pos, "round.lr", "must be > 0");
	} else if (cfg->lr_decay == FB_LR_DECAY_NONE && cfg->lr_final != 0) {
		rc = fb_cfg_error(path, sch, pos, "round.lr_final",
		    "%g is read only with round.lr_decay: cosine (the workers' "
		    "lr is constant without a schedule); set round.lr_decay: "
		    "cosine or drop round.lr_final", cfg->lr_final);
	} else if (cfg->sa_enabled && !cfg->security) {
		rc = fb_cfg_error(path, sch, pos,
		    at_fault(pos, "secure_aggregation.enabled",
		        "security.enabled"),
		    "secure_aggregation.enabled needs security.enabled (keys "
		    "and shares travel over the signed sessions); set "
		    "secure_aggregation.enabled: false as well to run without "
		    "security");
	} else if (cfg->lanes > 1 && cfg->io_threads > 0 &&
	    cfg->lanes > cfg->io_threads) {
		rc = fb_cfg_error(path, sch, pos, "transport.lanes",
		    "%lld exceeds transport.io_threads (%lld): each lane needs "
		    "an I/O thread of its own", (long long)cfg->lanes,
		    (long long)cfg->io_threads);
	} else if (cfg->lanes > 1 && strncmp(cfg->listen, "tcp://", 6) != 0) {
		rc = fb_cfg_error(path, sch, pos, "transport.lanes",
		    "%lld needs a tcp:// listen endpoint, not %s",
		    (long long)cfg->lanes, cfg->listen);
	} else if (strcmp(cfg->model_arch, "init") == 0 &&
	    cfg->init[0] == '\0') {
		rc = fb_cfg_error(path, sch, pos, "model.arch",
		    "init needs model.init: the safetensors file of the "
		    "model's tensors (python -m fedbox init MODEL -o FILE "
		    "writes one)");
	} else if (strcmp(cfg->model_arch, "init") != 0 &&
	    cfg->init[0] != '\0') {
		rc = fb_cfg_error(path, sch, pos, "model.init",
		    "is read only with model.arch: init (the arch is %s)",
		    cfg->model_arch);
	} else if (strcmp(cfg->model_arch, "init") == 0 &&
	    cfg->eval_every > 0) {
		rc = fb_cfg_error(path, sch, pos,
		    at_fault(pos, "evaluation.every", "model.arch"),
		    "the coordinator cannot evaluate a model known only by "
		    "its layout (model.arch: init has no code here): set "
		    "evaluation.every: 0 (evaluate the exported "
		    "model.safetensors with the model's own code)");
	} else if (strcmp(cfg->model_arch, "synthetic") == 0 &&
	    cfg->synthetic_params == 0) {
		rc = fb_cfg_error(path, sch, pos, "model.synthetic_params",
		    "must be > 0 for the synthetic model");
	} else if (cfg->metrics_listen[0] != '\0' &&
	    fb_metrics_listen_check(cfg->metrics_listen) != FB_OK) {
		rc = fb_cfg_error(path, sch, pos, "metrics.listen",
		    "'%.200s' is not HOST:PORT (e.g. 127.0.0.1:9464 or "
		    "[::1]:9464)", cfg->metrics_listen);
	} else if ((cfg->task == FB_TASK_REGRESSION) != (cfg->classes == 1)) {
		rc = fb_cfg_error(path, sch, pos,
		    at_fault(pos, "model.classes", "model.task"),
		    "model.classes %lld does not fit model.task %s: "
		    "regression has exactly 1 output, classification 2 or "
		    "more classes",
		    (long long)cfg->classes, fb_data_task_names[cfg->task]);
	} else if (strcmp(cfg->model_arch, "synthetic") != 0 &&
	    cfg->eval_every > 0 && cfg->eval_dataset == 0) {
		rc = eval_files_fail(path, pos, cfg->data_dir);
	}
	if (rc == FB_OK) {
		rc = async_check(path, pos, cfg);
	}
	if (rc == FB_OK) {
		/* The evaluation set is read for the model's task and classes. */
		cfg->eval.task = cfg->task;
		cfg->eval.classes = cfg->task == FB_TASK_REGRESSION
		    ? 0 : cfg->classes;
		rc = fb_data_spec_check(&cfg->eval, cfg->eval_dataset == 1,
		    "evaluation", "file", "labels", path);
	}
	return rc;
}

fb_err
fb_coord_config_load(const char *path, fb_coord_config *cfg)
{
	fb_err rc;
	fb_cfg_pos *pos = NULL;

	memset(cfg, 0, sizeof(*cfg));
	pos = calloc(fb_cfg_count(fb_coord_config_schema), sizeof(*pos));
	if (pos == NULL) {
		fb_log_error("%s: out of memory", path);
		rc = FB_ENOMEM;
		goto out;
	}
	rc = fb_cfg_load_pos(path, fb_coord_config_schema, cfg, pos);
	if (rc != FB_OK) {
		goto out;
	}
	if ((rc = cross_check(path, pos, cfg)) != FB_OK) {
		fb_coord_config_fini(cfg);
	}
out:
	free(pos);
	return rc;
}

void
fb_coord_config_fini(fb_coord_config *cfg)
{
	fb_cfg_free(fb_coord_config_schema, cfg);
}
