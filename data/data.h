/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data.h -- datasets for training and evaluation.
 *
 * A box's data comes from its own files: CSV (a header row, a label column,
 * numeric features), NumPy .npy (a features array and a labels array) or
 * .npz (named arrays), or IDX (MNIST and Fashion-MNIST as shipped by
 * Debian's dataset-fashion-mnist). fb_dataset_load reads the training file
 * (and a validation file when one is named), checks every value, splits the
 * training set among simulated workers when asked (iid, Dirichlet(alpha)
 * label skew, or label shards: workers 0..N-1 given the same seed get
 * disjoint shards that together cover the whole set), and normalises the
 * features: per feature with the mean and standard deviation of this box's
 * own training data, with constants from a file or the config, or not at
 * all. fb_dataset_describe says what was done, for the model file's
 * metadata. Labels are int32 classes or, for regression, float targets.
 *
 * Bad input loads nothing: the call logs one line naming the file (and for
 * CSV the line and column, for NumPy the array) and what is wrong, and
 * leaves its outputs zeroed.
 */
#ifndef FB_DATA_DATA_H
#define FB_DATA_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "model/model.h"

/* Fashion-MNIST's preprocessing (the IDX default), recorded in models. */
#define FB_FMNIST_MEAN 0.2860f
#define FB_FMNIST_STD 0.3530f
#define FB_FMNIST_PREPROCESSING                                           \
	"x = (pixel / 255 - 0.2860) / 0.3530; pixels row-major 28x28 as "  \
	"784 features; labels 0..9"
#define FB_FMNIST_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

/* Labels of a classification set are below this (a sanity bound that keeps
 * per-class tables small; models take up to 65536 classes). */
#define FB_DATA_MAX_CLASSES (1u << 24)

/* File formats (data.format). */
typedef enum fb_data_format {
	FB_DATA_CSV = 0, /* header row; label column; numeric features */
	FB_DATA_NPY,     /* features .npy + labels .npy */
	FB_DATA_NPZ,     /* one .npz with a features and a labels array */
	FB_DATA_IDX,     /* IDX3 ubyte images + IDX1 ubyte labels (gzip ok) */
} fb_data_format;

/* How features are normalised (data.normalize). */
typedef enum fb_data_norm {
	FB_NORM_AUTO = 0, /* idx: scalar (Fashion-MNIST's); others: own */
	FB_NORM_OWN,      /* per feature, this box's training mean and std */
	FB_NORM_FILE,     /* per feature, from a CSV file (mean and std rows) */
	FB_NORM_SCALAR,   /* one mean and std for every feature */
	FB_NORM_NONE,     /* features as stored */
} fb_data_norm;

/*
 * fb_data_spec says where a box's data is and how to read it. It is filled
 * by the config loader (FB_DATA_CFG_FIELDS); strings are "" when unset.
 */
typedef struct fb_data_spec {
	int format;               /* fb_data_format */
	char *file;               /* csv, npz: the data; npy: the features
	                           * array; idx: the images */
	char *labels;             /* npy, idx: the labels file */
	char *valid;              /* validation data, same format; "" = none */
	char *valid_labels;       /* npy, idx: its labels file */
	char *label_column;       /* csv: the label column's header name */
	fb_cfg_str_list features; /* csv: feature columns in order; none =
	                           * every column but the label's */
	char *x_array;            /* npz: the features array's name */
	char *y_array;            /* npz: the labels array's name */
	int task;                 /* fb_task */
	int64_t classes;          /* classification: labels must be below it;
	                           * 0 = max label + 1 */
	int normalize;            /* fb_data_norm */
	char *normalize_file;     /* file: CSV with a header naming the
	                           * features and rows "mean" and "std" */
	double mean;              /* scalar: x = (v - mean) / std */
	double std;               /* scalar: > 0 */
} fb_data_spec;

typedef struct fb_dataset {
	uint32_t count;   /* examples */
	uint32_t dim;     /* features per example */
	uint32_t classes; /* classification: labels are < classes;
	                   * regression: 0 */
	fb_task task;
	float *x;         /* count * dim, row-major, normalised */
	fb_label *y;      /* count labels */
	/* What was done to the features (fb_dataset_describe). */
	fb_data_format format;
	fb_data_norm norm;  /* OWN, FILE, SCALAR or NONE (never AUTO) */
	float *mean;        /* dim values; NULL for NONE */
	float *std;         /* dim values, > 0; NULL for NONE */
	char **names;       /* csv: dim feature names (heap) in x's order;
	                     * NULL for other formats */
	uint32_t raw_count; /* examples in the file before any split */
} fb_dataset;

/* Config names, NULL-terminated, in enum order. */
extern const char *const fb_data_format_names[]; /* "csv", "npy", ... */
extern const char *const fb_data_norm_names[];   /* "auto", "own", ... */
extern const char *const fb_data_task_names[];   /* "classification", ... */

/*
 * FB_DATA_CFG_FIELDS expands to the config schema entries shared by every
 * program that reads data files, under `prefix` (e.g. "data"), for the
 * fb_data_spec member `member` of config struct `type`. The file keys
 * (file, labels, valid, ...) and task/classes are each program's own.
 */
#define FB_DATA_CFG_FIELDS(prefix, type, member)                          \
	{prefix ".format", FB_CFG_ENUM, offsetof(type, member.format),    \
	    "csv", 1, 0, fb_data_format_names,                            \
	    "files' format: csv, npy (features and labels arrays), npz "  \
	    "or idx"},                                                    \
	{prefix ".label_column", FB_CFG_STRING,                           \
	    offsetof(type, member.label_column), "label", 1, 0, NULL,     \
	    "csv: header name of the label (target) column"},             \
	{prefix ".features", FB_CFG_STR_LIST,                             \
	    offsetof(type, member.features), "[]", 1, 0, NULL,            \
	    "csv: feature columns, in order; empty = every column but "   \
	    "the label's (other columns are ignored)"},                   \
	{prefix ".x_array", FB_CFG_STRING, offsetof(type, member.x_array), \
	    "x", 1, 0, NULL, "npz: name of the features array"},          \
	{prefix ".y_array", FB_CFG_STRING, offsetof(type, member.y_array), \
	    "y", 1, 0, NULL, "npz: name of the labels array"},            \
	{prefix ".normalize", FB_CFG_ENUM,                                \
	    offsetof(type, member.normalize), "auto", 1, 0,               \
	    fb_data_norm_names,                                           \
	    "features: own (per feature, mean and std of the data read "  \
	    "here: a worker's own training shard), file, scalar, none; "  \
	    "auto = scalar for idx, own otherwise"},                      \
	{prefix ".normalize_file", FB_CFG_PATH,                         \
	    offsetof(type, member.normalize_file), "", 1, 0, NULL,        \
	    "normalize file: CSV whose header names the features (after " \
	    "a first column) and whose rows are mean and std"},           \
	{prefix ".mean", FB_CFG_FLOAT, offsetof(type, member.mean),       \
	    "0.2860", -1e30, 1e30, NULL,                                  \
	    "normalize scalar: x = (v - mean) / std for every feature "   \
	    "(v = pixel / 255 for idx)"},                                 \
	{prefix ".std", FB_CFG_FLOAT, offsetof(type, member.std),         \
	    "0.3530", 1e-30, 1e30, NULL, "normalize scalar: see mean"}

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
 * fb_dataset_load reads the data `spec` names: the training file into
 * `train` and, when spec->valid is set and `valid` is non-NULL, the
 * validation file into `valid` (else `valid` is left zeroed). With `part`
 * non-NULL the training set is split first and `train` gets worker
 * part->index's share (a simulation of several boxes on one data set;
 * regression data splits iid only). Normalisation statistics (own) come
 * from `train` after the split and are applied to both sets; a feature
 * with no spread there is only centred (std 1). Labels are checked:
 * classification labels must be whole numbers in 0..classes-1
 * (spec->classes; any non-negative int32 below FB_DATA_MAX_CLASSES when it
 * is 0, and classes is then max label + 1), regression targets finite.
 * Errors, each logged with the file and what is wrong (CSV:
 * file:line:column; NumPy: the array): FB_EIO (missing or unreadable
 * file), FB_EFORMAT (bad contents), FB_EINVAL (bad spec, or a split that
 * cannot be made), FB_ENOMEM. On error both outputs are zeroed. The caller
 * owns the outputs on FB_OK (fb_dataset_fini). Blocks on file I/O.
 */
FB_MUST_CHECK fb_err fb_dataset_load(const fb_data_spec *spec,
    const fb_partition_spec *part, fb_dataset *train, fb_dataset *valid);

/*
 * fb_data_spec_check cross-checks a spec that a config file `path` gave
 * under `prefix` (e.g. "data"), for a config loader. `used` says whether
 * the program will read the files (data.dataset files); if not, naming a
 * file is an error too (it would be silently ignored). file_key and
 * labels_key are the program's names for spec->file and spec->labels
 * (e.g. "train", "train_labels"). Errors: FB_ECONFIG, logged with the key.
 */
FB_MUST_CHECK fb_err fb_data_spec_check(const fb_data_spec *spec, int used,
    const char *prefix, const char *file_key, const char *labels_key,
    const char *path);

/*
 * fb_dataset_load_eval reads an evaluation set (the coordinator's central
 * evaluation): fb_dataset_load of spec->file alone, no split. Same errors.
 */
FB_MUST_CHECK fb_err fb_dataset_load_eval(const fb_data_spec *spec,
    fb_dataset *out);

/*
 * fb_dataset_describe writes into *out (heap, fb_free) one line saying
 * what the features and labels of `ds` are and how they were normalised,
 * with the constants (float32, 9 significant digits, so that they
 * round-trip), e.g. for the model file's "fedbox.preprocessing":
 *   csv: 30 features (radius, texture, ...) in this order; x[j] = (v[j] -
 *   mean[j]) / std[j], mean = [...], std = [...] (own: this box's
 *   training data); label column "diagnosis": classes 0..1
 * `spec` may be NULL (the label column is then not named). Errors:
 * FB_ENOMEM, FB_EINVAL (ds NULL or empty).
 */
FB_MUST_CHECK fb_err fb_dataset_describe(const fb_data_spec *spec,
    const fb_dataset *ds, char **out);

/*
 * fb_dataset_check_fit checks that `ds` fits a model taking `input_dim`
 * features for `task` with `classes` outputs: same width and task, every
 * class label below `classes`. Errors: FB_EINVAL, logged with the first
 * thing that differs (or the first bad example).
 */
FB_MUST_CHECK fb_err fb_dataset_check_fit(const fb_dataset *ds,
    uint32_t input_dim, fb_task task, uint32_t classes);

/*
 * fb_dataset_load_idx reads an IDX3 ubyte image file and an IDX1 ubyte label
 * file (each gzip'd or plain; detected by magic) into `out`, preprocessing
 * pixels with FB_FMNIST_MEAN/STD (norm SCALAR). `classes` is set to max
 * label + 1 but at least 10. Truncated, corrupt or mismatched files give
 * FB_EFORMAT (and a log line naming the file and what is wrong), missing
 * ones FB_EIO; `out` is left zeroed on error. Blocks on file I/O.
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
 * < src->count) into a new dataset `out`, with src's normalisation record.
 * Errors: FB_ENOMEM, FB_EINVAL.
 */
FB_MUST_CHECK fb_err fb_dataset_subset(const fb_dataset *src,
    const uint32_t *idx, uint32_t count, fb_dataset *out);

/*
 * fb_partition_indices computes worker `spec->index`'s share of a labelled
 * set of `count` examples with labels `labels` (class labels < classes;
 * classes 0 means unlabelled for splitting, e.g. regression targets, and
 * allows only iid). It computes the whole assignment from `seed`, so
 * workers 0..N-1 get disjoint index sets whose union is 0..count-1, every
 * worker at least one example. `*idx` is heap-allocated (free with
 * fb_free), sorted ascending. Errors: FB_EINVAL (bad spec, or more workers
 * than examples), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_partition_indices(const fb_label *labels,
    uint32_t count, uint32_t classes, const fb_partition_spec *spec,
    uint32_t **idx, uint32_t *n);

/* fb_partition_scheme_names lists the config names, NULL-terminated, in
 * fb_partition_scheme order: "iid", "dirichlet", "shards". */
extern const char *const fb_partition_scheme_names[];

#endif
