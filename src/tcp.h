/*
 * tcp.h - the socket object shared by connections (tcp.c) and listeners
 * (listen.c). Internal.
 *
 * A socket's state is touched only on its strand, with two exceptions: the
 * event word `ev`, which the backends' reapers, weft_tcp_close from other
 * threads and the shutdown sweep update by CAS, and the fields of io_uring's
 * multishot receive that its reaper writes or reads (rin, rheld, mcancel,
 * mclosing, m_armer, mres: tcp_recv.c has their argument). ev packs the
 * socket's generation (high 32 bits) and event bits (low 32 bits), one of
 * which, EV_QUEUED, says that one of the socket's two embedded nodes is queued
 * on its strand. The protocol (bit-test-and-set, writing only on change):
 *   signal:  CAS ev: cur -> cur | bits | EV_QUEUED, unless the generation
 *            differs (a stale epoll event: dropped) or every bit is already
 *            set with EV_QUEUED (nothing changes: no write at all). The
 *            signaller that turned EV_QUEUED on pushes node[post_idx].
 *   run:     (on the strand) post_idx ^= 1, then fetch_and clears every low
 *            bit (acq_rel) and handles the bits it read.
 * So at most one node of a socket is queued at any time, no bit is lost (a
 * bit set after the clear is either seen by a later run or it queued one),
 * and a node is never pushed while its previous run is still in progress:
 * the node pushed after a run cleared EV_QUEUED is the other one, and the
 * run before it (which used that one) had finished, since one strand runs
 * one node at a time. post_idx is written by the run before its release
 * RMW on ev and read by the signaller after its acquire CAS.
 *
 * io_uring results: the reaper stores rres or wres, then signals (release);
 * the strand reads them after its acquire.
 *
 * Memory: sockets come from a runtime pool whose slabs live until the
 * runtime is destroyed; the pool overwrites only the first 16 bytes of a
 * free object (node[0]), so ev and its generation survive a free. Freeing
 * bumps the generation by CAS, only while EV_QUEUED is clear.
 */
#ifndef WEFT_TCP_H
#define WEFT_TCP_H

#include "internal.h"

#include <sys/socket.h>
#include <sys/uio.h>

#define EV_QUEUED (1u << 0)
#define EV_IN (1u << 1)       /* epoll: readable, hang-up or error */
#define EV_OUT (1u << 2)      /* epoll: writable, hang-up or error */
#define EV_RDONE (1u << 3)    /* uring: read, accept or connect completed */
#define EV_WDONE (1u << 4)    /* uring: send completed */
#define EV_KICK (1u << 5)     /* run the state machine again */
#define EV_CLOSE (1u << 6)    /* weft_tcp_close / weft_listener_close */
#define EV_SHUTDOWN (1u << 7) /* the runtime shuts down */
#define EV_ACCEPTED (1u << 8) /* deliver the accept callback */
#define EV_CONNECT (1u << 9)  /* start connecting */
#define EV_HUP (1u << 10)     /* epoll: peer closed its side, or an error */
#define EV_RDATA (1u << 11)   /* uring: a multishot receive pushed data */
#define EV_RMEND (1u << 12)   /* uring: a multishot receive ended */
#define EV_LOW 0xffffffffull

/* a tag for events that need no generation check */
#define WEFT_GEN_ANY UINT32_MAX

enum { SK_CONN = 0, SK_LISTEN = 1 };
/* state: only forward */
enum {
  ST_NEW = 0,    /* accepted, callback not yet delivered */
  ST_CONNECTING, /* weft_tcp_connect: not connected yet */
  ST_OPEN,       /* connected */
  ST_CLOSING,    /* closing: waiting for operations in the kernel */
  ST_CLOSED,     /* descriptor closed; the user has not closed yet */
  ST_DONE        /* close callback delivered; freed when no node queued */
};

#define WEFT_SEND_IOV 64

struct weft__wreq {
  struct weft__wreq *next;
  weft_write_fn fn;
  void *arg;
  struct iovec *iov; /* inl, or malloc'ed */
  int iovcnt, iovpos;
  size_t left; /* bytes of this write not yet sent */
  int status;  /* completion: 0 or negative errno */
  struct iovec inl[2];
};

struct weft_listener;

struct weft__sock {
  struct weft__node node[2]; /* node[0] first: the pool may overwrite it */
  _Atomic uint64_t ev;       /* see the top of this file */
  unsigned post_idx;
  uint32_t gen;
  int fd;
  uint8_t kind, state;
  bool own_strand, user_closed, abortive, timed_out;
  bool readable, writable; /* epoll: edge seen, EAGAIN not yet */
  bool hup;                /* epoll: EOF or error queued: reads never wait */
  bool reading, rd_inflight, wr_inflight, shut_req, shut_sent, drain_wanted;
  bool free_pending;
  bool rd_short;     /* uring: the last receive drained the socket */
  bool rd_pollfirst; /* uring: the receive in flight waits for data first */
  int err;           /* sticky write error, 0 if none */
  weft_rt *rt;
  weft_strand *strand;
  struct weft__shard *reg; /* the registry holding it (its tcp_lock) */
  struct weft__sock *rnext, *rprev;
  int32_t rres, wres; /* uring: results of the ops in the kernel */
  /* read */
  void *rbuf;
  size_t rlen;
  weft_read_fn rfn;
  void *rarg;
  /* uring's multishot receive (tcp_recv.c): rd_multi while one is in the
   * kernel; rq: buffers taken from rin, unread; rd_term: end of file or
   * error to deliver once rq is read (rd_term_set) */
  bool rd_multi, rd_nobufs, rd_term_set, in_pump;
  int32_t mres; /* its end, written by the reaper before EV_RMEND */
  int32_t rd_term;
  struct weft__rbuf *rq_head, *rq_tail;
  _Atomic(struct weft__rbuf *) rin;       /* pushed by the reaper */
  _Atomic uint32_t rheld;                 /* pushed and not yet handed back */
  _Atomic uint32_t mcancel;               /* the reaper asked to cancel it */
  _Atomic uint32_t mclosing;              /* the socket closes: cancel it */
  _Atomic(struct weft__thread *) m_armer; /* the thread that submitted it */
  struct weft__io *m_io; /* the ring it went to (strand only) */
  /* writes: queue, completed ones (callbacks due), backpressure */
  struct weft__wreq *wq_head, *wq_tail, *done_head, *done_tail;
  struct weft__wreq wr_inline;
  bool wr_inline_busy;
  size_t queued, low, high;
  weft_drain_fn dfn;
  void *darg;
  struct msghdr msg; /* uring: the send in the kernel */
  size_t msg_bytes;  /* bytes gathered into msg */
  struct iovec siov[WEFT_SEND_IOV];
  /* connect, or accept delivery */
  weft_connect_fn cfn;
  void *carg;
  weft_timer *timer; /* connect timeout; listener: accept backoff */
  uint64_t timeout_ns;
  struct sockaddr_storage addr;
  unsigned addrlen;
  weft_accept_fn afn;
  void *aarg;
  /* close: close_req is set once by weft_tcp_close (any thread) */
  _Atomic uint32_t close_req;
  weft_close_fn clfn;
  void *clarg;
  /* listener sockets; an accepted connection until its accept callback */
  struct weft_listener *lst;
  uint64_t backoff_ns;
  bool paused;
  bool at_limit; /* the last accept burst ran out of descriptors */
  bool acc_more; /* the ring accept's completion: more connections wait */
  struct weft__sq_hold acc_hold; /* its share of lst->active */
};

/* tcp.c, used by listen.c */
struct weft__sock *weft__sock_new(weft_rt *rt, int fd, int kind,
                                  weft_strand *strand);
/* Publishes s (every field set before this call), registers it for the
 * shutdown sweep and with its home shard's epoll set; -ESHUTDOWN once the
 * runtime shuts down. */
int weft__sock_register(struct weft__sock *s, unsigned home);
/* Frees a socket that was never registered or never seen by the user. */
void weft__sock_discard(struct weft__sock *s);
/* From the socket's strand: run its state machine again soon. */
void weft__sock_kick(struct weft__sock *s);
void weft__sock_close_fd(struct weft__sock *s);
/* Frees s (on its strand) once no node of it is queued. */
void weft__sock_free(struct weft__sock *s);
bool weft__on_strand(const struct weft__sock *s);
void weft__conn_accepted(struct weft__sock *lsock, int fd);

/* The checks and choices connect and listen share. */
int weft__tcp_check(weft_rt *rt, const struct sockaddr *addr, unsigned addrlen);
int weft__tcp_socket(weft_rt *rt, int family);
unsigned weft__tcp_home(weft_rt *rt);

/* tcp_recv.c: a read's completion; the receive state machine's steps
 * from the strand handler (run: when open), weft_tcp_read (start), the
 * completion of a one-shot (completed) and the end of a multishot (ended);
 * whether a receive is in the kernel; closing. */
void weft__recv_done(struct weft__sock *s, long n);
void weft__recv_run(struct weft__sock *s);
void weft__recv_start(struct weft__sock *s);
void weft__recv_completed(struct weft__sock *s);
void weft__recv_ended(struct weft__sock *s);
bool weft__recv_busy(const struct weft__sock *s);
void weft__recv_closing(struct weft__sock *s);
void weft__recv_cancel(struct weft__sock *s);
bool weft__recv_cancel_local(struct weft__sock *s);
void weft__recv_release(struct weft__sock *s);

/* listen.c: an accepted connection not yet delivered counts as an item
 * of its listener (weft_listener_close's done waits for it) */
void weft__listener_hold(struct weft_listener *l);
void weft__listener_delivered(struct weft_listener *l);
/* listen.c, for tests: shards accepting without limit_lock now, ring
 * accepts not yet entered included (0 once the listener is quiet) */
uint32_t weft__listener_active(const struct weft_listener *l);
/* listen.c: the strand handler; the reaper's side of a ring accept */
void weft__lsock_run(struct weft__sock *s, uint32_t bits);
void weft__lsock_accepted(struct weft__shard *local, struct weft__sock *s,
                          int32_t res, uint32_t flags);

#endif
