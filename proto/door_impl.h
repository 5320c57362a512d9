/* SPDX-License-Identifier: Apache-2.0 */
/*
 * door_impl.h -- the door of a ROUTER link (door.c), private to proto/:
 * link.c starts it on the socket it binds, tells it which descriptor each
 * received message came over, and which of them authenticated.
 */
#ifndef FB_PROTO_DOOR_IMPL_H
#define FB_PROTO_DOOR_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/proto.h"

typedef struct fb_door fb_door;

/*
 * fb_door_start watches `sock` (a ROUTER of context `ctx`, not yet bound:
 * call it before zmq_bind so that no connection is missed) per `o`, whose
 * max_pending is > 0; `max_msg` is the socket's ZMQ_MAXMSGSIZE. It raises
 * the soft RLIMIT_NOFILE (see fb_link_bind) and starts the door's thread.
 * Errors: FB_EINVAL (no descriptors left for connections, logged),
 * FB_ENOMEM, FB_EZMQ. The caller owns *out and stops it with
 * fb_door_stop before closing the socket.
 */
FB_MUST_CHECK fb_err fb_door_start(void *ctx, void *sock,
    const fb_door_opts *o, size_t max_msg, fb_door **out);

/* fb_door_stop stops watching `sock` and the thread, and frees `d`; NULL
 * is a no-op. Call it on the socket's thread. */
void fb_door_stop(fb_door *d, void *sock);

/*
 * fb_door_seen: the loop read a message that came over descriptor `fd`
 * (ZMQ_SRCFD). fb_door_trust: that connection, whose routing id hashes to
 * `rid` (never 0), authenticated; the first call for a connection costs
 * an fstat, later ones a compare. Both are lock-free, for the socket's
 * thread only; an fd out of the door's range is ignored.
 */
void fb_door_seen(fb_door *d, int fd);
void fb_door_trust(fb_door *d, int fd, uint64_t rid);

/* fb_door_closed_next pops the routing id hash (fb_door_trust's rid) of a
 * trusted connection that closed; false when none waits. Thread-safe; it
 * resets fb_door_closed_fd (an eventfd, readable while some wait) when the
 * queue is empty. */
bool fb_door_closed_next(fb_door *d, uint64_t *key);
int fb_door_closed_fd(const fb_door *d);

/* fb_door_stats copies the counters (thread-safe). */
void fb_door_stats_get(fb_door *d, fb_door_stats *out);

#endif
