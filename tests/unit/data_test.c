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

static const char *
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
		assert_true(ds.y[i] < 10);
		per_class[ds.y[i]]++;
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
	assert_int_equal(ds.y[0], raw_label);
	assert_int_equal(ds.y[0], 9); /* both splits open with an ankle boot */

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
		assert_int_equal(ds->y[i], syn_label(i));
	}
}

static void
test_gz_synthetic_loads(void **state)
{
	const char *img = tmp_path("syn-img.gz");
	const char *lab = tmp_path("syn-lab.gz");
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
	const char *img = tmp_path("plain-img");
	const char *lab = tmp_path("plain-lab");
	fb_dataset ds;

	write_syn(img, lab, 0, SYN_COUNT, 0);
	assert_int_equal(fb_dataset_load_idx(img, lab, &ds), FB_OK);
	check_syn(&ds);
	fb_dataset_fini(&ds);
}

static void
test_classes_from_labels(void **state)
{
	const char *img = tmp_path("cls-img");
	const char *lab = tmp_path("cls-lab");
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
	const char *img = tmp_path("trunc-img.gz");
	const char *lab = tmp_path("trunc-lab.gz");
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
	const char *img = tmp_path("tp-img");
	const char *lab = tmp_path("tp-lab");
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
	const char *img = tmp_path("corrupt-img.gz");
	const char *lab = tmp_path("corrupt-lab.gz");
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
	const char *img = tmp_path("magic-img");
	const char *lab = tmp_path("magic-lab");
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
	const char *img = tmp_path("mis-img.gz");
	const char *lab = tmp_path("mis-lab.gz");

	write_syn(img, lab, 1, SYN_COUNT - 1, 0);
	expect_load_error(img, lab, FB_EFORMAT, lab, "labels");
	write_syn(img, lab, 1, SYN_COUNT + 1, 0);
	expect_load_error(img, lab, FB_EFORMAT, lab, "labels");
}

static void
test_enormous_dims(void **state)
{
	const char *img = tmp_path("huge-img");
	const char *lab = tmp_path("huge-lab.gz");
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
	const char *img = tmp_path("trail-img.gz");
	const char *lab = tmp_path("trail-lab.gz");
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
	const char *img = tmp_path("mf-img.gz");
	const char *lab = tmp_path("mf-lab.gz");

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
	const char *img = tmp_path("sub-img.gz");
	const char *lab = tmp_path("sub-lab.gz");
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
		assert_int_equal(sub.y[i], ds.y[pick[i]]);
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
		assert_int_equal(fb_partition_indices(labels, count, 10, &spec,
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
		assert_int_equal(fb_partition_indices(labels, count, 10, &spec,
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
	    fb_partition_indices(labels, count, 10, &spec, &a, &na), FB_OK);
	spec.seed = seed_b;
	assert_int_equal(
	    fb_partition_indices(labels, count, 10, &spec, &b, &nb), FB_OK);
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
		assert_int_equal(fb_partition_indices(labels, count, 10, &spec,
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
	    fb_partition_indices(labels, count, classes, &spec, &idx, &n),
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
	{NULL, NULL},
};

FB_TEST_MAIN("data")
