/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_npy.c -- libFuzzer target: the .npy decoder (fb_data_npy_parse) on
 * one array image, read as features and as labels, for classification
 * and for regression. An accepted array must hold what it claims (finite
 * features, labels in range); a refused one leaves its output zeroed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check(const uint8_t *buf, size_t size, int labels, int task)
{
	fb_data_spec spec;
	fb_dataset out;
	fb_err rc;

	memset(&spec, 0, sizeof(spec));
	spec.task = task;
	spec.classes = task == FB_TASK_CLASSIFICATION ? 7 : 0;
	memset(&out, 0, sizeof(out));
	rc = fb_data_npy_parse(buf, size, "fuzz.npy", labels, &spec, &out);
	if (rc != FB_OK) {
		if (out.x != NULL || out.y != NULL) {
			abort();
		}
		return;
	}
	if (out.count == 0) {
		abort();
	}
	if (labels) {
		for (uint32_t i = 0; i < out.count; i++) {
			if (task == FB_TASK_CLASSIFICATION
			        ? out.y[i].cls < 0 || out.y[i].cls >= 7
			        : !isfinite(out.y[i].value)) {
				abort();
			}
		}
	} else {
		for (size_t i = 0; i < (size_t)out.count * out.dim; i++) {
			if (!isfinite(out.x[i])) {
				abort();
			}
		}
	}
	fb_free(out.x);
	fb_free(out.y);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	uint8_t *copy;

	if (!init) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		init = 1;
	}
	/* An exact-size heap copy so ASan sees any overread. */
	if ((copy = malloc(size > 0 ? size : 1)) == NULL) {
		return 0;
	}
	memcpy(copy, data, size);
	check(copy, size, 0, FB_TASK_CLASSIFICATION);
	check(copy, size, 1, FB_TASK_CLASSIFICATION);
	check(copy, size, 1, FB_TASK_REGRESSION);
	free(copy);
	return 0;
}
