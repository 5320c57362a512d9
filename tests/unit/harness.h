/* SPDX-License-Identifier: Apache-2.0 */
/*
 * harness.h -- the unit-test table over cmocka.
 *
 *   static void test_x(void **state) { assert_int_equal(...); }
 *   FB_TESTS = {
 *           { "update survives pack and unpack", test_x },
 *           { NULL, NULL },
 *   };
 *   FB_TEST_MAIN("proto")
 */
#ifndef FB_TESTS_HARNESS_H
#define FB_TESTS_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

typedef struct fb_test {
	const char *name;
	void (*fn)(void **state);
} fb_test;

#define FB_TESTS static const fb_test fb_tests_[]
#define FB_TEST_MAIN(suite)                                              \
	int main(void)                                                   \
	{                                                                \
		return fb_test_run(suite, fb_tests_);                    \
	}

int fb_test_run(const char *suite, const fb_test *tests);

/* fb_test_tmpdir returns a fresh folder under $TMPDIR for this process. */
const char *fb_test_tmpdir(void);

/* fb_test_fmnist_dir returns the Fashion-MNIST folder (FB_FMNIST_DIR or
 * the Debian package's), or NULL when it is absent. */
const char *fb_test_fmnist_dir(void);

#endif
