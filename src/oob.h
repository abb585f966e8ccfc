/*
 * Out-of-band TCP: the socket a connection's metadata travels over, and that
 * stays open afterwards so a dead peer shows up as EOF. Every call is
 * non-blocking: progress functions return 1 (complete), 0 (not yet) or -errno.
 */
#ifndef ERDMA_OOB_H
#define ERDMA_OOB_H

#include <netinet/in.h>
#include <stddef.h>

struct erdma_device;

/* The local address to listen on: NCCL_SOCKET_IFNAME's first match, else the device's netdev. */
int oob_local_addr(const struct erdma_device *dev, struct sockaddr_in *out);
int oob_listen(const struct sockaddr_in *local, int *fd, struct sockaddr_in *bound);
int oob_connect_start(const struct sockaddr_in *peer, int *fd);
int oob_connect_poll(int fd);
/* 1 with *fd set, 0 when nobody is waiting, 2 when the client taken had failed already (try
 * the next), -errno when the listening socket fails. */
int oob_accept(int listen_fd, int *fd, struct sockaddr_in *peer);
int oob_send_progress(int fd, const void *buf, size_t len, size_t *done);
int oob_recv_progress(int fd, void *buf, size_t len, size_t *done);
/* Sent by a closing comm; oob_peer_alive() reads it as "the peer is closing". */
#define OOB_BYE 'B'
/* Tells the peer we are closing: 0 when sent. */
int oob_goodbye_send(int fd);
/* 1 once the peer's goodbye (or EOF, or an error) is there to read, and reads it; else 0.
 * Never blocks. */
int oob_goodbye_seen(int fd);
/* 0 while nothing happened, OOB_PEER_CLOSING once the peer said goodbye (a normal close),
 * -ECONNRESET when it went away without one or the socket failed, -EPROTO for any other byte.
 * Never blocks. */
#define OOB_PEER_CLOSING 1
int oob_peer_alive(int fd);
/* For the handshake's quiet stages, when the peer sends nothing until it is done (the rdma_cm
 * part): -ECONNRESET once the socket shows its end or an error with nothing left to read, else
 * 0. Bytes that did arrive are left for the stage that reads them. Never blocks. */
int oob_peer_hung_up(int fd);
void oob_format(const struct sockaddr_in *a, char *out, int outlen);
/* Pure: does interface name match an NCCL_SOCKET_IFNAME list ("^a,b", "=a", "a")? */
int oob_ifname_match(const char *spec, const char *ifname);

#endif
