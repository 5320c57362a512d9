/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash.c -- BLAKE2b-256 for what is not a protocol message: checksums of
 * files the programs write and read back (the coordinator's checkpoint).
 */
#include "crypto/crypto_impl.h"

void
fb_hash(const void *data, size_t len, uint8_t out[FB_HASH_LEN])
{
	crypto_generichash(out, FB_HASH_LEN, data, len, NULL, 0);
}
