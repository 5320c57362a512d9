/* SPDX-License-Identifier: Apache-2.0 */
/*
 * data_test.c -- unit tests of data/: IDX loading (the real Fashion-MNIST
 * files and hand-made good and broken ones) and partitioning among workers.
 *
 * Broken files must give the documented code, one log line naming the file,
 * a zeroed `out`, and no leak (the suite also runs under ASan). Reference
 * values are read straight from the files with zlib here, not through the
 * loader.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "common/util.h"
#include "data/data.h"
#include "tests/unit/harness.h"

#define IMG_MAGIC 0x00000803u
#define LAB_MAGIC 0x00000801u

/* ---- helpers -------------------------------------------------------------- */

static char *
tmp_path(const char *name)
{
	static char bufs[4][512];
	static int next;
	char *p = bufs[next++ % 4];
	snprintf(p, sizeof(bufs[0]), "%s/%s", fb_test_tmpdir(), name);
	return p;
}

static void
write_plain(const char *path, const uint8_t *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(buf, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

static void
write_gz(const char *path, const uint8_t *buf, size_t len)
{
	gzFile gz = gzopen(path, "wb");
	assert_non_null(gz);
	assert_int_equal(gzwrite(gz, buf, (unsigned)len), (int)len);
	assert_int_equal(gzclose(gz), Z_OK);
}

static uint8_t *
read_whole(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;
	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	assert_true(n > 0);
	rewind(f);
	buf = malloc((size_t)n);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void
put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/*
 * make_idx builds an IDX file image in a malloc'd buffer: header with
 * `magic` and `ndims` sizes, then `payload_len` bytes of `payload`.
 */
static uint8_t *
make_idx(uint32_t magic, const uint32_t *dims, size_t ndims,
    const uint8_t *payload, size_t payload_len, size_t *len)
{
	size_t hdr = 4 + 4 * ndims;
	uint8_t *buf = malloc(hdr + payload_len + 1);
	assert_non_null(buf);
	put_be32(buf, magic);
	for (size_t i = 0; i < ndims; i++) {
		put_be32(buf + 4 + 4 * i, dims[i]);
	}
	if (payload_len > 0) {
		memcpy(buf + hdr, payload, payload_len);
	}
	*len = hdr + payload_len;
	return buf;
}

/* A small synthetic set: SYN_COUNT images of SYN_ROWS x SYN_COLS. */
#define SYN_COUNT 64u
#define SYN_ROWS 28u
#define SYN_COLS 28u
#define SYN_PIXELS (SYN_COUNT * SYN_ROWS * SYN_COLS)

static uint8_t
syn_pixel(size_t i)
{
	/* A dark border around a varied middle, like a real image, so that
	 * gzip makes Huffman-coded blocks (not stored ones) of it. */
	size_t img = i / (SYN_ROWS * SYN_COLS);
	size_t r = i / SYN_COLS % SYN_ROWS;
	size_t c = i % SYN_COLS;

	if (r < 4 || r >= 24 || c < 4 || c >= 24) {
		return 0;
	}
	return (uint8_t)((r * c * (img + 3)) >> 2);
}

static uint8_t
syn_label(size_t i)
{
	return (uint8_t)(i % 10);
}

/* write_syn writes the synthetic images and labels (gz or plain) with
 * optional changes: a different label count and extra payload bytes. */
static void
write_syn(const char *img_path, const char *lab_path, int gz,
    uint32_t label_count, size_t img_extra)
{
	uint32_t idims[3] = {SYN_COUNT, SYN_ROWS, SYN_COLS};
	uint32_t ldims[1] = {label_count};
	uint8_t *pix = malloc(SYN_PIXELS + img_extra);
	uint8_t *lab = malloc(label_count);
	uint8_t *file;
	size_t len;

	assert_non_null(pix);
	assert_non_null(lab);
	for (size_t i = 0; i < SYN_PIXELS + img_extra; i++) {
		pix[i] = syn_pixel(i);
	}
	for (size_t i = 0; i < label_count; i++) {
		lab[i] = syn_label(i);
	}
	file = make_idx(IMG_MAGIC, idims, 3, pix, SYN_PIXELS + img_extra,
	    &len);
	(gz ? write_gz : write_plain)(img_path, file, len);
	free(file);
	file = make_idx(LAB_MAGIC, ldims, 1, lab, label_count, &len);
	(gz ? write_gz : write_plain)(lab_path, file, len);
	free(file);
	free(pix);
	free(lab);
}

static float
expected_x(uint8_t p)
{
	return ((float)p / 255.0f - 0.2860f) / 0.3530f;
}

static void
assert_zeroed(const fb_dataset *ds)
{
	assert_int_equal(ds->count, 0);
	assert_int_equal(ds->dim, 0);
	assert_int_equal(ds->classes, 0);
	assert_null(ds->x);
	assert_null(ds->y);
	assert_null(ds->mean);
	assert_null(ds->std);
	assert_null(ds->names);
}

/* Captures what is logged to stderr between begin and end. */
typedef struct capture {
	int saved_fd;
	char path[512];
	char text[4096];
} capture;

static void
capture_begin(capture *c)
{
	int fd;
	snprintf(c->path, sizeof(c->path), "%s/stderr.txt", fb_test_tmpdir());
	fflush(stderr);
	c->saved_fd = dup(STDERR_FILENO);
	assert_true(c->saved_fd >= 0);
	fd = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	close(fd);
}

/* capture_end restores stderr and returns the number of lines logged. */
static int
capture_end(capture *c)
{
	FILE *f;
	size_t n;
	int lines = 0;

	fflush(stderr);
	assert_int_equal(dup2(c->saved_fd, STDERR_FILENO), STDERR_FILENO);
	close(c->saved_fd);
	f = fopen(c->path, "rb");
	assert_non_null(f);
	n = fread(c->text, 1, sizeof(c->text) - 1, f);
	fclose(f);
	c->text[n] = '\0';
	for (size_t i = 0; i < n; i++) {
		lines += c->text[i] == '\n';
	}
	/* Shown so that a failing run says what the loader said. */
	fputs(c->text, stderr);
	return lines;
}

/*
 * expect_load_error loads `img`/`lab` into a garbage-filled dataset and
 * checks the code, that `out` is zeroed and that exactly one line naming
 * `names` (a file) and containing `what` was logged.
 */
static void
expect_load_error(const char *img, const char *lab, fb_err want,
    const char *names, const char *what)
{
	fb_dataset ds;
	capture cap;
	fb_err rc;

	memset(&ds, 0xa5, sizeof(ds));
	capture_begin(&cap);
	rc = fb_dataset_load_idx(img, lab, &ds);
	assert_int_equal(capture_end(&cap), 1);
	assert_int_equal(rc, want);
	assert_zeroed(&ds);
	assert_non_null(strstr(cap.text, names));
	if (what != NULL) {
		assert_non_null(strstr(cap.text, what));
	}
	fb_dataset_fini(&ds);
}

/* read_raw reads `len` bytes at `offset` of a (gzip'd) file with zlib. */
static void
read_raw(const char *path, size_t offset, uint8_t *buf, size_t len)
{
	uint8_t skip[64];
	gzFile gz = gzopen(path, "rb");
	assert_non_null(gz);
	assert_true(offset <= sizeof(skip));
	assert_int_equal(gzread(gz, skip, (unsigned)offset), (int)offset);
	assert_int_equal(gzread(gz, buf, (unsigned)len), (int)len);
	gzclose(gz);
}

/* ---- real Fashion-MNIST -------------------------------------------------- */

static void
check_fmnist_split(int train, uint32_t want_count)
{
	const char *dir = fb_test_fmnist_dir();
	const char *split = train ? "train" : "t10k";
	char path[512];
	uint8_t raw[28 * 28];
	uint8_t raw_label;
	uint32_t per_class[10] = {0};
	double sum = 0.0, sumsq = 0.0;
	fb_dataset ds;

	if (dir == NULL) {
		print_message("Fashion-MNIST not installed; skipping\n");
		skip();
	}
	assert_int_equal(fb_dataset_load_fmnist(dir, train, &ds), FB_OK);
	assert_int_equal(ds.count, want_count);
	assert_int_equal(ds.dim, 784);
	assert_int_equal(ds.classes, 10);
	assert_non_null(ds.x);
	assert_non_null(ds.y);
	for (uint32_t i = 0; i < ds.count; i++) {
		assert_true(ds.y[i].cls >= 0 && ds.y[i].cls < 10);
		per_class[ds.y[i].cls]++;
	}
	/* Fashion-MNIST is balanced: 6000 (train) or 1000 (test) each. */
	for (int c = 0; c < 10; c++) {
		assert_int_equal(per_class[c], want_count / 10);
	}

	snprintf(path, sizeof(path), "%s/%s-images-idx3-ubyte.gz", dir, split);
	read_raw(path, 16, raw, sizeof(raw));
	for (size_t i = 0; i < sizeof(raw); i++) {
		assert_true(ds.x[i] == expected_x(raw[i]));
	}
	snprintf(path, sizeof(path), "%s/%s-labels-idx1-ubyte.gz", dir, split);
	read_raw(path, 8, &raw_label, 1);
	assert_int_equal(ds.y[0].cls, raw_label);
	/* both splits open with an ankle boot */
	assert_int_equal(ds.y[0].cls, 9);

	/* MEAN/STD are the set's own statistics: x is about N(0, 1). */
	for (size_t i = 0; i < (size_t)ds.count * ds.dim; i++) {
		sum += ds.x[i];
		sumsq += (double)ds.x[i] * ds.x[i];
	}
	sum /= (double)ds.count * ds.dim;
	sumsq /= (double)ds.count * ds.dim;
	assert_true(fabs(sum) < 0.01);
	assert_true(fabs(sqrt(sumsq - sum * sum) - 1.0) < 0.01);
	fb_dataset_fini(&ds);
	assert_zeroed(&ds);
}

static void
test_fmnist_train(void **state)
{
	check_fmnist_split(1, 60000);
}

static void
test_fmnist_test(void **state)
{
	check_fmnist_split(0, 10000);
}

static void
test_preprocessing_values(void **state)
{
	/* Independent of the loader: the formula's ends, by hand. */
	assert_true(fabsf(expected_x(0) - (-0.286f / 0.353f)) < 1e-6f);
	assert_true(fabsf(expected_x(255) - (0.714f / 0.353f)) < 1e-6f);
	assert_true(fabsf(expected_x(0) + 0.8101983f) < 1e-6f);
	assert_true(fabsf(expected_x(255) - 2.0226629f) < 1e-6f);
	/* Every pixel value agrees with the formula in double precision. */
	for (int p = 0; p < 256; p++) {
		double want = ((double)p / 255.0 - 0.2860) / 0.3530;
		assert_true(fabs(expected_x((uint8_t)p) - want) < 1e-6);
	}
}

static void
test_missing_fmnist_dir(void **state)
{
	fb_dataset ds;
	capture cap;

	memset(&ds, 0xa5, sizeof(ds));
	capture_begin(&cap);
	assert_int_equal(fb_dataset_load_fmnist(tmp_path("no-such-dir"), 1,
	                     &ds),
	    FB_EIO);
	assert_int_equal(capture_end(&cap), 1);
	assert_zeroed(&ds);
	assert_non_null(strstr(cap.text, "train-images-idx3-ubyte.gz"));
}

/* ---- hand-made files ----------------------------------------------------- */

static void
check_syn(const fb_dataset *ds)
{
	assert_int_equal(ds->count, SYN_COUNT);
	assert_int_equal(ds->dim, SYN_ROWS * SYN_COLS);
	assert_int_equal(ds->classes, 10);
	for (size_t i = 0; i < SYN_PIXELS; i++) {
		assert_true(ds->x[i] == expected_x(syn_pixel(i)));
	}
	for (size_t i = 0; i < SYN_COUNT; i++) {
		assert_int_equal(ds->y[i].cls, syn_label(i));
	}
}

static void
test_gz_synthetic_loads(void **state)
{
	char *img = tmp_path("syn-img.gz");
	char *lab = tmp_path("syn-lab.gz");
	fb_dataset ds;

	write_syn(img, lab, 1, SYN_COUNT, 0);
	assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
	check_syn(&ds);
	fb_dataset_fini(&ds);
	fb_dataset_fini(&ds); /* a second fini is harmless */
}

static void
test_plain_loads(void **state)
{
	char *img = tmp_path("plain-img");
	char *lab = tmp_path("plain-lab");
	fb_dataset ds;

	write_syn(img, lab, 0, SYN_COUNT, 0);
	assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
	check_syn(&ds);
	fb_dataset_fini(&ds);
}

static void
test_classes_from_labels(void **state)
{
	char *img = tmp_path("cls-img");
	char *lab = tmp_path("cls-lab");
	uint32_t idims[3] = {3, 2, 2};
	uint32_t ldims[1] = {3};
	uint8_t pix[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};
	uint8_t few[3] = {0, 3, 1};
	uint8_t many[3] = {0, 12, 1};
	uint8_t *file;
	size_t len;
	fb_dataset ds;

	file = make_idx(IMG_MAGIC, idims, 3, pix, sizeof(pix), &len);
	write_plain(img, file, len);
	free(file);
	file = make_idx(LAB_MAGIC, ldims, 1, few, sizeof(few), &len);
	write_plain(lab, file, len);
	free(file);
	assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
	assert_int_equal(ds.classes, 10); /* at least 10 */
	assert_int_equal(ds.dim, 4);
	assert_true(ds.x[11] == expected_x(255));
	fb_dataset_fini(&ds);

	file = make_idx(LAB_MAGIC, ldims, 1, many, sizeof(many), &len);
	write_plain(lab, file, len);
	free(file);
	assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
	assert_int_equal(ds.classes, 13); /* max label + 1 */
	fb_dataset_fini(&ds);
}

static void
test_truncated_gz(void **state)
{
	char *img = tmp_path("trunc-img.gz");
	char *lab = tmp_path("trunc-lab.gz");
	uint8_t *buf;
	size_t len;

	write_syn(img, lab, 1, SYN_COUNT, 0);
	buf = read_whole(img, &len);
	write_plain(img, buf, len / 2); /* cut in the deflate stream */
	free(buf);
	expect_load_error(img, lab, FB_EFORMAT, img, "truncated");
}

static void
test_truncated_plain(void **state)
{
	char *img = tmp_path("tp-img");
	char *lab = tmp_path("tp-lab");
	uint8_t *buf;
	size_t len;
	char what[128];

	write_syn(img, lab, 0, SYN_COUNT, 0);
	buf = read_whole(img, &len);
	write_plain(img, buf, len - 100);
	free(buf);
	snprintf(what, sizeof(what),
	    "truncated: expected %u bytes of pixels, got %u", SYN_PIXELS,
	    SYN_PIXELS - 100);
	expect_load_error(img, lab, FB_EFORMAT, img, what);

	/* A header cut short is truncated too. */
	buf = read_whole(lab, &len);
	write_plain(lab, buf, 6);
	free(buf);
	expect_load_error(tmp_path("tp-img"), lab, FB_EFORMAT, lab,
	    "truncated");
}

static void
test_corrupt_gz(void **state)
{
	char *img = tmp_path("corrupt-img.gz");
	char *lab = tmp_path("corrupt-lab.gz");
	uint8_t *good, *buf;
	size_t len;

	write_syn(img, lab, 1, SYN_COUNT, 0);
	good = read_whole(img, &len);
	assert_true(len > 2000 && len < SYN_PIXELS / 2); /* really deflated */
	buf = malloc(len);
	assert_non_null(buf);
	/* Flip bytes at several places inside the deflate stream (after the
	 * 10-byte gzip header, before the 8-byte trailer). */
	for (size_t at = 20; at + 8 < len - 8; at = at * 3 + 500) {
		memcpy(buf, good, len);
		for (size_t i = at; i < at + 8; i++) {
			buf[i] ^= 0x5a;
		}
		write_plain(img, buf, len);
		expect_load_error(img, lab, FB_EFORMAT, img, NULL);
	}
	/* A bad CRC alone is caught as well. */
	memcpy(buf, good, len);
	buf[len - 8] ^= 0xff;
	write_plain(img, buf, len);
	expect_load_error(img, lab, FB_EFORMAT, img,
	    "corrupt gzip data: incorrect data check");
	free(buf);
	free(good);
}

static void
test_wrong_magic(void **state)
{
	char *img = tmp_path("magic-img");
	char *lab = tmp_path("magic-lab");
	uint8_t *buf;
	size_t len;

	write_syn(img, lab, 0, SYN_COUNT, 0);
	buf = read_whole(img, &len);
	buf[0] = 0x12;
	write_plain(img, buf, len);
	free(buf);
	expect_load_error(img, lab, FB_EFORMAT, img, "magic");

	/* Images and labels swapped. */
	write_syn(img, lab, 0, SYN_COUNT, 0);
	expect_load_error(lab, img, FB_EFORMAT, lab, "dimensions");

	/* Not ubyte (0x0D is float). */
	buf = read_whole(img, &len);
	buf[2] = 0x0d;
	write_plain(img, buf, len);
	free(buf);
	expect_load_error(img, lab, FB_EFORMAT, img, "ubyte");
}

static void
test_count_mismatch(void **state)
{
	char *img = tmp_path("mis-img.gz");
	char *lab = tmp_path("mis-lab.gz");

	write_syn(img, lab, 1, SYN_COUNT - 1, 0);
	expect_load_error(img, lab, FB_EFORMAT, lab, "labels");
	write_syn(img, lab, 1, SYN_COUNT + 1, 0);
	expect_load_error(img, lab, FB_EFORMAT, lab, "labels");
}

static void
test_enormous_dims(void **state)
{
	char *img = tmp_path("huge-img");
	char *lab = tmp_path("huge-lab.gz");
	uint32_t idims[3] = {0xffffffffu, 28, 28};
	uint8_t pix[16] = {0};
	uint8_t *zeros;
	uint8_t *file;
	size_t len;

	write_syn(tmp_path("unused-img"), lab, 1, SYN_COUNT, 0);
	file = make_idx(IMG_MAGIC, idims, 3, pix, sizeof(pix), &len);
	write_plain(img, file, len);
	free(file);
	expect_load_error(img, lab, FB_EFORMAT, img, "header claims");

	/* One huge dimension alone. */
	idims[0] = 1;
	idims[1] = 0xffffffffu;
	idims[2] = 0xffffffffu;
	file = make_idx(IMG_MAGIC, idims, 3, pix, sizeof(pix), &len);
	write_plain(img, file, len);
	free(file);
	expect_load_error(img, lab, FB_EFORMAT, img, "header claims");

	/* Within the limit (1.5 GB claimed) but the file is tiny: reported
	 * as truncated, without first allocating what the header claims. */
	idims[0] = 2000000;
	idims[1] = 28;
	idims[2] = 28;
	file = make_idx(IMG_MAGIC, idims, 3, pix, sizeof(pix), &len);
	write_plain(img, file, len);
	free(file);
	zeros = calloc(idims[0], 1);
	assert_non_null(zeros);
	file = make_idx(LAB_MAGIC, idims, 1, zeros, idims[0], &len);
	write_gz(lab, file, len);
	free(file);
	free(zeros);
	expect_load_error(img, lab, FB_EFORMAT, img, "truncated");

	/* Zero-sized dimensions. */
	idims[0] = 0;
	file = make_idx(IMG_MAGIC, idims, 3, pix, 0, &len);
	write_plain(img, file, len);
	free(file);
	expect_load_error(img, lab, FB_EFORMAT, img, "zero");
}

static void
test_trailing_garbage(void **state)
{
	char *img = tmp_path("trail-img.gz");
	char *lab = tmp_path("trail-lab.gz");
	uint32_t ldims[1] = {SYN_COUNT};
	uint8_t labels[SYN_COUNT + 3] = {0};
	uint8_t *file;
	size_t len;

	write_syn(img, lab, 1, SYN_COUNT, 5);
	expect_load_error(img, lab, FB_EFORMAT, img, "trailing");

	write_syn(tmp_path("trail-img"), tmp_path("trail-lab"), 0, SYN_COUNT,
	    0);
	file = make_idx(LAB_MAGIC, ldims, 1, labels, sizeof(labels), &len);
	write_plain(tmp_path("trail-lab"), file, len);
	free(file);
	expect_load_error(tmp_path("trail-img"), tmp_path("trail-lab"),
	    FB_EFORMAT, "trail-lab", "trailing");
}

static void
test_missing_file(void **state)
{
	char *img = tmp_path("mf-img.gz");
	char *lab = tmp_path("mf-lab.gz");

	write_syn(img, lab, 1, SYN_COUNT, 0);
	expect_load_error(tmp_path("absent-img.gz"), lab, FB_EIO,
	    "absent-img.gz", "No such file");
	expect_load_error(img, tmp_path("absent-lab.gz"), FB_EIO,
	    "absent-lab.gz", "No such file");
	/* A folder is not a file either. */
	expect_load_error(fb_test_tmpdir(), lab, FB_EIO, fb_test_tmpdir(),
	    NULL);
}

static void
test_subset(void **state)
{
	char *img = tmp_path("sub-img.gz");
	char *lab = tmp_path("sub-lab.gz");
	uint32_t pick[3] = {5, 0, 63};
	uint32_t bad[2] = {1, SYN_COUNT};
	fb_dataset ds, sub;
	capture cap;

	write_syn(img, lab, 1, SYN_COUNT, 0);
	assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
	assert_int_equal(fb_dataset_subset(&ds, pick, 3, &sub), FB_OK);
	assert_int_equal(sub.count, 3);
	assert_int_equal(sub.dim, ds.dim);
	assert_int_equal(sub.classes, ds.classes);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(sub.y[i].cls, ds.y[pick[i]].cls);
		assert_memory_equal(sub.x + (size_t)i * sub.dim,
		    ds.x + (size_t)pick[i] * ds.dim, sub.dim * sizeof(float));
	}
	fb_dataset_fini(&sub);

	memset(&sub, 0xa5, sizeof(sub));
	capture_begin(&cap);
	assert_int_equal(fb_dataset_subset(&ds, bad, 2, &sub), FB_EINVAL);
	assert_int_equal(capture_end(&cap), 1);
	assert_zeroed(&sub);
	fb_dataset_fini(&ds);
}

/* ---- partitions ---------------------------------------------------------- */

/* partition_u8 is fb_partition_indices on byte labels (the tests' own
 * tables), converted to fb_label first. */
static fb_err
partition_u8(const uint8_t *labels, uint32_t count, uint32_t classes,
    const fb_partition_spec *spec, uint32_t **idx, uint32_t *n)
{
	fb_label *y = calloc(count > 0 ? count : 1, sizeof(*y));
	fb_err rc;

	assert_non_null(y);
	for (uint32_t i = 0; i < count; i++) {
		y[i].cls = labels[i];
	}
	rc = fb_partition_indices(labels != NULL ? y : NULL, count, classes,
	    spec, idx, n);
	free(y);
	return rc;
}

/* train_labels reads the real training labels straight from the file. */
static uint8_t *
train_labels(uint32_t *count)
{
	const char *dir = fb_test_fmnist_dir();
	char path[512];
	uint8_t *labels;

	if (dir == NULL) {
		print_message("Fashion-MNIST not installed; skipping\n");
		skip();
	}
	*count = 60000;
	labels = malloc(*count);
	assert_non_null(labels);
	snprintf(path, sizeof(path), "%s/train-labels-idx1-ubyte.gz", dir);
	read_raw(path, 8, labels, *count);
	return labels;
}

/* check_cover asserts that workers 0..N-1 get sorted, non-empty, disjoint
 * parts covering 0..count-1. */
static void
check_cover(const uint8_t *labels, uint32_t count, fb_partition_spec spec)
{
	uint8_t *seen = calloc(count, 1);
	uint32_t *idx;
	uint32_t n;

	assert_non_null(seen);
	for (uint32_t w = 0; w < spec.workers; w++) {
		spec.index = w;
		assert_int_equal(partition_u8(labels, count, 10, &spec,
		                     &idx, &n),
		    FB_OK);
		assert_true(n >= 1);
		for (uint32_t i = 0; i < n; i++) {
			assert_true(idx[i] < count);
			assert_true(i == 0 || idx[i - 1] < idx[i]);
			assert_int_equal(seen[idx[i]], 0);
			seen[idx[i]] = 1;
		}
		fb_free(idx);
	}
	for (uint32_t i = 0; i < count; i++) {
		assert_int_equal(seen[i], 1);
	}
	free(seen);
}

static const uint32_t worker_counts[] = {1, 3, 4, 10};

static void
check_scheme_covers(fb_partition_spec spec)
{
	uint32_t count;
	uint8_t *labels = train_labels(&count);

	for (size_t k = 0; k < FB_ARRAY_LEN(worker_counts); k++) {
		spec.workers = worker_counts[k];
		check_cover(labels, count, spec);
	}
	free(labels);
}

static void
test_iid_covers(void **state)
{
	fb_partition_spec spec = {FB_PARTITION_IID, 1, 0, 42, 0.0, 0};
	check_scheme_covers(spec);
}

static void
test_dirichlet_covers(void **state)
{
	fb_partition_spec spec = {FB_PARTITION_DIRICHLET, 1, 0, 42, 0.5, 0};
	check_scheme_covers(spec);
	spec.alpha = 0.1;
	check_scheme_covers(spec);
}

static void
test_shards_covers(void **state)
{
	fb_partition_spec spec = {FB_PARTITION_SHARDS, 1, 0, 42, 0.0, 2};
	check_scheme_covers(spec);
}

static void
test_iid_sizes_near_equal(void **state)
{
	fb_partition_spec spec = {FB_PARTITION_IID, 7, 0, 1, 0.0, 0};
	uint32_t count;
	uint8_t *labels = train_labels(&count);
	uint32_t *idx;
	uint32_t n;

	for (uint32_t w = 0; w < spec.workers; w++) {
		spec.index = w;
		assert_int_equal(partition_u8(labels, count, 10, &spec,
		                     &idx, &n),
		    FB_OK);
		assert_true(n == count / 7 || n == count / 7 + 1);
		fb_free(idx);
	}
	free(labels);
}

/* same_part says whether two seeds give worker 1 of 4 the same part. */
static int
same_part(const uint8_t *labels, uint32_t count, fb_partition_spec spec,
    uint64_t seed_a, uint64_t seed_b)
{
	uint32_t *a, *b;
	uint32_t na, nb;
	int same;

	spec.workers = 4;
	spec.index = 1;
	spec.seed = seed_a;
	assert_int_equal(
	    partition_u8(labels, count, 10, &spec, &a, &na), FB_OK);
	spec.seed = seed_b;
	assert_int_equal(
	    partition_u8(labels, count, 10, &spec, &b, &nb), FB_OK);
	same = na == nb && memcmp(a, b, na * sizeof(*a)) == 0;
	fb_free(a);
	fb_free(b);
	return same;
}

static void
test_seed_determines_partition(void **state)
{
	fb_partition_spec specs[] = {
		{FB_PARTITION_IID, 4, 0, 0, 0.0, 0},
		{FB_PARTITION_DIRICHLET, 4, 0, 0, 0.3, 0},
		{FB_PARTITION_SHARDS, 4, 0, 0, 0.0, 5},
	};
	uint32_t count;
	uint8_t *labels = train_labels(&count);

	for (size_t k = 0; k < FB_ARRAY_LEN(specs); k++) {
		assert_true(same_part(labels, count, specs[k], 7, 7));
		assert_false(same_part(labels, count, specs[k], 7, 8));
	}
	free(labels);
}

/* mean_top_fraction is the mean over N workers of the share of each
 * worker's examples that belong to its most frequent label. */
static double
mean_top_fraction(const uint8_t *labels, uint32_t count,
    fb_partition_spec spec, uint32_t *max_distinct)
{
	double total = 0.0;
	uint32_t *idx;
	uint32_t n;

	*max_distinct = 0;
	for (uint32_t w = 0; w < spec.workers; w++) {
		uint32_t per[10] = {0};
		uint32_t top = 0, distinct = 0;

		spec.index = w;
		assert_int_equal(partition_u8(labels, count, 10, &spec,
		                     &idx, &n),
		    FB_OK);
		for (uint32_t i = 0; i < n; i++) {
			per[labels[idx[i]]]++;
		}
		for (int c = 0; c < 10; c++) {
			top = per[c] > top ? per[c] : top;
			distinct += per[c] > 0;
		}
		if (distinct > *max_distinct) {
			*max_distinct = distinct;
		}
		total += (double)top / n;
		fb_free(idx);
	}
	return total / spec.workers;
}

static void
test_dirichlet_is_label_skewed(void **state)
{
	fb_partition_spec iid = {FB_PARTITION_IID, 10, 0, 3, 0.0, 0};
	fb_partition_spec dir = {FB_PARTITION_DIRICHLET, 10, 0, 3, 0.1, 0};
	fb_partition_spec mild = {FB_PARTITION_DIRICHLET, 10, 0, 3, 100.0, 0};
	uint32_t count, distinct;
	uint8_t *labels = train_labels(&count);
	double f_iid = mean_top_fraction(labels, count, iid, &distinct);
	double f_dir = mean_top_fraction(labels, count, dir, &distinct);
	double f_mild = mean_top_fraction(labels, count, mild, &distinct);

	print_message("mean top-label share: iid %.3f, dir(0.1) %.3f, "
	              "dir(100) %.3f\n",
	    f_iid, f_dir, f_mild);
	assert_true(f_iid < 0.15);
	assert_true(f_dir > 0.4);
	assert_true(f_dir > 3 * f_iid);
	assert_true(f_mild < 0.2); /* large alpha approaches iid */
	free(labels);
}

static void
test_shards_have_few_labels(void **state)
{
	fb_partition_spec spec = {FB_PARTITION_SHARDS, 10, 0, 5, 0.0, 2};
	uint32_t count, distinct;
	uint8_t *labels = train_labels(&count);
	double f = mean_top_fraction(labels, count, spec, &distinct);

	/* 20 shards of 3000 over 10 classes of 6000: one label a shard. */
	assert_true(distinct <= 3);
	assert_true(f >= 0.5);
	spec.workers = 4; /* shards of 7500 straddle two labels at most */
	(void)mean_top_fraction(labels, count, spec, &distinct);
	assert_true(distinct <= 4);
	free(labels);
}

static void
expect_bad_spec(const uint8_t *labels, uint32_t count, uint32_t classes,
    fb_partition_spec spec)
{
	static uint32_t junk[1];
	uint32_t *idx = junk; /* must be reset to NULL */
	uint32_t n = 12345;
	capture cap;

	capture_begin(&cap);
	assert_int_equal(
	    partition_u8(labels, count, classes, &spec, &idx, &n),
	    FB_EINVAL);
	assert_int_equal(capture_end(&cap), 1);
	assert_null(idx);
	assert_int_equal(n, 0);
}

static void
test_bad_specs_rejected(void **state)
{
	uint8_t labels[20];
	fb_partition_spec ok = {FB_PARTITION_IID, 4, 0, 1, 0.5, 2};
	fb_partition_spec s;

	for (int i = 0; i < 20; i++) {
		labels[i] = (uint8_t)(i % 10);
	}
	s = ok;
	s.workers = 0;
	expect_bad_spec(labels, 20, 10, s);
	s = ok;
	s.index = 4;
	expect_bad_spec(labels, 20, 10, s);
	s = ok;
	s.workers = 21; /* more workers than examples */
	expect_bad_spec(labels, 20, 10, s);
	s = ok;
	s.scheme = (fb_partition_scheme)7;
	expect_bad_spec(labels, 20, 10, s);
	s = ok;
	s.scheme = FB_PARTITION_DIRICHLET;
	s.alpha = 0.0;
	expect_bad_spec(labels, 20, 10, s);
	s.alpha = -1.0;
	expect_bad_spec(labels, 20, 10, s);
	s.alpha = NAN;
	expect_bad_spec(labels, 20, 10, s);
	s.alpha = INFINITY;
	expect_bad_spec(labels, 20, 10, s);
	s = ok;
	s.scheme = FB_PARTITION_SHARDS;
	s.shards_per_worker = 0;
	expect_bad_spec(labels, 20, 10, s);
	s.shards_per_worker = 6; /* 24 shards of 20 examples */
	expect_bad_spec(labels, 20, 10, s);
	s = ok;
	expect_bad_spec(labels, 20, 5, s); /* label 9 >= 5 classes */
	expect_bad_spec(labels, 0, 10, s);
}

static void
test_hopeless_dirichlet_rejected(void **state)
{
	uint8_t labels[20] = {0};
	fb_partition_spec s = {FB_PARTITION_DIRICHLET, 10, 0, 1, 0.001, 0};

	/* One class, alpha tiny: nearly all of it goes to one worker. */
	expect_bad_spec(labels, 20, 10, s);
}

static void
test_scheme_names(void **state)
{
	assert_string_equal(fb_partition_scheme_names[FB_PARTITION_IID],
	    "iid");
	assert_string_equal(fb_partition_scheme_names[FB_PARTITION_DIRICHLET],
	    "dirichlet");
	assert_string_equal(fb_partition_scheme_names[FB_PARTITION_SHARDS],
	    "shards");
	assert_null(fb_partition_scheme_names[3]);
}


/* ---- CSV, NumPy and normalisation ---------------------------------------- */

static void
write_text(const char *path, const char *text)
{
	write_plain(path, (const uint8_t *)text, strlen(text));
}

/* csv_spec: a classification spec for CSV files with label column "y"
 * and no normalisation (the values as written). */
static fb_data_spec
csv_spec(char *file)
{
	fb_data_spec s;

	memset(&s, 0, sizeof(s));
	s.format = FB_DATA_CSV;
	s.file = file;
	s.labels = "";
	s.valid = "";
	s.valid_labels = "";
	s.label_column = "y";
	s.x_array = "x";
	s.y_array = "y";
	s.task = FB_TASK_CLASSIFICATION;
	s.normalize = FB_NORM_NONE;
	s.normalize_file = "";
	s.mean = 0.0;
	s.std = 1.0;
	return s;
}

/*
 * expect_bad_data loads `spec` expecting `want`, at least one log line
 * holding every string of `needles` (NULL-terminated), and zeroed
 * outputs.
 */
static void
expect_bad_data(const fb_data_spec *spec, fb_err want,
    const char *const *needles)
{
	fb_dataset tr, va;
	capture cap;
	fb_err rc;

	memset(&tr, 0xa5, sizeof(tr));
	memset(&va, 0xa5, sizeof(va));
	capture_begin(&cap);
	rc = fb_dataset_load(spec, NULL, &tr, &va);
	assert_true(capture_end(&cap) >= 1);
	if (rc != want) {
		print_message("got %s, want %s; log: %s\n", fb_strerror(rc),
		    fb_strerror(want), cap.text);
	}
	assert_int_equal(rc, want);
	for (const char *const *n = needles; *n != NULL; n++) {
		if (strstr(cap.text, *n) == NULL) {
			print_message("log lacks \"%s\": %s\n", *n, cap.text);
		}
		assert_non_null(strstr(cap.text, *n));
	}
	assert_zeroed(&tr);
	assert_zeroed(&va);
}

static void
test_csv_loads(void **state)
{
	char *f = tmp_path("ok.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;

	/* BOM, CRLF, quotes, spaces, a blank line, an ignored text column
	 * (features named), the label in the middle. */
	sp.features.v[0] = "a";
	sp.features.v[1] = "b, 2";
	sp.features.count = 2;
	write_text(f, "\xef\xbb\xbf" "a, id ,y,\"b, 2\"\r\n"
	              "1.5,p1,0,-2\r\n"
	              "\r\n"
	              " 2e1 , \"p,2\" , 2 , \"3.25\"\n"
	              "-0.125,p3,1,1e-3");
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(ds.count, 3);
	assert_int_equal(ds.dim, 2);
	assert_int_equal(ds.classes, 3);
	assert_int_equal(ds.task, FB_TASK_CLASSIFICATION);
	assert_int_equal(ds.norm, FB_NORM_NONE);
	assert_string_equal(ds.names[0], "a");
	assert_string_equal(ds.names[1], "b, 2");
	assert_true(ds.x[0] == 1.5f && ds.x[1] == -2.0f);
	assert_true(ds.x[2] == 20.0f && ds.x[3] == 3.25f);
	assert_true(ds.x[4] == -0.125f && ds.x[5] == 1e-3f);
	assert_int_equal(ds.y[0].cls, 0);
	assert_int_equal(ds.y[1].cls, 2);
	assert_int_equal(ds.y[2].cls, 1);
	fb_dataset_fini(&ds);
	assert_zeroed(&ds);
}

static void
test_csv_feature_list(void **state)
{
	char *f = tmp_path("cols.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;

	write_text(f, "a,b,c,y\n1,2,3,1\n4,x,6,0\n");
	sp.features.v[0] = "c";
	sp.features.v[1] = "a";
	sp.features.count = 2;
	/* column b holds text but is not used: ignored */
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(ds.dim, 2);
	assert_string_equal(ds.names[0], "c");
	assert_string_equal(ds.names[1], "a");
	assert_true(ds.x[0] == 3.0f && ds.x[1] == 1.0f);
	assert_true(ds.x[2] == 6.0f && ds.x[3] == 4.0f);
	fb_dataset_fini(&ds);

	sp.features.v[1] = "nope";
	expect_bad_data(&sp, FB_EFORMAT,
	    (const char *const[]){"cols.csv:1", "\"nope\"", NULL});
	sp.features.v[1] = "y";
	expect_bad_data(&sp, FB_EINVAL,
	    (const char *const[]){"label column", NULL});
	sp.features.v[1] = "c";
	expect_bad_data(&sp, FB_EINVAL, (const char *const[]){"twice", NULL});
	/* without a list, every other column is a feature: text in one is
	 * an error */
	sp.features.count = 0;
	expect_bad_data(&sp, FB_EFORMAT,
	    (const char *const[]){"cols.csv:3:3:", "column \"b\"", NULL});
}

static void
test_csv_ragged(void **state)
{
	char *f = tmp_path("ragged.csv");
	fb_data_spec sp = csv_spec(f);

	write_text(f, "a,b,y\n1,2,0\n3,4,1,9\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "ragged.csv:3:7:", "4 fields", "header has 3", NULL});
	write_text(f, "a,b,y\n1,2,0\n1,2,0\n5,6\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "ragged.csv:4:4:", "2 fields", NULL});
}

static void
test_csv_text(void **state)
{
	char *f = tmp_path("text.csv");
	fb_data_spec sp = csv_spec(f);

	write_text(f, "a,b,y\n1,2,0\n3,  4x ,1\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "text.csv:3:5:", "column \"b\"", "\"4x\" is not a number", NULL});
	write_text(f, "a,b,y\n0x10,2,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "text.csv:2:1:", "not a number", NULL});
	write_text(f, "a,b,y\n1,2,M\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "text.csv:2:5:", "column \"y\"", NULL});
	write_text(f, "a,b,y\n1,\"2,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "text.csv:2:3:", "quote", NULL});
	write_text(f, "a,b,y\n1,\"2\"3,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "text.csv:2:6:", "closing quote", NULL});
}

static void
test_csv_nan(void **state)
{
	char *f = tmp_path("nan.csv");
	fb_data_spec sp = csv_spec(f);

	write_text(f, "a,b,y\n1,2,0\n1,NaN,1\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "nan.csv:3:3:", "column \"b\"", "NaN", NULL});
	write_text(f, "a,b,y\nnan,2,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "nan.csv:2:1:", "NaN", NULL});
	write_text(f, "a,b,y\n1,-inf,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "nan.csv:2:3:", "infinity", NULL});
	write_text(f, "a,b,y\n1,,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "nan.csv:2:3:", "empty value", NULL});
	write_text(f, "a,b,y\n1,1e39,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "nan.csv:2:3:", "float32 range", NULL});
}

static void
test_csv_labels(void **state)
{
	char *f = tmp_path("lab.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;

	write_text(f, "a,y\n1,0\n2,3\n");
	sp.classes = 3;
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "lab.csv:3:3:", "out of range", "0..2", NULL});
	sp.classes = 0;
	write_text(f, "a,y\n1,0\n2,-1\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "lab.csv:3:3:", "negative", NULL});
	write_text(f, "a,y\n1,0\n2,1.5\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "lab.csv:3:3:", "whole number", NULL});
	write_text(f, "a,y\n1,0\n2,1e10\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "lab.csv:3:3:", "out of range", NULL});
	/* a large class count loads as int32 labels */
	write_text(f, "a,y\n1,0\n2,70000\n3,1.0\n");
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(ds.classes, 70001);
	assert_int_equal(ds.y[1].cls, 70000);
	assert_int_equal(ds.y[2].cls, 1);
	fb_dataset_fini(&ds);
}

static void
test_csv_regression(void **state)
{
	char *f = tmp_path("reg.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;

	write_text(f, "x1,x2,price\n1,2,-1.25\n3,4,1e3\n");
	sp.label_column = "price";
	sp.task = FB_TASK_REGRESSION;
	sp.classes = 5; /* ignored for regression */
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(ds.task, FB_TASK_REGRESSION);
	assert_int_equal(ds.classes, 0);
	assert_true(ds.y[0].value == -1.25f && ds.y[1].value == 1000.0f);
	fb_dataset_fini(&ds);
	write_text(f, "x1,x2,price\n1,2,nan\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "reg.csv:2:5:", "NaN", NULL});
	/* regression splits iid only */
	{
		fb_partition_spec part = {FB_PARTITION_DIRICHLET, 2, 0, 1, 0.5,
		    1};
		fb_dataset tr;
		capture cap;
		uint32_t n0;
		write_text(f, "x1,x2,price\n1,2,3\n4,5,6\n7,8,9\n");
		capture_begin(&cap);
		assert_int_equal(fb_dataset_load(&sp, &part, &tr, NULL),
		    FB_EINVAL);
		assert_true(capture_end(&cap) >= 1);
		assert_non_null(strstr(cap.text, "iid only"));
		assert_zeroed(&tr);
		part.scheme = FB_PARTITION_IID;
		assert_int_equal(fb_dataset_load(&sp, &part, &tr, NULL),
		    FB_OK);
		n0 = tr.count;
		assert_int_equal(tr.raw_count, 3);
		fb_dataset_fini(&tr);
		part.index = 1;
		assert_int_equal(fb_dataset_load(&sp, &part, &tr, NULL),
		    FB_OK);
		assert_int_equal(n0 + tr.count, 3); /* 3 rows, 2 workers */
		assert_true(n0 >= 1 && tr.count >= 1);
		fb_dataset_fini(&tr);
	}
}

static void
test_csv_header_problems(void **state)
{
	char *f = tmp_path("hdr.csv");
	fb_data_spec sp = csv_spec(f);

	write_text(f, "a,b,label\n1,2,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "hdr.csv:1: no column \"y\"", "\"label\"", NULL});
	write_text(f, ",a,y\n0,1,0\n"); /* pandas' unnamed index column */
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "hdr.csv:1:1:", "no name", NULL});
	write_text(f, "a,a,y\n0,1,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "hdr.csv:1:3:", "appears twice", NULL});
	write_text(f, "y\n0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "no feature columns", NULL});
	write_text(f, "a,y\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "no data rows", NULL});
	write_text(f, "");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "empty file", NULL});
	sp = csv_spec(tmp_path("no-such.csv"));
	expect_bad_data(&sp, FB_EIO, (const char *const[]){
	    "no-such.csv: cannot open", NULL});
}

/* ---- NumPy (files written by numpy: tests/gen/npy_vectors.py) ----------- */

#define NPY_DIR "tests/vectors/npy/"

static float
npy_x(uint32_t i, uint32_t j)
{
	return (float)((int)((7 * i + 3 * j) % 11) - 5) + (float)j / 8.0f;
}

static fb_data_spec
npy_spec(char *x, char *y)
{
	fb_data_spec s = csv_spec(x);

	s.format = FB_DATA_NPY;
	s.labels = y;
	return s;
}

static void
check_npy_pattern(const fb_dataset *ds, uint32_t dim)
{
	assert_int_equal(ds->count, 5);
	assert_int_equal(ds->dim, dim);
	for (uint32_t i = 0; i < 5; i++) {
		for (uint32_t j = 0; j < dim; j++) {
			assert_true(ds->x[i * dim + j] == npy_x(i, j));
		}
		assert_int_equal(ds->y[i].cls, (int32_t)(i % 3));
	}
	assert_int_equal(ds->classes, 3);
}

static void
test_npy_loads(void **state)
{
	static const char *const xs[] = {"x_f4.npy", "x_f8.npy",
	    "x_f4_big.npy", "x_f8_fortran.npy", "x_f4_v2.npy"};
	static const char *const ys[] = {"y_i8.npy", "y_u1.npy",
	    "y_i2_big.npy", "y_i4_col.npy", "y_i8.npy"};
	char xp[256], yp[256];
	fb_dataset ds;

	for (size_t k = 0; k < 5; k++) {
		snprintf(xp, sizeof(xp), NPY_DIR "%s", xs[k]);
		snprintf(yp, sizeof(yp), NPY_DIR "%s", ys[k]);
		fb_data_spec sp = npy_spec(xp, yp);
		assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
		check_npy_pattern(&ds, 3);
		assert_null(ds.names);
		fb_dataset_fini(&ds);
	}
	{
		/* uint8 features of shape (5, 2, 2), flattened row-major */
		fb_data_spec sp = npy_spec(NPY_DIR "x_u1.npy",
		    NPY_DIR "y_u1.npy");
		assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
		assert_int_equal(ds.dim, 4);
		for (uint32_t i = 0; i < 5; i++) {
			for (uint32_t j = 0; j < 4; j++) {
				assert_true(ds.x[i * 4 + j] ==
				    (float)((7 * i + 3 * j) % 256));
			}
		}
		fb_dataset_fini(&ds);
	}
	{
		fb_data_spec sp = npy_spec(NPY_DIR "x_f4.npy",
		    NPY_DIR "y_f4_reg.npy");
		sp.task = FB_TASK_REGRESSION;
		assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
		for (uint32_t i = 0; i < 5; i++) {
			assert_true(ds.y[i].value == (float)i / 4.0f - 1.0f);
		}
		fb_dataset_fini(&ds);
	}
}

static void
test_npy_refused(void **state)
{
	fb_data_spec sp;

	sp = npy_spec(NPY_DIR "x_i4.npy", NPY_DIR "y_i8.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "x_i4.npy (features)", "'<i4'", NULL});
	sp = npy_spec(NPY_DIR "x_c8.npy", NPY_DIR "y_i8.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "x_c8.npy", "'<c8'", NULL});
	sp = npy_spec(NPY_DIR "x_1d.npy", NPY_DIR "y_i8.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "x_1d.npy (features)", "shape (5,)", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", NPY_DIR "y_2col.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "y_2col.npy (labels)", "shape (5, 2)", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", NPY_DIR "y_f8.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "y_f8.npy (labels)", "integer labels", NULL});
	sp = npy_spec(NPY_DIR "x_nan.npy", NPY_DIR "y_i8.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "x_nan.npy (features)", "[2, 1] is NaN", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", NPY_DIR "y_neg.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "y_neg.npy (labels)", "element 3", "negative", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", NPY_DIR "y_i8.npy");
	sp.classes = 2;
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "y_i8.npy (labels)", "element 2", "out of range", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", NPY_DIR "y_four.npy");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "x_f4.npy has 5 examples", "y_four.npy has 4", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", "");
	expect_bad_data(&sp, FB_EINVAL, (const char *const[]){
	    "labels file", NULL});
	sp = npy_spec(NPY_DIR "x_f4.npy", tmp_path("none.npy"));
	expect_bad_data(&sp, FB_EIO, (const char *const[]){
	    "none.npy: cannot open", NULL});
}

/* npy_damaged: a numpy file cut short, lengthened, or with a bad magic. */
static void
test_npy_damaged(void **state)
{
	size_t len;
	uint8_t *b = read_whole(NPY_DIR "x_f4.npy", &len);
	char *p = tmp_path("bad.npy");
	fb_data_spec sp = npy_spec(p, NPY_DIR "y_i8.npy");
	uint8_t *longer = malloc(len + 4);

	write_plain(p, b, len - 1);
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npy", "truncated", NULL});
	assert_non_null(longer);
	memcpy(longer, b, len);
	memset(longer + len, 0, 4);
	write_plain(p, longer, len + 4);
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npy", "trailing bytes", NULL});
	write_plain(p, b, 40); /* inside the header */
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npy", "header", NULL});
	b[1] = 'X';
	write_plain(p, b, len);
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npy", "magic", NULL});
	free(longer);
	free(b);
}

static void
test_npz_loads(void **state)
{
	fb_data_spec sp = csv_spec(NPY_DIR "d_stored.npz");
	fb_dataset ds;

	sp.format = FB_DATA_NPZ;
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	check_npy_pattern(&ds, 3);
	assert_int_equal(ds.format, FB_DATA_NPZ);
	fb_dataset_fini(&ds);
	/* np.savez_compressed: deflated entries with zip64 extras */
	sp.file = NPY_DIR "d_deflate.npz";
	sp.x_array = "features";
	sp.y_array = "target";
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	check_npy_pattern(&ds, 3);
	fb_dataset_fini(&ds);
}

static void
test_npz_refused(void **state)
{
	fb_data_spec sp = csv_spec(NPY_DIR "d_deflate.npz");
	size_t len;
	uint8_t *b;
	char *p = tmp_path("bad.npz");

	sp.format = FB_DATA_NPZ;
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "no array 'x' (x_array)", "'features', 'target'", NULL});
	sp.x_array = "features";
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "no array 'y' (y_array)", NULL});
	/* a flipped byte in the deflated data fails inflate or the CRC */
	b = read_whole(NPY_DIR "d_deflate.npz", &len);
	b[70] ^= 0x40;
	write_plain(p, b, len);
	sp.file = p;
	sp.y_array = "target";
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npz", "features.npy", NULL});
	b[70] ^= 0x40;
	write_plain(p, b, len - 30); /* end records cut off */
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npz", "end-of-central-directory", NULL});
	free(b);
	b = read_whole(NPY_DIR "x_f4.npy", &len);
	write_plain(p, b, len); /* an .npy is not a zip */
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "bad.npz", "zip", NULL});
	free(b);
}

/* ---- normalisation, validation, describe --------------------------------- */

static void
test_own_normalisation(void **state)
{
	char *f = tmp_path("own.csv");
	char *v = tmp_path("own-valid.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset tr, va;
	/* columns: a = 1, 2, 3, 6 (mean 3, population std sqrt(3.5));
	 * c = 5 everywhere (no spread: centred, std 1) */
	double am = 3.0, as = sqrt(3.5);

	write_text(f, "a,c,y\n1,5,0\n2,5,1\n3,5,0\n6,5,1\n");
	write_text(v, "a,c,y\n3,5,1\n10,7,0\n");
	sp.normalize = FB_NORM_OWN;
	sp.valid = v;
	assert_int_equal(fb_dataset_load(&sp, NULL, &tr, &va), FB_OK);
	assert_int_equal(tr.norm, FB_NORM_OWN);
	assert_true(tr.mean[0] == (float)am && tr.std[0] == (float)as);
	assert_true(tr.mean[1] == 5.0f && tr.std[1] == 1.0f);
	/* x = (v - mean) / std in float32, training statistics for both */
	assert_true(tr.x[0] == (1.0f - (float)am) / (float)as);
	assert_true(tr.x[6] == (6.0f - (float)am) / (float)as);
	assert_true(tr.x[1] == 0.0f);
	assert_true(va.x[2] == (10.0f - (float)am) / (float)as);
	assert_true(va.x[3] == 2.0f);
	assert_int_equal(va.norm, FB_NORM_OWN);
	fb_dataset_fini(&tr);
	fb_dataset_fini(&va);

	/* the validation file must have the training file's features */
	write_text(v, "a,y\n3,1\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "own-valid.csv: 1 features", "has 2", NULL});
	write_text(v, "a,c,y\n3,5,2\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "own-valid.csv: label 2", "2 classes", NULL});
	/* no such validation file */
	sp.valid = tmp_path("no-valid.csv");
	expect_bad_data(&sp, FB_EIO, (const char *const[]){
	    "no-valid.csv: cannot open", NULL});
}

static void
test_own_stats_from_the_shard(void **state)
{
	char *f = tmp_path("shard.csv");
	fb_data_spec sp = csv_spec(f);
	fb_partition_spec part = {FB_PARTITION_IID, 2, 1, 9, 0.5, 1};
	fb_dataset tr;
	char text[4096];
	size_t used = 0;
	double sum = 0, sq = 0;

	used += (size_t)snprintf(text, sizeof(text), "a,y\n");
	for (int i = 0; i < 40; i++) {
		used += (size_t)snprintf(text + used, sizeof(text) - used,
		    "%d,%d\n", i * i, i % 2);
	}
	write_text(f, text);
	sp.normalize = FB_NORM_OWN;
	assert_int_equal(fb_dataset_load(&sp, &part, &tr, NULL), FB_OK);
	assert_int_equal(tr.count, 20);
	assert_int_equal(tr.raw_count, 40);
	/* the statistics are those of this worker's 20 rows: its x is
	 * standardised exactly (mean 0, std 1) */
	for (uint32_t i = 0; i < tr.count; i++) {
		sum += tr.x[i];
		sq += (double)tr.x[i] * tr.x[i];
	}
	assert_true(fabs(sum / tr.count) < 1e-6);
	assert_true(fabs(sq / tr.count - 1.0) < 1e-5);
	fb_dataset_fini(&tr);
}

static void
test_file_normalisation(void **state)
{
	char *f = tmp_path("fn.csv");
	char *n = tmp_path("fn-norm.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;

	write_text(f, "a,b,y\n1,10,0\n3,30,1\n");
	write_text(n, "stat,a,b\nstd,2,0.5\nmean,1,20\n");
	sp.normalize = FB_NORM_FILE;
	sp.normalize_file = n;
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(ds.norm, FB_NORM_FILE);
	assert_true(ds.x[0] == 0.0f && ds.x[1] == -20.0f);
	assert_true(ds.x[2] == 1.0f && ds.x[3] == 20.0f);
	fb_dataset_fini(&ds);

	write_text(n, "stat,b,a\nmean,1,20\nstd,2,0.5\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "fn-norm.csv:1:6:", "column \"b\"", "feature 1 is \"a\"", NULL});
	write_text(n, "stat,a,b\nmean,1,20\nstd,2,0\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "fn-norm.csv:3:7:", "must be > 0", NULL});
	write_text(n, "stat,a,b\nmean,1,20\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "fn-norm.csv: no std row", NULL});
	write_text(n, "stat,a,b\nmean,1,20\nsd,2,3\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "fn-norm.csv:3:1:", "\"sd\"", NULL});
	write_text(n, "stat,a\nmean,1\nstd,2\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "fn-norm.csv:1:", "has 2 features", NULL});
	write_text(n, "stat,a,b\nmean,1,nan\nstd,2,3\n");
	expect_bad_data(&sp, FB_EFORMAT, (const char *const[]){
	    "fn-norm.csv:2:8:", "NaN", NULL});
}

static void
test_scalar_and_idx_through_load(void **state)
{
	char *img = tmp_path("load-img.gz");
	char *lab = tmp_path("load-lab.gz");
	fb_data_spec sp = csv_spec(img);
	fb_dataset ds, old;

	write_syn(img, lab, 1, SYN_COUNT, 0);
	sp.format = FB_DATA_IDX;
	sp.labels = lab;
	/* auto for idx is scalar, with the keys' defaults (Fashion-MNIST's
	 * constants) */
	sp.normalize = FB_NORM_AUTO;
	sp.mean = 0.2860;
	sp.std = 0.3530;
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(fb_dataset_load_idx(img, lab, &old), FB_OK);
	assert_int_equal(ds.norm, FB_NORM_SCALAR);
	assert_int_equal(old.norm, FB_NORM_SCALAR);
	/* bitwise the old loader's preprocessing, and the formula's */
	assert_memory_equal(ds.x, old.x,
	    (size_t)ds.count * ds.dim * sizeof(float));
	for (size_t i = 0; i < SYN_PIXELS; i++) {
		assert_true(ds.x[i] == expected_x(syn_pixel(i)));
	}
	fb_dataset_fini(&ds);
	fb_dataset_fini(&old);
	sp.normalize = FB_NORM_NONE;
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_true(ds.x[5] == (float)syn_pixel(5) / 255.0f);
	assert_null(ds.mean);
	fb_dataset_fini(&ds);
	sp.normalize = FB_NORM_SCALAR;
	sp.std = 0.0;
	expect_bad_data(&sp, FB_EINVAL, (const char *const[]){
	    "std > 0", NULL});
	sp.normalize = FB_NORM_FILE;
	sp.normalize_file = "";
	expect_bad_data(&sp, FB_EINVAL, (const char *const[]){
	    "normalize_file", NULL});
	sp.normalize = FB_NORM_NONE;
	sp.labels = "";
	expect_bad_data(&sp, FB_EINVAL, (const char *const[]){
	    "labels file", NULL});
	sp.labels = lab;
	sp.task = FB_TASK_REGRESSION;
	expect_bad_data(&sp, FB_EINVAL, (const char *const[]){
	    "regression", NULL});
}

/* describe: the constants it writes parse back to the same float32s. */
static void
test_describe(void **state)
{
	char *f = tmp_path("desc.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;
	char *d = NULL;
	const char *p;

	write_text(f, "radius,texture,diagnosis\n1.1,7,0\n2.3,8,1\n"
	              "0.7,11,1\n");
	sp.label_column = "diagnosis";
	sp.normalize = FB_NORM_OWN;
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(fb_dataset_describe(&sp, &ds, &d), FB_OK);
	print_message("%s\n", d);
	assert_non_null(strstr(d, "csv: 2 features (\"radius\", "
	                          "\"texture\") in this order"));
	assert_non_null(strstr(d, "label column \"diagnosis\""));
	assert_non_null(strstr(d, "labels 0..1"));
	assert_non_null(strstr(d, "own: from this box's 3 training"));
	p = strstr(d, "mean = [");
	assert_non_null(p);
	p += 8;
	for (uint32_t j = 0; j < 2; j++) {
		char *end;
		float v = strtof(p, &end);
		assert_true(v == ds.mean[j]);
		p = end + 2; /* ", " */
	}
	p = strstr(d, "std = [");
	assert_non_null(p);
	assert_true(strtof(p + 7, NULL) == ds.std[0]);
	fb_free(d);
	fb_dataset_fini(&ds);

	/* Fashion-MNIST-style scalar normalisation of IDX pixels */
	{
		char *img = tmp_path("desc-img.gz");
		char *lab = tmp_path("desc-lab.gz");
		write_syn(img, lab, 1, SYN_COUNT, 0);
		assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
		assert_int_equal(fb_dataset_describe(NULL, &ds, &d), FB_OK);
		assert_non_null(strstr(d, "x = (pixel / 255 - 0.286000013) / "
		                          "0.352999985 for every feature"));
		assert_non_null(strstr(d, "labels 0..9"));
		fb_free(d);
		fb_dataset_fini(&ds);
		/* per pixel, own statistics */
		sp = csv_spec(img);
		sp.format = FB_DATA_IDX;
		sp.labels = lab;
		sp.normalize = FB_NORM_OWN;
		assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
		assert_int_equal(fb_dataset_describe(&sp, &ds, &d), FB_OK);
		assert_non_null(strstr(d, "idx: 784 features (image pixels, "
		                          "row-major); x[j] = (pixel[j] / 255 - "
		                          "mean[j]) / std[j], mean = ["));
		fb_free(d);
		fb_dataset_fini(&ds);
		sp = csv_spec(f);
	}
	/* regression, not normalised */
	write_text(f, "a,t\n1,2.5\n");
	sp.label_column = "t";
	sp.task = FB_TASK_REGRESSION;
	sp.normalize = FB_NORM_NONE;
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(fb_dataset_describe(&sp, &ds, &d), FB_OK);
	assert_non_null(strstr(d, "not normalised"));
	assert_non_null(strstr(d, "target column \"t\""));
	assert_non_null(strstr(d, "regression"));
	fb_free(d);
	fb_dataset_fini(&ds);
}

static void
test_check_fit(void **state)
{
	char *f = tmp_path("fit.csv");
	fb_data_spec sp = csv_spec(f);
	fb_dataset ds;
	capture cap;

	write_text(f, "a,b,y\n1,2,0\n3,4,4\n");
	assert_int_equal(fb_dataset_load(&sp, NULL, &ds, NULL), FB_OK);
	assert_int_equal(
	    fb_dataset_check_fit(&ds, 2, FB_TASK_CLASSIFICATION, 5), FB_OK);
	capture_begin(&cap);
	assert_int_equal(
	    fb_dataset_check_fit(&ds, 3, FB_TASK_CLASSIFICATION, 5),
	    FB_EINVAL);
	assert_int_equal(
	    fb_dataset_check_fit(&ds, 2, FB_TASK_REGRESSION, 1), FB_EINVAL);
	assert_int_equal(
	    fb_dataset_check_fit(&ds, 2, FB_TASK_CLASSIFICATION, 4),
	    FB_EINVAL);
	assert_int_equal(capture_end(&cap), 3);
	assert_non_null(strstr(cap.text, "2 features per example, but the "
	                                 "model takes 3"));
	assert_non_null(strstr(cap.text, "the model is for regression"));
	assert_non_null(strstr(cap.text, "label 4 of example 1"));
	fb_dataset_fini(&ds);
}

FB_TESTS = {
	{"train split loads 60000 balanced 28x28 images", test_fmnist_train},
	{"test split loads 10000 balanced 28x28 images", test_fmnist_test},
	{"preprocessing maps 0 and 255 as the formula says",
	    test_preprocessing_values},
	{"missing dataset folder is an I/O error naming the file",
	    test_missing_fmnist_dir},
	{"gzip'd IDX files load exactly", test_gz_synthetic_loads},
	{"plain IDX files load exactly", test_plain_loads},
	{"classes is max label + 1 but at least 10", test_classes_from_labels},
	{"gzip file cut in the middle is truncated", test_truncated_gz},
	{"plain file cut short says how many bytes are missing",
	    test_truncated_plain},
	{"flipped bytes in the deflate stream are a format error",
	    test_corrupt_gz},
	{"wrong magic, swapped files and non-ubyte data are rejected",
	    test_wrong_magic},
	{"image and label counts must agree", test_count_mismatch},
	{"header claiming enormous or zero dims is refused",
	    test_enormous_dims},
	{"bytes after the data are rejected", test_trailing_garbage},
	{"missing file is an I/O error", test_missing_file},
	{"subset copies the listed examples and checks indices", test_subset},
	{"iid parts are disjoint, complete and sorted", test_iid_covers},
	{"dirichlet parts are disjoint, complete and sorted",
	    test_dirichlet_covers},
	{"shard parts are disjoint, complete and sorted", test_shards_covers},
	{"iid parts differ in size by at most one", test_iid_sizes_near_equal},
	{"same seed gives the same part and another seed another",
	    test_seed_determines_partition},
	{"dirichlet with small alpha is label-skewed",
	    test_dirichlet_is_label_skewed},
	{"two shards per worker give few labels each",
	    test_shards_have_few_labels},
	{"bad partition specs are rejected", test_bad_specs_rejected},
	{"dirichlet that cannot feed every worker is rejected",
	    test_hopeless_dirichlet_rejected},
	{"scheme names follow the enum", test_scheme_names},
	{"csv loads quoted, padded, CRLF rows with the label anywhere",
	    test_csv_loads},
	{"csv features list picks and orders the columns",
	    test_csv_feature_list},
	{"csv ragged row names file:line:column", test_csv_ragged},
	{"csv text in a numeric column names file:line:column",
	    test_csv_text},
	{"csv NaN, infinity and missing values name file:line:column",
	    test_csv_nan},
	{"csv labels out of range, negative or fractional are refused",
	    test_csv_labels},
	{"csv regression targets load as floats and split iid only",
	    test_csv_regression},
	{"csv header problems and a missing file are named",
	    test_csv_header_problems},
	{"npy files written by numpy load exactly", test_npy_loads},
	{"npy wrong dtype, shape, NaN or label names the array",
	    test_npy_refused},
	{"npy cut short, lengthened or without magic is refused",
	    test_npy_damaged},
	{"npz stored and deflated archives load exactly", test_npz_loads},
	{"npz missing arrays and damaged archives are refused",
	    test_npz_refused},
	{"own normalisation uses the training statistics for both sets",
	    test_own_normalisation},
	{"own statistics come from this worker's shard",
	    test_own_stats_from_the_shard},
	{"normalisation file is applied and checked", test_file_normalisation},
	{"idx through the entry point keeps Fashion-MNIST's preprocessing",
	    test_scalar_and_idx_through_load},
	{"describe writes constants that parse back exactly", test_describe},
	{"check_fit names width, task and label mismatches", test_check_fit},
	{NULL, NULL},
};

FB_TEST_MAIN("data")
