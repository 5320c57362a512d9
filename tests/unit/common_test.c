/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common_test.c -- unit tests of common/: the YAML config loader (every
 * type, unit and error, with the logged message checked for file:line:col
 * and the key) and the utilities in util.h (random generator, atomic file
 * writes, large allocations).
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "common/pool.h"
#include "common/util.h"
#include "tests/unit/harness.h"

/* ---- a test schema ------------------------------------------------------ */

typedef struct tcfg {
	int64_t rounds;
	int64_t deadline_ms;
	double lr;
	bool secure;
	char *name;
	uint64_t max_msg;
	int partition;
	fb_cfg_int_list hidden;
	fb_cfg_str_list peers;
	int64_t offset;
} tcfg;

static const char *const partitions[] = {"iid", "dirichlet", "shards", NULL};

#define NOB 1, 0 /* no bounds */

static const fb_cfg_field schema[] = {
    {"round.rounds", FB_CFG_INT, offsetof(tcfg, rounds), "10", 1, 100000, NULL,
        "rounds to run"},
    {"round.deadline", FB_CFG_DURATION, offsetof(tcfg, deadline_ms), "30s", 0,
        3600000, NULL, "time a round waits for updates"},
    {"train.lr", FB_CFG_FLOAT, offsetof(tcfg, lr), "0.1", 0, 10, NULL,
        "learning rate"},
    {"secure", FB_CFG_BOOL, offsetof(tcfg, secure), "true", NOB, NULL,
        "secure aggregation on or off"},
    {"name", FB_CFG_STRING, offsetof(tcfg, name), "fedbox", NOB, NULL,
        "a name | with a pipe"},
    {"net.max_msg", FB_CFG_SIZE, offsetof(tcfg, max_msg), "4MiB", 1024,
        1099511627776.0, NULL, "largest message"},
    {"data.partition", FB_CFG_ENUM, offsetof(tcfg, partition), "iid", NOB,
        partitions, "how data is split"},
    {"train.hidden", FB_CFG_INT_LIST, offsetof(tcfg, hidden), "[256, 128]", 1,
        4096, NULL, "hidden layer widths"},
    {"net.peers", FB_CFG_STR_LIST, offsetof(tcfg, peers), "", NOB, NULL,
        "peer addresses"},
    {"offset", FB_CFG_INT, offsetof(tcfg, offset), "-5", NOB, NULL,
        "an unbounded integer"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct rcfg {
	char *address;
	int64_t id;
	int64_t port;
} rcfg;

static const fb_cfg_field req_schema[] = {
    {"coordinator.address", FB_CFG_STRING, offsetof(rcfg, address), NULL, NOB,
        NULL, "where to connect"},
    {"worker.id", FB_CFG_INT, offsetof(rcfg, id), NULL, 0, 1000, NULL,
        "this worker's id"},
    {"worker.port", FB_CFG_INT, offsetof(rcfg, port), "5555", 1, 65535, NULL,
        "port"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* ---- capturing stderr --------------------------------------------------- */

typedef struct capture {
	int saved;
	char path[600];
	char text[8192];
} capture;

static void
capture_begin(capture *cap)
{
	int fd;
	snprintf(
	    cap->path, sizeof(cap->path), "%s/stderr.XXXXXX", fb_test_tmpdir());
	fd = mkstemp(cap->path);
	assert_true(fd >= 0);
	fflush(stderr);
	cap->saved = dup(STDERR_FILENO);
	assert_true(cap->saved >= 0);
	assert_true(dup2(fd, STDERR_FILENO) >= 0);
	close(fd);
}

static void
capture_end(capture *cap)
{
	FILE *f;
	size_t n;
	fflush(stderr);
	assert_true(dup2(cap->saved, STDERR_FILENO) >= 0);
	close(cap->saved);
	f = fopen(cap->path, "rb");
	assert_non_null(f);
	n = fread(cap->text, 1, sizeof(cap->text) - 1, f);
	cap->text[n] = '\0';
	fclose(f);
	unlink(cap->path);
}

static size_t
count_lines(const char *s)
{
	size_t n = 0;
	for (; *s != '\0'; s++) {
		n += *s == '\n';
	}
	return n;
}

static fb_err
load(const char *yaml, tcfg *c)
{
	return fb_cfg_load_string("t.yaml", yaml, strlen(yaml), schema, c);
}

/*
 * expect_error loads `yaml`, which must fail with FB_ECONFIG and one logged
 * line holding `where` (e.g. "t.yaml:4:3:") and each of `what`, `what2`.
 */
static void
expect_error_in(const fb_cfg_field *sch, void *out, const char *yaml,
    size_t len, const char *where, const char *what, const char *what2)
{
	capture cap;
	fb_err rc;

	capture_begin(&cap);
	rc = fb_cfg_load_string("t.yaml", yaml, len, sch, out);
	capture_end(&cap);
	if (rc != FB_ECONFIG || strstr(cap.text, where) == NULL ||
	    (what != NULL && strstr(cap.text, what) == NULL) ||
	    (what2 != NULL && strstr(cap.text, what2) == NULL) ||
	    count_lines(cap.text) != 1) {
		print_error("yaml: %s\nrc %d, log: %s\nwanted: %s %s %s\n",
		    yaml, (int)rc, cap.text, where, what ? what : "",
		    what2 ? what2 : "");
		fail();
	}
}

static void
expect_error(
    const char *yaml, const char *where, const char *what, const char *what2)
{
	tcfg c;
	memset(&c, 0xa5, sizeof(c)); /* garbage in must not be freed */
	expect_error_in(schema, &c, yaml, strlen(yaml), where, what, what2);
	/* After an error the heap fields have been released. */
	assert_null(c.name);
	assert_int_equal(c.peers.count, 0);
}

/* ---- config: values ----------------------------------------------------- */
/* A duration that also takes a word. */
typedef struct dcfg {
	int64_t wait_ms;
} dcfg;

static const char *const forever[] = {"forever", NULL};

static const fb_cfg_field dur_schema[] = {
    {"wait", FB_CFG_DURATION, offsetof(dcfg, wait_ms), "forever", 100,
        86400000, forever, "how long to wait"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

static void
test_duration_words(void **state)
{
	dcfg d;
	const char *y;

	assert_int_equal(fb_cfg_load_string("t.yaml", "", 0, dur_schema, &d),
	    FB_OK);
	assert_int_equal(d.wait_ms, -1); /* the word: -1 */
	y = "wait: 90s\n";
	assert_int_equal(
	    fb_cfg_load_string("t.yaml", y, strlen(y), dur_schema, &d), FB_OK);
	assert_int_equal(d.wait_ms, 90000);
	y = "wait: forevr\n";
	expect_error_in(dur_schema, &d, y, strlen(y), "t.yaml:1:7:",
	    "bad duration 'forevr'", "or forever");
	y = "wait: 10ms\n"; /* the bounds still hold for numbers */
	expect_error_in(dur_schema, &d, y, strlen(y), "t.yaml:1:7:",
	    "out of range", NULL);
}


static void
test_defaults(void **state)
{
	tcfg c;
	memset(&c, 0xa5, sizeof(c));
	assert_int_equal(load("", &c), FB_OK);
	assert_int_equal(c.rounds, 10);
	assert_int_equal(c.deadline_ms, 30000);
	assert_true(c.lr == 0.1);
	assert_true(c.secure);
	assert_string_equal(c.name, "fedbox");
	assert_int_equal(c.max_msg, 4u << 20);
	assert_int_equal(c.partition, 0);
	assert_int_equal(c.hidden.count, 2);
	assert_int_equal(c.hidden.v[0], 256);
	assert_int_equal(c.hidden.v[1], 128);
	assert_int_equal(c.peers.count, 0);
	assert_int_equal(c.offset, -5);
	fb_cfg_free(schema, &c);
	assert_null(c.name);
}

static void
test_comments_only(void **state)
{
	tcfg c;
	assert_int_equal(
	    load("# nothing here\n\n   # still nothing\n", &c), FB_OK);
	assert_int_equal(c.rounds, 10);
	fb_cfg_free(schema, &c);
	assert_int_equal(load("---\n", &c), FB_OK);
	assert_string_equal(c.name, "fedbox");
	fb_cfg_free(schema, &c);
	/* A section whose keys are all commented out is empty. */
	assert_int_equal(load("round:\n#  rounds: 3\n", &c), FB_OK);
	assert_int_equal(c.rounds, 10);
	fb_cfg_free(schema, &c);
}

static void
test_every_type(void **state)
{
	tcfg c;
	const char *yaml = "round:\n"
	                   "  rounds: 42\n"
	                   "  deadline: 1.5s\n"
	                   "train:\n"
	                   "  lr: 2.5e-3\n"
	                   "  hidden: [512, 64, 10]\n"
	                   "secure: Off\n"
	                   "name: \"alpha beta\"\n"
	                   "net:\n"
	                   "  max_msg: 1GiB\n"
	                   "  peers:\n"
	                   "    - tcp://a:1\n"
	                   "    - 'tcp://b:2'\n"
	                   "data: {partition: shards}\n"
	                   "offset: -9223372036854775808\n";
	assert_int_equal(load(yaml, &c), FB_OK);
	assert_int_equal(c.rounds, 42);
	assert_int_equal(c.deadline_ms, 1500);
	assert_true(fabs(c.lr - 2.5e-3) < 1e-15);
	assert_false(c.secure);
	assert_string_equal(c.name, "alpha beta");
	assert_int_equal(c.max_msg, 1ULL << 30);
	assert_int_equal(c.partition, 2);
	assert_int_equal(c.hidden.count, 3);
	assert_int_equal(c.hidden.v[0], 512);
	assert_int_equal(c.hidden.v[2], 10);
	assert_int_equal(c.peers.count, 2);
	assert_string_equal(c.peers.v[0], "tcp://a:1");
	assert_string_equal(c.peers.v[1], "tcp://b:2");
	assert_true(c.offset == INT64_MIN);
	fb_cfg_free(schema, &c);
	assert_null(c.name);
	assert_int_equal(c.peers.count, 0);
	assert_null(c.peers.v[0]);
	fb_cfg_free(schema, &c); /* twice is fine */
}

static void
test_nulls_and_empty_strings(void **state)
{
	tcfg c;
	/* A null keeps the default; a quoted "" is an empty string. */
	assert_int_equal(load("name:\nround: {rounds: ~}\ntrain:\n"
	                      "  hidden: null\n",
	                     &c),
	    FB_OK);
	assert_string_equal(c.name, "fedbox");
	assert_int_equal(c.rounds, 10);
	assert_int_equal(c.hidden.count, 2);
	fb_cfg_free(schema, &c);
	assert_int_equal(load("name: ''\ntrain: {hidden: []}\n", &c), FB_OK);
	assert_string_equal(c.name, "");
	assert_int_equal(c.hidden.count, 0);
	fb_cfg_free(schema, &c);
}

static void
test_bools(void **state)
{
	static const char *const yes[] = {"true", "TRUE", "yes", "On"};
	static const char *const no[] = {"false", "No", "off", "OFF"};
	char doc[64];
	tcfg c;
	for (size_t i = 0; i < 4; i++) {
		snprintf(doc, sizeof(doc), "secure: %s\n", yes[i]);
		assert_int_equal(load(doc, &c), FB_OK);
		assert_true(c.secure);
		fb_cfg_free(schema, &c);
		snprintf(doc, sizeof(doc), "secure: %s\n", no[i]);
		assert_int_equal(load(doc, &c), FB_OK);
		assert_false(c.secure);
		fb_cfg_free(schema, &c);
	}
	expect_error("secure: maybe\n", "t.yaml:1:9:", "secure", "'maybe'");
	expect_error("secure: 1\n", "t.yaml:1:9:", "secure", "boolean");
}

static void
test_durations(void **state)
{
	static const struct {
		const char *s;
		int64_t ms;
	} ok[] = {
	    {"30s", 30000},
	    {"250ms", 250},
	    {"1.5s", 1500},
	    {"2m", 120000},
	    {"1h", 3600000},
	    {"0s", 0},
	    {"0.0004s", 0},
	    {"0.0005s", 1},
	    {"1.25m", 75000},
	    {"10 s", 10000},
	    {"9223372036854775807ms", INT64_MAX},
	};
	static const char *const bad[] = {"30", "", "s", "-1s", "+1s", "1.s",
	    ".5s", "1e3s", "30 parsecs", "1sec", "1S", "1.5", " 1s", "1s "};
	int64_t ms;

	for (size_t i = 0; i < FB_ARRAY_LEN(ok); i++) {
		assert_int_equal(fb_parse_duration_ms(ok[i].s, &ms), FB_OK);
		assert_int_equal(ms, ok[i].ms);
	}
	for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
		ms = 7;
		if (fb_parse_duration_ms(bad[i], &ms) != FB_EINVAL) {
			print_error("accepted duration '%s'\n", bad[i]);
			fail();
		}
		assert_int_equal(ms, 0);
	}
	assert_int_equal(
	    fb_parse_duration_ms("9223372036854775808ms", &ms), FB_ERANGE);
	assert_int_equal(
	    fb_parse_duration_ms("9999999999999999h", &ms), FB_ERANGE);
	assert_int_equal(
	    fb_parse_duration_ms("99999999999999999999999999999s", &ms),
	    FB_ERANGE);
}

static void
test_sizes(void **state)
{
	static const struct {
		const char *s;
		uint64_t bytes;
	} ok[] = {
	    {"512", 512},
	    {"512B", 512},
	    {"4MiB", 4u << 20},
	    {"1GiB", 1ULL << 30},
	    {"2TiB", 2ULL << 40},
	    {"3KiB", 3072},
	    {"3kB", 3000},
	    {"5MB", 5000000},
	    {"7GB", 7000000000ULL},
	    {"1TB", 1000000000000ULL},
	    {"16 MiB", 16u << 20},
	    {"0", 0},
	    {"18446744073709551615", UINT64_MAX},
	};
	static const char *const bad[] = {"-1", "", "MiB", "1.5MiB", "4mib",
	    "4 M", "4KB", "1e3", "+4", "0x10", "4MiBs"};
	uint64_t b;

	for (size_t i = 0; i < FB_ARRAY_LEN(ok); i++) {
		assert_int_equal(fb_parse_size(ok[i].s, &b), FB_OK);
		assert_true(b == ok[i].bytes);
	}
	for (size_t i = 0; i < FB_ARRAY_LEN(bad); i++) {
		b = 7;
		if (fb_parse_size(bad[i], &b) != FB_EINVAL) {
			print_error("accepted size '%s'\n", bad[i]);
			fail();
		}
		assert_true(b == 0);
	}
	assert_int_equal(fb_parse_size("18446744073709551616", &b), FB_ERANGE);
	assert_int_equal(fb_parse_size("16777216TiB", &b), FB_ERANGE);
}

static void
test_units_in_config(void **state)
{
	static const struct {
		const char *doc;
		int64_t ms;
		uint64_t bytes;
	} cases[] = {
	    {"round: {deadline: 30s}\nnet: {max_msg: 4MiB}\n", 30000, 4u << 20},
	    {"round: {deadline: 250ms}\nnet: {max_msg: 1GiB}\n", 250,
	        1ULL << 30},
	    {"round: {deadline: 1.5s}\nnet: {max_msg: 1024}\n", 1500, 1024},
	    {"round: {deadline: 2m}\nnet: {max_msg: \"2 kB\"}\n", 120000, 2000},
	    {"round: {deadline: 1h}\nnet: {max_msg: 1TiB}\n", 3600000,
	        1ULL << 40},
	};
	tcfg c;
	for (size_t i = 0; i < FB_ARRAY_LEN(cases); i++) {
		assert_int_equal(load(cases[i].doc, &c), FB_OK);
		assert_int_equal(c.deadline_ms, cases[i].ms);
		assert_true(c.max_msg == cases[i].bytes);
		fb_cfg_free(schema, &c);
	}
}

static void
test_ints_strict(void **state)
{
	tcfg c;
	assert_int_equal(load("round: {rounds: +7}\noffset: -0\n", &c), FB_OK);
	assert_int_equal(c.rounds, 7);
	assert_int_equal(c.offset, 0);
	fb_cfg_free(schema, &c);
	expect_error("round:\n  rounds: 1.5\n", "t.yaml:2:11:", "round.rounds",
	    "bad integer '1.5'");
	expect_error("round:\n  rounds: 1e3\n", "t.yaml:2:11:", "round.rounds",
	    "bad integer");
	expect_error("round:\n  rounds: 0x10\n", "t.yaml:2:11:", "round.rounds",
	    "bad integer");
	expect_error(
	    "offset: 9223372036854775808\n", "t.yaml:1:9:", "offset", "64-bit");
	expect_error("offset: \"\"\n", "t.yaml:1:9:", "offset", "bad integer");
}

static void
test_floats_strict(void **state)
{
	tcfg c;
	assert_int_equal(load("train: {lr: 1}\n", &c), FB_OK);
	assert_true(c.lr == 1.0);
	fb_cfg_free(schema, &c);
	expect_error(
	    "train:\n  lr: nan\n", "t.yaml:2:7:", "train.lr", "finite");
	expect_error(
	    "train:\n  lr: inf\n", "t.yaml:2:7:", "train.lr", "finite");
	expect_error(
	    "train:\n  lr: 1e999\n", "t.yaml:2:7:", "train.lr", "finite");
	expect_error("train:\n  lr: 0.1x\n", "t.yaml:2:7:", "train.lr",
	    "bad number '0.1x'");
	expect_error("train:\n  lr: 11\n", "t.yaml:2:7:", "train.lr",
	    "out of range (0 to 10)");
}

/* ---- config: errors ----------------------------------------------------- */

static void
test_unknown_key(void **state)
{
	expect_error("round:\n  rounds: 3\n  deadlin: 30s\n",
	    "t.yaml:3:3:", "round.deadlin: unknown key",
	    "known keys under 'round': rounds, deadline");
	expect_error("round:\n  deadlin: 30s\n",
	    "t.yaml:2:3:", "did you mean 'deadline'", NULL);
	expect_error("secure: true\nbogus: 1\n",
	    "t.yaml:2:1:", "bogus: unknown key",
	    "known keys: round, train, secure, name, net, data, offset)");
	expect_error(
	    "round.rounds: 3\n", "t.yaml:1:1:", "round.rounds", "dotted keys");
}

static void
test_bad_duration(void **state)
{
	expect_error("round:\n  deadline: 30 parsecs\n",
	    "t.yaml:2:13:", "round.deadline: bad duration '30 parsecs'",
	    "(a number with unit ms, s, m or h, e.g. 30s)");
	expect_error("round:\n  deadline: 30\n",
	    "t.yaml:2:13:", "round.deadline", "has no unit");
	expect_error("round:\n  deadline: -1s\n",
	    "t.yaml:2:13:", "round.deadline", "negative");
	expect_error("round:\n  deadline: 2h\n",
	    "t.yaml:2:13:", "round.deadline",
	    "'2h' is out of range (0s to 1h)");
}

static void
test_bad_size(void **state)
{
	expect_error("net:\n  max_msg: 4 MB/s\n",
	    "t.yaml:2:12:", "net.max_msg: bad size '4 MB/s'", "KiB");
	expect_error("net:\n  max_msg: -4MiB\n", "t.yaml:2:12:", "net.max_msg",
	    "bad size");
	expect_error("net:\n  max_msg: 100\n", "t.yaml:2:12:", "net.max_msg",
	    "'100' is out of range (1KiB to 1TiB)");
	expect_error("net:\n  max_msg: 99999999999999999999\n",
	    "t.yaml:2:12:", "net.max_msg", "too large");
}

static void
test_out_of_range(void **state)
{
	expect_error("round:\n rounds: 0\n",
	    "t.yaml:2:10:", "round.rounds: 0 is out of range (1 to 100000)",
	    NULL);
	expect_error("round: {rounds: 100001}\n", "t.yaml:1:17:",
	    "round.rounds: 100001 is out of range (1 to 100000)", NULL);
	expect_error("train:\n  hidden: [256, 0]\n",
	    "t.yaml:2:17:", "train.hidden[1]: 0 is out of range (1 to 4096)",
	    NULL);
}

static void
test_bad_enum(void **state)
{
	tcfg c;
	assert_int_equal(load("data: {partition: dirichlet}\n", &c), FB_OK);
	assert_int_equal(c.partition, 1);
	fb_cfg_free(schema, &c);
	expect_error("\n\n\n\n\n\ndata:\n  partition: dirchlet\n",
	    "t.yaml:8:14:",
	    "data.partition: 'dirchlet' is not one of iid, dirichlet, shards",
	    "did you mean 'dirichlet'");
	expect_error("data: {partition: IID}\n",
	    "t.yaml:1:19:", "data.partition", "is not one of");
}

static void
test_duplicates(void **state)
{
	expect_error("secure: true\nsecure: false\n",
	    "t.yaml:2:1:", "secure: duplicate key", "line 1");
	expect_error("round:\n  rounds: 1\nround:\n  deadline: 1s\n",
	    "t.yaml:3:1:", "round: duplicate key", "line 1");
	expect_error("round: {rounds: 1, rounds: 2}\n",
	    "t.yaml:1:20:", "round.rounds: duplicate key", NULL);
}

static void
test_wrong_shapes(void **state)
{
	/* A mapping or sequence where a value is expected. */
	expect_error("round:\n  rounds:\n    a: 1\n",
	    "t.yaml:3:5:", "round.rounds", "found a mapping");
	expect_error(
	    "name: [a, b]\n", "t.yaml:1:7:", "name", "found a sequence");
	/* A value where a mapping is expected. */
	expect_error("round: 5\n", "t.yaml:1:8:", "round",
	    "expected a mapping of keys (rounds, deadline)");
	expect_error(
	    "round: [1]\n", "t.yaml:1:8:", "round", "expected a mapping");
	/* A value where a list is expected, and a list of lists. */
	expect_error("train: {hidden: 5}\n", "t.yaml:1:17:", "train.hidden",
	    "expected a list of int");
	expect_error("train: {hidden: [[1]]}\n",
	    "t.yaml:1:18:", "train.hidden[0]", "found a sequence");
	expect_error("net: {peers: [a, {b: c}]}\n",
	    "t.yaml:1:18:", "net.peers[1]", "found a mapping");
	expect_error("net: {peers: [a, ~]}\n", "t.yaml:1:18:", "net.peers[1]",
	    "no value");
	/* The top level is not a mapping. */
	expect_error("- a\n- b\n", "t.yaml:1:1:", "top level", "sequence");
	expect_error("just words\n", "t.yaml:1:1:", "top level", NULL);
	/* Keys that are not names. */
	expect_error(
	    "? [a, b]\n: 1\n", "t.yaml:1:3:", "key must be a name", "sequence");
	expect_error("round:\n  ? {a: 1}\n  : 1\n",
	    "t.yaml:2:5:", "round: a key must be a name", "mapping");
	expect_error("~: 1\n", "t.yaml:1:1:", "empty key", NULL);
	expect_error("1: 1\n", "t.yaml:1:1:", "1: unknown key", NULL);
}

static void
test_list_too_long(void **state)
{
	char doc[1024];
	size_t n = (size_t)snprintf(doc, sizeof(doc), "train:\n  hidden: [");
	tcfg c;

	for (int i = 0; i < FB_CFG_MAX_LIST; i++) {
		n += (size_t)snprintf(
		    doc + n, sizeof(doc) - n, "%s%d", i > 0 ? ", " : "", i + 1);
	}
	snprintf(doc + n, sizeof(doc) - n, "]\n");
	assert_int_equal(load(doc, &c), FB_OK);
	assert_int_equal(c.hidden.count, FB_CFG_MAX_LIST);
	assert_int_equal(c.hidden.v[FB_CFG_MAX_LIST - 1], FB_CFG_MAX_LIST);
	fb_cfg_free(schema, &c);
	snprintf(doc + n, sizeof(doc) - n, ", 65]\n");
	expect_error(doc, "t.yaml:2:", "train.hidden", "at most 64");

	/* Strings too: the first 64 are allocated, then freed on error. */
	n = (size_t)snprintf(doc, sizeof(doc), "net:\n  peers:\n");
	for (int i = 0; i <= FB_CFG_MAX_LIST; i++) {
		n += (size_t)snprintf(doc + n, sizeof(doc) - n, "  - p%d\n", i);
	}
	expect_error(doc, "t.yaml:67:5:", "net.peers", "too many elements");
}

static void
test_syntax_errors(void **state)
{
	expect_error("round:\n  rounds: 3\n deadline: 1s\n",
	    "t.yaml:3:", "YAML syntax error", NULL);
	expect_error(
	    "name: \"unterminated\n", "t.yaml:", "YAML syntax error", NULL);
	expect_error("train: {hidden: [1, 2\n",
	    "t.yaml:2:1:", "YAML syntax error", NULL);
	expect_error(
	    "secure: true\n\tname: x\n", "t.yaml:2:", "syntax error", NULL);
	expect_error("secure: true\n---\nsecure: false\n",
	    "t.yaml:2:1:", "second YAML document", NULL);
}

static void
test_required(void **state)
{
	rcfg r;
	capture cap;
	fb_err rc;
	const char *ok = "coordinator:\n  address: tcp://h:1\nworker:\n"
	                 "  id: 3\n";

	assert_int_equal(
	    fb_cfg_load_string("r.yaml", ok, strlen(ok), req_schema, &r),
	    FB_OK);
	assert_string_equal(r.address, "tcp://h:1");
	assert_int_equal(r.id, 3);
	assert_int_equal(r.port, 5555);
	fb_cfg_free(req_schema, &r);
	assert_null(r.address);

	memset(&r, 0, sizeof(r));
	expect_error_in(req_schema, &r, "worker: {id: 1}\n", 16,
	    "t.yaml: ", "coordinator.address: required key is missing", NULL);
	assert_null(r.address);
	expect_error_in(req_schema, &r, "", 0,
	    "t.yaml: ", "coordinator.address: required key is missing",
	    "also missing: worker.id");
	expect_error_in(req_schema, &r, "# only a comment\n", 17,
	    "t.yaml: ", "coordinator.address", "worker.id");
	/* A null is no value for a required key. */
	expect_error_in(req_schema, &r, "coordinator: {address: ~}\n", 26,
	    "t.yaml:1:24:", "coordinator.address", "required");

	/* Exactly one line even with several problems. */
	capture_begin(&cap);
	rc = fb_cfg_load_string(
	    "r.yaml", "worker: {id: 2000}\n", 19, req_schema, &r);
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_int_equal(count_lines(cap.text), 1);
	assert_non_null(strstr(cap.text, "r.yaml:1:14: worker.id"));
}

static void
test_hostile_input(void **state)
{
	static const char *const docs[] = {
	    "a: &x [1]\nb: *x\n",
	    "name: *nothing\n",
	    "round: &r {rounds: 2}\nx: *r\n",
	    "train: {hidden: [1, *y]}\n",
	    "name: !!binary aGVsbG8=\nround: !!map {rounds: !!int 4}\n",
	    "\xff\xfe\x00\x01garbage",
	    "name: \"a\\0b\"\n",
	    "\"\\0\": 1\n",
	    "%YAML 9.9\n---\na: 1\n",
	    "{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{",
	};
	char *big;
	size_t depth = 100000;
	tcfg c;
	capture cap;
	fb_err rc;

	for (size_t i = 0; i < FB_ARRAY_LEN(docs); i++) {
		size_t len = strlen(docs[i]);
		if (i == 5) {
			len = 11; /* embedded NUL */
		}
		memset(&c, 0, sizeof(c));
		capture_begin(&cap);
		rc = fb_cfg_load_string("h.yaml", docs[i], len, schema, &c);
		capture_end(&cap);
		if (i == 4) {
			/* Tags are ignored. */
			assert_int_equal(rc, FB_OK);
			assert_string_equal(c.name, "aGVsbG8=");
			assert_int_equal(c.rounds, 4);
			fb_cfg_free(schema, &c);
			continue;
		}
		if (rc != FB_ECONFIG || count_lines(cap.text) != 1 ||
		    strstr(cap.text, "h.yaml:") == NULL) {
			print_error(
			    "doc %zu: rc %d log '%s'\n", i, (int)rc, cap.text);
			fail();
		}
	}
	expect_error("name: *nothing\n", "t.yaml:1:7:", "name", "alias");
	expect_error("name: \"a\\0b\"\n", "t.yaml:1:7:", "name", "NUL");

	/* Deep nesting: a key's value nested a hundred thousand times. */
	big = malloc(2 * depth + 32);
	assert_non_null(big);
	memcpy(big, "round: ", 7);
	memset(big + 7, '[', depth);
	memset(big + 7 + depth, ']', depth);
	memcpy(big + 7 + 2 * depth, "\n", 2);
	expect_error(big, "t.yaml:1:8:", "round", "expected a mapping");
	memset(big, '[', depth);
	memset(big + depth, ']', depth);
	big[2 * depth] = '\0';
	expect_error(big, "t.yaml:1:1:", "top level", NULL);
	free(big);

	/* A huge scalar is quoted back shortened. */
	big = malloc(1000064);
	assert_non_null(big);
	memcpy(big, "name: ", 6);
	memset(big + 6, 'x', 1000000);
	memcpy(big + 1000006, "\n", 2);
	assert_int_equal(load(big, &c), FB_OK);
	assert_int_equal(strlen(c.name), 1000000);
	fb_cfg_free(schema, &c);
	memcpy(big, "train:\n  lr: ", 13);
	memset(big + 13, 'x', 1000000);
	memcpy(big + 1000013, "\n", 2);
	expect_error(big, "t.yaml:2:7:", "train.lr", "...'");
	free(big);
}

static void
test_fuzz_smoke(void **state)
{
	/* Random mutations of a valid document never crash or leak. */
	static const char base[] = "round:\n  rounds: 42\n  deadline: 1.5s\n"
	                           "train: {lr: 0.5, hidden: [3, 4]}\n"
	                           "net:\n  peers: [a, 'b']\n  max_msg: 2MiB\n"
	                           "data: {partition: shards}\nname: x\n";
	static const char alphabet[] = "{}[]:,-?&*!|>'\"#%@` \n\t.0a~\\";
	char doc[sizeof(base)];
	fb_rng rng;
	tcfg c;
	capture cap;

	fb_rng_init(&rng, 99, 0);
	capture_begin(&cap);
	for (int iter = 0; iter < 3000; iter++) {
		fb_err rc;
		memcpy(doc, base, sizeof(base));
		for (int k = 0; k < 1 + (int)fb_rng_below(&rng, 4); k++) {
			size_t at =
			    (size_t)fb_rng_below(&rng, sizeof(base) - 1);
			doc[at] = fb_rng_below(&rng, 4) == 0
			              ? (char)fb_rng_below(&rng, 256)
			              : alphabet[fb_rng_below(
			                    &rng, sizeof(alphabet) - 1)];
		}
		rc = fb_cfg_load_string(
		    "f.yaml", doc, sizeof(base) - 1, schema, &c);
		if (rc == FB_OK) {
			fb_cfg_free(schema, &c);
		}
		assert_true(rc == FB_OK || rc == FB_ECONFIG);
	}
	capture_end(&cap);
}

/* ---- log -------------------------------------------------------------- */

static void
read_file(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "rb");
	size_t n;

	assert_non_null(f);
	n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* JSON lines: fields in order, strings escaped whatever the bytes. */
static void
test_log_json_lines(void **state)
{
	char path[600], text[8192];
	const char *p;

	(void)state;
	snprintf(path, sizeof(path), "%s/log.jsonl", fb_test_tmpdir());
	unlink(path);
	fb_log_init("w[\"x\"]", FB_LOG_INFO);
	assert_int_equal(fb_log_output(path, FB_LOG_JSON), FB_OK);
	fb_log_debug("not shown");
	fb_log_warn("q\"uote\\ nl\n tab\t bell\x07 del\x7f "
	            "\xc3\xa9 \xf0\x9f\x98\x80 bad\xff over\xc0\xaf "
	            "cut\xe2\x82 sur\xed\xa0\x80 end");
	fb_log_error("%d%%", 50);
	assert_int_equal(fb_log_output(NULL, FB_LOG_TEXT), FB_OK);
	fb_log_init("common", FB_LOG_ERROR);
	read_file(path, text, sizeof(text));
	assert_int_equal(count_lines(text), 2);
	assert_null(strstr(text, "not shown"));
	/* {"time": "YYYY-MM-DDTHH:MM:SS.mmmZ", then the rest. */
	assert_int_equal(strncmp(text, "{\"time\": \"", 10), 0);
	assert_int_equal(text[10 + 4], '-');
	assert_int_equal(text[10 + 10], 'T');
	assert_int_equal(text[10 + 23], 'Z');
	p = text + 10 + 24;
	{
		const char want[] =
		    "\", \"level\": \"warn\", \"program\": \"w[\\\"x\\\"]\", "
		    "\"message\": \"q\\\"uote\\\\ nl\\n tab\\t "
		    "bell\\u0007 del\\u007f \xc3\xa9 \xf0\x9f\x98\x80 "
		    "bad\\ufffd over\\ufffd\\ufffd cut\\ufffd\\ufffd "
		    "sur\\ufffd\\ufffd\\ufffd end\"}\n";
		if (strncmp(p, want, strlen(want)) != 0) {
			print_error("got:  %s\nwant: %s\n", p, want);
			fail();
		}
		p += strlen(want);
	}
	assert_non_null(strstr(p, "\"level\": \"error\", \"program\": "
	                          "\"w[\\\"x\\\"]\", \"message\": \"50%\"}\n"));
}

/* Text lines to a file, appended to what it held; a file that cannot be
 * opened leaves the output as it was. */
static void
test_log_file_text(void **state)
{
	char path[600], text[4096];
	capture cap;

	(void)state;
	snprintf(path, sizeof(path), "%s/log.txt", fb_test_tmpdir());
	{
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs("earlier line\n", f);
		fclose(f);
	}
	fb_log_init("coordinator", FB_LOG_INFO);
	assert_int_equal(fb_log_output(path, FB_LOG_TEXT), FB_OK);
	fb_log_info("round %d", 3);
	capture_begin(&cap);
	assert_int_equal(fb_log_output("/nonexistent-dir/x.log", FB_LOG_JSON),
	    FB_EIO);
	fb_log_info("still text, still the file");
	assert_int_equal(fb_log_output(NULL, FB_LOG_TEXT), FB_OK);
	fb_log_error("back on stderr");
	capture_end(&cap);
	fb_log_init("common", FB_LOG_ERROR);
	read_file(path, text, sizeof(text));
	assert_int_equal(count_lines(text), 4);
	assert_int_equal(strncmp(text, "earlier line\n", 13), 0);
	assert_non_null(strstr(text, "Z coordinator INFO round 3\n"));
	assert_non_null(strstr(text, "Z coordinator ERROR cannot open the log "
	                             "file /nonexistent-dir/x.log: No such "
	                             "file or directory\n"));
	assert_non_null(strstr(text, "Z coordinator INFO still text, still "
	                             "the file\n"));
	assert_null(strstr(text, "back on stderr"));
	assert_non_null(
	    strstr(cap.text, "Z coordinator ERROR back on stderr\n"));
	assert_int_equal(fb_log_format_parse("json"), FB_LOG_JSON);
	assert_int_equal(fb_log_format_parse("text"), FB_LOG_TEXT);
	assert_int_equal(fb_log_format_parse("JSON "), -1);
}

/* ---- config: files and reference --------------------------------------- */

/* Positions of the keys given, for the programs' own cross-checks. */
static void
test_load_positions(void **state)
{
	char path[600];
	const char text[] = "# positions\ntrain:\n  lr: 0.5\nround:\n"
	                    "  deadline:   1m\nnet:\n  peers: [a, b]\n";
	fb_iovec piece = {text, sizeof(text) - 1};
	size_t n = fb_cfg_count(schema);
	fb_cfg_pos pos[16];
	tcfg c;
	capture cap;
	fb_err rc;

	(void)state;
	assert_int_equal(n, 10);
	memset(pos, 0x5a, sizeof(pos));
	snprintf(path, sizeof(path), "%s/pos.yaml", fb_test_tmpdir());
	assert_int_equal(fb_file_write_atomic(path, &piece, 1), FB_OK);
	assert_int_equal(fb_cfg_load_pos(path, schema, &c, pos), FB_OK);
	/* schema[2] is train.lr: its value at line 3, column 7. */
	assert_int_equal(pos[2].line, 3);
	assert_int_equal(pos[2].column, 7);
	assert_int_equal(pos[1].line, 5); /* round.deadline */
	assert_int_equal(pos[1].column, 15);
	assert_int_equal(pos[8].line, 7); /* net.peers: the sequence */
	assert_int_equal(pos[8].column, 10);
	assert_int_equal(pos[0].line, 0); /* round.rounds: a default */
	assert_int_equal(pos[0].column, 0);
	assert_true(fb_cfg_given(schema, pos, "train.lr"));
	assert_false(fb_cfg_given(schema, pos, "round.rounds"));

	capture_begin(&cap);
	rc = fb_cfg_error(path, schema, pos, "train.lr", "too big for %s",
	    "this");
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_non_null(strstr(cap.text, "pos.yaml:3:7: train.lr: too big for "
	                                 "this\n"));
	assert_int_equal(count_lines(cap.text), 1);
	capture_begin(&cap);
	rc = fb_cfg_error(path, schema, pos, "round.rounds", "wrong");
	(void)fb_cfg_error(path, schema, pos, "net.peers", "none");
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_non_null(strstr(cap.text, "pos.yaml: round.rounds: wrong (not "
	                                 "set: the default is 10)\n"));
	assert_non_null(strstr(cap.text, "pos.yaml:7:10: net.peers: none\n"));
	fb_cfg_free(schema, &c);

	/* A failed load leaves `pos` alone. */
	piece.base = "round:\n  rounds: 0\n";
	piece.len = strlen(piece.base);
	assert_int_equal(fb_file_write_atomic(path, &piece, 1), FB_OK);
	memset(pos, 0x5a, sizeof(pos));
	capture_begin(&cap);
	rc = fb_cfg_load_pos(path, schema, &c, pos);
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_int_equal(pos[0].line, (size_t)0x5a5a5a5a5a5a5a5aull);
}

static void
test_load_file(void **state)
{
	char path[600];
	const char text[] = "# fedbox test\nround:\n  rounds: 12\n";
	fb_iovec piece = {text, sizeof(text) - 1};
	tcfg c;
	capture cap;
	fb_err rc;

	snprintf(path, sizeof(path), "%s/c.yaml", fb_test_tmpdir());
	assert_int_equal(fb_file_write_atomic(path, &piece, 1), FB_OK);
	assert_int_equal(fb_cfg_load(path, schema, &c), FB_OK);
	assert_int_equal(c.rounds, 12);
	assert_string_equal(c.name, "fedbox");
	fb_cfg_free(schema, &c);

	/* Messages name the file as given. */
	piece.base = "round:\n  rounds: 0\n";
	piece.len = strlen(piece.base);
	assert_int_equal(fb_file_write_atomic(path, &piece, 1), FB_OK);
	capture_begin(&cap);
	rc = fb_cfg_load(path, schema, &c);
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_non_null(strstr(cap.text, "c.yaml:2:11: round.rounds: 0"));
	assert_null(c.name);

	/* A missing file is a configuration error, with the errno text. */
	snprintf(path, sizeof(path), "%s/absent.yaml", fb_test_tmpdir());
	memset(&c, 0xa5, sizeof(c));
	capture_begin(&cap);
	rc = fb_cfg_load(path, schema, &c);
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_non_null(strstr(cap.text, "absent.yaml: cannot open config"));
	assert_non_null(strstr(cap.text, "No such file"));
	assert_int_equal(count_lines(cap.text), 1);
	assert_null(c.name);
	fb_cfg_free(schema, &c);

	/* A folder is not a config file. */
	capture_begin(&cap);
	rc = fb_cfg_load(fb_test_tmpdir(), schema, &c);
	capture_end(&cap);
	assert_int_equal(rc, FB_ECONFIG);
	assert_int_equal(count_lines(cap.text), 1);
}

/* A schema of paths: relative values resolve against the file's folder. */
typedef struct pcfg {
	char *key, *abs, *line, *empty, *dot, *deflt, *name;
} pcfg;

static const char *const not_paths[] = {"fedbox-ed25519 ", NULL};

static const fb_cfg_field path_schema[] = {
    {"key", FB_CFG_PATH, offsetof(pcfg, key), "", NOB, NULL, "a key file"},
    {"abs", FB_CFG_PATH, offsetof(pcfg, abs), "", NOB, NULL, "absolute"},
    {"line", FB_CFG_PATH, offsetof(pcfg, line), "", NOB, not_paths,
        "a file or a key line"},
    {"empty", FB_CFG_PATH, offsetof(pcfg, empty), "x", NOB, NULL, "empty"},
    {"dot", FB_CFG_PATH, offsetof(pcfg, dot), "", NOB, NULL, "dot slash"},
    {"deflt", FB_CFG_PATH, offsetof(pcfg, deflt), "runs/fb", NOB, NULL,
        "a default"},
    {"name", FB_CFG_STRING, offsetof(pcfg, name), "", NOB, NULL, "a string"},
    {NULL, 0, 0, NULL, 0, 0, NULL, NULL},
};

static void
check_paths(const char *file, const char *folder)
{
	pcfg c;
	char want[1400];

	assert_int_equal(fb_cfg_load(file, path_schema, &c), FB_OK);
	snprintf(want, sizeof(want), "%s/keys/w.key", folder);
	assert_string_equal(c.key, want);
	assert_string_equal(c.abs, "/etc/fedbox/w.key");
	assert_string_equal(c.line, "fedbox-ed25519 AAAA coordinator");
	assert_string_equal(c.empty, "");
	snprintf(want, sizeof(want), "%s/data", folder);
	assert_string_equal(c.dot, want);
	assert_string_equal(c.deflt, "runs/fb"); /* defaults stay as written */
	assert_string_equal(c.name, "keys/w.key"); /* strings are not paths */
	fb_cfg_free(path_schema, &c);
}

static void
test_paths_resolve(void **state)
{
	const char text[] = "key: keys/w.key\nabs: /etc/fedbox/w.key\n"
	                    "line: fedbox-ed25519 AAAA coordinator\n"
	                    "empty: \"\"\ndot: ./data\nname: keys/w.key\n";
	fb_iovec piece = {text, sizeof(text) - 1};
	char dir[700], file[800], cwd[1024];
	char buf[4096];
	FILE *f;
	pcfg c;

	snprintf(dir, sizeof(dir), "%s/site", fb_test_tmpdir());
	assert_int_equal(mkdir(dir, 0700), 0);
	snprintf(file, sizeof(file), "%s/w.yaml", dir);
	assert_int_equal(fb_file_write_atomic(file, &piece, 1), FB_OK);
	assert_non_null(getcwd(cwd, sizeof(cwd)));

	/* Given by its absolute name, from a working directory elsewhere. */
	assert_int_equal(chdir("/"), 0);
	check_paths(file, dir);
	/* Given relative to the working directory: the folder is still
	 * the file's, made absolute. */
	assert_int_equal(chdir(fb_test_tmpdir()), 0);
	check_paths("site/w.yaml", dir);
	assert_int_equal(chdir(dir), 0);
	check_paths("w.yaml", dir);
	assert_int_equal(chdir(cwd), 0);

	/* From a string there is no folder: paths are kept as written. */
	assert_int_equal(fb_cfg_load_string("w.yaml", text, strlen(text),
	                     path_schema, &c),
	    FB_OK);
	assert_string_equal(c.key, "keys/w.key");
	assert_string_equal(c.dot, "./data");
	fb_cfg_free(path_schema, &c);

	f = fmemopen(buf, sizeof(buf), "w");
	assert_non_null(f);
	fb_cfg_print_reference(f, path_schema);
	fclose(f);
	assert_non_null(strstr(buf, "| `key` | path | `\"\"` | a key file |"));
}

static void
test_reference(void **state)
{
	char buf[4096];
	FILE *f = fmemopen(buf, sizeof(buf), "w");
	assert_non_null(f);
	fb_cfg_print_reference(f, schema);
	fb_cfg_print_reference(f, req_schema);
	fclose(f);
	assert_non_null(strstr(buf, "| key | type | default | description |\n"
	                            "|---|---|---|---|\n"));
	assert_non_null(strstr(buf, "| `round.rounds` | int, 1 to 100000 | "
	                            "`10` | rounds to run |\n"));
	assert_non_null(strstr(buf, "| `round.deadline` | duration, 0s to 1h "
	                            "| `30s` |"));
	assert_non_null(strstr(buf, "| `net.max_msg` | size, 1KiB to 1TiB | "
	                            "`4MiB` |"));
	assert_non_null(strstr(buf, "| `data.partition` | one of: iid, "
	                            "dirichlet, shards | `iid` |"));
	assert_non_null(
	    strstr(buf, "| `net.peers` | list of string | `\"\"` |"));
	assert_non_null(strstr(buf, "a name \\| with a pipe"));
	assert_non_null(strstr(buf, "| `coordinator.address` | string | "
	                            "(required) | where to connect |"));
}

/* ---- util --------------------------------------------------------------- */

static void
test_rng_streams(void **state)
{
	fb_rng a, b, other;
	int same = 0;

	fb_rng_init(&a, 42, 7);
	fb_rng_init(&b, 42, 7);
	fb_rng_init(&other, 42, 8);
	for (int i = 0; i < 1000; i++) {
		uint64_t x = fb_rng_u64(&a);
		assert_true(x == fb_rng_u64(&b));
		same += x == fb_rng_u64(&other);
	}
	assert_true(same < 2);
	fb_rng_init(&b, 43, 7);
	fb_rng_init(&a, 42, 7);
	assert_true(fb_rng_u64(&a) != fb_rng_u64(&b));
}

static void
test_rng_below(void **state)
{
	static const uint64_t ns[] = {
	    1, 2, 3, 7, 10, 1000003, UINT64_MAX / 2 + 1, UINT64_MAX};
	fb_rng r;
	int hits[10] = {0};

	fb_rng_init(&r, 1, 0);
	for (size_t k = 0; k < FB_ARRAY_LEN(ns); k++) {
		for (int i = 0; i < 2000; i++) {
			assert_true(fb_rng_below(&r, ns[k]) < ns[k]);
		}
	}
	for (int i = 0; i < 10000; i++) {
		hits[fb_rng_below(&r, 10)]++;
	}
	for (int i = 0; i < 10; i++) {
		assert_true(hits[i] > 800 && hits[i] < 1200);
	}
	for (int i = 0; i < 1000; i++) {
		double u = fb_rng_uniform(&r);
		assert_true(u >= 0.0 && u < 1.0);
	}
}

static void
test_rng_gamma_mean(void **state)
{
	static const double shapes[] = {0.5, 3.0};
	fb_rng r;

	fb_rng_init(&r, 2024, 1);
	for (size_t k = 0; k < FB_ARRAY_LEN(shapes); k++) {
		double sum = 0;
		for (int i = 0; i < 20000; i++) {
			double g = fb_rng_gamma(&r, shapes[k]);
			assert_true(g >= 0.0 && isfinite(g));
			sum += g;
		}
		sum /= 20000;
		if (fabs(sum - shapes[k]) > 0.05 * shapes[k]) {
			print_error("gamma(%g) mean %g\n", shapes[k], sum);
			fail();
		}
	}
}

static void
test_write_atomic(void **state)
{
	const char *dir = fb_test_tmpdir();
	char path[600], buf[64];
	fb_iovec pieces[] = {{"hello ", 6}, {"", 0}, {"world\n", 6}};
	struct stat st;
	FILE *f;
	size_t n;
	char cmd[700];
	int fd;

	snprintf(path, sizeof(path), "%s/atomic.bin", dir);
	assert_int_equal(fb_file_write_atomic(path, pieces, 3), FB_OK);
	f = fopen(path, "rb");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	assert_int_equal(n, 12);
	assert_memory_equal(buf, "hello world\n", 12);
	assert_int_equal(stat(path, &st), 0);

	/* Overwrite: new content, and no temporary file left next to it. */
	assert_int_equal(fb_file_write_atomic(path, pieces, 1), FB_OK);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, 6);
	snprintf(cmd, sizeof(cmd), "%s.tmp.%ld", path, (long)getpid());
	assert_int_not_equal(stat(cmd, &st), 0);
	snprintf(cmd, sizeof(cmd), "ls -A '%s' | grep -q tmp", dir);
	assert_int_not_equal(system(cmd), 0);

	/* A zero-length file is fine too. */
	assert_int_equal(fb_file_write_atomic(path, NULL, 0), FB_OK);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, 0);
	close(fd);
}

static void
test_write_atomic_missing_dir(void **state)
{
	char path[600];
	fb_iovec piece = {"x", 1};
	capture cap;
	fb_err rc;

	snprintf(path, sizeof(path), "%s/no/such/dir/f.bin", fb_test_tmpdir());
	capture_begin(&cap);
	rc = fb_file_write_atomic(path, &piece, 1);
	capture_end(&cap);
	assert_int_equal(rc, FB_EIO);
	assert_non_null(strstr(cap.text, "no/such/dir"));
	assert_int_equal(count_lines(cap.text), 1);
}

/* Whether the mapping holding p carries VM_HUGEPAGE ("hg" in VmFlags). */
static bool
advised_huge(const void *p)
{
	char line[512];
	uintptr_t a = (uintptr_t)p;
	bool in = false, hg = false;
	FILE *f = fopen("/proc/self/smaps", "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long lo, hi;
		/* "lo-hi perms ..." opens each mapping; no field name
		 * ("Size:", "VmFlags:", ...) reads as hex, a dash, hex. */
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
			in = a >= lo && a < hi;
		} else if (in && strncmp(line, "VmFlags:", 8) == 0) {
			hg = strstr(line, " hg") != NULL;
			break;
		}
	}
	fclose(f);
	return hg;
}

static void
test_alloc_large_huge_pages(void **state)
{
	const size_t big = ((size_t)8 << 20) + 123, small = ((size_t)8 << 20) - 1;
	uint8_t *p = fb_alloc(big), *q = fb_alloc(small);
	uint8_t *z = fb_calloc(big, 1);

	assert_non_null(p);
	assert_non_null(q);
	assert_non_null(z);
	/* 8 MiB and more: on a 2 MiB boundary, zeroed by fb_calloc, and
	 * usable to the last byte. */
	assert_int_equal((uintptr_t)p % ((uintptr_t)2 << 20), 0);
	assert_int_equal((uintptr_t)z % ((uintptr_t)2 << 20), 0);
	assert_int_equal((uintptr_t)q % 64, 0);
	memset(p, 0xa5, big);
	assert_int_equal(p[big - 1], 0xa5);
	assert_int_equal(z[0], 0);
	assert_int_equal(z[big / 2], 0);
	assert_int_equal(z[big - 1], 0);
	/* Advised as huge-page memory wherever the kernel has THP. */
	if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
		assert_true(advised_huge(p));
		assert_true(advised_huge(z));
	}
	fb_free(p);
	fb_free(q);
	fb_free(z);
}

/* ---- pool ---------------------------------------------------------------- */

typedef struct pool_case {
	atomic_uint hits[4096];
	atomic_uint calls;
	uint32_t n;
} pool_case;

static void
pool_mark(void *arg, uint32_t i)
{
	pool_case *pc = arg;
	atomic_fetch_add(&pc->hits[i], 1);
	atomic_fetch_add(&pc->calls, 1);
}

/* Every index runs exactly once, on pools of 0..4 threads, for batches of
 * every size from 0 to past the thread count, many batches in a row (a
 * thread late to one batch must not run it inside the next). */
static void
test_pool_runs_each_index_once(void **state)
{
	static pool_case pc;

	for (uint32_t t = 0; t <= 4; t++) {
		fb_pool *p = NULL;
		assert_int_equal(fb_pool_alloc(t, &p), FB_OK);
		assert_int_equal(fb_pool_threads(p), t);
		for (uint32_t rep = 0; rep < 300; rep++) {
			uint32_t n = rep % 37 + (rep % 5 == 0 ? 4000 : 0);
			memset(&pc, 0, sizeof(pc));
			fb_pool_for(p, n, pool_mark, &pc);
			assert_int_equal(atomic_load(&pc.calls), n);
			for (uint32_t i = 0; i < n; i++) {
				assert_int_equal(atomic_load(&pc.hits[i]), 1);
			}
		}
		fb_pool_free(p);
	}
	/* a NULL pool runs everything on the caller */
	memset(&pc, 0, sizeof(pc));
	fb_pool_for(NULL, 10, pool_mark, &pc);
	assert_int_equal(atomic_load(&pc.calls), 10);
	assert_true(fb_pool_cpus() >= 1);
	assert_int_equal(fb_pool_alloc(100000, &(fb_pool *){NULL}), FB_EINVAL);
	fb_pool_free(NULL);
}

FB_TESTS = {
    {"a duration also takes its words, stored as -1, -2, ...",
        test_duration_words},
    {"a pool runs each index of a batch exactly once",
        test_pool_runs_each_index_once},
    {"defaults apply to an empty document", test_defaults},
    {"comments only, --- and null sections give defaults", test_comments_only},
    {"every type parses", test_every_type},
    {"null keeps the default and quoted empty is empty",
        test_nulls_and_empty_strings},
    {"booleans accept true/false yes/no on/off", test_bools},
    {"durations parse with units and refuse bare numbers", test_durations},
    {"sizes parse binary and decimal units", test_sizes},
    {"units work inside a config", test_units_in_config},
    {"integers are strict", test_ints_strict},
    {"floats are finite and strict", test_floats_strict},
    {"unknown key names the key and lists known ones", test_unknown_key},
    {"bad duration names file line column and key", test_bad_duration},
    {"bad size is reported", test_bad_size},
    {"out-of-range values name the range", test_out_of_range},
    {"enum value outside its names is refused", test_bad_enum},
    {"duplicate keys are refused", test_duplicates},
    {"wrong shapes are refused", test_wrong_shapes},
    {"lists hold at most FB_CFG_MAX_LIST elements", test_list_too_long},
    {"YAML syntax errors carry a position", test_syntax_errors},
    {"required keys must be present", test_required},
    {"aliases, garbage and deep nesting fail cleanly", test_hostile_input},
    {"mutated documents never crash", test_fuzz_smoke},
    {"config loads from a file and a missing file is an error", test_load_file},
    {"positions name the line and column of each value given",
        test_load_positions},
    {"log lines as JSON escape every byte and keep the fields",
        test_log_json_lines},
    {"log lines go to a file, appended, and back to stderr",
        test_log_file_text},
    {"relative paths resolve against the config file's folder",
        test_paths_resolve},
    {"reference table lists every key", test_reference},
    {"rng is deterministic per seed and stream", test_rng_streams},
    {"rng_below stays in range and is even", test_rng_below},
    {"gamma sample mean is close to its shape", test_rng_gamma_mean},
    {"atomic write stores the bytes and leaves no temp file",
        test_write_atomic},
    {"atomic write into a missing folder fails with FB_EIO",
        test_write_atomic_missing_dir},
    {"buffers of 8 MiB and more are 2 MiB aligned and advised huge",
        test_alloc_large_huge_pages},
    {NULL, NULL},
};

FB_TEST_MAIN("common")
