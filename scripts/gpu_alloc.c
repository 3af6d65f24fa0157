/*
 * gpu_alloc: allocate GPU memory in one piece and say whether it worked; what
 * scripts/gpu-check runs in its MPS containers to show that a memory limit holds.
 *
 *     gpu_alloc MIB [HOLD_SECONDS [MIB ...]]
 *
 * Allocates MIB MiB on the container's one GPU (cuMemAlloc), prints "allocated MIB MiB" or
 * "failed MIB MiB: <CUDA error name>", holds what it got for HOLD_SECONDS (so that two
 * containers hold their shares at once), then tries each further MIB the same way. Exit
 * status: 0 when every allocation went as the sign of its MIB says (a MIB written as -N is
 * one that must fail), 1 otherwise, 2 when CUDA cannot start.
 *
 * The CUDA driver API only, loaded with dlopen: the container gets libcuda.so.1 from the
 * node (gpuwire injects it) and needs nothing else of CUDA's; cuda.h (the CUDA toolkit's, at
 * build time) gives the types. C and libc/libdl only; built by gpu-check with the machine's
 * toolkit: cc -Wall -Wextra -I/usr/local/cuda/include gpu_alloc.c -ldl.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*ctx_create_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*error_name_fn)(CUresult, const char **);

static void *need(void *lib, const char *name)
{
	void *found = dlsym(lib, name);
	if (found == NULL) {
		printf("libcuda.so.1 has no %s\n", name);
		exit(2);
	}
	return found;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: gpu_alloc MIB [HOLD_SECONDS [MIB ...]]\n");
		return 2;
	}
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (lib == NULL) {
		printf("cannot load libcuda.so.1: %s\n", dlerror());
		return 2;
	}
	init_fn init = (init_fn)need(lib, "cuInit");
	device_get_fn device_get = (device_get_fn)need(lib, "cuDeviceGet");
	ctx_create_fn ctx_create = (ctx_create_fn)need(lib, "cuCtxCreate_v2");
	mem_alloc_fn mem_alloc = (mem_alloc_fn)need(lib, "cuMemAlloc_v2");
	error_name_fn error_name = (error_name_fn)need(lib, "cuGetErrorName");

	CUdevice device;
	CUcontext context;
	CUresult status = init(0);
	if (status == CUDA_SUCCESS)
		status = device_get(&device, 0);
	if (status == CUDA_SUCCESS)
		status = ctx_create(&context, 0, device);
	if (status != CUDA_SUCCESS) {
		const char *name = "unknown";
		error_name(status, &name);
		printf("CUDA did not start: %s\n", name);
		return 2;
	}
	int ok = 1;
	for (int i = 1; i < argc; i += (i == 1 ? 2 : 1)) {
		long mib = atol(argv[i]);
		int must_fail = mib < 0;
		if (must_fail)
			mib = -mib;
		CUdeviceptr memory;
		status = mem_alloc(&memory, (size_t)mib << 20);
		if (status == CUDA_SUCCESS) {
			printf("allocated %ld MiB\n", mib);
		} else {
			const char *name = "unknown";
			error_name(status, &name);
			printf("failed %ld MiB: %s\n", mib, name);
		}
		fflush(stdout);
		ok &= (status == CUDA_SUCCESS) != must_fail;
		if (i == 1 && argc > 2)
			sleep((unsigned int)atoi(argv[2]));
	}
	return ok ? 0 : 1;
}
