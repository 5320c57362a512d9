/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto_sealed.c -- libFuzzer target: a sealed frame 0 on the coordinator's
 * session of the fixture (fuzz_common.h): fb_secure_sender, then
 * fb_secure_open, which authenticates and decrypts in place and decodes the
 * Envelope inside.
 *
 * Input layout:
 *   byte 0      selector
 *                 bit 0: 0 = RAW: the rest is a sealed frame as received
 *                        1 = SEAL: the target seals the rest itself
 *                 bit 1: a payload frame is present
 *                 bit 2: RAW only: sequence number 1 was already seen
 *   [byte 1]    with bit 1: payload length P; the payload is the last
 *               min(P, what is left) bytes of the input
 *   RAW:  the sealed frame 0 body (what follows the 4-byte prefix:
 *         header || ciphertext || MAC)
 *   SEAL: type (1 byte, as written into the sealed header), round (4 bytes
 *         little-endian, idem), then the Envelope bytes, which the target
 *         seals on the worker's session with sequence number 1 exactly as
 *         fb_secure_send does and opens at once. Random mutations never
 *         keep a MAC valid, so this is the mode that reaches
 *         fb_msg_unpack_envelope and the type/round checks behind the MAC.
 *
 * Sequence numbers are reset per input so that runs are reproducible. In
 * SEAL mode the outcome is predicted independently (decode the same bytes
 * with fb_msg_unpack_envelope, then compare type and round as secure.c's
 * contract says) and must match; the opened body must be wiped.
 */
#include "common/log.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/proto_check.h"

#define SEL_SEAL 1u
#define SEL_PAYLOAD 2u
#define SEL_SEEN1 4u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The round a message is about, or FB_ROUND_ANY (proto.h's contract). */
static uint32_t
round_of(const fb_msg *m)
{
	switch (m->type) {
	case FB_MSG_ROUND_START:
		return m->u.round_start.round;
	case FB_MSG_MODEL_FETCH:
		return m->u.model_fetch.round;
	case FB_MSG_MODEL_CHUNK:
		return m->u.model_chunk.round;
	case FB_MSG_UPDATE_BEGIN:
		return m->u.update_begin.round;
	case FB_MSG_UPDATE_CHUNK:
		return m->u.update_chunk.round;
	case FB_MSG_UPDATE_END:
		return m->u.update_end.round;
	case FB_MSG_ROUND_CANCEL:
		return m->u.round_cancel.round;
	case FB_MSG_ROUND_FAILED:
		return m->u.round_failed.round;
	case FB_MSG_UPDATE_CREDIT:
		return m->u.update_credit.round;
	case FB_MSG_SECAGG:
		return m->u.secagg.round;
	default:
		return FB_ROUND_ANY;
	}
}

static bool
all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] != 0) {
			return false;
		}
	}
	return true;
}

/* Outcome checks that hold in both modes. */
static void
check_open(const fb_frame *f, fb_err rc, int reject, const char *why,
    fb_err src, uint32_t sender)
{
	fb_msg_info info;

	if ((rc == FB_OK) != (reject == FB_REJECT_NONE) ||
	    (rc != FB_OK && why == NULL) || reject < 0 ||
	    reject >= FB_REJECT_COUNT_) {
		abort();
	}
	if (rc != FB_OK) {
		return;
	}
	/* Accepted: the clear header was readable and named our worker, the
	 * body was wiped after decoding, the message is well formed. */
	if (src != FB_OK || sender != FZ_WORKER_ID ||
	    fb_msg_peek(f->sealed_data, f->sealed_len, &info) != FB_OK ||
	    info.type != (uint8_t)f->msg.type ||
	    (round_of(&f->msg) != FB_ROUND_ANY &&
	        round_of(&f->msg) != info.round) ||
	    !all_zero(f->sealed_data + FB_MSG_HEADER_LEN,
	        f->sealed_len - FB_MSG_OVERHEAD)) {
		abort();
	}
	pc_check_msg(&f->msg, f->payload != NULL);
}

static void
run_raw(const fz_fixture *fx, fb_frame *f, uint8_t sel)
{
	fb_msg_info info;
	uint32_t sender = 0xdeadbeef;
	int reject = -1;
	const char *why = NULL;
	fb_err src, rc;

	fx->coord_s->recv_seq = (sel & SEL_SEEN1) ? 1 : 0;
	src = fb_secure_sender(f, &sender);
	if (src == FB_OK) {
		if (fb_msg_peek(f->sealed_data, f->sealed_len, &info) !=
		        FB_OK ||
		    info.sender != sender) {
			abort();
		}
	} else if (src != FB_EPROTO || sender != 0) {
		abort();
	}
	rc = fb_secure_open(fx->coord_s, f, &reject, &why);
	check_open(f, rc, reject, why, src, sender);
}

static void
run_seal(const fz_fixture *fx, fb_frame *f, uint8_t *in, size_t n)
{
	static fb_msg want;
	const char *why = NULL, *want_why = NULL;
	uint8_t type;
	uint32_t round, sender = 0;
	uint8_t *body, *sealed;
	size_t body_len, sealed_len = 0;
	int reject = -1;
	fb_err src, rc, want_rc;

	if (n < 5) {
		return;
	}
	type = in[0];
	round = (uint32_t)in[1] | (uint32_t)in[2] << 8 |
	    (uint32_t)in[3] << 16 | (uint32_t)in[4] << 24;
	body = in + 5; /* never written by the target or the seal */
	body_len = n - 5;

	/* Seal as fb_secure_send does, into an exact-size mutable buffer. */
	sealed = malloc(body_len + FB_MSG_OVERHEAD);
	if (sealed == NULL) {
		return;
	}
	fx->worker_s->send_seq = 0;
	fx->coord_s->recv_seq = 0;
	if (fb_msg_seal(fx->worker_s, type, round, body, body_len, sealed,
	        body_len + FB_MSG_OVERHEAD, &sealed_len) != FB_OK ||
	    sealed_len != body_len + FB_MSG_OVERHEAD) {
		abort();
	}
	f->sealed_data = sealed;
	f->sealed_len = sealed_len;

	/* The independent prediction. */
	want_rc = fb_msg_unpack_envelope(
	    body, body_len, f->payload != NULL, &want, &want_why);

	src = fb_secure_sender(f, &sender);
	rc = fb_secure_open(fx->coord_s, f, &reject, &why);
	check_open(f, rc, reject, why, src, sender);
	if (src != FB_OK || sender != FZ_WORKER_ID ||
	    !all_zero(sealed + FB_MSG_HEADER_LEN, body_len)) {
		abort();
	}
	if (want_rc != FB_OK || want.type != (fb_msg_type)type) {
		if (rc != FB_EPROTO || reject != FB_REJECT_MALFORMED) {
			abort();
		}
	} else if (round_of(&want) != FB_ROUND_ANY &&
	    round_of(&want) != round) {
		if (rc != FB_ESTALE || reject != FB_REJECT_WRONG_ROUND) {
			abort();
		}
	} else if (want.type == FB_MSG_SECAGG ||
	    want.type == FB_MSG_WELCOME) {
		/* Their payload must be a message sealed right after the
		 * envelope (secure.c's payload_sealed); the fuzzer's bytes
		 * cannot be one. */
		if (rc == FB_OK) {
			abort();
		}
	} else if (rc != FB_OK || memcmp(&want, &f->msg, sizeof(want)) != 0) {
		abort();
	}
	free(sealed);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const fz_fixture *fx = fz_setup();
	static int init;
	uint8_t sel, *copy = NULL, *pay = NULL;
	size_t plen = 0;
	fb_frame f;

	if (!init) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		init = 1;
	}
	if (size < 1) {
		return 0;
	}
	sel = data[0];
	data++;
	size--;
	if (sel & SEL_PAYLOAD) {
		if (size < 1) {
			return 0;
		}
		plen = data[0];
		data++;
		size--;
		if (plen > size) {
			plen = size;
		}
		size -= plen;
		pay = malloc(plen > 0 ? plen : 1);
		if (pay == NULL) {
			return 0;
		}
		if (plen > 0) {
			memcpy(pay, data + size, plen);
		}
	}
	copy = malloc(size > 0 ? size : 1); /* exact size, mutable */
	if (copy == NULL) {
		free(pay);
		return 0;
	}
	if (size > 0) {
		memcpy(copy, data, size);
	}
	memset(&f, 0, sizeof(f));
	f.sealed = true;
	f.sealed_data = copy;
	f.sealed_len = size;
	f.payload = pay;
	f.payload_len = plen;
	memset(&f.msg, 0xa5, sizeof(f.msg)); /* open must reset it */
	if (sel & SEL_SEAL) {
		run_seal(fx, &f, copy, size);
	} else {
		run_raw(fx, &f, sel);
	}
	free(copy);
	free(pay);
	return 0;
}
