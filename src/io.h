/*
 * io.h, io.c - each shard's I/O backend and the verbs the socket code
 * speaks to it. Only io.c, io_uring.c, io_bufring.c and io_epoll.c know
 * how an operation is made (liburing, epoll); sockets name what they want
 * with the verbs below and hear back through a handle they embed.
 *
 * Two kinds of backend serve a shard. A completion backend (io_uring)
 * takes operations (receive, send, connect, accept, poll, cancel, close)
 * and completes each later, once, to its handle. A readiness backend
 * (epoll) takes a registration per descriptor and reports readiness to
 * its handle; the socket then makes the system call itself. The socket
 * code picks its strategy with weft__io_completes; every verb of the
 * completion kind returns -ENOTSUP on the other.
 *
 * Threads: a shard's backend is used only by the thread holding the shard
 * (the same exclusion as its run queue's owner side). Verbs take that
 * shard (the caller's weft__local_begin) and never reap completions: a
 * handle's done runs only from the run loop's poll, never inside a verb.
 */
#ifndef WEFT_IO_H
#define WEFT_IO_H

#include "rt.h"
#include "shard.h"

struct msghdr;
struct sockaddr;

/* What an operation is, in the low bits of its tag (the handle's address,
 * 8-byte aligned). */
enum {
  WEFT_OP_RECV = 1, /* a one-shot receive into the caller's buffer */
  WEFT_OP_RECVM,    /* a multishot receive into provided buffers */
  WEFT_OP_SEND,     /* a send, or a sendmsg */
  WEFT_OP_CONNECT,
  WEFT_OP_ACCEPT, /* a multishot accept */
  WEFT_OP_POLL,   /* a one-shot poll (for what its owner asked) */
  WEFT_OP_FILE,   /* a file operation (struct weft__fileop) */
  WEFT_OP_QUIET   /* no handle: a cancel or close nobody waits for */
};
#define WEFT_OP_MASK 7u

/* A buffer the kernel filled for a multishot receive (a provided buffer
 * of the shard's ring, io_bufring.c). next links it in a socket's queue;
 * len and off: its data, unread from off on. The socket gives it back
 * with weft__io_buf_put once read. */
struct weft__rbuf {
  struct weft__rbuf *next;
  struct weft__io *io; /* the ring it belongs to */
  char *data;
  uint32_t len, off;
  uint16_t bid;
};

/* Pushes b on a stack of buffers that a consumer takes whole, with one
 * exchange (acquire): release, so that b's fields written before the push
 * are seen by the taker. Nothing pops single nodes, so there is no ABA. */
static inline void weft__rbuf_push(_Atomic(struct weft__rbuf *) *top,
                                   struct weft__rbuf *b) {
  struct weft__rbuf *head = atomic_load_explicit(top, memory_order_relaxed);
  do
    b->next = head;
  while (!atomic_compare_exchange_weak_explicit(
      top, &head, b, memory_order_release, memory_order_relaxed));
}

/* A file operation for weft__io_file (fs.c): what, on which descriptor,
 * and its arguments; everything it points to stays valid until the
 * completion. */
enum {
  WEFT_FOP_READ,
  WEFT_FOP_WRITE,
  WEFT_FOP_READV,
  WEFT_FOP_WRITEV,
  WEFT_FOP_FSYNC,
  WEFT_FOP_FDATASYNC,
  WEFT_FOP_OPEN,
  WEFT_FOP_CLOSE,
  WEFT_FOP_STATX
};
struct statx;
struct weft__fileop {
  int kind;
  int fd;       /* OPEN, STATX: the directory (AT_FDCWD) or, with an empty
                   path, the file itself */
  void *buf;    /* READ, WRITE */
  size_t len;   /* READ, WRITE; READV, WRITEV: the iovec count */
  uint64_t off; /* READ..WRITEV: the offset, or -1 for the file position */
  const struct iovec *iov;
  const char *path;  /* OPEN, STATX */
  int flags;         /* OPEN: open(2)'s; STATX: AT_* */
  unsigned mode;     /* OPEN */
  struct statx *stx; /* STATX */
};

/* A completion, or readiness (epoll). */
struct weft__cqe {
  int32_t res;    /* the operation's result: >= 0, or -errno */
  uint32_t flags; /* WEFT_CQE_* */
  /* RECVM: the buffer that holds res > 0 bytes, else NULL */
  struct weft__rbuf *buf;
  uint32_t events; /* READY: WEFT_IO_* */
  uint32_t gen;    /* READY: the tag given to weft__io_watch (16 bits) */
};
#define WEFT_CQE_MORE 1u /* RECVM, ACCEPT: the operation goes on */

#define WEFT_IO_IN 1u  /* readable, hang-up or error */
#define WEFT_IO_OUT 2u /* writable, hang-up or error */
#define WEFT_IO_HUP 4u /* the peer closed its side, or an error */
#define WEFT_IO_PRI 8u /* epoll: urgent (TCP out-of-band) data arrived */

/* Embedded in whatever makes operations. done runs on the thread that
 * holds the shard whose backend completed the operation (local); the owner
 * must stay alive until the last completion of each of its operations has
 * been handed to it. Readiness (WEFT_OP_READY) is reported to the socket
 * that embeds h, through weft__sock_ready (sock.h), never through done: a
 * readiness report may be stale, and only the socket's generation check
 * tells. */
struct weft__ioh {
  void (*done)(struct weft__ioh *h, struct weft__shard *local, unsigned op,
               const struct weft__cqe *c);
};

#define WEFT_IO_EVBUF 64
#define WEFT_RBUF_COUNT 128u /* a power of two */
#define WEFT_RBUF_SIZE 4096u

/* A shard's backend. Its fields are the backends' own (io*.c). */
struct weft__io {
  int kind; /* WEFT_BACKEND_URING or WEFT_BACKEND_EPOLL */
  int efd;  /* eventfd: written to wake the holder from its wait */
  struct weft__shard *sh;
  unsigned unsubmitted; /* uring: SQEs prepared and not yet entered */
  unsigned close_n;     /* uring: close entries not yet entered */
  uint32_t close_pos;   /* uring: the last one's SQ index + 1 */
  bool wake_armed;      /* uring: a poll of efd is in the ring */
  void *ring;           /* uring: struct io_uring */
  /* uring: provided receive buffers, NULL if the kernel has none */
  void *br; /* struct io_uring_buf_ring */
  struct weft__rbuf *rbufs;
  char *rbuf_mem;
  _Atomic(struct weft__rbuf *) rbuf_ret; /* handed back by other threads */
  /* buffers given to sockets, and given back: by the holder, by others */
  _Atomic uint64_t st_rbuf_out, st_rbuf_in, st_rbuf_ret;
  int epfd;            /* epoll */
  bool ms_waits;       /* epoll: no epoll_pwait2, so epoll_wait (io_epoll.c) */
  unsigned nev, evpos; /* epoll: events waited for, not yet dispatched */
  uint64_t evdata[WEFT_IO_EVBUF];
  uint32_t evbits[WEFT_IO_EVBUF];
};

/* ---- the runtime's side ------------------------------------------------ */

/* At create: decides the backend (a probe ring, once per process). */
int weft__io_init(weft_rt *rt, int backend);
/* Before the first socket: sets up every shard's backend (once), and
 * starts every dormant thread. -ENOTSUP for backend NONE. */
int weft__io_ensure(weft_rt *rt);
void weft__io_destroy(weft_rt *rt);
void weft__io_stats(weft_rt *rt, weft_stats *out);
/* Run loop: submit what is prepared, dispatch what completed. look: a
 * readiness backend asks the kernel now (a system call); without it, one
 * turn in 16 (io.c says why). */
void weft__io_poll(struct weft__shard *sh, struct weft__io *io, bool look);
/* Submits what the shard has prepared (a no-op for readiness backends). */
void weft__io_flush(struct weft__shard *sh);
/* Park: sleep in the backend until woken (t->wake), an event, or deadline
 * (UINT64_MAX: none). Dispatches nothing (the thread is still counted
 * parked); returns true when events wait to be dispatched. */
bool weft__io_wait(struct weft__thread *t, struct weft__io *io,
                   uint64_t deadline);
/* Wakes t if it sleeps in a backend; false if it does not (use the futex). */
bool weft__io_wake_thread(struct weft__thread *t);

/* ---- the verbs ----------------------------------------------------------- */

/* Whether the runtime's backend completes operations (io_uring) rather
 * than reporting readiness (epoll). */
static inline bool weft__io_completes(const weft_rt *rt) {
  return rt->io.backend == WEFT_BACKEND_URING;
}
/* The flags of a socket the backend serves (socket(2), accept4(2)):
 * non-blocking for readiness, blocking for completions (an O_NONBLOCK
 * socket makes some kernels complete an operation with -EAGAIN instead of
 * waiting). */
int weft__io_sock_flags(weft_rt *rt);
/* Readiness backends: reports fd's readiness from now on, on shard home,
 * edge-triggered (in; out too if out), to the socket that embeds h, each
 * report tagged with gen. A no-op on completion backends. */
int weft__io_watch(weft_rt *rt, struct weft__shard *home, int fd,
                   struct weft__ioh *h, uint32_t gen, bool out);
/* Closes fd, one of the runtime's busy descriptors (rt.c): through sh's
 * ring where there is one (the count drops once an enter has taken the
 * entry; every operation on fd must have completed), else at once. sh
 * may be NULL. */
void weft__io_close(weft_rt *rt, struct weft__shard *sh, int fd);

/* Completion backends. Each queues one operation in sh's ring, tagged
 * with h and the op, to leave with the thread's next enter: 0, or -EAGAIN
 * when sh is NULL or the ring stays full (try again later). */
int weft__io_recv(struct weft__shard *sh, int fd, void *buf, size_t len,
                  bool poll_first, struct weft__ioh *h);
/* A one-shot recvmsg (completes as weft__io_recv does); msg and what it
 * points to must stay valid until the completion. */
int weft__io_recvmsg(struct weft__shard *sh, int fd, struct msghdr *msg,
                     int flags, bool poll_first, struct weft__ioh *h);
/* -ENOBUFS: the shard has no provided buffers (receive one-shot). */
int weft__io_recv_multishot(struct weft__shard *sh, int fd,
                            struct weft__ioh *h);
int weft__io_send(struct weft__shard *sh, int fd, struct msghdr *msg,
                  struct weft__ioh *h);
int weft__io_connect(struct weft__shard *sh, int fd,
                     const struct sockaddr *addr, unsigned addrlen,
                     struct weft__ioh *h);
/* A one-shot poll for events (WEFT_IO_IN, WEFT_IO_OUT). */
int weft__io_poll_fd(struct weft__shard *sh, int fd, unsigned events,
                     struct weft__ioh *h);
/* A file operation, completed with its result (WEFT_OP_FILE). */
int weft__io_file(struct weft__shard *sh, const struct weft__fileop *op,
                  struct weft__ioh *h);
/* A multishot accept (rt->io.ring_accept): a completion per connection,
 * with WEFT_CQE_MORE while it goes on, until an error or a cancel ends
 * it. */
int weft__io_accept(struct weft__shard *sh, int fd, int flags,
                    struct weft__ioh *h);
/* Cancels h's operation op; its completion still comes. now: enter it at
 * once rather than with the thread's next enter (it still reaps nothing).
 * The cancel's own result is not reported. */
int weft__io_cancel(struct weft__shard *sh, struct weft__ioh *h, unsigned op,
                    bool now);
/* Cancels h's operation op in io's ring, from any thread, which need not
 * hold it (the one exception to the rule above): once this returns 0 the
 * operation does nothing more, though its completion comes to its ring as
 * usual. -ENOENT: none was in the kernel (ended, or never entered);
 * -ETIME: running, and not cancelled within timeout_ns (which bounds
 * only that); -ENOTSUP: not a ring. */
int weft__io_cancel_sync(struct weft__io *io, struct weft__ioh *h, unsigned op,
                         uint64_t timeout_ns);
/* sh's backend, to tell later whether a thread holds the same one (a
 * multishot receive's ring); NULL for sh NULL. */
static inline struct weft__io *weft__io_of(struct weft__shard *sh) {
  return sh ? weft__load(&sh->io, WA_ACQ) : NULL;
}
/* A buffer of a multishot receive is read: back to its ring. Any thread. */
void weft__io_buf_put(weft_rt *rt, struct weft__rbuf *b);

#endif
