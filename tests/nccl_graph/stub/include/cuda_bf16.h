/* Test stub: NCCL's host code needs only the declarations in cuda_stub.h. */
#include "cuda_stub.h"
