/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels.cu -- the CUDA backend's own kernels: batch gather, bias + ReLU,
 * ReLU backward, softmax cross-entropy and squared error (each forward and
 * backward in one pass), a deterministic loss reduction, the
 * SGD/momentum/weight-decay update, a replica checksum and a timestamp
 * (profiling the all-reduce). The matrix products are cuBLAS's
 * (backend.c).
 *
 * All kernels are memory-bound; they use grid-stride loops, 16-byte
 * accesses where the shapes allow, and no atomics on floats, so that a
 * step is bitwise reproducible.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_impl.h"

#define THREADS 256

static unsigned
grid_for(size_t n, unsigned threads)
{
	size_t blocks = (n + threads - 1) / threads;
	/* Grid-stride loops: enough blocks to fill an H200 several times. */
	if (blocks > 132 * 16) {
		blocks = 132 * 16;
	}
	return blocks == 0 ? 1 : (unsigned)blocks;
}

/* One block per row; 16-byte copies when dim % 4 == 0. */
__global__ void
gather_kernel(const float *__restrict__ x, const uint32_t *__restrict__ y,
    const uint32_t *__restrict__ idx, const uint32_t *step, uint32_t stride,
    uint32_t off, uint32_t rows, uint32_t dim, float *__restrict__ xo,
    uint32_t *__restrict__ yo, int vec4)
{
	size_t base = step != NULL ? (size_t)*step * stride : 0;

	for (uint32_t r = blockIdx.x; r < rows; r += gridDim.x) {
		uint32_t e = idx[base + off + r];
		const float *src = x + (size_t)e * dim;
		float *dst = xo + (size_t)r * dim;

		if (vec4) {
			const float4 *s4 = (const float4 *)src;
			float4 *d4 = (float4 *)dst;
			for (uint32_t i = threadIdx.x; i < dim / 4;
			     i += blockDim.x) {
				d4[i] = s4[i];
			}
		} else {
			for (uint32_t i = threadIdx.x; i < dim;
			     i += blockDim.x) {
				dst[i] = src[i];
			}
		}
		if (threadIdx.x == 0) {
			yo[r] = y[e];
		}
	}
}

extern "C" cudaError_t
fb_cuda_gather(const float *x, const uint32_t *y, const uint32_t *idx,
    const uint32_t *step, uint32_t stride, uint32_t off, uint32_t rows,
    uint32_t dim, float *xo, uint32_t *yo, cudaStream_t s)
{
	int vec4 = dim % 4 == 0 && ((uintptr_t)x % 16) == 0 &&
	    ((uintptr_t)xo % 16) == 0;
	unsigned blocks = rows < 65535 ? rows : 65535;

	gather_kernel<<<blocks ? blocks : 1, 128, 0, s>>>(x, y, idx, step,
	    stride, off, rows, dim, xo, yo, vec4);
	return cudaGetLastError();
}

__global__ void
bias_act_kernel(float *__restrict__ z, const float *__restrict__ b,
    size_t n, uint32_t cols, int relu)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float v = z[i] + b[i % cols];
		z[i] = relu ? fmaxf(v, 0.0f) : v;
	}
}

/* cols % 4 == 0: each thread handles four consecutive columns. */
__global__ void
bias_act4_kernel(float4 *__restrict__ z, const float4 *__restrict__ b,
    size_t n4, uint32_t cols4, int relu)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
	     i += (size_t)gridDim.x * blockDim.x) {
		float4 v = z[i];
		float4 c = b[i % cols4];
		v.x += c.x;
		v.y += c.y;
		v.z += c.z;
		v.w += c.w;
		if (relu) {
			v.x = fmaxf(v.x, 0.0f);
			v.y = fmaxf(v.y, 0.0f);
			v.z = fmaxf(v.z, 0.0f);
			v.w = fmaxf(v.w, 0.0f);
		}
		z[i] = v;
	}
}

extern "C" cudaError_t
fb_cuda_bias_act(float *z, const float *b, uint32_t rows, uint32_t cols,
    int relu, cudaStream_t s)
{
	size_t n = (size_t)rows * cols;

	if (cols % 4 == 0 && (uintptr_t)z % 16 == 0 && (uintptr_t)b % 16 == 0) {
		bias_act4_kernel<<<grid_for(n / 4, THREADS), THREADS, 0, s>>>(
		    (float4 *)z, (const float4 *)b, n / 4, cols / 4, relu);
	} else {
		bias_act_kernel<<<grid_for(n, THREADS), THREADS, 0, s>>>(z, b,
		    n, cols, relu);
	}
	return cudaGetLastError();
}

__global__ void
relu_bwd_kernel(float *__restrict__ dz, const float *__restrict__ h, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		if (!(h[i] > 0.0f)) {
			dz[i] = 0.0f;
		}
	}
}

extern "C" cudaError_t
fb_cuda_relu_bwd(float *dz, const float *h, size_t count, cudaStream_t s)
{
	relu_bwd_kernel<<<grid_for(count, THREADS), THREADS, 0, s>>>(dz, h,
	    count);
	return cudaGetLastError();
}

__device__ static float
warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1) {
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	}
	return v;
}

__device__ static float
warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1) {
		v += __shfl_xor_sync(0xffffffffu, v, o);
	}
	return v;
}

/* One warp per row: max, sum of exp(z - max), then the gradient. */
__global__ void
softmax_xent_kernel(const float *__restrict__ logits,
    const int32_t *__restrict__ y, uint32_t rows, uint32_t classes,
    float scale, float *__restrict__ dlogits, float *__restrict__ rowloss)
{
	uint32_t lane = threadIdx.x & 31;
	uint32_t warps = (blockDim.x / 32) * gridDim.x;

	for (uint32_t r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
	     r < rows; r += warps) {
		const float *z = logits + (size_t)r * classes;
		float *dz = dlogits + (size_t)r * classes;
		uint32_t label = (uint32_t)y[r];
		float m = -INFINITY;
		float sum = 0.0f;

		for (uint32_t c = lane; c < classes; c += 32) {
			m = fmaxf(m, z[c]);
		}
		m = warp_max(m);
		for (uint32_t c = lane; c < classes; c += 32) {
			sum += expf(z[c] - m);
		}
		sum = warp_sum(sum);
		float inv = 1.0f / sum;
		for (uint32_t c = lane; c < classes; c += 32) {
			float p = expf(z[c] - m) * inv;
			dz[c] = (p - (c == label ? 1.0f : 0.0f)) * scale;
		}
		if (lane == 0) {
			rowloss[r] = (m + logf(sum)) - z[label];
		}
	}
}

extern "C" cudaError_t
fb_cuda_softmax_xent(const float *logits, const int32_t *y, uint32_t rows,
    uint32_t classes, float scale, float *dlogits, float *rowloss,
    cudaStream_t s)
{
	unsigned blocks = (rows + 7) / 8;

	softmax_xent_kernel<<<blocks ? blocks : 1, 256, 0, s>>>(logits, y,
	    rows, classes, scale, dlogits, rowloss);
	return cudaGetLastError();
}

/* One output per row: e = z - t, loss e^2, gradient 2 e scale (the CPU
 * backend's expression, in the same float order). */
__global__ void
squared_error_kernel(const float *__restrict__ z, const float *__restrict__ t,
    uint32_t rows, float scale, float *__restrict__ dz,
    float *__restrict__ rowloss)
{
	for (uint32_t r = blockIdx.x * blockDim.x + threadIdx.x; r < rows;
	     r += gridDim.x * blockDim.x) {
		float e = z[r] - t[r];
		rowloss[r] = e * e;
		dz[r] = 2.0f * e * scale;
	}
}

extern "C" cudaError_t
fb_cuda_squared_error(const float *z, const float *t, uint32_t rows,
    float scale, float *dz, float *rowloss, cudaStream_t s)
{
	squared_error_kernel<<<grid_for(rows, THREADS), THREADS, 0, s>>>(z, t,
	    rows, scale, dz, rowloss);
	return cudaGetLastError();
}

/* One block, fixed order: each thread sums a strided subset in double,
 * then a tree in shared memory. */
__global__ void
loss_reduce_kernel(const float *__restrict__ rowloss, uint32_t rows,
    float scale, const uint32_t *step, float *losses)
{
	__shared__ double part[THREADS];
	double acc = 0.0;

	for (uint32_t i = threadIdx.x; i < rows; i += blockDim.x) {
		acc += rowloss[i];
	}
	part[threadIdx.x] = acc;
	__syncthreads();
	for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
		if (threadIdx.x < w) {
			part[threadIdx.x] += part[threadIdx.x + w];
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		losses[step != NULL ? *step : 0] = (float)(part[0] * scale);
	}
}

extern "C" cudaError_t
fb_cuda_loss_reduce(const float *rowloss, uint32_t rows, float scale,
    const uint32_t *step, float *losses, cudaStream_t s)
{
	loss_reduce_kernel<<<1, THREADS, 0, s>>>(rowloss, rows, scale, step,
	    losses);
	return cudaGetLastError();
}

__device__ static inline void
sgd_one(float &w, float g, float &v, float a, float lr, float mu, float wd,
    float prox, int mom)
{
	/* The CPU backend's order: FedProx term, then weight decay. */
	float d = prox != 0.0f ? g + prox * (w - a) : g;

	d = d + wd * w;
	if (mom) {
		v = mu * v + d;
		d = v;
	}
	w -= lr * d;
}

/* count % 4 == 0 and 16-byte aligned buffers (the backend pads them). */
__global__ void
sgd4_kernel(float4 *__restrict__ w, const float4 *__restrict__ g,
    float4 *__restrict__ v, const float4 *__restrict__ anchor, size_t n4,
    float lr, float mu, float wd, float prox, int mom, uint32_t *step)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
	     i += (size_t)gridDim.x * blockDim.x) {
		float4 a = w[i];
		float4 b = g[i];
		float4 c = mom ? v[i] : make_float4(0, 0, 0, 0);
		float4 o = anchor != NULL ? anchor[i] : make_float4(0, 0, 0, 0);
		sgd_one(a.x, b.x, c.x, o.x, lr, mu, wd, prox, mom);
		sgd_one(a.y, b.y, c.y, o.y, lr, mu, wd, prox, mom);
		sgd_one(a.z, b.z, c.z, o.z, lr, mu, wd, prox, mom);
		sgd_one(a.w, b.w, c.w, o.w, lr, mu, wd, prox, mom);
		w[i] = a;
		if (mom) {
			v[i] = c;
		}
	}
	if (step != NULL && blockIdx.x == 0 && threadIdx.x == 0) {
		(*step)++;
	}
}

__global__ void
sgd_kernel(float *__restrict__ w, const float *__restrict__ g,
    float *__restrict__ v, const float *__restrict__ anchor, size_t n,
    float lr, float mu, float wd, float prox, int mom, uint32_t *step)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float a = w[i];
		float c = mom ? v[i] : 0.0f;
		sgd_one(a, g[i], c, anchor != NULL ? anchor[i] : 0.0f, lr, mu,
		    wd, prox, mom);
		w[i] = a;
		if (mom) {
			v[i] = c;
		}
	}
	if (step != NULL && blockIdx.x == 0 && threadIdx.x == 0) {
		(*step)++;
	}
}

extern "C" cudaError_t
fb_cuda_sgd(float *w, const float *g, float *v, const float *anchor,
    size_t count, float lr, float mu, float wd, float prox, uint32_t *step,
    cudaStream_t s)
{
	int mom = mu != 0.0f;

	if (anchor == NULL) {
		prox = 0.0f;
	}
	if (count % 4 == 0 && (uintptr_t)w % 16 == 0 &&
	    (uintptr_t)g % 16 == 0 && (uintptr_t)v % 16 == 0 &&
	    (uintptr_t)anchor % 16 == 0) {
		sgd4_kernel<<<grid_for(count / 4, THREADS), THREADS, 0, s>>>(
		    (float4 *)w, (const float4 *)g, (float4 *)v,
		    (const float4 *)anchor, count / 4, lr, mu, wd, prox, mom,
		    step);
	} else {
		sgd_kernel<<<grid_for(count, THREADS), THREADS, 0, s>>>(w, g,
		    v, anchor, count, lr, mu, wd, prox, mom, step);
	}
	return cudaGetLastError();
}

__global__ void
checksum_kernel(const uint32_t *__restrict__ w, size_t n,
    unsigned long long *out)
{
	__shared__ unsigned long long part[THREADS];
	unsigned long long acc = 0;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		/* Odd multiplier per position: a swap or a flip changes it. */
		acc += (unsigned long long)w[i] *
		    (2ull * i + 0x9e3779b97f4a7c15ull);
	}
	part[threadIdx.x] = acc;
	__syncthreads();
	for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
		if (threadIdx.x < k) {
			part[threadIdx.x] += part[threadIdx.x + k];
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		/* Integer addition commutes: the order of blocks is moot. */
		atomicAdd(out, part[0]);
	}
}

extern "C" cudaError_t
fb_cuda_checksum(const float *w, size_t count, unsigned long long *out,
    cudaStream_t s)
{
	checksum_kernel<<<grid_for(count, THREADS), THREADS, 0, s>>>(
	    (const uint32_t *)w, count, out);
	return cudaGetLastError();
}

__global__ void
fill_kernel(float *p, size_t n, float v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		p[i] = v;
	}
}

extern "C" cudaError_t
fb_cuda_fill(float *p, size_t count, float v, cudaStream_t s)
{
	fill_kernel<<<grid_for(count, THREADS), THREADS, 0, s>>>(p, count, v);
	return cudaGetLastError();
}

/* One thread: the GPU's global nanosecond timer into the step's slot. */
__global__ void
stamp_kernel(unsigned long long *stamps, const uint32_t *step,
    uint32_t slot, uint32_t stride)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	stamps[(size_t)*step * stride + slot] = t;
}

extern "C" cudaError_t
fb_cuda_stamp(unsigned long long *stamps, const uint32_t *step,
    uint32_t slot, uint32_t stride, cudaStream_t s)
{
	stamp_kernel<<<1, 1, 0, s>>>(stamps, step, slot, stride);
	return cudaGetLastError();
}
