/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secure.c -- sealed frames: an Envelope sealed under a session key
 * (crypto/), behind the 4-byte prefix with the SEALED flag. The sealed
 * header carries run id, round, sender and sequence number in the clear but
 * authenticated, so replays, reordering and cross-round or cross-run reuse
 * are refused before anything is decoded.
 *
 * Payload frames of model and update chunks are secretstream ciphertext
 * already (crypto/stream.c) and travel as they are. The payload of a
 * secure-aggregation message (key adverts, relayed shares, reveals) is
 * sealed as a second message of the same session right after the envelope
 * (type | PAYLOAD_TYPE_BIT, the same round, the next sequence number), so
 * it is secret, authentic, and bound to its envelope. A welcome's payload,
 * the model's layout, is sealed the same way.
 */
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "proto/proto.h"

#define PAYLOAD_TYPE_BIT 0x80

static bool
payload_sealed(fb_msg_type t)
{
	return t == FB_MSG_SECAGG || t == FB_MSG_WELCOME;
}

/* The round a message is about, or FB_ROUND_ANY for session messages. */
static uint32_t
msg_round(const fb_msg *m)
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

fb_err
fb_secure_send(fb_link *l, const fb_peer *peer, struct fb_session *s,
    uint32_t round, const fb_msg *m, const void *payload, size_t payload_len)
{
	return fb_secure_send_from(l, peer, s, round, m, payload, payload_len,
	    NULL);
}

fb_err
fb_secure_send_from(fb_link *l, const fb_peer *peer, struct fb_session *s,
    uint32_t round, const fb_msg *m, const void *payload, size_t payload_len,
    fb_lent *origin)
{
	uint8_t env[FB_MAX_CONTROL_LEN];
	uint8_t out[FB_MAX_CONTROL_LEN + FB_MSG_OVERHEAD + FB_WIRE_PREFIX_LEN];
	size_t env_len = 0, sealed_len = 0;
	bool with_payload = fb_msg_has_payload(m->type);
	fb_err rc;

	if ((rc = fb_msg_pack_envelope(m, env, sizeof(env), &env_len)) !=
	    FB_OK) {
		return rc;
	}
	rc = fb_msg_seal(s, (uint8_t)m->type, round, env, env_len,
	    out + FB_WIRE_PREFIX_LEN, sizeof(out) - FB_WIRE_PREFIX_LEN,
	    &sealed_len);
	fb_wipe(env, env_len);
	if (rc != FB_OK) {
		return rc;
	}
	out[0] = 'F';
	out[1] = 'B';
	out[2] = 1;
	out[3] = FB_WIRE_SEALED | (with_payload ? FB_WIRE_PAYLOAD : 0);
	if (payload_sealed(m->type)) {
		size_t plen = 0, cap = payload_len + FB_MSG_OVERHEAD;
		uint8_t *p = malloc(cap);
		if (p == NULL) {
			return FB_ENOMEM;
		}
		rc = fb_msg_seal(s, (uint8_t)(m->type | PAYLOAD_TYPE_BIT), round,
		    payload != NULL ? payload : (const void *)"", payload_len, p,
		    cap, &plen);
		if (rc == FB_OK) {
			rc = fb_link_send_raw(l, peer, out,
			    sealed_len + FB_WIRE_PREFIX_LEN, p, plen);
		}
		free(p);
		return rc;
	}
	return fb_link_send_raw_from(l, peer, out,
	    sealed_len + FB_WIRE_PREFIX_LEN,
	    with_payload ? (payload != NULL ? payload : "") : NULL,
	    with_payload ? payload_len : 0, payload != NULL ? origin : NULL);
}

fb_err
fb_secure_sender(const fb_frame *f, uint32_t *sender)
{
	fb_msg_info info;
	*sender = 0;
	if (!f->sealed || fb_msg_peek(f->sealed_data, f->sealed_len, &info) !=
	        FB_OK) {
		return FB_EPROTO;
	}
	*sender = info.sender;
	return FB_OK;
}

fb_err
fb_secure_open(struct fb_session *s, fb_frame *f, int *reject,
    const char **why)
{
	fb_msg_info info;
	fb_reject r = FB_REJECT_NONE;
	size_t body_len = 0;
	fb_err rc;

	*reject = FB_REJECT_NONE;
	*why = NULL;
	memset(&f->msg, 0, sizeof(f->msg));
	if (!f->sealed || f->sealed_len < FB_MSG_OVERHEAD) {
		*reject = FB_REJECT_MALFORMED;
		*why = "sealed frame too short";
		return FB_EPROTO;
	}
	rc = fb_msg_open(s, FB_ROUND_ANY, f->sealed_data, f->sealed_len,
	    f->sealed_data + FB_MSG_HEADER_LEN,
	    f->sealed_len - FB_MSG_HEADER_LEN, &body_len, &info, &r);
	if (rc != FB_OK) {
		*reject = (int)r;
		*why = fb_reject_name(r);
		return rc;
	}
	rc = fb_msg_unpack_envelope(f->sealed_data + FB_MSG_HEADER_LEN,
	    body_len, f->payload != NULL, &f->msg, why);
	fb_wipe(f->sealed_data + FB_MSG_HEADER_LEN, body_len);
	if (rc != FB_OK) {
		*reject = FB_REJECT_MALFORMED;
		return rc;
	}
	if (info.type != (uint8_t)f->msg.type) {
		*reject = FB_REJECT_MALFORMED;
		*why = "sealed type differs from the message";
		rc = FB_EPROTO;
	} else if (msg_round(&f->msg) != FB_ROUND_ANY &&
	    msg_round(&f->msg) != info.round) {
		*reject = FB_REJECT_WRONG_ROUND;
		*why = "sealed round differs from the message's";
		rc = FB_ESTALE;
	}
	if (rc == FB_OK && payload_sealed(f->msg.type)) {
		fb_msg_info pinfo;
		size_t plen = 0;
		if (f->payload == NULL || f->payload_len < FB_MSG_OVERHEAD) {
			*reject = FB_REJECT_MALFORMED;
			*why = "sealed payload missing or too short";
			rc = FB_EPROTO;
		} else if ((rc = fb_msg_open(s, info.round, f->payload,
		                f->payload_len, f->payload + FB_MSG_HEADER_LEN,
		                f->payload_len - FB_MSG_HEADER_LEN, &plen, &pinfo,
		                &r)) != FB_OK) {
			*reject = (int)r;
			*why = fb_reject_name(r);
		} else if (pinfo.type != (uint8_t)(info.type | PAYLOAD_TYPE_BIT) ||
		    pinfo.seq != info.seq + 1) {
			fb_wipe(f->payload + FB_MSG_HEADER_LEN, plen);
			*reject = FB_REJECT_MALFORMED;
			*why = "sealed payload does not belong to its message";
			rc = FB_EPROTO;
		} else {
			f->payload += FB_MSG_HEADER_LEN;
			f->payload_len = plen;
		}
	}
	if (rc != FB_OK) {
		memset(&f->msg, 0, sizeof(f->msg));
	}
	return rc;
}
