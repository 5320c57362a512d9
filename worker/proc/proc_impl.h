/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proc_impl.h -- private to worker/proc/: the messages between a worker and
 * its trainer process, and the trainer's process (start, stop, who may
 * connect).
 *
 * The control channel is a Unix stream socket. Each message is a 4-byte
 * little-endian body length (at most FB_PROC_MSG_MAX) and a body that
 * starts with a 4-byte type; integers and doubles are little-endian,
 * strings are a 2-byte length and UTF-8 bytes (no NUL). The parameters
 * never travel on the socket: they lie in a memfd both sides map, handed to
 * the authenticated trainer with SCM_RIGHTS next to the welcome.
 *
 *   trainer -> worker  HELLO   magic, version, token[32], pid, world size,
 *                              examples (0: not told yet)
 *   worker -> trainer  WELCOME version, param count, layout, parameter
 *                              bytes, device, shard (count, dim, classes,
 *                              label dtype) or none; fds: params[, x, y]
 *   worker -> trainer  TASK    task id, kind (train, evaluate), round,
 *                              steps, batch, lr,
 *                              momentum, weight decay, prox mu, seed,
 *                              worker index
 *   trainer -> worker  RESULT  task id, examples, steps, loss, a_norm (NaN:
 *                              none), seconds, param count, layout
 *   trainer -> worker  EVAL    task id, examples, loss, accuracy (NaN:
 *                              none), metric count (<= 8), per metric its
 *                              name and value: the task's global model on
 *                              the trainer's validation data; at most one
 *                              per task, before its RESULT (optional)
 *   trainer -> worker  FAIL    task id, fatal (1 byte: the trainer is
 *                              ending), reason
 *   worker -> trainer  BYE     (the worker is closing)
 *
 * A layout is a 4-byte count and per tensor: name, dtype (1 byte; only
 * F32), rank (1 byte, 1..4), shape (8 bytes each) and the offset of its
 * first element in the parameter vector (8 bytes).
 *
 * python/fedbox/_wire.py is the other side of this format; the two must
 * change together (FB_PROC_VERSION).
 */
#ifndef FB_WORKER_PROC_PROC_IMPL_H
#define FB_WORKER_PROC_PROC_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "model/model.h"
#include "worker/trainer.h"

#define FB_PROC_MAGIC 0x50544246u /* "FBTP" */
#define FB_PROC_VERSION 2u /* 2: EVAL */
#define FB_PROC_MSG_MAX (16u << 20) /* bytes of one message body */
#define FB_PROC_TOKEN_LEN 32
#define FB_PROC_REASON_MAX 4096     /* bytes of a FAIL reason kept */
#define FB_PROC_TENSORS_MAX 1000000 /* tensors in a layout */

/* The trainer thread's cancel flag, as worker/trainer.h's ops pass it: set
 * by the worker's loop thread, read here. */
typedef const atomic_int fb_proc_cancel;
static inline bool
fb_proc_cancelled(fb_proc_cancel *c)
{
	return c != NULL && atomic_load(c) != 0;
}

typedef enum fb_proc_type {
	FB_PROC_HELLO = 1,
	FB_PROC_WELCOME = 2,
	FB_PROC_TASK = 3,
	FB_PROC_RESULT = 4,
	FB_PROC_FAIL = 5,
	FB_PROC_BYE = 6,
	FB_PROC_EVAL = 7,
} fb_proc_type;

typedef enum fb_proc_dtype {
	FB_PROC_F32 = 1,
	FB_PROC_U8 = 2,
	FB_PROC_I32 = 3,
} fb_proc_dtype;

typedef enum fb_proc_kind {
	FB_PROC_TRAIN = 1,
	FB_PROC_EVALUATE = 2, /* evaluate the parameters only (EVAL answers;
	                       * a RESULT is taken too) */
} fb_proc_kind;

/* A growable message under construction; `oom` sticks once set. */
typedef struct fb_proc_buf {
	uint8_t *p;
	size_t len, cap;
	bool oom;
} fb_proc_buf;

/* A bounded reader over a received body; `bad` sticks once set. */
typedef struct fb_proc_rd {
	const uint8_t *p;
	size_t left;
	bool bad;
} fb_proc_rd;

typedef struct fb_proc_hello {
	uint32_t magic, version;
	uint8_t token[FB_PROC_TOKEN_LEN];
	uint32_t pid, world;
	uint64_t examples;
} fb_proc_hello;

typedef struct fb_proc_task {
	uint64_t id;
	uint32_t kind; /* fb_proc_kind */
	uint32_t round;
	uint64_t steps;
	uint32_t batch;
	double lr, momentum, weight_decay, prox_mu;
	uint64_t seed;
	uint32_t worker_index;
} fb_proc_task;

/* A RESULT with its layout still in the body (checked in place). */
typedef struct fb_proc_result {
	uint64_t id, examples, steps;
	double loss, a_norm, seconds;
	uint64_t param_count;
	fb_proc_rd layout; /* the rest of the body: the layout */
} fb_proc_result;

/* ---- messages (wire.c) ---- */

/* fb_proc_buf_* append little-endian values; on allocation failure `oom`
 * is set and later appends do nothing. fb_proc_buf_fini frees. */
void fb_proc_buf_u8(fb_proc_buf *b, uint8_t v);
void fb_proc_buf_u32(fb_proc_buf *b, uint32_t v);
void fb_proc_buf_u64(fb_proc_buf *b, uint64_t v);
void fb_proc_buf_f64(fb_proc_buf *b, double v);
void fb_proc_buf_bytes(fb_proc_buf *b, const void *p, size_t len);
void fb_proc_buf_str(fb_proc_buf *b, const char *s);
void fb_proc_buf_fini(fb_proc_buf *b);

/* fb_proc_msg_begin starts a message of `type` in `b` (length to fill in);
 * fb_proc_msg_end fills in the length. Errors: FB_ENOMEM (b->oom), FB_ERANGE
 * (body over FB_PROC_MSG_MAX). */
void fb_proc_msg_begin(fb_proc_buf *b, fb_proc_type type);
FB_MUST_CHECK fb_err fb_proc_msg_end(fb_proc_buf *b);

/* fb_proc_layout_pack appends the layout of model `m`. */
void fb_proc_layout_pack(fb_proc_buf *b, const fb_model *m);
/* fb_proc_task_pack appends a TASK message (begin to end). */
FB_MUST_CHECK fb_err fb_proc_task_pack(fb_proc_buf *b, const fb_proc_task *t);

/* fb_proc_rd_* read little-endian values; past the end they return 0 and
 * set `bad`. fb_proc_rd_str copies at most cap - 1 bytes and a NUL into
 * `out` and sets `bad` when the string is longer, or holds a NUL. */
uint8_t fb_proc_rd_u8(fb_proc_rd *r);
uint32_t fb_proc_rd_u32(fb_proc_rd *r);
uint64_t fb_proc_rd_u64(fb_proc_rd *r);
double fb_proc_rd_f64(fb_proc_rd *r);
void fb_proc_rd_bytes(fb_proc_rd *r, void *out, size_t len);
void fb_proc_rd_str(fb_proc_rd *r, char *out, size_t cap);

/*
 * fb_proc_msg_type reads the type at the start of `body` (body_len bytes)
 * and leaves `r` on what follows. Errors: FB_EPROTO (shorter than a type).
 */
FB_MUST_CHECK fb_err fb_proc_msg_type(
    const uint8_t *body, size_t body_len, fb_proc_rd *r, uint32_t *type);

/* fb_proc_hello_unpack reads a HELLO's fields from `r` (after the type),
 * which must hold nothing else. Errors: FB_EPROTO. */
FB_MUST_CHECK fb_err fb_proc_hello_unpack(fb_proc_rd *r, fb_proc_hello *h);

/* fb_proc_eval_unpack reads an EVAL body (after its type) into *ev and
 * *task_id, and checks it: examples >= 1, a finite loss, an accuracy in
 * [0, 1] or NaN, at most FB_TRAIN_METRICS_MAX metrics with names of 1 to
 * 31 printable bytes, no two alike, and finite values. Errors: FB_EPROTO
 * (truncated or trailing bytes; *why says), FB_EINVAL (a value out of
 * range; *why names it). */
FB_MUST_CHECK fb_err fb_proc_eval_unpack(fb_proc_rd *r, uint64_t *task_id,
    fb_train_eval *ev, char *why, size_t why_len);

/* fb_proc_result_unpack reads a RESULT's fixed fields from `r` and leaves
 * out->layout on the layout. Errors: FB_EPROTO (truncated). */
FB_MUST_CHECK fb_err fb_proc_result_unpack(fb_proc_rd *r, fb_proc_result *out);

/* fb_proc_fail_unpack reads a FAIL: the task id, whether the trainer is
 * ending, and the reason (cut to cap - 1 bytes; control characters become
 * '?'). Errors: FB_EPROTO. */
FB_MUST_CHECK fb_err fb_proc_fail_unpack(
    fb_proc_rd *r, uint64_t *task_id, bool *fatal, char *reason, size_t cap);

/*
 * fb_proc_layout_check compares the layout in `r` (all of what is left)
 * with model `m`'s, tensor by tensor. On a difference it writes one
 * sentence naming the first tensor that differs (or what is missing or
 * extra) into `why` and returns FB_EPROTO; a malformed table is FB_EPROTO
 * too. Does not allocate.
 */
FB_MUST_CHECK fb_err fb_proc_layout_check(
    fb_proc_rd *r, const fb_model *m, char *why, size_t why_len);

/*
 * fb_proc_copy_checked copies `count` floats from `src` to `dst` and checks
 * each value as copied, so that what lands in `dst` is what was checked
 * even if `src` (shared memory) changes meanwhile. Returns the index of the
 * first NaN or infinity, or `count` when there is none (the copy is then
 * complete; after a bad value it stops). Large copies use non-temporal
 * stores, like memcpy.
 */
uint64_t fb_proc_copy_checked(float *dst, const float *src, uint64_t count);
/* fb_proc_copy_checked_base is the same for CPUs without AVX2 (SSE2, or
 * plain C); fb_proc_copy_checked picks one at run time. */
uint64_t fb_proc_copy_checked_base(
    float *dst, const float *src, uint64_t count);

/*
 * fb_proc_copy_threads says how many threads a copy of `count` floats
 * gets: `want` (0: half this host's CPUs, at most 8), fewer when slices would
 * be under 32 MiB, at least 1, at most 16.
 */
uint32_t fb_proc_copy_threads(uint64_t count, uint32_t want);

/*
 * fb_proc_copy_par copies `count` floats from `src` to `dst` on `threads`
 * threads (the caller's among them; blocks until all are done): a memcpy,
 * or with `checked` a fb_proc_copy_checked whose result it returns (the
 * first NaN or infinity of the whole vector, or count). Unchecked: count.
 */
uint64_t fb_proc_copy_par(float *dst, const float *src, uint64_t count,
    bool checked, uint32_t threads);

/* ---- the trainer's process (child.c) ---- */

typedef struct fb_proc_child fb_proc_child;

/*
 * fb_proc_child_alloc prepares to run `argv` (argv[0] looked up in PATH
 * now, so that a missing program is an error here) with the worker's
 * environment plus `env`, in `workdir` (NULL: ours). It makes the private
 * folder (mkdtemp, mode 0700) and a thread that forks the trainers, so
 * that their parent-death signal stays armed between rounds. Errors:
 * FB_EINVAL (program not found or not executable; logged), FB_EIO,
 * FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_proc_child_alloc(const char *const *argv, uint32_t argc,
    const char *const *env, uint32_t env_count, const char *workdir,
    fb_proc_child **out);

/* fb_proc_child_free kills any trainer (fb_proc_child_stop), ends the
 * fork thread, and removes the folder. NULL is a no-op. */
void fb_proc_child_free(fb_proc_child *c);

/*
 * fb_proc_child_start starts a trainer: a fresh socket in the folder and a
 * fresh one-time token, both given to the trainer in its environment
 * (FEDBOX_TRAINER_SOCKET, FEDBOX_TRAINER_TOKEN), then fork and exec in a
 * process group of its own. A trainer already running is killed first.
 * Errors: FB_EIO (logged).
 */
FB_MUST_CHECK fb_err fb_proc_child_start(fb_proc_child *c);

/*
 * fb_proc_child_stop ends the trainer: when grace_ms > 0, it sends
 * `first_sig` (0: none, just wait) to the trainer's process group and
 * waits up to grace_ms for its first process to end; then SIGKILL to the
 * group, and reaps it. Closes the listening socket. Blocks for at most
 * grace_ms plus the time killed processes take to exit.
 */
void fb_proc_child_stop(fb_proc_child *c, int first_sig, int64_t grace_ms);

/*
 * fb_proc_child_exited says whether the trainer's first process has ended
 * (without reaping it, so that its group id stays ours until stop), writing
 * "exited with status N" or "killed by signal S (NAME)" into `why`. False while
 * it runs or when none was started.
 */
bool fb_proc_child_exited(fb_proc_child *c, char *why, size_t why_len);

/* fb_proc_child_pid is the trainer's first process, or 0. */
pid_t fb_proc_child_pid(const fb_proc_child *c);

/* fb_proc_child_listen_fd is the listening socket, or -1 after a trainer
 * connected (it is closed then) or before a start. */
int fb_proc_child_listen_fd(const fb_proc_child *c);

/*
 * fb_proc_child_accept takes one pending connection and says whether it is
 * the trainer's: the peer's uid must be ours and its pid the trainer's
 * process or one of its descendants (SO_PEERCRED, /proc); then, within
 * `hello_ms`, it must send a HELLO with the current token. On success the
 * listening socket is closed and removed (nobody else can connect), the
 * token is spent, *fd is the connection (non-blocking) and *h its hello.
 * A refused peer is logged with its pid and why, and closed. Returns FB_OK,
 * FB_EAGAIN (nothing pending), FB_EAUTH (refused) or FB_EIO.
 */
FB_MUST_CHECK fb_err fb_proc_child_accept(
    fb_proc_child *c, int64_t hello_ms, int *fd, fb_proc_hello *h);

/* fb_proc_child_describe writes e.g. "python3 train.py". */
void fb_proc_child_describe(const fb_proc_child *c, char *buf, size_t len);

/* ---- socket I/O with deadlines (io.c) ---- */

/*
 * fb_proc_send writes all of `b` to non-blocking `fd`, and `fds` (n_fds,
 * at most 4) as SCM_RIGHTS with its first byte, until `deadline_ms`
 * (fb_now_ms clock). Errors: FB_ETIMEDOUT, FB_EIO (peer gone).
 */
FB_MUST_CHECK fb_err fb_proc_send(int fd, const fb_proc_buf *b, const int *fds,
    int n_fds, int64_t deadline_ms);

/*
 * fb_proc_recv reads one message from non-blocking `fd` into *body (grown
 * as needed, up to FB_PROC_MSG_MAX; the caller frees it with fb_free) and
 * *body_len. It waits in slices of at most 50 ms, and between them returns
 * FB_ECLOSED when *cancel (if given) is non-zero, and FB_EAGAIN when
 * `stop_cb` (if given) says so. Errors: FB_ETIMEDOUT (past deadline_ms),
 * FB_EIO (connection closed or failed), FB_EPROTO (length over the
 * limit), FB_ENOMEM. Bytes of a message cut off by a timeout are lost: the
 * caller then drops the connection.
 */
typedef bool (*fb_proc_stop_cb)(void *arg);
FB_MUST_CHECK fb_err fb_proc_recv(int fd, uint8_t **body, size_t *cap,
    size_t *body_len, int64_t deadline_ms, fb_proc_cancel *cancel,
    fb_proc_stop_cb stop_cb, void *stop_arg);

#endif
