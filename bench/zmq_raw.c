/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zmq_raw.c -- raw ZeroMQ loopback throughput, the yardstick of
 * bench/round_overhead: K DEALER senders (separate processes, like fedbox
 * workers) push fixed-size messages to one ROUTER receiver, which reads
 * every byte once (a 64-bit sum, so the copy-out cannot be optimised away,
 * like the coordinator that reads every byte of every update).
 *
 *   zmq_raw --senders K --bytes B [--msg-size 1048576] [--reps R]
 *           [--warmup W] [--hwm H] [--header-bytes C] [--io-threads T]
 *           [--source update|copy|hot] [--malloc tuned|default]
 *           [--endpoint tcp://127.0.0.1:*]
 *
 * Each sender sends B bytes (the last message may be shorter), so one rep
 * moves K x B bytes. W untimed warm-up reps come first on the same
 * connections (fresh TCP connections and heaps are slower: the fedbox
 * rounds it is compared with run on connections that already carried a
 * round). Timing: the receiver waits until every sender has
 * connected and said "ready", then sends "go" to all and starts the clock;
 * it stops when the last byte of the K x B has been received and summed.
 * Prints one line per rep and a final JSON line with the median:
 *   {"senders": K, "bytes": K*B, "reps": R, "seconds": s, "mb_per_s": x}
 * MB = 1e6 bytes. Libzmq is used directly here (benchmarks may). The
 * high-water marks default to 16 messages, as fedbox's links (proto/link.c):
 * with libzmq's default of 1000, each sender queues up to 1 GB of fresh
 * 1 MiB buffers and the run measures page faults more than the transport.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "common/util.h"

#define MAX_SENDERS 256
#define MAX_REPS 64

typedef struct opts {
	int senders;
	uint64_t bytes;    /* per sender, per rep */
	uint64_t msg_size; /* bytes per message, > 0 */
	int reps;
	int warmup; /* untimed reps first (TCP windows, heaps warm up) */
	int hwm; /* send and receive high-water marks, messages */
	size_t header_bytes; /* a frame of this size before each payload */
	int io_threads; /* the receiver's ZeroMQ I/O threads */
	int source; /* SRC_*: where a sender's bytes come from */
	const char *endpoint;
	bool default_malloc; /* --malloc default: glibc's own thresholds */
} opts;

/*
 * What a sender sends. SRC_UPDATE, the default, is what a fedbox worker
 * does: B bytes held in memory, message i the i-th slice, handed to ZeroMQ
 * without a copy. SRC_COPY: the same buffer through zmq_send (one copy in
 * the sender). SRC_HOT: one msg_size buffer sent again and again through
 * zmq_send; the kernel then copies from cache, which no sender of a
 * model-sized update can do (kept for comparison with earlier figures).
 */
enum { SRC_UPDATE, SRC_COPY, SRC_HOT };
static const char *const source_names[] = {"update", "copy", "hot", NULL};
static const char *const malloc_names[] = {"tuned", "default", NULL};

/* The index of v in the NULL-ended names, or -1. */
static int
name_index(const char *v, const char *const *names)
{
	for (int k = 0; names[k] != NULL; k++) {
		if (strcmp(v, names[k]) == 0) {
			return k;
		}
	}
	return -1;
}

static void
usage(FILE *f)
{
	fprintf(f, "usage: zmq_raw --senders K --bytes B [--msg-size BYTES] "
	           "[--reps R] [--warmup W] [--hwm H]\n"
	           "               [--header-bytes C] [--io-threads T]\n"
	           "               [--source update|copy|hot] "
	           "[--malloc tuned|default] [--endpoint tcp://127.0.0.1:*]\n"
	           "K DEALER processes each send B bytes in messages of "
	           "BYTES (default 1 MiB) to one ROUTER\nthat sums every "
	           "byte; prints the receive throughput (median of R reps, "
	           "default 3),\nafter W untimed reps (default 1) on the same "
	           "connections.\nH: send and receive high-water marks in messages "
	           "(default 16, as\nproto/link.c; 0 = unlimited). C: send a C-byte "
	           "frame before each payload\n(fedbox's control frame; "
	           "default 0). T: the receiver's ZeroMQ I/O threads (default "
	           "1,\nas the coordinator's transport.io_threads).\n"
	           "--source: update (default) sends slices of a B-byte buffer "
	           "without a copy,\nas a fedbox worker sends its update; copy: "
	           "the same through zmq_send; hot:\none BYTES buffer sent again "
	           "and again through zmq_send (cache-hot).\n"
	           "--malloc: tuned (default) keeps freed message buffers in the "
	           "heap, as the\nfedbox programs do (fb_tune_malloc); default "
	           "leaves glibc's thresholds, and\nevery 1 MiB message then "
	           "faults in fresh pages.\n");
}

static int
parse(int argc, char **argv, opts *o)
{
	o->senders = 0;
	o->bytes = 0;
	o->msg_size = 1u << 20;
	o->reps = 3;
	o->warmup = 1;
	o->hwm = 16;
	o->header_bytes = 0;
	o->io_threads = 1;
	o->source = SRC_UPDATE;
	o->endpoint = "tcp://127.0.0.1:*";
	o->default_malloc = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			exit(0);
		}
		if (v == NULL) {
			usage(stderr);
			return -1;
		}
		if (strcmp(a, "--senders") == 0) {
			o->senders = atoi(v);
		} else if (strcmp(a, "--bytes") == 0) {
			o->bytes = strtoull(v, NULL, 10);
		} else if (strcmp(a, "--msg-size") == 0) {
			o->msg_size = strtoull(v, NULL, 10);
		} else if (strcmp(a, "--reps") == 0) {
			o->reps = atoi(v);
		} else if (strcmp(a, "--warmup") == 0) {
			o->warmup = atoi(v);
		} else if (strcmp(a, "--header-bytes") == 0) {
			o->header_bytes = strtoull(v, NULL, 10);
		} else if (strcmp(a, "--io-threads") == 0) {
			o->io_threads = atoi(v);
		} else if (strcmp(a, "--hwm") == 0) {
			o->hwm = atoi(v);
		} else if (strcmp(a, "--source") == 0) {
			if ((o->source = name_index(v, source_names)) < 0) {
				fprintf(stderr, "zmq_raw: --source: '%s' is not "
				                "update, copy or hot\n", v);
				return -1;
			}
		} else if (strcmp(a, "--malloc") == 0) {
			int m = name_index(v, malloc_names);
			if (m < 0) {
				fprintf(stderr, "zmq_raw: --malloc: '%s' is not "
				                "tuned or default\n", v);
				return -1;
			}
			o->default_malloc = m == 1;
		} else if (strcmp(a, "--endpoint") == 0) {
			o->endpoint = v;
		} else {
			usage(stderr);
			return -1;
		}
		i++;
	}
	if (o->senders < 1 || o->senders > MAX_SENDERS || o->bytes == 0 ||
	    o->msg_size == 0 || o->reps < 1 || o->reps > MAX_REPS ||
	    o->hwm < 0 || o->warmup < 0 || o->warmup > 1000 ||
	    o->io_threads < 1 || o->io_threads > 64 ||
	    o->header_bytes > o->msg_size) {
		usage(stderr);
		return -1;
	}
	return 0;
}

/* Reads every byte of the message once. */
static uint64_t
touch(const uint8_t *p, size_t len)
{
	uint64_t s = 0;
	size_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t w;
		memcpy(&w, p + i, 8);
		s += w;
	}
	for (; i < len; i++) {
		s += p[i];
	}
	return s;
}

static int
set_hwm(void *sock, int hwm)
{
	return zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
	    zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof(hwm)) != 0;
}

static void
keep(void *data, void *hint)
{
	(void)data;
	(void)hint; /* the buffer lives as long as the sender */
}

/* Sends len bytes at p: without a copy for SRC_UPDATE. */
static int
send_payload(void *sock, uint8_t *p, size_t len, int source)
{
	zmq_msg_t m;

	if (source != SRC_UPDATE) {
		return zmq_send(sock, p, len, 0);
	}
	if (zmq_msg_init_data(&m, p, len, keep, NULL) != 0) {
		return -1;
	}
	if (zmq_msg_send(&m, sock, 0) < 0) {
		zmq_msg_close(&m);
		return -1;
	}
	return (int)len;
}

/* A sender process: gets the endpoint on fd, then sends when told. */
static int
sender_main(int fd, const opts *o)
{
	char endpoint[256];
	ssize_t n = read(fd, endpoint, sizeof(endpoint) - 1);
	void *ctx = NULL, *sock = NULL;
	uint8_t *buf = NULL, go;
	uint64_t buf_len = o->source == SRC_HOT ? o->msg_size : o->bytes;
	int rc = 1;

	close(fd);
	if (n <= 0) {
		return 1;
	}
	endpoint[n] = '\0';
	if (buf_len < o->header_bytes) {
		buf_len = o->header_bytes;
	}
	/* Allocated as a worker allocates its update (huge pages where the
	 * kernel grants them): the yardstick's senders read the same memory. */
	if ((buf = fb_alloc(buf_len)) == NULL) {
		fprintf(stderr, "zmq_raw sender: out of memory\n");
		return 1;
	}
	for (uint64_t i = 0; i < buf_len; i++) {
		buf[i] = (uint8_t)(i * 2654435761u >> 13);
	}
	ctx = zmq_ctx_new();
	sock = zmq_socket(ctx, ZMQ_DEALER);
	if (sock == NULL || set_hwm(sock, o->hwm) != 0 ||
	    zmq_connect(sock, endpoint) != 0) {
		fprintf(stderr, "zmq_raw sender: %s\n", zmq_strerror(errno));
		goto out;
	}
	for (int r = 0; r < o->warmup + o->reps; r++) {
		uint64_t left = o->bytes;
		if (zmq_send(sock, "r", 1, 0) != 1 ||
		    zmq_recv(sock, &go, 1, 0) != 1) {
			fprintf(stderr, "zmq_raw sender: %s\n",
			    zmq_strerror(errno));
			goto out;
		}
		while (left > 0) {
			size_t len = left < o->msg_size ? left : o->msg_size;
			uint8_t *p = o->source == SRC_HOT ? buf
			                                  : buf + (o->bytes - left);
			if ((o->header_bytes > 0 &&
			        zmq_send(sock, buf, o->header_bytes,
			            ZMQ_SNDMORE) < 0) ||
			    send_payload(sock, p, len, o->source) < 0) {
				fprintf(stderr, "zmq_raw sender: %s\n",
				    zmq_strerror(errno));
				goto out;
			}
			left -= len;
		}
	}
	rc = 0;
out:
	if (sock != NULL) {
		zmq_close(sock); /* default linger: everything is delivered */
	}
	if (ctx != NULL) {
		zmq_ctx_term(ctx);
	}
	fb_free(buf);
	return rc;
}

/*
 * Receives one [identity, payload] message into part; returns the sender's
 * index (identities are learnt in order of first contact), -1 on error.
 */
static int
recv_from(void *sock, uint8_t ids[][256], size_t *id_len, int senders,
    zmq_msg_t *part)
{
	uint8_t id[256];
	int more = 0, n;
	size_t sz = sizeof(more);

	n = zmq_recv(sock, id, sizeof(id), 0);
	if (n <= 0 || n > (int)sizeof(id) ||
	    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) != 0 || !more ||
	    zmq_msg_recv(part, sock, 0) < 0) {
		return -1;
	}
	/* With --header-bytes the payload is the last frame. */
	while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz) == 0 && more) {
		if (zmq_msg_recv(part, sock, 0) < 0) {
			return -1;
		}
	}
	for (int i = 0; i < senders; i++) {
		if (id_len[i] == 0) {
			memcpy(ids[i], id, (size_t)n);
			id_len[i] = (size_t)n;
			return i;
		}
		if (id_len[i] == (size_t)n && memcmp(ids[i], id, (size_t)n) == 0) {
			return i;
		}
	}
	return -1;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int
main(int argc, char **argv)
{
	opts o;
	pid_t pids[MAX_SENDERS];
	int fds[MAX_SENDERS];
	uint8_t ids[MAX_SENDERS][256];
	size_t id_len[MAX_SENDERS];
	bool ready[MAX_SENDERS];
	uint64_t sent[MAX_SENDERS];
	double secs[MAX_REPS];
	zmq_msg_t part;
	char endpoint[256];
	size_t ep_len = sizeof(endpoint);
	void *ctx = NULL, *sock = NULL;
	uint64_t sum = 0, total;
	int rc = 1, started = 0;

	zmq_msg_init(&part);
	if (parse(argc, argv, &o) != 0) {
		return 2;
	}
	total = o.bytes * (uint64_t)o.senders;
	/* The yardstick gets the allocator setting the coordinator and the
	 * workers apply to themselves (before the fork: the senders too). */
	if (!o.default_malloc) {
		fb_tune_malloc((size_t)o.msg_size);
	}
	/* Fork the senders before any ZeroMQ state exists in this process. */
	for (int i = 0; i < o.senders; i++) {
		int p[2];
		if (pipe(p) != 0) {
			perror("pipe");
			goto out;
		}
		if ((pids[i] = fork()) < 0) {
			perror("fork");
			close(p[0]);
			close(p[1]);
			goto out;
		}
		if (pids[i] == 0) {
			/* Never outlive the receiver (e.g. it was killed). */
			prctl(PR_SET_PDEATHSIG, SIGTERM);
			close(p[1]);
			for (int j = 0; j < i; j++) {
				close(fds[j]);
			}
			_exit(sender_main(p[0], &o));
		}
		close(p[0]);
		fds[i] = p[1];
		started++;
	}
	ctx = zmq_ctx_new();
	if (ctx == NULL ||
	    zmq_ctx_set(ctx, ZMQ_IO_THREADS, o.io_threads) != 0) {
		fprintf(stderr, "zmq_raw: cannot make a context with %d I/O "
		                "threads\n", o.io_threads);
		goto out;
	}
	sock = zmq_socket(ctx, ZMQ_ROUTER);
	if (sock == NULL || set_hwm(sock, o.hwm) != 0 ||
	    zmq_bind(sock, o.endpoint) != 0 ||
	    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, endpoint, &ep_len) != 0) {
		fprintf(stderr, "zmq_raw: cannot bind %s: %s\n", o.endpoint,
		    zmq_strerror(errno));
		goto out;
	}
	for (int i = 0; i < o.senders; i++) {
		if (write(fds[i], endpoint, strlen(endpoint)) < 0) {
			perror("write");
			goto out;
		}
		close(fds[i]);
		fds[i] = -1;
	}
	for (int i = 0; i < o.senders; i++) {
		id_len[i] = 0;
		ready[i] = false;
	}
	for (int r = -o.warmup; r < o.reps; r++) {
		uint64_t got = 0;
		int nready = 0;
		double t0;

		/* Every sender says ready before it sends. A sender that is
		 * done early may have said it during the previous rep. */
		for (int i = 0; i < o.senders; i++) {
			nready += ready[i];
			sent[i] = 0;
		}
		while (nready < o.senders) {
			int i = recv_from(sock, ids, id_len, o.senders, &part);
			if (i < 0 || ready[i]) {
				fprintf(stderr, "zmq_raw: bad ready\n");
				goto out;
			}
			ready[i] = true;
			nready++;
		}
		t0 = fb_now_s();
		for (int i = 0; i < o.senders; i++) {
			ready[i] = false;
			if (zmq_send(sock, ids[i], id_len[i], ZMQ_SNDMORE) < 0 ||
			    zmq_send(sock, "g", 1, 0) != 1) {
				fprintf(stderr, "zmq_raw: go: %s\n",
				    zmq_strerror(errno));
				goto out;
			}
		}
		while (got < total) {
			int i = recv_from(sock, ids, id_len, o.senders, &part);
			if (i < 0) {
				fprintf(stderr, "zmq_raw: recv failed\n");
				goto out;
			}
			if (sent[i] == o.bytes) {
				ready[i] = true; /* next rep's ready */
				continue;
			}
			sent[i] += zmq_msg_size(&part);
			got += zmq_msg_size(&part);
			sum += touch(zmq_msg_data(&part), zmq_msg_size(&part));
		}
		if (r < 0) {
			double t = fb_now_s() - t0;
			printf("warm-up %d: %" PRIu64 " bytes in %.6fs: %.1f MB/s\n",
			    r + o.warmup + 1, total, t, (double)total / t / 1e6);
			continue;
		}
		secs[r] = fb_now_s() - t0;
		printf("rep %d: %" PRIu64 " bytes from %d senders in %.6fs: "
		       "%.1f MB/s\n",
		    r + 1, total, o.senders, secs[r],
		    (double)total / secs[r] / 1e6);
	}
	qsort(secs, (size_t)o.reps, sizeof(secs[0]), cmp_double);
	{
		double med = o.reps % 2
		    ? secs[o.reps / 2]
		    : (secs[o.reps / 2 - 1] + secs[o.reps / 2]) / 2;
		printf("{\"senders\": %d, \"bytes\": %" PRIu64 ", \"msg_size\": "
		       "%" PRIu64 ", \"hwm\": %d, \"io_threads\": %d, \"warmup\": %d, \"reps\": %d, \"seconds\": %.6f, "
		       "\"mb_per_s\": %.1f, \"source\": \"%s\", \"malloc\": \"%s\", "
		       "\"checksum\": %" PRIu64 "}\n",
		    o.senders, total, o.msg_size, o.hwm, o.io_threads, o.warmup,
		    o.reps, med, (double)total / med / 1e6,
		    source_names[o.source], malloc_names[o.default_malloc],
		    sum);
	}
	rc = 0;
out:
	fflush(stdout);
	for (int i = 0; i < started; i++) {
		int st;
		if (rc != 0) {
			kill(pids[i], SIGTERM);
		}
		if (waitpid(pids[i], &st, 0) == pids[i] &&
		    !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && rc == 0) {
			fprintf(stderr, "zmq_raw: sender %d failed\n", i);
			rc = 1;
		}
	}
	zmq_msg_close(&part);
	if (sock != NULL) {
		zmq_close(sock);
	}
	if (ctx != NULL) {
		zmq_ctx_term(ctx);
	}
	return rc;
}
