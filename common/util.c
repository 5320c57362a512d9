/* SPDX-License-Identifier: Apache-2.0 */
/* util.c -- clocks, allocation, atomic file writes, the seeded PRNG. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"

int64_t
fb_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double
fb_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void
fb_sleep_ms(int64_t ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/*
 * Buffers of 8 MiB and more (models, updates, accumulators) start on a
 * 2 MiB boundary and ask the kernel for transparent huge pages, which it
 * grants where THP is "always" or "madvise" (in the latter mode, as on our
 * build VM and the device hosts, only madvise'd memory gets them). Each
 * round streams through several such buffers: with 4 KiB pages every 4 KiB
 * is a page fault on first touch and, where the host samples accessed bits
 * (DAMON, shadow page tables), a trap. On our 2-CPU VM, 1e8 parameters and
 * two workers: the coordinator came up in 0.85 s instead of 3.4 s, the
 * first round took 4.4 s instead of 9.1 s, the host's page sampler used a
 * third as much CPU; steady-state rounds did not change beyond the noise
 * (bench/RESULTS.md). Only whole 2 MiB pages inside the buffer are
 * advised, so no neighbour is affected; where THP is off or absent nothing
 * changes.
 */
#define HUGE_MIN ((size_t)8 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

void *
fb_alloc(size_t len)
{
	void *p = NULL;
	if (len == 0) {
		len = 1;
	}
	if (len < 4096) {
		return malloc(len);
	}
	if (posix_memalign(&p, len >= HUGE_MIN ? HUGE_PAGE : 64, len) != 0) {
		return NULL;
	}
#ifdef MADV_HUGEPAGE
	if (len >= HUGE_MIN) {
		(void)madvise(p, len & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
	}
#endif
	return p;
}

void *
fb_calloc(size_t count, size_t size)
{
	void *p;
	if (size != 0 && count > SIZE_MAX / size) {
		return NULL;
	}
	if ((p = fb_alloc(count * size)) != NULL) {
		memset(p, 0, count * size);
	}
	return p;
}

void
fb_free(void *p)
{
	free(p);
}

void
fb_tune_malloc(size_t chunk_len)
{
#ifdef __GLIBC__
	/* glibc serves blocks above the mmap threshold with fresh mappings
	 * and unmaps them on free: every 1 MiB ZeroMQ message then faults in
	 * its pages anew. Above the chunk size, and a generous trim
	 * threshold, keep them in the heap. */
	size_t mmap_min = chunk_len * 4 > (size_t)4 << 20 ? chunk_len * 4
	                                                  : (size_t)4 << 20;
	if (mmap_min > (size_t)32 << 20) {
		mmap_min = (size_t)32 << 20; /* glibc's own upper bound */
	}
	(void)mallopt(M_MMAP_THRESHOLD, (int)mmap_min);
	(void)mallopt(M_TRIM_THRESHOLD, 512 << 20);
#else
	(void)chunk_len;
#endif
}

static volatile sig_atomic_t stop_flag;

static void
on_stop_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

volatile sig_atomic_t *
fb_stop_on_signals(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	return &stop_flag;
}

/* The "NAME: N kB" line of a /proc file, in bytes; 0 without one. */
static uint64_t
proc_kb(const char *path, const char *name)
{
	char line[256];
	unsigned long long kb = 0;
	size_t n = strlen(name);
	FILE *f = fopen(path, "r");

	if (f == NULL) {
		return 0;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, name, n) == 0 && line[n] == ':' &&
		    sscanf(line + n + 1, "%llu", &kb) == 1) {
			break;
		}
	}
	fclose(f);
	return (uint64_t)kb * 1024;
}

uint64_t
fb_peak_rss_bytes(void)
{
	return proc_kb("/proc/self/status", "VmHWM");
}

uint64_t
fb_mem_available_bytes(void)
{
	return proc_kb("/proc/meminfo", "MemAvailable");
}

fb_err
fb_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t k = write(fd, p, len);
		if (k < 0) {
			if (errno == EINTR) {
				continue;
			}
			return FB_EIO;
		}
		p += k;
		len -= (size_t)k;
	}
	return FB_OK;
}

fb_err
fb_file_write_atomic(const char *path, const fb_iovec *pieces, size_t n)
{
	fb_err rc = FB_OK;
	char tmp[4096], dir[4096];
	int fd = -1, dfd = -1;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >=
	    (int)sizeof(tmp)) {
		fb_log_error("%s: path too long", path);
		return FB_EINVAL;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fb_log_error("cannot create %s: %s", tmp, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (fb_write_all(fd, pieces[i].base, pieces[i].len) != FB_OK) {
			fb_log_error("cannot write %s: %s", tmp,
			    strerror(errno));
			rc = FB_EIO;
			goto out;
		}
	}
	if (fsync(fd) != 0) {
		fb_log_error("cannot fsync %s: %s", tmp, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	if (close(fd) != 0) {
		fd = -1;
		fb_log_error("cannot close %s: %s", tmp, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	fd = -1;
	if (rename(tmp, path) != 0) {
		fb_log_error("cannot rename %s to %s: %s", tmp, path,
		    strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd);
		close(dfd);
	}
out:
	if (fd >= 0) {
		close(fd);
	}
	if (rc != FB_OK) {
		(void)unlink(tmp);
	}
	return rc;
}

fb_err
fb_file_read_all(const char *path, uint8_t **out, size_t *len)
{
	fb_err rc = FB_OK;
	struct stat st;
	uint8_t *b = NULL;
	size_t got = 0;
	int fd;

	*out = NULL;
	*len = 0;
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		fb_log_error("cannot open %s: %s", path, strerror(errno));
		return FB_EIO;
	}
	if (fstat(fd, &st) != 0) {
		fb_log_error("cannot stat %s: %s", path, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	if ((b = fb_alloc((size_t)st.st_size > 0 ? (size_t)st.st_size : 1)) ==
	    NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0) {
			fb_log_error("cannot read %s: %s", path,
			    n < 0 ? strerror(errno) : "file shrank while read");
			rc = FB_EIO;
			goto out;
		}
		got += (size_t)n;
	}
	*out = b;
	*len = got;
	b = NULL;
out:
	fb_free(b);
	close(fd);
	return rc;
}

unsigned
fb_remove_matching(const char *dir, const char *part)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	unsigned n = 0;

	if (d == NULL) {
		return 0;
	}
	while ((e = readdir(d)) != NULL) {
		char path[4096];
		struct stat st;
		if ((part != NULL && strstr(e->d_name, part) == NULL) ||
		    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >=
		        (int)sizeof(path) ||
		    lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
			continue;
		}
		n += unlink(path) == 0;
	}
	closedir(d);
	return n;
}

fb_err
fb_mkdir_p(const char *path)
{
	char buf[4096];
	size_t len = strlen(path);

	if (len == 0 || len >= sizeof(buf)) {
		return FB_EINVAL;
	}
	memcpy(buf, path, len + 1);
	for (size_t i = 1; i <= len; i++) {
		if (buf[i] == '/' || buf[i] == '\0') {
			char c = buf[i];
			buf[i] = '\0';
			if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
				fb_log_error("cannot create folder %s: %s", buf,
				    strerror(errno));
				return FB_EIO;
			}
			buf[i] = c;
		}
	}
	return FB_OK;
}

/* ---- xoshiro256** seeded by splitmix64 ---- */

static uint64_t
splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void
fb_rng_init(fb_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed ^ (stream * 0xd1342543de82ef95ULL);
	(void)splitmix64(&x);
	x ^= stream;
	for (int i = 0; i < 4; i++) {
		r->s[i] = splitmix64(&x);
	}
}

static inline uint64_t
rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t
fb_rng_u64(fb_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

uint64_t
fb_rng_below(fb_rng *r, uint64_t n)
{
	/* Rejection sampling: draws below the largest multiple of n. */
	uint64_t limit = UINT64_MAX - UINT64_MAX % n;
	uint64_t x;
	FB_ASSERT(n > 0);
	do {
		x = fb_rng_u64(r);
	} while (x >= limit);
	return x % n;
}

double
fb_rng_uniform(fb_rng *r)
{
	return (double)(fb_rng_u64(r) >> 11) * 0x1.0p-53;
}

double
fb_rng_normal(fb_rng *r)
{
	/* Box-Muller; one deviate per call keeps the stream simple. */
	double u1, u2;
	do {
		u1 = fb_rng_uniform(r);
	} while (u1 <= 0.0);
	u2 = fb_rng_uniform(r);
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double
fb_rng_gamma(fb_rng *r, double shape)
{
	/* Marsaglia and Tsang (2000); shape < 1 via the boost
	 * Gamma(a) = Gamma(a + 1) * U^(1/a). */
	double d, c, x, v, u;
	if (shape < 1.0) {
		double g = fb_rng_gamma(r, shape + 1.0);
		do {
			u = fb_rng_uniform(r);
		} while (u <= 0.0);
		return g * pow(u, 1.0 / shape);
	}
	d = shape - 1.0 / 3.0;
	c = 1.0 / sqrt(9.0 * d);
	for (;;) {
		do {
			x = fb_rng_normal(r);
			v = 1.0 + c * x;
		} while (v <= 0.0);
		v = v * v * v;
		u = fb_rng_uniform(r);
		if (u < 1.0 - 0.0331 * x * x * x * x) {
			return d * v;
		}
		if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) {
			return d * v;
		}
	}
}

void
fb_rng_shuffle_u32(fb_rng *r, uint32_t *v, size_t count)
{
	for (size_t i = count; i > 1; i--) {
		size_t j = (size_t)fb_rng_below(r, i);
		uint32_t t = v[i - 1];
		v[i - 1] = v[j];
		v[j] = t;
	}
}
