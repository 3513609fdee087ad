/*
 * tcp_timeout.h, tcp_timeout.c - a connection's timeouts
 * (weft_tcp_set_timeouts): idle, read and write deadlines kept by one
 * timer on the connection's strand. tcp.c and tcp_recv.c tell it when a
 * read starts and when bytes move; it closes the connection with
 * -ETIMEDOUT when a deadline passes.
 *
 * Nothing is re-armed per operation: progress only moves timestamps. The
 * timer stays armed at the earliest deadline it knew; when it fires it
 * recomputes the deadlines from the timestamps, and either closes the
 * connection or goes back to sleep until the new earliest. Only a new
 * deadline earlier than the armed one (a read or write started with a
 * shorter timeout than the idle one) re-arms it at once.
 */
#ifndef WEFT_TCP_TIMEOUT_H
#define WEFT_TCP_TIMEOUT_H

#include "tcp.h"

#include <errno.h>

struct weft__tmo {
  weft_timer *timer;          /* on the connection's strand */
  uint64_t idle, read, write; /* ns; 0: none */
  uint64_t armed_at;          /* the timer's deadline; UINT64_MAX: none */
  uint64_t last_io;           /* last bytes delivered or sent, or the setting */
  uint64_t read_since;        /* the pending read's start */
  uint64_t write_since; /* the queue's last progress, or its first bytes */
  bool fired;           /* it closed the connection */
};

/* Hooks, on the strand, only for a connection with timeouts (weft__tcp_tmo). */
void weft__tmo_read_started(struct weft__conn *c);
void weft__tmo_write_queued(struct weft__conn *c); /* into an empty queue */
void weft__tmo_progress(struct weft__conn *c, bool sent);
/* Closed: the timer is destroyed (a firing still queued is dropped). */
void weft__tmo_free(struct weft__conn *c);

/* What an operation that the close ended completes with. */
static inline int weft__tcp_close_status(const struct weft__conn *c) {
  const struct weft__tmo *t = weft__tcp_tmo(c);
  return t && t->fired ? -ETIMEDOUT : -ECANCELED;
}

#endif
