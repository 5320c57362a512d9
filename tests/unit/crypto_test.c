/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_test.c -- unit tests of crypto/: round trips of keys, handshake,
 * sealed messages and streams, and a negative test for every accept path
 * (flipped bits, replays, reordering, truncation, wrong run/round/sender,
 * unknown and unpinned keys, bad key files and lines). Known answers come
 * from RFC 8032 (Ed25519) and RFC 7693 (BLAKE2b).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "crypto/crypto.h"
#include "crypto/crypto_impl.h"
#include "tests/unit/harness.h"

#define PROTO 7

/* ---- fixture ------------------------------------------------------------- */

#define NOW_MS 5000000 /* the coordinator's clock for cookies */
#define COOKIE_MS 30000

typedef struct fixture {
	fb_identity *coord, *w0, *w1, *outsider;
	fb_pubkey coord_pk, allowed[2], outsider_pk;
	fb_allowlist allow;
	fb_run_id run;
	uint8_t cookie_key[FB_HS_COOKIE_KEY_LEN];
	uint8_t cookie[FB_HS_COOKIE_LEN]; /* issued at NOW_MS */
} fixture;

static fixture fx_;

static const fixture *
fx(void)
{
	uint8_t seed[32];

	if (fx_.coord != NULL) {
		return &fx_;
	}
	memset(seed, 1, sizeof(seed));
	assert_int_equal(
	    fb_identity_alloc_from_seed(seed, "coord", &fx_.coord), FB_OK);
	assert_int_equal(fb_identity_alloc(NULL, &fx_.w0), FB_OK);
	assert_int_equal(fb_identity_alloc("w1", &fx_.w1), FB_OK);
	assert_int_equal(fb_identity_alloc(NULL, &fx_.outsider), FB_OK);
	fb_identity_pubkey(fx_.coord, &fx_.coord_pk);
	fb_identity_pubkey(fx_.w0, &fx_.allowed[0]);
	fb_identity_pubkey(fx_.w1, &fx_.allowed[1]);
	fb_identity_pubkey(fx_.outsider, &fx_.outsider_pk);
	fx_.allow.keys = fx_.allowed;
	fx_.allow.count = 2;
	assert_int_equal(fb_run_id_random(&fx_.run), FB_OK);
	randombytes_buf(fx_.cookie_key, sizeof(fx_.cookie_key));
	fb_hs_cookie_make(fx_.cookie_key, NOW_MS, fx_.cookie);
	return &fx_;
}

static fb_hs_accept_cfg
accept_cfg(const fixture *f, const fb_run_id *run)
{
	fb_hs_accept_cfg cfg = {
	    .self = f->coord,
	    .run = *run,
	    .proto_version = PROTO,
	    .lookup = fb_allowlist_lookup_cb,
	    .lookup_arg = (void *)(uintptr_t)&f->allow,
	    .cookie_key = f->cookie_key,
	    .now_ms = NOW_MS + 100,
	    .cookie_ms = COOKIE_MS,
	};
	return cfg;
}

/* pair runs a full handshake of `w` with the coordinator. */
static void
pair(const fixture *f, const fb_identity *w, const fb_run_id *run,
    fb_session **ws, fb_session **cs)
{
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, run);
	fb_reject why;

	assert_int_equal(
	    fb_handshake_start(w, &f->coord_pk, PROTO, f->cookie, hello, &hs),
	    FB_OK);
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, cs, &why),
	    FB_OK);
	assert_int_equal(why, FB_REJECT_NONE);
	assert_int_equal(
	    fb_handshake_finish(hs, reply, sizeof(reply), ws, &why), FB_OK);
	fb_handshake_free(hs);
}

static void
hex(const char *s, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		assert_int_equal(sscanf(s + 2 * i, "%2x", &v), 1);
		out[i] = (uint8_t)v;
	}
}

static char *
read_text(const char *path)
{
	static char buf[8192];
	FILE *f = fopen(path, "r");
	size_t n;

	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* ---- known answers ------------------------------------------------------- */

static void
test_kat_ed25519(void **state)
{
	/* RFC 8032 section 7.1, TEST 1 (empty message). */
	uint8_t seed[32], pk[32], sig[64], want[64];
	fb_identity *id = NULL;
	fb_pubkey got;

	hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
	    seed, 32);
	hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
	    pk, 32);
	hex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
	    "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
	    want, 64);
	assert_int_equal(fb_identity_alloc_from_seed(seed, NULL, &id), FB_OK);
	fb_identity_pubkey(id, &got);
	assert_memory_equal(got.b, pk, 32);
	fb_identity_sign_raw(id, (const uint8_t *)"", 0, sig);
	assert_memory_equal(sig, want, 64);
	fb_identity_free(id);
}

/* ---- the bulk passes (bulk.c) ------------------------------------------ */

/* libcrypto in use, unless the environment asked for libsodium. */
static void
expect_libcrypto(void)
{
	const char *e = getenv("FEDBOX_CIPHER");

	if (e == NULL || strcmp(e, "libsodium") != 0) {
		assert_string_equal(fb_crypto_ciphers(), "libcrypto");
	}
}

static void
test_chacha_is_libsodium(void **state)
{
	/* around FB_CHACHA_MIN, block edges, a multi-MiB chunk */
	static const size_t sizes[] = {0, 1, 63, 64, 65, 4095, 4096, 4097,
	    65536 + 17, (4u << 20) + 5};
	static const uint32_t ics[] = {0, 1, 12345, 0xffffff00u, 0xfffffffeu};
	size_t max = (4u << 20) + 5;
	uint8_t *m = fb_alloc(max), *c1 = fb_alloc(max), *c2 = fb_alloc(max);
	uint8_t *back = fb_alloc(max);
	uint8_t k[32], npub[24], n12[12], ad[45], t1[16], t2[16];

	assert_non_null(m);
	assert_non_null(c1);
	assert_non_null(c2);
	assert_non_null(back);
	expect_libcrypto();
	randombytes_buf(m, max);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		for (size_t adl = 0; adl <= sizeof(ad); adl += sizeof(ad)) {
			randombytes_buf(k, sizeof(k));
			randombytes_buf(npub, sizeof(npub));
			randombytes_buf(ad, sizeof(ad));
			crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c1,
			    t1, NULL, m, n, ad, adl, NULL, npub, k);
			/* apart, then in place, both ways */
			for (int in_place = 0; in_place < 2; in_place++) {
				const uint8_t *src = m;
				uint8_t *dst = back;
				if (in_place) {
					memcpy(c2, m, n);
					src = dst = c2;
				}
				fb_xchacha_seal(c2, t2, src, n, ad, adl, npub, k);
				assert_memory_equal(c1, c2, n);
				assert_memory_equal(t1, t2, 16);
				assert_int_equal(fb_xchacha_open(dst, c2, n, t2,
				                     ad, adl, npub, k),
				    0);
				assert_memory_equal(dst, m, n);
			}
		}
		{
			uint8_t h1[32], h2[32];
			crypto_hash_sha256_state st;
			size_t cut = n / 3;
			crypto_hash_sha256_init(&st);
			crypto_hash_sha256_update(&st, m, n);
			crypto_hash_sha256_final(&st, h1);
			fb_sha256_2(h2, m, cut, m + cut, n - cut);
			assert_memory_equal(h1, h2, 32);
		}
		{
			/* Poly1305 in three steps, the length hint right and
			 * wrong (it picks the library, not the tag) */
			uint8_t t3[16], pk[32];
			crypto_onetimeauth_poly1305_state st;
			fb_poly p;
			size_t cut = n / 3, cut2 = n - n / 5;
			randombytes_buf(pk, sizeof(pk));
			crypto_onetimeauth_poly1305_init(&st, pk);
			crypto_onetimeauth_poly1305_update(&st, m, cut);
			crypto_onetimeauth_poly1305_update(&st, m + cut, cut2 - cut);
			crypto_onetimeauth_poly1305_update(&st, m + cut2, n - cut2);
			crypto_onetimeauth_poly1305_final(&st, t1);
			for (size_t hint = 0; hint < 2; hint++) {
				fb_poly_init(&p, pk, hint ? n : FB_CHACHA_MIN);
				fb_poly_update(&p, m, cut);
				fb_poly_update(&p, m + cut, cut2 - cut);
				fb_poly_update(&p, m + cut2, n - cut2);
				fb_poly_final(&p, t3);
				assert_memory_equal(t1, t3, 16);
			}
		}
		for (size_t j = 0; j < sizeof(ics) / sizeof(ics[0]); j++) {
			/* up to the counter's last block (past it,
			 * libsodium aborts, and so does fb_chacha20_xor_ic,
			 * through it) */
			if ((n + 63) / 64 > (1ull << 32) - ics[j]) {
				continue;
			}
			randombytes_buf(k, sizeof(k));
			randombytes_buf(n12, sizeof(n12));
			crypto_stream_chacha20_ietf_xor_ic(c1, m, n, n12,
			    ics[j], k);
			fb_chacha20_xor_ic(c2, m, n, n12, ics[j], k);
			assert_memory_equal(c1, c2, n);
		}
	}
	fb_free(m);
	fb_free(c1);
	fb_free(c2);
	fb_free(back);
}

static void
test_chacha_open_refuses_and_wipes(void **state)
{
	size_t sizes[] = {100, 8192 + 3};
	uint8_t k[32], npub[24], ad[20], tag[16];
	uint8_t *m = fb_alloc(8192 + 3), *c = fb_alloc(8192 + 3);
	uint8_t *out = fb_alloc(8192 + 3);

	assert_non_null(m);
	assert_non_null(c);
	assert_non_null(out);
	expect_libcrypto();
	randombytes_buf(k, sizeof(k));
	randombytes_buf(npub, sizeof(npub));
	randombytes_buf(ad, sizeof(ad));
	for (size_t i = 0; i < 2; i++) {
		size_t n = sizes[i];
		randombytes_buf(m, n);
		fb_xchacha_seal(c, tag, m, n, ad, sizeof(ad), npub, k);
		/* a bit of the ciphertext, of the tag, of the AD, of the
		 * nonce, of the key */
		for (int what = 0; what < 5; what++) {
			uint8_t *p = what == 0 ? c + n / 2
			           : what == 1 ? tag + 7
			           : what == 2 ? ad + 3
			           : what == 3 ? npub + 20
			                       : k + 31;
			*p ^= 0x10;
			memset(out, 0xa5, n);
			assert_int_equal(fb_xchacha_open(out, c, n, tag, ad,
			                     sizeof(ad), npub, k),
			    -1);
			for (size_t b = 0; b < n; b++) {
				assert_true(out[b] == 0 || out[b] == 0xa5);
			}
			*p ^= 0x10;
		}
		assert_int_equal(
		    fb_xchacha_open(out, c, n, tag, ad, sizeof(ad), npub, k), 0);
		assert_memory_equal(out, m, n);
	}
	fb_free(m);
	fb_free(c);
	fb_free(out);
}

/* ---- memory for short-lived secrets (secmem.c) -------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define SECMEM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SECMEM_ASAN 1
#endif
#endif

static void
test_secmem_blocks(void **state)
{
	static const size_t sizes[] = {1, 63, 64, 100, 4000, 16384,
	    FB_SECMEM_MAX, FB_SECMEM_MAX + 1, 1u << 20};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	uint8_t *p[N], *again;

	/* every size: 64-byte aligned, all of it writable, none overlapping */
	for (size_t i = 0; i < N; i++) {
		p[i] = fb_secmem_alloc(sizes[i]);
		assert_non_null(p[i]);
		assert_int_equal((uintptr_t)p[i] % 64, 0);
		memset(p[i], (int)(0x11 * (i + 1)), sizes[i]);
	}
	for (size_t i = 0; i < N; i++) {
		for (size_t j = 0; j < sizes[i]; j++) {
			assert_int_equal(p[i][j], (uint8_t)(0x11 * (i + 1)));
		}
	}
	for (size_t i = 0; i < N; i++) {
		fb_secmem_free(p[i]);
	}
	fb_secmem_free(NULL);
#ifndef SECMEM_ASAN
	/* a freed block comes back wiped (arenas: the same block, its last
	 * contents gone) */
	p[0] = fb_secmem_alloc(4000);
	memset(p[0], 0x5a, 4000);
	fb_secmem_free(p[0]);
	again = fb_secmem_alloc(4000);
	assert_ptr_equal(again, p[0]);
	assert_true(sodium_is_zero(again, 4000));
	fb_secmem_free(again);
#else
	(void)again;
#endif
}

typedef struct secmem_arg {
	unsigned seed;
	int bad;
} secmem_arg;

static void *
secmem_thread(void *arg)
{
	secmem_arg *a = arg;
	uint8_t *held[16] = {0};
	size_t len[16] = {0};

	for (int i = 0; i < 20000; i++) {
		unsigned r = a->seed = a->seed * 1103515245u + 12345u;
		unsigned k = (r >> 8) % 16;
		if (held[k] != NULL) {
			for (size_t j = 0; j < len[k]; j++) {
				a->bad |= held[k][j] != (uint8_t)k;
			}
			fb_secmem_free(held[k]);
			held[k] = NULL;
		} else {
			len[k] = 1 + (r >> 12) % 3000;
			held[k] = fb_secmem_alloc(len[k]);
			if (held[k] == NULL) {
				a->bad = 1;
				break;
			}
			memset(held[k], (int)k, len[k]);
		}
	}
	for (int k = 0; k < 16; k++) {
		fb_secmem_free(held[k]);
	}
	return NULL;
}

static void
test_secmem_threads(void **state)
{
	pthread_t t[4];
	secmem_arg a[4];

	for (int i = 0; i < 4; i++) {
		a[i] = (secmem_arg){.seed = (unsigned)i + 1};
		assert_int_equal(pthread_create(&t[i], NULL, secmem_thread, &a[i]),
		    0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(a[i].bad, 0);
	}
}

static void
test_kat_blake2b(void **state)
{
	/* RFC 7693 appendix A: BLAKE2b-512("abc"). */
	uint8_t want[64], got[64];

	hex("ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
	    "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923",
	    want, 64);
	assert_int_equal(fb_crypto_init(), FB_OK);
	crypto_generichash(got, 64, (const uint8_t *)"abc", 3, NULL, 0);
	assert_memory_equal(got, want, 64);
}

/* ---- identities and key files -------------------------------------------- */

static void
test_identity_save_load(void **state)
{
	const fixture *f = fx();
	char name[600], path[700];
	fb_identity *id = NULL;
	fb_pubkey pk, pk2;
	char comment[FB_COMMENT_MAX];
	struct stat st;

	snprintf(name, sizeof(name), "%s/id1", fb_test_tmpdir());
	assert_int_equal(fb_identity_save(f->w1, name, 0), FB_OK);
	snprintf(path, sizeof(path), "%s.key", name);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(fb_identity_load(path, &id), FB_OK);
	fb_identity_pubkey(id, &pk);
	assert_true(fb_pubkey_equal(&pk, &f->allowed[1]));
	assert_string_equal(fb_identity_comment(id), "w1");
	fb_identity_free(id);

	snprintf(path, sizeof(path), "%s.pub", name);
	assert_int_equal(
	    fb_pubkey_load(path, &pk2, comment, sizeof(comment)), FB_OK);
	assert_true(fb_pubkey_equal(&pk2, &f->allowed[1]));
	assert_string_equal(comment, "w1");
}

static void
test_identity_no_overwrite(void **state)
{
	const fixture *f = fx();
	char name[600], path[700];
	fb_identity *id = NULL;
	fb_pubkey pk;

	snprintf(name, sizeof(name), "%s/id2", fb_test_tmpdir());
	assert_int_equal(fb_identity_save(f->w0, name, 0), FB_OK);
	assert_int_equal(fb_identity_save(f->w1, name, 0), FB_EIO);
	snprintf(path, sizeof(path), "%s.key", name);
	assert_int_equal(fb_identity_load(path, &id), FB_OK);
	fb_identity_pubkey(id, &pk);
	assert_true(fb_pubkey_equal(&pk, &f->allowed[0]));
	fb_identity_free(id);
	assert_int_equal(fb_identity_save(f->w1, name, 1), FB_OK);
	assert_int_equal(fb_identity_load(path, &id), FB_OK);
	fb_identity_pubkey(id, &pk);
	assert_true(fb_pubkey_equal(&pk, &f->allowed[1]));
	fb_identity_free(id);
}

static void
test_key_mode_refused(void **state)
{
	const fixture *f = fx();
	char name[600], path[700], log[700];
	fb_identity *id = NULL;
	int saved, fd;
	fb_err rc;

	snprintf(name, sizeof(name), "%s/id3", fb_test_tmpdir());
	snprintf(path, sizeof(path), "%s.key", name);
	snprintf(log, sizeof(log), "%s/id3.log", fb_test_tmpdir());
	assert_int_equal(fb_identity_save(f->w0, name, 0), FB_OK);
	assert_int_equal(chmod(path, 0644), 0);

	fflush(stderr);
	saved = dup(2);
	fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(saved >= 0 && fd >= 0);
	dup2(fd, 2);
	rc = fb_identity_load(path, &id);
	dup2(saved, 2);
	close(saved);
	close(fd);

	assert_int_equal(rc, FB_EINVAL);
	assert_null(id);
	assert_non_null(strstr(read_text(log), "chmod 600"));
	assert_non_null(strstr(read_text(log), path));

	assert_int_equal(chmod(path, 0640), 0);
	assert_int_equal(fb_identity_load(path, &id), FB_EINVAL);
	assert_int_equal(chmod(path, 0600), 0);
	assert_int_equal(fb_identity_load(path, &id), FB_OK);
	fb_identity_free(id);
}

static void
test_key_corrupt_refused(void **state)
{
	char path[700];
	fb_identity *id = NULL;
	const char *bad[] = {
	    "",
	    "fedbox-ed25519-secret v1\n",
	    "fedbox-ed25519-secret v2\nAAAA\n",
	    /* seed does not match the public line */
	    "fedbox-ed25519-secret v1\n"
	    "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"
	    "fedbox-ed25519 "
	    "g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=\n",
	};

	snprintf(path, sizeof(path), "%s/bad.key", fb_test_tmpdir());
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		assert_true(fd >= 0);
		assert_int_equal(
		    write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		close(fd);
		assert_int_equal(fb_identity_load(path, &id), FB_EFORMAT);
		assert_null(id);
	}
	assert_int_equal(fb_identity_load("/nonexistent/x.key", &id), FB_EIO);
}

static void
test_publine_roundtrip(void **state)
{
	const fixture *f = fx();
	char line[FB_PUBLINE_MAX], comment[FB_COMMENT_MAX], fp[40];
	fb_pubkey pk;

	assert_int_equal(
	    fb_pubkey_format(&f->coord_pk, "lab server #1", line, sizeof(line)),
	    FB_OK);
	assert_int_equal(strncmp(line, "fedbox-ed25519 ", 15), 0);
	assert_int_equal(
	    fb_pubkey_parse(line, &pk, comment, sizeof(comment)), FB_OK);
	assert_true(fb_pubkey_equal(&pk, &f->coord_pk));
	assert_string_equal(comment, "lab server #1");
	strcat(line, "\r\n");
	assert_int_equal(fb_pubkey_parse(line, &pk, NULL, 0), FB_OK);

	assert_int_equal(
	    fb_pubkey_format(&f->coord_pk, NULL, line, sizeof(line)), FB_OK);
	assert_int_equal(
	    fb_pubkey_parse(line, &pk, comment, sizeof(comment)), FB_OK);
	assert_string_equal(comment, "");
	assert_int_equal(
	    fb_pubkey_format(&f->coord_pk, NULL, line, 20), FB_ERANGE);
	assert_int_equal(
	    fb_pubkey_format(&f->coord_pk, "a\nb", line, sizeof(line)),
	    FB_EINVAL);

	fb_pubkey_fingerprint(&f->coord_pk, fp);
	assert_int_equal(strlen(fp), FB_FINGERPRINT_SIZE - 1);
	assert_int_equal(strncmp(fp, "fb:", 3), 0);
}

static void
test_publine_errors(void **state)
{
	const char *good = "g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=";
	char line[512];
	fb_pubkey pk;
	const char *bad[] = {
	    "",
	    "fedbox-ed25519",
	    "fedbox-ed25519 ",
	    "ssh-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=",
	    "fedbox-ed25519  g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSM=",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSM*=",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=x",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=\tc",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs= a\tb",
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMs=\n\n",
	    /* all-zero key: small order, not a usable identity */
	    "fedbox-ed25519 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
	    /* 33 bytes */
	    "fedbox-ed25519 g62hDdZ23aziWtrJ7NArTwE85W5UYpPUzIWLItjqSMsA",
	};

	snprintf(line, sizeof(line), "fedbox-ed25519 %s", good);
	assert_int_equal(fb_pubkey_parse(line, &pk, NULL, 0), FB_OK);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(
		    fb_pubkey_parse(bad[i], &pk, NULL, 0), FB_EINVAL);
	}
	/* A comment longer than FB_COMMENT_MAX - 1. */
	snprintf(line, sizeof(line), "fedbox-ed25519 %s ", good);
	memset(line + strlen(line), 'c', FB_COMMENT_MAX);
	line[15 + 44 + 1 + FB_COMMENT_MAX] = '\0';
	assert_int_equal(fb_pubkey_parse(line, &pk, NULL, 0), FB_EINVAL);
}

static void
test_domain_signatures(void **state)
{
	const fixture *f = fx();
	uint8_t sig[FB_SIG_LEN];
	const uint8_t msg[] = "mask seeds";

	assert_int_equal(
	    fb_identity_sign(f->w0, "secagg", msg, sizeof(msg), sig), FB_OK);
	assert_int_equal(
	    fb_pubkey_verify(&f->allowed[0], "secagg", msg, sizeof(msg), sig),
	    FB_OK);
	assert_int_equal(
	    fb_pubkey_verify(&f->allowed[0], "secagh", msg, sizeof(msg), sig),
	    FB_EAUTH);
	assert_int_equal(
	    fb_pubkey_verify(&f->allowed[1], "secagg", msg, sizeof(msg), sig),
	    FB_EAUTH);
	sig[5] ^= 1;
	assert_int_equal(
	    fb_pubkey_verify(&f->allowed[0], "secagg", msg, sizeof(msg), sig),
	    FB_EAUTH);
}

/* ---- handshake ----------------------------------------------------------- */

static void
test_handshake_roundtrip(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL;
	fb_run_id r1, r2;
	fb_pubkey p;
	uint8_t t1[32], t2[32];

	pair(f, f->w1, &f->run, &ws, &cs);
	assert_int_equal(fb_session_worker_id(ws), 1);
	assert_int_equal(fb_session_worker_id(cs), 1);
	fb_session_run_id(ws, &r1);
	fb_session_run_id(cs, &r2);
	assert_memory_equal(r1.b, f->run.b, FB_RUN_ID_LEN);
	assert_memory_equal(r2.b, f->run.b, FB_RUN_ID_LEN);
	fb_session_peer(ws, &p);
	assert_true(fb_pubkey_equal(&p, &f->coord_pk));
	fb_session_peer(cs, &p);
	assert_true(fb_pubkey_equal(&p, &f->allowed[1]));
	fb_session_transcript(ws, t1);
	fb_session_transcript(cs, t2);
	assert_memory_equal(t1, t2, 32);
	assert_memory_equal(ws->tx, cs->rx, 32);
	assert_memory_equal(ws->rx, cs->tx, 32);
	assert_memory_not_equal(ws->tx, ws->rx, 32);
	fb_session_free(ws);
	fb_session_free(cs);
}

static void
test_handshake_unknown_key(void **state)
{
	const fixture *f = fx();
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	fb_session *cs = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, &f->run);
	fb_reject why;

	assert_int_equal(fb_handshake_start(f->outsider, &f->coord_pk, PROTO,
	                     f->cookie, hello, &hs),
	    FB_OK);
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_UNKNOWN_KEY);
	assert_null(cs);
	fb_handshake_free(hs);
}

static void
test_handshake_forged_hello(void **state)
{
	const fixture *f = fx();
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	fb_session *cs = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, &f->run);
	fb_reject why;
	uint8_t msg[FB_DOMAIN_LEN + 100];

	/* The outsider claims worker 0's key and signs with its own. */
	assert_int_equal(fb_handshake_start(f->outsider, &f->coord_pk, PROTO,
	                     f->cookie, hello, &hs),
	    FB_OK);
	memcpy(hello + 4, f->allowed[0].b, 32);
	memcpy(msg, fb_dom_hello, FB_DOMAIN_LEN);
	memcpy(msg + FB_DOMAIN_LEN, hello, 100);
	fb_identity_sign_raw(f->outsider, msg, sizeof(msg), hello + 100);
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_SIGNATURE);
	assert_null(cs);
	fb_handshake_free(hs);
}

static void
test_handshake_hello_bitflips(void **state)
{
	const fixture *f = fx();
	uint8_t hello[FB_HS_HELLO_LEN], bad[FB_HS_HELLO_LEN];
	uint8_t reply[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	fb_session *cs = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, &f->run);
	fb_reject why;

	assert_int_equal(fb_handshake_start(
	                     f->w0, &f->coord_pk, PROTO, f->cookie, hello, &hs),
	    FB_OK);
	for (size_t bit = 0; bit < 8 * sizeof(hello); bit++) {
		memcpy(bad, hello, sizeof(bad));
		bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_not_equal(fb_handshake_accept(&cfg, bad, sizeof(bad),
		                         reply, &cs, &why),
		    FB_OK);
		assert_int_not_equal(why, FB_REJECT_NONE);
		assert_null(cs);
	}
	for (size_t len = 0; len < sizeof(hello); len += 7) {
		assert_int_equal(
		    fb_handshake_accept(&cfg, hello, len, reply, &cs, &why),
		    FB_EPROTO);
		assert_int_equal(why, FB_REJECT_MALFORMED);
	}
	cfg.proto_version = PROTO + 1;
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_ENOTSUP);
	assert_int_equal(why, FB_REJECT_VERSION);
	fb_handshake_free(hs);
}

/*
 * The hello's freshness: a cookie made under another key (the coordinator
 * before a restart) or one past its life is refused after the signature
 * checks out (REPLAY, FB_ESTALE), a cookie from the future too; without
 * a cookie key the coordinator side refuses to run at all.
 */
static void
test_handshake_cookie_freshness(void **state)
{
	const fixture *f = fx();
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	uint8_t other[FB_HS_COOKIE_KEY_LEN], cookie[FB_HS_COOKIE_LEN];
	fb_handshake *hs = NULL;
	fb_session *cs = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, &f->run);
	fb_reject why;

	/* the cookie itself */
	assert_int_equal(
	    fb_hs_cookie_check(f->cookie_key, f->cookie, NOW_MS, COOKIE_MS),
	    FB_OK);
	assert_int_equal(fb_hs_cookie_check(f->cookie_key, f->cookie,
	                     NOW_MS + COOKIE_MS + 1, COOKIE_MS),
	    FB_ESTALE);
	assert_int_equal(
	    fb_hs_cookie_check(f->cookie_key, f->cookie, NOW_MS - 1, COOKIE_MS),
	    FB_ESTALE);
	memcpy(cookie, f->cookie, sizeof(cookie));
	for (size_t i = 0; i < sizeof(cookie); i++) {
		cookie[i] ^= 0x40;
		assert_int_not_equal(fb_hs_cookie_check(f->cookie_key, cookie,
		                         NOW_MS, COOKIE_MS),
		    FB_OK);
		cookie[i] ^= 0x40;
	}
	/* a hello recorded before a restart: another process's key */
	memcpy(other, f->cookie_key, sizeof(other));
	other[0] ^= 1;
	fb_hs_cookie_make(other, NOW_MS, cookie);
	assert_int_equal(
	    fb_hs_cookie_check(f->cookie_key, cookie, NOW_MS, COOKIE_MS),
	    FB_EAUTH);
	assert_int_equal(
	    fb_handshake_start(f->w0, &f->coord_pk, PROTO, cookie, hello, &hs),
	    FB_OK);
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_ESTALE);
	assert_int_equal(why, FB_REJECT_REPLAY);
	assert_null(cs);
	fb_handshake_free(hs);
	/* one of this process, past its life */
	assert_int_equal(fb_handshake_start(
	                     f->w0, &f->coord_pk, PROTO, f->cookie, hello, &hs),
	    FB_OK);
	cfg.now_ms = NOW_MS + COOKIE_MS + 1;
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_ESTALE);
	assert_int_equal(why, FB_REJECT_REPLAY);
	/* within it, the same hello is taken */
	cfg.now_ms = NOW_MS + COOKIE_MS;
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_OK);
	fb_session_free(cs);
	cs = NULL;
	cfg.cookie_key = NULL;
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_EINVAL);
	fb_handshake_free(hs);
}

static void
test_handshake_unpinned(void **state)
{
	const fixture *f = fx();
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	fb_session *cs = NULL, *ws = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, &f->run);
	fb_reject why;

	/* A coordinator with another key answers the worker. */
	cfg.self = f->outsider;
	assert_int_equal(fb_handshake_start(
	                     f->w0, &f->coord_pk, PROTO, f->cookie, hello, &hs),
	    FB_OK);
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_OK);
	assert_int_equal(
	    fb_handshake_finish(hs, reply, sizeof(reply), &ws, &why), FB_EAUTH);
	assert_int_equal(why, FB_REJECT_UNPINNED_KEY);
	assert_null(ws);
	/* ... and claims the pinned key: the signature gives it away. */
	memcpy(reply + 24, f->coord_pk.b, 32);
	assert_int_equal(
	    fb_handshake_finish(hs, reply, sizeof(reply), &ws, &why), FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_SIGNATURE);
	fb_session_free(cs);
	fb_handshake_free(hs);
}

static void
test_handshake_reply_bitflips(void **state)
{
	const fixture *f = fx();
	uint8_t hello[FB_HS_HELLO_LEN], reply[FB_HS_REPLY_LEN];
	uint8_t bad[FB_HS_REPLY_LEN];
	fb_handshake *hs = NULL;
	fb_session *cs = NULL, *ws = NULL;
	fb_hs_accept_cfg cfg = accept_cfg(f, &f->run);
	fb_reject why;

	assert_int_equal(fb_handshake_start(
	                     f->w0, &f->coord_pk, PROTO, f->cookie, hello, &hs),
	    FB_OK);
	assert_int_equal(
	    fb_handshake_accept(&cfg, hello, sizeof(hello), reply, &cs, &why),
	    FB_OK);
	for (size_t bit = 0; bit < 8 * sizeof(reply); bit++) {
		memcpy(bad, reply, sizeof(bad));
		bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_not_equal(
		    fb_handshake_finish(hs, bad, sizeof(bad), &ws, &why),
		    FB_OK);
		assert_int_not_equal(why, FB_REJECT_NONE);
		assert_null(ws);
	}
	assert_int_equal(
	    fb_handshake_finish(hs, reply, 10, &ws, &why), FB_EPROTO);
	/* The genuine reply still completes after the forgeries. */
	assert_int_equal(
	    fb_handshake_finish(hs, reply, sizeof(reply), &ws, &why), FB_OK);
	assert_memory_equal(ws->tx, cs->rx, 32);
	fb_session_free(cs);
	fb_session_free(ws);
	fb_handshake_free(hs);
}

/* ---- sealed messages ----------------------------------------------------- */

static void
test_msg_roundtrip(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL;
	uint8_t buf[256], body[256];
	size_t n, blen;
	fb_msg_info info;
	fb_reject why;
	const char *text = "join round 3";

	pair(f, f->w1, &f->run, &ws, &cs);
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(fb_msg_seal(ws, 5, 3, (const uint8_t *)text,
		                     strlen(text), buf, sizeof(buf), &n),
		    FB_OK);
		assert_int_equal(n, strlen(text) + FB_MSG_OVERHEAD);
		assert_int_equal(fb_msg_peek(buf, n, &info), FB_OK);
		assert_int_equal(info.sender, 1);
		assert_int_equal(fb_msg_open(cs, 3, buf, n, body, sizeof(body),
		                     &blen, &info, &why),
		    FB_OK);
		assert_int_equal(why, FB_REJECT_NONE);
		assert_int_equal(blen, strlen(text));
		assert_memory_equal(body, text, blen);
		assert_int_equal(info.type, 5);
		assert_int_equal(info.round, 3);
		assert_int_equal(info.sender, 1);
		assert_int_equal(info.seq, i + 1);
	}
	/* The other direction, empty body, any round. */
	assert_int_equal(
	    fb_msg_seal(cs, 9, 4, NULL, 0, buf, sizeof(buf), &n), FB_OK);
	assert_int_equal(fb_msg_open(ws, FB_ROUND_ANY, buf, n, body,
	                     sizeof(body), &blen, &info, &why),
	    FB_OK);
	assert_int_equal(blen, 0);
	assert_int_equal(info.sender, FB_SENDER_COORDINATOR);
	/* Seal into a buffer that is too small. */
	assert_int_equal(
	    fb_msg_seal(ws, 5, 3, body, 200, buf, 200 + 55, &n), FB_ERANGE);
	fb_session_free(ws);
	fb_session_free(cs);
}

static void
test_msg_in_place(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL;
	uint8_t buf[4096 + FB_MSG_OVERHEAD], plain[4096];
	size_t n, blen;
	fb_msg_info info;

	pair(f, f->w0, &f->run, &ws, &cs);
	for (size_t i = 0; i < 4096; i++) {
		plain[i] = (uint8_t)(i * 7);
	}
	memcpy(buf + FB_MSG_HEADER_LEN, plain, sizeof(plain));
	assert_int_equal(fb_msg_seal(ws, 1, 0, buf + FB_MSG_HEADER_LEN, 4096,
	                     buf, sizeof(buf), &n),
	    FB_OK);
	/* encrypted in place: the body is no longer the plaintext (one byte
	 * of a random key stream equals it 1 time in 256, so the whole of
	 * it is compared) */
	assert_memory_not_equal(buf + FB_MSG_HEADER_LEN, plain, sizeof(plain));
	assert_int_equal(fb_msg_open(cs, 0, buf, n, buf + FB_MSG_HEADER_LEN,
	                     4096, &blen, &info, NULL),
	    FB_OK);
	for (size_t i = 0; i < 4096; i++) {
		assert_int_equal(buf[FB_MSG_HEADER_LEN + i], (uint8_t)(i * 7));
	}
	fb_session_free(ws);
	fb_session_free(cs);
}

static void
test_msg_bitflips(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL;
	uint8_t buf[128], bad[128], body[128];
	size_t n, blen;
	fb_msg_info info;
	fb_reject why;

	pair(f, f->w0, &f->run, &ws, &cs);
	assert_int_equal(fb_msg_seal(ws, 2, 1, (const uint8_t *)"update ready",
	                     12, buf, sizeof(buf), &n),
	    FB_OK);
	for (size_t bit = 0; bit < 8 * n; bit++) {
		memcpy(bad, buf, n);
		bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		memset(body, 0xaa, sizeof(body));
		assert_int_not_equal(fb_msg_open(cs, 1, bad, n, body,
		                         sizeof(body), &blen, &info, &why),
		    FB_OK);
		assert_int_not_equal(why, FB_REJECT_NONE);
		assert_int_equal(blen, 0);
		/* Header bits other than run/sender fail as a bad MAC. */
		if (bit / 8 >= FB_MSG_HEADER_LEN ||
		    (bit / 8 >= 20 && bit / 8 < 24) ||
		    (bit / 8 >= 28 && bit / 8 < 36) || bit / 8 == 1) {
			assert_int_equal(why, FB_REJECT_BAD_MAC);
		}
	}
	/* The untouched message is still accepted afterwards. */
	assert_int_equal(
	    fb_msg_open(cs, 1, buf, n, body, sizeof(body), &blen, &info, &why),
	    FB_OK);
	/* Short, long and inconsistent lengths are malformed. */
	assert_int_equal(fb_msg_open(cs, 1, buf, FB_MSG_OVERHEAD - 1, body,
	                     sizeof(body), &blen, &info, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_MALFORMED);
	assert_int_equal(fb_msg_open(cs, 1, buf, n - 1, body, sizeof(body),
	                     &blen, &info, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_MALFORMED);
	assert_int_equal(
	    fb_msg_open(cs, 1, buf, n, body, 4, &blen, &info, &why), FB_EPROTO);
	assert_int_equal(why, FB_REJECT_TOO_LARGE);
	fb_session_free(ws);
	fb_session_free(cs);
}

static void
test_msg_replay(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL;
	uint8_t m1[64], m2[64], body[64];
	size_t n1, n2, blen;
	fb_msg_info info;
	fb_reject why;

	pair(f, f->w0, &f->run, &ws, &cs);
	assert_int_equal(
	    fb_msg_seal(ws, 1, 1, (const uint8_t *)"a", 1, m1, sizeof(m1), &n1),
	    FB_OK);
	assert_int_equal(
	    fb_msg_seal(ws, 1, 1, (const uint8_t *)"b", 1, m2, sizeof(m2), &n2),
	    FB_OK);
	/* Reordered: m2 first, then m1 is older than what was seen. */
	assert_int_equal(
	    fb_msg_open(cs, 1, m2, n2, body, sizeof(body), &blen, &info, &why),
	    FB_OK);
	assert_int_equal(
	    fb_msg_open(cs, 1, m1, n1, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_REPLAY);
	assert_int_equal(blen, 0);
	/* Replayed later, in the same round and in a later one. */
	assert_int_equal(
	    fb_msg_open(cs, 1, m2, n2, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_REPLAY);
	assert_int_equal(
	    fb_msg_open(cs, 2, m2, n2, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_REPLAY);
	fb_session_free(ws);
	fb_session_free(cs);
}

static void
test_msg_wrong_round(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL;
	uint8_t m[64], body[64];
	size_t n, blen;
	fb_msg_info info;
	fb_reject why;

	pair(f, f->w0, &f->run, &ws, &cs);
	assert_int_equal(
	    fb_msg_seal(ws, 1, 3, (const uint8_t *)"late", 4, m, sizeof(m), &n),
	    FB_OK);
	memset(body, 0x55, sizeof(body));
	assert_int_equal(
	    fb_msg_open(cs, 4, m, n, body, sizeof(body), &blen, &info, &why),
	    FB_ESTALE);
	assert_int_equal(why, FB_REJECT_WRONG_ROUND);
	assert_int_equal(blen, 0);
	assert_int_equal(body[0], 0); /* plaintext wiped */
	fb_session_free(ws);
	fb_session_free(cs);
}

static void
test_msg_wrong_run(void **state)
{
	const fixture *f = fx();
	fb_session *ws = NULL, *cs = NULL, *ws2 = NULL, *cs2 = NULL;
	fb_run_id other;
	uint8_t m[64], body[64];
	size_t n, blen;
	fb_msg_info info;
	fb_reject why;

	/* A message from this worker's session in an earlier run. */
	assert_int_equal(fb_run_id_random(&other), FB_OK);
	pair(f, f->w0, &other, &ws, &cs);
	pair(f, f->w0, &f->run, &ws2, &cs2);
	assert_int_equal(
	    fb_msg_seal(ws, 1, 1, (const uint8_t *)"x", 1, m, sizeof(m), &n),
	    FB_OK);
	assert_int_equal(
	    fb_msg_open(cs2, 1, m, n, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_WRONG_RUN);
	/* Same run id but another session's key: bad MAC. */
	memcpy(m + 4, f->run.b, FB_RUN_ID_LEN);
	assert_int_equal(
	    fb_msg_open(cs2, 1, m, n, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	fb_session_free(ws);
	fb_session_free(cs);
	fb_session_free(ws2);
	fb_session_free(cs2);
}

static void
test_msg_wrong_sender(void **state)
{
	const fixture *f = fx();
	fb_session *w0 = NULL, *c0 = NULL, *w1 = NULL, *c1 = NULL;
	uint8_t m[64], body[64];
	size_t n, blen;
	fb_msg_info info;
	fb_reject why;

	pair(f, f->w0, &f->run, &w0, &c0);
	pair(f, f->w1, &f->run, &w1, &c1);
	/* Worker 1's message delivered as if worker 0 sent it. */
	assert_int_equal(
	    fb_msg_seal(w1, 1, 1, (const uint8_t *)"x", 1, m, sizeof(m), &n),
	    FB_OK);
	assert_int_equal(
	    fb_msg_open(c0, 1, m, n, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_WRONG_SENDER);
	/* Worker 1 rewrites its header to claim worker 0: bad MAC. */
	le32_store(m + 24, 0);
	assert_int_equal(
	    fb_msg_open(c0, 1, m, n, body, sizeof(body), &blen, &info, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	/* A worker cannot speak as the coordinator to another worker. */
	assert_int_equal(
	    fb_msg_seal(w1, 1, 1, (const uint8_t *)"x", 1, m, sizeof(m), &n),
	    FB_OK);
	assert_int_not_equal(
	    fb_msg_open(w0, 1, m, n, body, sizeof(body), &blen, &info, &why),
	    FB_OK);
	fb_session_free(w0);
	fb_session_free(c0);
	fb_session_free(w1);
	fb_session_free(c1);
}

/* ---- streams ------------------------------------------------------------- */

#define CH 1000 /* chunk length in these tests */

/* The digest mode push_wire and pull_wire use. */
static fb_stream_digest cur_mode = FB_STREAM_DIGEST_FULL;

typedef struct wire {
	uint8_t key[FB_STREAM_KEY_LEN];
	uint8_t header[FB_STREAM_HEADER_LEN];
	uint8_t chunks[8][CH + FB_STREAM_CHUNK_OVERHEAD];
	size_t chunk_len[8];
	size_t nchunks;
	uint8_t trailer[FB_STREAM_TRAILER_LEN];
	uint8_t plain[8 * CH];
	size_t plain_len;
} wire;

static fb_stream_ctx
ctx_of(const fb_run_id *run, uint32_t round, uint32_t sender)
{
	fb_stream_ctx c = {.run = *run, .round = round, .sender = sender};
	return c;
}

/* push_wire pushes `len` bytes as a stream signed by `signer`. */
static void
push_wire(const fb_stream_ctx *ctx, const fb_identity *signer, size_t len,
    uint8_t seed, wire *w)
{
	fb_stream_push *p = NULL;
	size_t off = 0;

	memset(w, 0, sizeof(*w));
	assert_true(len <= sizeof(w->plain));
	for (size_t i = 0; i < len; i++) {
		w->plain[i] = (uint8_t)(seed + i * 31);
	}
	w->plain_len = len;
	assert_int_equal(
	    fb_stream_push_alloc(ctx, CH, cur_mode, w->key, w->header, &p),
	    FB_OK);
	do {
		size_t k = len - off > CH ? CH : len - off;
		int final = off + k == len;
		assert_int_equal(
		    fb_stream_push_chunk(p, w->plain + off, k, final,
		        w->chunks[w->nchunks], sizeof(w->chunks[0]),
		        &w->chunk_len[w->nchunks]),
		    FB_OK);
		w->nchunks++;
		off += k;
	} while (off < len);
	assert_int_equal(fb_stream_push_chunk(p, w->plain, 1, 1, w->chunks[7],
	                     sizeof(w->chunks[7]), &off),
	    FB_EINVAL);
	assert_int_equal(fb_stream_push_final(p, signer, w->trailer), FB_OK);
	fb_stream_push_free(p);
}

/*
 * pull_wire pulls chunks in the order `order` (indexes into w->chunks,
 * `n` of them) and the trailer; returns the first error and its reason.
 */
static fb_err
pull_wire(const fb_stream_ctx *ctx, const fb_pubkey *signer, const wire *w,
    const size_t *order, size_t n, fb_reject *why)
{
	fb_stream_pull *p = NULL;
	fb_err rc;
	uint8_t buf[CH + FB_STREAM_CHUNK_OVERHEAD];
	size_t off = 0, mlen;
	int final = 0;
	uint64_t total = 0;

	rc = fb_stream_pull_alloc(
	    ctx, cur_mode, w->key, w->header, sizeof(w->header), CH, &p, why);
	if (rc != FB_OK) {
		return rc;
	}
	for (size_t i = 0; i < n; i++) {
		size_t k = order[i];
		/* In place: plaintext lands at buf + 1. */
		memcpy(buf, w->chunks[k], w->chunk_len[k]);
		rc = fb_stream_pull_chunk(p, buf, w->chunk_len[k], buf + 1,
		    sizeof(buf) - 1, &mlen, &final, why);
		if (rc != FB_OK) {
			goto out;
		}
		assert_memory_equal(buf + 1, w->plain + off, mlen);
		off += mlen;
	}
	rc = fb_stream_pull_final(
	    p, signer, w->trailer, sizeof(w->trailer), &total, why);
	if (rc == FB_OK) {
		assert_int_equal(total, w->plain_len);
		assert_int_equal(off, w->plain_len);
	}
out:
	fb_stream_pull_free(p);
	return rc;
}

static const size_t in_order[8] = {0, 1, 2, 3, 4, 5, 6, 7};

/*
 * A FULL stream's chunks sealed one by one, last first (as threads would,
 * in any order), pull like a stream pushed in order; a TAGS stream cannot
 * be sealed that way; a chunk sealed at the wrong index, or with the FINAL
 * flag moved, fails its MAC.
 */
static void
test_stream_chunks_sealed_out_of_order(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w, bad;
	uint8_t hashes[4][FB_STREAM_HASH_LEN];
	fb_stream_push *p = NULL;
	size_t len = 3 * CH + 5, clen = 0;
	fb_reject why;

	memset(&w, 0, sizeof(w));
	for (size_t i = 0; i < len; i++) {
		w.plain[i] = (uint8_t)(7 + i * 13);
	}
	w.plain_len = len;
	w.nchunks = 4;
	assert_int_equal(fb_stream_push_alloc(&ctx, CH, FB_STREAM_DIGEST_FULL,
	                     w.key, w.header, &p),
	    FB_OK);
	for (size_t k = 4; k-- > 0;) {
		size_t n = k == 3 ? 5 : CH;
		assert_int_equal(fb_stream_push_chunk_at(p, k, w.plain + k * CH, n,
		                     k == 3, w.chunks[k], sizeof(w.chunks[k]),
		                     &w.chunk_len[k], hashes[k]),
		    FB_OK);
	}
	/* the trailer cannot be signed before the hashes are in */
	assert_int_equal(fb_stream_push_final(p, f->w1, w.trailer), FB_EINVAL);
	assert_int_equal(fb_stream_push_hashes(p, hashes[0], 4, len, 1), FB_OK);
	assert_int_equal(fb_stream_push_final(p, f->w1, w.trailer), FB_OK);
	/* sealed again once signed (seal on fetch): the same bytes and hash
	 * as the first time, so the signed trailer still holds */
	for (size_t k = 0; k < 4; k++) {
		uint8_t again[FB_STREAM_HASH_LEN];
		size_t n = k == 3 ? 5 : CH;
		memset(bad.chunks[k], 0xa5, sizeof(bad.chunks[k]));
		assert_int_equal(fb_stream_push_chunk_at(p, k, w.plain + k * CH,
		                     n, k == 3, bad.chunks[k],
		                     sizeof(bad.chunks[k]), &clen, again),
		    FB_OK);
		assert_int_equal(clen, w.chunk_len[k]);
		assert_memory_equal(bad.chunks[k], w.chunks[k], clen);
		assert_memory_equal(again, hashes[k], FB_STREAM_HASH_LEN);
	}
	/* another plaintext at the same index seals to other bytes */
	assert_int_equal(fb_stream_push_chunk_at(p, 0, w.plain + CH, CH, 0,
	                     bad.chunks[0], sizeof(bad.chunks[0]), &clen,
	                     hashes[0]),
	    FB_OK);
	assert_true(memcmp(bad.chunks[0], w.chunks[0], clen) != 0);
	fb_stream_push_free(p);
	cur_mode = FB_STREAM_DIGEST_FULL;
	assert_int_equal(pull_wire(&ctx, &f->allowed[1], &w, in_order, 4, &why),
	    FB_OK);
	/* a chunk sealed as index 2 cannot stand at index 1 */
	bad = w;
	memcpy(bad.chunks[1], w.chunks[2], w.chunk_len[2]);
	bad.chunk_len[1] = w.chunk_len[2];
	assert_int_equal(pull_wire(&ctx, &f->allowed[1], &bad, in_order, 4,
	                     &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	bad = w;
	bad.chunks[2][0] = 1; /* FINAL moved to chunk 2 */
	assert_int_equal(pull_wire(&ctx, &f->allowed[1], &bad, in_order, 4,
	                     &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	/* TAGS streams chain their chunks: no sealing out of order */
	assert_int_equal(fb_stream_push_alloc(&ctx, CH, FB_STREAM_DIGEST_TAGS,
	                     w.key, w.header, &p),
	    FB_OK);
	assert_int_equal(fb_stream_push_chunk_at(p, 0, w.plain, 1, 1,
	                     bad.chunks[0], sizeof(bad.chunks[0]), &clen,
	                     hashes[0]),
	    FB_EINVAL);
	assert_int_equal(fb_stream_push_hashes(p, hashes[0], 1, 1, 1),
	    FB_EINVAL);
	fb_stream_push_free(p);
}

/*
 * A FULL stream pushed in order opens chunk by chunk out of order (last
 * first, as threads would) into the same plaintext, and verifies once the
 * hashes are in, in order; a chunk opened at another index, a tampered
 * one, the FINAL flag moved, or hashes taken in another order fail, and a
 * TAGS stream cannot be opened that way.
 */
static void
test_stream_chunks_opened_out_of_order(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	static uint8_t plain[4 * CH], one[CH + FB_STREAM_CHUNK_OVERHEAD];
	uint8_t hashes[4][FB_STREAM_HASH_LEN], swapped[4][FB_STREAM_HASH_LEN];
	fb_stream_pull *p = NULL;
	size_t len = 3 * CH + 5, mlen = 0;
	int final = 0;
	uint64_t total = 0;
	fb_reject why;

	cur_mode = FB_STREAM_DIGEST_FULL;
	push_wire(&ctx, f->w1, len, 9, &w);
	assert_int_equal(w.nchunks, 4);
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	for (size_t k = 4; k-- > 0;) {
		assert_int_equal(fb_stream_pull_chunk_at(p, k, w.chunks[k],
		                     w.chunk_len[k], plain + k * CH, CH, &mlen,
		                     &final, hashes[k], &why),
		    FB_OK);
		assert_int_equal(mlen, k == 3 ? 5 : CH);
		assert_int_equal(final, k == 3);
	}
	assert_memory_equal(plain, w.plain, len);
	/* at another index, or tampered: the MAC fails, nothing written */
	assert_int_equal(fb_stream_pull_chunk_at(p, 1, w.chunks[2],
	                     w.chunk_len[2], one, CH, &mlen, &final,
	                     swapped[0], &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	assert_int_equal(mlen, 0);
	memcpy(one, w.chunks[1], w.chunk_len[1]);
	one[0] = 1; /* FINAL moved to chunk 1 */
	assert_int_equal(fb_stream_pull_chunk_at(p, 1, one, w.chunk_len[1],
	                     plain, CH, &mlen, &final, swapped[0], &why),
	    FB_EAUTH);
	assert_int_equal(fb_stream_pull_chunk_at(p, 0, w.chunks[0],
	                     w.chunk_len[0], plain, CH - 1, &mlen, &final,
	                     swapped[0], &why),
	    FB_ERANGE);
	/* the trailer verifies only after all the hashes, in order */
	assert_int_equal(fb_stream_pull_final(p, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_EPROTO);
	assert_int_equal(fb_stream_pull_hashes(p, hashes[0], 2, 2 * CH, 0),
	    FB_OK);
	assert_int_equal(fb_stream_pull_hashes(p, hashes[2], 2, CH + 5, 1),
	    FB_OK);
	assert_int_equal(fb_stream_pull_final(p, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_OK);
	assert_int_equal(total, len);
	assert_int_equal(fb_stream_pull_hashes(p, hashes[0], 1, 1, 1),
	    FB_EINVAL); /* finished */
	assert_int_equal(fb_stream_pull_chunk_at(p, 0, w.chunks[0],
	                     w.chunk_len[0], plain, CH, &mlen, &final,
	                     swapped[0], &why),
	    FB_EINVAL);
	fb_stream_pull_free(p);
	/* hashes in another order: the digest differs */
	memcpy(swapped[0], hashes[1], FB_STREAM_HASH_LEN);
	memcpy(swapped[1], hashes[0], FB_STREAM_HASH_LEN);
	memcpy(swapped[2], hashes[2], 2 * FB_STREAM_HASH_LEN);
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_hashes(p, swapped[0], 4, len, 1),
	    FB_OK);
	assert_int_equal(fb_stream_pull_final(p, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_EAUTH);
	fb_stream_pull_free(p);
	/* TAGS streams chain their chunks: no opening out of order */
	cur_mode = FB_STREAM_DIGEST_TAGS;
	push_wire(&ctx, f->w1, len, 9, &w);
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_TAGS,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_chunk_at(p, 0, w.chunks[0],
	                     w.chunk_len[0], plain, CH, &mlen, &final,
	                     hashes[0], &why),
	    FB_EINVAL);
	assert_int_equal(fb_stream_pull_hashes(p, hashes[0], 1, CH, 0),
	    FB_EINVAL);
	fb_stream_pull_free(p);
	cur_mode = FB_STREAM_DIGEST_FULL;
}

/* open_parts opens chunk c of TAGS stream p and decrypts it into m in
 * three parts, last part first. */
static fb_err
open_parts(fb_stream_pull *p, const uint8_t *c, size_t c_len, uint8_t *m,
    size_t *m_len, int *final, fb_reject *why)
{
	fb_err rc = fb_stream_pull_open(p, c, c_len, CH, m_len, final, why);
	size_t n = *m_len, cut1, cut2;

	if (rc != FB_OK) {
		return rc;
	}
	cut1 = n / 3 / FB_STREAM_PART_ALIGN * FB_STREAM_PART_ALIGN;
	cut2 = 2 * cut1;
	assert_int_equal(fb_stream_pull_decrypt(p, c, cut2, n - cut2, m), FB_OK);
	assert_int_equal(fb_stream_pull_decrypt(p, c, 0, cut1, m), FB_OK);
	assert_int_equal(fb_stream_pull_decrypt(p, c, cut1, cut2 - cut1, m),
	    FB_OK);
	/* no second chunk while one is open */
	{
		size_t n2 = 0;
		int f2 = 0;
		assert_int_equal(
		    fb_stream_pull_open(p, c, c_len, CH, &n2, &f2, NULL),
		    FB_EINVAL);
	}
	fb_stream_pull_close(p);
	return FB_OK;
}

/*
 * A TAGS stream pushed by libsodium's secretstream opens chunk by chunk in
 * parts (fb_stream_pull_open, _decrypt out of order, _close) into the same
 * plaintext, and its trailer verifies; a flipped bit in a chunk or its tag
 * fails the MAC before anything is decrypted and kills the stream, chunks
 * out of order fail, parts out of range and a FULL stream are refused.
 */
static void
test_stream_tags_chunks_opened_in_parts(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	static uint8_t plain[8 * CH], c[CH + FB_STREAM_CHUNK_OVERHEAD];
	fb_stream_pull *p = NULL;
	size_t len = 3 * CH + 100, mlen = 0, off = 0;
	int final = 0;
	uint64_t total = 0;
	fb_reject why;

	cur_mode = FB_STREAM_DIGEST_TAGS;
	push_wire(&ctx, f->w1, len, 5, &w);
	assert_int_equal(w.nchunks, 4);
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_TAGS,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_decrypt(p, w.chunks[0], 0, 1, plain),
	    FB_EINVAL); /* nothing open */
	for (size_t k = 0; k < w.nchunks; k++) {
		assert_int_equal(open_parts(p, w.chunks[k], w.chunk_len[k],
		                     plain + off, &mlen, &final, &why),
		    FB_OK);
		assert_int_equal(final != 0, k + 1 == w.nchunks);
		off += mlen;
	}
	assert_int_equal(off, len);
	assert_memory_equal(plain, w.plain, len);
	assert_int_equal(fb_stream_pull_final(p, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_OK);
	assert_int_equal(total, len);
	fb_stream_pull_free(p);
	/* tampered: body, tag byte, MAC; each kills the stream */
	for (size_t at = 0; at < 3; at++) {
		size_t pos = at == 0 ? 40 : at == 1 ? 0 : w.chunk_len[1] - 1;
		assert_int_equal(fb_stream_pull_alloc(&ctx,
		                     FB_STREAM_DIGEST_TAGS, w.key, w.header,
		                     sizeof(w.header), CH, &p, &why),
		    FB_OK);
		assert_int_equal(open_parts(p, w.chunks[0], w.chunk_len[0],
		                     plain, &mlen, &final, &why),
		    FB_OK);
		memcpy(c, w.chunks[1], w.chunk_len[1]);
		c[pos] ^= 0x10;
		memset(plain, 0xAA, CH);
		assert_int_equal(fb_stream_pull_open(p, c, w.chunk_len[1], CH,
		                     &mlen, &final, &why),
		    FB_EAUTH);
		assert_int_equal(why, FB_REJECT_BAD_MAC);
		assert_int_equal(mlen, 0);
		assert_int_equal(fb_stream_pull_decrypt(p, c, 0, 64, plain),
		    FB_EINVAL);
		assert_int_equal(plain[0], 0xAA);
		assert_int_equal(fb_stream_pull_open(p, w.chunks[1],
		                     w.chunk_len[1], CH, &mlen, &final, &why),
		    FB_EAUTH); /* dead */
		fb_stream_pull_free(p);
	}
	/* out of order: chunk 2 where chunk 1 belongs */
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_TAGS,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(open_parts(p, w.chunks[0], w.chunk_len[0], plain,
	                     &mlen, &final, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_open(p, w.chunks[2], w.chunk_len[2],
	                     CH, &mlen, &final, &why),
	    FB_EAUTH);
	fb_stream_pull_free(p);
	/* parts out of range, a short buffer, a FULL stream */
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_TAGS,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_open(p, w.chunks[0], w.chunk_len[0],
	                     CH - 1, &mlen, &final, &why),
	    FB_ERANGE);
	assert_int_equal(fb_stream_pull_open(p, w.chunks[0], w.chunk_len[0],
	                     CH, &mlen, &final, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_decrypt(p, w.chunks[0], 1, 64, plain),
	    FB_ERANGE);
	assert_int_equal(fb_stream_pull_decrypt(p, w.chunks[0], 64, CH, plain),
	    FB_ERANGE);
	fb_stream_pull_close(p);
	fb_stream_pull_free(p);
	cur_mode = FB_STREAM_DIGEST_FULL;
	push_wire(&ctx, f->w1, len, 5, &w);
	assert_int_equal(fb_stream_pull_alloc(&ctx, FB_STREAM_DIGEST_FULL,
	                     w.key, w.header, sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_open(p, w.chunks[0], w.chunk_len[0],
	                     CH, &mlen, &final, &why),
	    FB_EINVAL);
	fb_stream_pull_free(p);
}

static void
test_stream_roundtrip(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	fb_reject why;
	const size_t lens[] = {0, 1, CH - 1, CH, CH + 1, 3 * CH + 17, 5 * CH};

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		push_wire(&ctx, f->w1, lens[i], (uint8_t)i, &w);
		assert_int_equal(pull_wire(&ctx, &f->allowed[1], &w, in_order,
		                     w.nchunks, &why),
		    FB_OK);
		assert_int_equal(why, FB_REJECT_NONE);
	}
}

static void
test_stream_chunk_bitflips(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w, bad;
	fb_reject why;

	push_wire(&ctx, f->w1, 3 * CH + 5, 9, &w);
	assert_int_equal(w.nchunks, 4);
	for (size_t c = 0; c < w.nchunks; c++) {
		/* First and last bytes, some in the middle, the MAC. */
		const size_t pos[] = {0, 1, 2, 100, w.chunk_len[c] / 2,
		    w.chunk_len[c] - 16, w.chunk_len[c] - 1};
		for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++) {
			if (pos[i] >= w.chunk_len[c]) {
				continue; /* the last chunk is short */
			}
			for (int b = 0; b < 8; b += 3) {
				bad = w;
				bad.chunks[c][pos[i]] ^= (uint8_t)(1u << b);
				assert_int_equal(
				    pull_wire(&ctx, &f->allowed[1], &bad,
				        in_order, w.nchunks, &why),
				    FB_EAUTH);
				assert_int_equal(why, FB_REJECT_BAD_MAC);
			}
		}
	}
}

static void
test_stream_header_bitflips(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w, bad;
	fb_reject why;

	push_wire(&ctx, f->w1, 2 * CH, 3, &w);
	for (size_t bit = 0; bit < 8 * FB_STREAM_HEADER_LEN; bit++) {
		bad = w;
		bad.header[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_not_equal(pull_wire(&ctx, &f->allowed[1], &bad,
		                         in_order, w.nchunks, &why),
		    FB_OK);
		assert_int_not_equal(why, FB_REJECT_NONE);
	}
}

static void
test_stream_trailer_bitflips(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w, bad;
	fb_reject why;

	push_wire(&ctx, f->w1, 2 * CH + 1, 4, &w);
	for (size_t bit = 0; bit < 8 * FB_STREAM_TRAILER_LEN; bit++) {
		bad = w;
		bad.trailer[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_not_equal(pull_wire(&ctx, &f->allowed[1], &bad,
		                         in_order, w.nchunks, &why),
		    FB_OK);
		assert_true(why == FB_REJECT_BAD_SIGNATURE ||
		            why == FB_REJECT_MALFORMED);
	}
}

static void
test_stream_reorder_dup_truncate(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	fb_reject why;
	const size_t swapped[] = {0, 2, 1, 3};
	const size_t dup[] = {0, 1, 1, 2, 3};
	const size_t dup_last[] = {0, 1, 2, 3, 3};
	const size_t skip[] = {0, 2, 3};
	const size_t last_first[] = {3};

	push_wire(&ctx, f->w1, 4 * CH, 5, &w);
	assert_int_equal(w.nchunks, 4);
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, swapped, 4, &why), FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, dup, 5, &why), FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, skip, 3, &why), FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, last_first, 1, &why), FB_EAUTH);
	/* Chunk after FINAL. */
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, dup_last, 5, &why), FB_EPROTO);
	assert_int_equal(why, FB_REJECT_MALFORMED);
	/* Truncated: the trailer arrives before the FINAL chunk. */
	for (size_t n = 0; n < 4; n++) {
		assert_int_equal(
		    pull_wire(&ctx, &f->allowed[1], &w, in_order, n, &why),
		    FB_EPROTO);
		assert_int_equal(why, FB_REJECT_TRUNCATED);
	}
}

static void
test_stream_bad_trailers(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	fb_stream_ctx ctx3 = ctx_of(&f->run, 3, 1);
	fb_stream_ctx ctx0 = ctx_of(&f->run, 2, 0);
	static wire w, other;
	fb_reject why;
	fb_run_id run2;

	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	/* Signed by another key, or checked against another key. */
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[0], &w, in_order, w.nchunks, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_SIGNATURE);
	/* The signer's genuine trailer of another stream, same round. */
	push_wire(&ctx, f->w1, 2 * CH, 7, &other);
	memcpy(w.trailer, other.trailer, sizeof(w.trailer));
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_SIGNATURE);
	/* Its trailer from the next round (cross-round replay). */
	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	push_wire(&ctx3, f->w1, 2 * CH, 6, &other);
	memcpy(w.trailer, other.trailer, sizeof(w.trailer));
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_ESTALE);
	assert_int_equal(why, FB_REJECT_WRONG_ROUND);
	/* Worker 0's trailer on worker 1's stream (both signed by w1 here,
	 * so only the sender field differs). */
	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	push_wire(&ctx0, f->w1, 2 * CH, 6, &other);
	memcpy(w.trailer, other.trailer, sizeof(w.trailer));
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_WRONG_SENDER);
	/* Another run. */
	assert_int_equal(fb_run_id_random(&run2), FB_OK);
	ctx0 = ctx_of(&run2, 2, 1);
	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	push_wire(&ctx0, f->w1, 2 * CH, 6, &other);
	memcpy(w.trailer, other.trailer, sizeof(w.trailer));
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_WRONG_RUN);
	/* Chunks pulled under another context fail at the first MAC. */
	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	assert_int_equal(
	    pull_wire(&ctx3, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	/* Short trailer. */
	{
		fb_stream_pull *p = NULL;
		assert_int_equal(fb_stream_pull_alloc(&ctx, cur_mode, w.key,
		                     w.header, sizeof(w.header), CH, &p, &why),
		    FB_OK);
		assert_int_equal(fb_stream_pull_final(p, &f->allowed[1],
		                     w.trailer, 10, NULL, &why),
		    FB_EPROTO);
		assert_int_equal(why, FB_REJECT_MALFORMED);
		fb_stream_pull_free(p);
	}
}

static void
test_stream_limits(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	fb_stream_pull *p = NULL;
	fb_reject why;
	uint8_t out[CH];
	size_t mlen;
	int final;

	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	/* Header declares chunks bigger than the receiver allows. */
	assert_int_equal(fb_stream_pull_alloc(&ctx, cur_mode, w.key, w.header,
	                     sizeof(w.header), CH - 1, &p, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_TOO_LARGE);
	assert_null(p);
	assert_int_equal(fb_stream_pull_alloc(
	                     &ctx, cur_mode, w.key, w.header, 31, CH, &p, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_MALFORMED);
	assert_int_equal(fb_stream_pull_alloc(&ctx, cur_mode, w.key, w.header,
	                     sizeof(w.header), CH, &p, &why),
	    FB_OK);
	/* Too short, then a dead stream stays dead. */
	assert_int_equal(fb_stream_pull_chunk(p, w.chunks[0], 16, out,
	                     sizeof(out), &mlen, &final, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_MALFORMED);
	assert_int_equal(fb_stream_pull_chunk(p, w.chunks[0], w.chunk_len[0],
	                     out, sizeof(out), &mlen, &final, &why),
	    FB_EPROTO);
	fb_stream_pull_free(p);
	/* A chunk longer than declared. */
	assert_int_equal(fb_stream_pull_alloc(&ctx, cur_mode, w.key, w.header,
	                     sizeof(w.header), CH, &p, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_chunk(p, w.chunks[0],
	                     CH + FB_STREAM_CHUNK_OVERHEAD + 1, out,
	                     sizeof(out), &mlen, &final, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_TOO_LARGE);
	fb_stream_pull_free(p);
	{
		fb_stream_push *q = NULL;
		uint8_t key[32], hdr[32];
		assert_int_equal(
		    fb_stream_push_alloc(&ctx, 0, cur_mode, key, hdr, &q),
		    FB_EINVAL);
		assert_int_equal(
		    fb_stream_push_alloc(&ctx, (size_t)FB_STREAM_CHUNK_MAX + 1,
		        cur_mode, key, hdr, &q),
		    FB_EINVAL);
		assert_int_equal(
		    fb_stream_push_alloc(&ctx, 16, cur_mode, key, hdr, &q),
		    FB_OK);
		assert_int_equal(
		    fb_stream_push_final(q, f->w1, w.trailer), FB_EINVAL);
		assert_int_equal(fb_stream_push_chunk(
		                     q, out, 17, 0, out, sizeof(out), &mlen),
		    FB_ERANGE);
		assert_int_equal(
		    fb_stream_push_chunk(q, out, 16, 0, out, 32, &mlen),
		    FB_ERANGE);
		fb_stream_push_free(q);
	}
}

static void
test_stream_tags_mode(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	fb_reject why;

	cur_mode = FB_STREAM_DIGEST_TAGS;
	test_stream_roundtrip(state);
	test_stream_chunk_bitflips(state);
	test_stream_trailer_bitflips(state);
	test_stream_reorder_dup_truncate(state);
	test_stream_bad_trailers(state);
	/* A receiver that requires FULL refuses a TAGS stream... */
	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	cur_mode = FB_STREAM_DIGEST_FULL;
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_EPROTO);
	assert_int_equal(why, FB_REJECT_MALFORMED);
	/* ... and a TAGS receiver a FULL stream. */
	push_wire(&ctx, f->w1, 2 * CH, 6, &w);
	cur_mode = FB_STREAM_DIGEST_TAGS;
	assert_int_equal(
	    pull_wire(&ctx, &f->allowed[1], &w, in_order, w.nchunks, &why),
	    FB_EPROTO);
	cur_mode = FB_STREAM_DIGEST_FULL;
}

/* run_rev: an fb_stream_pull_chunk_par runner that runs the pieces last
 * first, as threads may. */
static void
run_rev(void *ctx, uint32_t n, void (*fn)(void *arg, uint32_t i), void *arg)
{
	uint32_t *pieces = ctx;

	*pieces += n;
	for (uint32_t i = n; i-- > 0;) {
		fn(arg, i);
	}
}

/*
 * INDEXED_TAGS (worker updates): every check the other modes pass
 * (round trip, flipped bits in chunks, header and trailer, swapped,
 * duplicated, skipped and truncated chunks, trailers of another stream,
 * round, sender or run, chunks under another context, limits), and no
 * receiver of one mode takes a stream of another.
 */
static void
test_stream_indexed_mode(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	static wire w;
	fb_reject why;
	const fb_stream_digest other[] = {
	    FB_STREAM_DIGEST_FULL, FB_STREAM_DIGEST_TAGS};

	cur_mode = FB_STREAM_DIGEST_INDEXED_TAGS;
	test_stream_roundtrip(state);
	test_stream_chunk_bitflips(state);
	test_stream_header_bitflips(state);
	test_stream_trailer_bitflips(state);
	test_stream_reorder_dup_truncate(state);
	test_stream_bad_trailers(state);
	test_stream_limits(state);
	for (size_t i = 0; i < 2; i++) {
		cur_mode = FB_STREAM_DIGEST_INDEXED_TAGS;
		push_wire(&ctx, f->w1, 2 * CH, 6, &w);
		cur_mode = other[i];
		assert_int_equal(pull_wire(&ctx, &f->allowed[1], &w, in_order,
		                     w.nchunks, &why),
		    FB_EPROTO);
		assert_int_equal(why, FB_REJECT_MALFORMED);
		push_wire(&ctx, f->w1, 2 * CH, 6, &w);
		cur_mode = FB_STREAM_DIGEST_INDEXED_TAGS;
		assert_int_equal(pull_wire(&ctx, &f->allowed[1], &w, in_order,
		                     w.nchunks, &why),
		    FB_EPROTO);
		assert_int_equal(why, FB_REJECT_MALFORMED);
	}
	cur_mode = FB_STREAM_DIGEST_FULL;
}

/*
 * An INDEXED_TAGS or FULL stream as crypto.h documents it, rebuilt here
 * from libsodium's primitives alone: each chunk is XChaCha20-Poly1305-IETF
 * under nonce = header nonce || LE64(k) and AD = run || round || sender
 * || LE64(k) || flag, the digest in the trailer is BLAKE2b-256 of
 * "fedbox/stream/v1" || header || for each chunk, INDEXED_TAGS:
 * LE64(length) || LE64(k) || its tag, FULL: SHA-256(LE64(length) ||
 * chunk), and the header carries the mode (2, 0).
 */
static void
wire_format_of(fb_stream_digest mode)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 7, 3);
	static wire w;
	static uint8_t c[CH + FB_STREAM_CHUNK_OVERHEAD];
	crypto_generichash_state h;
	uint8_t nonce[24], ad[FB_RUN_ID_LEN + 8 + 9], l[8], digest[32];
	size_t len = 2 * CH + 33, off = 0;
	unsigned long long tlen = 0;

	cur_mode = mode;
	push_wire(&ctx, f->w1, len, 11, &w);
	assert_int_equal(w.nchunks, 3);
	assert_int_equal(w.header[2], mode);
	assert_true(sodium_is_zero(w.header + 24, 8));
	crypto_generichash_init(&h, NULL, 0, 32);
	crypto_generichash_update(&h, (const uint8_t *)"fedbox/stream/v1", 16);
	crypto_generichash_update(&h, w.header, sizeof(w.header));
	for (size_t k = 0; k < w.nchunks; k++) {
		size_t n = k == 2 ? 33 : CH;
		uint8_t flag = k == 2;
		memcpy(nonce, w.header + 8, 16);
		fb_store_le64(nonce + 16, k);
		memcpy(ad, f->run.b, FB_RUN_ID_LEN);
		le32_store(ad + FB_RUN_ID_LEN, 7);
		le32_store(ad + FB_RUN_ID_LEN + 4, 3);
		fb_store_le64(ad + FB_RUN_ID_LEN + 8, k);
		ad[FB_RUN_ID_LEN + 16] = flag;
		c[0] = flag;
		crypto_aead_xchacha20poly1305_ietf_encrypt_detached(c + 1,
		    c + 1 + n, &tlen, w.plain + off, n, ad, sizeof(ad), NULL,
		    nonce, w.key);
		assert_int_equal(tlen, 16);
		assert_int_equal(w.chunk_len[k], n + 17);
		assert_memory_equal(w.chunks[k], c, n + 17);
		fb_store_le64(l, n + 17);
		if (mode == FB_STREAM_DIGEST_FULL) {
			crypto_hash_sha256_state sh;
			uint8_t ch[32];
			crypto_hash_sha256_init(&sh);
			crypto_hash_sha256_update(&sh, l, 8);
			crypto_hash_sha256_update(&sh, c, n + 17);
			crypto_hash_sha256_final(&sh, ch);
			crypto_generichash_update(&h, ch, 32);
		} else {
			crypto_generichash_update(&h, l, 8);
			fb_store_le64(l, k);
			crypto_generichash_update(&h, l, 8);
			crypto_generichash_update(&h, c + 1 + n, 16);
		}
		off += n;
	}
	crypto_generichash_final(&h, digest, 32);
	assert_memory_equal(w.trailer + 44, digest, 32);
	assert_int_equal(fb_load_le64(w.trailer + 28), len);
	assert_int_equal(fb_load_le64(w.trailer + 36), 3);
	cur_mode = FB_STREAM_DIGEST_FULL;
}

static void
test_stream_indexed_wire_format(void **state)
{
	wire_format_of(FB_STREAM_DIGEST_INDEXED_TAGS);
}

static void
test_stream_full_wire_format(void **state)
{
	wire_format_of(FB_STREAM_DIGEST_FULL);
}

/*
 * INDEXED_TAGS chunks sealed on their own, last first (as pool threads
 * would), pull like a stream pushed in order; opened on their own in any
 * order (fb_stream_pull_chunk_at) and in parts (fb_stream_pull_chunk_par,
 * pieces last first) they give the same plaintext and the same digest as
 * fb_stream_pull_chunk in order. A chunk moved to another index, its FINAL
 * flag dropped, moved or added, or a chunk of another stream, round or
 * sender at the same index fails its MAC; the hashes out of order fail
 * the trailer.
 */
static void
test_stream_indexed_parallel(void **state)
{
	const fixture *f = fx();
	fb_stream_ctx ctx = ctx_of(&f->run, 2, 1);
	const fb_stream_ctx others[] = {ctx_of(&f->run, 3, 1),
	    ctx_of(&f->run, 2, 0), ctx};
	static wire w, bad, alien;
	static uint8_t plain[8 * CH], buf[CH + FB_STREAM_CHUNK_OVERHEAD];
	uint8_t hashes[5][FB_STREAM_HASH_LEN], again[5][FB_STREAM_HASH_LEN];
	fb_stream_push *p = NULL;
	fb_stream_pull *q = NULL;
	size_t len = 4 * CH + 200, mlen = 0;
	uint64_t total = 0;
	uint32_t pieces = 0;
	int final = 0;
	fb_reject why;

	memset(&w, 0, sizeof(w));
	for (size_t i = 0; i < len; i++) {
		w.plain[i] = (uint8_t)(3 + i * 7);
	}
	w.plain_len = len;
	w.nchunks = 5;
	assert_int_equal(fb_stream_push_alloc(&ctx, CH,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, w.key, w.header, &p),
	    FB_OK);
	for (size_t k = 5; k-- > 0;) {
		size_t n = k == 4 ? 200 : CH;
		assert_int_equal(fb_stream_push_chunk_at(p, k, w.plain + k * CH, n,
		                     k == 4, w.chunks[k], sizeof(w.chunks[k]),
		                     &w.chunk_len[k], hashes[k]),
		    FB_OK);
	}
	assert_int_equal(fb_stream_push_final(p, f->w1, w.trailer), FB_EINVAL);
	assert_int_equal(fb_stream_push_hashes(p, hashes[0], 2, 2 * CH, 0),
	    FB_OK);
	assert_int_equal(fb_stream_push_hashes(p, hashes[2], 3, 2 * CH + 200,
	                     1),
	    FB_OK);
	assert_int_equal(fb_stream_push_final(p, f->w1, w.trailer), FB_OK);
	fb_stream_push_free(p);
	cur_mode = FB_STREAM_DIGEST_INDEXED_TAGS;
	/* in order, one by one */
	assert_int_equal(pull_wire(&ctx, &f->allowed[1], &w, in_order, 5, &why),
	    FB_OK);
	/* on their own, last first, then the hashes in order */
	assert_int_equal(fb_stream_pull_alloc(&ctx,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, w.key, w.header,
	                     sizeof(w.header), CH, &q, &why),
	    FB_OK);
	memset(plain, 0, sizeof(plain));
	for (size_t k = 5; k-- > 0;) {
		assert_int_equal(fb_stream_pull_chunk_at(q, k, w.chunks[k],
		                     w.chunk_len[k], plain + k * CH, CH, &mlen,
		                     &final, again[k], &why),
		    FB_OK);
		assert_int_equal(final, k == 4);
		assert_memory_equal(again[k], hashes[k], FB_STREAM_HASH_LEN);
	}
	assert_memory_equal(plain, w.plain, len);
	assert_int_equal(fb_stream_pull_hashes(q, again[0], 5, len, 1), FB_OK);
	assert_int_equal(fb_stream_pull_final(q, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_OK);
	assert_int_equal(total, len);
	fb_stream_pull_free(q);
	/* the hashes out of order: the digest differs */
	memcpy(again[0], hashes[1], FB_STREAM_HASH_LEN);
	memcpy(again[1], hashes[0], FB_STREAM_HASH_LEN);
	assert_int_equal(fb_stream_pull_alloc(&ctx,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, w.key, w.header,
	                     sizeof(w.header), CH, &q, &why),
	    FB_OK);
	assert_int_equal(fb_stream_pull_hashes(q, again[0], 5, len, 1), FB_OK);
	assert_int_equal(fb_stream_pull_final(q, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_SIGNATURE);
	fb_stream_pull_free(q);
	/* in parts, in place, the pieces last first */
	assert_int_equal(fb_stream_pull_alloc(&ctx,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, w.key, w.header,
	                     sizeof(w.header), CH, &q, &why),
	    FB_OK);
	for (size_t k = 0, off = 0; k < 5; k++) {
		memcpy(buf, w.chunks[k], w.chunk_len[k]);
		assert_int_equal(fb_stream_pull_chunk_par(q, buf, w.chunk_len[k],
		                     buf + 1, CH, &mlen, &final, &why, run_rev,
		                     &pieces),
		    FB_OK);
		assert_int_equal(final, k == 4);
		assert_memory_equal(buf + 1, w.plain + off, mlen);
		off += mlen;
	}
	assert_true(pieces >= 5);
	assert_int_equal(fb_stream_pull_final(q, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_OK);
	fb_stream_pull_free(q);
	/* chunks moved: 2 at 1, the last at 3 */
	bad = w;
	memcpy(bad.chunks[1], w.chunks[2], w.chunk_len[2]);
	assert_int_equal(pull_wire(&ctx, &f->allowed[1], &bad, in_order, 5,
	                     &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	bad = w;
	memcpy(bad.chunks[3], w.chunks[4], w.chunk_len[4]);
	bad.chunk_len[3] = w.chunk_len[4];
	assert_int_equal(pull_wire(&ctx, &f->allowed[1], &bad, in_order, 4,
	                     &why),
	    FB_EAUTH);
	assert_int_equal(why, FB_REJECT_BAD_MAC);
	/* the FINAL flag: dropped from the last, moved, added, another value */
	for (int t = 0; t < 4; t++) {
		bad = w;
		if (t == 0) {
			bad.chunks[4][0] = 0;
		} else if (t == 1) {
			bad.chunks[2][0] = 1;
		} else if (t == 2) {
			bad.chunks[0][0] = 1;
		} else {
			bad.chunks[4][0] = 3;
		}
		assert_int_equal(pull_wire(&ctx, &f->allowed[1], &bad, in_order,
		                     5, &why),
		    FB_EAUTH);
		assert_int_equal(why, FB_REJECT_BAD_MAC);
		assert_int_equal(fb_stream_pull_alloc(&ctx,
		                     FB_STREAM_DIGEST_INDEXED_TAGS, bad.key,
		                     bad.header, sizeof(bad.header), CH, &q, &why),
		    FB_OK);
		for (size_t k = 0; k < 5; k++) {
			fb_err rc;
			memcpy(buf, bad.chunks[k], bad.chunk_len[k]);
			memset(plain, 0xAA, CH);
			rc = fb_stream_pull_chunk_par(q, buf, bad.chunk_len[k],
			    plain, CH, &mlen, &final, &why, run_rev, &pieces);
			if (rc != FB_OK) {
				assert_int_equal(rc, FB_EAUTH);
				assert_int_equal(why, FB_REJECT_BAD_MAC);
				assert_int_equal(mlen, 0);
				assert_int_equal(plain[0], 0xAA); /* MAC first */
				break;
			}
			assert_true(k < 4);
		}
		fb_stream_pull_free(q);
	}
	/* chunk 1 of another stream (same context, another key), and of
	 * the same plaintext under another round or sender */
	for (size_t i = 0; i < 3; i++) {
		push_wire(&others[i], f->w1, len, 3, &alien);
		bad = w;
		memcpy(bad.chunks[1], alien.chunks[1], alien.chunk_len[1]);
		assert_int_equal(pull_wire(&ctx, &f->allowed[1], &bad, in_order,
		                     5, &why),
		    FB_EAUTH);
		assert_int_equal(why, FB_REJECT_BAD_MAC);
		assert_int_equal(fb_stream_pull_alloc(&ctx,
		                     FB_STREAM_DIGEST_INDEXED_TAGS, bad.key,
		                     bad.header, sizeof(bad.header), CH, &q, &why),
		    FB_OK);
		assert_int_equal(fb_stream_pull_chunk_at(q, 1, bad.chunks[1],
		                     bad.chunk_len[1], plain, CH, &mlen, &final,
		                     again[0], &why),
		    FB_EAUTH);
		assert_int_equal(why, FB_REJECT_BAD_MAC);
		fb_stream_pull_free(q);
	}
	/* opened in three parts out of order; a TAGS-only check: none */
	assert_int_equal(fb_stream_pull_alloc(&ctx,
	                     FB_STREAM_DIGEST_INDEXED_TAGS, w.key, w.header,
	                     sizeof(w.header), CH, &q, &why),
	    FB_OK);
	for (size_t k = 0, off = 0; k < 5; k++) {
		assert_int_equal(open_parts(q, w.chunks[k], w.chunk_len[k],
		                     plain + off, &mlen, &final, &why),
		    FB_OK);
		off += mlen;
	}
	assert_memory_equal(plain, w.plain, len);
	assert_int_equal(fb_stream_pull_final(q, &f->allowed[1], w.trailer,
	                     sizeof(w.trailer), &total, &why),
	    FB_OK);
	fb_stream_pull_free(q);
	cur_mode = FB_STREAM_DIGEST_FULL;
}

static void
test_broadcast(void **state)
{
	const fixture *f = fx();
	fb_session *w0 = NULL, *c0 = NULL, *w1 = NULL, *c1 = NULL;
	fb_stream_ctx ctx = ctx_of(&f->run, 5, FB_SENDER_COORDINATOR);
	static wire w;
	uint8_t m0[128], m1[128], key[64];
	size_t n0, n1, klen;
	fb_msg_info info;
	fb_reject why;
	fb_session *sess[2];
	const uint8_t *msgs[2] = {m0, m1};
	size_t lens[2];

	pair(f, f->w0, &f->run, &w0, &c0);
	pair(f, f->w1, &f->run, &w1, &c1);
	/* The model is encrypted once, the round key sealed per worker. */
	push_wire(&ctx, f->coord, 3 * CH + 3, 1, &w);
	assert_int_equal(
	    fb_msg_seal(c0, 7, 5, w.key, 32, m0, sizeof(m0), &n0), FB_OK);
	assert_int_equal(
	    fb_msg_seal(c1, 7, 5, w.key, 32, m1, sizeof(m1), &n1), FB_OK);
	assert_memory_not_equal(
	    m0 + FB_MSG_HEADER_LEN, m1 + FB_MSG_HEADER_LEN, 32);
	sess[0] = w0;
	sess[1] = w1;
	lens[0] = n0;
	lens[1] = n1;
	for (int i = 0; i < 2; i++) {
		static wire got;
		assert_int_equal(fb_msg_open(sess[i], 5, msgs[i], lens[i], key,
		                     sizeof(key), &klen, &info, &why),
		    FB_OK);
		assert_int_equal(klen, 32);
		got = w;
		memcpy(got.key, key, 32);
		fb_wipe(key, sizeof(key));
		assert_int_equal(pull_wire(&ctx, &f->coord_pk, &got, in_order,
		                     w.nchunks, &why),
		    FB_OK);
		/* A worker's key cannot stand in for the coordinator's. */
		assert_int_equal(pull_wire(&ctx, &f->allowed[i], &got, in_order,
		                     w.nchunks, &why),
		    FB_EAUTH);
	}
	/* Worker 0 cannot open worker 1's copy of the round key. */
	assert_int_not_equal(
	    fb_msg_open(w0, 5, m1, n1, key, sizeof(key), &klen, &info, &why),
	    FB_OK);
	fb_session_free(w0);
	fb_session_free(c0);
	fb_session_free(w1);
	fb_session_free(c1);
}

/* crypto_scalarmult's verdict on pk: zero out (refused) for every
 * secret key tried. */
static int
refused_by_sodium(const uint8_t pk[32])
{
	uint8_t sk[32], q[32];
	int refused = 0;

	for (int i = 0; i < 3; i++) {
		randombytes_buf(sk, sizeof(sk));
		refused += crypto_scalarmult(q, sk, pk) != 0;
	}
	assert_true(refused == 0 || refused == 3);
	return refused == 3;
}

/*
 * The small-order table is exactly the keys libsodium's X25519 refuses:
 * every entry, with and without the ignored top bit, the values around
 * 0 and p (the non-canonical encodings), each entry with one bit
 * flipped, and random keys.
 */
static void
test_x25519_small_order_table(void **state)
{
	uint8_t pk[32];
	uint32_t small = 0;

	(void)state;
	assert_int_equal(fb_crypto_init(), FB_OK);
	/* near 0, and near p = 2^255 - 19 (p - 1 .. 2^255 - 1 and beyond) */
	for (int hi = 0; hi < 2; hi++) {
		for (int v = 0; v < 64; v++) {
			memset(pk, hi ? 0xff : 0, sizeof(pk));
			if (hi) {
				pk[31] = 0x7f;
				pk[0] = (uint8_t)(0xff - v); /* 2^255 - 1 - v */
			} else {
				pk[0] = (uint8_t)v;
			}
			for (int top = 0; top < 2; top++) {
				pk[31] = (uint8_t)((pk[31] & 0x7f) | (top << 7));
				assert_int_equal(fb_x25519_small_order(pk),
				    refused_by_sodium(pk));
				small += (uint32_t)fb_x25519_small_order(pk);
			}
		}
	}
	/* 0, 1, p - 1, p, p + 1, each with and without the top bit */
	assert_int_equal(small, 10);
	/* the two of order 8, and every one-bit change of them */
	{
		static const char *const hex[2] = {
			"e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd8662051"
			"65f49b800",
			"5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224ed"
			"dd09f1157",
		};
		for (int e = 0; e < 2; e++) {
			assert_int_equal(sodium_hex2bin(pk, sizeof(pk), hex[e],
			    64, NULL, NULL, NULL), 0);
			for (int top = 0; top < 2; top++) {
				pk[31] = (uint8_t)((pk[31] & 0x7f) | (top << 7));
				assert_true(fb_x25519_small_order(pk));
				assert_true(refused_by_sodium(pk));
			}
			for (int bit = 0; bit < 255; bit++) {
				pk[bit / 8] ^= (uint8_t)(1u << (bit % 8));
				assert_int_equal(fb_x25519_small_order(pk),
				    refused_by_sodium(pk));
				pk[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			}
		}
	}
	/* real keys */
	for (int i = 0; i < 200; i++) {
		uint8_t sk[32];

		randombytes_buf(sk, sizeof(sk));
		assert_int_equal(crypto_scalarmult_base(pk, sk), 0);
		assert_false(fb_x25519_small_order(pk));
		randombytes_buf(pk, sizeof(pk));
		assert_int_equal(fb_x25519_small_order(pk),
		    refused_by_sodium(pk));
	}
}

static void
test_reject_names(void **state)
{
	for (int i = 0; i < FB_REJECT_COUNT_; i++) {
		const char *a = fb_reject_name((fb_reject)i);
		assert_non_null(a);
		for (int j = 0; j < i; j++) {
			assert_string_not_equal(
			    a, fb_reject_name((fb_reject)j));
		}
	}
	assert_string_equal(fb_reject_name(FB_REJECT_COUNT_), "unknown");
}

FB_TESTS = {
    {"Ed25519 from a seed matches RFC 8032", test_kat_ed25519},
    {"BLAKE2b matches RFC 7693", test_kat_blake2b},
    {"secret blocks are aligned, apart, and wiped when freed",
        test_secmem_blocks},
    {"secret blocks hold their contents with 4 threads at once",
        test_secmem_threads},
    {"the bulk ChaCha20, Poly1305 and SHA-256 passes are libsodium's",
        test_chacha_is_libsodium},
    {"a failed open returns -1 and leaves nothing unauthenticated",
        test_chacha_open_refuses_and_wipes},
    {"identity survives save and load", test_identity_save_load},
    {"saving refuses to overwrite without force", test_identity_no_overwrite},
    {"secret key readable by others is refused with a chmod hint",
        test_key_mode_refused},
    {"corrupt secret key file is refused", test_key_corrupt_refused},
    {"public key line survives format and parse", test_publine_roundtrip},
    {"malformed public key lines are refused", test_publine_errors},
    {"domain signatures verify and bind key and domain",
        test_domain_signatures},
    {"handshake gives both sides matching sessions", test_handshake_roundtrip},
    {"worker key not on the allowlist is refused", test_handshake_unknown_key},
    {"hello signed by another key is refused", test_handshake_forged_hello},
    {"any flipped bit in a hello is rejected", test_handshake_hello_bitflips},
    {"a hello with another process's or an expired cookie is refused",
        test_handshake_cookie_freshness},
    {"coordinator key that is not the pinned one is refused",
        test_handshake_unpinned},
    {"any flipped bit in a reply is rejected and the real one still "
     "works",
        test_handshake_reply_bitflips},
    {"sealed message survives seal and open both ways", test_msg_roundtrip},
    {"sealed message opens in place", test_msg_in_place},
    {"any flipped bit in header, body or MAC is rejected", test_msg_bitflips},
    {"replayed and reordered messages are rejected", test_msg_replay},
    {"message for another round is stale", test_msg_wrong_round},
    {"message from another run is rejected", test_msg_wrong_run},
    {"message from another sender is rejected", test_msg_wrong_sender},
    {"stream survives push and pull in place", test_stream_roundtrip},
    {"flipped bit in any stream chunk is rejected", test_stream_chunk_bitflips},
    {"flipped bit in the stream header is rejected",
        test_stream_header_bitflips},
    {"flipped bit in the trailer is rejected", test_stream_trailer_bitflips},
    {"reordered, duplicated and truncated chunks are rejected",
        test_stream_reorder_dup_truncate},
    {"trailers of other signers, streams, rounds, senders and runs are "
     "rejected",
        test_stream_bad_trailers},
    {"stream sizes beyond the limits are rejected", test_stream_limits},
    {"TAGS digest streams pass the same checks and cannot be downgraded",
        test_stream_tags_mode},
    {"an INDEXED_TAGS stream passes every check the other modes pass",
        test_stream_indexed_mode},
    {"an INDEXED_TAGS stream is the documented libsodium construction",
        test_stream_indexed_wire_format},
    {"a FULL stream is the documented construction (SHA-256 per chunk)",
        test_stream_full_wire_format},
    {"INDEXED_TAGS chunks seal and open on their own, in any order",
        test_stream_indexed_parallel},
    {"FULL chunks sealed out of order on their own pull as one stream",
        test_stream_chunks_sealed_out_of_order},
    {"FULL chunks opened out of order on their own verify as one stream",
        test_stream_chunks_opened_out_of_order},
    {"a TAGS stream's chunks opened in parts are libsodium's pull",
        test_stream_tags_chunks_opened_in_parts},
    {"global model is encrypted once and opens for each selected worker",
        test_broadcast},
    {"the X25519 small-order table is the keys libsodium refuses",
        test_x25519_small_order_table},
    {"reject reasons have distinct names", test_reject_names},
    {NULL, NULL},
};

FB_TEST_MAIN("crypto")
