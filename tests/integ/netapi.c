#define _GNU_SOURCE
#include "netapi.h"

#include <errno.h>
#include <execinfo.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int net_open(struct netapi *n, int version, const char *devname) {
    return net_open_cfg(n, version, devname, NCCL_NET_TRAFFIC_CLASS_UNDEF, NULL);
}

int net_open_prof(struct netapi *n, int version, const char *devname, ncclProfilerCallback_t prof) {
    return net_open_cfg(n, version, devname, NCCL_NET_TRAFFIC_CLASS_UNDEF, prof);
}

int net_open_tc(struct netapi *n, int version, const char *devname, int traffic_class) {
    return net_open_cfg(n, version, devname, traffic_class, NULL);
}

int net_open_cfg(struct netapi *n, int version, const char *devname, int traffic_class,
                 ncclProfilerCallback_t prof) {
    memset(n, 0, sizeof(*n));
    n->version = version;
    if (plugin_open(&n->p)) return -1;
    int rc, ndev = 0;
    n->t12 = version == 11 ? (const ncclNet_v12_t *)n->p.v11 : n->p.v12;
    ncclNetCommConfig_t cfg = {.trafficClass = traffic_class};
    if (version >= 11) {
        rc = n->t12->init(&n->ctx, 42, &cfg, log_capture, prof);
        if (!rc) rc = n->t12->devices(&ndev);
    } else if (version == 10) {
        rc = n->p.v10->init(log_capture, prof);
        if (!rc) rc = n->p.v10->devices(&ndev);
    } else {
        rc = n->p.v8->init(log_capture);
        if (!rc) rc = n->p.v8->devices(&ndev);
    }
    if (rc) {
        fprintf(stderr, "init failed: %d\n", rc);
        return -1;
    }
    for (int i = 0; i < ndev; i++) {
        ncclNetProperties_v8_t pr;
        n->p.v8->getProperties(i, &pr);
        if (!strcmp(pr.name, devname)) {
            n->dev = i;
            return 0;
        }
    }
    fprintf(stderr, "device %s not found among %d\n", devname, ndev);
    return -1;
}

void net_close(struct netapi *n) {
    if (n->version == 12 && n->ctx) n->p.v12->finalize(n->ctx);
    if (n->version == 11 && n->ctx) n->p.v11->finalize(n->ctx);
    plugin_close(&n->p);
}

int net_listen(struct netapi *n, void *handle, void **lc) {
    if (n->version == 11) return n->p.v11->listen(n->ctx, n->dev, handle, lc);
    return n->version == 12 ? n->p.v12->listen(n->ctx, n->dev, handle, lc)
                            : n->p.v8->listen(n->dev, handle, lc);
}

int net_connect(struct netapi *n, void *handle, void **sc, int timeout_s) {
    double end = now_s() + timeout_s;
    *sc = NULL;
    while (!*sc) {
        ncclNetDeviceHandle_t *dh = NULL;
        ncclNetCommConfig_t cfg = {.trafficClass = -1};
        int rc = n->version == 12   ? n->p.v12->connect(n->ctx, n->dev, handle, sc, &dh)
                 : n->version == 11 ? n->p.v11->connect(n->ctx, n->dev, handle, sc, &dh)
                 : n->version == 10 ? n->p.v10->connect(n->dev, &cfg, handle, sc, &dh)
                                    : n->p.v8->connect(n->dev, handle, sc, &dh);
        if (rc) return rc;
        if (!*sc && now_s() > end) {
            fprintf(stderr, "connect: still not connected after %d s\n", timeout_s);
            return ncclSystemError;
        }
    }
    return 0;
}

int net_accept(struct netapi *n, void *lc, void **rc_out, int timeout_s) {
    double end = now_s() + timeout_s;
    *rc_out = NULL;
    while (!*rc_out) {
        ncclNetDeviceHandle_t *dh = NULL;
        int rc =
            n->version >= 11 ? n->t12->accept(lc, rc_out, &dh) : n->p.v8->accept(lc, rc_out, &dh);
        if (rc) return rc;
        if (!*rc_out && now_s() > end) {
            fprintf(stderr, "accept: nothing after %d s\n", timeout_s);
            return ncclSystemError;
        }
    }
    return 0;
}

int net_regmr(struct netapi *n, void *comm, void *data, size_t size, void **mh) {
    return n->p.v8->regMr(comm, data, size, NCCL_PTR_HOST, mh);
}

int net_regmr_type(struct netapi *n, void *comm, void *data, size_t size, int type, void **mh) {
    return n->p.v8->regMr(comm, data, size, type, mh);
}

int net_deregmr(struct netapi *n, void *comm, void *mh) {
    return n->p.v8->deregMr(comm, mh);
}

int net_isend(struct netapi *n, void *sc, void *data, size_t size, int tag, void *mh, void **req,
              int timeout_s) {
    double end = now_s() + timeout_s;
    *req = NULL;
    while (!*req) {
        void *ph = n->phandle;
        int rc = n->version == 12   ? n->p.v12->isend(sc, data, size, tag, mh, ph, req)
                 : n->version == 11 ? n->p.v11->isend(sc, data, size, tag, mh, ph, req)
                 : n->version == 10 ? n->p.v10->isend(sc, data, size, tag, mh, ph, req)
                                    : n->p.v8->isend(sc, data, (int)size, tag, mh, req);
        if (rc) return rc;
        if (!*req && now_s() > end) {
            fprintf(stderr, "isend: no clear-to-send after %d s\n", timeout_s);
            return ncclSystemError;
        }
    }
    return 0;
}

int net_irecv(struct netapi *n, void *rc, int cnt, void **data, size_t *sizes, int *tags, void **mh,
              void **req, int timeout_s) {
    double end = now_s() + timeout_s;
    *req = NULL;
    while (!*req) {
        int r;
        if (n->version >= 10) {
            void *ph[8] = {0};
            for (int i = 0; i < cnt && n->phandle; i++)
                ph[i] = n->phandle + i;
            r = n->version == 12   ? n->p.v12->irecv(rc, cnt, data, sizes, tags, mh, ph, req)
                : n->version == 11 ? n->p.v11->irecv(rc, cnt, data, sizes, tags, mh, ph, req)
                                   : n->p.v10->irecv(rc, cnt, data, sizes, tags, mh, ph, req);
        } else {
            int isz[8];
            for (int i = 0; i < cnt; i++)
                isz[i] = (int)sizes[i];
            r = n->p.v8->irecv(rc, cnt, data, isz, tags, mh, req);
        }
        if (r) return r;
        if (!*req && now_s() > end) {
            fprintf(stderr, "irecv: not accepted after %d s\n", timeout_s);
            return ncclSystemError;
        }
    }
    return 0;
}

int net_test(struct netapi *n, void *req, int *done, int *sizes) {
    return n->p.v8->test(req, done, sizes);
}

int net_wait(struct netapi *n, void *req, int *sizes, int timeout_s) {
    double end = now_s() + timeout_s;
    int done = 0;
    while (!done) {
        int rc = n->p.v8->test(req, &done, sizes);
        if (rc) return rc;
        if (!done && now_s() > end) {
            fprintf(stderr, "test: request not done after %d s\n", timeout_s);
            return ncclSystemError;
        }
    }
    return 0;
}

int net_iflush(struct netapi *n, void *rc, int cnt, void **data, int *sizes, void **mh,
               void **req) {
    return n->p.v8->iflush(rc, cnt, data, sizes, mh, req);
}

int net_close_send(struct netapi *n, void *sc) {
    return n->p.v8->closeSend(sc);
}

int net_close_recv(struct netapi *n, void *rc) {
    return n->p.v8->closeRecv(rc);
}

int net_close_listen(struct netapi *n, void *lc) {
    return n->p.v8->closeListen(lc);
}

/* ------------------------------------------------------------ two processes */
static int full_io(int fd, void *buf, size_t len, int writing) {
    size_t done = 0;
    while (done < len) {
        struct pollfd p = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        if (poll(&p, 1, 120000) <= 0) return -1;
        ssize_t r = writing ? write(fd, (char *)buf + done, len - done)
                            : read(fd, (char *)buf + done, len - done);
        if (r <= 0) return -1;
        done += (size_t)r;
    }
    return 0;
}

int duo_send(struct duo *d, const void *buf, size_t len) {
    return full_io(d->is_child ? d->to_parent[1] : d->to_child[1], (void *)buf, len, 1);
}

int duo_recv(struct duo *d, void *buf, size_t len) {
    return full_io(d->is_child ? d->to_child[0] : d->to_parent[0], buf, len, 0);
}

int duo_barrier(struct duo *d) {
    char c = 'b';
    if (duo_send(d, &c, 1)) return -1;
    return duo_recv(d, &c, 1);
}

/* A SIGPIPE kills a role with no word of where it came from: print the stack first (the
 * plugin sends with MSG_NOSIGNAL; a kernel driver sending in our syscall may not). */
static void sigpipe_report(int sig) {
    static const char msg[] = "SIGPIPE in this role, raised here:\n";
    void *frames[64];
    if (write(2, msg, sizeof(msg) - 1) < 0) _exit(0x7d);
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Both roles run in fresh child processes: a role that fails half-way can leave the
 * plugin loaded and initialised, and verbs objects must never be inherited across fork(). */
static pid_t spawn(struct duo *d, duo_fn fn, void *arg, int is_child, int timeout_s) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    d->is_child = is_child;
    signal(SIGPIPE, sigpipe_report);
    alarm((unsigned)timeout_s + ROLE_BACKSTOP_S);
    int rc = fn(d, arg);
    fflush(NULL);
    _exit(rc == 0 ? 0 : 1);
}

/* A role past its deadline is stuck somewhere: say where before killing it, so that a hang
 * seen once in CI can be found (kernel stacks of every thread, then gdb's, if installed). */
void role_dump_stacks(pid_t pid, const char *role) {
    char cmd[512];
    fprintf(stderr, "---- %s (pid %d) stacks at the deadline ----\n", role, (int)pid);
    fflush(stderr);
    snprintf(cmd, sizeof(cmd),
             "for t in /proc/%d/task/*; do echo \"thread $(basename $t) $(cat $t/comm)"
             " wchan=$(cat $t/wchan)\"; cat $t/stack 2>/dev/null; done >&2; "
             "command -v gdb >/dev/null && timeout 60 gdb -p %d -batch -nx"
             " -ex 'thread apply all bt' 2>&1 | grep -E '^(#|Thread)' >&2",
             (int)pid, (int)pid);
    if (system(cmd) < 0) fprintf(stderr, "cannot run the stack dump: %s\n", strerror(errno));
    fprintf(stderr, "---- end of %s stacks ----\n", role);
}

int role_reap(pid_t pid, double end, const char *role) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_s() > end) {
            fprintf(stderr, "%s still running at the deadline: killing it\n", role);
            role_dump_stacks(pid, role);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(10000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s failed (status 0x%x)\n", role, status);
        return -1;
    }
    return 0;
}

int duo_run(duo_fn parent, duo_fn child, void *arg, int timeout_s) {
    struct duo d = {0};
    if (pipe(d.to_child) || pipe(d.to_parent)) return -1;
    fflush(NULL);
    pid_t p1 = spawn(&d, parent, arg, 0, timeout_s);
    pid_t p2 = spawn(&d, child, arg, 1, timeout_s);
    if (p1 < 0 || p2 < 0) return -1;
    close(d.to_child[0]);
    close(d.to_child[1]);
    close(d.to_parent[0]);
    close(d.to_parent[1]);
    double end = now_s() + timeout_s;
    int r1 = role_reap(p1, end, "receiver");
    int r2 = role_reap(p2, end, "sender");
    return r1 || r2 ? -1 : 0;
}

void pattern_fill(uint8_t *buf, size_t len, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
}

long pattern_check(const uint8_t *buf, size_t len, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        if (buf[i] != (uint8_t)(x >> 16)) return (long)i;
    }
    return -1;
}

void env_apply(const char *env, bool set) {
    if (!env) return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", env);
    for (char *save, *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = 0;
        if (set)
            setenv(kv, eq + 1, 1);
        else
            unsetenv(kv);
    }
}
