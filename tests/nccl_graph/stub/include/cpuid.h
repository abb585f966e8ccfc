/* Test stub for <cpuid.h>: NCCL reads the CPU's vendor, family and model with
 * __cpuid; the test answers for the CPU of the node it models. */
#pragma once
unsigned *ng_cpuid(unsigned leaf);
#define __cpuid(leaf, a, b, c, d)                                                                  \
    do {                                                                                           \
        unsigned *ng_r_ = ng_cpuid(leaf);                                                          \
        a = ng_r_[0];                                                                              \
        b = ng_r_[1];                                                                              \
        c = ng_r_[2];                                                                              \
        d = ng_r_[3];                                                                              \
    } while (0)
