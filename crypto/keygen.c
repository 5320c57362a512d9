/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keygen.c -- fedbox-keygen: make an Ed25519 identity for a coordinator or
 * a worker (NAME.key, mode 0600, and NAME.pub), or print the public line of
 * an existing secret key. Folders of NAME that do not exist yet are made,
 * mode 0700 (they hold secrets). Exit 0 ok, 1 failure, 2 usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/util.h"
#include "crypto/crypto.h"

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: fedbox-keygen -o NAME [-C COMMENT] [--force]\n"
	    "       fedbox-keygen --pub NAME.key\n"
	    "\n"
	    "Makes an Ed25519 identity: NAME.key (secret, mode 0600) and\n"
	    "NAME.pub (one line: fedbox-ed25519 <base64 key> [comment]),\n"
	    "and prints the public line; missing folders of NAME are made\n"
	    "(mode 0700). Put a worker's line in the\n"
	    "coordinator's allowlist; pin the coordinator's line in each\n"
	    "worker's config.\n"
	    "\n"
	    "  -o, --out NAME       write NAME.key and NAME.pub\n"
	    "  -C, --comment TEXT   comment for the public line (e.g. host)\n"
	    "  -f, --force          overwrite existing NAME.key / NAME.pub\n"
	    "  -p, --pub FILE.key   print the public line of a secret key\n"
	    "  -h, --help           this help\n"
	    "  -V, --version        print the version\n");
}

/*
 * make_parents creates the missing folders above file name `name`, each
 * mode 0700; folders that exist are left as they are. Returns 0, or 1
 * after saying which folder could not be made.
 */
static int
make_parents(const char *name)
{
	char buf[4096];
	size_t len = strlen(name);
	struct stat st;

	if (len >= sizeof(buf)) {
		fprintf(stderr, "fedbox-keygen: %s: name too long\n", name);
		return 1;
	}
	memcpy(buf, name, len + 1);
	for (size_t i = 1; i < len; i++) {
		if (buf[i] != '/' || buf[i - 1] == '/') {
			continue;
		}
		buf[i] = '\0';
		if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
			fprintf(stderr, "fedbox-keygen: cannot create folder "
			                "%s: %s\n", buf, strerror(errno));
			return 1;
		}
		if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
			fprintf(stderr, "fedbox-keygen: %s is not a folder\n",
			    buf);
			return 1;
		}
		buf[i] = '/';
	}
	return 0;
}

static int
print_pub(const fb_identity *id)
{
	fb_pubkey pk;
	char line[FB_PUBLINE_MAX];

	fb_identity_pubkey(id, &pk);
	if (fb_pubkey_format(
	        &pk, fb_identity_comment(id), line, sizeof(line)) != FB_OK) {
		return 1;
	}
	printf("%s\n", line);
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"out", required_argument, NULL, 'o'},
	    {"comment", required_argument, NULL, 'C'},
	    {"force", no_argument, NULL, 'f'},
	    {"pub", required_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const char *out = NULL, *comment = NULL, *pub = NULL;
	int force = 0, c, rc = 1;
	fb_err err;
	fb_identity *id = NULL;
	char path[4096];
	struct stat st;

	fb_log_init("fedbox-keygen", FB_LOG_INFO);
	while ((c = getopt_long(argc, argv, "o:C:fp:hV", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case 'C':
			comment = optarg;
			break;
		case 'f':
			force = 1;
			break;
		case 'p':
			pub = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("fedbox-keygen %s\n", FB_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || (out == NULL) == (pub == NULL) ||
	    (pub != NULL && (comment != NULL || force))) {
		fprintf(stderr, "fedbox-keygen: give either -o NAME or "
		                "--pub FILE.key\n");
		usage(stderr);
		return 2;
	}
	if (out != NULL && out[0] == '\0') {
		fprintf(stderr, "fedbox-keygen: -o needs a non-empty NAME\n");
		return 2;
	}
	if (pub != NULL) {
		if (fb_identity_load(pub, &id) != FB_OK) {
			goto out;
		}
		rc = print_pub(id);
		goto out;
	}
	if (comment != NULL && strlen(comment) >= FB_COMMENT_MAX) {
		fprintf(stderr, "fedbox-keygen: comment longer than %d bytes\n",
		    FB_COMMENT_MAX - 1);
		return 2;
	}
	if (!force) {
		const char *ext[] = {".key", ".pub"};
		for (size_t i = 0; i < FB_ARRAY_LEN(ext); i++) {
			snprintf(path, sizeof(path), "%s%s", out, ext[i]);
			if (lstat(path, &st) == 0) {
				fprintf(stderr,
				    "fedbox-keygen: %s exists; "
				    "use --force to overwrite it\n",
				    path);
				goto out;
			}
		}
	}
	if (make_parents(out) != 0) {
		goto out;
	}
	if ((err = fb_identity_alloc(comment, &id)) != FB_OK) {
		if (err == FB_EINVAL) {
			fprintf(stderr, "fedbox-keygen: the comment must be "
			                "printable text on one line\n");
			rc = 2;
		} else {
			fprintf(stderr,
			    "fedbox-keygen: cannot make a key: "
			    "%s\n",
			    fb_strerror(err));
		}
		goto out;
	}
	if (fb_identity_save(id, out, force) != FB_OK) {
		goto out;
	}
	rc = print_pub(id);
out:
	fb_identity_free(id);
	return rc;
}
