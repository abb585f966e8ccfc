/* Owns the traffic counters, their registry and the stats file writer; see stats.h. */
#include "stats.h"
#include "log.h"
#include "params.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h> /* enum ibv_wc_status: names only, no calls */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STATS_MAX_DEVICES 32

struct stats_device {
    char name[64];
    struct stats_counters closed; /* connections already closed */
    uint64_t events[STATS_EVENTS];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* registry, totals, file */
static struct stats_device devs[STATS_MAX_DEVICES];
static int ndevs;
static struct stats_conn *live; /* registered connections */
static uint64_t next_conn_id;

/* ------------------------------------------------------------ names */
static const char *const wc_names[STATS_WC_STATUSES] = {
    [IBV_WC_LOC_LEN_ERR] = "local_length",
    [IBV_WC_LOC_QP_OP_ERR] = "local_qp_operation",
    [IBV_WC_LOC_EEC_OP_ERR] = "local_eec_operation",
    [IBV_WC_LOC_PROT_ERR] = "local_protection",
    [IBV_WC_WR_FLUSH_ERR] = "flushed",
    [IBV_WC_MW_BIND_ERR] = "memory_window_bind",
    [IBV_WC_BAD_RESP_ERR] = "bad_response",
    [IBV_WC_LOC_ACCESS_ERR] = "local_access",
    [IBV_WC_REM_INV_REQ_ERR] = "remote_invalid_request",
    [IBV_WC_REM_ACCESS_ERR] = "remote_access",
    [IBV_WC_REM_OP_ERR] = "remote_operation",
    [IBV_WC_RETRY_EXC_ERR] = "retry_exceeded",
    [IBV_WC_RNR_RETRY_EXC_ERR] = "rnr_retry_exceeded",
    [IBV_WC_LOC_RDD_VIOL_ERR] = "local_rdd_violation",
    [IBV_WC_REM_INV_RD_REQ_ERR] = "remote_invalid_rd_request",
    [IBV_WC_REM_ABORT_ERR] = "remote_abort",
    [IBV_WC_INV_EECN_ERR] = "invalid_eecn",
    [IBV_WC_INV_EEC_STATE_ERR] = "invalid_eec_state",
    [IBV_WC_FATAL_ERR] = "fatal",
    [IBV_WC_RESP_TIMEOUT_ERR] = "response_timeout",
    [IBV_WC_GENERAL_ERR] = "general",
};

const char *stats_wc_status_name(int status) {
    if (status >= 0 && status < STATS_WC_STATUSES && wc_names[status]) return wc_names[status];
    return "other";
}

static int wc_slot(int status) {
    return status > 0 && status < STATS_WC_STATUSES && wc_names[status] ? status
                                                                        : STATS_WC_STATUSES;
}

void stats_wc_error(struct stats_conn *s, int status) {
    stats_add(&s->c.wc_errors[wc_slot(status)], 1);
}

/* ------------------------------------------------------------ registry */
static void counters_fold(struct stats_counters *into, const struct stats_counters *from) {
    into->bytes_sent += __atomic_load_n(&from->bytes_sent, __ATOMIC_RELAXED);
    into->bytes_recv += __atomic_load_n(&from->bytes_recv, __ATOMIC_RELAXED);
    into->msgs_sent += __atomic_load_n(&from->msgs_sent, __ATOMIC_RELAXED);
    into->msgs_recv += __atomic_load_n(&from->msgs_recv, __ATOMIC_RELAXED);
    into->wrs_posted += __atomic_load_n(&from->wrs_posted, __ATOMIC_RELAXED);
    into->flushes += __atomic_load_n(&from->flushes, __ATOMIC_RELAXED);
    uint64_t m = __atomic_load_n(&from->max_inflight_ns, __ATOMIC_RELAXED);
    if (m > into->max_inflight_ns) into->max_inflight_ns = m;
    for (int i = 0; i <= STATS_WC_STATUSES; i++)
        into->wc_errors[i] += __atomic_load_n(&from->wc_errors[i], __ATOMIC_RELAXED);
}

static void counters_snapshot(struct stats_counters *out, const struct stats_counters *from) {
    memset(out, 0, sizeof(*out));
    counters_fold(out, from);
}

void stats_conn_open(struct stats_conn *s, int dev, enum stats_dir dir, const char *peer) {
    memset(s, 0, sizeof(*s));
    s->dev = dev;
    s->dir = dir;
    snprintf(s->peer, sizeof(s->peer), "%s", peer ? peer : "");
    pthread_mutex_lock(&lock);
    s->id = next_conn_id++;
    s->next = live;
    if (live) live->prev = s;
    live = s;
    s->registered = true;
    pthread_mutex_unlock(&lock);
}

void stats_conn_close(struct stats_conn *s) {
    pthread_mutex_lock(&lock);
    if (s->registered) {
        if (s->prev)
            s->prev->next = s->next;
        else
            live = s->next;
        if (s->next) s->next->prev = s->prev;
        s->registered = false;
        if (s->dev >= 0 && s->dev < ndevs) counters_fold(&devs[s->dev].closed, &s->c);
    }
    pthread_mutex_unlock(&lock);
}

void stats_event(int dev, enum stats_event ev) {
    if (dev >= 0 && dev < STATS_MAX_DEVICES && ev < STATS_EVENTS)
        __atomic_fetch_add(&devs[dev].events[ev], 1, __ATOMIC_RELAXED);
}

static void device_totals_locked(int dev, struct stats_counters *out,
                                 uint64_t events[STATS_EVENTS]) {
    *out = devs[dev].closed;
    for (struct stats_conn *s = live; s; s = s->next)
        if (s->dev == dev) counters_fold(out, &s->c);
    if (events)
        for (int e = 0; e < STATS_EVENTS; e++)
            events[e] = __atomic_load_n(&devs[dev].events[e], __ATOMIC_RELAXED);
}

void stats_device_totals(int dev, struct stats_counters *out, uint64_t events[STATS_EVENTS]) {
    memset(out, 0, sizeof(*out));
    if (events) memset(events, 0, sizeof(uint64_t) * STATS_EVENTS);
    pthread_mutex_lock(&lock);
    if (dev >= 0 && dev < ndevs) device_totals_locked(dev, out, events);
    pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------ Prometheus text format */
struct metric {
    const char *name; /* after erdma_device_ / erdma_conn_ */
    const char *help;
    size_t off;
};

static const struct metric counters[] = {
    {"bytes_sent_total", "payload bytes sent", offsetof(struct stats_counters, bytes_sent)},
    {"bytes_received_total", "payload bytes received", offsetof(struct stats_counters, bytes_recv)},
    {"messages_sent_total", "messages sent (isend requests completed)",
     offsetof(struct stats_counters, msgs_sent)},
    {"messages_received_total", "messages received (irecv requests completed)",
     offsetof(struct stats_counters, msgs_recv)},
    {"work_requests_posted_total", "work requests posted to the RDMA device",
     offsetof(struct stats_counters, wrs_posted)},
    {"flushes_total", "GPU Direct flush reads posted", offsetof(struct stats_counters, flushes)},
};

static uint64_t counter_at(const struct stats_counters *c, size_t off) {
    return *(const uint64_t *)((const char *)c + off);
}

/* A label value with \, " and newline escaped, as the text format requires. */
static void put_label(FILE *out, const char *name, const char *value, bool first) {
    fprintf(out, "%s%s=\"", first ? "" : ",", name);
    for (const char *p = value; *p; p++) {
        if (*p == '\\' || *p == '"') fputc('\\', out);
        if (*p == '\n') {
            fputs("\\n", out);
            continue;
        }
        fputc(*p, out);
    }
    fputc('"', out);
}

static void put_dev_labels(FILE *out, int dev, long pid) {
    char p[24];
    snprintf(p, sizeof(p), "%ld", pid);
    put_label(out, "device", devs[dev].name, true);
    put_label(out, "pid", p, false);
}

static void put_conn_labels(FILE *out, const struct stats_conn *s, long pid) {
    char p[24], id[24];
    snprintf(p, sizeof(p), "%ld", pid);
    snprintf(id, sizeof(id), "%llu", (unsigned long long)s->id);
    put_label(out, "device", devs[s->dev].name, true);
    put_label(out, "peer", s->peer, false);
    put_label(out, "pid", p, false);
    put_label(out, "conn", id, false);
    put_label(out, "dir", s->dir == STATS_SEND ? "send" : "recv", false);
}

static void header(FILE *out, const char *scope, const char *name, const char *help,
                   const char *type) {
    fprintf(out, "# HELP erdma_%s_%s %s\n# TYPE erdma_%s_%s %s\n", scope, name, help, scope, name,
            type);
}

static void write_locked(FILE *out, long pid) {
    struct stats_counters tot[STATS_MAX_DEVICES];
    uint64_t ev[STATS_MAX_DEVICES][STATS_EVENTS];
    for (int d = 0; d < ndevs; d++)
        device_totals_locked(d, &tot[d], ev[d]);
    int nconn = 0;
    for (struct stats_conn *s = live; s; s = s->next)
        nconn += s->dev >= 0 && s->dev < ndevs;

    for (size_t m = 0; m < sizeof(counters) / sizeof(counters[0]); m++) {
        header(out, "device", counters[m].name, counters[m].help, "counter");
        for (int d = 0; d < ndevs; d++) {
            fprintf(out, "erdma_device_%s{", counters[m].name);
            put_dev_labels(out, d, pid);
            fprintf(out, "} %llu\n", (unsigned long long)counter_at(&tot[d], counters[m].off));
        }
    }
    header(out, "device", "completion_errors_total", "failed work completions, by status",
           "counter");
    for (int d = 0; d < ndevs; d++)
        for (int i = 0; i <= STATS_WC_STATUSES; i++) {
            if (!tot[d].wc_errors[i]) continue;
            fprintf(out, "erdma_device_completion_errors_total{");
            put_dev_labels(out, d, pid);
            put_label(out, "status", stats_wc_status_name(i), false);
            fprintf(out, "} %llu\n", (unsigned long long)tot[d].wc_errors[i]);
        }
    header(out, "device", "request_max_inflight_seconds",
           "longest time a request stayed between post and completion", "gauge");
    for (int d = 0; d < ndevs; d++) {
        fprintf(out, "erdma_device_request_max_inflight_seconds{");
        put_dev_labels(out, d, pid);
        fprintf(out, "} %.6f\n", tot[d].max_inflight_ns / 1e9);
    }
    static const char *const ev_names[STATS_EVENTS][2] = {
        [STATS_CONNECT] = {"connects_total", "connections established by connect"},
        [STATS_ACCEPT] = {"accepts_total", "connections established by accept"},
        [STATS_ACCEPT_REJECT] = {"accept_rejections_total",
                                 "stray or malformed peers accept turned away"},
    };
    for (int e = 0; e < STATS_EVENTS; e++) {
        header(out, "device", ev_names[e][0], ev_names[e][1], "counter");
        for (int d = 0; d < ndevs; d++) {
            fprintf(out, "erdma_device_%s{", ev_names[e][0]);
            put_dev_labels(out, d, pid);
            fprintf(out, "} %llu\n", (unsigned long long)ev[d][e]);
        }
    }
    if (!nconn) return;
    for (size_t m = 0; m < sizeof(counters) / sizeof(counters[0]); m++) {
        header(out, "conn", counters[m].name, counters[m].help, "counter");
        for (struct stats_conn *s = live; s; s = s->next) {
            if (s->dev < 0 || s->dev >= ndevs) continue;
            struct stats_counters c;
            counters_snapshot(&c, &s->c);
            fprintf(out, "erdma_conn_%s{", counters[m].name);
            put_conn_labels(out, s, pid);
            fprintf(out, "} %llu\n", (unsigned long long)counter_at(&c, counters[m].off));
        }
    }
    header(out, "conn", "completion_errors_total", "failed work completions, by status", "counter");
    for (struct stats_conn *s = live; s; s = s->next) {
        if (s->dev < 0 || s->dev >= ndevs) continue;
        for (int i = 0; i <= STATS_WC_STATUSES; i++) {
            uint64_t v = __atomic_load_n(&s->c.wc_errors[i], __ATOMIC_RELAXED);
            if (!v) continue;
            fprintf(out, "erdma_conn_completion_errors_total{");
            put_conn_labels(out, s, pid);
            put_label(out, "status", stats_wc_status_name(i), false);
            fprintf(out, "} %llu\n", (unsigned long long)v);
        }
    }
    header(out, "conn", "request_max_inflight_seconds",
           "longest time a request stayed between post and completion", "gauge");
    for (struct stats_conn *s = live; s; s = s->next) {
        if (s->dev < 0 || s->dev >= ndevs) continue;
        fprintf(out, "erdma_conn_request_max_inflight_seconds{");
        put_conn_labels(out, s, pid);
        fprintf(out, "} %.6f\n", __atomic_load_n(&s->c.max_inflight_ns, __ATOMIC_RELAXED) / 1e9);
    }
}

int stats_write_prometheus(FILE *out, long pid) {
    pthread_mutex_lock(&lock);
    write_locked(out, pid);
    pthread_mutex_unlock(&lock);
    return ferror(out) ? -EIO : 0;
}

int stats_file_name(const char *tmpl, long pid, char *out, size_t outlen) {
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        char buf[24];
        const char *add = buf;
        if (p[0] == '%' && p[1] == 'p') {
            snprintf(buf, sizeof(buf), "%ld", pid);
            p++;
        } else {
            buf[0] = *p;
            buf[1] = 0;
        }
        size_t n = strlen(add);
        if (o + n >= outlen) return -ENAMETOOLONG;
        memcpy(out + o, add, n);
        o += n;
    }
    if (!o) return -EINVAL;
    out[o] = 0;
    return 0;
}

static int write_all(int fd, const char *p, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? -errno : -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int stats_write_file(const char *tmpl) {
    char path[4096], tmp[4096 + 32];
    long pid = (long)getpid();
    int rc = stats_file_name(tmpl, pid, path, sizeof(path));
    if (rc) return rc;
    /* The text is made in memory under the registry lock, and the file is written without
     * it: connect, accept and close take that lock, and a filesystem that hangs (NFS) must
     * stall this thread only, never connection setup. */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) return -errno;
    rc = stats_write_prometheus(m, pid);
    if (fclose(m) && !rc) rc = -ENOMEM;
    if (rc) {
        free(text);
        return rc;
    }
    /* the collector reads only *.prom: it never sees the half-written temporary */
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, pid);
    /* Its name is predictable: in a shared directory someone may have put a link (we would
     * truncate its target) or a FIFO (we would block) there. Created afresh, never followed,
     * never waited on. */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        free(text);
        return rc;
    }
    rc = write_all(fd, text, len);
    free(text);
    if (close(fd) && !rc) rc = -errno;
    if (!rc && rename(tmp, path)) rc = -errno;
    if (rc) unlink(tmp);
    return rc;
}

/* ------------------------------------------------------------ writer thread */
static pthread_t writer;
static bool writer_running;
static bool writer_stop;
static pthread_cond_t writer_cv;
static const char *file_tmpl;
static long interval_s;

static void write_reporting(void) {
    static int last_err;
    int rc = stats_write_file(file_tmpl);
    if (rc && rc != last_err)
        WARN("cannot write the stats file %s: %s (NCCL_ERDMA_STATS_FILE; the directory must "
             "exist and be writable)",
             file_tmpl, strerror(-rc));
    last_err = rc;
}

static void *writer_main(void *arg) {
    pthread_mutex_lock(&lock);
    while (!writer_stop) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_sec += interval_s;
        while (!writer_stop && pthread_cond_timedwait(&writer_cv, &lock, &t) != ETIMEDOUT) {
        }
        if (writer_stop) break;
        pthread_mutex_unlock(&lock);
        write_reporting(); /* takes the lock itself */
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

int stats_start(int n, const char *const *names) {
    pthread_mutex_lock(&lock);
    ndevs = n < STATS_MAX_DEVICES ? n : STATS_MAX_DEVICES;
    memset(devs, 0, sizeof(devs));
    for (int d = 0; d < ndevs; d++)
        snprintf(devs[d].name, sizeof(devs[d].name), "%s", names[d]);
    writer_stop = false;
    pthread_mutex_unlock(&lock);
    file_tmpl = param_str(P_ERDMA_STATS_FILE);
    interval_s = param_int(P_ERDMA_STATS_INTERVAL);
    if (!*file_tmpl) return 0;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&writer_cv, &ca);
    pthread_condattr_destroy(&ca);
    write_reporting(); /* the file exists from init on: a bad path is said at once */
    int rc = pthread_create(&writer, NULL, writer_main, NULL);
    if (rc) {
        pthread_cond_destroy(&writer_cv);
        WARN("cannot start the stats file writer: %s", strerror(rc));
        return -rc;
    }
    writer_running = true;
    INFO(NCCL_INIT | NCCL_NET, "writing traffic counters to %s every %ld s", file_tmpl, interval_s);
    return 0;
}

static void human_bytes(uint64_t b, char *out, size_t len) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    snprintf(out, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

static void info_lines(void) {
    for (int d = 0; d < ndevs; d++) {
        struct stats_counters c;
        uint64_t ev[STATS_EVENTS], errs = 0;
        stats_device_totals(d, &c, ev);
        for (int i = 0; i <= STATS_WC_STATUSES; i++)
            errs += c.wc_errors[i];
        char sent[32], recv[32];
        human_bytes(c.bytes_sent, sent, sizeof(sent));
        human_bytes(c.bytes_recv, recv, sizeof(recv));
        INFO(NCCL_NET,
             "%s: sent %s in %llu messages, received %s in %llu, %llu work requests, %llu "
             "flushes, %llu completion errors, connects %llu, accepts %llu (%llu rejected), "
             "longest request in flight %.3f s",
             devs[d].name, sent, (unsigned long long)c.msgs_sent, recv,
             (unsigned long long)c.msgs_recv, (unsigned long long)c.wrs_posted,
             (unsigned long long)c.flushes, (unsigned long long)errs,
             (unsigned long long)ev[STATS_CONNECT], (unsigned long long)ev[STATS_ACCEPT],
             (unsigned long long)ev[STATS_ACCEPT_REJECT], c.max_inflight_ns / 1e9);
    }
}

void stats_stop(void) {
    if (writer_running) {
        pthread_mutex_lock(&lock);
        writer_stop = true;
        pthread_cond_signal(&writer_cv);
        pthread_mutex_unlock(&lock);
        pthread_join(writer, NULL);
        pthread_cond_destroy(&writer_cv);
        writer_running = false;
        write_reporting(); /* the final counts */
    }
    info_lines();
}
