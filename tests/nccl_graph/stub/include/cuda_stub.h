/*
 * Test stub for the CUDA headers NCCL's host code includes: the types and
 * declarations its graph code and the headers it pulls in need to compile, no
 * more. No CUDA toolkit is needed; CUDART_VERSION 11020 keeps cudawrap.h's
 * cuMem* driver-entry-point tables out (the graph code uses none of them).
 * Any function the graph code actually calls is defined in nccl_stubs.cc.
 */
#pragma once
#include <stdint.h>
#define CUDART_VERSION 11020
#define CUDA_VERSION   11020
#include <stddef.h>
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef enum cudaError_enum { cudaSuccess = 0, cudaErrorNotReady = 600 } cudaError_t;
typedef enum { CUDA_SUCCESS = 0 } CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    CU_MEM_HANDLE_TYPE_FABRIC = 8
} CUmemAllocationHandleType;
typedef union {
    int dummy;
} CUstreamBatchMemOpParams;
typedef struct {
    char reserved[64];
} cudaIpcMemHandle_t;
typedef enum {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;
typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount, pciBusID, pciDeviceID, pciDomainID;
    size_t totalGlobalMem;
};
#define cudaStreamNonBlocking 0x01
#define cudaHostAllocMapped   0x02
#define cudaStreamLegacy      ((cudaStream_t)0x1)
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t);
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaStreamDestroy(cudaStream_t);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *, unsigned int);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *, int);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaDriverGetVersion(int *);
cudaError_t cudaMemcpy(void *, const void *, size_t, cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemset(void *, int, size_t);
cudaError_t cudaMemsetAsync(void *, int, size_t, cudaStream_t);
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaHostAlloc(void **, size_t, unsigned int);
cudaError_t cudaHostGetDevicePointer(void **, void *, unsigned int);
cudaError_t cudaGetDevice(int *);
cudaError_t cudaSetDevice(int);
cudaError_t cudaHostRegister(void *, size_t, unsigned int);
cudaError_t cudaHostUnregister(void *);
cudaError_t cudaEventCreate(cudaEvent_t *);
cudaError_t cudaEventDestroy(cudaEvent_t);
extern CUmemAllocationHandleType ncclCuMemHandleType;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef struct {
    char bytes[16];
} cudaUUID_t;
typedef void (*cudaHostFn_t)(void *);
typedef enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3
} CUmemLocationType;
struct int4 {
    int x, y, z, w;
};
struct ulong2 {
    unsigned long x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct half {
    unsigned short x;
};
cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaEventQuery(cudaEvent_t);
struct dim3 {
    unsigned x, y, z;
};
