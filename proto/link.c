/* SPDX-License-Identifier: Apache-2.0 */
/*
 * link.c -- the only user of libzmq.
 *
 * The coordinator's ROUTER refuses to queue for unknown peers
 * (ZMQ_ROUTER_MANDATORY), keeps per-peer queues short (HWM) so that memory
 * stays O(chunk) per peer, and caps message size (ZMQ_MAXMSGSIZE) so that an
 * oversized frame costs the sender its connection, not our memory. Every
 * send has a timeout; every receive waits at most what the caller says.
 * With a door (door.c) it also caps the connections that have not
 * authenticated yet: each received message's ZMQ_SRCFD tells the door
 * which connection it came over, and fb_link_peer_trust which of them
 * authenticated.
 *
 * A worker's DEALER watches its own connection (a socket monitor read in
 * fb_link_wait), so that the program learns at once when it comes up or
 * goes, and queues messages only on a connection that is up
 * (ZMQ_IMMEDIATE). Liveness on both sides can count bytes the kernel moved
 * (TCP_INFO of ZeroMQ's descriptor), not whole messages: a 1 MiB frame on
 * a slow link arrives over many seconds, its bytes all along.
 */
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include "common/log.h"
#include "common/util.h"
#include "proto/door_impl.h"
#include "proto/proto.h"

struct fb_link {
	void *ctx;
	void *sock;
	bool router;
	fb_link_opts opts;
	zmq_msg_t payload; /* last received payload frame */
	bool payload_live;
	zmq_msg_t head; /* last received sealed frame 0 */
	bool head_live;
	uint64_t sent;
	uint64_t received;
	uint32_t lanes;
	uint32_t lane_port[FB_LANES_MAX];
	fb_door *door;      /* ROUTER with limits before authentication */
	int last_fd;        /* descriptor of the last received message */
	fb_peer last_peer;  /* and its sender */
	/* DEALER: its connection, from the socket monitor */
	void *mon;          /* PAIR reading the monitor's events */
	bool conn_up;       /* ZMTP handshake done, not disconnected since */
	uint32_t conn_gen;  /* connections that came up */
	int conn_fd;        /* the TCP connection's descriptor, or -1 */
	uint64_t conn_ino;
	int tcp_fd;         /* connected, handshake not yet done */
};

#define ZMQ_TRY(call, rc, label)                                           \
	do {                                                               \
		if ((call) != 0) {                                         \
			fb_log_error("%s: %s", #call, zmq_strerror(errno)); \
			(rc) = FB_EZMQ;                                    \
			goto label;                                        \
		}                                                          \
	} while (0)

bool
fb_peer_equal(const fb_peer *a, const fb_peer *b)
{
	return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

uint32_t
fb_upload_chunk(uint32_t first_chunk, uint32_t chunk_count, uint32_t pos)
{
	return pos < chunk_count
	    ? (uint32_t)(((uint64_t)first_chunk + pos) % chunk_count)
	    : pos;
}

fb_err
fb_endpoint_port(const char *endpoint, uint32_t port, char *out, size_t cap,
    uint32_t *base_port)
{
	const char *colon, *p;
	uint32_t base = 0;
	int n;

	if (strncmp(endpoint, "tcp://", 6) != 0 ||
	    (colon = strrchr(endpoint + 6, ':')) == NULL ||
	    colon == endpoint + 6 || port > 65535) {
		return FB_EINVAL;
	}
	p = colon + 1;
	if (strcmp(p, "*") != 0) {
		if (*p == '\0') {
			return FB_EINVAL;
		}
		for (; *p != '\0'; p++) {
			if (*p < '0' || *p > '9' || base > 65535) {
				return FB_EINVAL;
			}
			base = base * 10 + (uint32_t)(*p - '0');
		}
		if (base > 65535) {
			return FB_EINVAL;
		}
	}
	if (port == 0) {
		n = snprintf(out, cap, "%.*s:*", (int)(colon - endpoint),
		    endpoint);
	} else {
		n = snprintf(out, cap, "%.*s:%u", (int)(colon - endpoint),
		    endpoint, (unsigned)port);
	}
	if (n < 0 || (size_t)n >= cap) {
		return FB_ERANGE;
	}
	if (base_port != NULL) {
		*base_port = base;
	}
	return FB_OK;
}

/* The port a ROUTER's last bind took (ZMQ_LAST_ENDPOINT), 0 if unknown. */
static uint32_t
last_port(void *sock)
{
	char ep[256], scratch[256];
	size_t len = sizeof(ep);
	uint32_t port = 0;

	if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &len) != 0 ||
	    len == 0) {
		return 0;
	}
	ep[sizeof(ep) - 1] = '\0';
	if (fb_endpoint_port(ep, 1, scratch, sizeof(scratch), &port) != FB_OK) {
		return 0;
	}
	return port;
}

/*
 * Binds lanes: lane i on endpoint's port + i, with the affinity of the
 * I/O threads j = i, i + L, i + 2L, ... The affinity is taken by each
 * listener when it binds and given to the connections it accepts.
 */
static fb_err
bind_lanes(fb_link *l, const char *endpoint, uint32_t lanes, int threads)
{
	uint32_t base = 0;
	char ep[512];

	if (fb_endpoint_port(endpoint, 0, ep, sizeof(ep), &base) != FB_OK) {
		fb_log_error("cannot listen on %s: lanes need a tcp://HOST:PORT "
		             "endpoint", endpoint);
		return FB_EINVAL;
	}
	if (base != 0 && base + lanes - 1 > 65535) {
		fb_log_error("cannot listen on %s: its %u lanes would go past "
		             "port 65535", endpoint, lanes);
		return FB_EINVAL;
	}
	for (uint32_t i = 0; i < lanes; i++) {
		uint64_t aff = 0;
		for (int j = (int)i; j < threads && j < 64; j += (int)lanes) {
			aff |= 1ULL << j;
		}
		if (fb_endpoint_port(endpoint, base == 0 ? 0 : base + i, ep,
		        sizeof(ep), NULL) != FB_OK) {
			return FB_EINVAL;
		}
		if (zmq_setsockopt(l->sock, ZMQ_AFFINITY, &aff, sizeof(aff)) !=
		    0) {
			fb_log_error("zmq_setsockopt(ZMQ_AFFINITY): %s",
			    zmq_strerror(errno));
			return FB_EZMQ;
		}
		if (zmq_bind(l->sock, ep) != 0) {
			fb_log_error("cannot listen on %s (lane %u of %u): %s", ep,
			    i, lanes, zmq_strerror(errno));
			return FB_EZMQ;
		}
		l->lane_port[i] = last_port(l->sock);
	}
	l->lanes = lanes;
	return FB_OK;
}

uint32_t
fb_link_lanes(const fb_link *l)
{
	return l->lanes;
}

uint32_t
fb_link_lane_port(const fb_link *l, uint32_t lane)
{
	return lane < l->lanes ? l->lane_port[lane] : 0;
}

/*
 * The door's socket options, then the door itself (before any bind, so
 * that it sees every connection): the ZMTP greeting gets the handshake's
 * time too, and TCP keepalive finds authenticated peers whose host died
 * (60 s idle, then 3 probes 10 s apart).
 */
static fb_err
door_open(fb_link *l, size_t maxmsg)
{
	fb_err rc = FB_OK;
	const fb_door_opts *o = &l->opts.door;
	int ivl = o->handshake_ms > INT32_MAX ? INT32_MAX : (int)o->handshake_ms;
	int one = 1, idle = 60, intvl = 10, cnt = 3;

	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_HANDSHAKE_IVL, &ivl, sizeof(ivl)),
	    rc, out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_TCP_KEEPALIVE, &one, sizeof(one)),
	    rc, out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_TCP_KEEPALIVE_IDLE, &idle,
	            sizeof(idle)), rc, out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_TCP_KEEPALIVE_INTVL, &intvl,
	            sizeof(intvl)), rc, out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_TCP_KEEPALIVE_CNT, &cnt,
	            sizeof(cnt)), rc, out);
	rc = fb_door_start(l->ctx, l->sock, o, maxmsg, &l->door);
out:
	return rc;
}

/*
 * DEALER: watches the socket's own connection, from before it connects
 * (an inproc PAIR per link, read in fb_link_wait).
 */
static fb_err
monitor_open(fb_link *l)
{
	char ep[64];
	int events = ZMQ_EVENT_CONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
	    ZMQ_EVENT_DISCONNECTED;

	snprintf(ep, sizeof(ep), "inproc://fb-link-%p", (void *)l);
	if (zmq_socket_monitor(l->sock, ep, events) != 0) {
		fb_log_error("zmq_socket_monitor: %s", zmq_strerror(errno));
		return FB_EZMQ;
	}
	if ((l->mon = zmq_socket(l->ctx, ZMQ_PAIR)) == NULL ||
	    zmq_connect(l->mon, ep) != 0) {
		fb_log_error("link monitor: %s", zmq_strerror(errno));
		(void)zmq_socket_monitor(l->sock, NULL, 0);
		if (l->mon != NULL) {
			zmq_close(l->mon);
			l->mon = NULL;
		}
		return FB_EZMQ;
	}
	return FB_OK;
}

/* The inode of socket descriptor fd, 0 if it is none. */
static uint64_t
sock_ino(int fd)
{
	struct stat sb;
	return fd >= 0 && fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode)
	    ? (uint64_t)sb.st_ino
	    : 0;
}

/* Takes the monitor's waiting events; true if the connection changed. */
static bool
monitor_drain(fb_link *l)
{
	bool changed = false;

	for (int n = 0; n < 64; n++) {
		zmq_msg_t ev, ep;
		uint16_t what = 0;
		uint32_t value = 0;

		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, l->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			break;
		}
		zmq_msg_init(&ep);
		if (zmq_msg_more(&ev)) {
			(void)zmq_msg_recv(&ep, l->mon, ZMQ_DONTWAIT);
		}
		if (zmq_msg_size(&ev) >= 6) {
			memcpy(&what, zmq_msg_data(&ev), 2);
			memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
		}
		zmq_msg_close(&ep);
		zmq_msg_close(&ev);
		if (what == ZMQ_EVENT_CONNECTED) {
			l->tcp_fd = (int)value;
		} else if (what == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
			l->conn_up = true;
			l->conn_gen++;
			l->conn_fd = l->tcp_fd;
			l->conn_ino = sock_ino(l->conn_fd);
			changed = true;
		} else if (what == ZMQ_EVENT_DISCONNECTED) {
			changed = changed || l->conn_up;
			l->conn_up = false;
			l->conn_fd = -1;
			l->conn_ino = 0;
			l->tcp_fd = -1;
		}
	}
	return changed;
}

bool
fb_link_conn_up(const fb_link *l)
{
	return l->conn_up;
}

uint32_t
fb_link_conn_gen(const fb_link *l)
{
	return l->conn_gen;
}

/* TCP_INFO's byte counters of descriptor fd, if it is still socket ino. */
static fb_err
fd_traffic(int fd, uint64_t ino, fb_traffic *t)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	memset(t, 0, sizeof(*t));
	if (fd < 0 || ino == 0 || sock_ino(fd) != ino) {
		return FB_ECLOSED;
	}
	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
	    len < offsetof(struct tcp_info, tcpi_bytes_received) +
	            sizeof(ti.tcpi_bytes_received)) {
		return FB_ENOTSUP;
	}
	t->in = ti.tcpi_bytes_received;
	t->acked = ti.tcpi_bytes_acked;
	return FB_OK;
}

fb_err
fb_link_traffic(const fb_link *l, fb_traffic *t)
{
	if (!l->conn_up) {
		memset(t, 0, sizeof(*t));
		return FB_ECLOSED;
	}
	return fd_traffic(l->conn_fd, l->conn_ino, t);
}

void
fb_link_last_conn(fb_link *l, fb_conn *c)
{
	if (l->last_fd < 0) {
		c->fd = -1;
		c->ino = 0;
		return;
	}
	if (c->fd == l->last_fd && c->ino != 0) {
		return;
	}
	c->fd = l->last_fd;
	c->ino = sock_ino(l->last_fd);
}

fb_err
fb_link_conn_traffic(const fb_conn *c, fb_traffic *t)
{
	return fd_traffic(c->fd, c->ino, t);
}

uint64_t
fb_peer_key(const fb_peer *p)
{
	uint64_t h = 14695981039346656037ULL; /* FNV-1a of the routing id */

	for (uint8_t i = 0; i < p->len; i++) {
		h = (h ^ p->id[i]) * 1099511628211ULL;
	}
	return h == 0 ? 1 : h;
}

bool
fb_link_closed_next(fb_link *l, uint64_t *key)
{
	return l->door != NULL && fb_door_closed_next(l->door, key);
}

int
fb_link_closed_fd(const fb_link *l)
{
	return l->door != NULL ? fb_door_closed_fd(l->door) : -1;
}

static fb_err
link_open(const char *endpoint, const fb_link_opts *opts, bool router,
    fb_link **out)
{
	fb_err rc = FB_OK;
	fb_link *l = NULL;
	int zero = 0, one = 1, hwm = opts->hwm < 2 ? 2 : opts->hwm;
	int send_hwm = opts->send_hwm > 0 ? opts->send_hwm : hwm;
	int64_t maxmsg = (int64_t)opts->max_payload + FB_MAX_CONTROL_LEN;
	/* 0: sends never wait (a full peer queue is FB_EAGAIN at once) */
	int sndtimeo = opts->send_timeout_ms > 0 ? opts->send_timeout_ms : 0;

	*out = NULL;
	if ((l = calloc(1, sizeof(*l))) == NULL) {
		return FB_ENOMEM;
	}
	l->router = router;
	l->opts = *opts;
	l->last_fd = -1;
	l->conn_fd = -1;
	l->tcp_fd = -1;
	if ((l->ctx = zmq_ctx_new()) == NULL) {
		fb_log_error("zmq_ctx_new: %s", zmq_strerror(errno));
		rc = FB_EZMQ;
		goto out;
	}
	if (opts->io_threads > 0) {
		/* before the first socket: the context starts them there */
		ZMQ_TRY(zmq_ctx_set(l->ctx, ZMQ_IO_THREADS, opts->io_threads),
		    rc, out);
	}
	l->sock = zmq_socket(l->ctx, router ? ZMQ_ROUTER : ZMQ_DEALER);
	if (l->sock == NULL) {
		fb_log_error("zmq_socket: %s", zmq_strerror(errno));
		rc = FB_EZMQ;
		goto out;
	}
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_LINGER, &zero, sizeof(zero)), rc,
	    out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_SNDHWM, &send_hwm,
	            sizeof(send_hwm)), rc,
	    out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm)), rc,
	    out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_SNDTIMEO, &sndtimeo,
	            sizeof(sndtimeo)),
	    rc, out);
	ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_MAXMSGSIZE, &maxmsg,
	            sizeof(maxmsg)),
	    rc, out);
	if (router) {
		ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_ROUTER_MANDATORY, &one,
		            sizeof(one)),
		    rc, out);
		if (opts->door.max_pending > 0 &&
		    (rc = door_open(l, (size_t)maxmsg)) != FB_OK) {
			goto out;
		}
		if (opts->lanes >= 2) {
			if (opts->lanes > FB_LANES_MAX ||
			    opts->lanes > opts->io_threads) {
				fb_log_error("cannot listen on %s: %d lanes need as "
				             "many I/O threads (%d)", endpoint,
				    opts->lanes, opts->io_threads);
				rc = FB_EINVAL;
				goto out;
			}
			if ((rc = bind_lanes(l, endpoint, (uint32_t)opts->lanes,
			         opts->io_threads)) != FB_OK) {
				goto out;
			}
		} else if (zmq_bind(l->sock, endpoint) != 0) {
			fb_log_error("cannot listen on %s: %s", endpoint,
			    zmq_strerror(errno));
			rc = FB_EZMQ;
			goto out;
		} else {
			l->lanes = 1;
			l->lane_port[0] = last_port(l->sock);
		}
	} else {
		/* ZeroMQ adds up to ivl of jitter to each interval */
		int ivl = 250, ivl_max = 4000;
		ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_RECONNECT_IVL, &ivl,
		            sizeof(ivl)),
		    rc, out);
		ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_RECONNECT_IVL_MAX,
		            &ivl_max, sizeof(ivl_max)),
		    rc, out);
		if (!opts->queue_unconnected) {
			ZMQ_TRY(zmq_setsockopt(l->sock, ZMQ_IMMEDIATE, &one,
			            sizeof(one)), rc, out);
		}
		if ((rc = monitor_open(l)) != FB_OK) {
			goto out;
		}
		if (zmq_connect(l->sock, endpoint) != 0) {
			fb_log_error("cannot connect to %s: %s", endpoint,
			    zmq_strerror(errno));
			rc = FB_EZMQ;
			goto out;
		}
	}
	*out = l;
	l = NULL;
out:
	fb_link_close(l);
	return rc;
}

fb_err
fb_link_bind(const char *endpoint, const fb_link_opts *opts, fb_link **out)
{
	return link_open(endpoint, opts, true, out);
}

fb_err
fb_link_connect(const char *endpoint, const fb_link_opts *opts, fb_link **out)
{
	return link_open(endpoint, opts, false, out);
}

void
fb_link_close(fb_link *l)
{
	if (l == NULL) {
		return;
	}
	if (l->payload_live) {
		zmq_msg_close(&l->payload);
	}
	if (l->head_live) {
		zmq_msg_close(&l->head);
	}
	fb_door_stop(l->door, l->sock);
	if (l->mon != NULL) {
		/* the monitor first: its writer is an I/O thread */
		(void)zmq_socket_monitor(l->sock, NULL, 0);
		zmq_close(l->mon);
	}
	if (l->sock != NULL) {
		zmq_close(l->sock);
	}
	if (l->ctx != NULL) {
		zmq_ctx_term(l->ctx);
	}
	free(l);
}

static fb_err
send_errno(int err)
{
	switch (err) {
	case EAGAIN:
		return FB_EAGAIN;
	case EHOSTUNREACH:
		return FB_ECLOSED;
	case EINTR:
		return FB_ECLOSED;
	default:
		fb_log_error("zmq_send: %s", zmq_strerror(err));
		return FB_EZMQ;
	}
}

/*
 * The generations of one owner's memory: fb_lent_own starts a new one
 * while messages still hold the old. While an older generation is held,
 * sends from the line copy (see fb_link_send_raw_from), so a peer that
 * stops reading pins at most one old copy, not one per round.
 */
typedef struct lent_line {
	atomic_size_t members;  /* generations not yet freed */
	atomic_size_t held_old; /* replaced generations still held */
} lent_line;

/*
 * libzmq is not built with ThreadSanitizer, so its hand-over of a message
 * to its I/O thread (through its pipes) is invisible to it, and the free
 * function's first touch of a buffer just allocated and sent looks like a
 * race. In a SAN=thread build these two say what libzmq does: everything
 * before the send happens before the free function. Nothing otherwise.
 */
#if defined(__SANITIZE_THREAD__)
#define FB_LINK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FB_LINK_TSAN 1
#endif
#endif
#ifdef FB_LINK_TSAN
#include <sanitizer/tsan_interface.h>
#define LENT_HANDED(b) __tsan_release(b)
#define LENT_TAKEN(b) __tsan_acquire(b)
#else
#define LENT_HANDED(b) ((void)(b))
#define LENT_TAKEN(b) ((void)(b))
#endif

struct fb_lent {
	atomic_size_t refs; /* the owner's, plus one per message in flight */
	void *data;
	lent_line *line;
	bool replaced;      /* counted in line->held_old until freed */
	atomic_int notify_fd; /* eventfd written when it turns idle, or -1 */
};

static fb_err
lent_alloc(size_t len, lent_line *line, fb_lent **out)
{
	fb_lent *b;

	*out = NULL;
	if ((b = malloc(sizeof(*b))) == NULL) {
		return FB_ENOMEM;
	}
	if ((b->data = fb_alloc(len)) == NULL) {
		free(b);
		return FB_ENOMEM;
	}
	if (line == NULL) {
		if ((line = malloc(sizeof(*line))) == NULL) {
			fb_free(b->data);
			free(b);
			return FB_ENOMEM;
		}
		atomic_init(&line->members, 0);
		atomic_init(&line->held_old, 0);
	}
	atomic_fetch_add_explicit(&line->members, 1, memory_order_relaxed);
	atomic_init(&b->refs, 1);
	b->line = line;
	b->replaced = false;
	atomic_init(&b->notify_fd, -1);
	*out = b;
	return FB_OK;
}

fb_err
fb_lent_new(size_t len, fb_lent **out)
{
	return lent_alloc(len, NULL, out);
}

void *
fb_lent_data(fb_lent *b)
{
	return b->data;
}

bool
fb_lent_idle(const fb_lent *b)
{
	return atomic_load_explicit(&b->refs, memory_order_acquire) == 1;
}

bool
fb_lent_lendable(const fb_lent *b)
{
	return atomic_load_explicit(&b->line->held_old, memory_order_acquire) ==
	    0;
}

static void
lent_unref(fb_lent *b)
{
	lent_line *line;
	/* read before the release: once it is out, another holder may free b */
	int fd = atomic_load_explicit(&b->notify_fd, memory_order_relaxed);
	size_t was = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel);

	if (was == 2 && fd >= 0) {
		/* idle now (or the owner's own reference went first, a wake
		 * for nothing): the owner's loop looks at its buffers */
		uint64_t one = 1;
		if (write(fd, &one, sizeof(one)) != sizeof(one) &&
		    errno != EAGAIN) {
			fb_log_error("lent eventfd: %s", strerror(errno));
		}
	}
	if (was != 1) {
		return;
	}
	line = b->line;
	if (b->replaced) {
		atomic_fetch_sub_explicit(&line->held_old, 1,
		    memory_order_acq_rel);
	}
	fb_free(b->data);
	free(b);
	if (atomic_fetch_sub_explicit(&line->members, 1, memory_order_acq_rel) ==
	    1) {
		free(line);
	}
}

void
fb_lent_free(fb_lent *b)
{
	if (b != NULL) {
		lent_unref(b);
	}
}

void
fb_lent_notify(fb_lent *b, int fd)
{
	atomic_store_explicit(&b->notify_fd, fd, memory_order_relaxed);
}

void
fb_lent_ref(fb_lent *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

fb_err
fb_lent_own(fb_lent **b, size_t len, bool keep)
{
	fb_lent *fresh;
	fb_err rc;

	if (fb_lent_idle(*b)) {
		return FB_OK;
	}
	if ((rc = lent_alloc(len, (*b)->line, &fresh)) != FB_OK) {
		return rc;
	}
	if (keep) {
		memcpy(fresh->data, (*b)->data, len);
	}
	atomic_store_explicit(&fresh->notify_fd,
	    atomic_load_explicit(&(*b)->notify_fd, memory_order_relaxed),
	    memory_order_relaxed);
	/* Counted before the owner's reference goes, so the release that
	 * frees it (here or on ZeroMQ's I/O thread) finds it counted. */
	atomic_fetch_add_explicit(&(*b)->line->held_old, 1,
	    memory_order_acq_rel);
	(*b)->replaced = true;
	lent_unref(*b);
	*b = fresh;
	return FB_OK;
}

/* ZeroMQ's free function: the message is out (or dropped). */
static void
lent_release(void *data, void *hint)
{
	(void)data;
	LENT_TAKEN(hint);
	lent_unref(hint);
}

fb_err
fb_link_send_raw_from(fb_link *l, const fb_peer *peer, const uint8_t *head,
    size_t head_len, const void *payload, size_t payload_len,
    fb_lent *origin)
{
	bool with_payload = payload != NULL;
	zmq_msg_t part;

	if (l->router != (peer != NULL)) {
		return FB_EINVAL;
	}
	if (with_payload && payload_len > l->opts.max_payload) {
		return FB_EINVAL;
	}
	if (peer != NULL &&
	    zmq_send(l->sock, peer->id, peer->len, ZMQ_SNDMORE) < 0) {
		return send_errno(errno);
	}
	if (zmq_send(l->sock, head, head_len, with_payload ? ZMQ_SNDMORE : 0) <
	    0) {
		return send_errno(errno);
	}
	if (with_payload && origin != NULL && payload_len > 0 &&
	    fb_lent_lendable(origin)) {
		/* Without a copy: the message holds a reference to origin. */
		atomic_fetch_add_explicit(&origin->refs, 1,
		    memory_order_relaxed);
		LENT_HANDED(origin);
		if (zmq_msg_init_data(&part, (void *)(uintptr_t)payload,
		        payload_len, lent_release, origin) != 0) {
			lent_unref(origin);
			return FB_ENOMEM;
		}
		if (zmq_msg_send(&part, l->sock, 0) < 0) {
			int err = errno;
			zmq_msg_close(&part); /* drops the reference */
			return send_errno(err);
		}
	} else if (with_payload &&
	    zmq_send(l->sock, payload, payload_len, 0) < 0) {
		return send_errno(errno);
	}
	l->sent += head_len + (with_payload ? payload_len : 0);
	return FB_OK;
}

fb_err
fb_link_send_raw(fb_link *l, const fb_peer *peer, const uint8_t *head,
    size_t head_len, const void *payload, size_t payload_len)
{
	return fb_link_send_raw_from(l, peer, head, head_len, payload,
	    payload_len, NULL);
}

fb_err
fb_link_send_from(fb_link *l, const fb_peer *peer, const fb_msg *m,
    const void *payload, size_t payload_len, fb_lent *origin)
{
	fb_err rc;
	uint8_t buf[FB_MAX_CONTROL_LEN];
	size_t len = 0;
	bool with_payload = fb_msg_has_payload(m->type);

	if ((rc = fb_msg_pack(m, buf, sizeof(buf), &len)) != FB_OK) {
		return rc;
	}
	return fb_link_send_raw_from(l, peer, buf, len,
	    with_payload ? (payload != NULL ? payload : "") : NULL,
	    with_payload ? payload_len : 0, payload != NULL ? origin : NULL);
}

fb_err
fb_link_send(fb_link *l, const fb_peer *peer, const fb_msg *m,
    const void *payload, size_t payload_len)
{
	return fb_link_send_from(l, peer, m, payload, payload_len, NULL);
}

/* Reads and discards the rest of a multipart message. */
static size_t
drain(void *sock)
{
	size_t n = 0;
	int more = 1;
	size_t sz = sizeof(more);
	zmq_msg_t part;

	while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
		zmq_msg_init(&part);
		if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&part);
			break;
		}
		n += zmq_msg_size(&part);
		zmq_msg_close(&part);
	}
	return n;
}

static bool
has_more(void *sock)
{
	int more = 0;
	size_t sz = sizeof(more);
	return zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more;
}

/*
 * link_wait polls the socket (and wake_fd) up to timeout_ms: FB_OK when a
 * message is waiting, FB_ETIMEDOUT otherwise (*woke set if wake_fd fired).
 */
static fb_err
link_wait(fb_link *l, int timeout_ms, int wake_fd, bool *woke)
{
	zmq_pollitem_t items[2] = {
	    {l->sock, 0, ZMQ_POLLIN, 0},
	    {NULL, wake_fd, ZMQ_POLLIN, 0},
	};
	int n = zmq_poll(items, wake_fd >= 0 ? 2 : 1, timeout_ms);

	if (n < 0) {
		if (errno == EINTR) {
			return FB_ETIMEDOUT;
		}
		fb_log_error("zmq_poll: %s", zmq_strerror(errno));
		return FB_EZMQ;
	}
	if (wake_fd >= 0 && (items[1].revents & ZMQ_POLLIN) && woke != NULL) {
		*woke = true;
	}
	return (items[0].revents & ZMQ_POLLIN) ? FB_OK : FB_ETIMEDOUT;
}

fb_err
fb_link_wait(fb_link *l, int timeout_ms, int wake_fd, unsigned want,
    unsigned *ready)
{
	zmq_pollitem_t items[3] = {
	    {l->sock, 0, 0, 0},
	    {NULL, wake_fd, ZMQ_POLLIN, 0},
	    {l->mon, 0, ZMQ_POLLIN, 0},
	};
	bool wake = wake_fd >= 0 && (want & FB_LINK_WAKE);
	int n, mon_at = wake ? 2 : 1;

	*ready = 0;
	items[0].events = (short)(((want & FB_LINK_IN) ? ZMQ_POLLIN : 0) |
	    ((want & FB_LINK_OUT) ? ZMQ_POLLOUT : 0));
	if (!wake) {
		items[1] = items[2];
	}
	if (l->mon != NULL && monitor_drain(l)) {
		/* a change seen since the last wait: say it without waiting */
		timeout_ms = 0;
		*ready |= FB_LINK_CONN;
	}
	n = zmq_poll(items, l->mon != NULL ? mon_at + 1 : mon_at, timeout_ms);
	if (n < 0) {
		if (errno == EINTR) {
			return FB_OK;
		}
		fb_log_error("zmq_poll: %s", zmq_strerror(errno));
		return FB_EZMQ;
	}
	if (l->mon != NULL && (items[mon_at].revents & ZMQ_POLLIN) &&
	    monitor_drain(l)) {
		*ready |= FB_LINK_CONN;
	}
	if (items[0].revents & ZMQ_POLLIN) {
		*ready |= FB_LINK_IN;
	}
	if (items[0].revents & ZMQ_POLLOUT) {
		*ready |= FB_LINK_OUT;
	}
	if (wake && (items[1].revents & ZMQ_POLLIN)) {
		*ready |= FB_LINK_WAKE;
	}
	return FB_OK;
}

/* A payload frame taken out of the link: the ZeroMQ message itself, so
 * the bytes are never copied. */
struct fb_buf {
	zmq_msg_t msg;
};

fb_err
fb_link_take_payload(fb_link *l, fb_buf **out)
{
	fb_buf *b;

	*out = NULL;
	if (!l->payload_live) {
		return FB_EINVAL;
	}
	if ((b = malloc(sizeof(*b))) == NULL) {
		return FB_ENOMEM;
	}
	zmq_msg_init(&b->msg);
	zmq_msg_move(&b->msg, &l->payload);
	zmq_msg_close(&l->payload);
	l->payload_live = false;
	*out = b;
	return FB_OK;
}

fb_err
fb_buf_alloc(size_t len, fb_buf **out)
{
	fb_buf *b;

	*out = NULL;
	if ((b = malloc(sizeof(*b))) == NULL) {
		return FB_ENOMEM;
	}
	if (zmq_msg_init_size(&b->msg, len) != 0) {
		free(b);
		return FB_ENOMEM;
	}
	*out = b;
	return FB_OK;
}

uint8_t *
fb_buf_data(fb_buf *b)
{
	return zmq_msg_data(&b->msg);
}

size_t
fb_buf_len(const fb_buf *b)
{
	return zmq_msg_size(&b->msg);
}

void
fb_buf_free(fb_buf *b)
{
	if (b != NULL) {
		zmq_msg_close(&b->msg);
		free(b);
	}
}

fb_err
fb_link_recv(fb_link *l, int timeout_ms, int wake_fd, bool *woke, fb_frame *f,
    const char **why)
{
	fb_err rc = FB_OK;
	zmq_msg_t part;
	bool part_live = false;

	const char *ignored;

	if (why == NULL) {
		why = &ignored;
	}
	memset(f, 0, sizeof(*f));
	if (woke != NULL) {
		*woke = false;
	}
	if (l->payload_live) {
		zmq_msg_close(&l->payload);
		l->payload_live = false;
	}
	if (l->head_live) {
		zmq_msg_close(&l->head);
		l->head_live = false;
	}
	zmq_msg_init(&part);
	part_live = true;
	if (l->router) {
		/* A busy coordinator finds the next message already queued:
		 * take it without a zmq_poll (a system call and a socket scan
		 * per message); poll only when the queue is empty. */
		if (zmq_msg_recv(&part, l->sock, ZMQ_DONTWAIT) < 0) {
			if (errno != EAGAIN && errno != EINTR) {
				rc = FB_EZMQ;
				goto out;
			}
			if ((rc = link_wait(l, timeout_ms, wake_fd, woke)) !=
			    FB_OK) {
				goto out;
			}
			if (zmq_msg_recv(&part, l->sock, ZMQ_DONTWAIT) < 0) {
				rc = errno == EAGAIN || errno == EINTR
				    ? FB_ETIMEDOUT
				    : FB_EZMQ;
				goto out;
			}
		}
		f->wire_len += zmq_msg_size(&part);
		l->last_fd = -1;
		l->last_peer.len = 0;
		if (zmq_msg_size(&part) > FB_PEER_ID_MAX || !has_more(l->sock)) {
			*why = "bad routing frame";
			rc = FB_EPROTO;
			goto out;
		}
		f->peer.len = (uint8_t)zmq_msg_size(&part);
		memcpy(f->peer.id, zmq_msg_data(&part), f->peer.len);
		l->last_peer = f->peer;
		zmq_msg_close(&part);
		zmq_msg_init(&part);
	} else if ((rc = link_wait(l, timeout_ms, wake_fd, woke)) != FB_OK) {
		goto out;
	}
	if (zmq_msg_recv(&part, l->sock, ZMQ_DONTWAIT) < 0) {
		rc = errno == EAGAIN || errno == EINTR ? FB_ETIMEDOUT : FB_EZMQ;
		goto out;
	}
	f->wire_len += zmq_msg_size(&part);
	if (l->router) {
		/* The connection it came over (the routing id frame, made by
		 * the ROUTER, carries none). */
		l->last_fd = zmq_msg_get(&part, ZMQ_SRCFD);
		if (l->door != NULL) {
			fb_door_seen(l->door, l->last_fd);
		}
	}
	{
		const uint8_t *h = zmq_msg_data(&part);
		size_t hl = zmq_msg_size(&part);
		bool want_payload;

		if (hl >= FB_WIRE_PREFIX_LEN && h[0] == 'F' && h[1] == 'B' &&
		    h[2] == 1 && (h[3] & FB_WIRE_SEALED) &&
		    !(h[3] & ~(FB_WIRE_SEALED | FB_WIRE_PAYLOAD))) {
			if (hl > FB_MAX_CONTROL_LEN + 128) {
				*why = "sealed frame too long";
				rc = FB_EPROTO;
				goto out;
			}
			/* Keep frame 0: the caller opens it in place. */
			zmq_msg_init(&l->head);
			zmq_msg_move(&l->head, &part);
			l->head_live = true;
			f->sealed = true;
			f->sealed_data = (uint8_t *)zmq_msg_data(&l->head) +
			    FB_WIRE_PREFIX_LEN;
			f->sealed_len = hl - FB_WIRE_PREFIX_LEN;
			want_payload = (h[3] & FB_WIRE_PAYLOAD) != 0;
		} else {
			rc = fb_msg_unpack(h, hl, &f->msg, why);
			if (rc != FB_OK) {
				goto out;
			}
			want_payload = fb_msg_has_payload(f->msg.type);
		}
		if (want_payload) {
			if (!has_more(l->sock)) {
				*why = "payload frame missing";
				rc = FB_EPROTO;
				goto out;
			}
			zmq_msg_init(&l->payload);
			if (zmq_msg_recv(&l->payload, l->sock, ZMQ_DONTWAIT) <
			    0) {
				zmq_msg_close(&l->payload);
				*why = "payload frame missing";
				rc = FB_EPROTO;
				goto out;
			}
			l->payload_live = true;
			f->payload = zmq_msg_data(&l->payload);
			f->payload_len = zmq_msg_size(&l->payload);
			f->wire_len += f->payload_len;
			if (f->payload_len > l->opts.max_payload) {
				*why = "payload frame too long";
				rc = FB_EPROTO;
				goto out;
			}
		}
	}
	if (has_more(l->sock)) {
		*why = "unexpected extra frames";
		rc = FB_EPROTO;
		goto out;
	}
out:
	if (part_live) {
		zmq_msg_close(&part);
	}
	f->wire_len += drain(l->sock);
	l->received += f->wire_len;
	if (rc != FB_OK && rc != FB_EPROTO) {
		if (rc == FB_EZMQ) {
			fb_log_error("zmq_msg_recv: %s", zmq_strerror(errno));
		}
	}
	if (rc == FB_EPROTO) {
		if (l->payload_live) {
			zmq_msg_close(&l->payload);
			l->payload_live = false;
		}
		if (l->head_live) {
			zmq_msg_close(&l->head);
			l->head_live = false;
		}
		f->payload = NULL;
		f->payload_len = 0;
		f->sealed = false;
		f->sealed_data = NULL;
		f->sealed_len = 0;
	}
	return rc;
}

void
fb_link_peer_trust(fb_link *l, const fb_peer *peer)
{
	if (l->door == NULL || l->last_fd < 0 || l->last_peer.len == 0 ||
	    !fb_peer_equal(peer, &l->last_peer)) {
		return;
	}
	fb_door_trust(l->door, l->last_fd, fb_peer_key(peer));
}

void
fb_link_door_stats(fb_link *l, fb_door_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (l->door != NULL) {
		fb_door_stats_get(l->door, out);
	}
}

uint64_t
fb_link_bytes_sent(const fb_link *l)
{
	return l->sent;
}

uint64_t
fb_link_bytes_received(const fb_link *l)
{
	return l->received;
}
