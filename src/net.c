/*
 * Owns plugin lifetime: the refcounted init/finalize pair, device queries and
 * memory registration entry points. Connections live in conn.c, the data path
 * in p2p.c.
 */
#include "net.h"
#include "async.h"
#include "comm.h"
#include "device.h"
#include "log.h"
#include "mr_cache.h"
#include "mtu_guard.h"
#include "params.h"
#include "prof.h"
#include "reap.h"
#include "stats.h"
#include "topo.h"
#include "verbs.h"

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int net_version; /* the newest table's version NCCL has called init on */

void erdma_set_net_version(int version) {
    if (erdma_forked) return; /* init refuses next; see on_fork_child */
    pthread_mutex_lock(&init_lock);
    if (version > net_version) net_version = version;
    pthread_mutex_unlock(&init_lock);
}
static int init_refs;
static pid_t init_pid;        /* the process whose init opened the devices */
static int open_objects;      /* comms and registrations not closed yet (atomic) */
static bool release_deferred; /* the last finalize came while some were open */

/* ------------------------------------------------------------ fork */
bool erdma_forked;
static bool forked_mid_change; /* init_lock was held at the fork: see on_fork_child */

/* Runs in the child only, single-threaded. A child forked with no devices open and no init in
 * force may init its own. One forked while another thread held init_lock (in init, or in a
 * finalize releasing the devices) inherits that lock locked for ever and the devices half
 * opened or half released: it is refused every call, as a child of an initialised parent is,
 * and no call takes the lock. (A prepare handler that waited for the lock instead would hold
 * every fork in the process, a data loader's workers, behind an init or finalize; and before
 * glibc 2.36, which holds its atfork lock while the handlers run, it could deadlock with a
 * library that init's dlopen loads and that registers fork handlers as it loads.) */
static void on_fork_child(void) {
    if (pthread_mutex_trylock(&init_lock) != 0) {
        forked_mid_change = true;
        erdma_forked = true;
        return;
    }
    if (init_refs > 0 || devices_count() > 0) erdma_forked = true;
    pthread_mutex_unlock(&init_lock);
}

__attribute__((constructor)) static void erdma_load(void) {
    pthread_atfork(NULL, NULL, on_fork_child);
}

int erdma_forked_refuse(const char *call) {
    static bool said;
    if (__atomic_exchange_n(&said, true, __ATOMIC_RELAXED)) return -ENOTSUP;
    if (forked_mid_change)
        WARN("%s called in a process forked (pid %ld) while another thread of its parent was "
             "opening or releasing the eRDMA devices (NCCL init or finalize): their state here "
             "is half made, so the plugin refuses every call. Fix: fork the workers before "
             "NCCL starts or after every communicator is destroyed, or start them with the "
             "spawn method (Python: multiprocessing.set_start_method(\"spawn\"))",
             call, (long)getpid());
    else
        WARN("%s called in a process forked (pid %ld) from the one that opened the eRDMA devices "
             "(pid %ld): the devices, queues and connections are the parent's, so the plugin "
             "refuses every call here. Fix: initialise NCCL after the fork, in the worker "
             "itself, or start workers with the spawn method (Python: "
             "multiprocessing.set_start_method(\"spawn\"))",
             call, (long)getpid(), (long)init_pid);
    return -ENOTSUP;
}

int erdma_forked_skip(const char *call) {
    static bool said;
    if (!__atomic_exchange_n(&said, true, __ATOMIC_RELAXED))
        INFO(NCCL_NET,
             "%s in a forked child (pid %ld): nothing is closed, the devices and "
             "connections stay the parent's (pid %ld)",
             call, (long)getpid(), (long)init_pid);
    return 0;
}

/* Names the devices for the counters and starts the stats file writer. */
static void stats_begin_devices(void) {
    const char *names[ERDMA_MAX_DEVICES];
    int n = devices_count();
    for (int i = 0; i < n && i < ERDMA_MAX_DEVICES; i++)
        names[i] = device_get(i)->name;
    stats_start(n, names);
}

int erdma_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
    int rc = 0;
    if (erdma_forked) { /* before the lock: see on_fork_child */
        erdma_log_set(logger);
        return erdma_forked_refuse("init");
    }
    pthread_mutex_lock(&init_lock);
    erdma_log_set(logger);
    if (prof) prof_set(prof); /* NCCL hands every context the same one */
    if (init_refs++ > 0) goto out;
    if (release_deferred) { /* the devices are still open: the handles NCCL holds use them */
        release_deferred = false;
        goto out;
    }
    init_pid = getpid();

    int bad = params_load();
    params_dump();
    if (bad) WARN("%d environment value(s) ignored, see above", bad);
    if (param_int(P_IB_DISABLE)) {
        INFO(NCCL_INIT | NCCL_NET, "NCCL_IB_DISABLE=%ld: plugin disabled", param_int(P_IB_DISABLE));
        rc = -ENODEV;
        goto fail;
    }
    rc = verbs_open();
    if (rc) goto fail;
    rc = devices_discover();
    if (rc < 0) {
        verbs_close();
        goto fail;
    }
    /* Both may setenv() NCCL variables, and setenv can race with getenv in threads the
     * application or NCCL already runs: it is done at the first init of the process only
     * (NCCL's first communicator, before its own threads read these variables), never at a
     * later re-init after a finalize (v11's per-communicator init). */
    static bool env_exported;
    if (!env_exported) {
        env_exported = true;
        struct topo_plugin_view view = {.gdr = true, .net_version = net_version};
        for (int i = 0; i < devices_count() && i < TOPO_MAX_NICS; i++) {
            view.names[view.nnics++] = device_get(i)->name;
            view.gdr = view.gdr && (device_get(i)->gdr || device_get(i)->dmabuf);
        }
        topo_autoselect(&view); /* never fails init: logs why when it leaves NCCL alone */
        mtu_guard_run();
    }
    rc = async_start();
    if (rc) {
        devices_release();
        verbs_close();
        goto fail;
    }
    stats_begin_devices(); /* never fails init: a bad stats file is WARNed about */
    rc = 0;
    goto out;
fail:
    init_refs--;
    prof_set(NULL);
out:
    pthread_mutex_unlock(&init_lock);
    return rc;
}

/* Our own threads: none may outlive the code of an unloaded plugin. */
static void stop_threads(void) {
    reap_drain();
    stats_stop();
    async_stop();
}

static void release_all(void) {
    erdma_connect_sweep(); /* abandoned connects hold QPs, CQs and MRs of the devices */
    /* closed comms still saying goodbye hold them too; the stats' INFO line per device and
     * last file while names are valid; the async thread before the devices it watches */
    stop_threads();
    devices_release();
    verbs_close();
    prof_set(NULL);
}

void erdma_finalize(void) {
    if (erdma_forked) { /* the parent's threads and devices: see on_fork_child */
        erdma_forked_skip("finalize");
        return;
    }
    pthread_mutex_lock(&init_lock);
    if (init_refs > 0 && --init_refs == 0) {
        int open = __atomic_load_n(&open_objects, __ATOMIC_ACQUIRE);
        if (open > 0) {
            INFO(NCCL_NET,
                 "finalize with %d comm(s) or memory registration(s) still open: the devices "
                 "are released when the last of them is closed",
                 open);
            release_deferred = true;
        } else {
            release_all();
        }
    }
    pthread_mutex_unlock(&init_lock);
}

void erdma_object_opened(void) {
    __atomic_add_fetch(&open_objects, 1, __ATOMIC_ACQ_REL);
}

void erdma_object_closed(void) {
    if (__atomic_sub_fetch(&open_objects, 1, __ATOMIC_ACQ_REL) > 0) return;
    pthread_mutex_lock(&init_lock);
    if (release_deferred && init_refs == 0 &&
        __atomic_load_n(&open_objects, __ATOMIC_ACQUIRE) == 0) {
        release_deferred = false;
        INFO(NCCL_NET, "the last comm or registration open at finalize is closed: releasing the "
                       "devices");
        release_all();
    }
    pthread_mutex_unlock(&init_lock);
}

/* At process exit, and when NCCL >= 2.26 dlclose()s the plugin without a finalize (v8-v10
 * have none). */
__attribute__((destructor)) static void erdma_unload(void) {
    /* A forked child that exits inherited the parent's state but not its threads: its stop
     * pipe and verbs file descriptors are the parent's, and releasing through them would stop
     * the parent's thread and destroy the parent's resources. Checked before the lock: a fork
     * while another thread held it leaves it locked for ever in the child. */
    if (erdma_forked || getpid() != __atomic_load_n(&init_pid, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&init_lock);
    if (init_refs > 0 || release_deferred) {
        if (__atomic_load_n(&open_objects, __ATOMIC_ACQUIRE) > 0 || erdma_connects_pending())
            /* Comms still open, or a connect under way: this is an exit without a finalize
             * (NCCL dlcloses only after its comms are closed), and NCCL's proxy threads may
             * still be in isend, test or connect. The devices and the verbs library stay for
             * them (the kernel reclaims them); our threads stop. Released, a busy data path or
             * a connecting thread crashed the exit (SIGSEGV). */
            stop_threads();
        else
            release_all();
    }
    init_refs = 0;
    release_deferred = false;
    erdma_log_set(NULL);
    pthread_mutex_unlock(&init_lock);
}

int erdma_devices(int *ndev) {
    *ndev = devices_count();
    return 0;
}

int erdma_get_properties(int dev, struct erdma_props *props) {
    struct erdma_device *d = device_get(dev);
    if (!d) {
        WARN("getProperties: device %d does not exist (%d devices)", dev, devices_count());
        return -EINVAL;
    }
    device_fill_props(d, props);
    return 0;
}

int erdma_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    if (erdma_forked) return erdma_forked_refuse("regMr");
    struct erdma_device *dev = comm_device(comm);
    if (!dev) return -EINVAL;
    if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
        WARN("%s: regMr with unknown pointer type %d", dev->name, type);
        return -EINVAL;
    }
    if (type == NCCL_PTR_CUDA && !(dev->ptr_support & NCCL_PTR_CUDA)) {
        WARN("%s: regMr of GPU memory %s; load nvidia_peermem or set NCCL_ERDMA_GDR=1 if peer "
             "memory is provided otherwise",
             dev->name,
             dev->dmabuf ? "without peer memory (no nvidia_peermem): this device takes GPU "
                           "memory only as a dma-buf (regMrDmaBuf with its descriptor)"
                         : "but GPU Direct RDMA is off (no nvidia_peermem)");
        return -EINVAL;
    }
    struct erdma_mr *m;
    int rc = mr_cache_get(dev->mrs, data, size, type, &m);
    if (rc) return rc;
    *mhandle = m;
    erdma_object_opened();
    return 0;
}

int erdma_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                        void **mhandle) {
    if (erdma_forked) return erdma_forked_refuse("regMrDmaBuf");
    struct erdma_device *dev = comm_device(comm);
    if (!dev) return -EINVAL;
    /* no descriptor: a plain registration, as net_ib's (fd != -1 is what selects dma-buf) */
    if (type == NCCL_PTR_HOST || fd == -1) return erdma_reg_mr(comm, data, size, type, mhandle);
    struct erdma_mr *m;
    int rc = mr_cache_get_dmabuf(dev->mrs, data, size, offset, fd, &m);
    if (rc) return rc;
    *mhandle = m;
    erdma_object_opened();
    return 0;
}

int erdma_dereg_mr(void *comm, void *mhandle) {
    if (erdma_forked) return erdma_forked_skip("deregMr");
    if (!mhandle) return 0;
    mr_cache_put(mhandle);
    erdma_object_closed();
    return 0;
}
