/* SPDX-License-Identifier: Apache-2.0 */
/*
 * util.h -- small shared helpers: clocks, allocation, whole-file and atomic
 * file writes, a seeded random generator, and byte-order helpers.
 */
#ifndef FB_COMMON_UTIL_H
#define FB_COMMON_UTIL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define FB_VERSION "0.1.0"
#define FB_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* fb_now_ms returns a monotonic clock in milliseconds. */
int64_t fb_now_ms(void);
/* fb_now_s returns a monotonic clock in seconds, with sub-ms resolution. */
double fb_now_s(void);
/* fb_sleep_ms sleeps; it may return early on a signal. */
void fb_sleep_ms(int64_t ms);

/* fb_alloc/fb_calloc return NULL on failure (callers map that to FB_ENOMEM).
 * Buffers of 4 KiB and more are 64-byte aligned so that kernels can
 * vectorise; those of 8 MiB and more are 2 MiB aligned and advised to the
 * kernel as huge-page memory (util.c). */
void *fb_alloc(size_t len);
void *fb_calloc(size_t count, size_t size);
void fb_free(void *p);

/*
 * fb_tune_malloc keeps freed buffers of up to `chunk_len` bytes (and a few
 * times more) in the heap instead of returning them to the kernel, so that
 * streaming ~1 MiB messages does not cost fresh page faults on every chunk.
 * A no-op outside glibc. Call once, early, before threads start.
 */
void fb_tune_malloc(size_t chunk_len);

/*
 * fb_stop_on_signals makes SIGINT and SIGTERM set the returned flag (and
 * interrupt blocking waits) instead of killing the process, and ignores
 * SIGPIPE. For a program's main(); call once.
 */
volatile sig_atomic_t *fb_stop_on_signals(void);

/* fb_peak_rss_bytes returns this process's peak resident set (VmHWM). */
uint64_t fb_peak_rss_bytes(void);
/* fb_mem_available_bytes returns the host's MemAvailable (0: unknown). */
uint64_t fb_mem_available_bytes(void);

/*
 * fb_file_write_atomic writes `len` bytes from up to `n` pieces to `path`
 * through a temporary file in the same folder, fsyncs it, renames it over
 * `path` and fsyncs the folder. On error `path` is left as it was.
 * Errors: FB_EIO (logged with the path and errno text).
 */
typedef struct fb_iovec {
	const void *base;
	size_t len;
} fb_iovec;
FB_MUST_CHECK fb_err fb_file_write_atomic(const char *path,
    const fb_iovec *pieces, size_t n);

/* fb_write_all writes all `len` bytes to `fd`, retrying short writes and
 * EINTR. Errors: FB_EIO (errno says why). */
FB_MUST_CHECK fb_err fb_write_all(int fd, const void *buf, size_t len);

/*
 * fb_file_read_all reads the whole file at `path` into a new buffer (*out,
 * released with fb_free; *len its bytes). Errors: FB_EIO (logged with the
 * path and errno text), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_file_read_all(const char *path, uint8_t **out,
    size_t *len);

/*
 * fb_remove_matching removes the plain files in folder `dir` whose names
 * contain `part` (every plain file when `part` is NULL) and returns how
 * many it removed. A missing folder removes nothing.
 */
unsigned fb_remove_matching(const char *dir, const char *part);

/* fb_mkdir_p creates `path` and its parents (mode 0755). Errors: FB_EIO. */
FB_MUST_CHECK fb_err fb_mkdir_p(const char *path);

/*
 * fb_rng is xoshiro256** seeded through splitmix64: fast, reproducible on
 * every platform, not for secrets (crypto/ uses libsodium for those).
 */
typedef struct fb_rng {
	uint64_t s[4];
} fb_rng;
void fb_rng_init(fb_rng *r, uint64_t seed, uint64_t stream);
uint64_t fb_rng_u64(fb_rng *r);
/* fb_rng_below returns a uniform integer in [0, n), n > 0, without bias. */
uint64_t fb_rng_below(fb_rng *r, uint64_t n);
/* fb_rng_uniform returns a double uniform in [0, 1). */
double fb_rng_uniform(fb_rng *r);
/* fb_rng_normal returns a standard normal deviate. */
double fb_rng_normal(fb_rng *r);
/* fb_rng_gamma returns a Gamma(shape, 1) deviate, shape > 0. */
double fb_rng_gamma(fb_rng *r, double shape);
/* fb_rng_shuffle_u32 shuffles `v` in place (Fisher-Yates). */
void fb_rng_shuffle_u32(fb_rng *r, uint32_t *v, size_t count);

static inline uint32_t
fb_load_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
	    ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void
fb_store_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static inline uint32_t
fb_load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
	    ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void
fb_store_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static inline uint64_t
fb_load_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--) {
		v = (v << 8) | p[i];
	}
	return v;
}

#endif
