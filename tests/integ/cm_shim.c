/*
 * A test stand-in for librdmacm (loaded by the plugin through NCCL_ERDMA_RDMACM_LIB): every
 * function the plugin uses goes to the real librdmacm, and rdma_listen calls a hook the test
 * sets afterwards. It lets a test act at the one moment the plugin has a listener up and has
 * not used it yet (a stranger's request to the flush loopback's listener during its setup),
 * with no test code inside the plugin. CM_SHIM_DIE_IN=<function> makes the process kill itself
 * (SIGKILL) when the plugin calls that function: a peer that dies at one exact step of the
 * rdma_cm handshake. CM_SHIM_DIE_IN=warmup_repeat makes it lose its zero-length SENDs (the
 * sender's warm-ups) and die at the second, the repeat a sender posts once its ready message
 * is out and its receiver has not confirmed: a receiver then waits for warm-ups that never
 * come, from a sender that is gone. CM_SHIM_DIE_IN=warmup_disconnect loses them the same way
 * but, at the second, disconnects its rdma_cm ids and hangs with its socket open: the
 * receiver sees the rdma_cm disconnect first, as it now and then does when a killed sender's
 * DREQ overtakes its socket's end. cm_shim_port_taken() makes listens and connects fail as
 * when rdma_cm picks a port a TCP socket holds. cm_shim_migrate_fails() fails an
 * rdma_migrate_id, and an id destroyed after its event channel aborts the process.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*cm_shim_listen_hook)(struct rdma_cm_id *id, int backlog, void *arg);
static cm_shim_listen_hook hook;
static void *hook_arg;

void cm_shim_set_listen_hook(cm_shim_listen_hook fn, void *arg); /* dlsym()ed by the test */
void cm_shim_set_listen_hook(cm_shim_listen_hook fn, void *arg) {
    hook = fn;
    hook_arg = arg;
}

static void *real(const char *sym) {
    static void *lib;
    if (!lib) lib = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *f = lib ? dlsym(lib, sym) : NULL;
    if (!f) {
        fprintf(stderr, "cm_shim: no %s in librdmacm.so.1\n", sym);
        abort();
    }
    return f;
}

static void maybe_die(const char *name) {
    const char *at = getenv("CM_SHIM_DIE_IN");
    if (at && !strcmp(at, name)) raise(SIGKILL);
}

#define FORWARD(ret, name, params, args)                                                           \
    ret name params {                                                                              \
        static ret(*f) params;                                                                     \
        maybe_die(#name);                                                                          \
        if (!f) *(void **)&f = real(#name);                                                        \
        return f args;                                                                             \
    }

FORWARD(int, rdma_create_id,
        (struct rdma_event_channel * ch, struct rdma_cm_id **id, void *ctx,
         enum rdma_port_space ps),
        (ch, id, ctx, ps))
FORWARD(int, rdma_bind_addr, (struct rdma_cm_id * id, struct sockaddr *a), (id, a))
FORWARD(int, rdma_resolve_addr,
        (struct rdma_cm_id * id, struct sockaddr *src, struct sockaddr *dst, int ms),
        (id, src, dst, ms))
FORWARD(int, rdma_resolve_route, (struct rdma_cm_id * id, int ms), (id, ms))
FORWARD(void, rdma_destroy_qp, (struct rdma_cm_id * id), (id))
FORWARD(int, rdma_accept, (struct rdma_cm_id * id, struct rdma_conn_param *p), (id, p))
FORWARD(int, rdma_reject, (struct rdma_cm_id * id, const void *d, uint8_t len), (id, d, len))
FORWARD(int, rdma_disconnect, (struct rdma_cm_id * id), (id))
FORWARD(int, rdma_get_cm_event, (struct rdma_event_channel * ch, struct rdma_cm_event **ev),
        (ch, ev))
FORWARD(int, rdma_ack_cm_event, (struct rdma_cm_event * ev), (ev))
FORWARD(const char *, rdma_event_str, (enum rdma_cm_event_type ev), (ev))

/* Event channels destroyed so far (until a new one takes the same address): an id still
 * reporting to one of them is a use-after-free waiting in librdmacm, which reads the channel
 * when the id is destroyed. Such a destroy is reported and aborts the process. */
static struct rdma_event_channel *dead_channels[64];
static int ndead;
static pthread_mutex_t dead_lock = PTHREAD_MUTEX_INITIALIZER; /* the reaper destroys too */

static void channel_forget(struct rdma_event_channel *ch) {
    pthread_mutex_lock(&dead_lock);
    for (int i = 0; i < ndead; i++)
        if (dead_channels[i] == ch) dead_channels[i] = dead_channels[--ndead];
    pthread_mutex_unlock(&dead_lock);
}

static bool channel_dead(struct rdma_event_channel *ch) {
    bool dead = false;
    pthread_mutex_lock(&dead_lock);
    for (int i = 0; i < ndead; i++)
        dead |= dead_channels[i] == ch;
    pthread_mutex_unlock(&dead_lock);
    return dead;
}

struct rdma_event_channel *rdma_create_event_channel(void) {
    static struct rdma_event_channel *(*f)(void);
    maybe_die("rdma_create_event_channel");
    if (!f) *(void **)&f = real("rdma_create_event_channel");
    struct rdma_event_channel *ch = f();
    if (ch) channel_forget(ch);
    return ch;
}

void rdma_destroy_event_channel(struct rdma_event_channel *ch) {
    static void (*f)(struct rdma_event_channel *);
    maybe_die("rdma_destroy_event_channel");
    if (!f) *(void **)&f = real("rdma_destroy_event_channel");
    pthread_mutex_lock(&dead_lock);
    if (ch && ndead < (int)(sizeof(dead_channels) / sizeof(dead_channels[0])))
        dead_channels[ndead++] = ch;
    pthread_mutex_unlock(&dead_lock);
    f(ch);
}

int rdma_destroy_id(struct rdma_cm_id *id) {
    static int (*f)(struct rdma_cm_id *);
    maybe_die("rdma_destroy_id");
    if (!f) *(void **)&f = real("rdma_destroy_id");
    if (id && channel_dead(id->channel)) {
        fprintf(stderr,
                "cm_shim: rdma_destroy_id of an id whose event channel %p was destroyed "
                "before it (use after free)\n",
                (void *)id->channel);
        abort();
    }
    return f(id);
}

/* cm_shim_migrate_fails(n): the n-th rdma_migrate_id from now fails with ENOMEM without
 * reaching librdmacm (0: none). */
static int migrate_fail_at;
void cm_shim_migrate_fails(int n); /* dlsym()ed by the test */
void cm_shim_migrate_fails(int n) {
    migrate_fail_at = n;
}

int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch) {
    static int (*f)(struct rdma_cm_id *, struct rdma_event_channel *);
    maybe_die("rdma_migrate_id");
    if (!f) *(void **)&f = real("rdma_migrate_id");
    if (migrate_fail_at > 0 && --migrate_fail_at == 0) {
        errno = ENOMEM;
        return -1;
    }
    return f(id, ch);
}
FORWARD(uint16_t, rdma_get_src_port, (struct rdma_cm_id * id), (id))
FORWARD(struct ibv_context **, rdma_get_devices, (int *n), (n))
FORWARD(void, rdma_free_devices, (struct ibv_context * *list), (list))

/* The plugin posts through ibv_post_send, which calls the QP's context's post_send. */
static int (*real_post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);

static struct rdma_cm_id *qp_ids[16]; /* the ids rdma_create_qp gave a QP, to disconnect */
static int nqp_ids;
static bool hang_up_at_repeat; /* CM_SHIM_DIE_IN=warmup_disconnect */

static void disconnect_and_hang(void) {
    int (*disconnect)(struct rdma_cm_id *) = (int (*)(struct rdma_cm_id *))real("rdma_disconnect");
    for (int i = 0; i < nqp_ids; i++)
        if (disconnect(qp_ids[i]))
            fprintf(stderr, "cm_shim: rdma_disconnect failed: %s\n", strerror(errno));
    for (;;)
        pause(); /* the test kills us */
}

static int lossy_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    static int lost;
    if (wr && !wr->next && wr->opcode == IBV_WR_SEND && wr->num_sge == 0) { /* a warm-up */
        if (++lost == 2) {
            if (hang_up_at_repeat) disconnect_and_hang();
            raise(SIGKILL);
        }
        return 0;
    }
    return real_post_send(qp, wr, bad);
}

int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
    static int (*f)(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *);
    maybe_die("rdma_create_qp");
    if (!f) *(void **)&f = real("rdma_create_qp");
    int ret = f(id, pd, a);
    const char *at = getenv("CM_SHIM_DIE_IN");
    if (ret == 0 && at && (!strcmp(at, "warmup_repeat") || !strcmp(at, "warmup_disconnect"))) {
        hang_up_at_repeat = !strcmp(at, "warmup_disconnect");
        if (nqp_ids < (int)(sizeof(qp_ids) / sizeof(qp_ids[0]))) qp_ids[nqp_ids++] = id;
        if (id->qp->context->ops.post_send != lossy_post_send) {
            real_post_send = id->qp->context->ops.post_send;
            id->qp->context->ops.post_send = lossy_post_send;
        }
    }
    return ret;
}

/* cm_shim_port_taken(listens, connects): the next `listens` rdma_listen and `connects`
 * rdma_connect calls fail with EADDRINUSE without reaching librdmacm, as on siw when the port
 * rdma_cm chose is held by a TCP socket. cm_shim_port_taken_left() counts those not used. */
static int listens_refused, connects_refused;
void cm_shim_port_taken(int listens, int connects); /* dlsym()ed by the test */
void cm_shim_port_taken(int listens, int connects) {
    listens_refused = listens;
    connects_refused = connects;
}
int cm_shim_port_taken_left(void);
int cm_shim_port_taken_left(void) {
    return listens_refused + connects_refused;
}

/* Uses one of *left refusals: true (errno EADDRINUSE) while some are left. */
static bool port_taken(int *left) {
    if (*left <= 0) return false;
    (*left)--;
    errno = EADDRINUSE;
    return true;
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p) {
    static int (*f)(struct rdma_cm_id *, struct rdma_conn_param *);
    maybe_die("rdma_connect");
    if (!f) *(void **)&f = real("rdma_connect");
    if (port_taken(&connects_refused)) return -1;
    return f(id, p);
}

int rdma_listen(struct rdma_cm_id *id, int backlog) {
    static int (*f)(struct rdma_cm_id *, int);
    maybe_die("rdma_listen");
    if (!f) *(void **)&f = real("rdma_listen");
    if (port_taken(&listens_refused)) return -1;
    int ret = f(id, backlog);
    if (ret == 0 && hook) hook(id, backlog, hook_arg);
    return ret;
}
