/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask_bench.c -- speed of the secure-aggregation masks on the GPU (the
 * CUDA backend's mask_apply) against one CPU core, measured in one run.
 *
 *   mask_bench [--mib N] [--terms K]     (default: 1024 MiB, 4 terms)
 *
 * Rows (GB/s = keystream bytes, K x elements x 4, over seconds, 1e9):
 *   cpu core, chacha20   libsodium's crypto_stream_chacha20_ietf on one
 *                        thread, 256 MiB a call, best of 4
 *   cpu core, mask       fb_mask_apply with the K terms over the vector on
 *                        one thread (the CPU path, per core)
 *   gpu kernel           the mask kernel alone on the vector in device
 *                        memory, no copies: mean of 10 launches
 *   gpu op, pageable     mask_apply on the vector in ordinary host memory
 *                        (copies through the op's pinned stage), best of 3
 *   gpu op, page-locked  the same on the vector after cudaHostRegister
 *                        (direct copies), best of 3
 * and the time cudaHostRegister took on the vector. Then the ratios
 * kernel / cpu core chacha20 (issue 25's target: >= 50x) and op / cpu core.
 * The op's first result is compared with fb_mask_apply's on the same input,
 * word for word; a mismatch or an error exits 1.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/log.h"
#include "common/util.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"
#include "worker/cuda/cuda.h"
#include "worker/trainer.h"

#define MAX_TERMS 64u

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int
parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	unsigned long v;

	if (s == NULL || *s == '\0') {
		return -1;
	}
	v = strtoul(s, &end, 10);
	if (*end != '\0' || v < lo || v > hi) {
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* One CPU core's raw libsodium ChaCha20 (IETF) keystream rate, GB/s. */
static double
cpu_chacha_rate(void)
{
	const size_t len = (size_t)256 << 20;
	unsigned char *buf = fb_alloc(len);
	unsigned char key[32], nonce[12];
	double best = 0.0;

	if (buf == NULL) {
		return 0.0;
	}
	memset(key, 7, sizeof(key));
	memset(nonce, 3, sizeof(nonce));
	for (int i = 0; i < 4; i++) {
		double t0 = now_s();
		crypto_stream_chacha20_ietf(buf, len, nonce, key);
		double s = now_s() - t0;
		if (s > 0 && (double)len / s > best) {
			best = (double)len / s;
		}
	}
	fb_free(buf);
	return best / 1e9;
}

static fb_err
open_backend(const fb_trainer_backend *be, fb_model **m, fb_dataset *d,
    void **st)
{
	fb_model_spec spec;
	fb_trainer_config cfg;
	fb_err rc;

	memset(&spec, 0, sizeof(spec));
	memset(d, 0, sizeof(*d));
	snprintf(spec.arch, sizeof(spec.arch), "logreg");
	spec.input_dim = 4;
	spec.classes = 2;
	spec.task = FB_TASK_CLASSIFICATION;
	if ((rc = fb_model_open(&spec, m)) != FB_OK) {
		return rc;
	}
	d->x = fb_calloc(8 * 4, sizeof(float));
	d->y = fb_calloc(8, sizeof(fb_label));
	if (d->x == NULL || d->y == NULL) {
		return FB_ENOMEM;
	}
	d->count = 8;
	d->dim = 4;
	d->classes = 2;
	d->task = FB_TASK_CLASSIFICATION;
	memset(&cfg, 0, sizeof(cfg));
	cfg.device = FB_DEVICE_CUDA;
	cfg.math = FB_MATH_FP32;
	cfg.throttle = 1.0;
	cfg.gpu_count = 1;
	cfg.gpus[0] = 0;
	return be->open(*m, d, &cfg, 4, st);
}

/* Best of `runs` op calls on v; rc of the first failure. */
static fb_err
time_op(const fb_trainer_backend *be, void *st, uint32_t *v, uint64_t n,
    const fb_mask_term *terms, uint32_t k, int runs, double *best)
{
	fb_err rc = FB_OK;

	*best = 0.0;
	for (int i = 0; i < runs && rc == FB_OK; i++) {
		double t0 = now_s();
		rc = be->mask_apply(st, v, 3, n, terms, k, 1);
		double s = now_s() - t0;
		if (*best == 0.0 || s < *best) {
			*best = s;
		}
	}
	return rc;
}

static void
row(const char *what, double seconds, double bytes, double core)
{
	double gbs = seconds > 0 ? bytes / seconds / 1e9 : 0.0;

	printf("| %-34s | %9.4f | %9.2f | %8.1fx |\n", what, seconds, gbs,
	    core > 0 ? gbs / core : 0.0);
}

int
main(int argc, char **argv)
{
	const fb_trainer_backend *be = fb_trainer_cuda_backend_v1();
	uint32_t mib = 1024, k = 4;
	fb_mask_term terms[MAX_TERMS];
	fb_model *m = NULL;
	fb_dataset d;
	void *st = NULL;
	uint32_t *gpu = NULL, *cpu = NULL;
	char why[256] = "", desc[256] = "";
	double core, cpu_mask, kern, op_page = 0, op_lock = 0, reg = 0, t0;
	double ks_bytes;
	uint64_t n, diff = 0;
	int status = 1, registered = 0;
	fb_err rc;
	fb_rng r;

	memset(&d, 0, sizeof(d));
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc &&
		    parse_u32(argv[i + 1], 1, 65536, &mib) == 0) {
			i++;
		} else if (strcmp(argv[i], "--terms") == 0 && i + 1 < argc &&
		           parse_u32(argv[i + 1], 1, MAX_TERMS, &k) == 0) {
			i++;
		} else {
			fprintf(stderr, "mask_bench: bad argument %s (usage: "
			    "mask_bench [--mib 1..65536] [--terms 1..%u])\n",
			    argv[i], MAX_TERMS);
			return 2;
		}
	}
	fb_log_init("mask_bench", FB_LOG_WARN);
	if (fb_cuda_device_count(why, sizeof(why)) <= 0) {
		printf("SKIP: no GPU: %s\n", why);
		return 77;
	}
	if (sodium_init() < 0) {
		fprintf(stderr, "mask_bench: sodium_init failed\n");
		return 1;
	}
	if ((rc = open_backend(be, &m, &d, &st)) != FB_OK) {
		fprintf(stderr, "mask_bench: cannot open the CUDA backend: "
		    "%s\n", fb_strerror(rc));
		goto out;
	}
	be->describe(st, desc, sizeof(desc));
	n = (uint64_t)mib << 18; /* MiB of uint32 */
	ks_bytes = (double)k * (double)n * 4.0;
	gpu = fb_alloc(n * 4);
	cpu = fb_alloc(n * 4);
	if (gpu == NULL || cpu == NULL) {
		fprintf(stderr, "mask_bench: out of host memory\n");
		goto out;
	}
	fb_rng_init(&r, 25, 3);
	for (uint64_t i = 0; i < n; i++) {
		gpu[i] = (uint32_t)fb_rng_u64(&r);
	}
	memcpy(cpu, gpu, n * 4);
	for (uint32_t t = 0; t < k; t++) {
		for (int b = 0; b < FB_MASK_SEED_LEN; b++) {
			terms[t].seed[b] = (uint8_t)fb_rng_u64(&r);
		}
		terms[t].role = t == 0 ? FB_MASK_SELF : FB_MASK_PAIR;
		terms[t].sign = t % 2 == 0 ? 1 : -1;
	}

	core = cpu_chacha_rate();
	t0 = now_s();
	rc = fb_mask_apply(cpu, 3, n, terms, k, 1);
	cpu_mask = now_s() - t0;
	if (rc != FB_OK) {
		fprintf(stderr, "mask_bench: fb_mask_apply: %s\n",
		    fb_strerror(rc));
		goto out;
	}
	if ((rc = fb_cuda_trainer_mask_kernel(st, n, k, 10, &kern)) != FB_OK) {
		fprintf(stderr, "mask_bench: kernel: %s\n", fb_strerror(rc));
		goto out;
	}
	/* first op call: its result is checked against fb_mask_apply */
	t0 = now_s();
	rc = be->mask_apply(st, gpu, 3, n, terms, k, 1);
	op_page = now_s() - t0;
	if (rc != FB_OK) {
		fprintf(stderr, "mask_bench: op: %s\n", fb_strerror(rc));
		goto out;
	}
	for (uint64_t i = 0; i < n; i++) {
		diff += gpu[i] != cpu[i];
	}
	{
		double more;
		if ((rc = time_op(be, st, gpu, n, terms, k, 2, &more)) !=
		    FB_OK) {
			fprintf(stderr, "mask_bench: op: %s\n",
			    fb_strerror(rc));
			goto out;
		}
		op_page = more < op_page ? more : op_page;
	}
	t0 = now_s();
	if (fb_cuda_host_register(gpu, n * 4) == FB_OK) {
		reg = now_s() - t0;
		registered = 1;
		if ((rc = time_op(be, st, gpu, n, terms, k, 3, &op_lock)) !=
		    FB_OK) {
			fprintf(stderr, "mask_bench: op: %s\n",
			    fb_strerror(rc));
			goto out;
		}
	}

	printf("mask_bench: %u MiB vector (%" PRIu64 " elements, offset 3), "
	       "%u terms, %s\n", mib, n, k, desc);
	printf("| %-34s | %9s | %9s | %9s |\n", "what", "seconds",
	    "GB/s", "vs core");
	printf("|%s|%s|%s|%s|\n", "------------------------------------",
	    "-----------", "-----------", "-----------");
	row("cpu core, chacha20 (libsodium)", (double)(256u << 20) / (core *
	    1e9), (double)(256u << 20), core);
	row("cpu core, fb_mask_apply", cpu_mask, ks_bytes, core);
	row("gpu kernel (device memory)", kern, ks_bytes, core);
	row("gpu op, pageable vector", op_page, ks_bytes, core);
	if (registered) {
		row("gpu op, page-locked vector", op_lock, ks_bytes, core);
		printf("cudaHostRegister of the vector: %.4f s (%.2f GB/s)\n",
		    reg, reg > 0 ? (double)n * 4 / reg / 1e9 : 0.0);
	} else {
		printf("cudaHostRegister of the vector failed: no page-locked "
		       "row\n");
	}
	printf("ratio kernel / cpu core: %.1fx (target >= 50x: %s)\n",
	    kern > 0 ? ks_bytes / kern / 1e9 / core : 0.0,
	    kern > 0 && ks_bytes / kern / 1e9 / core >= 50.0 ? "met"
	                                                     : "NOT met");
	printf("ratio op / cpu core: %.1fx pageable", ks_bytes / op_page /
	    1e9 / core);
	if (registered) {
		printf(", %.1fx page-locked", ks_bytes / op_lock / 1e9 / core);
	}
	printf("\nop result equals fb_mask_apply: %s", diff == 0 ? "yes" :
	    "NO");
	if (diff != 0) {
		printf(" (%" PRIu64 " words differ)", diff);
	}
	printf("\n");
	status = diff == 0 ? 0 : 1;
out:
	if (registered) {
		fb_cuda_host_unregister(gpu);
	}
	sodium_memzero(terms, sizeof(terms));
	if (st != NULL) {
		be->close(st);
	}
	fb_free(gpu);
	fb_free(cpu);
	fb_dataset_fini(&d);
	fb_model_close(m);
	return status;
}
