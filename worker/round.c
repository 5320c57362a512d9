/* SPDX-License-Identifier: Apache-2.0 */
/*
 * round.c -- one round on the worker: the RoundStart and its checks, the
 * download of the global model (chunks requested a window ahead, verified
 * and decrypted as they come), the training, and its result turned into
 * the update (global - local, FedNova-normalised).
 *
 * Training runs on a thread of its own that touches no socket, so the loop
 * keeps answering the coordinator meanwhile; it ends by writing to an
 * eventfd the loop polls, and a cancel (a C11 atomic it reads between
 * steps) stops it within one step. The state machine starts and stops it
 * through w->io; fb_wk_thread_start/stop/reap are the real implementation.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pool.h"
#include "common/util.h"
#include "worker/worker_impl.h"

/* ---- the trainer thread ------------------------------------------------- */

/* Benchmark rounds (a synthetic model): no training; the update is fixed
 * small noise, made once (on the trainer thread: a model of 1e9 floats
 * takes seconds, which the loop must not spend). */
static void
synthetic_fill(fb_wk *w)
{
	double t0 = fb_now_s();

	if (!w->synthetic_ready) {
		fb_rng r;
		fb_rng_init(&r, (uint64_t)w->cfg->index + 1, 0x5e);
		for (uint64_t j = 0; j < w->param_count; j++) {
			w->local[j] =
			    (float)((double)(fb_rng_u64(&r) >> 40) * 0x1.0p-24 -
			            0.5) *
			    0.02f;
		}
		w->synthetic_ready = true;
	}
	memset(&w->stats, 0, sizeof(w->stats));
	w->stats.seconds = fb_now_s() - t0;
}

fb_err
fb_wk_update_form(fb_wk *w)
{
	float nan_probe = 0.0f; /* x * 0 is 0 unless x is NaN or infinite */

	for (uint64_t j = 0; j < w->param_count; j++) {
		w->local[j] = w->global[j] - w->local[j];
		nan_probe += w->local[j] * 0.0f;
	}
	if (nan_probe != 0.0f) {
		fb_log_error("round %u: the update holds NaN or infinity (did "
		             "the training diverge? try a lower lr)",
		    w->round);
		return FB_ERANGE;
	}
	w->a_norm = 0;
	/* FedNova: send d_i = update / ||a_i||_1; the coordinator scales the
	 * mean back by tau_eff. */
	if (w->fednova && (fb_fednova_a_norm(w->stats.steps, w->momentum, w->lr,
	                       w->prox_mu, &w->a_norm) != FB_OK ||
	                      fb_fednova_normalise(w->local, w->param_count,
	                          w->a_norm) != FB_OK)) {
		fb_log_error("round %u: FedNova normaliser failed", w->round);
		return FB_ERANGE;
	}
	return FB_OK;
}

static void *
train_main(void *arg)
{
	fb_wk *w = arg;
	fb_train_opts o = {
	    .steps = w->steps,
	    .batch = w->batch,
	    .lr = w->lr,
	    .momentum = w->momentum,
	    .weight_decay = w->weight_decay,
	    .prox_mu = w->prox_mu,
	    .seed = w->seed,
	    .round = w->round,
	    .worker_index = (uint32_t)w->cfg->index,
	    .evaluate_only = w->eval_only,
	};
	fb_train_stats st;
	uint64_t one = 1;
	fb_err rc;

	memset(&st, 0, sizeof(st));
	fb_log_clear_error();
	w->train_why[0] = '\0';
	/* the global model as received, before training changes it */
	fb_wk_evaluate(w);
	if (w->eval_only && !w->synthetic) {
		/* the final evaluation: no training, a zero update */
		rc = FB_OK;
		if (w->has_proc) {
			rc = fb_trainer_set_params(w->trainer, w->global);
			if (rc == FB_OK) {
				rc = fb_trainer_train(w->trainer, &o, &st,
				    &w->cancel);
			}
			if (rc == FB_OK && st.eval.examples > 0) {
				w->eval = st.eval;
			}
		}
		memset(&w->stats, 0, sizeof(w->stats));
		memset(w->local, 0, w->param_count * 4);
		w->a_norm = 0;
		w->train_rc = rc;
		if (rc != FB_OK) {
			snprintf(w->train_why, sizeof(w->train_why), "%s",
			    fb_log_last_error());
		}
	} else if (w->synthetic) {
		synthetic_fill(w);
		w->a_norm = 0;
		w->train_rc = FB_OK;
	} else {
		if ((rc = fb_trainer_set_params(w->trainer, w->global)) ==
		        FB_OK &&
		    (rc = fb_trainer_train(w->trainer, &o, &st, &w->cancel)) ==
		        FB_OK) {
			rc = fb_trainer_get_params(w->trainer, w->local);
		}
		w->stats = st;
		if (w->has_proc && st.eval.examples > 0) {
			w->eval = st.eval; /* the script evaluated */
		}
		/* the update (global - local), a pass over the model, here too */
		if (rc == FB_OK) {
			rc = fb_wk_update_form(w);
		}
		w->train_rc = rc;
		if (rc != FB_OK) {
			snprintf(w->train_why, sizeof(w->train_why), "%s",
			    fb_log_last_error());
		}
	}
	if (write(w->efd, &one, sizeof(one)) != sizeof(one)) {
		fb_log_error("eventfd write: %s", strerror(errno));
	}
	return NULL;
}

static fb_err
ensure_trainer(fb_wk *w)
{
	fb_trainer_config tc;
	fb_err rc;

	if (w->trainer != NULL && w->trainer_batch >= w->batch) {
		return FB_OK;
	}
	fb_trainer_close(w->trainer);
	w->trainer = NULL;
	memset(&tc, 0, sizeof(tc));
	tc.device = w->cfg->device;
	tc.gpu_count = (uint32_t)w->cfg->gpus.count;
	for (size_t i = 0; i < w->cfg->gpus.count; i++) {
		tc.gpus[i] = (int)w->cfg->gpus.v[i];
	}
	tc.math = w->cfg->math;
	tc.throttle = w->cfg->throttle;
	if (!w->has_proc) {
		w->has_proc = fb_worker_trainer_proc(w->cfg, &w->proc,
		    w->proc_argv, w->proc_env);
	}
	tc.proc = w->has_proc ? &w->proc : NULL;
	rc = fb_trainer_open(w->model, &w->shard, &tc, w->batch, &w->trainer);
	if (rc != FB_OK) {
		fb_log_error("cannot start the trainer: %s", fb_strerror(rc));
		return rc;
	}
	w->trainer_batch = w->batch;
	fb_trainer_describe(w->trainer, w->backend, sizeof(w->backend));
	fb_log_info("trainer: %s", w->backend);
	if (w->cfg->throttle > 1.0) {
		fb_log_info("SIMULATION: training throttled %.2fx slower "
		            "(train.throttle)",
		    w->cfg->throttle);
	}
	return FB_OK;
}

fb_err
fb_wk_thread_start(fb_wk *w)
{
	fb_err rc;

	if (!w->synthetic && (rc = ensure_trainer(w)) != FB_OK) {
		return rc;
	}
	atomic_store(&w->cancel, 0);
	if (pthread_create(&w->thread, NULL, train_main, w) != 0) {
		fb_log_error("cannot start the training thread");
		return FB_ENOMEM;
	}
	w->thread_live = true;
	return FB_OK;
}

void
fb_wk_thread_stop(fb_wk *w)
{
	uint64_t v;

	if (!w->thread_live) {
		return;
	}
	atomic_store(&w->cancel, 1);
	pthread_join(w->thread, NULL);
	w->thread_live = false;
	if (read(w->efd, &v, sizeof(v)) < 0) {
		/* Nothing pending: fine. */
	}
}

bool
fb_wk_thread_reap(fb_wk *w)
{
	uint64_t v;

	if (read(w->efd, &v, sizeof(v)) < 0 || !w->thread_live) {
		return false;
	}
	pthread_join(w->thread, NULL);
	w->thread_live = false;
	return true;
}

fb_err
fb_wk_load_shard(fb_wk *w)
{
	const fb_worker_config *cfg = w->cfg;
	fb_dataset full = {0};
	fb_partition_spec ps = {
	    .scheme = (fb_partition_scheme)cfg->partition,
	    .workers = (uint32_t)cfg->workers,
	    .index = (uint32_t)cfg->index,
	    .seed = (uint64_t)cfg->partition_seed,
	    .alpha = cfg->alpha,
	    .shards_per_worker = (uint32_t)cfg->shards_per_worker,
	};
	uint32_t *idx = NULL, n = 0;
	fb_err rc = FB_OK;

	if (cfg->dataset == 1) {
		goto out;
	}
	if (cfg->dataset == FB_WORKER_DATA_FILES) {
		if ((rc = fb_dataset_load(&cfg->files, &ps, &w->shard,
		         &w->valid)) != FB_OK) {
			fb_log_error("cannot load this box's data (data.train "
			             "%s)", cfg->files.file);
			goto out;
		}
		fb_log_info("data %s: %u of %u examples (part %lld of %lld), "
		            "%u features%s",
		    cfg->files.file, w->shard.count, w->shard.raw_count,
		    (long long)cfg->index, (long long)cfg->workers,
		    w->shard.dim, w->valid.count > 0 ? ", with validation" : "");
		goto out;
	}
	if ((rc = fb_dataset_load_fmnist(cfg->data_dir, 1, &full)) != FB_OK) {
		fb_log_error("cannot load the training set from %s (data.dir)",
		    cfg->data_dir);
		goto out;
	}
	rc = fb_partition_indices(
	    full.y, full.count, full.classes, &ps, &idx, &n);
	if (rc != FB_OK) {
		goto out;
	}
	if ((rc = fb_dataset_subset(&full, idx, n, &w->shard)) != FB_OK) {
		goto out;
	}
	fb_log_info("shard %lld of %lld (%s): %u examples",
	    (long long)cfg->index, (long long)cfg->workers,
	    fb_partition_scheme_names[cfg->partition], n);
out:
	fb_free(idx);
	fb_dataset_fini(&full);
	return rc;
}

/* ---- the round ---------------------------------------------------------- */

static bool
round_running(const fb_wk *w)
{
	return w->phase == FB_WK_FETCHING || w->phase == FB_WK_TRAINING ||
	       w->phase == FB_WK_WAITING || w->phase == FB_WK_UPLOADING;
}

void
fb_wk_round_leave(fb_wk *w)
{
	w->io->train_stop(w->io->arg, w);
	fb_wk_upload_drop(w);
	fb_wk_sa_end(w);
	if (round_running(w)) {
		w->phase = FB_WK_IDLE;
	}
}

void
fb_wk_round_fail(fb_wk *w, uint32_t round, const char *why)
{
	fb_msg m = {.type = FB_MSG_ROUND_FAILED};
	size_t i;

	fb_wk_round_leave(w);
	m.u.round_failed.round = round;
	snprintf(m.u.round_failed.reason, sizeof(m.u.round_failed.reason),
	    "%s", why != NULL && why[0] != '\0' ? why : "failed on the worker");
	for (i = 0; m.u.round_failed.reason[i] != '\0'; i++) {
		unsigned char ch = (unsigned char)m.u.round_failed.reason[i];
		if (ch < 0x20 || ch == 0x7f) {
			m.u.round_failed.reason[i] = ' ';
		}
	}
	if (fb_wk_send_ctl(w, &m, NULL, 0) != FB_OK) {
		fb_log_warn("round %u: could not tell the coordinator that the "
		            "round failed here",
		    round);
	}
}

/* The public checks of a RoundStart: sizes that match the welcome's, and
 * work to do. */
static bool
round_start_usable(const fb_wk *w, const fb_msg *m)
{
	uint64_t expect =
	    (w->param_count * 4 + w->chunk_bytes - 1) / w->chunk_bytes;

	bool budget_ok = m->u.round_start.time_budget_ms == 0 ||
	                 (m->u.round_start.secagg &&
	                     m->u.round_start.min_steps >= 1 &&
	                     m->u.round_start.min_steps <=
	                         m->u.round_start.max_steps);

	return m->u.round_start.param_count == w->param_count &&
	       m->u.round_start.chunk_bytes == w->chunk_bytes &&
	       m->u.round_start.chunk_count == expect &&
	       m->u.round_start.first_chunk < expect &&
	       m->u.round_start.batch_size != 0 && budget_ok &&
	       (m->u.round_start.local_steps != 0 ||
	           (m->u.round_start.secagg &&
	               m->u.round_start.local_epochs > 0 &&
	               isfinite(m->u.round_start.local_epochs)));
}

/* Whether this worker takes part in a round of this kind (logged). */
static bool
round_start_wanted(const fb_wk *w, const fb_msg *m)
{
	if (m->u.round_start.synthetic != (w->cfg->dataset == 1)) {
		fb_log_error("round %u: the coordinator's model is %s but this "
		             "worker has %s; skipping the round",
		    m->u.round_start.round,
		    m->u.round_start.synthetic ? "synthetic" : "trainable",
		    w->cfg->dataset == 1 ? "no data (data.dataset: none)"
		                         : "training data");
		return false;
	}
	if (!m->u.round_start.secagg && w->cfg->secure_aggregation == 0) {
		fb_log_error(
		    "round %u: the coordinator runs it without secure "
		    "aggregation, which this worker requires "
		    "(security.secure_aggregation); skipping the round",
		    m->u.round_start.round);
		return false;
	}
	return true;
}

static void
round_settings(fb_wk *w, const fb_msg *m)
{
	w->round = m->u.round_start.round;
	w->steps = m->u.round_start.local_steps;
	if (w->steps == 0) {
		/* Secure aggregation: our sample count stays here, so we turn
		 * the coordinator's local_epochs into steps ourselves. */
		double st = ceil((double)m->u.round_start.local_epochs *
		                 (double)fb_wk_samples(w) /
		                 (double)m->u.round_start.batch_size);
		w->steps = st < 1 ? 1 : (uint64_t)st;
	}
	w->own_budget = false;
	if (m->u.round_start.time_budget_ms > 0 && w->has_speed) {
		/* Secure time budget: as many steps as our own speed fits in
		 * it; the coordinator learns neither the speed nor the steps
		 * (until we have a speed, the fixed work above). */
		double budget_s =
		    (double)m->u.round_start.time_budget_ms / 1000.0;
		double fit = floor(w->speed * budget_s);
		double lo = (double)m->u.round_start.min_steps;
		double hi = (double)m->u.round_start.max_steps;
		fit = fit < lo ? lo : fit > hi ? hi : fit;
		w->steps = (uint64_t)fit;
		w->own_budget = true;
	}
	w->batch = m->u.round_start.batch_size;
	w->lr = m->u.round_start.lr;
	w->momentum = m->u.round_start.momentum;
	w->weight_decay = m->u.round_start.weight_decay;
	w->prox_mu = m->u.round_start.prox_mu;
	w->fednova = m->u.round_start.fednova;
	w->seed = m->u.round_start.seed;
	w->synthetic = m->u.round_start.synthetic;
	w->eval_only = m->u.round_start.evaluate_only;
	w->chunk_count = m->u.round_start.chunk_count;
	w->first_chunk = m->u.round_start.first_chunk;
	w->next_chunk = 0;
	w->next_fetch = 0;
	w->dl_first = 0;
	w->dl_n = 0;
}

/* Secure mode: the round's model stream, under the round key. */
static fb_err
model_stream_open(fb_wk *w, const fb_msg *m)
{
	/* secure async: the model is the step's, the task the cohort's */
	fb_stream_ctx ctx = {.round = m->u.round_start.model_round != 0
	                                  ? m->u.round_start.model_round
	                                  : w->round,
	    .sender = FB_SENDER_COORDINATOR};
	fb_reject why = FB_REJECT_NONE;

	fb_session_run_id(w->sess, &ctx.run);
	fb_stream_pull_free(w->mpull);
	w->mpull = NULL;
	if (m->u.round_start.round_key.len != FB_STREAM_KEY_LEN ||
	    fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
	        m->u.round_start.round_key.b, m->u.round_start.stream_header.b,
	        m->u.round_start.stream_header.len, w->chunk_bytes, &w->mpull,
	        &why) != FB_OK) {
		fb_log_warn(
		    "round %u: unusable model stream (%s); skipping the "
		    "round",
		    w->round, fb_reject_name(why));
		return FB_EPROTO;
	}
	w->model_trailer = m->u.round_start.stream_trailer;
	return FB_OK;
}

void
fb_wk_on_round_start(fb_wk *w, const fb_msg *m)
{
	if (m->u.round_start.model_round != 0 &&
	    m->u.round_start.round != w->round) {
		/* secure async: the last task's cohort may still unmask */
		fb_wk_sa_hold(w);
	}
	if (round_running(w)) {
		fb_log_warn(
		    "round %u started while round %u was %s; abandoning "
		    "round %u",
		    m->u.round_start.round, w->round,
		    fb_wk_phase_name(w->phase), w->round);
	}
	fb_wk_round_leave(w);
	fb_wk_sa_ahead_check(w, m);
	if (!round_start_usable(w, m)) {
		fb_log_warn("round %u: malformed round start ignored",
		    m->u.round_start.round);
		return;
	}
	fb_log_clear_error();
	if (!round_start_wanted(w, m)) {
		fb_wk_round_fail(w, m->u.round_start.round, fb_log_last_error());
		return;
	}
	round_settings(w, m);
	if (w->secure && model_stream_open(w, m) != FB_OK) {
		fb_wk_round_fail(w, w->round, "the round's model stream is not "
		                              "usable here");
		return;
	}
	if (m->u.round_start.secagg && fb_wk_sa_start(w, m) != FB_OK) {
		fb_wk_sa_end(w);
		fb_wk_round_fail(w, w->round, fb_log_last_error()[0] != '\0'
		        ? fb_log_last_error()
		        : "cannot take part in secure aggregation");
		return;
	}
	w->phase = FB_WK_FETCHING;
	fb_log_debug("round %u: fetching the model (%u chunks)", w->round,
	    w->chunk_count);
	if (fb_wk_fetch_more(w) != FB_OK) {
		fb_wk_round_leave(w);
	}
}

bool
fb_wk_fetch_pending(const fb_wk *w)
{
	return w->phase == FB_WK_FETCHING && w->next_fetch < w->chunk_count &&
	       w->next_fetch < w->next_chunk + (uint32_t)w->cfg->fetch_window;
}

fb_err
fb_wk_fetch_more(fb_wk *w)
{
	fb_msg m = {.type = FB_MSG_MODEL_FETCH};
	fb_err rc;

	/* After what waits in the outbox (this round's advert, say). */
	while (w->out_count == 0 && fb_wk_fetch_pending(w)) {
		m.u.model_fetch.round = w->round;
		m.u.model_fetch.chunk = w->next_fetch;
		rc = fb_wk_send_now(w, &m, NULL, 0, NULL);
		if (rc == FB_EAGAIN) {
			return FB_OK; /* on room (fb_wk_on_writable) */
		}
		if (rc != FB_OK) {
			return rc;
		}
		w->next_fetch++;
	}
	return FB_OK;
}

/*
 * The trainer is about to overwrite w->local. Parts of the last update may
 * still be queued in ZeroMQ (an upload the coordinator stopped reading):
 * they keep the old memory, and training gets fresh memory.
 */
static fb_err
local_writable(fb_wk *w)
{
	/* (a synthetic update is made once and kept: copied if it moves) */
	if (fb_lent_own(&w->local_lent, w->param_count * 4,
	        w->synthetic && w->synthetic_ready) != FB_OK) {
		fb_log_error(
		    "round %u: out of memory for the update", w->round);
		return FB_ENOMEM;
	}
	w->local = fb_lent_data(w->local_lent);
	return FB_OK;
}

static void
start_training(fb_wk *w)
{
	fb_log_clear_error();
	if (local_writable(w) != FB_OK ||
	    w->io->train_start(w->io->arg, w) != FB_OK) {
		fb_wk_round_fail(w, w->round, fb_log_last_error());
		return;
	}
	w->phase = FB_WK_TRAINING;
}

/*
 * Secure mode: the slots received model chunks wait in before their
 * check, one per core (up to FB_WK_BATCH_MAX), made once.
 */
static fb_err
dl_slots_ready(fb_wk *w)
{
	uint32_t n = fb_pool_threads(w->pool) + 1;
	size_t stride = fb_wk_ct_stride(w);

	n = n > FB_WK_BATCH_MAX ? FB_WK_BATCH_MAX : n;
	if (w->dl_slots != NULL && w->dl_cap == n && w->dl_stride == stride) {
		return FB_OK;
	}
	fb_free(w->dl_slots);
	w->dl_cap = 0;
	if ((w->dl_slots = fb_alloc((size_t)n * stride)) == NULL) {
		fb_log_error("round %u: out of memory for the model's chunks",
		    w->round);
		return FB_ENOMEM;
	}
	w->dl_cap = n;
	w->dl_stride = stride;
	return FB_OK;
}

/* The checks of a batch of model chunks: slot i is position dl_first + i. */
typedef struct dl_arg {
	fb_wk *w;
	fb_err rc[FB_WK_BATCH_MAX];
	fb_reject why[FB_WK_BATCH_MAX];
	int final[FB_WK_BATCH_MAX];
	uint8_t hash[FB_WK_BATCH_MAX][FB_STREAM_HASH_LEN];
} dl_arg;

static void
dl_piece(void *arg, uint32_t i)
{
	dl_arg *a = arg;
	fb_wk *w = a->w;
	uint64_t k = (uint64_t)w->dl_first + i;
	size_t mlen = 0;

	a->rc[i] = fb_stream_pull_chunk_at(w->mpull, k,
	    w->dl_slots + (size_t)i * w->dl_stride, w->dl_len[i],
	    (uint8_t *)w->global + k * w->chunk_bytes,
	    w->dl_len[i] - FB_STREAM_CHUNK_OVERHEAD, &mlen, &a->final[i],
	    a->hash[i], &a->why[i]);
}

/*
 * Secure mode: verifies and decrypts the chunks waiting in the slots, all
 * at once on the pool, into w->global; their hashes then go into the
 * model stream's digest in order, and after the last chunk the trailer's
 * signature is checked. False: the model is refused (logged).
 */
static bool
dl_check(fb_wk *w)
{
	dl_arg a = {.w = w};
	uint64_t bytes = 0;
	bool last = false;
	fb_reject why = FB_REJECT_NONE;

	fb_pool_for(w->pool, w->dl_n, dl_piece, &a);
	for (uint32_t i = 0; i < w->dl_n; i++) {
		uint32_t k = w->dl_first + i;

		last = k + 1 == w->chunk_count;
		if (a.rc[i] != FB_OK || (a.final[i] != 0) != last) {
			fb_log_warn("round %u: model chunk %u rejected (%s); "
			            "abandoning the round",
			    w->round, k,
			    fb_reject_name(a.rc[i] != FB_OK ? a.why[i]
			                                    : FB_REJECT_MALFORMED));
			return false;
		}
		bytes += w->dl_len[i] - FB_STREAM_CHUNK_OVERHEAD;
	}
	if (fb_stream_pull_hashes(w->mpull, a.hash[0], w->dl_n, bytes,
	        last) != FB_OK) {
		fb_log_warn("round %u: the model stream took no more chunks; "
		            "abandoning the round",
		    w->round);
		return false;
	}
	w->dl_first += w->dl_n;
	w->dl_n = 0;
	if (!last) {
		return true;
	}
	if (fb_stream_pull_final(w->mpull, &w->coord_pk, w->model_trailer.b,
	        w->model_trailer.len, NULL, &why) != FB_OK) {
		fb_log_warn("round %u: the model's signature does not verify "
		            "(%s); abandoning the round",
		    w->round, fb_reject_name(why));
		return false;
	}
	return true;
}

/*
 * Stores model chunk w->next_chunk. Secure mode: into a slot, checked with
 * the others once the slots are full or the model is all here, so that
 * the decryption runs on every core.
 */
static bool
model_chunk_take(fb_wk *w, const fb_frame *f, uint64_t off, uint64_t len)
{
	if (!w->secure) {
		memcpy((uint8_t *)w->global + off, f->payload, len);
		return true;
	}
	if (w->dl_n == 0 && dl_slots_ready(w) != FB_OK) {
		return false;
	}
	memcpy(w->dl_slots + (size_t)w->dl_n * w->dl_stride, f->payload,
	    f->payload_len);
	w->dl_len[w->dl_n++] = f->payload_len;
	if (w->dl_n < w->dl_cap && w->next_chunk + 1 < w->chunk_count) {
		return true;
	}
	return dl_check(w);
}

void
fb_wk_on_model_chunk(fb_wk *w, const fb_frame *f)
{
	const fb_msg *m = &f->msg;
	uint64_t off, len, total = w->param_count * 4;

	if (w->phase != FB_WK_FETCHING || m->u.model_chunk.round != w->round) {
		fb_log_debug("dropped model chunk %u of round %u",
		    m->u.model_chunk.chunk, m->u.model_chunk.round);
		return;
	}
	if (m->u.model_chunk.chunk != w->next_chunk) {
		fb_log_warn("round %u: model chunk %u out of order (wanted %u);"
		            " abandoning the round",
		    w->round, m->u.model_chunk.chunk, w->next_chunk);
		fb_wk_round_fail(w, w->round, "a model chunk came out of order");
		return;
	}
	off = (uint64_t)w->next_chunk * w->chunk_bytes;
	len = total - off < w->chunk_bytes ? total - off : w->chunk_bytes;
	if (f->payload_len !=
	    len + (w->secure ? FB_STREAM_CHUNK_OVERHEAD : 0)) {
		fb_log_warn("round %u: model chunk %u has %zu bytes, expected "
		            "%" PRIu64 "; abandoning the round",
		    w->round, w->next_chunk, f->payload_len, len);
		fb_wk_round_fail(w, w->round, "a model chunk had the wrong size");
		return;
	}
	if (!model_chunk_take(w, f, off, len)) {
		fb_wk_round_fail(w, w->round, "a model chunk failed its check");
		return;
	}
	w->next_chunk++;
	if (w->next_chunk == w->chunk_count) {
		fb_log_debug("round %u: model received; training %" PRIu64
		             " steps",
		    w->round, w->steps);
		start_training(w);
	} else if (fb_wk_fetch_more(w) != FB_OK) {
		fb_wk_round_leave(w);
	}
}

void
fb_wk_on_trained(fb_wk *w, int64_t now)
{
	fb_err rc = w->train_rc;

	w->now = now;
	if (w->phase != FB_WK_TRAINING) {
		return; /* the round was left meanwhile */
	}
	w->phase = FB_WK_IDLE;
	if (rc == FB_ECLOSED) {
		fb_log_info("round %u: training cancelled", w->round);
		return;
	}
	if (rc != FB_OK) {
		char why[FB_TEXT_MAX + 32];
		snprintf(why, sizeof(why), "training failed: %s",
		    w->train_why[0] != '\0' ? w->train_why : fb_strerror(rc));
		fb_log_error("round %u: %s", w->round, why);
		fb_wk_round_fail(w, w->round, why);
		return;
	}
	if (w->synthetic) {
		snprintf(w->backend, sizeof(w->backend),
		    "none (synthetic update)");
	}
	if (w->own_budget) {
		fb_log_info("round %u: %" PRIu64 " steps fitted to the time "
		            "budget at this worker's %.1f steps/s (kept here)",
		    w->round, w->steps, w->speed);
	}
	if (w->stats.steps > 0 && w->stats.seconds > 0 &&
	    isfinite(w->stats.seconds)) {
		/* smoothed as the coordinator smooths the speeds of plain
		 * workers; kept here, for our own time budgets */
		double sp = (double)w->stats.steps / w->stats.seconds;
		w->speed = w->has_speed ? 0.5 * w->speed + 0.5 * sp : sp;
		w->has_speed = true;
	}
	if (w->sa != NULL && w->sa_phase != FB_WK_SA_MASKING) {
		fb_log_info("round %u: %" PRIu64 " steps in %.2fs, loss %.4f; "
		            "waiting for the secure-aggregation shares",
		    w->round, w->stats.steps, w->stats.seconds,
		    w->stats.loss_mean);
		w->phase = FB_WK_WAITING;
		return;
	}
	fb_log_info("round %u: %" PRIu64 " steps in %.2fs, loss %.4f; "
	            "sending %supdate",
	    w->round, w->stats.steps, w->stats.seconds, w->stats.loss_mean,
	    w->sa != NULL ? "masked " : "");
	fb_log_clear_error();
	if (fb_wk_upload_start(w, w->stats.seconds, w->stats.loss_mean,
	        w->stats.steps) != FB_OK) {
		fb_log_warn("round %u: update not delivered", w->round);
		fb_wk_round_fail(w, w->round, fb_log_last_error());
	}
}

void
fb_wk_on_round_cancel(fb_wk *w, const fb_msg *m)
{
	if (m->u.round_cancel.round != w->round) {
		return;
	}
	if (round_running(w)) {
		fb_log_warn(
		    "round %u cancelled by the coordinator while %s: %s",
		    w->round, fb_wk_phase_name(w->phase),
		    m->u.round_cancel.reason);
	}
	fb_wk_round_leave(w);
}
