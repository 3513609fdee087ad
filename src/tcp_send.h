/*
 * tcp_send.h, tcp_send.c - a connection's writes: the queue of writes and
 * file sends in order, partial sends, backpressure (watermarks), sending
 * on readiness (epoll) or through the ring (io_uring), sending a file
 * with sendfile(2), and the write callbacks. The steps called by tcp.c's
 * strand handler; everything here runs on the connection's strand.
 */
#ifndef WEFT_TCP_SEND_H
#define WEFT_TCP_SEND_H

#include "tcp.h"

/* Sends what the queue holds, as the backend does it; FIN after the last
 * write once weft_tcp_shutdown asked for it; gives the write state back
 * if nothing in it is left. Only while open. Inline, as the calls below:
 * a connection without write state, the most common one in a strand
 * turn, then costs a test, not a call that saves registers first. */
void weft__send_pump_held(struct weft__conn *c);
static inline void weft__send_pump(struct weft__conn *c) {
  if (c->s.state == ST_OPEN && (c->ws || c->shut_req))
    weft__send_pump_held(c);
}
/* io_uring: the send or the poll for room in the kernel completed
 * (c->wres its result). */
void weft__send_completed(struct weft__conn *c);
/* Every queued write fails with status (close, error). */
void weft__send_fail(struct weft__conn *c, int status);
/* A write is queued (its bytes not all sent). */
bool weft__send_queued(const struct weft__conn *c);
/* Calls the due write callbacks, then the drain callback, and gives the
 * write state back if nothing in it is left; only from the strand handler
 * (never inside a weft_tcp_* call). */
void weft__send_flush_held(struct weft__conn *c);
static inline void weft__send_flush(struct weft__conn *c) {
  if (c->ws || c->drain_wanted)
    weft__send_flush_held(c);
}
#endif
