/*
 * tcp_recv.c - receiving on a connection, both backends: epoll's
 * non-blocking reads on readiness, io_uring's multishot receive into the
 * shard's provided buffers (io_bufring.c), and io_uring's one-shot receive
 * into the reader's buffer where there are no provided buffers. Owns the
 * socket's receive state in struct weft__sock (tcp.h).
 *
 * io_uring, multishot: one receive stays armed for as long as the socket
 * is read. Each completion names a buffer of the ring it was submitted to;
 * the reaper (the thread holding that ring) pushes it on the socket's
 * `rin` stack and signals EV_RDATA, or EV_RMEND when the receive ended
 * (no IORING_CQE_F_MORE). The strand takes the stack, in order, into its
 * own queue, copies from it into the reader's buffer and hands each
 * buffer back once read. A receive ends by itself at end of file, on an
 * error, on -ENOBUFS (the ring was empty), at a CQ overflow, when its
 * submitting thread exits (-ECANCELED), or by our cancel; the strand arms a
 * new one when a read is pending and nothing is queued, so at most one
 * multishot of a socket is in the kernel at a time and its bytes arrive in
 * order. After -ENOBUFS the next receive is a one-shot into the reader's
 * buffer, then multishot again.
 *
 * A socket nobody reads would keep filling the shared ring, so the reaper
 * cancels a receive whose socket holds RHELD_CAP unread buffers (`rheld`,
 * counted up by the reaper and down by the strand: a bound, not an exact
 * count), and submits the cancel at once. The kernel's receive takes all
 * that the socket holds in one pass, so what the socket had received by
 * then lands too (8-22 buffers a connection in test_tcp_recv_unread); the
 * ring's size bounds them all, and a socket that finds it empty falls back
 * as above instead of waiting for the others.
 *
 * The rin stack: the reaper CASes the head (release, after writing the
 * buffer's len, off and next), the strand takes it all with one exchange
 * (acquire) and reverses it. Everything taken in one exchange was pushed
 * before anything taken in the next, so the order of bytes is kept. mres,
 * the end's result, is a plain field: the reaper writes it before its
 * signal (release CAS on ev) and the strand reads it after clearing the
 * bits (acq_rel). Only one thread reaps a given ring at a time.
 *
 * A multishot's completions are finished by its submitter's task work
 * (io_uring.c), for its whole life rather than for one read. A
 * connection's receive armed by a thread that is now stuck in a handler
 * gets each completion when that thread next enters the kernel: at once
 * if it is blocked interruptibly (it is woken for it), within a scheduler
 * tick if it is computing, and not before it leaves the call if it sleeps
 * uninterruptibly. epoll has no such limit.
 */
#include "tcp.h"

#include <errno.h>
#include <liburing.h>
#include <string.h>
#include <sys/socket.h>

#define RHELD_CAP 8u
#define MRES_MORE 1 /* mres: it ended after delivering data, no error */

void weft__recv_done(struct weft__sock *s, long n) {
  s->reading = false;
  weft_read_fn fn = s->rfn;
  s->rfn = NULL;
  fn(s->rarg, (weft_tcp *)s, n);
}

/* ---- the reaper's side ----------------------------------------------------
 */

/* once: only the first call for this receive cancels, unless !once */
static void cancel_multishot(struct weft__io *io, uint64_t ud,
                             struct weft__sock *s, bool once) {
  if (weft__xchg(&s->mcancel, 1, WA_RLX) && once)
    return;
  /* Not weft__uring_sqe: a full SQ would submit, and submitting may reap. */
  struct io_uring_sqe *sqe = io_uring_get_sqe(io->ring);
  if (!sqe) {
    weft__store(&s->mcancel, 0, WA_RLX); /* the next completion retries */
    return;
  }
  io_uring_prep_cancel64(sqe, ud, 0);
  io_uring_sqe_set_data64(sqe, WEFT_UD_QUIET);
  io->unsubmitted++;
  /* At once, not with the next batch: the receive goes on filling buffers
   * until the kernel has seen the cancel. Entering does not touch the CQ
   * that the caller is walking (the walk rereads its tail). Errors leave
   * the entries for the next submit. */
  (void)io_uring_submit(io->ring);
  weft__uring_entered(io);
}

void weft__sock_recvm(struct weft__io *io, uint64_t ud, int32_t res,
                      uint32_t flags) {
  struct weft__sock *s =
      (struct weft__sock *)(uintptr_t)(ud & ~(uint64_t)WEFT_OP_MASK);
  uint64_t bits = 0;
  uint32_t held = 0;
  if (flags & IORING_CQE_F_BUFFER) {
    struct weft__rbuf *b =
        weft__bufring_get(io, flags >> IORING_CQE_BUFFER_SHIFT);
    if (b && res > 0) {
      weft__stat_add(&io->st_rbuf_out, 1);
      b->len = (uint32_t)res;
      b->off = 0;
      /* before the push: the strand's decrement follows its take */
      held = weft__fetch_add(&s->rheld, 1, WA_RLX) + 1;
      weft__rbuf_push(&s->rin, b);
      bits |= EV_RDATA;
    } else if (b) {
      weft__bufring_give(io, b); /* no data in it: straight back */
    }
  }
  if (!(flags & IORING_CQE_F_MORE)) {
    s->mres = res > 0 ? MRES_MORE : res;
    bits |= EV_RMEND;
  } else if (weft__load(&s->mclosing, WA_ACQ)) {
    cancel_multishot(io, ud, s, false); /* see weft__recv_closing */
  } else if (held >= RHELD_CAP ||
             weft__load(&s->m_armer, WA_RLX) != weft__self()) {
    /* Too much unread, or its submitter no longer holds this ring's
     * shard (the monitor handed it on): the next one is armed by a
     * thread that does. */
    cancel_multishot(io, ud, s, true);
  }
  if (bits)
    weft__sock_signal(io->sh, s, bits, WEFT_GEN_ANY);
}

/* ---- the strand's side ----------------------------------------------------
 */

/* Moves what the reaper pushed to the end of the socket's queue. */
static void grab(struct weft__sock *s) {
  if (!weft__load(&s->rin, WA_RLX))
    return;
  struct weft__rbuf *b = weft__xchg(&s->rin, NULL, WA_ACQ), *rev = NULL;
  while (b) {
    struct weft__rbuf *next = b->next;
    b->next = rev;
    rev = b;
    b = next;
  }
  if (s->rq_tail)
    s->rq_tail->next = rev;
  else
    s->rq_head = rev;
  while (rev) {
    s->rq_tail = rev;
    rev = rev->next;
  }
}

static void put(struct weft__sock *s, struct weft__rbuf *b) {
  weft__fetch_sub(&s->rheld, 1, WA_RLX);
  weft__bufring_put(s->rt, b);
}

/* Copies up to len queued bytes to dst; hands back the buffers emptied. */
static size_t take(struct weft__sock *s, char *dst, size_t len) {
  size_t n = 0;
  while (n < len && s->rq_head) {
    struct weft__rbuf *b = s->rq_head;
    size_t k = b->len - b->off;
    if (k > len - n)
      k = len - n;
    memcpy(dst + n, b->data + b->off, k);
    b->off += (uint32_t)k;
    n += k;
    if (b->off == b->len) {
      s->rq_head = b->next;
      if (!s->rq_head)
        s->rq_tail = NULL;
      put(s, b);
    }
  }
  return n;
}

/* Puts a receive in the kernel: multishot where the ring has buffers,
 * else one-shot into the reader's buffer. */
static void arm(struct weft__sock *s) {
  weft_rt *rt = s->rt;
  struct weft__shard *sh = weft__local_begin(rt);
  struct io_uring_sqe *sqe = sh ? weft__uring_sqe(sh) : NULL;
  if (sqe) {
    struct weft__io *io = weft__load(&sh->io, WA_RLX);
    if (io->br && !s->rd_nobufs && !weft__load(&rt->no_multishot, WA_RLX)) {
      io_uring_prep_recv_multishot(sqe, s->fd, NULL, 0, 0);
      sqe->flags |= IOSQE_BUFFER_SELECT;
      sqe->buf_group = 0;
      io_uring_sqe_set_data64(sqe, (uintptr_t)s | WEFT_OP_RECVM);
      weft__store(&s->mcancel, 0, WA_RLX);
      weft__store(&s->m_armer, weft__self(), WA_RLX);
      s->m_io = io;
      s->rd_multi = true;
    } else {
      io_uring_prep_recv(sqe, s->fd, s->rbuf, s->rlen, 0);
      /* After a receive that drained the socket (a request answered,
       * the next not sent yet) the kernel's first try would fail: wait
       * for data first (5.19; -EINVAL before, then never again). */
      s->rd_pollfirst = s->rd_short && !weft__load(&rt->no_poll_first, WA_RLX);
      if (s->rd_pollfirst)
        sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
      io_uring_sqe_set_data64(sqe, (uintptr_t)s | WEFT_OP_READ);
      s->rd_inflight = true;
    }
  }
  weft__local_end(sh);
  if (!sqe)
    weft__sock_kick(s); /* no shard (handed off) or ring full: later */
}

/* uring: deliver what is queued to pending reads; arm when it is empty. */
static void pump(struct weft__sock *s) {
  s->in_pump = true;
  while (s->reading) {
    grab(s); /* a read from the callback gets what arrived meanwhile */
    if (s->rq_head) {
      weft__recv_done(s, (long)take(s, s->rbuf, s->rlen));
      continue;
    }
    if (s->rd_term_set) {
      s->rd_term_set = false;
      weft__recv_done(s, s->rd_term);
      continue;
    }
    if (!s->rd_multi && !s->rd_inflight)
      arm(s);
    break;
  }
  s->in_pump = false;
}

/* epoll: try the pending read if the socket may have data. */
static void recv_now(struct weft__sock *s) {
  while (s->reading && s->readable) {
    ssize_t n = recv(s->fd, s->rbuf, s->rlen, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      s->readable = false;
      return;
    }
    /* A short read emptied the buffer: wait for the next edge. Not after
     * a hang-up: its edge came with the data, and no other will come. */
    if (n > 0 && (size_t)n < s->rlen && !s->hup)
      s->readable = false;
    weft__recv_done(s, n < 0 ? -errno : n);
  }
}

void weft__recv_run(struct weft__sock *s) {
  if (s->rt->backend == WEFT_BACKEND_EPOLL)
    recv_now(s);
  else
    pump(s);
}

void weft__recv_start(struct weft__sock *s) {
  if (s->rt->backend == WEFT_BACKEND_EPOLL) {
    if (s->readable)
      weft__sock_kick(s); /* read in the handler, not in this call */
  } else if (s->rq_head || s->rd_term_set || weft__load(&s->rin, WA_RLX)) {
    if (!s->in_pump)
      weft__sock_kick(s); /* queued: delivered by the handler */
  } else if (!s->rd_multi && !s->rd_inflight) {
    arm(s);
  }
}

/* EV_RDONE of a one-shot receive. */
void weft__recv_completed(struct weft__sock *s) {
  s->rd_inflight = false;
  s->rd_nobufs = false;
  int res = s->rres;
  s->rd_short = res > 0 && (size_t)res < s->rlen;
  if (res == -EINVAL && s->rd_pollfirst)
    weft__store(&s->rt->no_poll_first, 1, WA_RLX);
  if (s->state == ST_CLOSING) {
    weft__recv_done(s, -ECANCELED);
  } else if (res == -EINTR || res == -EAGAIN || res == -ECANCELED ||
             (res == -EINVAL && s->rd_pollfirst)) {
    arm(s); /* -ECANCELED: its submitter exited (io_uring.c) */
  } else {
    weft__recv_done(s, res);
  }
}

/* EV_RMEND: the multishot receive ended with s->mres. */
void weft__recv_ended(struct weft__sock *s) {
  s->rd_multi = false;
  int res = s->mres;
  if (s->state != ST_OPEN)
    return; /* closing: the read was cancelled already */
  switch (res) {
  case MRES_MORE:
  case -ECANCELED: /* ours, or its submitter exited (io_uring.c) */
  case -EINTR:
  case -EAGAIN:
    return; /* pump arms another when a read is pending */
  case -ENOBUFS:
    s->rd_nobufs = true;
    weft__fetch_add(&s->rt->recv_nobufs, 1, WA_RLX);
    return;
  case -EINVAL:
    /* Before 6.0: no multishot receive. From now on one-shots, which
     * report an -EINVAL of the socket's own. */
    weft__store(&s->rt->no_multishot, 1, WA_RLX);
    return;
  default:
    break;
  }
  s->rd_term = res; /* end of file or an error, after the queued bytes */
  s->rd_term_set = true;
}

/* Closing, before shutdown(2) wakes the receive to end it. A multishot
 * receive can miss that wakeup (Linux 6.18, found by test_tcp_close_race):
 * if the wakeup and the peer's last bytes reach it in one pass, its receive
 * returns the bytes after the shutdown, the socket reports nothing more to
 * read (a local shutdown does not set SOCK_DONE, so the inq hint stays 0)
 * and it waits for a wakeup that never comes. Its completion for those
 * bytes then comes after the shutdown, and with them after this store:
 * store, shutdown (socket lock), receive (socket lock), CQE (the ring's
 * release), reap (acquire), load. So the reaper sees mclosing on that
 * completion and cancels the receive. */
void weft__recv_closing(struct weft__sock *s) {
  if (s->rd_multi)
    weft__store(&s->mclosing, 1, WA_REL);
}

bool weft__recv_busy(const struct weft__sock *s) {
  return s->rd_inflight || s->rd_multi;
}

/* Closing: a pending read not in the kernel completes with -ECANCELED. */
void weft__recv_cancel(struct weft__sock *s) {
  if (s->reading && !s->rd_inflight)
    weft__recv_done(s, -ECANCELED);
}

/* Closing, instead of shutdown(2): a cancel of the multishot receive in
 * the ring that holds it, if the calling thread holds that ring; the
 * entry leaves with the thread's next enter. false: it is elsewhere (a
 * handoff moved it), or the ring is full. */
bool weft__recv_cancel_local(struct weft__sock *s) {
  struct weft__shard *sh = weft__local_begin(s->rt);
  struct io_uring_sqe *sqe = NULL;
  if (sh && weft__load(&sh->io, WA_RLX) == s->m_io)
    sqe = weft__uring_sqe(sh);
  if (sqe) {
    io_uring_prep_cancel64(sqe, (uintptr_t)s | WEFT_OP_RECVM, 0);
    io_uring_sqe_set_data64(sqe, WEFT_UD_QUIET);
    weft__store(&s->mcancel, 1, WA_RLX); /* the reaper needs no other */
  }
  weft__local_end(sh);
  return sqe != NULL;
}

/* Closed, nothing in the kernel: the unread buffers go back. */
void weft__recv_release(struct weft__sock *s) {
  grab(s);
  while (s->rq_head) {
    struct weft__rbuf *b = s->rq_head;
    s->rq_head = b->next;
    put(s, b);
  }
  s->rq_tail = NULL;
  s->rd_term_set = false;
}
