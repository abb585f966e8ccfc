/* Owns the reaper thread and its list of deferred teardowns (reap.h); the items own the
 * teardown itself (conn.c). */
#define _GNU_SOURCE
#include "reap.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REAP_MAX_FDS 256 /* items waiting on a descriptor beyond these are polled every 10 ms */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct reap_item *incoming; /* handed over, not yet taken by the thread */
static int pending;                /* handed over, not finished */
static bool running, stopping;
static pid_t owner; /* a forked child inherits the flags but not the thread */
static pthread_t thread;
static int wake_pipe[2] = {-1, -1};

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ms_until(uint64_t wake) {
    if (wake == UINT64_MAX) return -1;
    uint64_t t = mono_ns();
    if (wake <= t) return 0;
    uint64_t ms = (wake - t + 999999ull) / 1000000ull;
    return ms > 60000 ? 60000 : (int)ms;
}

static void finished(void) {
    pthread_mutex_lock(&lock);
    pending--;
    pthread_mutex_unlock(&lock);
}

/* Without the thread: the item is finished here, sleeping in poll between its steps. */
static void run_in_place(struct reap_item *it) {
    for (;;) {
        int fd = -1;
        uint64_t wake = UINT64_MAX;
        if (it->step(it, &fd, &wake)) break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int ms = ms_until(wake);
        if (fd < 0 && ms < 0) ms = 10; /* an item that names nothing to wait on is retried */
        poll(&p, fd >= 0, ms);
    }
    finished();
}

static void *reap_main(void *arg) {
    (void)arg;
    struct reap_item *items = NULL;
    struct pollfd pfd[REAP_MAX_FDS + 1];
    for (;;) {
        /* Empty the wake pipe BEFORE reading the shared state: a wake-up written after this
         * read (reap_defer, reap_drain) then stays in the pipe and ends the poll below.
         * Emptied after it, a wake-up could be consumed unseen and the poll wait forever
         * (finalize's join hung in siw0 runs this way). */
        char drain[64];
        while (read(wake_pipe[0], drain, sizeof(drain)) > 0)
            ;
        pthread_mutex_lock(&lock);
        struct reap_item *in = incoming;
        incoming = NULL;
        bool stop = stopping;
        pthread_mutex_unlock(&lock);
        while (in) {
            struct reap_item *next = in->next;
            in->next = items;
            items = in;
            in = next;
        }
        int n = 0;
        uint64_t wake = UINT64_MAX;
        for (struct reap_item **pp = &items; *pp;) {
            struct reap_item *it = *pp, *next = it->next;
            int fd = -1;
            uint64_t w = UINT64_MAX;
            if (it->step(it, &fd, &w)) { /* done, and maybe freed */
                *pp = next;
                finished();
                continue;
            }
            if (fd >= 0 && n < REAP_MAX_FDS)
                pfd[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
            else if (w > mono_ns() + 10000000ull)
                w = mono_ns() + 10000000ull;
            if (w < wake) wake = w;
            pp = &it->next;
        }
        if (stop && !items) {
            pthread_mutex_lock(&lock);
            bool more = incoming != NULL;
            pthread_mutex_unlock(&lock);
            if (!more) break;
            continue;
        }
        pfd[n] = (struct pollfd){.fd = wake_pipe[0], .events = POLLIN};
        if (poll(pfd, (nfds_t)n + 1, ms_until(wake)) < 0 && errno != EINTR) {
            WARN("teardown thread: poll failed: %s", strerror(errno));
            usleep(10000);
        }
    }
    return NULL;
}

/* Called with the lock held. */
static int start_locked(void) {
    if (running && owner == getpid()) return 0;
    running = false; /* a forked child: the parent's thread is not here */
    incoming = NULL;
    pending = 0;
    if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK)) return -errno;
    stopping = false;
    int rc = pthread_create(&thread, NULL, reap_main, NULL);
    if (rc) {
        close(wake_pipe[0]);
        close(wake_pipe[1]);
        wake_pipe[0] = wake_pipe[1] = -1;
        return -rc;
    }
    running = true;
    owner = getpid();
    return 0;
}

static void wake(void) {
    char c = 'w';
    if (write(wake_pipe[1], &c, 1) < 0 && errno != EAGAIN)
        WARN("teardown thread: cannot wake it: %s", strerror(errno));
}

void reap_defer(struct reap_item *it) {
    pthread_mutex_lock(&lock);
    int rc = start_locked();
    pending++;
    if (rc) {
        pthread_mutex_unlock(&lock);
        WARN("cannot start the teardown thread (%s): closing in the caller's thread",
             strerror(-rc));
        run_in_place(it);
        return;
    }
    it->next = incoming;
    incoming = it;
    wake();
    pthread_mutex_unlock(&lock);
}

void reap_drain(void) {
    pthread_mutex_lock(&lock);
    if (!running || owner != getpid()) {
        running = false;
        pthread_mutex_unlock(&lock);
        return;
    }
    stopping = true;
    wake();
    pthread_mutex_unlock(&lock);
    pthread_join(thread, NULL);
    pthread_mutex_lock(&lock);
    close(wake_pipe[0]);
    close(wake_pipe[1]);
    wake_pipe[0] = wake_pipe[1] = -1;
    running = stopping = false;
    struct reap_item *late = incoming; /* handed over while the thread was exiting */
    incoming = NULL;
    pthread_mutex_unlock(&lock);
    while (late) {
        struct reap_item *next = late->next;
        run_in_place(late);
        late = next;
    }
}

int reap_pending(void) {
    pthread_mutex_lock(&lock);
    int n = pending;
    pthread_mutex_unlock(&lock);
    return n;
}
