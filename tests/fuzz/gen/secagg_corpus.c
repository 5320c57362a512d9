/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_corpus.c -- writes the seed corpora of the secure-aggregation
 * fuzz targets into DIR/secagg_<what>/: each worker's advert, share batch,
 * confirmation and reveal from the targets' own round fixture (so they
 * are valid there), and a near miss of each:
 *   build/fuzz/gen/secagg_corpus tests/fuzz/corpus
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "tests/fuzz/secagg_common.h"

static const char *out_dir;

static void
put(const char *target, const char *name, const uint8_t *head, size_t head_len,
    const uint8_t *p, size_t n)
{
	char path[1024];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) != 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	if ((fp = fopen(path, "wb")) == NULL ||
	    fwrite(head, 1, head_len, fp) != head_len ||
	    fwrite(p, 1, n, fp) != n || fclose(fp) != 0) {
		perror(path);
		exit(1);
	}
}

int
main(int argc, char **argv)
{
	const sa_fixture *f;
	uint8_t buf[SA_REVEAL];
	char name[32];

	if (argc != 2) {
		fprintf(stderr, "usage: secagg_corpus DIR\n");
		return 2;
	}
	out_dir = argv[1];
	f = sa_setup();
	for (uint32_t i = 0; i < SA_N; i++) {
		uint8_t sel[2] = {(uint8_t)i, (uint8_t)(i & 1)};
		snprintf(name, sizeof(name), "valid%u", i);
		put("secagg_advert", name, NULL, 0, f->adv[i],
		    FB_SECAGG_ADV_LEN);
		put("secagg_shares", name, sel, 1, f->batch[i], SA_BATCH);
		put("secagg_confirm", name, NULL, 0, f->confirm[i],
		    FB_SECAGG_CONFIRM_LEN);
		put("secagg_reveal", name, sel, 2, f->reveal[i],
		    f->reveal_len[i]);
	}
	/* near misses: a signature bit, a set hash bit, a cut batch, and a
	 * share value that no longer lies on the polynomial */
	memcpy(buf, f->adv[1], FB_SECAGG_ADV_LEN);
	buf[150] ^= 1;
	put("secagg_advert", "badsig", NULL, 0, buf, FB_SECAGG_ADV_LEN);
	memcpy(buf, f->confirm[2], FB_SECAGG_CONFIRM_LEN);
	buf[40] ^= 1;
	put("secagg_confirm", "otherset", NULL, 0, buf, FB_SECAGG_CONFIRM_LEN);
	{
		uint8_t sel = 1;
		put("secagg_shares", "cut", &sel, 1, f->batch[1],
		    SA_BATCH - FB_SECAGG_SHARE_MSG_LEN);
	}
	{
		uint8_t sel[2] = {2, 1};
		memcpy(buf, f->reveal[2], f->reveal_len[2]);
		/* entry 0's y[0] (low byte), LE64 at 32 + 8 + 4 */
		buf[FB_SECAGG_REVEAL_HEADER_LEN + 12] ^= 1;
		put("secagg_reveal", "offcurve", sel, 2, buf, f->reveal_len[2]);
	}
	return 0;
}
