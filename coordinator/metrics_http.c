/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_http.c -- the Prometheus endpoint (see metrics_http.h).
 *
 * All values live in one struct behind one mutex. The setters write a few
 * fields under it; a scrape (on libmicrohttpd's thread) copies the struct
 * and the used worker slots under it, then formats the text exposition
 * without holding it. The listening socket is made here (so that a taken
 * port or an unknown name is reported in our words) and handed to the
 * daemon, which runs one internal polling thread (epoll on Linux).
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/log.h"
#include "coordinator/metrics_http.h"

/* Upper bounds of the round-duration buckets, in seconds (+Inf implied). */
static const double round_buckets[] = {
    0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
#define NBUCKETS (sizeof(round_buckets) / sizeof(round_buckets[0]))

/* Upper bounds of the update-staleness buckets, in server steps. */
static const double stale_buckets[] = {0, 1, 2, 4, 8, 16, 32};
#define NSTALE (sizeof(stale_buckets) / sizeof(stale_buckets[0]))

/* One label set: distinct values, each with a number. */
typedef struct label_set {
	uint32_t count;
	char name[FB_METRICS_MAX_LABELS][FB_METRICS_LABEL_MAX];
	double value[FB_METRICS_MAX_LABELS];
} label_set;

typedef struct worker_slot {
	bool used;
	bool have_steps;
	char name[FB_METRICS_LABEL_MAX];
	double steps_per_s;
	uint64_t steps;
} worker_slot;

/* Everything a scrape shows except the worker slots. */
typedef struct values {
	uint32_t round;
	uint32_t rounds;
	int32_t phase; /* index into phases; -1 before the first */
	label_set phases;
	label_set statuses;             /* rounds ended, by status */
	uint64_t buckets[NBUCKETS + 1]; /* per bucket (not cumulative) */
	double round_sum;
	double test_acc, test_loss; /* NaN: not set */
	double fed_acc, fed_loss;
	uint64_t up, down;
	label_set workers;  /* by state */
	label_set rejected; /* by reason */
	double start_time;  /* unix seconds */
	uint32_t used_slots;
	/* round.mode async (shown once async_on) */
	bool async_on, async_secure;
	uint32_t version;
	uint64_t applied, dropped_stale, superseded, cohorts_failed;
	uint64_t stale[NSTALE + 1]; /* per bucket (not cumulative) */
	double stale_sum;
} values;

/* Kinds of setter failure, each logged once. */
enum { FAIL_FULL, FAIL_EMPTY, FAIL_SLOT, FAIL_KINDS_ };

struct fb_metrics {
	pthread_mutex_t mu;
	values v;           /* under mu */
	worker_slot *slots; /* under mu; max_workers of them */
	uint32_t max_workers;
	bool logged[FAIL_KINDS_]; /* under mu */
	/* The daemon's thread only (one internal thread serves all). */
	values snap;
	worker_slot *snap_slots;
	struct MHD_Daemon *daemon;
	int fd;
	uint16_t port;
};

/* ---- the listen address ----------------------------------------------- */

/*
 * split_listen splits HOST:PORT into host (brackets of an IPv6 address
 * removed) and port text. FB_EINVAL on anything else.
 */
static fb_err
split_listen(
    const char *s, char *host, size_t host_cap, char *port, size_t port_cap)
{
	const char *colon, *h = s, *p;
	size_t hlen;
	unsigned long v = 0;

	if (s == NULL || s[0] == '\0') {
		return FB_EINVAL;
	}
	if (s[0] == '[') {
		const char *close = strchr(s, ']');
		if (close == NULL || close[1] != ':' || close == s + 1) {
			return FB_EINVAL;
		}
		h = s + 1;
		hlen = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL || colon == s ||
		    memchr(s, ':', (size_t)(colon - s)) != NULL) {
			return FB_EINVAL; /* IPv6 needs brackets */
		}
		hlen = (size_t)(colon - s);
	}
	for (size_t i = 0; i < hlen; i++) {
		unsigned char c = (unsigned char)h[i];
		if (c <= ' ' || c >= 0x7f || c == '/' || c == '[' || c == ']') {
			return FB_EINVAL;
		}
	}
	p = colon + 1;
	if (*p == '\0' || strlen(p) > 5) {
		return FB_EINVAL;
	}
	for (const char *q = p; *q != '\0'; q++) {
		if (*q < '0' || *q > '9') {
			return FB_EINVAL;
		}
		v = v * 10 + (unsigned long)(*q - '0');
	}
	if (v > 65535 || hlen + 1 > host_cap || strlen(p) + 1 > port_cap) {
		return FB_EINVAL;
	}
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	memcpy(port, p, strlen(p) + 1);
	return FB_OK;
}

fb_err
fb_metrics_listen_check(const char *addr)
{
	char host[256], port[8];

	return split_listen(addr, host, sizeof(host), port, sizeof(port));
}

/* open_listener binds and listens on HOST:PORT; the socket in *fd. */
static fb_err
open_listener(const char *addr, int *fd, uint16_t *bound, int *family)
{
	fb_err rc = FB_EIO;
	char host[256], port[8];
	struct addrinfo hints, *res = NULL;
	int gai, err = 0;

	*fd = -1;
	if (split_listen(addr, host, sizeof(host), port, sizeof(port)) !=
	    FB_OK) {
		fb_log_error("metrics.listen '%.200s' is not HOST:PORT", addr);
		return FB_EINVAL;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	if ((gai = getaddrinfo(host, port, &hints, &res)) != 0) {
		fb_log_error("metrics.listen %s: cannot resolve %s: %s", addr,
		    host, gai_strerror(gai));
		goto out;
	}
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
		    ai->ai_protocol);
		int one = 1;
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);

		if (s < 0) {
			err = errno;
			continue;
		}
		(void)setsockopt(
		    s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(s, ai->ai_addr, ai->ai_addrlen) != 0 ||
		    listen(s, 64) != 0 ||
		    getsockname(s, (struct sockaddr *)&ss, &sl) != 0) {
			err = errno;
			close(s);
			continue;
		}
		*bound = ntohs(ss.ss_family == AF_INET6
		                   ? ((struct sockaddr_in6 *)&ss)->sin6_port
		                   : ((struct sockaddr_in *)&ss)->sin_port);
		*family = ss.ss_family;
		*fd = s;
		rc = FB_OK;
		break;
	}
	if (rc != FB_OK) {
		fb_log_error("metrics.listen %s: cannot listen: %s", addr,
		    strerror(err != 0 ? err : EADDRNOTAVAIL));
	}
out:
	if (res != NULL) {
		freeaddrinfo(res);
	}
	return rc;
}

/* ---- the exposition text ------------------------------------------------ */

typedef struct text {
	char *p;
	size_t len, cap;
	bool oom;
} text;

static void put(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
put(text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		if (t->oom) {
			return;
		}
		va_start(ap, fmt);
		n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->oom = true;
			return;
		}
		if ((size_t)n < t->cap - t->len) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap * 2 + (size_t)n;
		char *np = realloc(t->p, cap);
		if (np == NULL) {
			t->oom = true;
			return;
		}
		t->p = np;
		t->cap = cap;
	}
}

/* put_label writes a label value with \, " and line feed escaped. */
static void
put_label(text *t, const char *v)
{
	for (; *v != '\0'; v++) {
		if (*v == '\\') {
			put(t, "\\\\");
		} else if (*v == '"') {
			put(t, "\\\"");
		} else if (*v == '\n') {
			put(t, "\\n");
		} else {
			put(t, "%c", *v);
		}
	}
}

/* put_value writes a sample value: the shortest decimal that reads back
 * as the same double, or NaN / +Inf / -Inf. */
static void
put_value(text *t, double v)
{
	char buf[40];

	if (isnan(v)) {
		put(t, "NaN");
		return;
	}
	if (isinf(v)) {
		put(t, v > 0 ? "+Inf" : "-Inf");
		return;
	}
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v) {
			break;
		}
	}
	put(t, "%s", buf);
}

static void
put_head(text *t, const char *name, const char *type, const char *help)
{
	put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void
put_sample(
    text *t, const char *name, const char *label, const char *lv, double v)
{
	put(t, "%s", name);
	if (label != NULL) {
		put(t, "{%s=\"", label);
		put_label(t, lv);
		put(t, "\"}");
	}
	put(t, " ");
	put_value(t, v);
	put(t, "\n");
}

static void
put_set(text *t, const char *name, const char *type, const char *help,
    const char *label, const label_set *s)
{
	put_head(t, name, type, help);
	for (uint32_t i = 0; i < s->count; i++) {
		put_sample(t, name, label, s->name[i], s->value[i]);
	}
}

/* put_histogram writes histogram `name`'s buckets (counts per bucket,
 * made cumulative here), sum and count. */
static void
put_histogram(text *t, const char *name, const double *bounds, size_t n,
    const uint64_t *per, double sum)
{
	uint64_t cum = 0;

	for (size_t i = 0; i <= n; i++) {
		cum += per[i];
		put(t, "%s_bucket{le=\"", name);
		if (i < n) {
			put_value(t, bounds[i]);
		} else {
			put(t, "+Inf");
		}
		put(t, "\"} %llu\n", (unsigned long long)cum);
	}
	put(t, "%s_sum ", name);
	put_value(t, sum);
	put(t, "\n%s_count %llu\n", name, (unsigned long long)cum);
}

/* The round.mode async families. */
static void
render_async(text *t, const values *v)
{
	put_head(t, "fedbox_model_version", "gauge",
	    "Server steps applied to the global model (round.mode async).");
	put_sample(t, "fedbox_model_version", NULL, NULL, v->version);
	put_head(t, "fedbox_async_updates_total", "counter",
	    "Asynchronous updates by outcome: applied in a server step, "
	    "dropped past round.max_staleness, or their task superseded "
	    "(its model went before it was fetched).");
	put_sample(t, "fedbox_async_updates_total", "outcome", "applied",
	    (double)v->applied);
	put_sample(t, "fedbox_async_updates_total", "outcome",
	    "dropped_stale", (double)v->dropped_stale);
	put_sample(t, "fedbox_async_updates_total", "outcome", "superseded",
	    (double)v->superseded);
	put_head(t, "fedbox_async_update_staleness", "histogram",
	    "Staleness of each applied update: server steps between the "
	    "model it trained from and the step that applied it.");
	put_histogram(t, "fedbox_async_update_staleness", stale_buckets,
	    NSTALE, v->stale, v->stale_sum);
	if (v->async_secure) {
		put_head(t, "fedbox_async_cohorts_failed_total", "counter",
		    "Secure-aggregation cohorts that failed: fewer masked "
		    "inputs than their threshold, so no step.");
		put_sample(t, "fedbox_async_cohorts_failed_total", NULL, NULL,
		    (double)v->cohorts_failed);
	}
}

static void
render(text *t, const values *v, const worker_slot *slots, uint32_t nslots)
{
	put_head(t, "fedbox_round", "gauge",
	    "Current (or last) round, 1-based; 0 before the first.");
	put_sample(t, "fedbox_round", NULL, NULL, v->round);
	put_head(t, "fedbox_rounds_planned", "gauge",
	    "Rounds this run is configured for (round.rounds).");
	put_sample(t, "fedbox_rounds_planned", NULL, NULL, v->rounds);
	put_head(t, "fedbox_round_phase", "gauge",
	    "1 for the phase the current round is in, 0 for the others.");
	for (uint32_t i = 0; i < v->phases.count; i++) {
		put_sample(t, "fedbox_round_phase", "phase", v->phases.name[i],
		    (int32_t)i == v->phase ? 1 : 0);
	}
	put_set(t, "fedbox_rounds_total", "counter", "Rounds ended, by status.",
	    "status", &v->statuses);

	put_head(t, "fedbox_round_duration_seconds", "histogram",
	    "Wall time of each ended round, from its start to its commit or "
	    "failure.");
	put_histogram(t, "fedbox_round_duration_seconds", round_buckets,
	    NBUCKETS, v->buckets, v->round_sum);

	put_head(t, "fedbox_test_accuracy", "gauge",
	    "Test-set accuracy of the global model at the last evaluation "
	    "(0 to 1).");
	if (!isnan(v->test_acc)) {
		put_sample(t, "fedbox_test_accuracy", NULL, NULL, v->test_acc);
	}
	put_head(t, "fedbox_test_loss", "gauge",
	    "Test-set cross-entropy loss of the global model at the last "
	    "evaluation.");
	if (!isnan(v->test_loss)) {
		put_sample(t, "fedbox_test_loss", NULL, NULL, v->test_loss);
	}
	put_head(t, "fedbox_federated_accuracy", "gauge",
	    "Workers' sample-weighted accuracy on their own validation data "
	    "(federated evaluation) in the last round that had one (0 to 1).");
	if (!isnan(v->fed_acc)) {
		put_sample(
		    t, "fedbox_federated_accuracy", NULL, NULL, v->fed_acc);
	}
	put_head(t, "fedbox_federated_loss", "gauge",
	    "Workers' sample-weighted validation loss (federated evaluation) "
	    "in the last round that had one.");
	if (!isnan(v->fed_loss)) {
		put_sample(t, "fedbox_federated_loss", NULL, NULL, v->fed_loss);
	}

	put_head(t, "fedbox_upload_bytes_total", "counter",
	    "Bytes received from the workers.");
	put(t, "fedbox_upload_bytes_total %llu\n", (unsigned long long)v->up);
	put_head(t, "fedbox_download_bytes_total", "counter",
	    "Bytes sent to the workers.");
	put(t, "fedbox_download_bytes_total %llu\n",
	    (unsigned long long)v->down);

	put_set(t, "fedbox_workers", "gauge", "Workers by state.", "state",
	    &v->workers);
	put_set(t, "fedbox_rejected_messages_total", "counter",
	    "Messages rejected, by reason.", "reason", &v->rejected);

	put_head(t, "fedbox_worker_steps_per_second", "gauge",
	    "Each worker's local SGD steps per second in its last round.");
	for (uint32_t i = 0; i < nslots; i++) {
		put_sample(t, "fedbox_worker_steps_per_second", "worker",
		    slots[i].name, slots[i].steps_per_s);
	}
	put_head(t, "fedbox_worker_steps_total", "counter",
	    "Local SGD steps each worker reported (plain rounds only: secure "
	    "aggregation keeps them private).");
	for (uint32_t i = 0; i < nslots; i++) {
		if (slots[i].have_steps) {
			put_sample(t, "fedbox_worker_steps_total", "worker",
			    slots[i].name, (double)slots[i].steps);
		}
	}
	put_head(t, "fedbox_start_time_seconds", "gauge",
	    "When the coordinator started, in seconds since the Unix epoch.");
	put_sample(t, "fedbox_start_time_seconds", NULL, NULL, v->start_time);
	if (v->async_on) {
		render_async(t, v);
	}
}

/*
 * snapshot copies the values and the used worker slots under the mutex
 * into the daemon thread's own copies; returns the number of slots copied,
 * or -1 when memory ran out.
 */
static int64_t
snapshot(fb_metrics *m)
{
	uint32_t n = 0;

	pthread_mutex_lock(&m->mu);
	m->snap = m->v;
	for (uint32_t i = 0; i < m->max_workers && n < m->v.used_slots; i++) {
		if (m->slots[i].used) {
			m->snap_slots[n++] = m->slots[i];
		}
	}
	pthread_mutex_unlock(&m->mu);
	return n;
}

/* ---- HTTP ------------------------------------------------------------- */

static enum MHD_Result
reply(struct MHD_Connection *conn, unsigned int status, const char *body,
    const char *allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    strlen(body), (void *)(uintptr_t)body, MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ok;

	if (r == NULL) {
		return MHD_NO;
	}
	(void)MHD_add_response_header(
	    r, "Content-Type", "text/plain; charset=utf-8");
	if (allow != NULL) {
		(void)MHD_add_response_header(r, "Allow", allow);
	}
	ok = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ok;
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	fb_metrics *m = cls;
	struct MHD_Response *r;
	enum MHD_Result ok;
	text t = {0};
	int64_t n;

	(void)version;
	(void)upload_data;
	(void)con_cls;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		*upload_data_size = 0; /* a body is never read */
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
		    "only GET and HEAD are served\n", "GET, HEAD");
	}
	if (strcmp(url, "/metrics") != 0) {
		return reply(conn, MHD_HTTP_NOT_FOUND,
		    "not found: the metrics are at /metrics\n", NULL);
	}
	n = snapshot(m);
	t.cap = 4096 + (size_t)n * 256;
	if ((t.p = malloc(t.cap)) == NULL) {
		return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
		    "out of memory\n", NULL);
	}
	render(&t, &m->snap, m->snap_slots, (uint32_t)n);
	if (t.oom) {
		free(t.p);
		return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
		    "out of memory\n", NULL);
	}
	r = MHD_create_response_from_buffer(t.len, t.p, MHD_RESPMEM_MUST_FREE);
	if (r == NULL) {
		free(t.p);
		return MHD_NO;
	}
	(void)MHD_add_response_header(
	    r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ok;
}

static void
on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	size_t n;

	(void)cls;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) {
		msg[--n] = '\0';
	}
	fb_log_warn("metrics endpoint: %s", msg);
}

/* ---- lifecycle -------------------------------------------------------- */

fb_err
fb_metrics_alloc(const char *addr, uint32_t max_workers, fb_metrics **out)
{
	fb_err rc = FB_OK;
	fb_metrics *m = NULL;
	int family = AF_INET;
	unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;

	*out = NULL;
	if (max_workers == 0) {
		fb_log_error("metrics: max_workers must be > 0");
		return FB_EINVAL;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	m->fd = -1;
	pthread_mutex_init(&m->mu, NULL);
	m->max_workers = max_workers;
	m->slots = calloc(max_workers, sizeof(*m->slots));
	m->snap_slots = calloc(max_workers, sizeof(*m->snap_slots));
	if (m->slots == NULL || m->snap_slots == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	m->v.phase = -1;
	m->v.test_acc = m->v.test_loss = NAN;
	m->v.fed_acc = m->v.fed_loss = NAN;
	{
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		m->v.start_time = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	}
	if ((rc = open_listener(addr, &m->fd, &m->port, &family)) != FB_OK) {
		goto out;
	}
	if (family == AF_INET6) {
		flags |= MHD_USE_IPv6;
	}
	m->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, m,
	    MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, m, MHD_OPTION_LISTEN_SOCKET,
	    (MHD_socket)m->fd, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned int)FB_METRICS_MAX_CONNECTIONS,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)FB_METRICS_TIMEOUT_S,
	    MHD_OPTION_END);
	if (m->daemon == NULL) {
		fb_log_error(
		    "metrics.listen %s: the HTTP daemon did not start", addr);
		rc = FB_EIO;
		goto out;
	}
	fb_log_info("metrics: Prometheus endpoint at http://%s/metrics "
	            "(port %u)",
	    addr, (unsigned)m->port);
out:
	if (rc != FB_OK && m != NULL) {
		fb_metrics_free(m);
		m = NULL;
	}
	*out = m;
	return rc;
}

void
fb_metrics_free(fb_metrics *m)
{
	if (m == NULL) {
		return;
	}
	if (m->daemon != NULL) {
		/* Stops the thread and closes the listening socket. */
		MHD_stop_daemon(m->daemon);
	} else if (m->fd >= 0) {
		close(m->fd);
	}
	pthread_mutex_destroy(&m->mu);
	free(m->slots);
	free(m->snap_slots);
	free(m);
}

uint16_t
fb_metrics_port(const fb_metrics *m)
{
	return m->port;
}

/* ---- setters ---------------------------------------------------------- */

/* fail logs the first failure of a kind; mu is held. */
static fb_err
fail(fb_metrics *m, int kind, fb_err rc, const char *what)
{
	if (!m->logged[kind]) {
		m->logged[kind] = true;
		fb_log_warn(
		    "metrics: %s (further such cases are not logged)", what);
	}
	return rc;
}

/* label_index finds or adds `name` in `s`; mu is held. */
static fb_err
label_index(fb_metrics *m, label_set *s, const char *name, uint32_t *idx)
{
	char cut[FB_METRICS_LABEL_MAX];

	if (name == NULL || name[0] == '\0') {
		return fail(m, FAIL_EMPTY, FB_EINVAL, "an empty label value");
	}
	snprintf(cut, sizeof(cut), "%s", name);
	for (uint32_t i = 0; i < s->count; i++) {
		if (strcmp(s->name[i], cut) == 0) {
			*idx = i;
			return FB_OK;
		}
	}
	if (s->count == FB_METRICS_MAX_LABELS) {
		return fail(m, FAIL_FULL, FB_ENOMEM,
		    "a label set is full; a new value was not shown");
	}
	memcpy(s->name[s->count], cut, sizeof(cut));
	s->value[s->count] = 0;
	*idx = s->count++;
	return FB_OK;
}

fb_err
fb_metrics_set_round(
    fb_metrics *m, uint32_t round, uint32_t rounds, const char *phase)
{
	fb_err rc;
	uint32_t i = 0;

	pthread_mutex_lock(&m->mu);
	m->v.round = round;
	m->v.rounds = rounds;
	if ((rc = label_index(m, &m->v.phases, phase, &i)) == FB_OK) {
		m->v.phase = (int32_t)i;
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

fb_err
fb_metrics_round_done(fb_metrics *m, const char *status, double seconds)
{
	fb_err rc;
	uint32_t i = 0;
	size_t b = 0;

	pthread_mutex_lock(&m->mu);
	if ((rc = label_index(m, &m->v.statuses, status, &i)) == FB_OK) {
		m->v.statuses.value[i] += 1;
	}
	while (b < NBUCKETS && !(seconds <= round_buckets[b])) {
		b++;
	}
	m->v.buckets[b]++;
	m->v.round_sum += seconds;
	pthread_mutex_unlock(&m->mu);
	return rc;
}

void
fb_metrics_set_test(fb_metrics *m, double accuracy, double loss)
{
	pthread_mutex_lock(&m->mu);
	m->v.test_acc = accuracy;
	m->v.test_loss = loss;
	pthread_mutex_unlock(&m->mu);
}

void
fb_metrics_set_federated(fb_metrics *m, double accuracy, double loss)
{
	pthread_mutex_lock(&m->mu);
	m->v.fed_acc = accuracy;
	m->v.fed_loss = loss;
	pthread_mutex_unlock(&m->mu);
}

void
fb_metrics_add_bytes(fb_metrics *m, uint64_t up, uint64_t down)
{
	pthread_mutex_lock(&m->mu);
	m->v.up += up;
	m->v.down += down;
	pthread_mutex_unlock(&m->mu);
}

fb_err
fb_metrics_set_workers(fb_metrics *m, const char *state, uint32_t count)
{
	fb_err rc;
	uint32_t i = 0;

	pthread_mutex_lock(&m->mu);
	if ((rc = label_index(m, &m->v.workers, state, &i)) == FB_OK) {
		m->v.workers.value[i] = count;
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

fb_err
fb_metrics_add_rejected(fb_metrics *m, const char *reason, uint64_t count)
{
	fb_err rc;
	uint32_t i = 0;

	pthread_mutex_lock(&m->mu);
	if ((rc = label_index(m, &m->v.rejected, reason, &i)) == FB_OK) {
		m->v.rejected.value[i] += (double)count;
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

fb_err
fb_metrics_set_worker(
    fb_metrics *m, uint32_t slot, const char *name, double steps_per_s)
{
	fb_err rc = FB_OK;
	worker_slot *w;
	char cut[FB_METRICS_LABEL_MAX];

	pthread_mutex_lock(&m->mu);
	if (slot >= m->max_workers) {
		rc =
		    fail(m, FAIL_SLOT, FB_EINVAL, "a worker slot out of range");
		goto out;
	}
	if (name == NULL || name[0] == '\0') {
		rc = fail(m, FAIL_EMPTY, FB_EINVAL, "an empty label value");
		goto out;
	}
	w = &m->slots[slot];
	snprintf(cut, sizeof(cut), "%s", name);
	if (!w->used || strcmp(w->name, cut) != 0) {
		if (!w->used) {
			m->v.used_slots++;
		}
		memset(w, 0, sizeof(*w));
		w->used = true;
		memcpy(w->name, cut, sizeof(cut));
	}
	w->steps_per_s = steps_per_s;
out:
	pthread_mutex_unlock(&m->mu);
	return rc;
}

fb_err
fb_metrics_add_worker_steps(fb_metrics *m, uint32_t slot, uint64_t steps)
{
	fb_err rc = FB_OK;

	pthread_mutex_lock(&m->mu);
	if (slot >= m->max_workers || !m->slots[slot].used) {
		rc = fail(m, FAIL_SLOT, FB_EINVAL,
		    "steps for a worker slot out of range or without a name");
		goto out;
	}
	m->slots[slot].have_steps = true;
	m->slots[slot].steps += steps;
out:
	pthread_mutex_unlock(&m->mu);
	return rc;
}

void
fb_metrics_forget_worker(fb_metrics *m, uint32_t slot)
{
	pthread_mutex_lock(&m->mu);
	if (slot < m->max_workers && m->slots[slot].used) {
		memset(&m->slots[slot], 0, sizeof(m->slots[slot]));
		m->v.used_slots--;
	}
	pthread_mutex_unlock(&m->mu);
}

void
fb_metrics_async_start(fb_metrics *m, bool secure)
{
	pthread_mutex_lock(&m->mu);
	m->v.async_on = true;
	m->v.async_secure = secure;
	pthread_mutex_unlock(&m->mu);
}

void
fb_metrics_async_step(fb_metrics *m, uint32_t version,
    const uint32_t *staleness, uint32_t n, uint64_t dropped_stale,
    uint64_t superseded)
{
	pthread_mutex_lock(&m->mu);
	m->v.async_on = true;
	m->v.version = version;
	for (uint32_t i = 0; i < n; i++) {
		size_t b = 0;
		while (b < NSTALE && !((double)staleness[i] <= stale_buckets[b])) {
			b++;
		}
		m->v.stale[b]++;
		m->v.stale_sum += staleness[i];
	}
	m->v.applied += n;
	m->v.dropped_stale += dropped_stale;
	m->v.superseded += superseded;
	pthread_mutex_unlock(&m->mu);
}

void
fb_metrics_cohort_failed(fb_metrics *m)
{
	pthread_mutex_lock(&m->mu);
	m->v.cohorts_failed++;
	pthread_mutex_unlock(&m->mu);
}
