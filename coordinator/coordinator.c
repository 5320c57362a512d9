/* SPDX-License-Identifier: Apache-2.0 */
/*
 * coordinator.c -- fedbox-coordinator's setup and teardown, and
 * fb_coordinator_run: load the identity and allowlist, make the model, the
 * accumulator, the server rule, the ingest pool, the thread pool and the
 * job thread, open the outputs, listen, and run the event loop (loop.c)
 * until the rounds are done, the run fails, or a signal stops it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fedbox sends float32 tensors in host order: little-endian only"
#endif

/* ---- the link as the coordinator's io ---- */

static fb_err
link_send_worker(coord *c, worker *w, const fb_msg *m, const void *payload,
    size_t len, fb_lent *origin)
{
	/* a SecAgg message is sealed for its own round: in secure async
	 * mode an earlier cohort's unmasking runs alongside w's task */
	uint32_t round = m->type == FB_MSG_SECAGG ? m->u.secagg.round
	                                          : round_of(c, w);

	return c->secure
	    ? fb_secure_send_from(c->link, &w->peer, w->sess, round, m, payload,
	          len, origin)
	    : fb_link_send_from(c->link, &w->peer, m, payload, len, origin);
}

static fb_err
link_send_peer(coord *c, const fb_peer *peer, const fb_msg *m)
{
	return fb_link_send(c->link, peer, m, NULL, 0);
}

static uint64_t
link_sent(coord *c)
{
	return c->link != NULL ? fb_link_bytes_sent(c->link) : 0;
}

static uint64_t
link_received(coord *c)
{
	return c->link != NULL ? fb_link_bytes_received(c->link) : 0;
}

static fb_err
link_traffic(coord *c, worker *w, fb_traffic *t)
{
	return fb_link_conn_traffic(&w->conn, t);
}

static const coord_io link_io = {
    .send_worker = link_send_worker,
    .send_peer = link_send_peer,
    .bytes_sent = link_sent,
    .bytes_received = link_received,
    .traffic = link_traffic,
};

/* ---- setup ---- */

/* The central evaluation set: Fashion-MNIST's test split, or the files
 * evaluation.* names; it must fit the model, and says how its features
 * were preprocessed (the model file's metadata). */
static fb_err
open_test_set(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	bool files = cfg->eval_dataset == 1;
	fb_err rc;

	rc = files ? fb_dataset_load_eval(&cfg->eval, &c->test)
	           : fb_dataset_load_fmnist(cfg->data_dir, 0, &c->test);
	if (rc != FB_OK) {
		fb_log_error("cannot load the evaluation set %s (%s)",
		    files ? cfg->eval.file : cfg->data_dir,
		    files ? "evaluation.file" : "evaluation.data_dir");
		return rc;
	}
	if (fb_dataset_check_fit(&c->test, fb_model_input_dim(c->model),
	        fb_model_task(c->model), fb_model_classes(c->model)) != FB_OK) {
		fb_log_error("the evaluation set does not fit the model");
		return FB_ECONFIG;
	}
	return fb_dataset_describe(files ? &cfg->eval : NULL, &c->test,
	    &c->preprocessing);
}

static fb_err
open_model(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	fb_model_spec spec;
	fb_err rc;

	memset(&spec, 0, sizeof(spec));
	snprintf(spec.arch, sizeof(spec.arch), "%s", cfg->model_arch);
	spec.input_dim = (uint32_t)cfg->input_dim;
	spec.classes = (uint32_t)cfg->classes;
	spec.task = (uint32_t)cfg->task;
	spec.hidden_count = (uint32_t)cfg->hidden.count;
	if (spec.hidden_count > FB_MODEL_MAX_HIDDEN) {
		fb_log_error("model.hidden: at most %d layers",
		    FB_MODEL_MAX_HIDDEN);
		return FB_ECONFIG;
	}
	for (size_t i = 0; i < cfg->hidden.count; i++) {
		spec.hidden[i] = (uint32_t)cfg->hidden.v[i];
	}
	spec.synthetic_params = (uint64_t)cfg->synthetic_params;
	snprintf(spec.plugin, sizeof(spec.plugin), "%s", cfg->plugin);
	if (strlen(cfg->init) >= sizeof(spec.init)) {
		fb_log_error("model.init: the path is longer than %zu bytes",
		    sizeof(spec.init) - 1);
		return FB_ECONFIG;
	}
	snprintf(spec.init, sizeof(spec.init), "%s", cfg->init);
	if ((rc = fb_model_open(&spec, &c->model)) != FB_OK) {
		fb_log_error("cannot create the model: %s", fb_strerror(rc));
		return rc == FB_EINVAL ? FB_ECONFIG : rc;
	}
	fb_model_describe(c->model, c->model_desc, sizeof(c->model_desc));
	if ((rc = fb_model_layout_pack(c->model, &c->layout,
	         &c->layout_len)) != FB_OK) {
		return rc;
	}
	if (c->layout_len + FB_MSG_OVERHEAD > (uint64_t)cfg->chunk_size) {
		/* The welcome carries it in one payload frame. */
		fb_log_error("the model's layout (%u tensors) takes %zu bytes "
		             "on the wire, more than transport.chunk_size "
		             "(%lld): raise transport.chunk_size",
		    fb_model_tensor_count(c->model), c->layout_len,
		    (long long)cfg->chunk_size);
		return FB_ECONFIG;
	}
	c->param_count = fb_model_param_count(c->model);
	c->chunk_elems = (uint32_t)(cfg->chunk_size / 4);
	if (fb_lent_new(c->param_count * 4, &c->params_lent) != FB_OK) {
		return FB_ENOMEM;
	}
	c->params = fb_lent_data(c->params_lent);
	fb_model_init_params(c->model, c->params, (uint64_t)cfg->seed);
	c->evaluate = strcmp(cfg->model_arch, "synthetic") != 0 &&
	    cfg->eval_every > 0;
	return c->evaluate ? open_test_set(c) : FB_OK;
	return FB_OK;
}

static fb_err
open_aggregation(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	fb_server_opt_params op;
	fb_err rc;

	rc = fb_accum_alloc(c->param_count, c->chunk_elems, cfg->clip,
	    &c->accum);
	if (rc != FB_OK) {
		return rc;
	}
	c->chunk_count = fb_accum_chunk_count(c->accum);
	fb_server_opt_params_default(&op, fb_rule_server_kind(cfg->rule));
	op.lr = cfg->server_lr;
	op.beta1 = cfg->beta1;
	op.beta2 = cfg->beta2;
	op.tau = cfg->tau;
	op.decay = (fb_server_lr_decay)cfg->server_lr_decay;
	op.lr_final = cfg->server_lr_final;
	op.rounds = (uint64_t)cfg->rounds;
	return fb_server_opt_alloc(&op, c->param_count, &c->opt);
}

static fb_err
open_ingest(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	fb_ingest_opts io = {
	    .threads = cfg->ingest_threads < 0 ? fb_ingest_threads_auto()
	                                       : (uint32_t)cfg->ingest_threads,
	    .slots = c->reg.cap,
	    .chunk_count = c->chunk_count + 1, /* + SecAgg extras */
	    .max_chunk_len = (size_t)c->chunk_elems * 4,
	    .chunk_cb = upload_add_cb,
	    .end_cb = upload_end_cb,
	    .dst_cb = upload_dst_cb,
	    .cb_arg = c,
	    .cb_concurrent = true,
	};
	fb_err rc;

	if ((rc = fb_ingest_alloc(&io, &c->ingest)) != FB_OK) {
		return rc;
	}
	/* The pool's idle threads help with the parts of each add. */
	fb_accum_set_parallel(c->accum, fb_ingest_parallel, c->ingest);
	if (io.threads > 0) {
		fb_log_info("ingest pool: %u threads decrypt and add updates",
		    io.threads);
	} else {
		fb_log_info("ingest: updates decrypted and added on the event "
		            "loop");
	}
	return FB_OK;
}

/* The wake fd the loop polls beside the socket: an epoll set of the
 * ingest pool's results, the job thread's completions and (model_cache
 * seal_on_fetch) the sealed chunks. */
static fb_err
open_wake(coord *c)
{
	int fds[3] = {fb_ingest_wake_fd(c->ingest), c->job.efd,
	    broadcast_wake_fd(c)};

	if ((c->wake_fd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
		fb_log_error("epoll_create1: %s", strerror(errno));
		return FB_EIO;
	}
	for (int i = 0; i < 3 && fds[i] >= 0; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
		if (epoll_ctl(c->wake_fd, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
			fb_log_error("epoll_ctl: %s", strerror(errno));
			return FB_EIO;
		}
	}
	return FB_OK;
}

/* Secure aggregation: a config whose sums could overflow is refused. */
static fb_err
check_encoding(coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	fb_encoding e;

	if (fb_encoding_init(&e, (uint32_t)cfg->sa_ring_bits,
	        c->reg.allow_count, cfg->sa_clip, 1.0) != FB_OK) {
		fb_log_error("secure_aggregation: with ring_bits %lld and clip "
		             "%g, a sum of %u workers could overflow: raise "
		             "ring_bits or lower clip",
		    (long long)cfg->sa_ring_bits, cfg->sa_clip,
		    c->reg.allow_count);
		return FB_ECONFIG;
	}
	fb_log_info("secure aggregation on: ring Z_2^%lld, clip %g, one unit "
	            "%.3g with all %u workers",
	    (long long)cfg->sa_ring_bits, cfg->sa_clip, 1.0 / e.scale,
	    c->reg.allow_count);
	return FB_OK;
}

fb_err
coord_init(coord *c, const fb_coord_config *cfg, const coord_io *io,
    bool inline_jobs)
{
	uint32_t cap = c->secure ? c->reg.allow_count
	                         : (uint32_t)cfg->max_workers;
	uint32_t cpus = fb_pool_cpus();
	fb_err rc;

	c->cfg = cfg;
	c->io = *io;
	c->sa = &c->sa_sync;
	c->wake_fd = -1;
	c->job.efd = -1;
	c->lock_fd = -1;
	pthread_mutex_init(&c->extra_mu, NULL);
	fb_rng_init(&c->rng, (uint64_t)cfg->seed, 0xc00d);
	if ((rc = open_model(c)) != FB_OK ||
	    (rc = open_aggregation(c)) != FB_OK ||
	    (rc = registry_alloc(c, cap)) != FB_OK) {
		return rc;
	}
	if ((c->stream_arg = calloc(cap, sizeof(*c->stream_arg))) == NULL ||
	    (c->rd.sel = calloc(cap, sizeof(*c->rd.sel))) == NULL ||
	    (c->rd.sel_id = calloc(cap, sizeof(*c->rd.sel_id))) == NULL ||
	    (c->rd.sel_weight = calloc(cap, sizeof(*c->rd.sel_weight))) ==
	        NULL ||
	    (c->rd.upload_round = calloc(cap, sizeof(*c->rd.upload_round))) ==
	        NULL) {
		return FB_ENOMEM;
	}
	if (c->secure && (rc = broadcast_alloc(c, inline_jobs)) != FB_OK) {
		return rc;
	}
	if ((rc = upload_credits_alloc(c)) != FB_OK ||
	    (rc = async_alloc(c)) != FB_OK ||
	    (rc = cohorts_alloc(c)) != FB_OK ||
	    (cfg->sa_enabled && (rc = upload_partials_alloc(c)) != FB_OK)) {
		return rc;
	}
	if (c->secure && cfg->sa_enabled && (rc = check_encoding(c)) != FB_OK) {
		return rc;
	}
	if ((rc = open_ingest(c)) != FB_OK ||
	    (rc = fb_pool_alloc(inline_jobs || cpus < 2 ? 0 : cpus - 1,
	         &c->pool)) != FB_OK ||
	    (rc = jobs_start(c, inline_jobs)) != FB_OK ||
	    (rc = open_wake(c)) != FB_OK) {
		return rc;
	}
	c->rd.phase = PHASE_IDLE;
	c->rd.number = 1;
	c->rd.tau_eff = 0;
	return FB_OK;
}

void
coord_fini(coord *c)
{
	jobs_stop(c);              /* first: a job may use everything below */
	broadcast_stop(c);         /* its threads read the model */
	progress_stop(c);
	wirelog_close(c);
	fb_ingest_free(c->ingest); /* its threads use the accumulator */
	upload_partials_fini(c);   /* after: its end callback frees them */
	fb_pool_free(c->pool);
	if (c->wake_fd >= 0) {
		close(c->wake_fd);
	}
	pthread_mutex_destroy(&c->extra_mu);
	sa_free(&c->sa_sync); /* the cohorts free their own */
	sa_free(&c->sa_ahead);
	async_fini(c);
	cohorts_fini(c);
	fb_secagg_keys_free(c->sa_seen); /* after every instance */
	fb_link_close(c->link);
	fb_accum_free(c->accum);
	fb_server_opt_free(c->opt);
	fb_lent_free(c->params_lent); /* after fb_link_close: none in flight */
	fb_model_close(c->model);
	fb_free(c->layout);
	fb_dataset_fini(&c->test);
	fb_free(c->preprocessing);
	free(c->stream_arg);
	free(c->rd.sel);
	free(c->rd.sel_id);
	free(c->rd.sel_weight);
	upload_credits_fini(c);
	free(c->rd.upload_round);
	free(c->rd.resume_line);
	registry_fini(c);
	broadcast_fini(c);
	fb_identity_free(c->self);
	outputs_unlock(c);
}

/* Secure mode: the identity, the allowlist and a fresh run id. */
static fb_err
load_security(coord *c, const fb_coord_config *cfg)
{
	fb_pubkey pk;
	char fp[FB_FINGERPRINT_SIZE];
	fb_err rc;

	if (cfg->key[0] == '\0') {
		fb_log_error("security.key is required (the coordinator's "
		             "identity; make one with fedbox-keygen -o NAME), "
		             "or set security.enabled: false");
		return FB_ECONFIG;
	}
	if ((rc = fb_identity_load(cfg->key, &c->self)) != FB_OK) {
		return rc == FB_ENOMEM ? rc : FB_ECONFIG;
	}
	if ((rc = registry_load_allowlist(c)) != FB_OK ||
	    (rc = fb_run_id_random(&c->run)) != FB_OK) {
		return rc;
	}
	memcpy(&c->run_id, c->run.b, sizeof(c->run_id));
	c->secure = true;
	fb_identity_pubkey(c->self, &pk);
	fb_pubkey_fingerprint(&pk, fp);
	fb_log_info("secure sessions on: identity %s, %u workers on the "
	            "allowlist", fp, c->reg.allow_count);
	return FB_OK;
}

static fb_err
plain_run_id(coord *c)
{
	fb_log_warn("security.enabled is false: messages and updates travel "
	            "unencrypted and unsigned");
	if (getrandom(&c->run_id, sizeof(c->run_id), 0) !=
	    (ssize_t)sizeof(c->run_id)) {
		c->run_id = (uint64_t)fb_now_ms() ^ ((uint64_t)getpid() << 32);
	}
	return FB_OK;
}

/* The link's options for cfg: sends never wait (a worker that stops
 * reading loses messages and, past transport.send_timeout, its place);
 * model chunks go without a copy, so the send queue may hold a whole
 * fetch window. */
static fb_link_opts
link_opts(const coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	fb_link_opts lo = {
	    .max_payload = (uint32_t)cfg->chunk_size,
	    .send_timeout_ms = 0,
	    .hwm = 16,
	    .send_hwm = FB_FETCH_WINDOW_MAX + 16,
	    .io_threads = cfg->io_threads < 0 ? (int)fb_io_threads_auto()
	                                      : (int)cfg->io_threads,
	    /* the door: limits on connections until they authenticate */
	    .door = {
	        .max_connections = cfg->max_connections < 0
	            ? 0
	            : (uint32_t)cfg->max_connections,
	        .max_pending = (uint32_t)cfg->max_pending,
	        .max_per_source = (uint32_t)cfg->max_pending_per_source,
	        .handshake_ms = (uint32_t)cfg->handshake_timeout_ms,
	        .max_pending_bytes = (uint32_t)cfg->max_pending_bytes,
	        .max_pending_memory = cfg->max_pending_memory,
	        .fd_reserve = (uint32_t)cfg->fd_reserve,
	    },
	};

	/* lanes auto: one per I/O thread where the endpoint is TCP; lanes set
	 * with io_threads auto: at least as many I/O threads as lanes. */
	if (cfg->lanes < 0) {
		lo.lanes = strncmp(cfg->listen, "tcp://", 6) == 0 ? lo.io_threads
		                                                  : 1;
	} else {
		lo.lanes = (int)cfg->lanes;
		if (cfg->io_threads < 0 && lo.io_threads < lo.lanes) {
			lo.io_threads = lo.lanes;
		}
	}
	if (c->secure) {
		lo.max_payload += FB_STREAM_CHUNK_OVERHEAD;
		if (cfg->sa_enabled) {
			/* Share and advert batches travel as payloads too. */
			uint64_t sa_max = (uint64_t)c->reg.allow_count *
			        (FB_SECAGG_SHARE_MSG_LEN +
			            FB_SECAGG_REVEAL_ENTRY_LEN) +
			    FB_SECAGG_REVEAL_HEADER_LEN + FB_MSG_OVERHEAD;
			if (sa_max > lo.max_payload) {
				lo.max_payload = (uint32_t)sa_max;
			}
		}
	}
	return lo;
}

static fb_err
listen_link(coord *c)
{
	fb_link_opts lo = link_opts(c);
	/* ", 2 lanes: workers are sent in turn to this port and to port
	 * 5556", or nothing without lanes */
	char lanes[64 + FB_LANES_MAX * 7] = "";
	int used = 0;
	fb_err rc;

	if ((rc = fb_link_bind(c->cfg->listen, &lo, &c->link)) != FB_OK) {
		return rc;
	}
	if (fb_link_closed_fd(c->link) >= 0) {
		/* closed connections wake the loop too */
		int fd = fb_link_closed_fd(c->link);
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
		if (epoll_ctl(c->wake_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			fb_log_error("epoll_ctl: %s", strerror(errno));
			return FB_EIO;
		}
	}
	c->reg.lanes = fb_link_lanes(c->link);
	{
		/* room for every worker under the descriptor limit? */
		fb_door_stats ds;
		fb_link_door_stats(c->link, &ds);
		if (ds.max_connections < c->reg.cap) {
			fb_log_warn("only %u connections fit under the "
			            "file-descriptor limit (%u) for up to %u "
			            "workers: raise it (ulimit -n) or lower "
			            "transport.fd_reserve", ds.max_connections,
			    ds.fd_limit, c->reg.cap);
		}
	}
	if (c->reg.lanes > 1) {
		used = snprintf(lanes, sizeof(lanes), ", %u lanes: workers are "
		    "sent in turn to this port and to port%s", c->reg.lanes,
		    c->reg.lanes > 2 ? "s" : "");
	}
	for (uint32_t i = 1; i < c->reg.lanes && used > 0 &&
	     (size_t)used < sizeof(lanes); i++) {
		int n = snprintf(lanes + used, sizeof(lanes) - (size_t)used,
		    "%s %u", i > 1 ? "," : "", fb_link_lane_port(c->link, i));
		used = n > 0 ? used + n : -1;
	}
	snprintf(c->listening, sizeof(c->listening),
	    "listening on %s (%d ZeroMQ I/O thread%s%s); model %s; "
	    "run %016" PRIx64 "; ciphers: %s", c->cfg->listen, lo.io_threads,
	    lo.io_threads == 1 ? "" : "s", lanes, c->model_desc, c->run_id,
	    fb_crypto_ciphers());
	return FB_OK;
}

static void
shutdown_workers(coord *c, const char *reason)
{
	fb_msg m = {.type = FB_MSG_SHUTDOWN};

	snprintf(m.u.shutdown.reason, sizeof(m.u.shutdown.reason), "%s",
	    reason);
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		if (c->reg.workers[i].used) {
			(void)coord_send(c, &c->reg.workers[i], &m, NULL, 0, NULL);
		}
	}
	/* Give the I/O thread a moment to flush before the socket closes. */
	fb_sleep_ms(200);
}

/* Settings that can never commit a round with this allowlist (or, in
 * plain mode, transport.max_workers). */
static fb_err
check_feasible(const coord *c)
{
	const fb_coord_config *cfg = c->cfg;
	uint32_t most = c->secure ? c->reg.allow_count
	                          : (uint32_t)cfg->max_workers;
	const char *who = c->secure ? "workers on the allowlist"
	                            : "workers transport.max_workers admits";

	if ((uint64_t)cfg->min_updates > most) {
		fb_log_error("round.min_updates (%lld) exceeds the %u %s: no "
		             "round could commit",
		    (long long)cfg->min_updates, most, who);
		return FB_ECONFIG;
	}
	if (cfg->sa_enabled && cfg->sa_threshold > 0 &&
	    cfg->workers_per_round > 0 &&
	    cfg->sa_threshold > cfg->workers_per_round) {
		fb_log_error("secure_aggregation.threshold (%lld) exceeds "
		             "round.workers_per_round (%lld): no round could "
		             "unmask",
		    (long long)cfg->sa_threshold,
		    (long long)cfg->workers_per_round);
		return FB_ECONFIG;
	}
	if (!c->secure) {
		if ((uint64_t)cfg->min_workers > most) {
			fb_log_error("round.min_workers (%lld) exceeds the "
			             "%u %s: no round could start",
			    (long long)cfg->min_workers, most, who);
			return FB_ECONFIG;
		}
		return FB_OK;
	}
	if ((uint32_t)cfg->min_workers > c->reg.allow_count) {
		fb_log_error("round.min_workers (%lld) exceeds the %u workers on "
		             "the allowlist: no round could start",
		    (long long)cfg->min_workers, c->reg.allow_count);
		return FB_ECONFIG;
	}
	if (cfg->sa_enabled && cfg->sa_threshold > 0 &&
	    (uint32_t)cfg->sa_threshold > c->reg.allow_count) {
		fb_log_error("secure_aggregation.threshold (%lld) exceeds the %u "
		             "workers on the allowlist: no round could unmask",
		    (long long)cfg->sa_threshold, c->reg.allow_count);
		return FB_ECONFIG;
	}
	return FB_OK;
}

/* The run is over: say how it went. */
static fb_err
run_outcome(coord *c, fb_err rc, volatile sig_atomic_t *stop)
{
	if (rc == FB_ECLOSED && *stop) {
		fb_log_info("stopped by signal after round %u",
		    c->rd.number > 0 ? c->rd.number - 1 : 0);
		return FB_OK;
	}
	if (rc == FB_OK && c->rd.ran > 0 && c->rd.committed == 0) {
		fb_log_error("none of the %u rounds committed (their reasons are in "
		             "%s); no model was written", c->rd.ran,
		    c->metrics_path);
		return FB_ERANGE;
	}
	if (rc == FB_OK && c->rd.ran > 0) {
		fb_log_info("all %lld rounds done (%u committed); model in %s",
		    (long long)c->cfg->rounds, c->rd.committed, c->model_path);
	}
	return rc;
}

fb_err
fb_coordinator_run(const fb_coord_config *cfg, fb_coord_start how,
    volatile sig_atomic_t *stop)
{
	coord *c = calloc(1, sizeof(*c));
	uint32_t first = 1;
	fb_err rc;

	if (c == NULL) {
		return FB_ENOMEM;
	}
	c->cfg = cfg;
	c->stop = stop;
	c->now = fb_now_ms();
	c->wake_fd = -1;
	c->job.efd = -1;
	c->lock_fd = -1;
	/* The checks first; nothing in OUTPUT_DIR changes before they pass. */
	if ((rc = cfg->security ? load_security(c, cfg) : plain_run_id(c)) !=
	        FB_OK ||
	    (rc = check_feasible(c)) != FB_OK ||
	    (rc = coord_init(c, cfg, &link_io, false)) != FB_OK ||
	    (rc = outputs_lock(c, how)) != FB_OK ||
	    (rc = outputs_prepare(c, how, &first)) != FB_OK ||
	    (rc = listen_link(c)) != FB_OK ||
	    (rc = progress_start(c)) != FB_OK ||
	    (rc = wirelog_open(c)) != FB_OK ||
	    (rc = outputs_begin(c, how)) != FB_OK) {
		goto out;
	}
	/* Said once --resume would find this run, however soon it dies. */
	fb_log_info("%s", c->listening);
	c->rd.number = first;
	c->rd.idle_since_ms = c->rd.last_note_ms = fb_now_ms();
	if (first > (uint32_t)cfg->rounds) {
		fb_log_info("all %lld rounds were done already; model in %s",
		    (long long)cfg->rounds, c->model_path);
		goto out;
	}
	rc = coord_loop(c);
out:
	if (c->link != NULL) {
		shutdown_workers(c, rc == FB_OK ? "training finished"
		                                : "coordinator stopping");
	}
	rc = run_outcome(c, rc, stop);
	coord_fini(c);
	free(c);
	return rc;
}
