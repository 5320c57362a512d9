/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idx.c -- IDX dataset files (MNIST, Fashion-MNIST) into fb_dataset.
 *
 * An IDX file is a big-endian header (magic 0x000008NN: ubyte elements, NN
 * dimensions; then NN uint32 sizes) followed by exactly the elements. Files
 * may be gzip'd or plain: zlib's gzread reads both. Everything in a header
 * is checked before it sizes an allocation, and buffers grow only as data
 * actually arrives, so a lying header cannot make us allocate gigabytes for
 * a file of a few bytes. zlib stays inside this file and npz.c.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <zlib.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "data/data_impl.h"

#define IDX_MAGIC_IMAGES 0x00000803u /* ubyte, 3 dimensions */
#define IDX_MAGIC_LABELS 0x00000801u /* ubyte, 1 dimension */
#define IDX_MAX_PIXELS ((uint64_t)1 << 31) /* bytes of pixels we accept */
#define IDX_FIRST_CHUNK ((size_t)1 << 20)  /* first payload buffer, bytes */
#define IDX_GZ_BUFFER (256u * 1024u)       /* zlib's input buffer, bytes */

typedef struct idx_file {
	const char *path; /* for log lines */
	gzFile gz;        /* NULL when closed */
} idx_file;

static fb_err
idx_open(idx_file *f, const char *path)
{
	fb_err rc = FB_OK;
	int e;

	f->path = path;
	errno = 0;
	f->gz = gzopen(path, "rb");
	if (f->gz == NULL) {
		/* gzopen leaves errno 0 when its own allocation failed. */
		e = errno;
		fb_log_error("%s: cannot open: %s", path,
		    e != 0 ? strerror(e) : "out of memory");
		rc = e != 0 ? FB_EIO : FB_ENOMEM;
		goto out;
	}
	(void)gzbuffer(f->gz, IDX_GZ_BUFFER);
out:
	return rc;
}

static void
idx_close(idx_file *f)
{
	if (f->gz != NULL) {
		(void)gzclose_r(f->gz);
		f->gz = NULL;
	}
}

/* gz_detail drops the "path: " that zlib puts before its messages. */
static const char *
gz_detail(const char *path, const char *msg)
{
	size_t n = strlen(path);

	if (msg == NULL) {
		return "unknown zlib error";
	}
	if (strncmp(msg, path, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ') {
		return msg + n + 2;
	}
	return msg;
}

/*
 * idx_read reads up to `len` bytes, stopping early only at the end of the
 * data; `*got` says how many arrived. A gzip stream that ends early is a
 * short read (the caller reports the truncation); corrupt data is
 * FB_EFORMAT and a failed read(2) FB_EIO, both logged here.
 */
static fb_err
idx_read(idx_file *f, void *buf, size_t len, size_t *got)
{
	fb_err rc = FB_OK;
	uint8_t *p = buf;
	const char *msg;
	int zerr = Z_OK;
	int n;

	*got = 0;
	while (*got < len) {
		size_t want = len - *got;
		if (want > (size_t)1 << 30) {
			want = (size_t)1 << 30;
		}
		n = gzread(f->gz, p + *got, (unsigned)want);
		if (n < 0) {
			msg = gzerror(f->gz, &zerr);
			if (zerr == Z_ERRNO) {
				fb_log_error("%s: read failed: %s", f->path,
				    strerror(errno));
				rc = FB_EIO;
			} else if (zerr == Z_MEM_ERROR) {
				fb_log_error("%s: out of memory in zlib",
				    f->path);
				rc = FB_ENOMEM;
			} else {
				fb_log_error("%s: corrupt gzip data: %s",
				    f->path, gz_detail(f->path, msg));
				rc = FB_EFORMAT;
			}
			goto out;
		}
		if (n == 0) {
			break;
		}
		*got += (size_t)n;
	}
out:
	return rc;
}

static fb_err
idx_read_header(idx_file *f, uint32_t magic, uint32_t *dims, size_t ndims)
{
	fb_err rc = FB_OK;
	uint8_t hdr[4 + 4 * 3];
	size_t len = 4 + 4 * ndims;
	size_t got = 0;
	uint32_t m;

	FB_ASSERT(ndims >= 1 && ndims <= 3);
	if ((rc = idx_read(f, hdr, len, &got)) != FB_OK) {
		goto out;
	}
	if (got < 4) {
		fb_log_error("%s: truncated: expected a %zu-byte IDX header, "
		             "got %zu bytes",
		    f->path, len, got);
		rc = FB_EFORMAT;
		goto out;
	}
	m = fb_load_be32(hdr);
	if (m != magic) {
		if ((m >> 8) == 0x08 && (m & 0xffu) != ndims) {
			fb_log_error("%s: expected %zu IDX dimensions, got %u "
			             "(images and labels swapped?)",
			    f->path, ndims, (unsigned)(m & 0xffu));
		} else if ((m >> 16) == 0 && (m >> 8) != 0x08) {
			fb_log_error("%s: IDX element type 0x%02x is not "
			             "supported (only ubyte, 0x08)",
			    f->path, (unsigned)((m >> 8) & 0xffu));
		} else {
			fb_log_error("%s: bad magic 0x%08x, expected 0x%08x "
			             "(not an IDX file)",
			    f->path, (unsigned)m, (unsigned)magic);
		}
		rc = FB_EFORMAT;
		goto out;
	}
	if (got < len) {
		fb_log_error("%s: truncated: expected a %zu-byte IDX header, "
		             "got %zu bytes",
		    f->path, len, got);
		rc = FB_EFORMAT;
		goto out;
	}
	for (size_t i = 0; i < ndims; i++) {
		dims[i] = fb_load_be32(hdr + 4 + 4 * i);
		if (dims[i] == 0) {
			fb_log_error("%s: IDX dimension %zu is zero", f->path,
			    i);
			rc = FB_EFORMAT;
			goto out;
		}
	}
out:
	return rc;
}

/*
 * idx_read_payload reads exactly `len` bytes of elements into a new fb_alloc
 * buffer and checks that nothing follows them. The buffer starts small and
 * doubles as data arrives, so memory follows the file, not its header.
 */
static fb_err
idx_read_payload(idx_file *f, size_t len, const char *what, uint8_t **out)
{
	fb_err rc = FB_OK;
	uint8_t *buf = NULL;
	uint8_t *bigger;
	size_t cap = len < IDX_FIRST_CHUNK ? len : IDX_FIRST_CHUNK;
	size_t have = 0;
	size_t got = 0;
	uint8_t extra;

	*out = NULL;
	if ((buf = fb_alloc(cap)) == NULL) {
		fb_log_error("%s: out of memory for %zu bytes of %s", f->path,
		    len, what);
		rc = FB_ENOMEM;
		goto out;
	}
	while (have < len) {
		if (have == cap) {
			cap = cap > len / 2 ? len : cap * 2;
			if ((bigger = fb_alloc(cap)) == NULL) {
				fb_log_error("%s: out of memory for %zu bytes "
				             "of %s",
				    f->path, len, what);
				rc = FB_ENOMEM;
				goto out;
			}
			memcpy(bigger, buf, have);
			fb_free(buf);
			buf = bigger;
		}
		if ((rc = idx_read(f, buf + have, cap - have, &got)) != FB_OK) {
			goto out;
		}
		have += got;
		if (got == 0) {
			break;
		}
	}
	if (have < len) {
		fb_log_error("%s: truncated: expected %zu bytes of %s, got %zu",
		    f->path, len, what, have);
		rc = FB_EFORMAT;
		goto out;
	}
	/* Reading on to the end also makes zlib check the gzip CRC. */
	if ((rc = idx_read(f, &extra, 1, &got)) != FB_OK) {
		goto out;
	}
	if (got != 0) {
		fb_log_error("%s: trailing bytes after %zu bytes of %s",
		    f->path, len, what);
		rc = FB_EFORMAT;
		goto out;
	}
	*out = buf;
	buf = NULL;
out:
	fb_free(buf);
	return rc;
}

/* idx_check_images bounds an image header: count x rows x cols pixels. */
static fb_err
idx_check_images(const char *path, const uint32_t *dims)
{
	fb_err rc = FB_OK;
	uint64_t dim = (uint64_t)dims[1] * dims[2];

	/* Each factor is < 2^32, so checking after each product is safe. */
	if (dim > IDX_MAX_PIXELS || (uint64_t)dims[0] * dim > IDX_MAX_PIXELS) {
		fb_log_error("%s: header claims %u images of %ux%u pixels, "
		             "more than the %llu bytes we accept",
		    path, (unsigned)dims[0], (unsigned)dims[1],
		    (unsigned)dims[2], (unsigned long long)IDX_MAX_PIXELS);
		rc = FB_EFORMAT;
	}
	return rc;
}

/*
 * fb_data_idx_read reads the pair of files into `out` with x = pixel / 255
 * (float32) and norm NONE; classes = max label + 1.
 */
fb_err
fb_data_idx_read(const char *images_path, const char *labels_path,
    fb_dataset *out)
{
	fb_err rc = FB_OK;
	idx_file img = {images_path, NULL};
	idx_file lab = {labels_path, NULL};
	uint32_t idims[3] = {0, 0, 0};
	uint32_t ldims[1] = {0};
	uint8_t *pixels = NULL;
	uint8_t *labels = NULL;
	float *x = NULL;
	fb_label *y = NULL;
	float lut[256];
	size_t npix;
	uint8_t maxlabel = 0;

	if (out == NULL) {
		fb_log_error("dataset: load with no output");
		rc = FB_EINVAL;
		goto out;
	}
	memset(out, 0, sizeof(*out));
	if (images_path == NULL || labels_path == NULL ||
	    images_path[0] == '\0' || labels_path[0] == '\0') {
		fb_log_error("dataset: load needs an image and a label file");
		rc = FB_EINVAL;
		goto out;
	}
	/* Both headers first, so a mismatch costs no payload reads. */
	if ((rc = idx_open(&img, images_path)) != FB_OK ||
	    (rc = idx_read_header(&img, IDX_MAGIC_IMAGES, idims, 3)) !=
	        FB_OK ||
	    (rc = idx_check_images(images_path, idims)) != FB_OK) {
		goto out;
	}
	if ((rc = idx_open(&lab, labels_path)) != FB_OK ||
	    (rc = idx_read_header(&lab, IDX_MAGIC_LABELS, ldims, 1)) !=
	        FB_OK) {
		goto out;
	}
	if (ldims[0] != idims[0]) {
		fb_log_error("%s: %u labels, but %s has %u images",
		    labels_path, (unsigned)ldims[0], images_path,
		    (unsigned)idims[0]);
		rc = FB_EFORMAT;
		goto out;
	}
	if ((rc = idx_read_payload(&lab, ldims[0], "labels", &labels)) !=
	    FB_OK) {
		goto out;
	}
	npix = (size_t)idims[0] * idims[1] * idims[2];
	if ((rc = idx_read_payload(&img, npix, "pixels", &pixels)) != FB_OK) {
		goto out;
	}
	if (npix > SIZE_MAX / sizeof(float) ||
	    (x = fb_alloc(npix * sizeof(float))) == NULL ||
	    (y = fb_alloc((size_t)ldims[0] * sizeof(*y))) == NULL) {
		fb_log_error("%s: out of memory for %zu pixels", images_path,
		    npix);
		rc = FB_ENOMEM;
		goto out;
	}
	/* Exactly this float expression, so numpy can reproduce it:
	 * np.float32(p) / 255, in float32. */
	for (int p = 0; p < 256; p++) {
		lut[p] = (float)p / 255.0f;
	}
	for (size_t i = 0; i < npix; i++) {
		x[i] = lut[pixels[i]];
	}
	for (uint32_t i = 0; i < ldims[0]; i++) {
		if (labels[i] > maxlabel) {
			maxlabel = labels[i];
		}
		y[i].cls = labels[i];
	}
	out->count = idims[0];
	out->dim = idims[1] * idims[2];
	out->classes = maxlabel + 1u;
	out->task = FB_TASK_CLASSIFICATION;
	out->format = FB_DATA_IDX;
	out->norm = FB_NORM_NONE;
	out->raw_count = idims[0];
	out->x = x;
	out->y = y;
	x = NULL;
	y = NULL;
out:
	idx_close(&img);
	idx_close(&lab);
	fb_free(pixels);
	fb_free(labels);
	fb_free(x);
	fb_free(y);
	return rc;
}

fb_err
fb_dataset_load_idx(const char *images_path, const char *labels_path,
    fb_dataset *out)
{
	fb_err rc = FB_OK;

	if ((rc = fb_data_idx_read(images_path, labels_path, out)) != FB_OK) {
		goto out;
	}
	if (out->classes < 10) {
		out->classes = 10;
	}
	rc = fb_data_normalize_scalar(out, FB_FMNIST_MEAN, FB_FMNIST_STD);
	if (rc != FB_OK) {
		fb_dataset_fini(out);
	}
out:
	return rc;
}

fb_err
fb_dataset_load_fmnist(const char *dir, int train, fb_dataset *out)
{
	fb_err rc = FB_OK;
	const char *split = train ? "train" : "t10k";
	char images[4096];
	char labels[4096];
	int n1, n2;

	if (out == NULL) {
		fb_log_error("dataset: load with no output");
		rc = FB_EINVAL;
		goto out;
	}
	memset(out, 0, sizeof(*out));
	if (dir == NULL) {
		dir = FB_FMNIST_DEFAULT_DIR;
	}
	n1 = snprintf(images, sizeof(images), "%s/%s-images-idx3-ubyte.gz",
	    dir, split);
	n2 = snprintf(labels, sizeof(labels), "%s/%s-labels-idx1-ubyte.gz",
	    dir, split);
	if (n1 < 0 || (size_t)n1 >= sizeof(images) || n2 < 0 ||
	    (size_t)n2 >= sizeof(labels)) {
		fb_log_error("dataset: folder name too long: %.64s...", dir);
		rc = FB_EINVAL;
		goto out;
	}
	rc = fb_dataset_load_idx(images, labels, out);
out:
	return rc;
}
