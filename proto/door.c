/* SPDX-License-Identifier: Apache-2.0 */
/*
 * door.c -- which connections a ROUTER link holds before they have
 * authenticated, and for how long.
 *
 * libzmq accepts every TCP connection on a bound port and gives each its
 * buffers, up to ZMQ_MAXMSGSIZE for a frame in progress; nothing in it
 * caps how many it holds or how long they may stay silent. The door is a
 * thread of the link that follows the socket's monitor events
 * (ZMQ_EVENT_ACCEPTED and ZMQ_EVENT_DISCONNECTED carry the descriptor),
 * reads each new connection's address (getpeername) and closes those over
 * the limits with shutdown(2) of the descriptor, which makes libzmq drop
 * the connection as if the peer had gone. The event loop says which
 * connections authenticated (fb_door_trust, keyed by the ZMQ_SRCFD of the
 * message that proved it): it records the socket's inode, once per
 * connection, and the door reads it. None of the door's work runs on the
 * loop.
 *
 * libzmq closes a descriptor right after the DISCONNECTED event and the
 * kernel reuses the number at once, and under a flood the door's events
 * arrive late (the loop may even authenticate a connection before the
 * door has seen it open): so connections are known by their socket's
 * inode (fstat; unique among live sockets), and a descriptor is shut down
 * only while it still names the socket the door means.
 *
 * Not used, and why: a ZAP handler (ZMQ_ZAP_DOMAIN) sees the same address
 * but only after the ZMTP greeting, costs a round trip through a socket
 * per connection, and refuses after accept(2) all the same; ZMTP
 * heartbeat timeouts (ZMQ_HEARTBEAT_TIMEOUT) count whole messages, so a
 * worker on a slow link in the middle of a 1 MiB chunk would look dead.
 * ZMQ_HANDSHAKE_IVL (the ZMTP greeting's limit) and TCP keepalive are set
 * by link.c.
 *
 * The door also tells the loop when an authenticated connection closes
 * (its DISCONNECTED event, or a descriptor found gone): the key of the
 * routing id the loop trusted on it goes on a short queue with an eventfd,
 * so the program drops that peer at once instead of after its liveness
 * timeout. The routing id is recorded with the socket's inode under the
 * door's lock, so a descriptor reused by a newer connection is never
 * reported for the old one's peer.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/tcp.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <zmq.h>

#include "common/log.h"
#include "common/util.h"
#include "proto/door_impl.h"

#define DOOR_TABLE_MAX (1u << 20) /* descriptors tracked (and fd limit) */
#define DOOR_SWEEP_MS 20          /* pending connections checked */
#define DOOR_VALIDATE_MS 1000     /* every entry checked against its fd */
#define DOOR_LOG_MS 10000         /* summary lines at most this often */
#define DOOR_TRIM_MS 250          /* malloc_trim at most this often */
#define DOOR_GRACE_MS 100         /* a new connection's time to send its
                                   * first message: never evicted then */
#define DOOR_EVICT_AGE_MS 1000    /* one whose first, second or third
                                   * message the loop read (a handshake
                                   * in progress):
                                   * evicted only this long after it
                                   * opened */
#define DOOR_BATCH 1024           /* monitor events handled per lock */
#define DOOR_ENDPOINT "inproc://fb-door"
#define DOOR_CLOSED_MAX 4096      /* closed connections waiting for the
                                   * loop; older ones are dropped */

enum { C_FREE = 0, C_PENDING, C_TRUSTED, C_CLOSING };

/* One descriptor's connection. trust_ino and reads are shared with the
 * event loop, loop_rid is the loop's; the rest belong to the door's
 * thread. */
typedef struct door_conn {
	atomic_uint_least64_t trust_ino; /* inode of the socket on this fd
	                                  * that the loop last trusted */
	atomic_uint reads; /* messages the loop read from it */
	uint64_t loop_rid; /* loop: routing id hash it last trusted here */
	uint64_t rid;      /* under mu: the routing id hash trusted on ... */
	uint64_t rid_ino;  /* ... the socket with this inode (0: none) */
	uint8_t state;     /* C_* */
	uint8_t src[16];   /* peer address (IPv4 mapped into IPv6) */
	uint64_t ino;      /* the socket's inode: a reused fd differs */
	int64_t since_ms;  /* when it entered its state */
} door_conn;

struct fb_door {
	void *mon;         /* PAIR receiving the socket's monitor events */
	int stop_fd;       /* eventfd: the thread stops when readable */
	pthread_t thread;
	bool running;
	fb_door_opts o;
	uint64_t max_msg;
	uint32_t max_conn; /* cap in force */
	uint32_t max_pend; /* pending cap in force: max_pending, and no more
	                    * than max_pending_memory / max_msg */
	door_conn *tab;    /* indexed by descriptor */
	uint32_t tab_len;
	int hi_fd;         /* above every descriptor in the table */
	int *pend;         /* descriptors of pending connections */
	uint32_t npend;
	uint32_t live;     /* pending + trusted */
	int64_t last_log_ms;
	int64_t last_trim_ms;
	int64_t last_validate_ms;
	int64_t accept_failed_logged_ms;
	uint32_t closed_since_trim; /* unauthenticated connections gone */
	char refused_from[INET6_ADDRSTRLEN]; /* the last refused address */
	pthread_mutex_t mu; /* st and logged, for fb_door_stats_get; the
	                     * table's rid fields; the closed queue */
	uint64_t closed[DOOR_CLOSED_MAX]; /* keys of trusted connections that
	                                   * closed, oldest at closed_head */
	uint32_t closed_head, closed_n;
	int closed_fd;      /* eventfd: readable while closed_n > 0 */
	fb_door_stats st;
	fb_door_stats logged; /* st at the last summary line */
};

/* The peer address of `ss` as 16 bytes (IPv4 mapped; other families:
 * zero, one source). */
static void
addr_key(const struct sockaddr_storage *ss, uint8_t key[16])
{
	memset(key, 0, 16);
	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		key[10] = 0xff;
		key[11] = 0xff;
		memcpy(key + 12, &a->sin_addr, 4);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		memcpy(key, &a->sin6_addr, 16);
	}
}

static void
addr_text(const uint8_t key[16], char *out, size_t cap)
{
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff,
	    0xff};

	if (memcmp(key, v4, 12) == 0) {
		inet_ntop(AF_INET, key + 12, out, (socklen_t)cap);
	} else {
		inet_ntop(AF_INET6, key, out, (socklen_t)cap);
	}
}

/* Whether `fd` is still the socket with inode `ino`. */
static bool
is_trusted(const door_conn *c)
{
	return atomic_load_explicit(&c->trust_ino, memory_order_acquire) ==
	    c->ino;
}

static bool
same_socket(int fd, uint64_t ino)
{
	struct stat sb;
	return fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode) &&
	    (uint64_t)sb.st_ino == ino;
}

/* Bytes the kernel received on `fd` (TCP_INFO); 0 where it cannot say
 * (not TCP, or a kernel before 4.1). */
static uint64_t
tcp_bytes_in(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
	    len < offsetof(struct tcp_info, tcpi_bytes_received) +
	            sizeof(ti.tcpi_bytes_received)) {
		return 0;
	}
	return ti.tcpi_bytes_received;
}

static void
pend_remove(fb_door *d, int fd)
{
	for (uint32_t i = 0; i < d->npend; i++) {
		if (d->pend[i] == fd) {
			d->pend[i] = d->pend[--d->npend];
			return;
		}
	}
}

/* fd's connection goes: if the loop trusted it, its routing id's key goes
 * on the closed queue for the loop. Under d->mu. */
static void
publish_closed(fb_door *d, door_conn *c)
{
	uint64_t one = 1;

	if (c->rid_ino == 0 || c->rid_ino != c->ino || c->rid == 0) {
		return;
	}
	if (d->closed_n == DOOR_CLOSED_MAX) {
		d->closed_head = (d->closed_head + 1) % DOOR_CLOSED_MAX;
		d->closed_n--;
	}
	d->closed[(d->closed_head + d->closed_n) % DOOR_CLOSED_MAX] = c->rid;
	d->closed_n++;
	c->rid_ino = 0;
	if (write(d->closed_fd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
		/* saturated: readable anyway */
	}
}

/* Moves fd's entry to `state`, keeping the pending list and counts. */
static void
conn_set(fb_door *d, int fd, uint8_t state, int64_t now)
{
	door_conn *c = &d->tab[fd];

	if (state == C_FREE && c->state != C_FREE) {
		publish_closed(d, c);
	}

	if (c->state == C_PENDING) {
		pend_remove(d, fd);
	}
	if (c->state == C_PENDING || c->state == C_TRUSTED) {
		d->live--;
	}
	if (c->state != C_TRUSTED && c->state != C_FREE &&
	    state == C_FREE) {
		d->closed_since_trim++;
	}
	if (state == C_FREE) {
		/* The next connection on this fd counts from here: its
		 * DISCONNECTED event came before the next one's ACCEPTED. */
		atomic_store_explicit(&c->reads, 0, memory_order_relaxed);
	}
	c->state = state;
	c->since_ms = now;
	if (state == C_PENDING) {
		FB_ASSERT(d->npend < d->max_pend);
		d->pend[d->npend++] = fd;
	}
	if (state == C_PENDING || state == C_TRUSTED) {
		d->live++;
	}
}

/* Closes fd's connection (counted in *counter) if fd still is it; an entry
 * whose descriptor went elsewhere is forgotten instead. */
static void
conn_close(fb_door *d, int fd, uint64_t *counter, int64_t now)
{
	door_conn *c = &d->tab[fd];

	if (!same_socket(fd, c->ino)) {
		conn_set(d, fd, C_FREE, now);
		return;
	}
	(void)shutdown(fd, SHUT_RDWR);
	conn_set(d, fd, C_CLOSING, now);
	if (counter != NULL) {
		(*counter)++;
	}
}

/* Pending connections the loop has trusted since the last look. */
static void
refresh_trust(fb_door *d, int64_t now)
{
	for (uint32_t i = d->npend; i-- > 0;) {
		int fd = d->pend[i];
		if (is_trusted(&d->tab[fd])) {
			conn_set(d, fd, C_TRUSTED, now);
			d->st.trusted++;
		}
	}
}

static uint32_t
source_pending(const fb_door *d, const uint8_t src[16])
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < d->npend; i++) {
		n += memcmp(d->tab[d->pend[i]].src, src, 16) == 0;
	}
	return n;
}

/*
 * The pending connection to close for a newcomer when the door is full,
 * or -1 (the newcomer is refused). `mine`: pending connections from the
 * newcomer's address. First those that had their chance: the loop handled
 * three of their messages without trusting them (a secure worker
 * authenticates by its third: cookie request, signed hello, sealed
 * hello; the loop reading a fourth means it is done with the third).
 * Then those of the address holding most pending connections, the oldest
 * first. Never one whose first, second or third message the loop read (a
 * handshake in progress: a cookie or reply on its way, a sealed hello
 * being opened) open less than DOOR_EVICT_AGE_MS, nor one that has
 * sent nothing yet open less than DOOR_GRACE_MS unless its address holds
 * more pending connections than the newcomer's: so a newcomer from a
 * quiet address gets in past a flood from busier ones.
 */
static int
pick_victim(const fb_door *d, uint32_t mine, int64_t now)
{
	int best = -1;
	bool best_spent = false;
	uint32_t best_n = 0;
	int64_t best_since = 0;

	for (uint32_t i = 0; i < d->npend; i++) {
		int fd = d->pend[i];
		const door_conn *c = &d->tab[fd];
		unsigned r = atomic_load_explicit(&c->reads,
		    memory_order_relaxed);
		int64_t age = now - c->since_ms;
		bool spent = r >= 4;
		uint32_t n = source_pending(d, c->src);

		if ((r >= 1 && r <= 3 && age < DOOR_EVICT_AGE_MS) ||
		    (r == 0 && age < DOOR_GRACE_MS && n <= mine)) {
			continue;
		}
		if (best < 0 || spent > best_spent ||
		    (spent == best_spent &&
		        (n > best_n || (n == best_n && c->since_ms < best_since)))) {
			best = fd;
			best_spent = spent;
			best_n = n;
			best_since = c->since_ms;
		}
	}
	return best;
}

static void
on_accepted(fb_door *d, int fd, int64_t now)
{
	struct stat sb;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	uint8_t src[16];
	uint64_t *refused = NULL;
	uint32_t mine;
	door_conn *c;

	d->st.accepted++;
	if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISSOCK(sb.st_mode)) {
		return; /* gone already: nothing is held */
	}
	if ((uint32_t)fd >= d->tab_len) {
		/* beyond the table (the limit was raised behind our back) */
		(void)shutdown(fd, SHUT_RDWR);
		d->st.refused_full++;
		return;
	}
	memset(&ss, 0, sizeof(ss));
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
		return;
	}
	addr_key(&ss, src);
	c = &d->tab[fd];
	if (c->state != C_FREE) {
		/* Its DISCONNECTED never came (libzmq closes some without). */
		conn_set(d, fd, C_FREE, now);
	}
	memcpy(c->src, src, 16);
	c->ino = (uint64_t)sb.st_ino;
	if (fd >= d->hi_fd) {
		d->hi_fd = fd + 1;
	}
	if (is_trusted(c)) {
		/* The loop authenticated it before this event came. */
		d->st.trusted++;
		conn_set(d, fd, C_TRUSTED, now);
		return;
	}
	refresh_trust(d, now);
	mine = source_pending(d, src);
	if (mine >= d->o.max_per_source) {
		refused = &d->st.refused_source;
	} else if (d->live >= d->max_conn || d->npend >= d->max_pend) {
		int v = pick_victim(d, mine, now);
		if (v >= 0) {
			conn_close(d, v, &d->st.evicted, now);
		}
		if (d->live >= d->max_conn || d->npend >= d->max_pend) {
			refused = &d->st.refused_full;
		}
	}
	if (refused != NULL) {
		(*refused)++;
		addr_text(src, d->refused_from, sizeof(d->refused_from));
		(void)shutdown(fd, SHUT_RDWR);
		conn_set(d, fd, C_CLOSING, now);
		return;
	}
	conn_set(d, fd, C_PENDING, now);
}

static void
on_disconnected(fb_door *d, int fd, int64_t now)
{
	if (fd >= 0 && (uint32_t)fd < d->tab_len &&
	    d->tab[fd].state != C_FREE) {
		conn_set(d, fd, C_FREE, now);
	}
}

static void
on_accept_failed(fb_door *d, int err, int64_t now)
{
	d->st.accept_failed++;
	if (now - d->accept_failed_logged_ms >= 1000) {
		struct rlimit rl;
		getrlimit(RLIMIT_NOFILE, &rl);
		fb_log_warn("cannot accept a connection: %s (%" PRIu64 " so "
		            "far; descriptor limit %llu)",
		    strerror(err), d->st.accept_failed,
		    (unsigned long long)rl.rlim_cur);
		d->accept_failed_logged_ms = now;
	}
}

/*
 * Pending connections past their time or their bytes are closed: past
 * max_pending_bytes once the loop has handled three of its messages
 * without trusting it (it read a fourth; a worker's first to third
 * message authenticates it), or past a whole frame more than that
 * whatever the loop did.
 */
static void
sweep_pending(fb_door *d, int64_t now)
{
	for (uint32_t i = d->npend; i-- > 0;) {
		int fd = d->pend[i];
		door_conn *c = &d->tab[fd];
		/* reads before trust: the loop trusts a connection while it
		 * handles a message, before it reads the next one */
		unsigned r = atomic_load_explicit(&c->reads,
		    memory_order_acquire);
		uint64_t in;

		if (is_trusted(c)) {
			conn_set(d, fd, C_TRUSTED, now);
			d->st.trusted++;
			continue;
		}
		if (now - c->since_ms >= (int64_t)d->o.handshake_ms) {
			conn_close(d, fd, &d->st.timed_out, now);
			continue;
		}
		in = tcp_bytes_in(fd);
		if (in > d->o.max_pending_bytes &&
		    (r >= 4 || in > d->o.max_pending_bytes + d->max_msg)) {
			conn_close(d, fd, &d->st.over_bytes, now);
		}
	}
}

/* Every entry against its descriptor: ghosts (a close libzmq did not
 * report) are forgotten; closing ones still open are shut down again. */
static void
validate(fb_door *d, int64_t now)
{
	for (int fd = 0; fd < d->hi_fd; fd++) {
		door_conn *c = &d->tab[fd];
		if (c->state == C_FREE) {
			continue;
		}
		if (!same_socket(fd, c->ino)) {
			conn_set(d, fd, C_FREE, now);
		} else if (c->state == C_CLOSING &&
		    now - c->since_ms >= DOOR_VALIDATE_MS) {
			(void)shutdown(fd, SHUT_RDWR);
		}
	}
}

static void
handle_event(fb_door *d, zmq_msg_t *ev, int64_t now)
{
	const uint8_t *b = zmq_msg_data(ev);
	uint16_t what;
	uint32_t value;

	if (zmq_msg_size(ev) < 6) {
		return;
	}
	memcpy(&what, b, 2);
	memcpy(&value, b + 2, 4);
	switch (what) {
	case ZMQ_EVENT_ACCEPTED:
		on_accepted(d, (int)value, now);
		break;
	case ZMQ_EVENT_DISCONNECTED:
		on_disconnected(d, (int)value, now);
		break;
	case ZMQ_EVENT_ACCEPT_FAILED:
		on_accept_failed(d, (int)value, now);
		break;
	default:
		break;
	}
}

/* Handles the monitor events waiting; false when none was waiting. */
static bool
drain_events(fb_door *d)
{
	bool any = false;

	for (int n = 0; n < DOOR_BATCH; n++) {
		zmq_msg_t ev, ep;
		zmq_msg_init(&ev);
		if (zmq_msg_recv(&ev, d->mon, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&ev);
			break;
		}
		zmq_msg_init(&ep); /* the endpoint frame: not needed */
		if (zmq_msg_more(&ev)) {
			(void)zmq_msg_recv(&ep, d->mon, ZMQ_DONTWAIT);
		}
		handle_event(d, &ev, fb_now_ms());
		zmq_msg_close(&ep);
		zmq_msg_close(&ev);
		any = true;
	}
	return any;
}

static void
note_peaks(fb_door *d)
{
	d->st.connections = d->live;
	d->st.pending = d->npend;
	if (d->live > d->st.peak_connections) {
		d->st.peak_connections = d->live;
	}
	if (d->npend > d->st.peak_pending) {
		d->st.peak_pending = d->npend;
	}
}

/* One line on what the door closed since the last, at most every
 * DOOR_LOG_MS (the first at once), and the rest when the door closes
 * (final), so that a run's lines add up to all it closed. */
static void
log_summary(fb_door *d, int64_t now, bool final)
{
	const fb_door_stats *s = &d->st, *p = &d->logged;
	uint64_t rs = s->refused_source - p->refused_source;
	uint64_t rf = s->refused_full - p->refused_full;
	uint64_t ev = s->evicted - p->evicted;
	uint64_t to = s->timed_out - p->timed_out;
	uint64_t ob = s->over_bytes - p->over_bytes;

	if (rs + rf + ev + to + ob == 0 ||
	    (!final && d->last_log_ms != 0 &&
	        now - d->last_log_ms < DOOR_LOG_MS)) {
		return;
	}
	fb_log_warn("door: closed %" PRIu64 " unauthenticated connections "
	            "(%" PRIu64 " over transport.max_pending_per_source "
	            "%u, the last from %s; %" PRIu64 " with the door full, "
	            "transport.max_pending %u or transport.max_connections "
	            "%u; %" PRIu64 " evicted to make room; %" PRIu64 " past "
	            "transport.handshake_timeout; %" PRIu64 " past "
	            "transport.max_pending_bytes); holding %u, %u pending",
	    rs + rf + ev + to + ob, rs, d->o.max_per_source,
	    d->refused_from[0] ? d->refused_from : "-", rf, d->max_pend,
	    d->max_conn, ev, to, ob, d->live, d->npend);
	d->logged = *s;
	d->last_log_ms = now;
}

static void *
door_main(void *arg)
{
	fb_door *d = arg;
	int64_t next_sweep = 0;

	for (;;) {
		zmq_pollitem_t it[2] = {
		    {d->mon, 0, ZMQ_POLLIN, 0},
		    {NULL, d->stop_fd, ZMQ_POLLIN, 0},
		};
		int64_t now = fb_now_ms();
		int64_t wait = d->npend > 0 ? next_sweep - now : DOOR_VALIDATE_MS;

		if (wait < 0) {
			wait = 0;
		}
		if (zmq_poll(it, 2, (long)wait) < 0 && errno != EINTR) {
			fb_log_error("door: zmq_poll: %s", zmq_strerror(errno));
			break;
		}
		if (it[1].revents & ZMQ_POLLIN) {
			pthread_mutex_lock(&d->mu);
			log_summary(d, fb_now_ms(), true);
			pthread_mutex_unlock(&d->mu);
			break;
		}
		pthread_mutex_lock(&d->mu);
		while (drain_events(d)) {
			note_peaks(d);
			if (fb_now_ms() >= next_sweep) {
				break; /* a flood of events: sweep in between */
			}
		}
		now = fb_now_ms();
		if (now >= next_sweep) {
			sweep_pending(d, now);
			next_sweep = now + DOOR_SWEEP_MS;
		}
		if (now - d->last_validate_ms >= DOOR_VALIDATE_MS) {
			validate(d, now);
			d->last_validate_ms = now;
		}
		if (d->closed_since_trim > 0 &&
		    now - d->last_trim_ms >= DOOR_TRIM_MS) {
			/* Buffers of the peers that went (a frame in progress
			 * is up to ZMQ_MAXMSGSIZE): glibc keeps freed heap
			 * memory (fb_tune_malloc's trim threshold); give it
			 * back. */
			malloc_trim(0);
			d->st.trims++;
			d->closed_since_trim = 0;
			d->last_trim_ms = now;
		}
		note_peaks(d);
		log_summary(d, now, false);
		pthread_mutex_unlock(&d->mu);
	}
	return NULL;
}

/* Descriptors this process has open now (-1 if /proc cannot say). */
static int
open_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (dir == NULL) {
		return -1;
	}
	while ((e = readdir(dir)) != NULL) {
		n += e->d_name[0] != '.';
	}
	closedir(dir);
	return n - 1; /* the directory's own */
}

/* Raises the soft descriptor limit to the hard one (at most
 * DOOR_TABLE_MAX) and returns the limit in force. */
static uint32_t
raise_fd_limit(void)
{
	struct rlimit rl;
	rlim_t want;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
		return 1024;
	}
	want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > DOOR_TABLE_MAX
	    ? DOOR_TABLE_MAX
	    : rl.rlim_max;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
		rlim_t old = rl.rlim_cur;
		rl.rlim_cur = want;
		if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
			fb_log_info("file descriptors: soft limit raised from "
			            "%llu to %llu (the hard limit)",
			    (unsigned long long)old, (unsigned long long)want);
		} else {
			rl.rlim_cur = old;
		}
	}
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > DOOR_TABLE_MAX) {
		return DOOR_TABLE_MAX;
	}
	return (uint32_t)rl.rlim_cur;
}

static void
door_free(fb_door *d)
{
	if (d->mon != NULL) {
		zmq_close(d->mon);
	}
	if (d->stop_fd >= 0) {
		close(d->stop_fd);
	}
	if (d->closed_fd >= 0) {
		close(d->closed_fd);
	}
	pthread_mutex_destroy(&d->mu);
	free(d->tab);
	free(d->pend);
	free(d);
}

fb_err
fb_door_start(void *ctx, void *sock, const fb_door_opts *o, size_t max_msg,
    fb_door **out)
{
	fb_err rc = FB_OK;
	fb_door *d = NULL;
	uint32_t limit, budget;
	int used, events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED |
	    ZMQ_EVENT_ACCEPT_FAILED;

	*out = NULL;
	if (o->max_pending == 0 || o->max_per_source == 0 ||
	    o->handshake_ms == 0 || o->max_pending_memory == 0) {
		return FB_EINVAL;
	}
	if ((d = calloc(1, sizeof(*d))) == NULL) {
		return FB_ENOMEM;
	}
	d->stop_fd = -1;
	d->closed_fd = -1;
	pthread_mutex_init(&d->mu, NULL);
	d->o = *o;
	d->max_msg = max_msg;
	limit = raise_fd_limit();
	used = open_fds();
	if (used < 0) {
		used = 64; /* no /proc: a guess, on top of the reserve */
	}
	budget = limit > (uint32_t)used + o->fd_reserve
	    ? limit - (uint32_t)used - o->fd_reserve
	    : 0;
	if (budget == 0) {
		fb_log_error("no file descriptors left for connections: limit "
		             "%u, %d open, %u kept for files "
		             "(transport.fd_reserve); raise the limit (ulimit "
		             "-n)", limit, used, o->fd_reserve);
		rc = FB_EINVAL;
		goto out;
	}
	d->max_conn = o->max_connections == 0 || o->max_connections > budget
	    ? budget
	    : o->max_connections;
	if (o->max_connections > budget) {
		fb_log_warn("transport.max_connections %u does not fit under "
		            "the file-descriptor limit %u (%d open, %u kept for "
		            "files, transport.fd_reserve): at most %u "
		            "connections (raise ulimit -n)",
		    o->max_connections, limit, used, o->fd_reserve, budget);
	}
	/* A pending connection may hold a frame in progress of max_msg
	 * bytes (libzmq allocates it when the frame's header arrives): the
	 * memory limit is a limit on how many may be pending. */
	d->max_pend = o->max_pending;
	if (o->max_pending_memory / max_msg < d->max_pend) {
		d->max_pend = o->max_pending_memory / max_msg > 0
		    ? (uint32_t)(o->max_pending_memory / max_msg)
		    : 1;
	}
	d->st.max_connections = d->max_conn;
	d->st.max_pending = d->max_pend;
	d->st.fd_limit = limit;
	d->tab_len = limit;
	if ((d->tab = calloc(d->tab_len, sizeof(*d->tab))) == NULL ||
	    (d->pend = calloc(d->max_pend, sizeof(*d->pend))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if ((d->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
	    (d->closed_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		fb_log_error("door: eventfd: %s", strerror(errno));
		rc = FB_ENOMEM;
		goto out;
	}
	if (zmq_socket_monitor(sock, DOOR_ENDPOINT, events) != 0) {
		fb_log_error("zmq_socket_monitor: %s", zmq_strerror(errno));
		rc = FB_EZMQ;
		goto out;
	}
	if ((d->mon = zmq_socket(ctx, ZMQ_PAIR)) == NULL ||
	    zmq_connect(d->mon, DOOR_ENDPOINT) != 0) {
		fb_log_error("door: monitor socket: %s", zmq_strerror(errno));
		(void)zmq_socket_monitor(sock, NULL, 0);
		rc = FB_EZMQ;
		goto out;
	}
	if (pthread_create(&d->thread, NULL, door_main, d) != 0) {
		(void)zmq_socket_monitor(sock, NULL, 0);
		rc = FB_ENOMEM;
		goto out;
	}
	d->running = true;
	fb_log_info("door: at most %u connections, %u of them not yet "
	            "authenticated (%u per address; each may hold a frame of "
	            "%.2f MiB in progress, %.1f MiB in all), each closed after "
	            "%.1fs or %u bytes unless it authenticates; descriptor "
	            "limit %u, %d open, %u kept for files",
	    d->max_conn, d->max_pend, o->max_per_source,
	    (double)max_msg / 1048576.0,
	    (double)d->max_pend * (double)max_msg / 1048576.0,
	    (double)o->handshake_ms / 1000.0, o->max_pending_bytes, limit, used,
	    o->fd_reserve);
	*out = d;
	d = NULL;
out:
	if (d != NULL) {
		door_free(d);
	}
	return rc;
}

void
fb_door_stop(fb_door *d, void *sock)
{
	uint64_t one = 1;

	if (d == NULL) {
		return;
	}
	/* The monitor first: libzmq's I/O threads block on a monitor whose
	 * reader went away. */
	(void)zmq_socket_monitor(sock, NULL, 0);
	if (d->running) {
		if (write(d->stop_fd, &one, sizeof(one)) != (ssize_t)sizeof(one)) {
			/* an eventfd write cannot fail below 2^64 - 1 */
		}
		pthread_join(d->thread, NULL);
	}
	door_free(d);
}

void
fb_door_seen(fb_door *d, int fd)
{
	if (fd >= 0 && (uint32_t)fd < d->tab_len) {
		atomic_fetch_add_explicit(&d->tab[fd].reads, 1,
		    memory_order_release);
	}
}

void
fb_door_trust(fb_door *d, int fd, uint64_t rid)
{
	door_conn *c;
	struct stat sb;

	if (fd < 0 || (uint32_t)fd >= d->tab_len) {
		return;
	}
	c = &d->tab[fd];
	if (c->loop_rid == rid) {
		return; /* this connection (routing id) is trusted already */
	}
	if (fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode)) {
		/* once per connection: the lock is cheap at that rate */
		pthread_mutex_lock(&d->mu);
		c->rid = rid;
		c->rid_ino = (uint64_t)sb.st_ino;
		pthread_mutex_unlock(&d->mu);
		atomic_store_explicit(&c->trust_ino, (uint64_t)sb.st_ino,
		    memory_order_release);
		c->loop_rid = rid;
	}
}

bool
fb_door_closed_next(fb_door *d, uint64_t *key)
{
	uint64_t v;
	bool got = false;

	pthread_mutex_lock(&d->mu);
	if (d->closed_n > 0) {
		*key = d->closed[d->closed_head];
		d->closed_head = (d->closed_head + 1) % DOOR_CLOSED_MAX;
		d->closed_n--;
		got = true;
	}
	if (d->closed_n == 0 && read(d->closed_fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: not signalled */
	}
	pthread_mutex_unlock(&d->mu);
	return got;
}

int
fb_door_closed_fd(const fb_door *d)
{
	return d->closed_fd;
}

void
fb_door_stats_get(fb_door *d, fb_door_stats *out)
{
	pthread_mutex_lock(&d->mu);
	*out = d->st;
	pthread_mutex_unlock(&d->mu);
}
