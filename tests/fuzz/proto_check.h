/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto_check.h -- invariants of a decoded fb_msg, shared by the proto/
 * fuzz targets. A message that fb_msg_unpack or fb_msg_unpack_envelope
 * accepted must be one the rest of the program can trust without checking
 * again (type in range, every string NUL-terminated inside its field and
 * free of control bytes, blobs and hidden sizes within their arrays, the
 * payload flag matching the type), and it must survive pack -> unpack
 * unchanged, with a canonical encoding (packing the re-decoded message
 * gives the same bytes). Any violation abort()s, which libFuzzer reports.
 *
 * Static functions only: each target includes it once.
 */
#ifndef FB_TESTS_FUZZ_PROTO_CHECK_H
#define FB_TESTS_FUZZ_PROTO_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

static void
pc_text(const char *s, size_t cap)
{
	const char *nul = memchr(s, '\0', cap);
	if (nul == NULL) {
		abort();
	}
	for (const char *p = s; p < nul; p++) {
		if ((unsigned char)*p < 0x20 || *p == 0x7f) {
			abort();
		}
	}
}

#define PC_TEXT(field) pc_text((field), sizeof(field))

static void
pc_blob(const fb_blob *b)
{
	if (b->len > FB_BLOB_MAX) {
		abort();
	}
}

/* pc_fields checks the per-type invariants of an accepted message. */
static void
pc_fields(const fb_msg *m, bool with_payload)
{
	if (m->type <= FB_MSG_NONE || m->type >= FB_MSG_TYPE_COUNT_) {
		abort();
	}
	if (fb_msg_has_payload(m->type) != with_payload) {
		abort();
	}
	switch (m->type) {
	case FB_MSG_HELLO:
		PC_TEXT(m->u.hello.name);
		PC_TEXT(m->u.hello.backend);
		PC_TEXT(m->u.hello.software);
		break;
	case FB_MSG_WELCOME:
		PC_TEXT(m->u.welcome.model.arch);
		PC_TEXT(m->u.welcome.model.plugin);
		if (m->u.welcome.model.hidden_count > FB_PROTO_MAX_HIDDEN) {
			abort();
		}
		break;
	case FB_MSG_REJECT:
		PC_TEXT(m->u.reject.reason);
		break;
	case FB_MSG_ROUND_START:
		pc_blob(&m->u.round_start.round_key);
		pc_blob(&m->u.round_start.stream_header);
		pc_blob(&m->u.round_start.stream_trailer);
		break;
	case FB_MSG_UPDATE_BEGIN:
		PC_TEXT(m->u.update_begin.backend);
		pc_blob(&m->u.update_begin.stream_key);
		pc_blob(&m->u.update_begin.stream_header);
		break;
	case FB_MSG_UPDATE_END:
		pc_blob(&m->u.update_end.stream_trailer);
		break;
	case FB_MSG_HANDSHAKE:
		pc_blob(&m->u.handshake.data);
		break;
	case FB_MSG_ROUND_CANCEL:
		PC_TEXT(m->u.round_cancel.reason);
		break;
	case FB_MSG_SHUTDOWN:
		PC_TEXT(m->u.shutdown.reason);
		break;
	default:
		break;
	}
	(void)fb_msg_type_name(m->type);
}

/*
 * pc_check_msg checks an accepted message `m` (decoded with payload flag
 * `with_payload`): its fields, then both encodings (with prefix and bare
 * envelope) re-decode to an identical struct and re-encode to the same
 * bytes. Messages are compared with memcmp: both sides were decoded by
 * the same code into zeroed structs, so even padding and the bytes after
 * each string's NUL must agree (floats compare bitwise, NaN included).
 */
static void
pc_check_msg(const fb_msg *m, bool with_payload)
{
	static uint8_t a[FB_MAX_CONTROL_LEN], b[FB_MAX_CONTROL_LEN];
	static fb_msg m2, m3;
	size_t alen = 0, blen = 0;
	const char *why = NULL;

	pc_fields(m, with_payload);

	/* Frame 0 with its prefix. */
	if (fb_msg_pack(m, a, sizeof(a), &alen) != FB_OK ||
	    alen < FB_WIRE_PREFIX_LEN || alen > FB_MAX_CONTROL_LEN) {
		abort();
	}
	if (((a[3] & FB_WIRE_PAYLOAD) != 0) != with_payload ||
	    (a[3] & FB_WIRE_SEALED) != 0) {
		abort();
	}
	if (fb_msg_unpack(a, alen, &m2, &why) != FB_OK) {
		abort();
	}
	if (memcmp(m, &m2, sizeof(m2)) != 0) {
		abort();
	}
	if (fb_msg_pack(&m2, b, sizeof(b), &blen) != FB_OK || blen != alen ||
	    memcmp(a, b, alen) != 0) {
		abort();
	}

	/* The bare envelope (what gets sealed) is the same bytes. */
	if (fb_msg_pack_envelope(m, b, sizeof(b), &blen) != FB_OK ||
	    blen + FB_WIRE_PREFIX_LEN != alen ||
	    memcmp(a + FB_WIRE_PREFIX_LEN, b, blen) != 0) {
		abort();
	}
	if (fb_msg_unpack_envelope(b, blen, with_payload, &m3, &why) !=
	        FB_OK ||
	    memcmp(m, &m3, sizeof(m3)) != 0) {
		abort();
	}
	/* The other payload flag must be refused. */
	if (fb_msg_unpack_envelope(b, blen, !with_payload, &m3, &why) !=
	        FB_EPROTO ||
	    why == NULL || m3.type != FB_MSG_NONE) {
		abort();
	}
}

/* pc_check_reject checks a refused decode: a reason, a zeroed message. */
static void
pc_check_reject(fb_err rc, const fb_msg *m, const char *why)
{
	static const fb_msg zero;
	if (rc != FB_EPROTO || why == NULL || why[0] == '\0' ||
	    memcmp(m, &zero, sizeof(zero)) != 0) {
		abort();
	}
}

#endif
