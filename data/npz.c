/* SPDX-License-Identifier: Apache-2.0 */
/*
 * npz.c -- NumPy .npz archives (np.savez, np.savez_compressed) into
 * fb_dataset.
 *
 * An .npz is a zip file with one "<name>.npy" entry per array, stored or
 * deflated, often with zip64 extra fields (numpy asks for them). We read
 * the end-of-central-directory record (zip64 when present), find the two
 * entries by name in the central directory, read each one's local header
 * and data with pread, inflate it when deflated, check its CRC-32, and hand
 * the bytes to the .npy decoder. Sizes come from the central directory and
 * are checked against the file before they size anything; an inflated
 * entry may not claim more than deflate can produce from its compressed
 * bytes. Encrypted entries, other compression methods and multi-disk
 * archives are refused. zlib stays inside this file and idx.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"
#include "data/data_impl.h"

#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_LOCAL 0x04034b50u
#define EOCD_LEN 22u
#define CENTRAL_LEN 46u
#define LOCAL_LEN 30u
#define MAX_COMMENT 65535u
#define DEFLATE_MAX_RATIO 1032u /* deflate's best ratio, with margin */
#define NAMES_SHOWN 8

typedef struct zip_entry {
	char name[264];
	uint16_t method; /* 0 stored, 8 deflate */
	uint16_t flags;
	uint32_t crc;
	uint64_t csize;
	uint64_t usize;
	uint64_t local; /* offset of the local header */
} zip_entry;

typedef struct zip_file {
	const char *path;
	int fd;
	uint64_t size;
	uint8_t *cd; /* the central directory */
	uint64_t cd_len;
	uint64_t entries;
} zip_file;

static uint16_t
le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static uint64_t
le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static fb_err
bad_zip(const zip_file *z, const char *what)
{
	fb_log_error("%s: not a usable .npz (zip) file: %s", z->path, what);
	return FB_EFORMAT;
}

/* read_at reads exactly len bytes at off. */
static fb_err
read_at(const zip_file *z, uint64_t off, void *buf, size_t len)
{
	size_t got = 0;

	if (off > z->size || len > z->size - off) {
		return bad_zip(z, "a record points past the end of the file");
	}
	while (got < len) {
		ssize_t n = pread(
		    z->fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0) {
			fb_log_error("%s: read failed: %s", z->path,
			    n < 0 ? strerror(errno) : "file shrank");
			return FB_EIO;
		}
		got += (size_t)n;
	}
	return FB_OK;
}

/* zip_open finds the end records and reads the central directory. */
static fb_err
zip_open(zip_file *z, const char *path)
{
	fb_err rc = FB_OK;
	struct stat st;
	uint8_t tail[EOCD_LEN + MAX_COMMENT];
	uint8_t rec[56];
	size_t tail_len;
	uint64_t eocd = UINT64_MAX, cd_off, cd_len, entries;

	memset(z, 0, sizeof(*z));
	z->fd = -1;
	z->path = path;
	if ((z->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		fb_log_error("%s: cannot open: %s", path, strerror(errno));
		return FB_EIO;
	}
	if (fstat(z->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		fb_log_error("%s: not a regular file", path);
		return FB_EIO;
	}
	z->size = (uint64_t)st.st_size;
	if (z->size < EOCD_LEN) {
		return bad_zip(z, "too short for a zip file");
	}
	tail_len = z->size < sizeof(tail) ? (size_t)z->size : sizeof(tail);
	if ((rc = read_at(z, z->size - tail_len, tail, tail_len)) != FB_OK) {
		return rc;
	}
	for (size_t i = tail_len - EOCD_LEN + 1; i-- > 0;) {
		if (le32(tail + i) == SIG_EOCD &&
		    i + EOCD_LEN + le16(tail + i + 20) == tail_len) {
			eocd = z->size - tail_len + i;
			memcpy(rec, tail + i, EOCD_LEN);
			break;
		}
	}
	if (eocd == UINT64_MAX) {
		return bad_zip(z, "no end-of-central-directory record");
	}
	if (le16(rec + 4) != 0 || le16(rec + 6) != 0) {
		return bad_zip(z, "multi-disk archives are not supported");
	}
	entries = le16(rec + 10);
	cd_len = le32(rec + 12);
	cd_off = le32(rec + 16);
	if (entries == 0xffff || cd_len == 0xffffffffu ||
	    cd_off == 0xffffffffu) {
		uint64_t at;
		if (eocd < 20) {
			return bad_zip(z, "zip64 locator missing");
		}
		if ((rc = read_at(z, eocd - 20, rec, 20)) != FB_OK) {
			return rc;
		}
		if (le32(rec) != SIG_LOC64) {
			return bad_zip(z, "zip64 locator missing");
		}
		at = le64(rec + 8);
		if ((rc = read_at(z, at, rec, 56)) != FB_OK) {
			return rc;
		}
		if (le32(rec) != SIG_EOCD64) {
			return bad_zip(z, "bad zip64 end record");
		}
		entries = le64(rec + 32);
		cd_len = le64(rec + 40);
		cd_off = le64(rec + 48);
	}
	if (cd_off > z->size || cd_len > z->size - cd_off ||
	    entries > cd_len / CENTRAL_LEN) {
		return bad_zip(z, "central directory out of bounds");
	}
	if ((z->cd = fb_alloc(cd_len + 1)) == NULL) {
		fb_log_error("%s: out of memory", path);
		return FB_ENOMEM;
	}
	z->cd_len = cd_len;
	z->entries = entries;
	return read_at(z, cd_off, z->cd, (size_t)cd_len);
}

static void
zip_close(zip_file *z)
{
	if (z->fd >= 0) {
		close(z->fd);
	}
	fb_free(z->cd);
	memset(z, 0, sizeof(*z));
	z->fd = -1;
}

/* zip64_sizes applies a zip64 extra field (id 1) to the entry. */
static fb_err
zip64_sizes(const zip_file *z, const uint8_t *ex, size_t len, zip_entry *e,
    int need_u, int need_c, int need_off)
{
	size_t at = 0;

	while (at + 4 <= len) {
		uint16_t id = le16(ex + at), n = le16(ex + at + 2);
		const uint8_t *d = ex + at + 4;
		size_t k = 0;
		if (at + 4 + n > len) {
			break;
		}
		if (id == 1) {
			if (need_u && k + 8 <= n) {
				e->usize = le64(d + k);
				k += 8;
				need_u = 0;
			}
			if (need_c && k + 8 <= n) {
				e->csize = le64(d + k);
				k += 8;
				need_c = 0;
			}
			if (need_off && k + 8 <= n) {
				e->local = le64(d + k);
				need_off = 0;
			}
		}
		at += 4 + (size_t)n;
	}
	if (need_u || need_c || need_off) {
		return bad_zip(z, "zip64 sizes missing");
	}
	return FB_OK;
}

/*
 * zip_find looks up entry `name` in the central directory. *found is 0
 * when it is not there (not an error here).
 */
static fb_err
zip_find(const zip_file *z, const char *name, zip_entry *e, int *found)
{
	fb_err rc = FB_OK;
	uint64_t at = 0;
	size_t want = strlen(name);

	*found = 0;
	for (uint64_t i = 0; i < z->entries; i++) {
		const uint8_t *c = z->cd + at;
		uint16_t nlen, xlen, clen;
		if (at + CENTRAL_LEN > z->cd_len || le32(c) != SIG_CENTRAL) {
			return bad_zip(z, "bad central directory entry");
		}
		nlen = le16(c + 28);
		xlen = le16(c + 30);
		clen = le16(c + 32);
		if (at + CENTRAL_LEN + nlen + xlen + clen > z->cd_len) {
			return bad_zip(z, "central directory entry too long");
		}
		if (nlen == want && memcmp(c + CENTRAL_LEN, name, want) == 0) {
			memset(e, 0, sizeof(*e));
			snprintf(e->name, sizeof(e->name), "%s", name);
			e->flags = le16(c + 8);
			e->method = le16(c + 10);
			e->crc = le32(c + 16);
			e->csize = le32(c + 20);
			e->usize = le32(c + 24);
			e->local = le32(c + 42);
			rc = zip64_sizes(z, c + CENTRAL_LEN + nlen, xlen, e,
			    e->usize == 0xffffffffu, e->csize == 0xffffffffu,
			    e->local == 0xffffffffu);
			if (rc == FB_OK) {
				*found = 1;
			}
			return rc;
		}
		at += CENTRAL_LEN + (uint64_t)nlen + xlen + clen;
	}
	return rc;
}

/* log_members names the archive's arrays after a "no such array" error. */
static void
log_members(const zip_file *z)
{
	char buf[512];
	size_t used = 0;
	uint64_t at = 0;

	buf[0] = '\0';
	for (uint64_t i = 0; i < z->entries && i < NAMES_SHOWN; i++) {
		const uint8_t *c = z->cd + at;
		uint16_t nlen;
		int k;
		if (at + CENTRAL_LEN > z->cd_len || le32(c) != SIG_CENTRAL) {
			break;
		}
		nlen = le16(c + 28);
		if (at + CENTRAL_LEN + nlen > z->cd_len) {
			break;
		}
		/* "x.npy" is array "x". */
		k = snprintf(buf + used, sizeof(buf) - used, "%s'%.*s'",
		    i > 0 ? ", " : "",
		    nlen > 4 &&
		            memcmp(c + CENTRAL_LEN + nlen - 4, ".npy", 4) == 0
		        ? (int)nlen - 4
		        : (int)nlen,
		    (const char *)c + CENTRAL_LEN);
		if (k < 0 || (size_t)k >= sizeof(buf) - used) {
			break;
		}
		used += (size_t)k;
		at +=
		    CENTRAL_LEN + (uint64_t)nlen + le16(c + 30) + le16(c + 32);
	}
	fb_log_error("%s: the archive holds: %s%s", z->path,
	    used > 0 ? buf : "nothing",
	    z->entries > NAMES_SHOWN ? ", ..." : "");
}

/* zip_read reads entry `e` into a new fb_alloc buffer of e->usize bytes. */
static fb_err
zip_read(const zip_file *z, const zip_entry *e, uint8_t **out)
{
	fb_err rc = FB_OK;
	uint8_t loc[LOCAL_LEN];
	uint8_t *comp = NULL, *data = NULL;
	uint64_t off;
	z_stream zs;
	int zinit = 0, zr;

	*out = NULL;
	if (e->flags & 1u) {
		fb_log_error("%s: entry %s is encrypted", z->path, e->name);
		return FB_EFORMAT;
	}
	if (e->method != 0 && e->method != 8) {
		fb_log_error("%s: entry %s uses compression method %u (only "
		             "stored and deflate are supported)",
		    z->path, e->name, e->method);
		return FB_EFORMAT;
	}
	if ((rc = read_at(z, e->local, loc, LOCAL_LEN)) != FB_OK) {
		goto out;
	}
	if (le32(loc) != SIG_LOCAL) {
		rc = bad_zip(z, "bad local header");
		goto out;
	}
	off = e->local + LOCAL_LEN + le16(loc + 26) + le16(loc + 28);
	if (off > z->size || e->csize > z->size - off) {
		rc = bad_zip(z, "entry data past the end of the file");
		goto out;
	}
	if ((e->method == 0 && e->usize != e->csize) ||
	    (e->method == 8 && e->usize / DEFLATE_MAX_RATIO > e->csize + 1)) {
		rc = bad_zip(z, "entry sizes are inconsistent");
		goto out;
	}
	if (e->usize > SIZE_MAX - 1 || e->csize > SIZE_MAX - 1 ||
	    (data = fb_alloc((size_t)e->usize + 1)) == NULL) {
		fb_log_error(
		    "%s: out of memory for entry %s", z->path, e->name);
		rc = FB_ENOMEM;
		goto out;
	}
	if (e->method == 0) {
		rc = read_at(z, off, data, (size_t)e->usize);
		if (rc != FB_OK) {
			goto out;
		}
	} else {
		if ((comp = fb_alloc((size_t)e->csize + 1)) == NULL) {
			fb_log_error(
			    "%s: out of memory for entry %s", z->path, e->name);
			rc = FB_ENOMEM;
			goto out;
		}
		if ((rc = read_at(z, off, comp, (size_t)e->csize)) != FB_OK) {
			goto out;
		}
		memset(&zs, 0, sizeof(zs));
		if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) {
			rc = FB_ENOMEM;
			goto out;
		}
		zinit = 1;
		zs.next_in = comp;
		zs.next_out = data;
		{
			uint64_t in_left = e->csize, out_left = e->usize + 1;
			do {
				uInt ci = in_left > (1u << 30) ? (1u << 30)
				                               : (uInt)in_left;
				uInt co = out_left > (1u << 30)
				              ? (1u << 30)
				              : (uInt)out_left;
				uInt ai, ao;
				zs.avail_in = ci;
				zs.avail_out = co;
				zr = inflate(&zs, Z_NO_FLUSH);
				ai = ci - zs.avail_in;
				ao = co - zs.avail_out;
				in_left -= ai;
				out_left -= ao;
				if (zr != Z_OK || (ai == 0 && ao == 0)) {
					break;
				}
			} while (1);
			if (zr != Z_STREAM_END || out_left != 1) {
				fb_log_error("%s: entry %s: corrupt deflate "
				             "data%s",
				    z->path, e->name,
				    zr == Z_STREAM_END ? " (wrong size)" : "");
				rc = FB_EFORMAT;
				goto out;
			}
		}
	}
	{
		uLong crc = crc32(0L, Z_NULL, 0);
		uint64_t left = e->usize;
		const uint8_t *p = data;
		while (left > 0) {
			uInt n = left > (1u << 30) ? (1u << 30) : (uInt)left;
			crc = crc32(crc, p, n);
			p += n;
			left -= n;
		}
		if ((uint32_t)crc != e->crc) {
			fb_log_error("%s: entry %s fails its CRC-32 check "
			             "(damaged file)",
			    z->path, e->name);
			rc = FB_EFORMAT;
			goto out;
		}
	}
	*out = data;
	data = NULL;
out:
	if (zinit) {
		inflateEnd(&zs);
	}
	fb_free(comp);
	fb_free(data);
	return rc;
}

/* read_array decodes array `array` (entry "<array>.npy") of the archive. */
static fb_err
read_array(const zip_file *z, const char *array, const char *key, int labels,
    const fb_data_spec *spec, fb_dataset *out)
{
	fb_err rc = FB_OK;
	char entry[260], name[600];
	zip_entry e;
	uint8_t *buf = NULL;
	int found = 0;

	if (array == NULL || array[0] == '\0' || strlen(array) > 250) {
		fb_log_error("%s: no usable array name (%s)", z->path, key);
		rc = FB_EINVAL;
		goto out;
	}
	snprintf(entry, sizeof(entry), "%s.npy", array);
	snprintf(name, sizeof(name), "%s: array '%s'", z->path, array);
	if ((rc = zip_find(z, entry, &e, &found)) != FB_OK) {
		goto out;
	}
	if (!found) {
		fb_log_error("%s: no array '%s' (%s)", z->path, array, key);
		log_members(z);
		rc = FB_EFORMAT;
		goto out;
	}
	if ((rc = zip_read(z, &e, &buf)) != FB_OK) {
		goto out;
	}
	rc = fb_data_npy_parse(buf, (size_t)e.usize, name, labels, spec, out);
out:
	fb_free(buf);
	return rc;
}

fb_err
fb_data_npz_read(const char *path, const fb_data_spec *spec, fb_dataset *out)
{
	fb_err rc = FB_OK;
	zip_file z;
	fb_dataset xs, ys;
	char xname[600], yname[600];

	memset(&xs, 0, sizeof(xs));
	memset(&ys, 0, sizeof(ys));
	memset(out, 0, sizeof(*out));
	if ((rc = zip_open(&z, path)) != FB_OK) {
		goto out;
	}
	if ((rc = read_array(&z, spec->x_array, "x_array", 0, spec, &xs)) !=
	        FB_OK ||
	    (rc = read_array(&z, spec->y_array, "y_array", 1, spec, &ys)) !=
	        FB_OK) {
		goto out;
	}
	snprintf(xname, sizeof(xname), "%s: array '%s'", path, spec->x_array);
	snprintf(yname, sizeof(yname), "array '%s'", spec->y_array);
	if ((rc = fb_data_npy_join(xname, &xs, yname, &ys, spec, out)) !=
	    FB_OK) {
		goto out;
	}
	out->format = FB_DATA_NPZ;
out:
	zip_close(&z);
	fb_free(xs.x);
	fb_free(ys.y);
	return rc;
}
