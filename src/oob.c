/* Owns TCP sockets and interface selection; never touches verbs. */
#define _GNU_SOURCE
#include "oob.h"
#include "device.h"
#include "log.h"
#include "params.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void oob_format(const struct sockaddr_in *a, char *out, int outlen) {
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    snprintf(out, outlen, "%s:%u", ip, ntohs(a->sin_port));
}

int oob_ifname_match(const char *spec, const char *ifname) {
    int exclude = 0, exact = 0, hit = 0;
    if (*spec == '^') exclude = 1, spec++;
    if (*spec == '=') exact = 1, spec++;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok && !hit;
         tok = strtok_r(NULL, ",", &save))
        hit = exact ? !strcmp(ifname, tok) : !strncmp(ifname, tok, strlen(tok));
    return exclude ? !hit : hit;
}

int oob_local_addr(const struct erdma_device *dev, struct sockaddr_in *out) {
    memset(out, 0, sizeof(*out));
    if (!param_is_set(P_SOCKET_IFNAME)) {
        if (dev->ip.sin_family != AF_INET) {
            WARN("%s: its netdev %s has no IPv4 address for the out-of-band connection; set "
                 "NCCL_SOCKET_IFNAME to an interface that has one",
                 dev->name, dev->netdev[0] ? dev->netdev : "(unknown)");
            return -EADDRNOTAVAIL;
        }
        *out = dev->ip;
        out->sin_port = 0;
        return 0;
    }
    const char *spec = param_str(P_SOCKET_IFNAME);
    struct ifaddrs *list, *ifa;
    if (getifaddrs(&list)) return -errno;
    int rc = -EADDRNOTAVAIL;
    for (ifa = list; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
        if (!oob_ifname_match(spec, ifa->ifa_name)) continue;
        memcpy(out, ifa->ifa_addr, sizeof(*out));
        out->sin_port = 0;
        rc = 0;
        break;
    }
    freeifaddrs(list);
    if (rc) WARN("NCCL_SOCKET_IFNAME=\"%s\" matches no interface with an IPv4 address", spec);
    return rc;
}

static int set_socket_opts(int fd) {
    int one = 1;
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)) return -errno;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}

int oob_listen(const struct sockaddr_in *local, int *fd_out, struct sockaddr_in *bound) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    socklen_t len = sizeof(*bound);
    int rc = set_socket_opts(fd);
    if (!rc && bind(fd, (const struct sockaddr *)local, sizeof(*local))) rc = -errno;
    if (!rc && listen(fd, 128)) rc = -errno;
    if (!rc && getsockname(fd, (struct sockaddr *)bound, &len)) rc = -errno;
    if (rc) {
        char a[64];
        oob_format(local, a, sizeof(a));
        WARN("cannot listen on %s: %s", a, strerror(-rc));
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

int oob_connect_start(const struct sockaddr_in *peer, int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int rc = set_socket_opts(fd);
    if (!rc && connect(fd, (const struct sockaddr *)peer, sizeof(*peer)) && errno != EINPROGRESS)
        rc = -errno;
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

int oob_connect_poll(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n = poll(&p, 1, 0);
    if (n < 0) return errno == EINTR ? 0 : -errno;
    if (n == 0) return 0;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)) return -errno;
    return err ? -err : 1;
}

/* Errors accept(2) passes on from a connection that failed before it was taken (its man
 * page: for TCP "treat them like EAGAIN"), and ECONNABORTED, a client that reset in the
 * backlog: that client is gone, the listening socket is fine. */
static bool accept_error_is_the_clients(int err) {
    switch (err) {
    case ECONNABORTED:
    case ENETDOWN:
    case EPROTO:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
        return true;
    default:
        return false;
    }
}

int oob_accept(int listen_fd, int *fd_out, struct sockaddr_in *peer) {
    socklen_t len = sizeof(*peer);
    int fd = accept4(listen_fd, (struct sockaddr *)peer, &len, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        return accept_error_is_the_clients(errno) ? 2 : -errno;
    }
    int rc = set_socket_opts(fd);
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 1;
}

int oob_send_progress(int fd, const void *buf, size_t len, size_t *done) {
    while (*done < len) {
        ssize_t n = send(fd, (const char *)buf + *done, len - *done, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
            return -errno;
        }
        *done += (size_t)n;
    }
    return 1;
}

int oob_recv_progress(int fd, void *buf, size_t len, size_t *done) {
    while (*done < len) {
        ssize_t n = recv(fd, (char *)buf + *done, len - *done, 0);
        if (n == 0) return -ECONNRESET;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
            return -errno;
        }
        *done += (size_t)n;
    }
    return 1;
}

int oob_goodbye_send(int fd) {
    char bye = OOB_BYE;
    return send(fd, &bye, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1 ? 0 : -EIO;
}

int oob_goodbye_seen(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & POLLIN) (void)!recv(fd, &c, 1, MSG_DONTWAIT);
    return 1;
}

int oob_peer_alive(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, 0);
    if (n <= 0) return 0;
    /* The goodbye is read first: a peer that said it and then closed its socket closed
     * normally, whatever the socket reports now. It is peeked, never consumed, so every
     * later look sees it too. */
    if (p.revents & POLLIN) {
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        /* after the handshake the only byte a peer sends is its goodbye */
        if (r > 0) return c == OOB_BYE ? OOB_PEER_CLOSING : -EPROTO;
        if (r == 0) return -ECONNRESET;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -errno;
    }
    if (p.revents & (POLLERR | POLLHUP)) return -ECONNRESET;
    return 0;
}

int oob_peer_hung_up(int fd) {
    /* oob_peer_alive's reading, where any other byte is the next stage's message arriving
     * early, left unread. A goodbye is a peer that gave up (its failed connect or accept
     * releases the comm, which says goodbye and closes): peeked, it would hide the end behind
     * it for ever. No message starts with that byte (conn.c asserts it). */
    int ret = oob_peer_alive(fd);
    if ((ret < 0 && ret != -EPROTO) || ret == OOB_PEER_CLOSING) return -ECONNRESET;
    if (ret != -EPROTO) return 0;
    /* A byte waits, early or stray: the peer is still there unless it also shut its end,
     * which such a byte would otherwise hide until the connect timeout. */
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) ? -ECONNRESET : 0;
}
