/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_file.c -- libFuzzer target: fb_dataset_load on a data file as a
 * box would read it. Input: one byte choosing the format (even: CSV with
 * label column "y"; odd: .npz with arrays x and y) and the normalisation
 * (bit 1: own, else none), then the file's bytes, which go to a memfd read
 * through /proc/self/fd. A loaded set must be consistent (finite
 * normalised features, labels in range, statistics for own); a refused one
 * leaves the outputs zeroed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	char path[64];
	fb_data_spec spec;
	fb_dataset ds;
	fb_err rc;
	int fd;

	if (!init) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		init = 1;
	}
	if (size < 1) {
		return 0;
	}
	if ((fd = memfd_create("fuzz-data", MFD_CLOEXEC)) < 0) {
		return 0;
	}
	if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) {
		close(fd);
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	memset(&spec, 0, sizeof(spec));
	spec.format = (data[0] & 1) ? FB_DATA_NPZ : FB_DATA_CSV;
	spec.file = path;
	spec.labels = "";
	spec.valid = "";
	spec.valid_labels = "";
	spec.label_column = "y";
	spec.x_array = "x";
	spec.y_array = "y";
	spec.task = FB_TASK_CLASSIFICATION;
	spec.normalize = (data[0] & 2) ? FB_NORM_OWN : FB_NORM_NONE;
	spec.normalize_file = "";
	spec.std = 1.0;
	memset(&ds, 0xa5, sizeof(ds));
	rc = fb_dataset_load(&spec, NULL, &ds, NULL);
	if (rc != FB_OK) {
		if (ds.x != NULL || ds.y != NULL || ds.count != 0 ||
		    ds.names != NULL || ds.mean != NULL) {
			abort();
		}
	} else {
		if (ds.count == 0 || ds.dim == 0 || ds.classes == 0) {
			abort();
		}
		for (size_t i = 0; i < (size_t)ds.count * ds.dim; i++) {
			if (!isfinite(ds.x[i])) {
				abort();
			}
		}
		for (uint32_t i = 0; i < ds.count; i++) {
			if (ds.y[i].cls < 0 ||
			    (uint32_t)ds.y[i].cls >= ds.classes) {
				abort();
			}
		}
		if ((spec.normalize == FB_NORM_OWN) != (ds.mean != NULL)) {
			abort();
		}
		fb_dataset_fini(&ds);
	}
	close(fd);
	return 0;
}
