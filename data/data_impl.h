/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_impl.h -- private to data/: the format readers behind
 * fb_dataset_load, and the pieces they share (growing buffers, label
 * checks, normalisation).
 *
 * Every reader fills an fb_dataset with the values as stored (x as float32,
 * norm NONE, classes = max label + 1 or spec->classes) or leaves it zeroed
 * and logs one line naming the file and what is wrong. None allocates more
 * than the file's contents justify: buffers grow as data arrives.
 */
#ifndef FB_DATA_DATA_IMPL_H
#define FB_DATA_DATA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "data/data.h"

/* Most examples and features one set may hold (uint32 counts, and byte
 * offsets far from overflow). */
#define FB_DATA_MAX_EXAMPLES 0xfffffffeu
#define FB_DATA_MAX_VALUES ((uint64_t)1 << 36) /* count x dim */

/*
 * fb_data_grow makes room for `need` elements of `elem` bytes in *p
 * (capacity *cap elements), doubling, from fb_alloc. Existing contents are
 * kept. Errors: FB_ENOMEM (*p unchanged).
 */
FB_MUST_CHECK fb_err fb_data_grow(
    void **p, size_t *cap, size_t need, size_t elem);

/*
 * fb_data_label_check says whether `v` is a usable label for `task`:
 * classification: a whole number in 0..classes-1 (classes > 0) or
 * 0..FB_DATA_MAX_CLASSES-1 (classes 0); regression: finite and within
 * float32. Returns 1 if good; else 0 with the reason in `why`.
 */
int fb_data_label_check(
    double v, int task, int64_t classes, char *why, size_t why_len);

/* fb_data_set_label stores a checked `v` into *y for `task`. */
void fb_data_set_label(double v, int task, fb_label *y);

/*
 * fb_data_finish_labels sets ds->classes: spec classes when > 0, else max
 * label + 1 (classification); 0 for regression.
 */
void fb_data_finish_labels(fb_dataset *ds, int64_t spec_classes);

/* fb_data_idx_read: the IDX pair with x = pixel / 255, norm NONE. */
FB_MUST_CHECK fb_err fb_data_idx_read(
    const char *images_path, const char *labels_path, fb_dataset *out);

/* fb_data_csv_read: a CSV file per spec (label column, features, task,
 * classes); sets ds->names. */
FB_MUST_CHECK fb_err fb_data_csv_read(
    const char *path, const fb_data_spec *spec, fb_dataset *out);

/*
 * fb_data_csv_read_norm reads a normalisation file for `ds` (dim features;
 * names checked against ds->names when set) into mean and std (dim floats
 * each). Errors: FB_EIO, FB_EFORMAT (file:line:column), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_data_csv_read_norm(
    const char *path, const fb_dataset *ds, float *mean, float *std);

/* fb_data_npy_read: a features .npy and a labels .npy. */
FB_MUST_CHECK fb_err fb_data_npy_read(const char *x_path, const char *y_path,
    const fb_data_spec *spec, fb_dataset *out);

/* fb_data_npz_read: the arrays spec->x_array and spec->y_array of a .npz
 * (stored or deflated zip entries). */
FB_MUST_CHECK fb_err fb_data_npz_read(
    const char *path, const fb_data_spec *spec, fb_dataset *out);

/*
 * fb_data_npy_parse decodes one .npy image (`len` bytes at `buf`, named
 * `name` in messages) as features (`labels` 0) or labels (`labels` 1) into
 * `out`: features set x, count and dim; labels set y and count (checked
 * per spec). Errors: FB_EFORMAT (logged), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_data_npy_parse(const uint8_t *buf, size_t len,
    const char *name, int labels, const fb_data_spec *spec, fb_dataset *out);

/*
 * fb_data_npy_join moves the features of `xs` (named xname) and the labels
 * of `ys` (yname) into `out`, after checking that they count the same
 * examples. Errors: FB_EFORMAT (logged).
 */
FB_MUST_CHECK fb_err fb_data_npy_join(const char *xname, fb_dataset *xs,
    const char *yname, fb_dataset *ys, const fb_data_spec *spec,
    fb_dataset *out);

/*
 * fb_data_normalize applies x = (v - mean[j]) / std[j] in float32 to ds
 * and records `norm` with copies of mean and std (dim each). Errors:
 * FB_ENOMEM (ds unchanged).
 */
FB_MUST_CHECK fb_err fb_data_normalize(
    fb_dataset *ds, fb_data_norm norm, const float *mean, const float *std);

/* fb_data_normalize_scalar is fb_data_normalize with one mean and std. */
FB_MUST_CHECK fb_err fb_data_normalize_scalar(
    fb_dataset *ds, float mean, float std);

/* fb_data_copy_record copies src's mean, std and names into dst (which
 * has none). Errors: FB_ENOMEM (dst's copies freed). */
FB_MUST_CHECK fb_err fb_data_copy_record(
    const fb_dataset *src, fb_dataset *dst);

#endif
