/*
 * io_uring.c - the io_uring backend (liburing): one ring per shard, used
 * only by the thread holding the shard (io_uring.h). Owns the ring, its
 * wake poll, the taking of entries and the reaping of completions.
 *
 * Every operation in the ring is either the wake poll (user_data 0: a
 * multishot poll of the shard's eventfd, whose counter is never read back:
 * each write posts one completion, where a read request per wakeup cost
 * several times a futex wake), or an operation whose user_data is its
 * handle's address tagged with its op (io.h), or a cancel or close whose
 * result nobody waits for (WEFT_OP_QUIET, no handle). A handle's owner
 * stays alive until its operation's last completion has been handed to it
 * (sock.c), so a completion never reaches memory reused since. The reaper
 * hands each completion to its handle's done, after turning a multishot
 * receive's buffer id into its buffer (io_bufring.c).
 *
 * Entries: every operation takes its entry with weft__uring_sqe, which
 * enters the ring when the SQ is full but never reaps, so no handle's done
 * runs inside a verb; the run loop's poll reaps (weft__uring_reap).
 *
 * Completions of network requests are finished by task work of the thread
 * that submitted them (the poll wakeup queues it to that task), even after
 * the monitor has handed that thread's shard to another one. Rings ask for
 * COOP_TASKRUN (5.19; older kernels: plain setup): the kernel does not
 * interrupt a running submitter for it but lets it run at its next kernel
 * entry, or wakes it from a sleep. Without it, each completion interrupted
 * its submitter at once, whose receive then spun on the socket lock that
 * the sender's softirq still held, and bench/net's keep-alive rate fell by
 * a third. The cost: a thread stuck spinning in a handler holds the
 * completions of what it submitted until its next tick (a few ms); one
 * stuck in an interruptible sleep is woken for them (test_tcp_stall); one
 * in uninterruptible sleep (D state) holds them until it leaves it. The
 * epoll backend has no such limit. DEFER_TASKRUN, which would hold them
 * until the submitter waits on the ring, is not used. A thread that exits
 * has its requests cancelled by the kernel: the socket code resubmits a
 * -ECANCELED it did not ask for. The CQ is 16 times the SQ;
 * IORING_FEAT_NODROP (5.5) keeps completions that overflow it in the
 * kernel, and an enter that fails with -EBUSY because of them is retried
 * after the run loop's next reap. Missing features or opcodes (a probe) make
 * setup fail, so that AUTO falls back to epoll.
 */
#include "io_uring.h"

#include "clock.h"
#include "io_bufring.h"
#include "rt.h"
#include "shard.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ThreadSanitizer models descriptors: a close it does not see leaves the
 * number open in its model, and the next open of that number on another
 * thread (the monitor's /proc reads, a socketpair) is reported as a data
 * race on it. A close made by the ring is one it cannot see, so TSan
 * builds announce it through the sanitizer's own syscall hook (libtsan
 * exports it; only clang ships the header), before the entry is queued:
 * nothing here uses the descriptor after that. */
#ifdef WEFT_TSAN
void __sanitizer_syscall_pre_impl_close(long fd);
static inline void tsan_closing(int fd) {
  __sanitizer_syscall_pre_impl_close(fd);
}
#else
static inline void tsan_closing(int fd) { (void)fd; }
#endif

#ifndef IORING_ACCEPT_DONTWAIT
#define IORING_ACCEPT_DONTWAIT (1u << 1) /* 6.10; liburing 2.3 predates it */
#endif

/* Small: a ring costs setup time per shard at the first socket, and a full
 * SQ is just submitted early; completions beyond the CQ wait in the kernel
 * (NODROP). */
#define SQ_ENTRIES 64
#define CQ_ENTRIES 1024

/* user_data of what nobody waits for */
#define UD_QUIET ((uint64_t)WEFT_OP_QUIET)

static struct io_uring *ring_of(struct weft__io *io) { return io->ring; }

static inline uint64_t tag(struct weft__ioh *h, unsigned op) {
  return (uint64_t)(uintptr_t)h | op;
}

/* Set by the probe ring (once per process, as io.c caches the probe). */
static _Atomic uint32_t accept_multishot;
static _Atomic uint32_t files_ok;

bool weft__uring_files_ok(void) { return weft__load(&files_ok, WA_ACQ) != 0; }

bool weft__uring_accept_multishot(void) {
  return weft__load(&accept_multishot, WA_ACQ) != 0;
}

/* A listener's accept is one multishot request (5.19), used from 6.10
 * on, where a cancel that returned (IORING_REGISTER_SYNC_CANCEL, 6.0)
 * means the request accepts nothing more: before, the task work running
 * a woken accept checked for a cancel and then took the ring's lock with
 * a trylock, falling back to a blocking take, so the accept could run
 * after the cancel returned ("io_uring: force tw ctx locking" made it
 * take the lock first). No accept is cancelled from another thread now,
 * but the kernels between are untried (docs/design.md). 6.10 is told by
 * the flag it brought,
 * IORING_ACCEPT_DONTWAIT (refused with -EINVAL before; with it, an accept
 * with none waiting says -EAGAIN). Then the features themselves: with
 * nobody connecting a multishot accept must wait (no completion), the
 * cancel must find it, and its one completion must say -ECANCELED. The
 * socket: an autobound AF_UNIX one, which needs no address or network. */
static void probe_accept(struct io_uring *ring) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  struct io_uring_sync_cancel_reg reg = {
      .addr = 1, .timeout = {.tv_sec = 1, .tv_nsec = 0}};
  struct __kernel_timespec wait = {.tv_sec = 1, .tv_nsec = 0};
  struct io_uring_cqe *cqe;
  if (fd < 0)
    return;
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
  if (!sqe || bind(fd, (struct sockaddr *)&a, sizeof(sa_family_t)) != 0 ||
      listen(fd, 1) != 0) {
    if (sqe)
      io_uring_prep_nop(sqe); /* the ring is torn down next: harmless */
    close(fd);
    return;
  }
  io_uring_prep_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
  sqe->ioprio |= IORING_ACCEPT_DONTWAIT;
  bool v610 = io_uring_submit_and_wait(ring, 1) == 1 &&
              io_uring_peek_cqe(ring, &cqe) == 0 && cqe->res == -EAGAIN;
  if (v610)
    io_uring_cqe_seen(ring, cqe);
  sqe = v610 ? io_uring_get_sqe(ring) : NULL;
  if (sqe) {
    io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(sqe, 1);
    if (io_uring_submit(ring) == 1 &&
        io_uring_peek_cqe(ring, &cqe) == -EAGAIN &&
        io_uring_register_sync_cancel(ring, &reg) == 0 &&
        io_uring_wait_cqe_timeout(ring, &cqe, &wait) == 0) {
      if (cqe->res == -ECANCELED && !(cqe->flags & IORING_CQE_F_MORE))
        weft__store(&accept_multishot, 1, WA_REL);
      io_uring_cqe_seen(ring, cqe);
    }
  }
  close(fd);
}

static int probe_ok(struct io_uring *ring) {
  static const int ops[] = {IORING_OP_RECV,     IORING_OP_SENDMSG,
                            IORING_OP_ACCEPT,   IORING_OP_CONNECT,
                            IORING_OP_POLL_ADD, IORING_OP_ASYNC_CANCEL,
                            IORING_OP_CLOSE};
  struct io_uring_probe *p = io_uring_get_probe_ring(ring);
  if (!p)
    return -ENOSYS;
  int r = 0;
  for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
    if (!io_uring_opcode_supported(p, ops[i]))
      r = -ENOSYS;
  /* Files: through the ring where the kernel has every opcode (5.6), else
   * through the blocking pool (fs.c). */
  static const int fops[] = {
      IORING_OP_READ,  IORING_OP_WRITE,  IORING_OP_READV, IORING_OP_WRITEV,
      IORING_OP_FSYNC, IORING_OP_OPENAT, IORING_OP_STATX};
  bool fok = true;
  for (size_t i = 0; i < sizeof(fops) / sizeof(fops[0]); i++)
    fok = fok && io_uring_opcode_supported(p, fops[i]);
  if (fok)
    weft__store(&files_ok, 1, WA_REL);
  io_uring_free_probe(p);
  if (!r)
    probe_accept(ring);
  return r;
}

static void arm_wake(struct weft__io *io) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring_of(io));
  if (!sqe)
    return; /* retried after the next submit (weft__uring_reap) */
  io_uring_prep_poll_multishot(sqe, io->efd, POLLIN);
  io_uring_sqe_set_data64(sqe, 0);
  io->wake_armed = true;
  io->unsubmitted++;
}

int weft__uring_setup(struct weft__io *io, bool probe) {
  struct io_uring *ring = calloc(1, sizeof(*ring));
  if (!ring)
    return -ENOMEM;
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN |
            IORING_SETUP_TASKRUN_FLAG;
  p.cq_entries = CQ_ENTRIES;
  int r = io_uring_queue_init_params(SQ_ENTRIES, ring, &p);
  if (r == -EINVAL) { /* before 5.19 */
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = CQ_ENTRIES;
    r = io_uring_queue_init_params(SQ_ENTRIES, ring, &p);
  }
  if (r) {
    free(ring);
    return r;
  }
  if (!(p.features & IORING_FEAT_NODROP) || !(p.features & IORING_FEAT_EXT_ARG))
    r = -ENOSYS; /* 5.11 and later have both */
  if (!r && probe)
    r = probe_ok(ring);
  if (r) {
    io_uring_queue_exit(ring);
    free(ring);
    return r;
  }
  io->ring = ring;
  /* No provided buffers (before 5.19, or no memory for them): receives go
   * into the reader's buffer, one request each (tcp_recv.c). */
  if (!probe)
    (void)weft__bufring_setup(io);
  arm_wake(io);
  return 0;
}

void weft__uring_teardown(struct weft__io *io) {
  if (!io->ring)
    return;
  io_uring_queue_exit(ring_of(io));
  free(io->ring);
  io->ring = NULL;
  weft__bufring_free(io);
}

/* What an enter consumed, whatever it returned: the kernel takes entries
 * in order from the head and has written khead when the enter returns
 * (an enter may take only part of the SQ: no memory for requests, or an
 * entry that fails its checks). Every entry before khead has been issued:
 * closes of sockets have finished, so the close count drops here. */
static void entered(struct weft__io *io) {
  struct io_uring *ring = ring_of(io);
  uint32_t head = IO_URING_READ_ONCE(*ring->sq.khead);
  io->unsubmitted = io_uring_sq_ready(ring);
  if (io->close_n && (int32_t)(head - io->close_pos) >= 0) {
    unsigned n = io->close_n;
    io->close_n = 0;
    weft__busy_drop(io->sh->rt, n);
  }
}

/* One enter that submits; EINTR is retried. Returns io_uring_submit's
 * result. */
static int enter(struct weft__io *io) {
  int r;
  do {
    r = io_uring_submit(ring_of(io));
    weft__stat_add(&io->sh->st.io_enters, 1);
    entered(io); /* it may have taken some, whatever it returned */
  } while (r == -EINTR);
  return r;
}

/* An enter that fails leaves its entries for the next one: -EBUSY (the
 * kernel holds overflowed completions) or -EAGAIN (no memory for
 * requests) clears once the run loop has reaped, which it does right
 * after its own submit (io.c, weft__io_poll); other errors are about the
 * ring itself, which we set up correctly. */
void weft__uring_submit(struct weft__io *io) { (void)enter(io); }

struct io_uring_sqe *weft__uring_sqe(struct weft__io *io) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring_of(io));
  if (!sqe) {
    enter(io);
    sqe = io_uring_get_sqe(ring_of(io));
  }
  if (sqe)
    io->unsubmitted++;
  return sqe;
}

/* One completion of an operation of ours, to its handle; t: the reap's
 * tick, when the thread records (trace.h). */
static void complete(struct weft__io *io, uint64_t ud,
                     const struct io_uring_cqe *cqe, uint64_t t) {
  struct weft__ioh *h = (struct weft__ioh *)(uintptr_t)(ud & ~(uint64_t)7);
  unsigned op = (unsigned)(ud & WEFT_OP_MASK);
  struct weft__cqe c = {.res = cqe->res};
  if (op == WEFT_OP_RECVM) {
    if (cqe->flags & IORING_CQE_F_MORE)
      c.flags |= WEFT_CQE_MORE;
    if (cqe->flags & IORING_CQE_F_BUFFER) {
      struct weft__rbuf *b =
          weft__bufring_get(io, cqe->flags >> IORING_CQE_BUFFER_SHIFT);
      if (b && cqe->res > 0) {
        weft__stat_add(&io->st_rbuf_out, 1);
        b->len = (uint32_t)cqe->res;
        b->off = 0;
        c.buf = b;
      } else if (b) {
        weft__bufring_give(io, b); /* no data in it: straight back */
      }
    }
  } else if (op == WEFT_OP_ACCEPT && (cqe->flags & IORING_CQE_F_MORE)) {
    c.flags |= WEFT_CQE_MORE;
  }
  if (t)
    weft__trace_at(t, WEFT_EV_COMPLETE, io->sh->idx, op,
                   (uint64_t)(int64_t)c.res);
  h->done(h, io->sh, op, &c);
}

void weft__uring_reap(struct weft__io *io) {
  struct io_uring *ring = ring_of(io);
  if (IO_URING_READ_ONCE(*ring->sq.kflags) &
      (IORING_SQ_TASKRUN | IORING_SQ_CQ_OVERFLOW))
    io_uring_get_events(ring); /* run task work, flush overflow */
  if (io->br)
    weft__bufring_drain(io);
  unsigned head, n = 0;
  struct io_uring_cqe *cqe;
  uint64_t events = 0, t = 0; /* one tick for the batch's events */
  io_uring_for_each_cqe(ring, head, cqe) {
    uint64_t ud = io_uring_cqe_get_data64(cqe);
    n++;
    if (!ud) {
      if (!(cqe->flags & IORING_CQE_F_MORE))
        io->wake_armed = false; /* the poll ended: arm it again */
      continue;
    }
    if (!t && weft__tracing())
      t = weft__ticks();
    if (ud != UD_QUIET)
      complete(io, ud, cqe, t);
    events++;
  }
  if (n)
    io_uring_cq_advance(ring, n);
  if (events)
    weft__stat_add(&io->sh->st.io_events, events);
  if (!io->wake_armed)
    arm_wake(io);
}

bool weft__uring_wait(struct weft__io *io, uint64_t deadline) {
  struct io_uring *ring = ring_of(io);
  if (!io->wake_armed)
    arm_wake(io);
  struct __kernel_timespec ts, *tsp = NULL;
  if (deadline != UINT64_MAX) {
    uint64_t now = weft__now_ns();
    uint64_t rel = deadline > now ? deadline - now : 0;
    ts.tv_sec = (long long)(rel / 1000000000u);
    ts.tv_nsec = (long long)(rel % 1000000000u);
    tsp = &ts;
  }
  struct io_uring_cqe *cqe;
  (void)io_uring_submit_and_wait_timeout(ring, &cqe, 1, tsp, NULL);
  entered(io);
  /* Anything but the wake poll waiting? Those are dispatched once the
   * thread has left the sleepers (park.c). Wake polls alone are consumed
   * here, so that the next wait does not return at once for them. */
  unsigned head, n = 0;
  bool events = false;
  io_uring_for_each_cqe(ring, head, cqe) {
    if (io_uring_cqe_get_data64(cqe)) {
      events = true;
      break;
    }
    if (!(cqe->flags & IORING_CQE_F_MORE))
      io->wake_armed = false;
    n++;
  }
  if (!events && n) {
    io_uring_cq_advance(ring, n);
    if (!io->wake_armed)
      arm_wake(io);
  }
  /* Not IORING_SQ_TASKRUN: it may be another thread's task work, which
   * posts to this CQ, and so wakes us, once that thread runs it. */
  return events;
}

/* ---- the verbs ------------------------------------------------------------
 */

int weft__uring_recv(struct weft__io *io, int fd, void *buf, size_t len,
                     bool poll_first, struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_recv(sqe, fd, buf, len, 0);
  /* Wait for data before the first try (5.19; -EINVAL before). */
  if (poll_first)
    sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_RECV));
  return 0;
}

/* Tagged as a one-shot receive: its completion is the same. The kernel
 * writes msg_flags and msg_controllen back into msg, as recvmsg(2) does. */
int weft__uring_recvmsg(struct weft__io *io, int fd, struct msghdr *msg,
                        int flags, bool poll_first, struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_recvmsg(sqe, fd, msg, (unsigned)flags);
  if (poll_first)
    sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_RECV));
  return 0;
}

int weft__uring_recv_multishot(struct weft__io *io, int fd,
                               struct weft__ioh *h) {
  if (!io->br)
    return -ENOBUFS;
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = WEFT_BUFRING_GROUP;
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_RECVM));
  return 0;
}

/* One buffer goes as IORING_OP_SEND, which spares the kernel copying in
 * the msghdr and its iovec (io_msg_copy_hdr: about 1% of a keep-alive
 * server's CPU in bench/net); several, or ancillary data, as a sendmsg. */
int weft__uring_send(struct weft__io *io, int fd, struct msghdr *msg,
                     struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  if (msg->msg_iovlen == 1 && !msg->msg_control && !msg->msg_name)
    io_uring_prep_send(sqe, fd, msg->msg_iov[0].iov_base,
                       msg->msg_iov[0].iov_len, MSG_NOSIGNAL);
  else
    io_uring_prep_sendmsg(sqe, fd, msg, MSG_NOSIGNAL);
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_SEND));
  return 0;
}

int weft__uring_connect(struct weft__io *io, int fd,
                        const struct sockaddr *addr, unsigned addrlen,
                        struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_connect(sqe, fd, addr, addrlen);
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_CONNECT));
  return 0;
}

int weft__uring_poll_fd(struct weft__io *io, int fd, unsigned events,
                        struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_poll_add(sqe, fd,
                         (events & WEFT_IO_IN ? POLLIN : 0) |
                             (events & WEFT_IO_OUT ? POLLOUT : 0));
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_POLL));
  return 0;
}

int weft__uring_file(struct weft__io *io, const struct weft__fileop *op,
                     struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  switch (op->kind) {
  case WEFT_FOP_READ:
    io_uring_prep_read(sqe, op->fd, op->buf, (unsigned)op->len, op->off);
    break;
  case WEFT_FOP_WRITE:
    io_uring_prep_write(sqe, op->fd, op->buf, (unsigned)op->len, op->off);
    break;
  case WEFT_FOP_READV:
    io_uring_prep_readv(sqe, op->fd, op->iov, (unsigned)op->len, op->off);
    break;
  case WEFT_FOP_WRITEV:
    io_uring_prep_writev(sqe, op->fd, op->iov, (unsigned)op->len, op->off);
    break;
  case WEFT_FOP_FSYNC:
  case WEFT_FOP_FDATASYNC:
    io_uring_prep_fsync(sqe, op->fd,
                        op->kind == WEFT_FOP_FDATASYNC ? IORING_FSYNC_DATASYNC
                                                       : 0);
    break;
  case WEFT_FOP_OPEN:
    io_uring_prep_openat(sqe, op->fd, op->path, op->flags, op->mode);
    break;
  case WEFT_FOP_CLOSE:
    tsan_closing(op->fd);
    io_uring_prep_close(sqe, op->fd);
    break;
  default: /* WEFT_FOP_STATX */
    io_uring_prep_statx(sqe, op->fd, op->path, op->flags, STATX_BASIC_STATS,
                        op->stx);
    break;
  }
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_FILE));
  return 0;
}

int weft__uring_accept(struct weft__io *io, int fd, int flags,
                       struct weft__ioh *h) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, flags);
  io_uring_sqe_set_data64(sqe, tag(h, WEFT_OP_ACCEPT));
  return 0;
}

int weft__uring_cancel(struct weft__io *io, uint64_t target, bool now) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return -EAGAIN;
  io_uring_prep_cancel64(sqe, target, 0);
  io_uring_sqe_set_data64(sqe, UD_QUIET);
  /* Entering does not touch a CQ that a caller inside the reaper is
   * walking (the walk rereads its tail). Errors leave the entries for the
   * next submit. */
  if (now)
    (void)enter(io);
  return 0;
}

/* Any thread: io_uring_register(2) needs only the ring's descriptor, and
 * the kernel serializes it with the holder's enters (the ring's lock).
 * The request is found by its user_data; a poll-driven one (an accept
 * waiting for connections) is marked cancelled under that lock, so it
 * issues nothing more even if its wakeup's task work is still queued to
 * its submitter; its completion comes to the ring's CQ as usual. */
int weft__uring_cancel_sync(struct weft__io *io, uint64_t target,
                            uint64_t timeout_ns) {
  struct io_uring_sync_cancel_reg reg = {
      .addr = target,
      .timeout = {.tv_sec = (long long)(timeout_ns / 1000000000u),
                  .tv_nsec = (long long)(timeout_ns % 1000000000u)}};
  return io_uring_register_sync_cancel(ring_of(io), &reg);
}

/* A close as an entry, leaving with the thread's next enter (a socket has
 * no flush method, so the kernel closes it inside that enter). The
 * descriptor number stays taken until then, so nothing reuses it early,
 * and stays counted busy until then (entered), so a shutdown does not end
 * before: a thread that parks with it sleeps in its ring, whose enter
 * takes it, and its completion ends that sleep at once. */
bool weft__uring_close(struct weft__io *io, int fd) {
  struct io_uring_sqe *sqe = weft__uring_sqe(io);
  if (!sqe)
    return false;
  tsan_closing(fd);
  io_uring_prep_close(sqe, fd);
  io_uring_sqe_set_data64(sqe, UD_QUIET);
  io->close_n++;
  io->close_pos = ring_of(io)->sq.sqe_tail;
  return true;
}
