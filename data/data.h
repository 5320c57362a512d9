/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data.h -- datasets for training and evaluation.
 *
 * Loads IDX files (gzip'd or plain; the format of MNIST and Fashion-MNIST as
 * shipped by Debian's dataset-fashion-mnist), preprocesses pixels to floats,
 * and partitions a training set among N workers (iid, Dirichlet(alpha) label
 * skew, or label shards) so that workers 0..N-1 given the same seed get
 * disjoint shards that together cover the whole set.
 */
#ifndef FB_DATA_DATA_H
#define FB_DATA_DATA_H

#include <stdint.h>

#include "common/err.h"

/* Input preprocessing, recorded in exported models' metadata. */
#define FB_FMNIST_MEAN 0.2860f
#define FB_FMNIST_STD 0.3530f
#define FB_FMNIST_PREPROCESSING                                           \
	"x = (pixel / 255 - 0.2860) / 0.3530; pixels row-major 28x28 as "  \
	"784 features; labels 0..9"
#define FB_FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

typedef struct fb_dataset {
	uint32_t count;   /* examples */
	uint32_t dim;     /* features per example */
	uint32_t classes; /* labels are < classes */
	float *x;         /* count * dim, row-major, preprocessed */
	uint8_t *y;       /* count labels */
} fb_dataset;

/*
 * fb_dataset_load_idx reads an IDX3 ubyte image file and an IDX1 ubyte label
 * file (each gzip'd or plain; detected by magic) into `out`, preprocessing
 * pixels with FB_FMNIST_MEAN/STD. `classes` is set to max label + 1 but at
 * least 10. Truncated, corrupt or mismatched files give FB_EFORMAT (and a
 * log line naming the file and what is wrong), missing ones FB_EIO; `out` is
 * left zeroed on error. Blocks on file I/O.
 */
FB_MUST_CHECK fb_err fb_dataset_load_idx(const char *images_path,
    const char *labels_path, fb_dataset *out);

/*
 * fb_dataset_load_fmnist loads the train (`train` != 0) or test split from
 * folder `dir` holding {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.
 */
FB_MUST_CHECK fb_err fb_dataset_load_fmnist(const char *dir, int train,
    fb_dataset *out);

/* fb_dataset_fini frees what a load allocated; safe on a zeroed struct. */
void fb_dataset_fini(fb_dataset *ds);

/*
 * fb_dataset_subset copies the examples listed in `idx` (count entries, each
 * < src->count) into a new dataset `out`. Errors: FB_ENOMEM, FB_EINVAL.
 */
FB_MUST_CHECK fb_err fb_dataset_subset(const fb_dataset *src,
    const uint32_t *idx, uint32_t count, fb_dataset *out);

typedef enum fb_partition_scheme {
	FB_PARTITION_IID = 0,
	FB_PARTITION_DIRICHLET,
	FB_PARTITION_SHARDS,
} fb_partition_scheme;

typedef struct fb_partition_spec {
	fb_partition_scheme scheme;
	uint32_t workers;           /* N >= 1 */
	uint32_t index;             /* this worker, < workers */
	uint64_t seed;              /* same on every worker */
	double alpha;               /* dirichlet: concentration > 0 */
	uint32_t shards_per_worker; /* shards: label shards per worker >= 1 */
} fb_partition_spec;

/*
 * fb_partition_indices computes worker `spec->index`'s share of a labelled
 * set of `count` examples with labels `labels` (< classes). It computes the
 * whole assignment from `seed`, so workers 0..N-1 get disjoint index sets
 * whose union is 0..count-1, every worker at least one example. `*idx` is
 * heap-allocated (free with fb_free), sorted ascending. Errors: FB_EINVAL
 * (bad spec, or more workers than examples), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_partition_indices(const uint8_t *labels,
    uint32_t count, uint32_t classes, const fb_partition_spec *spec,
    uint32_t **idx, uint32_t *n);

/* fb_partition_scheme_names lists the config names, NULL-terminated, in
 * fb_partition_scheme order: "iid", "dirichlet", "shards". */
extern const char *const fb_partition_scheme_names[];

#endif
