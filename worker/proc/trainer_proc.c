/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trainer_proc.c -- the "process" trainer backend: local training done by
 * a program of the user's (train.command), e.g. a PyTorch script, under
 * torchrun on the box's GPUs, using python/fedbox.
 *
 * The worker keeps the model's parameters in a memfd that it and the
 * trainer both map: set_params writes the global model there, the trainer
 * reads it in place (no copy, no pickle), trains, writes its parameters
 * back into the same memory and answers; get_params copies them out,
 * checking every value on the way. The Unix socket carries only small
 * control messages (proc_impl.h). The trainer never sees a key, a mask or
 * anything of secure aggregation: those stay in the worker.
 *
 * Watching: every wait looks at the trainer's exit, the round's cancel flag
 * and a deadline (train.start_timeout to connect, train.task_timeout per
 * task). A trainer that crashes, hangs, answers with the wrong layout, the
 * wrong size, bad numbers or NaN fails that round's local training, is
 * stopped (SIGTERM, then SIGKILL) and replaced by a fresh one with fresh
 * memory, so that the worker goes on to the next round. A round cancelled
 * while the trainer works on it kills the trainer at once (the worker must
 * not wait for it) and the next round starts a new one; one cancelled
 * while the trainer is still starting lets it go on starting.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/proc/proc_impl.h"
#include "worker/trainer.h"

#define HELLO_MS 5000      /* accept to hello, per connection */
#define STOP_GRACE_MS 1000 /* SIGTERM to SIGKILL when stopping a trainer */
#define EXIT_WAIT_MS 2000  /* after the connection closed: how it ended */
#define SEND_MS 10000      /* to hand a control message over */

typedef struct proc_state {
	const fb_model *m;
	uint64_t param_count;
	size_t params_len;    /* param_count * 4 */
	fb_proc_child *child; /* owned */
	int64_t start_timeout_ms;
	int64_t task_timeout_ms;
	uint32_t copy_threads; /* for set_params and get_params */
	char device[8];        /* auto, cpu, cuda: the trainer's hint */
	/* the parameters' shared memory of the current trainer */
	int params_fd;
	float *params; /* mapping of params_fd, params_len bytes */
	/* the lent shard, or -1 */
	int x_fd, y_fd;
	uint32_t shard_count, shard_dim, shard_classes;
	uint8_t y_dtype;
	/* the current trainer */
	int cfd; /* its connection, or -1 */
	bool welcomed;
	bool connected; /* it got in (since its start) */
	int64_t started_ms;
	bool restart; /* start a new one before the next task */
	uint32_t starts;
	/* the current task */
	uint64_t task_id;
	uint32_t round;
	bool have_result; /* get_params may copy */
	fb_proc_buf out;
	uint8_t *in;
	size_t in_cap;
	char desc[192];
} proc_state;

static void
unmap_params(proc_state *s)
{
	if (s->params != NULL) {
		munmap(s->params, s->params_len);
		s->params = NULL;
	}
	if (s->params_fd >= 0) {
		close(s->params_fd);
		s->params_fd = -1;
	}
}

/* memfd_sized makes a sealable memfd of `len` bytes that cannot shrink or
 * grow (a trainer could otherwise make our mapping fault). */
static fb_err
memfd_sized(const char *name, size_t len, int *out)
{
	int fd;

	*out = -1;
	if ((fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0) {
		fb_log_error("trainer: memfd_create: %s", strerror(errno));
		return FB_EIO;
	}
	if (ftruncate(fd, (off_t)len) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
		fb_log_error("trainer: shared memory of %zu bytes: %s", len,
		    strerror(errno));
		close(fd);
		return len > 0 && errno == ENOSPC ? FB_ENOMEM : FB_EIO;
	}
	*out = fd;
	return FB_OK;
}

/* map_params gives the trainer to come a fresh parameter memory, so that
 * one that was stopped mid-task cannot write into the next one's. */
static fb_err
map_params(proc_state *s)
{
	fb_err rc;
	void *p;

	unmap_params(s);
	if ((rc = memfd_sized("fedbox-params", s->params_len, &s->params_fd)) !=
	    FB_OK) {
		return rc;
	}
	if (fcntl(s->params_fd, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
		fb_log_error(
		    "trainer: sealing shared memory: %s", strerror(errno));
		return FB_EIO;
	}
	p = mmap(NULL, s->params_len, PROT_READ | PROT_WRITE, MAP_SHARED,
	    s->params_fd, 0);
	if (p == MAP_FAILED) {
		fb_log_error("trainer: mapping %zu bytes of shared memory: %s",
		    s->params_len, strerror(errno));
		return FB_ENOMEM;
	}
	if (s->params_len >= ((size_t)8 << 20)) {
		(void)madvise(p, s->params_len, MADV_HUGEPAGE);
	}
	s->params = p;
	return FB_OK;
}

/* lend_one copies `len` bytes into a memfd sealed against any change. */
static fb_err
lend_one(const char *name, const void *src, size_t len, int *out)
{
	fb_err rc;
	void *p;
	int fd;

	*out = -1;
	if ((rc = memfd_sized(name, len, &fd)) != FB_OK) {
		return rc;
	}
	if (len > 0) {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			fb_log_error(
			    "trainer: mapping the shard: %s", strerror(errno));
			close(fd);
			return FB_ENOMEM;
		}
		memcpy(p, src, len);
		munmap(p, len);
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
		fb_log_error("trainer: sealing the shard: %s", strerror(errno));
		close(fd);
		return FB_EIO;
	}
	*out = fd;
	return FB_OK;
}

static fb_err
lend_shard(proc_state *s, const fb_dataset *d)
{
	fb_err rc;

	s->shard_count = d->count;
	s->shard_dim = d->dim;
	s->shard_classes = d->classes;
	/* fb_label: a float target (regression) or an int32 class */
	s->y_dtype = d->task == FB_TASK_REGRESSION ? FB_PROC_F32 : FB_PROC_I32;
	if ((rc = lend_one("fedbox-shard-x", d->x,
	         (size_t)d->count * d->dim * sizeof(float), &s->x_fd)) !=
	    FB_OK) {
		return rc;
	}
	return lend_one("fedbox-shard-y", d->y,
	    (size_t)d->count * sizeof(d->y[0]), &s->y_fd);
}

static void
drop_connection(proc_state *s)
{
	if (s->cfd >= 0) {
		close(s->cfd);
		s->cfd = -1;
	}
	s->welcomed = false;
}

/* start_trainer starts a new trainer with new parameter memory. */
static fb_err
start_trainer(proc_state *s)
{
	fb_err rc;

	drop_connection(s);
	fb_proc_child_stop(s->child, 0, 0);
	if ((rc = map_params(s)) != FB_OK) {
		return rc;
	}
	if (s->starts > 0) {
		fb_log_info(
		    "trainer: starting a new one (start %u)", s->starts + 1);
	}
	if ((rc = fb_proc_child_start(s->child)) != FB_OK) {
		return rc;
	}
	s->starts++;
	s->started_ms = fb_now_ms();
	s->restart = false;
	s->connected = false;
	return FB_OK;
}

/* How a failed trainer is stopped. */
typedef enum stop_how {
	STOP_NOW = 0, /* SIGKILL: cancelled (the worker waits for us), or it
	               * answered wrongly and is waiting for the next task */
	STOP_WAIT,    /* it is ending by itself (crash, fatal failure): let
	               * it, e.g. torchrun stopping its ranks; then SIGKILL */
	STOP_TERM,    /* it hangs: SIGTERM first (a Python trainer prints
	               * its stacks), then SIGKILL */
} stop_how;

/* give_up stops the trainer after a failed task. The next round gets a
 * new one, started now so that it is ready by then -- unless this was a
 * cancel (that must not wait) or the trainer never got as far as
 * connecting (starting it again at once would most likely fail again:
 * the next round's set_params tries). */
static void
give_up(proc_state *s, stop_how how, bool cancelled)
{
	bool again = !cancelled && s->connected;

	drop_connection(s);
	fb_proc_child_stop(s->child, how == STOP_TERM ? SIGTERM : 0,
	    how == STOP_NOW ? 0 : STOP_GRACE_MS);
	s->restart = true;
	s->have_result = false;
	if (again && start_trainer(s) != FB_OK) {
		s->restart = true; /* try again at the next set_params */
	}
}

static void
proc_close(void *state)
{
	proc_state *s = state;

	if (s == NULL) {
		return;
	}
	if (s->cfd >= 0) {
		/* Tell it we are done; it may end on its own. */
		fb_proc_msg_begin(&s->out, FB_PROC_BYE);
		if (fb_proc_msg_end(&s->out) == FB_OK &&
		    fb_proc_send(s->cfd, &s->out, NULL, 0, fb_now_ms() + 200) ==
		        FB_OK) {
			int64_t until = fb_now_ms() + STOP_GRACE_MS;
			char why[64];
			while (
			    fb_now_ms() < until &&
			    !fb_proc_child_exited(s->child, why, sizeof(why))) {
				fb_sleep_ms(10);
			}
		}
	}
	drop_connection(s);
	fb_proc_child_stop(s->child, SIGTERM, STOP_GRACE_MS);
	fb_proc_child_free(s->child);
	unmap_params(s);
	if (s->x_fd >= 0) {
		close(s->x_fd);
	}
	if (s->y_fd >= 0) {
		close(s->y_fd);
	}
	fb_proc_buf_fini(&s->out);
	fb_free(s->in);
	fb_free(s);
}

static fb_err
proc_open(const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, uint32_t max_batch, void **state)
{
	static const char *const devices[] = {"auto", "cpu", "cuda"};
	const fb_trainer_proc_config *pc = cfg->proc;
	fb_err rc = FB_OK;
	proc_state *s = NULL;
	const char **env = NULL;
	char dev_env[64], gpu_env[16 * 8 + 32];
	uint32_t n = 0;
	char cmd[160];

	*state = NULL;
	if (pc == NULL || pc->argc < 1 || cfg->device < 0 || cfg->device > 2) {
		fb_log_error("trainer: no command for the trainer process");
		return FB_EINVAL;
	}
	if ((s = fb_calloc(1, sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	s->params_fd = s->x_fd = s->y_fd = s->cfd = -1;
	s->m = m;
	s->param_count = fb_model_param_count(m);
	s->params_len = (size_t)s->param_count * sizeof(float);
	s->start_timeout_ms =
	    pc->start_timeout_ms > 0 ? pc->start_timeout_ms : 120000;
	s->task_timeout_ms =
	    pc->task_timeout_ms > 0 ? pc->task_timeout_ms : 3600000;
	snprintf(s->device, sizeof(s->device), "%s", devices[cfg->device]);
	s->copy_threads =
	    fb_proc_copy_threads(s->param_count, pc->copy_threads);
	/* The trainer's own variables: the device hint, and the GPUs. */
	if ((env = fb_calloc(pc->env_count + 2, sizeof(char *))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	snprintf(
	    dev_env, sizeof(dev_env), "FEDBOX_TRAINER_DEVICE=%s", s->device);
	env[n++] = dev_env;
	if (cfg->gpu_count > 0) {
		int at =
		    snprintf(gpu_env, sizeof(gpu_env), "CUDA_VISIBLE_DEVICES=");
		for (uint32_t i = 0; i < cfg->gpu_count && i < 16; i++) {
			at +=
			    snprintf(gpu_env + at, sizeof(gpu_env) - (size_t)at,
			        "%s%d", i ? "," : "", cfg->gpus[i]);
		}
		env[n++] = gpu_env;
	}
	/* The config's own entries come last: they win. */
	for (uint32_t i = 0; i < pc->env_count; i++) {
		env[n++] = pc->env[i];
	}
	if ((rc = fb_proc_child_alloc(pc->argv, pc->argc, env, n, pc->workdir,
	         &s->child)) != FB_OK) {
		goto out;
	}
	if (pc->share_shard && shard != NULL && shard->count > 0 &&
	    (rc = lend_shard(s, shard)) != FB_OK) {
		goto out;
	}
	fb_proc_child_describe(s->child, cmd, sizeof(cmd));
	snprintf(s->desc, sizeof(s->desc), "process: %s", cmd);
	if (cfg->throttle > 1.0) {
		fb_log_warn("trainer: train.throttle does not slow a trainer "
		            "process down");
	}
	if ((rc = start_trainer(s)) != FB_OK) {
		goto out;
	}
	(void)max_batch;
	*state = s;
	s = NULL;
out:
	fb_free(env);
	proc_close(s);
	return rc;
}

static fb_err
proc_set_params(void *state, const float *params)
{
	proc_state *s = state;
	fb_err rc;
	char why[96];

	s->have_result = false;
	if (s->restart || fb_proc_child_pid(s->child) == 0 ||
	    fb_proc_child_exited(s->child, why, sizeof(why))) {
		if (!s->restart && why[0] != '\0') {
			fb_log_warn("trainer: pid %d %s between rounds",
			    (int)fb_proc_child_pid(s->child), why);
		}
		if ((rc = start_trainer(s)) != FB_OK) {
			s->restart = true;
			return rc;
		}
	}
	(void)fb_proc_copy_par(
	    s->params, params, s->param_count, false, s->copy_threads);
	return FB_OK;
}

static bool
child_gone_cb(void *arg)
{
	proc_state *s = arg;
	char why[96];
	return fb_proc_child_exited(s->child, why, sizeof(why));
}

/*
 * await_trainer waits for the trainer to connect and authenticate, until
 * its start deadline, *cancel, or its exit. Refused connections are logged
 * and waited past.
 */
static fb_err
await_trainer(proc_state *s, fb_proc_cancel *cancel)
{
	int64_t deadline = s->started_ms + s->start_timeout_ms;
	fb_proc_hello h;
	char why[96];
	fb_err rc;

	for (;;) {
		struct pollfd p;
		int lfd = fb_proc_child_listen_fd(s->child);
		int64_t left = deadline - fb_now_ms();

		if (fb_proc_cancelled(cancel)) {
			return FB_ECLOSED;
		}
		if (fb_proc_child_exited(s->child, why, sizeof(why))) {
			fb_log_error("round %u: the trainer %s before it "
			             "connected",
			    s->round, why);
			return FB_EIO;
		}
		if (left <= 0 || lfd < 0) {
			fb_log_error("round %u: the trainer did not connect "
			             "within %.0fs (train.start_timeout)",
			    s->round, (double)s->start_timeout_ms / 1000);
			return FB_ETIMEDOUT;
		}
		p.fd = lfd;
		p.events = POLLIN;
		p.revents = 0;
		if (poll(&p, 1, left < 50 ? (int)left : 50) <= 0) {
			continue;
		}
		rc = fb_proc_child_accept(s->child, HELLO_MS, &s->cfd, &h);
		if (rc == FB_OK) {
			s->connected = true;
			return FB_OK;
		}
		if (rc != FB_EAGAIN && rc != FB_EAUTH) {
			return rc;
		}
	}
}

static fb_err
send_welcome(proc_state *s)
{
	int fds[3] = {s->params_fd, s->x_fd, s->y_fd};
	bool shard = s->x_fd >= 0;
	fb_err rc;

	fb_proc_msg_begin(&s->out, FB_PROC_WELCOME);
	fb_proc_buf_u32(&s->out, FB_PROC_VERSION);
	fb_proc_buf_u64(&s->out, s->param_count);
	fb_proc_layout_pack(&s->out, s->m);
	fb_proc_buf_u64(&s->out, s->params_len);
	fb_proc_buf_str(&s->out, s->device);
	fb_proc_buf_u8(&s->out, shard ? 1 : 0);
	if (shard) {
		fb_proc_buf_u32(&s->out, s->shard_count);
		fb_proc_buf_u32(&s->out, s->shard_dim);
		fb_proc_buf_u32(&s->out, s->shard_classes);
		fb_proc_buf_u8(&s->out, s->y_dtype);
	}
	if ((rc = fb_proc_msg_end(&s->out)) != FB_OK) {
		fb_log_error(
		    "trainer: the welcome does not fit (%s)", fb_strerror(rc));
		return rc;
	}
	rc = fb_proc_send(
	    s->cfd, &s->out, fds, shard ? 3 : 1, fb_now_ms() + SEND_MS);
	if (rc == FB_OK) {
		s->welcomed = true;
	}
	return rc;
}

/* check_result says whether a RESULT may be taken; logs why not. */
static fb_err
check_result(proc_state *s, fb_proc_rd *r, fb_train_stats *stats)
{
	fb_proc_result res;
	char why[512];

	if (fb_proc_result_unpack(r, &res) != FB_OK) {
		fb_log_error(
		    "round %u: the trainer's result is truncated", s->round);
		return FB_EPROTO;
	}
	if (res.id != s->task_id) {
		fb_log_error("round %u: the trainer answered task %" PRIu64
		             ", not %" PRIu64,
		    s->round, res.id, s->task_id);
		return FB_EPROTO;
	}
	if (res.param_count != s->param_count) {
		/* Name the tensor where it went wrong, when the table says. */
		if (fb_proc_layout_check(&res.layout, s->m, why, sizeof(why)) ==
		    FB_OK) {
			why[0] = '\0';
		}
		fb_log_error("round %u: the trainer returned the wrong size: "
		             "%" PRIu64 " parameters, the model has %" PRIu64
		             "%s%s",
		    s->round, res.param_count, s->param_count,
		    why[0] ? "; " : "", why);
		return FB_EPROTO;
	}
	if (fb_proc_layout_check(&res.layout, s->m, why, sizeof(why)) !=
	    FB_OK) {
		fb_log_error("round %u: the trainer returned the wrong layout: "
		             "%s",
		    s->round, why);
		return FB_EPROTO;
	}
	if (res.steps == 0 || res.examples == 0 || !isfinite(res.loss) ||
	    !(isnan(res.a_norm) || (isfinite(res.a_norm) && res.a_norm > 0))) {
		fb_log_error("round %u: the trainer's result is not usable: "
		             "%" PRIu64 " steps, %" PRIu64
		             " examples, loss %g, "
		             "a_norm %g (steps and examples must be >= 1, the "
		             "loss finite, a_norm finite and > 0 or not given)",
		    s->round, res.steps, res.examples, res.loss, res.a_norm);
		return FB_EPROTO;
	}
	stats->steps = res.steps;
	stats->examples = res.examples;
	stats->loss_mean = res.loss;
	stats->a_norm = isnan(res.a_norm) ? 0 : res.a_norm;
	return FB_OK;
}

/* after_close explains a closed connection: how the trainer ended, if it
 * does within EXIT_WAIT_MS. */
static void
after_close(proc_state *s)
{
	int64_t until = fb_now_ms() + EXIT_WAIT_MS;
	char why[96];

	while (fb_now_ms() < until) {
		if (fb_proc_child_exited(s->child, why, sizeof(why))) {
			fb_log_error("round %u: the trainer (pid %d) %s",
			    s->round, (int)fb_proc_child_pid(s->child), why);
			return;
		}
		fb_sleep_ms(10);
	}
	fb_log_error("round %u: the trainer closed its connection", s->round);
}

static fb_err
send_task(proc_state *s, const fb_train_opts *opts)
{
	fb_proc_task t;
	fb_err rc;

	memset(&t, 0, sizeof(t));
	t.id = ++s->task_id;
	t.kind = opts->evaluate_only ? FB_PROC_EVALUATE : FB_PROC_TRAIN;
	t.round = opts->round;
	t.steps = opts->steps;
	t.batch = opts->batch;
	t.lr = opts->lr;
	t.momentum = opts->momentum;
	t.weight_decay = opts->weight_decay;
	t.prox_mu = opts->prox_mu;
	t.seed = opts->seed;
	t.worker_index = opts->worker_index;
	if ((rc = fb_proc_task_pack(&s->out, &t)) != FB_OK ||
	    (rc = fb_proc_send(
	         s->cfd, &s->out, NULL, 0, fb_now_ms() + SEND_MS)) != FB_OK) {
		fb_log_error(
		    "round %u: the trainer did not take the task", s->round);
	}
	return rc;
}

/* await_answer waits for the task's answer and says what went wrong. */
static fb_err
await_answer(
    proc_state *s, int64_t sent_ms, fb_proc_cancel *cancel, size_t *len)
{
	char why[96];
	fb_err rc;

	rc = fb_proc_recv(s->cfd, &s->in, &s->in_cap, len,
	    sent_ms + s->task_timeout_ms, cancel, child_gone_cb, s);
	switch (rc) {
	case FB_OK:
	case FB_ECLOSED:
		break;
	case FB_EAGAIN: /* it exited */
		(void)fb_proc_child_exited(s->child, why, sizeof(why));
		fb_log_error("round %u: the trainer (pid %d) %s during the "
		             "task",
		    s->round, (int)fb_proc_child_pid(s->child), why);
		rc = FB_EIO;
		break;
	case FB_ETIMEDOUT:
		fb_log_error(
		    "round %u: the trainer did not answer within %.0fs "
		    "(train.task_timeout); stopping it",
		    s->round, (double)s->task_timeout_ms / 1000);
		break;
	case FB_EIO:
		after_close(s);
		break;
	default:
		fb_log_error("round %u: reading the trainer's answer: %s",
		    s->round, fb_strerror(rc));
		break;
	}
	return rc;
}

/* take_eval keeps the task's evaluation (one, before the result): FB_EAGAIN
 * to wait on for the result. */
static fb_err
take_eval(proc_state *s, fb_proc_rd *r, fb_train_stats *stats)
{
	char why[256];
	uint64_t id = 0;
	fb_train_eval ev;

	if (stats->eval.examples > 0) {
		fb_log_error("round %u: the trainer sent a second evaluation "
		             "for the task",
		    s->round);
		return FB_EPROTO;
	}
	if (fb_proc_eval_unpack(r, &id, &ev, why, sizeof(why)) != FB_OK) {
		fb_log_error("round %u: the trainer's evaluation is not "
		             "usable: %s",
		    s->round, why);
		return FB_EPROTO;
	}
	if (id != s->task_id) {
		fb_log_error("round %u: the trainer evaluated task %" PRIu64
		             ", not %" PRIu64,
		    s->round, id, s->task_id);
		return FB_EPROTO;
	}
	stats->eval = ev;
	return FB_EAGAIN;
}

/* take_answer reads the answer in s->in: a result to check, or the
 * trainer's own report of a failure (FB_EIO; *keep says whether the
 * trainer goes on: it failed the task, not itself). */
static fb_err
take_answer(
    proc_state *s, size_t len, fb_train_stats *stats, bool *keep, bool *ending)
{
	char why[FB_PROC_REASON_MAX];
	fb_proc_rd r;
	uint32_t type;
	uint64_t id;
	bool fatal = true;

	*keep = false;
	*ending = false;
	if (fb_proc_msg_type(s->in, len, &r, &type) != FB_OK) {
		fb_log_error(
		    "round %u: the trainer sent an empty message", s->round);
		return FB_EPROTO;
	}
	if (type == FB_PROC_RESULT) {
		return check_result(s, &r, stats);
	}
	if (type == FB_PROC_EVAL) {
		return take_eval(s, &r, stats);
	}
	if (type != FB_PROC_FAIL) {
		fb_log_error("round %u: the trainer sent message type %u "
		             "instead of a result",
		    s->round, type);
		return FB_EPROTO;
	}
	if (fb_proc_fail_unpack(&r, &id, &fatal, why, sizeof(why)) != FB_OK ||
	    id != s->task_id) {
		fb_log_error("round %u: the trainer failed (its message is "
		             "malformed)",
		    s->round);
		return FB_EPROTO;
	}
	fb_log_error("round %u: the trainer failed: %s", s->round, why);
	*keep = !fatal;
	*ending = fatal;
	return FB_EIO;
}

static fb_err
proc_train(void *state, const fb_train_opts *opts, fb_train_stats *stats,
    fb_proc_cancel *cancel)
{
	proc_state *s = state;
	size_t len = 0;
	int64_t sent_ms = 0;
	bool keep = false, ending = false;
	fb_err rc = FB_OK;

	memset(stats, 0, sizeof(*stats));
	s->have_result = false;
	s->round = opts->round;
	if (s->restart || s->params == NULL) {
		return FB_EINVAL; /* set_params failed or was not called */
	}
	if (s->cfd < 0 && (rc = await_trainer(s, cancel)) != FB_OK) {
		/* Cancelled while it starts: let it go on starting (torchrun
		 * and CUDA can take longer than a round); the next round waits
		 * for it, within the same train.start_timeout. */
		keep = rc == FB_ECLOSED;
		goto out;
	}
	if (!s->welcomed && (rc = send_welcome(s)) != FB_OK) {
		fb_log_error(
		    "round %u: the trainer did not take the welcome", s->round);
		goto out;
	}
	if ((rc = send_task(s, opts)) != FB_OK) {
		goto out;
	}
	sent_ms = fb_now_ms();
	/* an evaluation may come first: then the result, same deadline
	 * (an evaluation-only task ends with the evaluation) */
	do {
		if ((rc = await_answer(s, sent_ms, cancel, &len)) != FB_OK) {
			goto out;
		}
		rc = take_answer(s, len, stats, &keep, &ending);
	} while (rc == FB_EAGAIN && !opts->evaluate_only);
	if (rc == FB_EAGAIN) {
		stats->seconds = (double)(fb_now_ms() - sent_ms) / 1000.0;
		rc = FB_OK;
		goto out; /* evaluated; no parameters come back */
	}
	if (rc != FB_OK) {
		goto out;
	}
	/* Our own clock, task sent to answer: the coordinator schedules
	 * time budgets with it, so the trainer's start-up stays out. */
	stats->seconds = (double)(fb_now_ms() - sent_ms) / 1000.0;
	stats->samples = stats->steps * opts->batch;
	s->have_result = true;
out:
	if (rc != FB_OK) {
		if (!keep) {
			give_up(s,
			    rc == FB_ETIMEDOUT ? STOP_TERM
			    : rc == FB_EIO &&
			            (ending || sent_ms == 0 ||
			                fb_proc_child_exited(s->child, NULL, 0))
			        ? STOP_WAIT
			        : STOP_NOW,
			    rc == FB_ECLOSED);
		}
		memset(stats, 0, sizeof(*stats));
	}
	return rc;
}

static fb_err
proc_get_params(void *state, float *params)
{
	proc_state *s = state;
	uint64_t bad;
	fb_tensor_info ti;
	uint32_t n;

	if (!s->have_result) {
		return FB_EINVAL;
	}
	s->have_result = false;
	bad = fb_proc_copy_par(
	    params, s->params, s->param_count, true, s->copy_threads);
	if (bad == s->param_count) {
		return FB_OK;
	}
	n = fb_model_tensor_count(s->m);
	memset(&ti, 0, sizeof(ti));
	for (uint32_t i = 0; i < n; i++) {
		fb_model_tensor_info(s->m, i, &ti);
		if (bad < ti.offset + ti.count) {
			break;
		}
	}
	fb_log_error("round %u: the trainer's parameters hold %s at %s, "
	             "element %" PRIu64,
	    s->round, isnan(s->params[bad]) ? "NaN" : "an infinity", ti.name,
	    bad - ti.offset);
	give_up(s, STOP_NOW, false);
	return FB_ERANGE;
}

static void
proc_describe(void *state, char *buf, size_t len)
{
	const proc_state *s = state;
	snprintf(buf, len, "%s", s->desc);
}

const fb_trainer_backend fb_trainer_proc_backend = {
    .name = "process",
    .open = proc_open,
    .close = proc_close,
    .set_params = proc_set_params,
    .train = proc_train,
    .get_params = proc_get_params,
    .describe = proc_describe,
};
