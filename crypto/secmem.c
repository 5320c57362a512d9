/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secmem.c -- memory for the secrets a round makes and drops: stream
 * keys, secure-aggregation key pairs, seeds and shares, handshake
 * temporaries.
 *
 * They used to be sodium_malloc'd one by one. Each sodium_malloc maps
 * fresh pages with guard pages around them and locks them, and each
 * sodium_free changes their protection back and unmaps them: a few
 * hundred mmap, mprotect and munmap calls a secure round, each a TLB
 * shootdown across the process's threads. libsodium documents it as
 * slow, for a few long-lived secrets. On the 2-vCPU development VM they
 * cost 14-32% of a 1e5-parameter model's secure round (bench/RESULTS.md).
 *
 * Here, blocks of 64 bytes to FB_SECMEM_MAX come from arenas that are
 * themselves sodium_malloc'd (locked, so never swapped; kept out of core
 * dumps; guard pages at the arena's ends), in power-of-two classes, each
 * block 64-byte aligned. A freed block is wiped at once and kept on its
 * class's list for the next allocation; arenas are never given back.
 * Larger blocks, and every block under AddressSanitizer (whose checks see
 * sodium_malloc's pages but not an arena's insides), are sodium_malloc'd
 * as before. What is given up is a guard page after each small secret:
 * an overrun of one now reaches its neighbour in the arena instead of a
 * fault.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "crypto/crypto_impl.h"

#define HEAD 64     /* a block's header (its class): keeps 64-alignment */
#define MIN_SHIFT 6 /* 64 bytes, the smallest block */
#define CLASSES 11  /* 64 B .. 64 KiB, header included */
#define ARENA_BYTES (1u << 20) /* an arena, carved as blocks are asked for */
#define BIG 0xffu              /* header mark: sodium_malloc'd on its own */

#if defined(__SANITIZE_ADDRESS__)
#define SECMEM_DIRECT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SECMEM_DIRECT 1
#endif
#endif
#ifndef SECMEM_DIRECT
#define SECMEM_DIRECT 0
#endif

_Static_assert(((size_t)1 << (MIN_SHIFT + CLASSES - 1)) - HEAD == FB_SECMEM_MAX,
    "the largest class holds FB_SECMEM_MAX bytes");

typedef struct free_block {
	struct free_block *next;
} free_block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static free_block *free_list[CLASSES];
static uint8_t *arena;    /* the arena being carved */
static size_t arena_used; /* bytes of it carved */

/* The class whose blocks hold `len` bytes after the header. */
static unsigned
class_of(size_t len)
{
	unsigned c = 0;

	while (((size_t)1 << (MIN_SHIFT + c)) - HEAD < len) {
		c++;
	}
	return c;
}

void *
fb_secmem_alloc(size_t len)
{
	uint8_t *b = NULL;
	unsigned c;

	if (SECMEM_DIRECT || len > FB_SECMEM_MAX) {
		/* a multiple of 64: sodium_malloc ends the block at a page's
		 * end, so its start is then 64-aligned too */
		if (len > SIZE_MAX - 2 * HEAD ||
		    (b = sodium_malloc(
		         HEAD + (len + HEAD - 1) / HEAD * HEAD)) == NULL) {
			return NULL;
		}
		b[0] = BIG;
		return b + HEAD;
	}
	c = class_of(len);
	pthread_mutex_lock(&mu);
	if (free_list[c] != NULL) {
		b = (uint8_t *)free_list[c];
		free_list[c] = free_list[c]->next;
	} else {
		size_t size = (size_t)1 << (MIN_SHIFT + c);
		if (arena == NULL || ARENA_BYTES - arena_used < size) {
			/* (what is left of the old arena stays unused: at most
			 * one block of the largest class) */
			arena = sodium_malloc(ARENA_BYTES);
			arena_used = 0;
		}
		if (arena != NULL) {
			b = arena + arena_used;
			arena_used += size;
		}
	}
	pthread_mutex_unlock(&mu);
	if (b == NULL) {
		return NULL;
	}
	b[0] = (uint8_t)c;
	return b + HEAD;
}

void
fb_secmem_free(void *p)
{
	uint8_t *b;
	unsigned c;

	if (p == NULL) {
		return;
	}
	b = (uint8_t *)p - HEAD;
	c = b[0];
	if (c == BIG) {
		sodium_free(b); /* wipes */
		return;
	}
	sodium_memzero(b, (size_t)1 << (MIN_SHIFT + c));
	pthread_mutex_lock(&mu);
	((free_block *)b)->next = free_list[c];
	free_list[c] = (free_block *)b;
	pthread_mutex_unlock(&mu);
	/* (b[0], now the list's link, says nothing: it is read again only
	 * after the block is handed out, with its class written anew) */
}
