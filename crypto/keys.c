/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keys.c -- Ed25519 identities, their files and their text form.
 *
 * A secret key file holds three lines:
 *   fedbox-ed25519-secret v1
 *   <base64 of the 32-byte Ed25519 seed>
 *   fedbox-ed25519 <base64 of the public key> [comment]
 * The last line is the public line, so a lost NAME.pub can be rebuilt
 * (fedbox-keygen --pub) and a corrupted seed is caught (derived != stored).
 * Secret bytes only ever sit in sodium_malloc'd memory and are wiped.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "crypto/crypto_impl.h"

#define KEYFILE_TAG "fedbox-ed25519-secret v1"
#define PUBLINE_TAG "fedbox-ed25519 "
#define B64_32_LEN 44    /* base64 (with padding) of 32 bytes */
#define KEYFILE_MAX 1024 /* bytes; a real key file is < 300 */
#define SIGN_DOMAIN_MAX 32

const uint8_t fb_dom_hello[FB_DOMAIN_LEN] = "fedbox/hello/v1";
const uint8_t fb_dom_reply[FB_DOMAIN_LEN] = "fedbox/reply/v1";
const uint8_t fb_dom_trans[FB_DOMAIN_LEN] = "fedbox/trans/v1";
const uint8_t fb_dom_c2s[FB_DOMAIN_LEN] = "fedbox/c2s/v1";
const uint8_t fb_dom_s2c[FB_DOMAIN_LEN] = "fedbox/s2c/v1";
const uint8_t fb_dom_stream[FB_DOMAIN_LEN] = "fedbox/stream/v1";
const uint8_t fb_dom_trailer[FB_DOMAIN_LEN] = "fedbox/trailr/v1";

static const char *const reject_names[FB_REJECT_COUNT_] = {
    [FB_REJECT_NONE] = "none",
    [FB_REJECT_MALFORMED] = "malformed",
    [FB_REJECT_TOO_LARGE] = "too_large",
    [FB_REJECT_VERSION] = "version",
    [FB_REJECT_UNKNOWN_KEY] = "unknown_key",
    [FB_REJECT_UNPINNED_KEY] = "unpinned_key",
    [FB_REJECT_BAD_SIGNATURE] = "bad_signature",
    [FB_REJECT_BAD_MAC] = "bad_mac",
    [FB_REJECT_REPLAY] = "replay",
    [FB_REJECT_WRONG_RUN] = "wrong_run",
    [FB_REJECT_WRONG_ROUND] = "wrong_round",
    [FB_REJECT_WRONG_SENDER] = "wrong_sender",
    [FB_REJECT_TRUNCATED] = "truncated",
};

const char *
fb_reject_name(fb_reject why)
{
	if ((unsigned)why >= FB_REJECT_COUNT_) {
		return "unknown";
	}
	return reject_names[why];
}

fb_err
fb_crypto_ready(void)
{
	if (sodium_init() < 0) {
		fb_log_error("libsodium failed to initialise");
		return FB_EIO;
	}
	return FB_OK;
}

fb_err
fb_crypto_init(void)
{
	return fb_crypto_ready();
}

void
fb_wipe(void *p, size_t len)
{
	if (p != NULL) {
		sodium_memzero(p, len);
	}
}

fb_err
fb_run_id_random(fb_run_id *run)
{
	fb_err rc;

	memset(run, 0, sizeof(*run));
	if ((rc = fb_crypto_ready()) != FB_OK) {
		return rc;
	}
	randombytes_buf(run->b, sizeof(run->b));
	return FB_OK;
}

/* ---- identities ---------------------------------------------------------- */

static int
comment_ok(const char *c)
{
	size_t n = 0;

	if (c == NULL) {
		return 1;
	}
	for (; c[n] != '\0'; n++) {
		unsigned char ch = (unsigned char)c[n];
		if (ch < 0x20 || ch == 0x7f) {
			return 0;
		}
	}
	return n < FB_COMMENT_MAX;
}

/* identity_new takes a 32-byte seed and builds the identity around it. */
static fb_err
identity_new(const uint8_t seed[32], const char *comment, fb_identity **out)
{
	fb_err rc = FB_OK;
	fb_identity *id = NULL;

	*out = NULL;
	if (!comment_ok(comment)) {
		rc = FB_EINVAL;
		goto out;
	}
	if ((rc = fb_crypto_ready()) != FB_OK) {
		goto out;
	}
	if ((id = fb_calloc(1, sizeof(*id))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if ((id->sk = sodium_malloc(crypto_sign_SECRETKEYBYTES)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if (pthread_mutex_init(&id->lock, NULL) != 0) {
		sodium_free(id->sk);
		id->sk = NULL;
		rc = FB_ENOMEM;
		goto out;
	}
	crypto_sign_seed_keypair(id->pk.b, id->sk, seed);
	(void)sodium_mprotect_noaccess(id->sk);
	if (comment != NULL) {
		snprintf(id->comment, sizeof(id->comment), "%s", comment);
	}
	*out = id;
	id = NULL;
out:
	if (id != NULL) {
		sodium_free(id->sk);
		fb_free(id);
	}
	return rc;
}

fb_err
fb_identity_alloc(const char *comment, fb_identity **out)
{
	fb_err rc;
	uint8_t seed[32];

	*out = NULL;
	if ((rc = fb_crypto_ready()) != FB_OK) {
		return rc;
	}
	randombytes_buf(seed, sizeof(seed));
	rc = identity_new(seed, comment, out);
	sodium_memzero(seed, sizeof(seed));
	return rc;
}

fb_err
fb_identity_alloc_from_seed(
    const uint8_t seed[32], const char *comment, fb_identity **out)
{
	return identity_new(seed, comment, out);
}

void
fb_identity_free(fb_identity *id)
{
	if (id == NULL) {
		return;
	}
	if (id->sk != NULL) {
		/* sodium_free unprotects, wipes and unmaps. */
		sodium_free(id->sk);
		pthread_mutex_destroy(&id->lock);
	}
	sodium_memzero(id, sizeof(*id));
	fb_free(id);
}

void
fb_identity_pubkey(const fb_identity *id, fb_pubkey *pk)
{
	*pk = id->pk;
}

const char *
fb_identity_comment(const fb_identity *id)
{
	return id->comment;
}

/* identity_unlock makes sk readable; pair with identity_relock. */
static void
identity_unlock(const fb_identity *id)
{
	fb_identity *m = (fb_identity *)(uintptr_t)id; /* lock is internal */

	pthread_mutex_lock(&m->lock);
	(void)sodium_mprotect_readonly(m->sk);
}

static void
identity_relock(const fb_identity *id)
{
	fb_identity *m = (fb_identity *)(uintptr_t)id;

	(void)sodium_mprotect_noaccess(m->sk);
	pthread_mutex_unlock(&m->lock);
}

void
fb_identity_sign_raw(const fb_identity *id, const uint8_t *msg, size_t len,
    uint8_t sig[FB_SIG_LEN])
{
	identity_unlock(id);
	crypto_sign_detached(sig, NULL, msg, len, id->sk);
	identity_relock(id);
}

/* domain_msg builds "fedbox/" || domain || 0 || msg in a heap buffer. */
static fb_err
domain_msg(const char *domain, const uint8_t *msg, size_t len, uint8_t **buf,
    size_t *buf_len)
{
	size_t dlen = strlen(domain);

	*buf = NULL;
	*buf_len = 0;
	if (dlen == 0 || dlen > SIGN_DOMAIN_MAX || len > SIZE_MAX - 64) {
		return FB_EINVAL;
	}
	*buf_len = 7 + dlen + 1 + len;
	if ((*buf = fb_alloc(*buf_len)) == NULL) {
		return FB_ENOMEM;
	}
	memcpy(*buf, "fedbox/", 7);
	memcpy(*buf + 7, domain, dlen);
	(*buf)[7 + dlen] = 0;
	if (len > 0) {
		memcpy(*buf + 8 + dlen, msg, len);
	}
	return FB_OK;
}

fb_err
fb_identity_sign(const fb_identity *id, const char *domain, const uint8_t *msg,
    size_t len, uint8_t sig[FB_SIG_LEN])
{
	fb_err rc;
	uint8_t *buf = NULL;
	size_t buf_len = 0;

	memset(sig, 0, FB_SIG_LEN);
	if ((rc = domain_msg(domain, msg, len, &buf, &buf_len)) != FB_OK) {
		goto out;
	}
	fb_identity_sign_raw(id, buf, buf_len, sig);
out:
	fb_free(buf);
	return rc;
}

fb_err
fb_pubkey_verify(const fb_pubkey *pk, const char *domain, const uint8_t *msg,
    size_t len, const uint8_t sig[FB_SIG_LEN])
{
	fb_err rc;
	uint8_t *buf = NULL;
	size_t buf_len = 0;

	if ((rc = domain_msg(domain, msg, len, &buf, &buf_len)) != FB_OK) {
		goto out;
	}
	if (crypto_sign_verify_detached(sig, buf, buf_len, pk->b) != 0) {
		rc = FB_EAUTH;
	}
out:
	fb_free(buf);
	return rc;
}

/* ---- public keys as text ------------------------------------------------- */

/* b64_32_decode decodes exactly B64_32_LEN chars into 32 bytes. */
static int
b64_32_decode(const char *s, uint8_t out[32])
{
	size_t bin_len = 0;
	const char *end = NULL;

	if (sodium_base642bin(out, 32, s, B64_32_LEN, NULL, &bin_len, &end,
	        sodium_base64_VARIANT_ORIGINAL) != 0 ||
	    bin_len != 32 || end != s + B64_32_LEN) {
		return -1;
	}
	return 0;
}

static int
pubkey_point_ok(const fb_pubkey *pk)
{
	uint8_t x[32];
	int ok = crypto_sign_ed25519_pk_to_curve25519(x, pk->b) == 0;

	sodium_memzero(x, sizeof(x));
	return ok;
}

fb_err
fb_pubkey_parse(
    const char *line, fb_pubkey *pk, char *comment, size_t comment_cap)
{
	fb_err rc = FB_OK;
	size_t len, taglen = strlen(PUBLINE_TAG);
	const char *b64, *rest;
	size_t rest_len;

	memset(pk, 0, sizeof(*pk));
	if (comment != NULL && comment_cap > 0) {
		comment[0] = '\0';
	}
	if (fb_crypto_ready() != FB_OK) {
		return FB_EIO;
	}
	len = strlen(line);
	if (len > 0 && line[len - 1] == '\n') {
		len--;
		if (len > 0 && line[len - 1] == '\r') {
			len--;
		}
	}
	if (len < taglen + B64_32_LEN ||
	    memcmp(line, PUBLINE_TAG, taglen) != 0) {
		rc = FB_EINVAL;
		goto out;
	}
	b64 = line + taglen;
	for (size_t i = 0; i < B64_32_LEN; i++) {
		if (b64[i] == ' ' || b64[i] == '\n') {
			rc = FB_EINVAL;
			goto out;
		}
	}
	if (b64_32_decode(b64, pk->b) != 0) {
		rc = FB_EINVAL;
		goto out;
	}
	rest = b64 + B64_32_LEN;
	rest_len = len - taglen - B64_32_LEN;
	if (rest_len > 0) {
		if (rest[0] != ' ' || rest_len - 1 >= FB_COMMENT_MAX) {
			rc = FB_EINVAL;
			goto out;
		}
		for (size_t i = 1; i < rest_len; i++) {
			unsigned char ch = (unsigned char)rest[i];
			if (ch < 0x20 || ch == 0x7f) {
				rc = FB_EINVAL;
				goto out;
			}
		}
	}
	if (!pubkey_point_ok(pk)) {
		rc = FB_EINVAL;
		goto out;
	}
	if (comment != NULL && comment_cap > 0 && rest_len > 1) {
		size_t n = rest_len - 1 < comment_cap - 1 ? rest_len - 1
		                                          : comment_cap - 1;
		memcpy(comment, rest + 1, n);
		comment[n] = '\0';
	}
out:
	if (rc != FB_OK) {
		memset(pk, 0, sizeof(*pk));
	}
	return rc;
}

fb_err
fb_pubkey_format(
    const fb_pubkey *pk, const char *comment, char *buf, size_t cap)
{
	char b64[B64_32_LEN + 1];
	int n;

	if (cap > 0) {
		buf[0] = '\0';
	}
	if (!comment_ok(comment)) {
		return FB_EINVAL;
	}
	sodium_bin2base64(b64, sizeof(b64), pk->b, sizeof(pk->b),
	    sodium_base64_VARIANT_ORIGINAL);
	if (comment != NULL && comment[0] != '\0') {
		n = snprintf(buf, cap, "%s%s %s", PUBLINE_TAG, b64, comment);
	} else {
		n = snprintf(buf, cap, "%s%s", PUBLINE_TAG, b64);
	}
	if (n < 0 || (size_t)n >= cap) {
		if (cap > 0) {
			buf[0] = '\0';
		}
		return FB_ERANGE;
	}
	return FB_OK;
}

fb_err
fb_pubkey_load(
    const char *path, fb_pubkey *pk, char *comment, size_t comment_cap)
{
	fb_err rc = FB_OK;
	char line[FB_PUBLINE_MAX + 8];
	FILE *f;

	memset(pk, 0, sizeof(*pk));
	if (comment != NULL && comment_cap > 0) {
		comment[0] = '\0';
	}
	if ((f = fopen(path, "r")) == NULL) {
		fb_log_error("cannot open %s: %s", path, strerror(errno));
		return FB_EIO;
	}
	if (fgets(line, sizeof(line), f) == NULL) {
		fb_log_error("%s: empty public key file", path);
		rc = FB_EINVAL;
		goto out;
	}
	if ((rc = fb_pubkey_parse(line, pk, comment, comment_cap)) != FB_OK) {
		fb_log_error("%s: not a public key line (want "
		             "'fedbox-ed25519 <base64 key> [comment]')",
		    path);
	}
out:
	fclose(f);
	return rc;
}

void
fb_pubkey_fingerprint(const fb_pubkey *pk, char out[FB_FINGERPRINT_SIZE])
{
	uint8_t h[32];

	crypto_generichash(h, sizeof(h), pk->b, sizeof(pk->b), NULL, 0);
	memcpy(out, "fb:", 3);
	sodium_bin2hex(out + 3, FB_FINGERPRINT_SIZE - 3, h, 8);
}

int
fb_pubkey_equal(const fb_pubkey *a, const fb_pubkey *b)
{
	return sodium_memcmp(a->b, b->b, FB_PUBKEY_LEN) == 0;
}

/* ---- key files ----------------------------------------------------------- */

/*
 * write_file writes `buf` to `path` through a temporary made with
 * O_EXCL|0600, then renames it (force) or hard-links it (no overwrite).
 */
static fb_err
write_file(
    const char *path, const char *buf, size_t len, mode_t mode, int force)
{
	fb_err rc = FB_OK;
	char tmp[4096];
	int fd = -1;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >=
	    (int)sizeof(tmp)) {
		fb_log_error("%s: path too long", path);
		return FB_EINVAL;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		fb_log_error("cannot create %s: %s", tmp, strerror(errno));
		return FB_EIO;
	}
	if (fb_write_all(fd, buf, len) != FB_OK || fchmod(fd, mode) != 0 ||
	    fsync(fd) != 0) {
		fb_log_error("cannot write %s: %s", tmp, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	if (close(fd) != 0) {
		fd = -1;
		fb_log_error("cannot close %s: %s", tmp, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	fd = -1;
	if (force) {
		if (rename(tmp, path) != 0) {
			fb_log_error("cannot rename %s to %s: %s", tmp, path,
			    strerror(errno));
			rc = FB_EIO;
		}
	} else if (link(tmp, path) != 0) {
		fb_log_error("cannot create %s: %s", path, strerror(errno));
		rc = FB_EIO;
	}
out:
	if (fd >= 0) {
		close(fd);
	}
	(void)unlink(tmp);
	return rc;
}

fb_err
fb_identity_save(const fb_identity *id, const char *name, int force)
{
	fb_err rc = FB_OK;
	char key_path[4096], pub_path[4096];
	char publine[FB_PUBLINE_MAX];
	char *secret = NULL; /* the key file's text */
	size_t secret_cap = 256, n;
	struct stat st;
	int key_written = 0;

	if (snprintf(key_path, sizeof(key_path), "%s.key", name) >=
	        (int)sizeof(key_path) ||
	    snprintf(pub_path, sizeof(pub_path), "%s.pub", name) >=
	        (int)sizeof(pub_path)) {
		fb_log_error("%s: name too long", name);
		return FB_EINVAL;
	}
	if (!force) {
		if (lstat(key_path, &st) == 0 || lstat(pub_path, &st) == 0) {
			fb_log_error("%s exists; not overwriting it",
			    lstat(key_path, &st) == 0 ? key_path : pub_path);
			return FB_EIO;
		}
	}
	if ((rc = fb_pubkey_format(
	         &id->pk, id->comment, publine, sizeof(publine))) != FB_OK) {
		goto out;
	}
	if ((secret = sodium_malloc(secret_cap)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memcpy(secret, KEYFILE_TAG "\n", strlen(KEYFILE_TAG) + 1);
	n = strlen(KEYFILE_TAG) + 1;
	identity_unlock(id);
	/* The first 32 bytes of a libsodium Ed25519 secret key are the seed. */
	sodium_bin2base64(secret + n, secret_cap - n, id->sk, 32,
	    sodium_base64_VARIANT_ORIGINAL);
	identity_relock(id);
	n += B64_32_LEN;
	secret[n++] = '\n';
	if (n + strlen(publine) + 2 > secret_cap) {
		rc = FB_ERANGE;
		goto out;
	}
	memcpy(secret + n, publine, strlen(publine));
	n += strlen(publine);
	secret[n++] = '\n';
	if ((rc = write_file(key_path, secret, n, 0600, force)) != FB_OK) {
		goto out;
	}
	key_written = 1;
	n = strlen(publine);
	publine[n] = '\n';
	if ((rc = write_file(pub_path, publine, n + 1, 0644, force)) != FB_OK) {
		goto out;
	}
out:
	if (rc != FB_OK && key_written && !force) {
		(void)unlink(key_path);
	}
	sodium_free(secret);
	return rc;
}

/* next_line returns the line at *pos (without "\n") and advances *pos. */
static const char *
next_line(char *buf, size_t len, size_t *pos)
{
	char *start, *nl;

	if (*pos >= len) {
		return NULL;
	}
	start = buf + *pos;
	nl = memchr(start, '\n', len - *pos);
	if (nl == NULL) {
		*pos = len;
		return start; /* buf is NUL-terminated by the reader */
	}
	*nl = '\0';
	*pos = (size_t)(nl - buf) + 1;
	return start;
}

fb_err
fb_identity_load(const char *path, fb_identity **out)
{
	fb_err rc = FB_OK;
	int fd = -1;
	struct stat st;
	char *buf = NULL; /* sodium_malloc'd: holds the base64 seed */
	uint8_t *seed = NULL;
	size_t len = 0, pos = 0;
	const char *l1, *l2, *l3;
	char comment[FB_COMMENT_MAX];
	fb_pubkey stored;
	fb_identity *id = NULL;

	*out = NULL;
	if ((rc = fb_crypto_ready()) != FB_OK) {
		goto out;
	}
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		fb_log_error(
		    "cannot open secret key %s: %s", path, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	if (fstat(fd, &st) != 0) {
		fb_log_error("cannot stat %s: %s", path, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		fb_log_error("%s: secret key is not a regular file", path);
		rc = FB_EINVAL;
		goto out;
	}
	if ((st.st_mode & 077) != 0) {
		fb_log_error("%s: secret key file is accessible by group or "
		             "others (mode %04o); refusing to use it; fix it "
		             "with: chmod 600 %s",
		    path, (unsigned)(st.st_mode & 07777), path);
		rc = FB_EINVAL;
		goto out;
	}
	if ((buf = sodium_malloc(KEYFILE_MAX + 1)) == NULL ||
	    (seed = sodium_malloc(32)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	while (len < KEYFILE_MAX) {
		ssize_t k = read(fd, buf + len, KEYFILE_MAX - len);
		if (k < 0 && errno == EINTR) {
			continue;
		}
		if (k < 0) {
			fb_log_error(
			    "cannot read %s: %s", path, strerror(errno));
			rc = FB_EIO;
			goto out;
		}
		if (k == 0) {
			break;
		}
		len += (size_t)k;
	}
	buf[len] = '\0';
	l1 = next_line(buf, len, &pos);
	l2 = next_line(buf, len, &pos);
	l3 = next_line(buf, len, &pos);
	if (len == KEYFILE_MAX || l1 == NULL || l2 == NULL || l3 == NULL ||
	    strcmp(l1, KEYFILE_TAG) != 0 || strlen(l2) != B64_32_LEN ||
	    b64_32_decode(l2, seed) != 0 ||
	    fb_pubkey_parse(l3, &stored, comment, sizeof(comment)) != FB_OK) {
		fb_log_error("%s: not a fedbox secret key file (want first "
		             "line '" KEYFILE_TAG "')",
		    path);
		rc = FB_EFORMAT;
		goto out;
	}
	if ((rc = identity_new(seed, comment, &id)) != FB_OK) {
		goto out;
	}
	if (!fb_pubkey_equal(&id->pk, &stored)) {
		fb_log_error("%s: corrupt secret key (its public line does not "
		             "match the secret)",
		    path);
		rc = FB_EFORMAT;
		goto out;
	}
	*out = id;
	id = NULL;
out:
	if (fd >= 0) {
		close(fd);
	}
	fb_identity_free(id);
	sodium_free(buf);
	sodium_free(seed);
	return rc;
}
