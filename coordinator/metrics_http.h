/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_http.h -- the coordinator's Prometheus endpoint.
 *
 * The event loop tells this module what the federation is doing (round and
 * phase, accuracy and loss, bytes, workers by state, rejected messages,
 * round durations, each worker's speed, and in round.mode async the model
 * version, the updates applied and dropped and their staleness) through
 * the setters below; a
 * libmicrohttpd daemon on a thread of its own serves the values at
 * GET /metrics in Prometheus's text exposition format 0.0.4. This file is
 * the only user of libmicrohttpd.
 *
 * The setters take a mutex for a few field writes; a scrape copies the
 * values under the same mutex and formats the text without it, so a scrape
 * (or a flood of them) costs the loop thread no more than a lock of a copy.
 * The daemon serves at most FB_METRICS_MAX_CONNECTIONS connections at once,
 * each for at most FB_METRICS_TIMEOUT_S idle seconds, and reads no request
 * body. The endpoint is plain HTTP without authentication: bind it to
 * localhost or to a monitoring network.
 *
 * Label values (phases, worker states, reject reasons, round statuses,
 * worker names) are escaped as the format requires (backslash, double
 * quote, line feed) and cut at FB_METRICS_LABEL_MAX - 1 bytes. Each label
 * set holds at most FB_METRICS_MAX_LABELS distinct values.
 */
#ifndef FB_COORDINATOR_METRICS_HTTP_H
#define FB_COORDINATOR_METRICS_HTTP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

#define FB_METRICS_MAX_LABELS 32      /* distinct values per label set */
#define FB_METRICS_LABEL_MAX 64       /* bytes per label value, with NUL */
#define FB_METRICS_MAX_CONNECTIONS 16 /* concurrent HTTP connections */
#define FB_METRICS_TIMEOUT_S 10       /* idle seconds before a close */

typedef struct fb_metrics fb_metrics;

/*
 * fb_metrics_listen_check says whether `listen` has the form HOST:PORT
 * (HOST an IPv4 address, a name, or an IPv6 address in brackets; PORT 0 to
 * 65535, 0 for any free port). Syntax only: no name is resolved. Returns
 * FB_OK or FB_EINVAL. Thread-safe.
 */
FB_MUST_CHECK fb_err fb_metrics_listen_check(const char *listen);

/*
 * fb_metrics_alloc binds `listen` (HOST:PORT) and starts serving GET
 * /metrics from a thread of its own; per-worker series are kept for worker
 * slots 0 .. max_workers - 1. On FB_OK *out owns the daemon; free it with
 * fb_metrics_free. Does not block beyond the bind. Errors (logged with the
 * address): FB_EINVAL (not HOST:PORT, or max_workers is 0), FB_EIO (the
 * name does not resolve, the port is taken, or the daemon does not start),
 * FB_ENOMEM. *out is NULL on error.
 */
FB_MUST_CHECK fb_err fb_metrics_alloc(
    const char *listen, uint32_t max_workers, fb_metrics **out);

/* fb_metrics_free stops the daemon (waiting for a scrape in progress),
 * closes its socket and frees everything; NULL is a no-op. */
void fb_metrics_free(fb_metrics *m);

/* fb_metrics_port is the TCP port the endpoint listens on (the one the
 * kernel chose when `listen` asked for port 0). Thread-safe. */
uint16_t fb_metrics_port(const fb_metrics *m);

/*
 * The setters below are thread-safe (one mutex) and never block on the
 * network; they are meant for the coordinator's loop thread. Those that
 * return fb_err fail only with FB_EINVAL (an empty label value, a slot out
 * of range) or FB_ENOMEM (a label set already holds FB_METRICS_MAX_LABELS
 * values); the first such failure of each kind is logged, and the loop may
 * ignore the result: the other series stay right.
 */

/* fb_metrics_set_round sets the current round (1-based, 0 before the
 * first), the rounds planned and the phase the round is in, e.g.
 * "waiting", "training", "unmasking", "done". */
fb_err fb_metrics_set_round(
    fb_metrics *m, uint32_t round, uint32_t rounds, const char *phase);

/* fb_metrics_round_done counts a round that ended with `status` ("ok",
 * "failed", ...) and adds its wall time to the round-duration histogram. */
fb_err fb_metrics_round_done(fb_metrics *m, const char *status, double seconds);

/* fb_metrics_set_test sets the test-set accuracy (0 to 1) and loss of the
 * global model; NaN for either removes that series (not evaluated). */
void fb_metrics_set_test(fb_metrics *m, double accuracy, double loss);

/* fb_metrics_set_federated sets the workers' sample-weighted accuracy (0
 * to 1) and loss on their validation data (federated evaluation) of the
 * last round; NaN removes a series (not known). */
void fb_metrics_set_federated(fb_metrics *m, double accuracy, double loss);

/* fb_metrics_add_bytes adds to the byte counters: `up` received from the
 * workers, `down` sent to them. */
void fb_metrics_add_bytes(fb_metrics *m, uint64_t up, uint64_t down);

/* fb_metrics_set_workers sets how many workers are in `state` ("live",
 * "training", "done", "lost", ...). */
fb_err fb_metrics_set_workers(fb_metrics *m, const char *state, uint32_t count);

/* fb_metrics_add_rejected adds `count` to the messages rejected for
 * `reason` ("bad_mac", "replay", ...); count 0 makes the series appear. */
fb_err fb_metrics_add_rejected(
    fb_metrics *m, const char *reason, uint64_t count);

/*
 * fb_metrics_set_worker sets the training speed of the worker in `slot`
 * (< max_workers), named `name`, in its last round. A slot that gets a new
 * name starts new series. fb_metrics_add_worker_steps adds local steps the
 * worker reported (plain rounds only: secure aggregation keeps them
 * private); the slot must have a name. fb_metrics_forget_worker drops the
 * slot's series (the worker left); a free slot is a no-op.
 */
fb_err fb_metrics_set_worker(
    fb_metrics *m, uint32_t slot, const char *name, double steps_per_s);
fb_err fb_metrics_add_worker_steps(
    fb_metrics *m, uint32_t slot, uint64_t steps);
void fb_metrics_forget_worker(fb_metrics *m, uint32_t slot);

/*
 * round.mode async. fb_metrics_async_start makes the asynchronous series
 * appear, at zero (and the cohort series when `secure`: each buffer a
 * secure-aggregation cohort); until then none is shown.
 * fb_metrics_async_step adds one recorded server step, at once for a
 * scrape: `version`, the model version after it (server steps applied so
 * far); the staleness (server steps since the model it trained from) of
 * each of the n updates it applied, none when it failed; and the updates
 * dropped past round.max_staleness and the tasks superseded (their model
 * went before they fetched it) since the step before (secure async: the
 * members of the cohort applied). fb_metrics_cohort_failed counts a
 * secure cohort that failed (fewer inputs than its threshold: no step).
 */
void fb_metrics_async_start(fb_metrics *m, bool secure);
void fb_metrics_async_step(fb_metrics *m, uint32_t version,
    const uint32_t *staleness, uint32_t n, uint64_t dropped_stale,
    uint64_t superseded);
void fb_metrics_cohort_failed(fb_metrics *m);

#endif
