/* SPDX-License-Identifier: Apache-2.0 */
/*
 * model_layout.c -- libFuzzer target: a model's layout as a welcome
 * carries it from the coordinator (fb_model_open_layout). An accepted
 * layout must pack back to the very bytes it came from and hold a
 * parameter count within bounds; a refused one returns no model.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int quiet;
	fb_model_spec spec;
	fb_model *m = (fb_model *)&spec;
	uint8_t *back = NULL;
	size_t len = 0;

	if (!quiet) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		quiet = 1;
	}
	memset(&spec, 0, sizeof(spec));
	strcpy(spec.arch, "init");
	spec.input_dim = 784;
	spec.classes = 10;
	if (fb_model_open_layout(data, size, &spec, &m) != FB_OK) {
		if (m != NULL) {
			abort();
		}
		return 0;
	}
	if (fb_model_param_count(m) < 1 ||
	    fb_model_param_count(m) >= ((uint64_t)1 << 40) ||
	    fb_model_layout_pack(m, &back, &len) != FB_OK || len != size ||
	    memcmp(back, data, size) != 0) {
		abort();
	}
	fb_free(back);
	fb_model_close(m);
	return 0;
}
