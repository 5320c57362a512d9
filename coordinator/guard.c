/* SPDX-License-Identifier: Apache-2.0 */
/*
 * guard.c -- what the coordinator does with messages it will not take.
 *
 * Every dropped message is counted by reason (metrics.jsonl's "rejected")
 * and logged at most once a second per reason, with the number left
 * unlogged. Reasons honest peers never cause count against the sender:
 * past RL_MAX_BAD in a window it is ignored for RL_BLOCK_MS, so a flood
 * costs one table lookup per message, not a decode, a MAC or a log line.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/coordinator_impl.h"

const char *const drop_names[DROP_REASON_COUNT_] = {
	"malformed", "unknown_peer", "stale_round", "unexpected",
	"out_of_order", "wrong_size", "non_finite", "version", "unknown_key",
	"bad_signature", "bad_mac", "replay", "wrong_run", "wrong_sender",
	"truncated", "wrong_identity", "not_sealed", "rate_limited",
};

/* Reasons that honest peers never cause: they count against the sender's
 * rate limit. (A late chunk from a slow honest worker is merely stale.) */
static bool
drop_is_hostile(drop_reason r)
{
	return r != DROP_STALE_ROUND && r != DROP_UNEXPECTED &&
	    r != DROP_RATE_LIMITED;
}

drop_reason
guard_reason_of_reject(int why)
{
	switch ((fb_reject)why) {
	case FB_REJECT_VERSION:
		return DROP_VERSION;
	case FB_REJECT_UNKNOWN_KEY:
	case FB_REJECT_UNPINNED_KEY:
		return DROP_UNKNOWN_KEY;
	case FB_REJECT_BAD_SIGNATURE:
		return DROP_BAD_SIGNATURE;
	case FB_REJECT_BAD_MAC:
		return DROP_BAD_MAC;
	case FB_REJECT_REPLAY:
		return DROP_REPLAY;
	case FB_REJECT_WRONG_RUN:
		return DROP_WRONG_RUN;
	case FB_REJECT_WRONG_ROUND:
		return DROP_STALE_ROUND;
	case FB_REJECT_WRONG_SENDER:
		return DROP_WRONG_SENDER;
	case FB_REJECT_TRUNCATED:
		return DROP_TRUNCATED;
	case FB_REJECT_TOO_LARGE:
		return DROP_WRONG_SIZE;
	default:
		return DROP_MALFORMED;
	}
}

static rl_entry *
rl_find(guard *g, const fb_peer *p, bool create)
{
	uint32_t h = 2166136261u;
	rl_entry *e;

	for (uint8_t i = 0; i < p->len; i++) {
		h = (h ^ p->id[i]) * 16777619u;
	}
	e = &g->rl[h % RL_SLOTS];
	if (fb_peer_equal(&e->peer, p)) {
		return e;
	}
	if (!create) {
		return NULL;
	}
	memset(e, 0, sizeof(*e));
	e->peer = *p;
	return e;
}

uint32_t
guard_bad_count(coord *c, const fb_peer *p)
{
	rl_entry *e = rl_find(&c->g, p, false);
	return e != NULL && c->now - e->window_ms <= RL_WINDOW_MS ? e->bad : 0;
}

bool
guard_blocked(coord *c, const fb_peer *p)
{
	rl_entry *e = rl_find(&c->g, p, false);
	return e != NULL && e->blocked_until_ms > c->now;
}

static void
rl_penalize(coord *c, const fb_peer *p)
{
	rl_entry *e = rl_find(&c->g, p, true);

	if (c->now - e->window_ms > RL_WINDOW_MS) {
		e->window_ms = c->now;
		e->bad = 0;
	}
	if (++e->bad > RL_MAX_BAD && e->blocked_until_ms <= c->now) {
		e->blocked_until_ms = c->now + RL_BLOCK_MS;
		fb_log_warn("peer sending bad messages (%u in %dms): ignoring "
		            "it for %ds",
		    e->bad, RL_WINDOW_MS, RL_BLOCK_MS / 1000);
	}
}

void
guard_drop(coord *c, drop_reason r, const char *fmt, ...)
{
	guard *g = &c->g;
	char text[512];
	va_list ap;

	g->drops[r]++;
	if (g->cur_peer != NULL && drop_is_hostile(r)) {
		rl_penalize(c, g->cur_peer);
	}
	if (g->logged_ms[r] != 0 && c->now - g->logged_ms[r] < 1000) {
		g->unlogged[r]++;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (g->unlogged[r] > 0) {
		fb_log_warn("dropped message (%s): %s [and %" PRIu64
		            " more of this kind]",
		    drop_names[r], text, g->unlogged[r]);
	} else {
		fb_log_warn("dropped message (%s): %s", drop_names[r], text);
	}
	g->unlogged[r] = 0;
	g->logged_ms[r] = c->now;
}
