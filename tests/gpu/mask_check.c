/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask_check.c -- the CUDA backend's secure-aggregation masks (its
 * mask_apply op) against the CPU reference, fb_mask_apply (libsodium's
 * ChaCha20), bit for bit, on a GPU machine.
 *
 * For 1, 2 and 9 terms (every role and both signs among them), on ranges
 * that start and end inside ChaCha20 blocks and on block edges, ranges of
 * several of the op's slices (more slices than it keeps in flight), ranges
 * whose block counter crosses 2^28, 2^31 and reaches the last block below
 * FB_MASK_MAX_ELEMS (2^36 elements: block counter 2^32 - 1), and count 0,
 * each on pageable and on page-locked host memory (the op's two copy
 * paths, each checked to have run): the op's output must equal
 * fb_mask_apply's on the same input word for word, and the words just
 * before and after the range must be untouched. One term is also checked
 * against crypto_stream_chacha20_ietf_xor_ic called here with the nonce
 * written out from crypto/crypto.h ("fbm" || role || LE32 round || 0^4).
 * Errors: a bad role or sign is FB_EINVAL, a range past the limit is
 * FB_ERANGE (before a bad term, as fb_mask_apply), each with the vector
 * untouched and the same code as fb_mask_apply; the op still works after
 * them. The cpu backend offers no mask op.
 *
 *   mask_check           all of the above
 *   mask_check --quick   a short run for compute-sanitizer: the libsodium
 *                        check, small ragged ranges, two slices, the limit
 *                        and the refusals
 *
 * Prints PASS/FAIL lines and a count; exits 1 on any failure, 2 on a bad
 * argument. Without a GPU it prints "SKIP: <reason>" and exits 77.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "common/log.h"
#include "common/util.h"
#include "crypto/crypto.h"
#include "data/data.h"
#include "model/model.h"
#include "worker/cuda/cuda.h"
#include "worker/trainer.h"

#define GUARD 64u /* words checked on each side of a range */
#define MAX_TERMS 9u

static int failures;
static int passes;
static const fb_trainer_backend *be;
static void *st;

static void
check(int ok, const char *what, const char *detail)
{
	printf("%s: %s%s%s\n", ok ? "PASS" : "FAIL", what,
	    detail[0] ? " -- " : "", detail);
	fflush(stdout);
	if (ok) {
		passes++;
	} else {
		failures++;
	}
}

/* Terms for a case: roles cycle 1, 2, 3 and signs alternate from a start
 * that `variant` moves, so that one-term cases see every role and sign
 * too; seeds are random. */
static void
make_terms(fb_mask_term *terms, uint32_t n, uint32_t variant, fb_rng *r)
{
	for (uint32_t t = 0; t < n; t++) {
		for (uint32_t b = 0; b < FB_MASK_SEED_LEN; b++) {
			terms[t].seed[b] = (uint8_t)fb_rng_u64(r);
		}
		terms[t].role = (uint8_t)(FB_MASK_SELF + (t + variant) % 3);
		terms[t].sign = (int8_t)((t + variant / 3) % 2 == 0 ? 1 : -1);
	}
}

/* First differing word of a and b over n words, or n. */
static uint64_t
first_diff(const uint32_t *a, const uint32_t *b, uint64_t n, uint64_t *ndiff)
{
	uint64_t first = n;

	*ndiff = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (a[i] != b[i]) {
			if (first == n) {
				first = i;
			}
			(*ndiff)++;
		}
	}
	return first;
}

/*
 * One comparison: v = random words with GUARD words on each side; the op
 * on a copy, fb_mask_apply on another; both must return FB_OK and agree on
 * every word, guards included (untouched by both).
 */
static void
compare(const char *what, uint64_t offset, uint64_t count, uint32_t nterms,
    uint32_t variant, int pinned)
{
	char name[256], detail[256] = "";
	uint64_t words = count + 2 * GUARD;
	uint32_t *gpu = fb_alloc(words * 4);
	uint32_t *cpu = fb_alloc(words * 4);
	fb_mask_term terms[MAX_TERMS];
	fb_cuda_mask_stats s0, s1;
	uint32_t round = 0x9e3779b9u ^ variant;
	fb_err rg = FB_OK, rc;
	uint64_t nd = 0, at;
	int registered = 0, path_ok;
	fb_rng r;

	snprintf(name, sizeof(name), "%s: offset %" PRIu64 ", count %" PRIu64
	    ", %u term%s, %s memory", what, offset, count, nterms,
	    nterms == 1 ? "" : "s", pinned ? "page-locked" : "pageable");
	if (gpu == NULL || cpu == NULL) {
		check(0, name, "out of host memory");
		goto out;
	}
	fb_rng_init(&r, offset ^ (count << 20) ^ nterms, variant + 1);
	for (uint64_t i = 0; i < words; i++) {
		gpu[i] = (uint32_t)fb_rng_u64(&r);
	}
	memcpy(cpu, gpu, words * 4);
	make_terms(terms, nterms, variant, &r);
	if (pinned) {
		if (fb_cuda_host_register(gpu, words * 4) != FB_OK) {
			check(0, name, "cudaHostRegister failed");
			goto out;
		}
		registered = 1;
	}
	fb_cuda_trainer_mask_stats(st, &s0);
	rg = be->mask_apply(st, gpu + GUARD, offset, count, terms, nterms,
	    round);
	fb_cuda_trainer_mask_stats(st, &s1);
	rc = fb_mask_apply(cpu + GUARD, offset, count, terms, nterms, round);
	at = first_diff(gpu, cpu, words, &nd);
	/* a non-empty call must have gone the way its memory asks */
	path_ok = count == 0 || nterms == 0 ||
	          (pinned ? s1.direct_slices > s0.direct_slices &&
	                        s1.staged_slices == s0.staged_slices
	                  : s1.staged_slices > s0.staged_slices &&
	                        s1.direct_slices == s0.direct_slices);
	if (rg != FB_OK || rc != FB_OK) {
		snprintf(detail, sizeof(detail), "op %s, fb_mask_apply %s",
		    fb_strerror(rg), fb_strerror(rc));
	} else if (nd != 0) {
		snprintf(detail, sizeof(detail), "%" PRIu64 " words differ, "
		    "first at %s%" PRId64, nd, at < GUARD ? "guard " : "",
		    (int64_t)at - (int64_t)GUARD);
	} else if (!path_ok) {
		snprintf(detail, sizeof(detail), "the %s copy path did not run",
		    pinned ? "direct" : "staged");
	}
	check(rg == FB_OK && rc == FB_OK && nd == 0 && path_ok, name, detail);
out:
	if (registered) {
		fb_cuda_host_unregister(gpu);
	}
	sodium_memzero(terms, sizeof(terms));
	fb_free(gpu);
	fb_free(cpu);
}

/* Every case for 1, 2 and 9 terms, on both kinds of memory. */
static void
compare_all(const char *what, uint64_t offset, uint64_t count)
{
	static const uint32_t nterms[] = {1, 2, 9};
	static uint32_t variant;

	for (int pinned = 0; pinned < 2; pinned++) {
		for (size_t k = 0; k < sizeof(nterms) / sizeof(nterms[0]);
		     k++) {
			compare(what, offset, count, nterms[k], variant++,
			    pinned);
		}
	}
}

/* The op against libsodium called directly with crypto.h's nonce. */
static void
check_documented_stream(int8_t sign)
{
	const uint64_t offset = 0x12345, count = 1000;
	uint64_t first = offset / 16, skip = offset % 16;
	uint64_t blocks = (skip + count + 15) / 16;
	uint32_t round = 0x01020304u;
	unsigned char *zero = calloc(blocks, 64);
	unsigned char *ks = calloc(blocks, 64);
	uint32_t *v = calloc(count, 4), *want = calloc(count, 4);
	unsigned char nonce[12] = {'f', 'b', 'm', FB_MASK_PAIR, 0x04, 0x03,
	    0x02, 0x01, 0, 0, 0, 0};
	fb_mask_term term;
	char name[128], detail[128] = "";
	uint64_t nd = 0, at = 0;
	fb_err rc = FB_EINVAL;
	fb_rng r;

	snprintf(name, sizeof(name), "one pairwise term (sign %+d) equals "
	    "crypto_stream_chacha20_ietf_xor_ic with crypto.h's nonce", sign);
	if (zero == NULL || ks == NULL || v == NULL || want == NULL) {
		check(0, name, "out of host memory");
		goto out;
	}
	fb_rng_init(&r, 77, (uint64_t)(sign + 2));
	for (int b = 0; b < FB_MASK_SEED_LEN; b++) {
		term.seed[b] = (uint8_t)fb_rng_u64(&r);
	}
	term.role = FB_MASK_PAIR;
	term.sign = sign;
	for (uint64_t i = 0; i < count; i++) {
		v[i] = (uint32_t)fb_rng_u64(&r);
	}
	crypto_stream_chacha20_ietf_xor_ic(ks, zero, blocks * 64, nonce,
	    (uint32_t)first, term.seed);
	for (uint64_t i = 0; i < count; i++) {
		const unsigned char *p = ks + 4 * (skip + i);
		uint32_t w = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
		             (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		want[i] = sign > 0 ? v[i] + w : v[i] - w;
	}
	rc = be->mask_apply(st, v, offset, count, &term, 1, round);
	at = first_diff(v, want, count, &nd);
	if (rc != FB_OK) {
		snprintf(detail, sizeof(detail), "%s", fb_strerror(rc));
	} else if (nd != 0) {
		snprintf(detail, sizeof(detail), "%" PRIu64 " words differ, "
		    "first at %" PRIu64, nd, at);
	}
	check(rc == FB_OK && nd == 0, name, detail);
out:
	sodium_memzero(&term, sizeof(term));
	sodium_memzero(ks, ks != NULL ? blocks * 64 : 0);
	free(zero);
	free(ks);
	free(v);
	free(want);
}

/* A refused call: the op and fb_mask_apply give `want`, v untouched. */
static void
check_refused(const char *what, uint64_t offset, uint64_t count,
    const fb_mask_term *terms, uint32_t nterms, fb_err want)
{
	uint32_t v[64], orig[64], ref[64];
	uint64_t nd = 0;
	char detail[128];
	fb_err rg, rc;

	for (uint32_t i = 0; i < 64; i++) {
		v[i] = orig[i] = ref[i] = 0x5a5a0000u + i;
	}
	/* (count may exceed v: a refused call must touch nothing) */
	rg = be->mask_apply(st, v, offset, count, terms, nterms, 1);
	rc = fb_mask_apply(ref, offset, count, terms, nterms, 1);
	(void)first_diff(v, orig, 64, &nd);
	snprintf(detail, sizeof(detail), "op %s, fb_mask_apply %s, %" PRIu64
	    " words changed", fb_strerror(rg), fb_strerror(rc), nd);
	check(rg == want && rc == want && nd == 0, what, detail);
}

static void
check_errors(void)
{
	fb_mask_term t[MAX_TERMS];
	fb_rng r;
	const uint64_t lim = FB_MASK_MAX_ELEMS;

	fb_rng_init(&r, 5, 5);
	make_terms(t, MAX_TERMS, 0, &r);
	t[0].role = 0;
	check_refused("role 0 is FB_EINVAL", 0, 16, t, 1, FB_EINVAL);
	t[0].role = 4;
	check_refused("role 4 is FB_EINVAL", 0, 16, t, 1, FB_EINVAL);
	t[0].role = FB_MASK_SELF;
	t[0].sign = 0;
	check_refused("sign 0 is FB_EINVAL", 3, 20, t, 1, FB_EINVAL);
	t[0].sign = 2;
	check_refused("sign 2 is FB_EINVAL", 3, 20, t, 1, FB_EINVAL);
	t[0].sign = -2;
	check_refused("sign -2 is FB_EINVAL", 3, 20, t, 1, FB_EINVAL);
	t[0].sign = 1;
	t[MAX_TERMS - 1].role = 9;
	check_refused("a bad ninth term refuses the whole call (FB_EINVAL)",
	    0, 64, t, MAX_TERMS, FB_EINVAL);
	check_refused("a bad term with count 0 is FB_EINVAL", 0, 0, t,
	    MAX_TERMS, FB_EINVAL);
	check_refused("offset past the limit with a bad term is FB_ERANGE "
	              "(range first)",
	    lim + 1, 0, t, MAX_TERMS, FB_ERANGE);
	t[MAX_TERMS - 1].role = FB_MASK_PAIR;
	check_refused("offset 2^36 + 1 is FB_ERANGE", lim + 1, 0, t, 1,
	    FB_ERANGE);
	check_refused("a range one past 2^36 is FB_ERANGE", lim - 10, 11, t, 2,
	    FB_ERANGE);
	check_refused("count 2^36 + 1 is FB_ERANGE", 0, lim + 1, t, 1,
	    FB_ERANGE);
	check_refused("offset + count overflowing 64 bits is FB_ERANGE", 1,
	    UINT64_MAX, t, 1, FB_ERANGE);
	check_refused("count 0 at offset 2^36 is fine", lim, 0, t, 2, FB_OK);
	check_refused("no terms is fine and changes nothing", 5, 40, t, 0,
	    FB_OK);
	sodium_memzero(t, sizeof(t));
	/* the state still works after the refusals */
	compare("after the refusals", 7, 1000, 2, 1, 0);
}

static fb_err
open_backend(fb_model **m, fb_dataset *d)
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
	return be->open(*m, d, &cfg, 4, &st);
}

int
main(int argc, char **argv)
{
	char why[256] = "";
	int quick = argc == 2 && strcmp(argv[1], "--quick") == 0;
	fb_model *m = NULL;
	fb_dataset d;
	const uint64_t lim = FB_MASK_MAX_ELEMS;
	const uint64_t mi = UINT64_C(1) << 20;
	fb_err rc;
	int ngpus;

	if (argc > 2 || (argc == 2 && !quick)) {
		fprintf(stderr, "usage: mask_check [--quick]\n");
		return 2;
	}
	fb_log_init("mask_check", FB_LOG_WARN);
	memset(&d, 0, sizeof(d));
	ngpus = fb_cuda_device_count(why, sizeof(why));
	if (ngpus <= 0) {
		printf("SKIP: GPU mask checks: %s\n", why);
		return 77;
	}
	if (sodium_init() < 0) {
		printf("FAIL: sodium_init\n");
		return 1;
	}
	be = fb_trainer_cuda_backend_v1();
	check(fb_trainer_cpu_backend.mask_apply == NULL,
	    "the cpu backend offers no mask op", "");
	check(be->mask_apply != NULL, "the cuda backend offers a mask op", "");
	if (be->mask_apply == NULL) {
		goto done;
	}
	if ((rc = open_backend(&m, &d)) != FB_OK) {
		check(0, "the cuda backend opens on GPU 0", fb_strerror(rc));
		goto done;
	}
	printf("mask_check: %d GPU(s), masks on GPU 0%s\n", ngpus,
	    quick ? ", quick" : "");

	check_documented_stream(1);
	check_documented_stream(-1);
	if (quick) {
		compare_all("ragged both ends", 3, 100);
		compare_all("two slices, ragged", mi - 5, mi + 10);
		compare_all("up to the limit (block 2^32 - 1)", lim - 1003,
		    1003);
		check_errors();
		goto done;
	}
	/* inside one block, up to and across block edges */
	compare_all("one word", 0, 1);
	compare_all("inside block 0", 0, 15);
	compare_all("one whole block", 0, 16);
	compare_all("one word past a block", 0, 17);
	compare_all("one word inside a block", 5, 1);
	compare_all("to the end of a block", 5, 11);
	compare_all("across one block edge", 5, 12);
	compare_all("ragged both ends", 3, 100);
	compare_all("whole blocks", 16, 32);
	compare_all("ragged, many blocks", 31, 1000);
	compare_all("ragged, odd offset", 1000003, 4097);
	/* the op moves slices of 2^20 words, 3 in flight */
	compare_all("across a slice edge", mi - 5, 10);
	compare_all("two slices, ragged", mi - 5, mi + 10);
	compare_all("eleven slices (slots reused)", 7, 10 * mi + 5);
	/* large block counters */
	compare_all("block counter across 2^28", (UINT64_C(1) << 32) - 37,
	    100);
	compare_all("block counter across 2^31", (UINT64_C(1) << 35) - 21, 64);
	compare_all("up to the limit (block 2^32 - 1)", lim - 1003, 1003);
	compare_all("the last block", lim - 16, 16);
	compare_all("the last word", lim - 1, 1);
	compare_all("slices ending at the limit", lim - mi - 9, mi + 9);
	/* nothing to do */
	compare_all("count 0", 0, 0);
	compare_all("count 0 at the limit", lim, 0);
	check_errors();
done:
	if (st != NULL) {
		be->close(st);
	}
	fb_dataset_fini(&d);
	fb_model_close(m);
	printf("mask_check: %d passed, %d failed\n", passes, failures);
	return failures == 0 ? 0 : 1;
}
