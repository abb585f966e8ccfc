/* Owns the async-event thread and its stop pipe; devices own their `fatal` flags. */
#define _GNU_SOURCE
#include "async.h"
#include "conn.h"
#include "device.h"
#include "log.h"
#include "qp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_t thread;
static bool running;
static int stop_pipe[2] = {-1, -1};

struct watch {
    struct ibv_context *ctx;
    int fd;
};

static void handle_event(struct ibv_context *ctx, const struct ibv_async_event *ev) {
    const char *what = vb.event_type_str(ev->event_type);
    for (int i = 0; i < devices_count(); i++) {
        struct erdma_device *d = device_get(i);
        if (d->ctx != ctx) continue;
        switch (ev->event_type) {
        case IBV_EVENT_DEVICE_FATAL:
            __atomic_store_n(&d->fatal, -EIO, __ATOMIC_RELEASE);
            WARN("%s: device fatal error (%s): every connection on it fails from now on; the "
                 "eRDMA driver needs a reset (see dmesg)",
                 d->name, what);
            break;
        case IBV_EVENT_PORT_ERR:
            if (ev->element.port_num != d->port) break;
            __atomic_store_n(&d->port_down_ns, now_coarse_ns(), __ATOMIC_RELEASE);
            __atomic_add_fetch(&d->port_downs, 1, __ATOMIC_ACQ_REL);
            /* a device fatal error stays: a flap during the driver's reset must not hide it
             * (its PORT_ACTIVE would then clear it, and a dead device's requests wait) */
            int up = 0;
            __atomic_compare_exchange_n(&d->fatal, &up, -ENETDOWN, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE);
            WARN("%s:%d: port went down (%s): check the link of %s; its connections wait up to "
                 "%.1f s (their QPs' retry window) for it, new ones wait until it is active again",
                 d->name, d->port, what, device_netdev_name(d), qp_retry_window_ns() / 1e9);
            break;
        case IBV_EVENT_PORT_ACTIVE: {
            if (ev->element.port_num != d->port) break;
            /* a link flap is not a device failure: connections go on where their QPs
             * survived it (as in net_ib); a device fatal error stays */
            int down = -ENETDOWN;
            __atomic_compare_exchange_n(&d->fatal, &down, 0, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE);
            INFO(NCCL_NET, "%s:%d: port active again; new connections can use it", d->name,
                 d->port);
            break;
        }
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
            WARN("%s: QP %u: %s", d->name, ev->element.qp ? ev->element.qp->qp_num : 0, what);
            break;
        case IBV_EVENT_CQ_ERR:
            WARN("%s: completion queue error (%s): a CQ overflowed", d->name, what);
            break;
        default:
            TRACE(NCCL_NET, "%s: async event %s", d->name, what);
            break;
        }
        /* several ports (devices) share a context: a port event is checked against each
         * one's port above; any other event is reported once */
        if (ev->event_type != IBV_EVENT_PORT_ERR && ev->event_type != IBV_EVENT_PORT_ACTIVE &&
            ev->event_type != IBV_EVENT_DEVICE_FATAL)
            return;
    }
}

/* The event channel of ctx reports an error with no event to read: the device went away (a
 * driver reset or unbind, a detached ENI); since Linux 5.7 its fd then polls as POLLERR for
 * good. Its devices fail like a fatal error, and the thread stops watching the channel:
 * polling it again would return at once, forever (a core spent on nothing). */
static void channel_failed(struct ibv_context *ctx, short revents) {
    for (int i = 0; i < devices_count(); i++) {
        struct erdma_device *d = device_get(i);
        if (d->ctx != ctx) continue;
        __atomic_store_n(&d->fatal, -EIO, __ATOMIC_RELEASE);
        WARN("%s: the device's event channel failed (poll revents 0x%x): the device was "
             "removed or reset; every connection on it fails from now on and its events are "
             "no longer watched (see dmesg; restart the job once the device is back)",
             d->name, (unsigned)revents);
    }
}

static void *async_main(void *arg) {
    struct watch *w = arg;
    int n = devices_count();
    struct pollfd pfd[ERDMA_MAX_DEVICES + 1];
    for (;;) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (w[i].ctx) pfd[m++] = (struct pollfd){.fd = w[i].fd, .events = POLLIN};
        pfd[m] = (struct pollfd){.fd = stop_pipe[0], .events = POLLIN};
        int r = poll(pfd, (nfds_t)m + 1, -1);
        if (r < 0 && errno != EINTR) {
            WARN("the async-event thread stops: poll failed (%s); device errors and port "
                 "changes are no longer reported",
                 strerror(errno));
            break;
        }
        if (pfd[m].revents) break;
        for (int i = 0, k = 0; i < n; i++) {
            if (!w[i].ctx) continue;
            short rev = pfd[k++].revents;
            if (rev & POLLIN) {
                struct ibv_async_event ev;
                while (vb.get_async_event(w[i].ctx, &ev) == 0) {
                    handle_event(w[i].ctx, &ev);
                    vb.ack_async_event(&ev);
                }
            }
            if (rev & (POLLERR | POLLHUP | POLLNVAL)) {
                channel_failed(w[i].ctx, rev);
                w[i].ctx = NULL;
            }
        }
    }
    free(w);
    return NULL;
}

int async_start(void) {
    int n = devices_count();
    struct watch *w = calloc((size_t)n + 1, sizeof(*w));
    if (!w) return -ENOMEM;
    for (int i = 0; i < n; i++) {
        struct ibv_context *ctx = device_get(i)->ctx;
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen |= w[j].ctx == ctx;
        if (seen) continue;
        /* non-blocking, so draining never stalls the thread's poll loop */
        int fd = ctx->async_fd;
        if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)) continue;
        w[i].ctx = ctx;
        w[i].fd = fd;
    }
    if (pipe2(stop_pipe, O_CLOEXEC)) {
        free(w);
        return -errno;
    }
    int rc = pthread_create(&thread, NULL, async_main, w);
    if (rc) {
        WARN("cannot start the async-event thread: %s", strerror(rc));
        close(stop_pipe[0]);
        close(stop_pipe[1]);
        stop_pipe[0] = stop_pipe[1] = -1;
        free(w);
        return -rc;
    }
    running = true;
    return 0;
}

void async_stop(void) {
    if (!running) return;
    char c = 'q';
    if (write(stop_pipe[1], &c, 1) != 1) WARN("async thread stop: %s", strerror(errno));
    pthread_join(thread, NULL);
    close(stop_pipe[0]);
    close(stop_pipe[1]);
    stop_pipe[0] = stop_pipe[1] = -1;
    running = false;
}
