/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker_proc_msg.c -- libFuzzer target: a message body from a trainer
 * process, as the worker reads it (worker/proc/wire.c): the type, then a
 * HELLO, a RESULT with its layout checked against a 784-32-10 MLP, or a
 * FAIL. Input: the body (the 4-byte length is io.c's and already checked).
 * A layout that passes must be exactly the model's; a refused one must
 * come with a reason; a FAIL's reason must be one printable line.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/model.h"
#include "worker/proc/proc_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fb_model *
mlp(void)
{
	static fb_model *m;
	fb_model_spec s;

	if (m == NULL) {
		memset(&s, 0, sizeof(s));
		strcpy(s.arch, "mlp");
		s.input_dim = 784;
		s.classes = 10;
		s.hidden[0] = 32;
		s.hidden_count = 1;
		if (fb_model_open(&s, &m) != FB_OK) {
			abort();
		}
	}
	return m;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	uint8_t *copy;
	fb_proc_rd r;
	uint32_t type;
	char why[512];

	if (!init) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		init = 1;
	}
	copy = malloc(size > 0 ? size : 1); /* exact size: ASan sees overreads */
	if (copy == NULL) {
		return 0;
	}
	if (size > 0) {
		memcpy(copy, data, size);
	}
	if (fb_proc_msg_type(copy, size, &r, &type) != FB_OK) {
		if (size >= 4) {
			abort();
		}
		goto out;
	}
	if (type == FB_PROC_HELLO) {
		fb_proc_hello h;
		if (fb_proc_hello_unpack(&r, &h) == FB_OK && size != 60) {
			abort(); /* a hello has exactly one size */
		}
	} else if (type == FB_PROC_RESULT) {
		fb_proc_result res;
		if (fb_proc_result_unpack(&r, &res) != FB_OK) {
			goto out;
		}
		if (fb_proc_layout_check(&res.layout, mlp(), why, sizeof(why)) ==
		    FB_OK) {
			/* Accepted: byte for byte the model's own table. */
			fb_proc_buf b = {0};
			fb_proc_layout_pack(&b, mlp());
			if (b.oom || b.len != size - 60 ||
			    memcmp(b.p, copy + 60, b.len) != 0) {
				abort();
			}
			fb_proc_buf_fini(&b);
		} else if (why[0] == '\0') {
			abort();
		}
	} else if (type == FB_PROC_FAIL) {
		uint64_t id;
		bool fatal;
		char reason[64];
		if (fb_proc_fail_unpack(&r, &id, &fatal, reason,
		        sizeof(reason)) == FB_OK) {
			for (char *p = reason; *p != '\0'; p++) {
				if ((unsigned char)*p < 0x20 || *p == 0x7f) {
					abort();
				}
			}
		}
	}
out:
	free(copy);
	return 0;
}
