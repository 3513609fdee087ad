/*
 * tcp_recv.h, tcp_recv.c - receiving on a connection: epoll's
 * non-blocking reads on readiness, io_uring's multishot receive into the
 * shard's provided buffers, and its one-shot receive into the reader's
 * buffer. The steps of the receive state machine, called by tcp.c.
 */
#ifndef WEFT_TCP_RECV_H
#define WEFT_TCP_RECV_H

#include "tcp.h"

/* A read's result to its callback. */
void weft__recv_done(struct weft__conn *c, long n);
/* The strand handler, while open: deliver what arrived, read or arm. */
void weft__recv_run(struct weft__conn *c);
/* weft_tcp_read: a read is pending now. */
void weft__recv_start(struct weft__conn *c);
/* EV_RDONE: a one-shot receive completed (rres). */
void weft__recv_completed(struct weft__conn *c);
/* EV_RMEND: the multishot receive ended (mres). */
void weft__recv_ended(struct weft__conn *c);
/* The reaper: a completion of c's multishot receive. */
void weft__recv_multishot_done(struct weft__shard *local, struct weft__conn *c,
                               const struct weft__cqe *cqe);
/* Whether a receive is in the kernel. */
bool weft__recv_busy(const struct weft__conn *c);
/* Closing: before shutdown(2); a pending read not in the kernel ends; a
 * multishot in this thread's ring is cancelled there (false: it is
 * elsewhere, or the ring is full); unread buffers go back once closed. */
void weft__recv_closing(struct weft__conn *c);
void weft__recv_cancel(struct weft__conn *c);
bool weft__recv_cancel_local(struct weft__conn *c);
void weft__recv_release(struct weft__conn *c);

#endif
