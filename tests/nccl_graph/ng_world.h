/* What the stubs of NCCL's surroundings ask the test about the node it models. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct ng_pci_ids {
    unsigned vendor, device, subsystem_vendor, subsystem_device;
};

const char *ng_sysfs_root(void);
bool ng_verbose(void);
int ng_thread_rank(void);
void ng_record_warn(const char *msg);
uint64_t ng_host_hash(void);
int ng_gpu_index(const char *busId); /* NVML's index, -1 if not a GPU of the node */
const struct ng_pci_ids *ng_gpu_ids(int index);
int ng_net_count(void);
int ng_virt_count(void);
void ng_set_virt_count(int n);
void ng_allgather(int rank, int nranks, void *all, int size);
