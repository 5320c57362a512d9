/* SPDX-License-Identifier: Apache-2.0 */
/* harness.c -- runs an FB_TESTS table as one cmocka group. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "tests/unit/harness.h"

int
fb_test_run(const char *suite, const fb_test *tests)
{
	size_t n = 0;
	struct CMUnitTest *cases;
	int rc;
	const char *lvl = getenv("FB_TEST_LOG");

	fb_log_init(suite, lvl != NULL && fb_log_level_parse(lvl) >= 0
	        ? (fb_log_level)fb_log_level_parse(lvl)
	        : FB_LOG_ERROR);
	while (tests[n].name != NULL) {
		n++;
	}
	cases = calloc(n, sizeof(*cases));
	if (cases == NULL) {
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		cases[i].name = tests[i].name;
		cases[i].test_func = tests[i].fn;
	}
	rc = _cmocka_run_group_tests(suite, cases, n, NULL, NULL);
	free(cases);
	return rc;
}

const char *
fb_test_tmpdir(void)
{
	static char dir[512];
	const char *base = getenv("TMPDIR");
	if (dir[0] != '\0') {
		return dir;
	}
	snprintf(dir, sizeof(dir), "%s/fbtest.XXXXXX",
	    base != NULL ? base : "/tmp");
	if (mkdtemp(dir) == NULL) {
		fprintf(stderr, "cannot make a temporary folder\n");
		abort();
	}
	return dir;
}

const char *
fb_test_fmnist_dir(void)
{
	static char path[512];
	const char *env = getenv("FB_FMNIST_DIR");
	const char *dir = env != NULL ? env : "/usr/share/datasets/fashion-mnist";
	struct stat st;
	snprintf(path, sizeof(path), "%s/t10k-labels-idx1-ubyte.gz", dir);
	if (stat(path, &st) != 0) {
		return NULL;
	}
	return dir;
}
