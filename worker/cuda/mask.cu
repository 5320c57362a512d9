/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask.cu -- the secure-aggregation mask kernel: ChaCha20 (RFC 8439: 20
 * rounds, 32-bit block counter, 96-bit nonce) keystream of every term of
 * a call, added to or subtracted from a uint32 vector in one pass, so that
 * the keystream lives only in registers.
 *
 * One thread makes one 64-byte block position j: it loads the 16 vector
 * words of block j, computes block `block0 + j` of each term's stream in
 * turn and adds or subtracts it word by word (mod 2^32), then stores the
 * 16 words. ChaCha20 writes each output word little-endian, and the GPU
 * is little-endian, so word w of a block is element 16 j + w of the mask,
 * as crypto/crypto.h defines PRG(seed, role, round): the same values as
 * libsodium's crypto_stream_chacha20_ietf_xor_ic on zeros. Rotations by 16
 * and 8 are byte permutes, by 12 and 7 funnel shifts. The block code is
 * __host__ __device__, so that it also compiles for the host.
 *
 * The work is compute-bound (about 1,000 integer operations per block and
 * term); memory is touched once, with 16-byte accesses for whole blocks.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_impl.h"

#define MASK_THREADS 256

/* "expand 32-byte k" */
#define SIGMA0 0x61707865u
#define SIGMA1 0x3320646eu
#define SIGMA2 0x79622d32u
#define SIGMA3 0x6b206574u

/* The rotations, by byte permutes and funnel shifts on the GPU. Host
 * versions exist so that the same block code can be compiled and checked
 * on a machine without a GPU. */
#ifdef __CUDA_ARCH__
#define ROTL16(x) __byte_perm((x), 0, 0x1032)
#define ROTL8(x) __byte_perm((x), 0, 0x2103)
#define ROTL(x, n) __funnelshift_l((x), (x), (n))
#define LOAD(p) __ldg(p)
#define UNROLL _Pragma("unroll")
#define UNROLL2 _Pragma("unroll 2")
#else
#define ROTL(x, n) ((uint32_t)((x) << (n)) | ((x) >> (32 - (n))))
#define ROTL16(x) ROTL(x, 16)
#define ROTL8(x) ROTL(x, 8)
#define LOAD(p) (*(p))
#define UNROLL
#define UNROLL2
#endif

__host__ __device__ __forceinline__ void
quarter(uint32_t &a, uint32_t &b, uint32_t &c, uint32_t &d)
{
	a += b;
	d ^= a;
	d = ROTL16(d);
	c += d;
	b ^= c;
	b = ROTL(b, 12);
	a += b;
	d ^= a;
	d = ROTL8(d);
	c += d;
	b ^= c;
	b = ROTL(b, 7);
}

/* ks = ChaCha20 block `ctr` of term k (state after 20 rounds plus the
 * input state, word by word). */
__host__ __device__ __forceinline__ void
chacha_block(const fb_cuda_mask_key *__restrict__ k, uint32_t ctr,
    uint32_t ks[16])
{
	const uint32_t k0 = LOAD(&k->key[0]), k1 = LOAD(&k->key[1]);
	const uint32_t k2 = LOAD(&k->key[2]), k3 = LOAD(&k->key[3]);
	const uint32_t k4 = LOAD(&k->key[4]), k5 = LOAD(&k->key[5]);
	const uint32_t k6 = LOAD(&k->key[6]), k7 = LOAD(&k->key[7]);
	const uint32_t n0 = LOAD(&k->nonce[0]), n1 = LOAD(&k->nonce[1]);
	const uint32_t n2 = LOAD(&k->nonce[2]);
	uint32_t x0 = SIGMA0, x1 = SIGMA1, x2 = SIGMA2, x3 = SIGMA3;
	uint32_t x4 = k0, x5 = k1, x6 = k2, x7 = k3;
	uint32_t x8 = k4, x9 = k5, x10 = k6, x11 = k7;
	uint32_t x12 = ctr, x13 = n0, x14 = n1, x15 = n2;

UNROLL2
	for (int i = 0; i < 10; i++) {
		/* columns */
		quarter(x0, x4, x8, x12);
		quarter(x1, x5, x9, x13);
		quarter(x2, x6, x10, x14);
		quarter(x3, x7, x11, x15);
		/* diagonals */
		quarter(x0, x5, x10, x15);
		quarter(x1, x6, x11, x12);
		quarter(x2, x7, x8, x13);
		quarter(x3, x4, x9, x14);
	}
	ks[0] = x0 + SIGMA0;
	ks[1] = x1 + SIGMA1;
	ks[2] = x2 + SIGMA2;
	ks[3] = x3 + SIGMA3;
	ks[4] = x4 + k0;
	ks[5] = x5 + k1;
	ks[6] = x6 + k2;
	ks[7] = x7 + k3;
	ks[8] = x8 + k4;
	ks[9] = x9 + k5;
	ks[10] = x10 + k6;
	ks[11] = x11 + k7;
	ks[12] = x12 + ctr;
	ks[13] = x13 + n0;
	ks[14] = x14 + n1;
	ks[15] = x15 + n2;
}

/*
 * mask_block is one thread's work: block position j of d, whose range is
 * d[lo .. hi) (lo < 16); block j covers d[16 j .. 16 j + 16) and is ChaCha20
 * block block0 + j. Words outside the range are neither read nor written.
 */
__host__ __device__ __forceinline__ void
mask_block(uint32_t *__restrict__ d, uint64_t lo, uint64_t hi, uint64_t j,
    uint32_t block0, const fb_cuda_mask_key *__restrict__ keys,
    uint32_t nkeys)
{
	uint64_t base = 16 * j;
	int whole = base >= lo && base + 16 <= hi;
	uint32_t acc[16];
	uint32_t ctr = block0 + (uint32_t)j;

	if (whole) {
#ifdef __CUDA_ARCH__
		const uint4 *p = (const uint4 *)(d + base);
UNROLL
		for (int q = 0; q < 4; q++) {
			uint4 t = p[q];
			acc[4 * q] = t.x;
			acc[4 * q + 1] = t.y;
			acc[4 * q + 2] = t.z;
			acc[4 * q + 3] = t.w;
		}
#else
		for (int w = 0; w < 16; w++) {
			acc[w] = d[base + w];
		}
#endif
	} else {
UNROLL
		for (int w = 0; w < 16; w++) {
			uint64_t e = base + w;
			acc[w] = e >= lo && e < hi ? d[e] : 0u;
		}
	}
	for (uint32_t t = 0; t < nkeys; t++) {
		uint32_t ks[16];
		chacha_block(&keys[t], ctr, ks);
		if (LOAD(&keys[t].neg)) {
UNROLL
			for (int w = 0; w < 16; w++) {
				acc[w] -= ks[w];
			}
		} else {
UNROLL
			for (int w = 0; w < 16; w++) {
				acc[w] += ks[w];
			}
		}
	}
	if (whole) {
#ifdef __CUDA_ARCH__
		uint4 *p = (uint4 *)(d + base);
UNROLL
		for (int q = 0; q < 4; q++) {
			p[q] = make_uint4(acc[4 * q], acc[4 * q + 1],
			    acc[4 * q + 2], acc[4 * q + 3]);
		}
#else
		for (int w = 0; w < 16; w++) {
			d[base + w] = acc[w];
		}
#endif
	} else {
UNROLL
		for (int w = 0; w < 16; w++) {
			uint64_t e = base + w;
			if (e >= lo && e < hi) {
				d[e] = acc[w];
			}
		}
	}
}

__global__ void __launch_bounds__(MASK_THREADS)
mask_kernel(uint32_t *__restrict__ d, uint64_t lo, uint64_t hi,
    uint64_t nblocks, uint32_t block0,
    const fb_cuda_mask_key *__restrict__ keys, uint32_t nkeys)
{
	for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
	     j < nblocks; j += (uint64_t)gridDim.x * blockDim.x) {
		mask_block(d, lo, hi, j, block0, keys, nkeys);
	}
}

extern "C" cudaError_t
fb_cuda_mask_expand(uint32_t *d, uint32_t head, uint64_t count,
    uint32_t block0, const fb_cuda_mask_key *keys, uint32_t nkeys,
    cudaStream_t s)
{
	uint64_t nblocks = ((uint64_t)head + count + 15) / 16;
	uint64_t grid = (nblocks + MASK_THREADS - 1) / MASK_THREADS;

	if (count == 0 || nkeys == 0) {
		return cudaSuccess;
	}
	/* Grid-stride beyond this: an H200 holds about 132 x 8 such blocks
	 * at once, so this is many waves already. */
	if (grid > 132u * 64u) {
		grid = 132u * 64u;
	}
	mask_kernel<<<(unsigned)grid, MASK_THREADS, 0, s>>>(d, head,
	    (uint64_t)head + count, nblocks, block0, keys, nkeys);
	return cudaGetLastError();
}
