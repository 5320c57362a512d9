/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker_proc_test.c -- the trainer-process messages (worker/proc/wire.c):
 * tasks and layouts survive packing, every way a trainer's layout can
 * differ from the model's is refused with the tensor named, truncated and
 * hostile tables are refused without a crash, and the checked copy that
 * takes parameters back copies exactly and stops at the first NaN or
 * infinity wherever it lies.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/model.h"
#include "tests/unit/harness.h"
#include "worker/proc/proc_impl.h"

/* An MLP 6-4-3: fc1.weight [4, 6], fc1.bias [4], fc2.weight [3, 4],
 * fc2.bias [3]; 43 parameters. */
static fb_model *
small_mlp(void)
{
	fb_model_spec s;
	fb_model *m = NULL;

	memset(&s, 0, sizeof(s));
	strcpy(s.arch, "mlp");
	s.input_dim = 6;
	s.classes = 3;
	s.hidden[0] = 4;
	s.hidden_count = 1;
	assert_int_equal(fb_model_open(&s, &m), FB_OK);
	assert_int_equal(fb_model_param_count(m), 43);
	return m;
}

typedef struct lt_tensor {
	const char *name;
	uint8_t dtype, ndim;
	uint64_t shape[4];
	uint64_t offset;
} lt_tensor;

static const lt_tensor mlp_tensors[4] = {
    {"fc1.weight", FB_PROC_F32, 2, {4, 6}, 0},
    {"fc1.bias", FB_PROC_F32, 1, {4}, 24},
    {"fc2.weight", FB_PROC_F32, 2, {3, 4}, 28},
    {"fc2.bias", FB_PROC_F32, 1, {3}, 40},
};

/* pack_table writes a layout table of `n` tensors the way a trainer
 * would. */
static void
pack_table(fb_proc_buf *b, const lt_tensor *t, uint32_t n)
{
	b->len = 0;
	fb_proc_buf_u32(b, n);
	for (uint32_t i = 0; i < n; i++) {
		fb_proc_buf_str(b, t[i].name);
		fb_proc_buf_u8(b, t[i].dtype);
		fb_proc_buf_u8(b, t[i].ndim);
		for (uint32_t d = 0; d < t[i].ndim; d++) {
			fb_proc_buf_u64(b, t[i].shape[d]);
		}
		fb_proc_buf_u64(b, t[i].offset);
	}
	assert_false(b->oom);
}

/* check_table runs the layout check on `b` and returns its result, the
 * reason in `why`. */
static fb_err
check_table(const fb_proc_buf *b, const fb_model *m, char *why, size_t len)
{
	fb_proc_rd r = {.p = b->p, .left = b->len};
	return fb_proc_layout_check(&r, m, why, len);
}

static void
test_task_roundtrip(void **state)
{
	fb_proc_buf b = {0};
	fb_proc_task t = {.id = 7,
	    .kind = FB_PROC_TRAIN,
	    .round = 12,
	    .steps = 1ULL << 40,
	    .batch = 64,
	    .lr = 0.05,
	    .momentum = 0.9,
	    .weight_decay = 1e-4,
	    .prox_mu = 0.01,
	    .seed = 99,
	    .worker_index = 3};
	fb_proc_task u;
	fb_proc_rd r;
	uint32_t type, len;

	assert_int_equal(fb_proc_task_pack(&b, &t), FB_OK);
	memcpy(&len, b.p, 4);
	assert_int_equal(len, b.len - 4);
	assert_int_equal(fb_proc_msg_type(b.p + 4, len, &r, &type), FB_OK);
	assert_int_equal(type, FB_PROC_TASK);
	memset(&u, 0, sizeof(u));
	u.id = fb_proc_rd_u64(&r);
	u.kind = fb_proc_rd_u32(&r);
	u.round = fb_proc_rd_u32(&r);
	u.steps = fb_proc_rd_u64(&r);
	u.batch = fb_proc_rd_u32(&r);
	u.lr = fb_proc_rd_f64(&r);
	u.momentum = fb_proc_rd_f64(&r);
	u.weight_decay = fb_proc_rd_f64(&r);
	u.prox_mu = fb_proc_rd_f64(&r);
	u.seed = fb_proc_rd_u64(&r);
	u.worker_index = fb_proc_rd_u32(&r);
	assert_false(r.bad);
	assert_int_equal(r.left, 0);
	/* Field by field: the structs' padding is not part of the message. */
	assert_int_equal(u.id, t.id);
	assert_int_equal(u.kind, t.kind);
	assert_int_equal(u.round, t.round);
	assert_int_equal(u.steps, t.steps);
	assert_int_equal(u.batch, t.batch);
	assert_true(u.lr == t.lr && u.momentum == t.momentum &&
	            u.weight_decay == t.weight_decay && u.prox_mu == t.prox_mu);
	assert_int_equal(u.seed, t.seed);
	assert_int_equal(u.worker_index, t.worker_index);
	(void)fb_proc_rd_u8(&r);
	assert_true(r.bad); /* reading past the end sticks */
	fb_proc_buf_fini(&b);
}

static void
test_model_layout_passes(void **state)
{
	fb_model *m = small_mlp();
	fb_proc_buf b = {0};
	char why[256];

	fb_proc_layout_pack(&b, m);
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_OK);
	pack_table(&b, mlp_tensors, 4); /* what a trainer sends */
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_OK);
	fb_proc_buf_fini(&b);
	fb_model_close(m);
}

/* refused runs the check on a changed copy of the table and asserts that
 * it is refused with every string of `needles` in the reason. */
static void
refused(const fb_model *m, const lt_tensor *t, uint32_t n,
    const char *const *needles)
{
	fb_proc_buf b = {0};
	char why[256];

	pack_table(&b, t, n);
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	for (; *needles != NULL; needles++) {
		if (strstr(why, *needles) == NULL) {
			fail_msg("reason \"%s\" lacks \"%s\"", why, *needles);
		}
	}
	fb_proc_buf_fini(&b);
}

static void
test_layout_differences_named(void **state)
{
	fb_model *m = small_mlp();
	lt_tensor t[5];

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[2].name = "fc2.kernel";
	refused(m, t, 4,
	    (const char *const[]){
	        "tensor 2", "fc2.weight", "fc2.kernel", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[0].shape[0] = 6;
	t[0].shape[1] = 4; /* same count, transposed */
	refused(m, t, 4,
	    (const char *const[]){"fc1.weight", "[4, 6]", "[6, 4]", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[1].ndim = 2;
	t[1].shape[1] = 1;
	refused(m, t, 4, (const char *const[]){"fc1.bias", "[4, 1]", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[3].dtype = FB_PROC_I32;
	refused(m, t, 4, (const char *const[]){"fc2.bias", "I32", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[3].offset = 39;
	refused(m, t, 4, (const char *const[]){"fc2.bias", "39", "40", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	refused(m, t, 3, (const char *const[]){"fc2.bias", "missing", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[4] = (lt_tensor){"fc3.weight", FB_PROC_F32, 1, {2}, 43};
	refused(m, t, 5, (const char *const[]){"fc3.weight", NULL});

	memcpy(t, mlp_tensors, sizeof(mlp_tensors));
	t[0] = mlp_tensors[1];
	t[1] = mlp_tensors[0]; /* order swapped */
	refused(m, t, 4,
	    (const char *const[]){"tensor 0", "fc1.weight", "fc1.bias", NULL});
	fb_model_close(m);
}

static void
test_truncated_table_refused(void **state)
{
	fb_model *m = small_mlp();
	fb_proc_buf b = {0};
	char why[256];
	size_t full;

	pack_table(&b, mlp_tensors, 4);
	full = b.len;
	for (size_t len = 0; len < full; len++) {
		fb_proc_rd r = {.p = b.p, .left = len};
		assert_int_equal(
		    fb_proc_layout_check(&r, m, why, sizeof(why)), FB_EPROTO);
		assert_true(why[0] != '\0');
	}
	fb_proc_buf_u8(&b, 0); /* one byte too many */
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	assert_non_null(strstr(why, "follow"));
	fb_proc_buf_fini(&b);
	fb_model_close(m);
}

static void
test_hostile_table_refused(void **state)
{
	fb_model *m = small_mlp();
	fb_proc_buf b = {0};
	char why[256];
	char longname[300];

	/* A count of four billion tensors in a few bytes: refused at once. */
	fb_proc_buf_u32(&b, 0xffffffffu);
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	/* A plausible count with nothing behind it. */
	b.len = 0;
	fb_proc_buf_u32(&b, 1000);
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	/* Rank 0 and rank 9. */
	for (uint8_t ndim = 0; ndim < 10; ndim += 9) {
		b.len = 0;
		fb_proc_buf_u32(&b, 1);
		fb_proc_buf_str(&b, "fc1.weight");
		fb_proc_buf_u8(&b, FB_PROC_F32);
		fb_proc_buf_u8(&b, ndim);
		for (int i = 0; i < 10; i++) {
			fb_proc_buf_u64(&b, 4);
		}
		assert_int_equal(
		    check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	}
	/* A name longer than any tensor name, and one with a NUL in it. */
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	b.len = 0;
	fb_proc_buf_u32(&b, 1);
	fb_proc_buf_str(&b, longname);
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	b.len = 0;
	fb_proc_buf_u32(&b, 1);
	fb_proc_buf_u8(&b, 3);
	fb_proc_buf_u8(&b, 0);
	fb_proc_buf_bytes(&b, "f\0c", 3);
	assert_int_equal(check_table(&b, m, why, sizeof(why)), FB_EPROTO);
	fb_proc_buf_fini(&b);
	fb_model_close(m);
}

/* An EVAL as python/fedbox/_wire.py writes it; `name1` and `acc` vary. */
static fb_err
eval_try(const char *name1, double acc, double v1, bool extra_byte,
    fb_train_eval *ev)
{
	fb_proc_buf b = {0};
	fb_proc_rd r;
	uint32_t type;
	uint64_t id = 0;
	char why[256];
	fb_err rc;

	fb_proc_msg_begin(&b, FB_PROC_EVAL);
	fb_proc_buf_u64(&b, 9);
	fb_proc_buf_u64(&b, 2500);
	fb_proc_buf_f64(&b, 0.41);
	fb_proc_buf_f64(&b, acc);
	fb_proc_buf_u32(&b, 2);
	fb_proc_buf_str(&b, "f1");
	fb_proc_buf_f64(&b, 0.8);
	fb_proc_buf_str(&b, name1);
	fb_proc_buf_f64(&b, v1);
	if (extra_byte) {
		fb_proc_buf_u8(&b, 0);
	}
	assert_int_equal(fb_proc_msg_end(&b), FB_OK);
	assert_int_equal(
	    fb_proc_msg_type(b.p + 4, b.len - 4, &r, &type), FB_OK);
	assert_int_equal(type, FB_PROC_EVAL);
	rc = fb_proc_eval_unpack(&r, &id, ev, why, sizeof(why));
	if (rc == FB_OK) {
		assert_int_equal(id, 9);
	} else {
		assert_true(why[0] != '\0');
		assert_int_equal(ev->examples, 0);
	}
	fb_proc_buf_fini(&b);
	return rc;
}

static void
test_eval_reads_back_and_checks(void **state)
{
	fb_train_eval ev;

	assert_int_equal(eval_try("auc", 0.9, 0.7, false, &ev), FB_OK);
	assert_int_equal(ev.examples, 2500);
	assert_true(ev.loss == 0.41 && ev.accuracy == 0.9);
	assert_int_equal(ev.metric_count, 2);
	assert_string_equal(ev.name[1], "auc");
	assert_true(ev.value[0] == 0.8 && ev.value[1] == 0.7);
	/* no accuracy (regression) is fine */
	assert_int_equal(eval_try("auc", NAN, 0.7, false, &ev), FB_OK);
	assert_true(isnan(ev.accuracy));
	assert_int_equal(eval_try("auc", 1.5, 0.7, false, &ev), FB_EINVAL);
	assert_int_equal(eval_try("f1", 0.9, 0.7, false, &ev), FB_EINVAL);
	assert_int_equal(eval_try("", 0.9, 0.7, false, &ev), FB_EINVAL);
	assert_int_equal(eval_try("a\"b", 0.9, 0.7, false, &ev), FB_EINVAL);
	assert_int_equal(eval_try("auc", 0.9, INFINITY, false, &ev),
	    FB_EINVAL);
	assert_int_equal(eval_try("a_name_of_more_than_31_bytes_long", 0.9,
	                     0.7, false, &ev),
	    FB_EPROTO);
	assert_int_equal(eval_try("auc", 0.9, 0.7, true, &ev), FB_EPROTO);
}

static void
test_hello_is_exact(void **state)
{
	fb_proc_buf b = {0};
	fb_proc_hello h;
	uint8_t token[FB_PROC_TOKEN_LEN];
	fb_proc_rd r;
	uint32_t type;

	memset(token, 0xab, sizeof(token));
	fb_proc_msg_begin(&b, FB_PROC_HELLO);
	fb_proc_buf_u32(&b, FB_PROC_MAGIC);
	fb_proc_buf_u32(&b, FB_PROC_VERSION);
	fb_proc_buf_bytes(&b, token, sizeof(token));
	fb_proc_buf_u32(&b, 1234);
	fb_proc_buf_u32(&b, 8);
	fb_proc_buf_u64(&b, 60000);
	assert_int_equal(fb_proc_msg_end(&b), FB_OK);
	assert_int_equal(
	    fb_proc_msg_type(b.p + 4, b.len - 4, &r, &type), FB_OK);
	assert_int_equal(fb_proc_hello_unpack(&r, &h), FB_OK);
	assert_int_equal(h.magic, FB_PROC_MAGIC);
	assert_memory_equal(h.token, token, sizeof(token));
	assert_int_equal(h.pid, 1234);
	assert_int_equal(h.world, 8);
	assert_int_equal(h.examples, 60000);
	/* One byte short, and one byte long. */
	assert_int_equal(
	    fb_proc_msg_type(b.p + 4, b.len - 5, &r, &type), FB_OK);
	assert_int_equal(fb_proc_hello_unpack(&r, &h), FB_EPROTO);
	fb_proc_buf_u8(&b, 0);
	assert_int_equal(
	    fb_proc_msg_type(b.p + 4, b.len - 4, &r, &type), FB_OK);
	assert_int_equal(fb_proc_hello_unpack(&r, &h), FB_EPROTO);
	assert_int_equal(fb_proc_msg_type(b.p, 3, &r, &type), FB_EPROTO);
	fb_proc_buf_fini(&b);
}

static void
test_fail_reason_is_one_line(void **state)
{
	fb_proc_buf b = {0};
	const char text[] = "LayoutError: bad\nsecond line\x1b[31m";
	char reason[16];
	uint64_t id;
	bool fatal;
	fb_proc_rd r;

	fb_proc_buf_u64(&b, 5);
	fb_proc_buf_u8(&b, 1);
	fb_proc_buf_str(&b, text);
	r = (fb_proc_rd){.p = b.p, .left = b.len};
	assert_int_equal(
	    fb_proc_fail_unpack(&r, &id, &fatal, reason, sizeof(reason)),
	    FB_OK);
	assert_int_equal(id, 5);
	assert_true(fatal);
	assert_string_equal(reason, "LayoutError: ba"); /* cut to 15 */
	r = (fb_proc_rd){.p = b.p, .left = b.len};
	{
		char all[64];
		assert_int_equal(
		    fb_proc_fail_unpack(&r, &id, &fatal, all, sizeof(all)),
		    FB_OK);
		assert_null(strchr(all, '\n'));
		assert_null(strchr(all, '\x1b'));
		assert_non_null(strstr(all, "bad?second line?[31m"));
	}
	/* A length that says more than there is. */
	r = (fb_proc_rd){.p = b.p, .left = b.len - 1};
	assert_int_equal(
	    fb_proc_fail_unpack(&r, &id, &fatal, reason, sizeof(reason)),
	    FB_EPROTO);
	fb_proc_buf_fini(&b);
}

typedef uint64_t (*copy_fn)(float *, const float *, uint64_t);
/* Both loops: the one this CPU gets, and the one for CPUs without AVX2. */
static const copy_fn copies[] = {
    fb_proc_copy_checked, fb_proc_copy_checked_base};

/* One size below the non-temporal threshold and one above, each with an
 * unaligned destination too. */
static void
test_checked_copy_exact(void **state)
{
	const uint64_t sizes[] = {0, 1, 15, 17, 1000, (5u << 20) / 4 + 3};

	for (size_t si = 0; si < FB_ARRAY_LEN(sizes); si++) {
		uint64_t n = sizes[si];
		float *src = fb_alloc((n + 1) * sizeof(float));
		float *dst = fb_alloc((n + 2) * sizeof(float));
		fb_rng r;

		assert_non_null(src);
		assert_non_null(dst);
		fb_rng_init(&r, 3, n);
		for (uint64_t i = 0; i < n; i++) {
			src[i] = (float)fb_rng_normal(&r);
		}
		src[n / 2] = -0.0f;
		for (int shift = 0; shift < 4; shift++) {
			copy_fn copy = copies[shift / 2];
			memset(dst, 0xff, (n + 2) * sizeof(float));
			assert_int_equal(copy(dst + shift % 2, src, n), n);
			assert_memory_equal(
			    dst + shift % 2, src, n * sizeof(float));
			/* Nothing written past the end. */
			assert_true(isnan(dst[shift % 2 + n]));
		}
		fb_free(src);
		fb_free(dst);
	}
}

static void
test_checked_copy_finds_first_bad(void **state)
{
	const uint64_t n = (5u << 20) / 4 + 7; /* above the NT threshold */
	const uint64_t at[] = {
	    0, 1, 3, 15, 16, 17, 31, 32, 33, 63, 4096, n - 33, n - 17, n - 1};
	const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
	float *src = fb_calloc(n, sizeof(float));
	float *dst = fb_alloc((n + 1) * sizeof(float));

	assert_non_null(src);
	assert_non_null(dst);
	for (size_t b = 0; b < FB_ARRAY_LEN(bad); b++) {
		for (size_t k = 0; k < FB_ARRAY_LEN(at); k++) {
			src[at[k]] = bad[b];
			/* A second bad value later does not hide the first. */
			if (at[k] + 5 < n) {
				src[at[k] + 5] = NAN;
			}
			for (size_t c = 0; c < FB_ARRAY_LEN(copies); c++) {
				assert_int_equal(copies[c](dst, src, n), at[k]);
				assert_int_equal(
				    copies[c](dst + 1, src, n), at[k]);
			}
			src[at[k]] = 1.0f;
			if (at[k] + 5 < n) {
				src[at[k] + 5] = 1.0f;
			}
		}
	}
	/* The largest finite float passes. */
	src[n - 1] = 3.4028235e38f;
	assert_int_equal(fb_proc_copy_checked(dst, src, n), n);
	assert_int_equal(fb_proc_copy_checked_base(dst, src, n), n);
	fb_free(src);
	fb_free(dst);
}

static void
test_parallel_copy_matches(void **state)
{
	const uint64_t n = 1000003;
	float *src = fb_alloc(n * sizeof(float));
	float *dst = fb_alloc(n * sizeof(float));
	const uint64_t at[] = {0, 15, 16, 250000, 250001, 500016, n - 1};
	fb_rng r;

	assert_non_null(src);
	assert_non_null(dst);
	fb_rng_init(&r, 5, 0);
	for (uint64_t i = 0; i < n; i++) {
		src[i] = (float)fb_rng_normal(&r);
	}
	for (uint32_t t = 1; t <= 7; t++) {
		memset(dst, 0, n * sizeof(float));
		assert_int_equal(fb_proc_copy_par(dst, src, n, false, t), n);
		assert_memory_equal(dst, src, n * sizeof(float));
		memset(dst, 0, n * sizeof(float));
		assert_int_equal(fb_proc_copy_par(dst, src, n, true, t), n);
		assert_memory_equal(dst, src, n * sizeof(float));
		for (size_t k = 0; k < FB_ARRAY_LEN(at); k++) {
			float keep = src[at[k]], later = src[n - 1];
			src[at[k]] = INFINITY;
			src[n - 1] =
			    NAN; /* another bad value, in the last slice */
			if (at[k] == n - 1) {
				src[n - 1] = INFINITY;
			}
			assert_int_equal(
			    fb_proc_copy_par(dst, src, n, true, t), at[k]);
			src[at[k]] = keep;
			src[n - 1] = later;
		}
	}
	/* Auto: tiny copies stay on one thread; a count is never 0. */
	assert_int_equal(fb_proc_copy_threads(1000, 0), 1);
	assert_int_equal(fb_proc_copy_threads(1000, 8), 1);
	assert_true(fb_proc_copy_threads(1ULL << 32, 0) <= 8);
	assert_int_equal(fb_proc_copy_threads(1ULL << 32, 64), 16);
	fb_free(src);
	fb_free(dst);
}

static void
test_oversized_message_refused(void **state)
{
	fb_proc_buf b = {0};
	static char big[FB_PROC_MSG_MAX / 2];

	memset(big, 'x', sizeof(big));
	fb_proc_msg_begin(&b, FB_PROC_FAIL);
	fb_proc_buf_bytes(&b, big, sizeof(big));
	fb_proc_buf_bytes(&b, big, sizeof(big));
	assert_int_equal(fb_proc_msg_end(&b), FB_ERANGE);
	fb_proc_buf_fini(&b);
}

FB_TESTS = {
    {"an evaluation reads back and bad values are refused by name",
        test_eval_reads_back_and_checks},
    {"a task survives packing and reads back field for field",
        test_task_roundtrip},
    {"the model's own layout passes the layout check",
        test_model_layout_passes},
    {"a renamed, reshaped, retyped, moved, missing, extra or reordered "
     "tensor is refused and named",
        test_layout_differences_named},
    {"a layout table cut short anywhere, or with bytes after it, is refused",
        test_truncated_table_refused},
    {"hostile counts, ranks and names in a layout table are refused",
        test_hostile_table_refused},
    {"a hello one byte short or long is refused", test_hello_is_exact},
    {"a trainer's failure reason is one line, cut to size",
        test_fail_reason_is_one_line},
    {"the checked copy copies every size exactly, aligned or not",
        test_checked_copy_exact},
    {"the checked copy stops at the first NaN or infinity wherever it is",
        test_checked_copy_finds_first_bad},
    {"copies on 1 to 7 threads are exact and find the first bad value",
        test_parallel_copy_matches},
    {"a message over the size limit is not built",
        test_oversized_message_refused},
    {NULL, NULL},
};

FB_TEST_MAIN("worker_proc")
