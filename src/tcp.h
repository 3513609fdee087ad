/*
 * tcp.h, tcp.c - TCP connections: a socket (sock.h) with a connection's
 * state: creation (connect, accept), the strand handler's state machine,
 * connecting with a timeout, half-close, close, and the public weft_tcp_*
 * calls. Receiving is tcp_recv.c's, writing tcp_send.c's, options and
 * addresses tcp_opt.c's.
 *
 * Everything here is touched only on the connection's strand, but `ev`
 * (sock.h), close_req (weft_tcp_close, from any thread), the results the
 * io_uring reaper writes before it signals their event (rres, wres,
 * mres), and what it shares with the strand for a multishot receive
 * (rin, mstate, m_armer: tcp_recv.c has their argument).
 */
#ifndef WEFT_TCP_H
#define WEFT_TCP_H

#include "sock.h"

#include <sys/socket.h>
#include <sys/uio.h>

/* A connection's own event bits (sock.h has the shared ones). */
#define EV_RDONE (EV_KIND << 0)    /* uring: a one-shot receive completed */
#define EV_WDONE (EV_KIND << 1)    /* uring: a send completed */
#define EV_CDONE (EV_KIND << 2)    /* uring: the connect completed */
#define EV_RDATA (EV_KIND << 3)    /* uring: a multishot receive pushed data */
#define EV_RMEND (EV_KIND << 4)    /* uring: a multishot receive ended */
#define EV_ACCEPTED (EV_KIND << 5) /* deliver the accept callback */
#define EV_CONNECT (EV_KIND << 6)  /* start connecting */

#define WEFT_SEND_IOV 64

/* A write: iovcnt buffers, or, for a file send, file_fd >= 0 and no
 * buffers (its bytes are the file's from file_off on). ctl: descriptors
 * to pass with its first byte (weft_tcp_send_fds: an SCM_RIGHTS control
 * message of ctllen bytes, malloc'ed), sent once ctl_sent. */
struct weft__wreq {
  struct weft__wreq *next;
  weft_write_fn fn;
  void *arg;
  struct iovec *iov; /* inl, or malloc'ed */
  int iovcnt, iovpos;
  size_t left; /* bytes of this write not yet sent */
  int status;  /* completion: 0 or negative errno */
  int file_fd;
  off_t file_off;
  void *ctl;
  size_t ctllen;
  bool ctl_sent;
  struct iovec inl[2];
};

/* The queue's unsent bytes gathered for one send: held only while a send
 * is in the kernel (io_uring reads msg and iov until it completes); from
 * the runtime's send pool. */
struct weft__sendbuf {
  struct msghdr msg;
  size_t bytes;   /* gathered into msg */
  bool file_next; /* a file send follows them in the queue */
  struct iovec iov[WEFT_SEND_IOV];
};

/* A connection's writes while it has any: taken from the runtime's pool
 * when a write is queued and none is held, given back once the queue,
 * the completed writes and the send in the kernel are all gone
 * (tcp_send.c), so an idle connection holds none of it. */
struct weft__wstate {
  /* the queue, then the completed writes whose callbacks are due */
  struct weft__wreq *wq_head, *wq_tail, *done_head, *done_tail;
  struct weft__sendbuf *sb; /* uring: the send in the kernel, if any */
  size_t queued;            /* weft_tcp_queued */
  bool inl_busy;
  struct weft__wreq inl; /* one write needs no allocation of its own */
};

/* weft_tcp_set_watermarks's settings (tcp_send.c). */
struct weft__wmark {
  size_t low, high;
  weft_drain_fn fn;
  void *arg;
};

/* What only some connections have, behind one pointer (c->more), from the
 * first call that sets any of it until the connection's end (tcp.c,
 * close_run): timeouts, read-until and descriptor passing own what they
 * point to and free it when the connection closes. */
struct weft__tcp_more {
  struct weft__tmo *tmo;     /* weft_tcp_set_timeouts, or NULL */
  struct weft__until *until; /* weft_tcp_read_until, or NULL */
  struct weft__fdq *fdq;     /* weft_tcp_set_fd_limit, or NULL (unix.h) */
  bool wm_set;               /* else the default watermarks */
  struct weft__wmark wm;
};

/* weft_tcp_connect's request, until the connect callback. */
struct weft__connect {
  weft_connect_fn fn;
  void *arg;
  weft_timer *timer; /* the timeout, if any */
  uint64_t timeout_ns;
  bool timed_out;
  unsigned addrlen;
  struct sockaddr_storage addr;
};

/* Every connection, idle ones included, holds one of these, carved in
 * whole cache lines (pool.c): three (tcp.c asserts it, but in a
 * simulation's build). What only some connections use, for a while or at
 * all, is held elsewhere: the writes' state while there are writes, and
 * behind `more` the watermarks, timeouts, read-until and descriptor
 * passing. The 4-byte words come first, in pairs, then the pointers. */
struct weft__conn {
  struct weft__sock s;
  /* Flags, in bits: all are read and written on the strand alone (what
   * weft_tcp_close, from any thread, says is in close_req). */
  bool user_closed : 1; /* EV_CLOSE seen */
  /* epoll: an edge seen, EAGAIN not yet. A socket starts writable and
   * not readable: the watch's EPOLL_CTL_ADD polls it and queues an event
   * for data already waiting (ep_insert), so the first read waits for
   * that edge rather than trying a receive that finds nothing (an
   * accepted client's request mostly arrives after the accept). */
  bool readable : 1, writable : 1;
  bool hup : 1; /* epoll: EOF or error queued: reads never wait */
  /* epoll: a short receive left nothing unread. A TCP receive stops short
   * at the end of what has arrived, or at urgent data (EV_PRI clears
   * this for good); a Unix one also after a message that carried
   * descriptors, so there only EAGAIN says the socket is empty. */
  bool short_empty : 1;
  /* rd_inflight: a one-shot receive, or the connect, is in the kernel */
  /* wr_inflight: a send, or (wr_poll) a poll for room, is in the kernel */
  bool reading : 1, rd_inflight : 1, wr_inflight : 1, wr_poll : 1;
  bool shut_req : 1, shut_sent : 1, drain_wanted : 1;
  bool nonblock : 1;     /* uring: made O_NONBLOCK for sendfile (tcp_send.c) */
  bool rd_short : 1;     /* uring: the last receive drained the socket */
  bool rd_pollfirst : 1; /* uring: the receive in flight waits for data first */
  /* uring's multishot receive (tcp_recv.c): rd_multi while one is in the
   * kernel; rq: buffers taken from rin, unread; rd_term_set: mres holds
   * the end of file or error to deliver once rq is read */
  bool rd_multi : 1, rd_nobufs : 1, rd_term_set : 1, in_pump : 1;
  bool read_made : 1;    /* a read was made (weft_tcp_set_fd_limit) */
  bool close_posted : 1; /* the close callback is queued (tcp.c, post_close) */
#ifdef WEFT_SIM
  /* A TCP connection of a simulation, a Unix socket underneath (sim.h):
   * the family and the ports its addresses read; sim_family 0 for a real
   * Unix connection. */
  uint8_t sim_family;
#endif
  int err;            /* sticky write error, 0 if none */
  int32_t rres, wres; /* uring: results of the ops in the kernel */
  /* The multishot's end, written by the reaper; once it is handled, the
   * end of file or error to deliver (rd_term_set), until a read takes it:
   * no receive is armed meanwhile. */
  int32_t mres;
  uint32_t rlen; /* a read's length (at most READ_MAX, tcp.c) */
  /* What the reaper and the strand share of the multishot receive
   * (tcp_recv.c): the buffers pushed and not yet handed back (MS_HELD's
   * bits), MS_CANCEL (a cancel was asked) and MS_CLOSING (the socket
   * closes: cancel it). */
  _Atomic uint32_t mstate;
  /* close: close_req goes 0 -> CLOSE_USER, with CLOSE_ABORT for an
   * abortive close (weft_tcp_close, any thread, which then signals
   * EV_CLOSE) or 0 -> CLOSE_SELF (on the strand: a shutdown, a failed
   * connect), once. The close callback comes when the descriptor is
   * closed and, for CLOSE_USER, EV_CLOSE was seen: after that nothing may
   * signal c, since its memory is then reused. */
  _Atomic uint32_t close_req;
#ifdef WEFT_SIM
  uint16_t sim_lport, sim_pport;
#endif
  /* One word, by state: the listener until the accept callback (ST_NEW),
   * the request while connecting (ST_CONNECTING), then a read's buffer
   * (reads are made only once open: weft__tcp_usable). */
  union {
    struct weft_listener *lst;
    struct weft__connect *cn;
    void *rbuf;
  };
  weft_read_fn rfn; /* a read's callback and argument */
  void *rarg;
  /* The unread buffers taken from rin, a ring through their next: rq is
   * the last, rq->next the first; NULL when none. */
  struct weft__rbuf *rq;
  _Atomic(struct weft__rbuf *) rin;       /* pushed by the reaper */
  _Atomic(struct weft__thread *) m_armer; /* the thread that submitted it */
  struct weft__io *m_io;   /* the ring it went to (strand only) */
  struct weft__wstate *ws; /* writes: their state while any is held */
  weft_close_fn clfn;      /* weft_tcp_set_data */
  void *data;
  struct weft__tcp_more *more; /* NULL until something of it is set */
};

static inline struct weft__conn *weft__conn_of(const weft_tcp *c) {
  return (struct weft__conn *)c;
}

static inline struct weft__tmo *weft__tcp_tmo(const struct weft__conn *c) {
  return c->more ? c->more->tmo : NULL;
}
static inline struct weft__until *weft__tcp_until(const struct weft__conn *c) {
  return c->more ? c->more->until : NULL;
}
static inline struct weft__fdq *weft__tcp_fdq(const struct weft__conn *c) {
  return c->more ? c->more->fdq : NULL;
}
/* c->more, allocated (zeroed) if c has none; NULL without memory. */
struct weft__tcp_more *weft__tcp_more(struct weft__conn *c);

/* The runtime's side: the pools at create and destroy. */
void weft__tcp_init(weft_rt *rt);
void weft__tcp_destroy(weft_rt *rt);
/* A connection accepted on listener l with descriptor fd; its accept
 * callback comes on its own strand (listen.c). */
void weft__tcp_accepted(weft_rt *rt, struct weft_listener *l, int fd);
/* The checks and choices connect and listen share: the address, the
 * backend, the runtime's state (and setting up the backends); a socket of
 * the address's family that the backend can serve. */
int weft__tcp_check(weft_rt *rt, const struct sockaddr *addr, unsigned addrlen);
/* The same without an address: -ENOTSUP (backend NONE), -ESHUTDOWN, or
 * the backends' setup (weft__io_ensure). */
int weft__tcp_check_rt(weft_rt *rt);
/* On the strand: weft closes c by itself (a shutdown, a failed connect, a
 * timeout), unless a weft_tcp_close came first. */
void weft__tcp_close_self(struct weft__conn *c);
/* The checks of a call on a connection (what names it in a misuse
 * message): 0, or the call's error. on_strand: a connection of this
 * process's runtime, on its strand; usable: that, and open. */
int weft__tcp_on_strand(const struct weft__conn *c, const char *what);
int weft__tcp_usable(const struct weft__conn *c, const char *what);
/* A call made off c's strand: logs which (WEFT_LOG_DEBUG), -EPERM. */
int weft__tcp_off_strand(const struct weft__conn *c, const char *what);
int weft__tcp_socket(weft_rt *rt, int family);
/* A connection over fd, a connected stream socket (a socketpair's end:
 * process.c), open at once on strand s (NULL: its own). fd is the
 * connection's from now on, even on error. 0, -ENOMEM, -ESHUTDOWN. */
int weft__tcp_adopt(weft_rt *rt, weft_strand *s, int fd, weft_tcp **out);

#endif
