/*
 * tcp_recv.c - receiving on a connection, both kinds of backend: reads on
 * readiness (epoll), a multishot receive into the shard's provided buffers
 * (io_uring: io_bufring.c), and a one-shot receive into the reader's
 * buffer where there are no provided buffers (tcp_recv.h). Owns the
 * connection's receive state in struct weft__conn (tcp.h).
 *
 * io_uring, multishot: one receive stays armed for as long as the socket
 * is read. Each completion names a buffer of the ring it was submitted to;
 * the reaper (the thread holding that ring) pushes it on the socket's
 * `rin` stack and signals EV_RDATA, or EV_RMEND when the receive ended
 * (no WEFT_CQE_MORE). The strand takes the stack, in order, into its
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
 * cancels a receive whose socket holds RHELD_CAP unread buffers
 * (MS_HELD of `mstate`, counted up by the reaper and down by the strand: a
 * bound, not an exact count), and submits the cancel at once. The
 * kernel's receive takes all that the socket holds in one pass, so what
 * the socket had received by then lands too (8-22 buffers a connection in
 * test_tcp_recv_unread); the ring's size bounds them all, and a socket
 * that finds it empty falls back as above instead of waiting for the
 * others.
 *
 * The rin stack: the reaper CASes the head (release, after writing the
 * buffer's len, off and next), the strand takes it all with one exchange
 * (acquire) and reverses it. Everything taken in one exchange was pushed
 * before anything taken in the next, so the order of bytes is kept. mres,
 * the end's result, is a plain field: the reaper writes it before its
 * signal (release CAS on ev) and the strand reads it after clearing the
 * bits (acq_rel). Only one thread reaps a given ring at a time.
 *
 * mstate packs three words into one, each kept as it would be alone:
 * every access is an RMW of its own bits or a load, so the others' are
 * untouched. The count never goes below 0 into the flags: the reaper adds
 * before its push (release), the strand subtracts after its take
 * (acquire), so each add happens before its subtraction, and one
 * location's modifications follow happens-before.
 *
 * A multishot's completions are finished by its submitter's task work
 * (io_uring.c), for its whole life rather than for one read. A
 * connection's receive armed by a thread that is now stuck in a handler
 * gets each completion when that thread next enters the kernel: at once
 * if it is blocked interruptibly (it is woken for it), within a scheduler
 * tick if it is computing, and not before it leaves the call if it sleeps
 * uninterruptibly. epoll has no such limit.
 *
 * A connection that receives descriptors (unix_fds.c) reads with recvmsg
 * and a control buffer: one-shot receives through the ring (never a
 * multishot, which has no control buffer), recvmsg(2) on readiness.
 */
#include "tcp_recv.h"

#include "io.h"
#include "tcp_timeout.h"
#include "thread.h"
#include "unix.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#define RHELD_CAP 8u
#define MS_HELD 0xffffu       /* mstate: buffers pushed, not yet handed back */
#define MS_CANCEL (1u << 30)  /* the reaper asked to cancel it */
#define MS_CLOSING (1u << 31) /* the socket closes: cancel it */
#define MRES_MORE 1 /* mres: it ended after delivering data, no error */

void weft__recv_done(struct weft__conn *c, long n) {
  c->reading = false;
  if (n > 0 && weft__tcp_tmo(c))
    weft__tmo_progress(c, false);
  weft_read_fn fn = c->rfn;
  c->rfn = NULL;
  weft__calling((void *)fn);
  fn(c->rarg, (weft_tcp *)c, n);
}

/* ---- the reaper's side ----------------------------------------------------
 */

/* once: only the first call for this receive cancels, unless !once. At
 * once, not with the next batch: the receive goes on filling buffers until
 * the kernel has seen the cancel. */
static void cancel_multishot(struct weft__shard *local, struct weft__conn *c,
                             bool once) {
  if (weft__fetch_or(&c->mstate, MS_CANCEL, WA_RLX) & MS_CANCEL && once)
    return;
  if (weft__io_cancel(local, &c->s.ioh, WEFT_OP_RECVM, true) != 0)
    weft__fetch_and(&c->mstate, ~MS_CANCEL, WA_RLX); /* the next retries */
}

void weft__recv_multishot_done(struct weft__shard *local, struct weft__conn *c,
                               const struct weft__cqe *cqe) {
  uint64_t bits = 0;
  uint32_t held = 0;
  if (cqe->buf) {
    /* before the push: the strand's decrement follows its take */
    held = (weft__fetch_add(&c->mstate, 1, WA_RLX) & MS_HELD) + 1;
    weft__rbuf_push(&c->rin, cqe->buf);
    bits |= EV_RDATA;
  }
  if (!(cqe->flags & WEFT_CQE_MORE)) {
    c->mres = cqe->res > 0 ? MRES_MORE : cqe->res;
    bits |= EV_RMEND;
  } else if (weft__load(&c->mstate, WA_ACQ) & MS_CLOSING) {
    cancel_multishot(local, c, false); /* see weft__recv_closing */
  } else if (held >= RHELD_CAP ||
             weft__load(&c->m_armer, WA_RLX) != weft__self()) {
    /* Too much unread, or its submitter no longer holds this ring's
     * shard (the monitor handed it on): the next one is armed by a
     * thread that does. */
    cancel_multishot(local, c, true);
  }
  if (bits)
    weft__sock_signal(local, &c->s, bits, WEFT_GEN_ANY);
}

/* ---- the strand's side ----------------------------------------------------
 */

/* Moves what the reaper pushed to the end of the connection's queue. */
static void grab(struct weft__conn *c) {
  if (!weft__load(&c->rin, WA_RLX))
    return;
  /* The stack's top, the newest, is the last once it is reversed. */
  struct weft__rbuf *top = weft__xchg(&c->rin, NULL, WA_ACQ), *b = top;
  struct weft__rbuf *rev = NULL;
  while (b) {
    struct weft__rbuf *next = b->next;
    b->next = rev;
    rev = b;
    b = next;
  }
  top->next = c->rq ? c->rq->next : rev; /* the ring closes at the first */
  if (c->rq)
    c->rq->next = rev;
  c->rq = top;
}

/* The first unread buffer, or NULL. */
static struct weft__rbuf *rq_first(const struct weft__conn *c) {
  return c->rq ? c->rq->next : NULL;
}

/* Unlinks the first unread buffer b. */
static void rq_pop(struct weft__conn *c, struct weft__rbuf *b) {
  if (b == c->rq)
    c->rq = NULL; /* it was the only one */
  else
    c->rq->next = b->next;
}

static void put(struct weft__conn *c, struct weft__rbuf *b) {
  weft__fetch_sub(&c->mstate, 1, WA_RLX);
  weft__io_buf_put(weft__sock_rt(&c->s), b);
}

/* Copies up to len queued bytes to dst; hands back the buffers emptied. */
static size_t take(struct weft__conn *c, char *dst, size_t len) {
  size_t n = 0;
  struct weft__rbuf *b;
  while (n < len && (b = rq_first(c))) {
    size_t k = b->len - b->off;
    if (k > len - n)
      k = len - n;
    memcpy(dst + n, b->data + b->off, k);
    b->off += (uint32_t)k;
    n += k;
    if (b->off == b->len) {
      rq_pop(c, b);
      put(c, b);
    }
  }
  return n;
}

/* Puts a receive in the kernel: multishot where the ring has buffers,
 * else one-shot into the reader's buffer. */
static void arm(struct weft__conn *c) {
  weft_rt *rt = weft__sock_rt(&c->s);
  struct weft__shard *sh = weft__local_begin(rt);
  int r = -ENOBUFS;
  if (sh && !c->rd_nobufs && !weft__tcp_fdq(c) &&
      !weft__load(&rt->net.no_multishot, WA_RLX)) {
    /* Before it can complete: the reaper compares m_armer. */
    weft__fetch_and(&c->mstate, ~MS_CANCEL, WA_RLX);
    weft__store(&c->m_armer, weft__self(), WA_RLX);
    r = weft__io_recv_multishot(sh, c->s.fd, &c->s.ioh);
    if (!r) {
      c->m_io = weft__io_of(sh);
      c->rd_multi = true;
    }
  }
  if (r == -ENOBUFS) {
    /* After a receive that drained the socket (a request answered, the
     * next not sent yet) the kernel's first try would fail: wait for data
     * first (5.19; -EINVAL before, then never again). */
    c->rd_pollfirst =
        c->rd_short && !weft__load(&rt->net.no_poll_first, WA_RLX);
    r = weft__tcp_fdq(c)
            ? weft__io_recvmsg(sh, c->s.fd, weft__fdq_msg(c), MSG_CMSG_CLOEXEC,
                               c->rd_pollfirst, &c->s.ioh)
            : weft__io_recv(sh, c->s.fd, c->rbuf, c->rlen, c->rd_pollfirst,
                            &c->s.ioh);
    c->rd_inflight = r == 0;
  }
  weft__local_end(sh);
  if (r)
    weft__sock_kick(&c->s); /* no shard (handed off) or ring full: later */
}

/* Completions: deliver what is queued to pending reads; arm when it is
 * empty. */
static void pump(struct weft__conn *c) {
  c->in_pump = true;
  while (c->reading) {
    grab(c); /* a read from the callback gets what arrived meanwhile */
    if (c->rq) {
      weft__recv_done(c, (long)take(c, c->rbuf, c->rlen));
      continue;
    }
    if (c->rd_term_set) {
      c->rd_term_set = false;
      weft__recv_done(c, c->mres);
      continue;
    }
    if (!c->rd_multi && !c->rd_inflight)
      arm(c);
    break;
  }
  c->in_pump = false;
}

/* A non-blocking receive into the reader's buffer; with descriptors
 * allowed, a recvmsg that keeps those it carries. */
static ssize_t recv_direct(struct weft__conn *c) {
  if (weft__sim_fault(weft__sock_rt(&c->s), WEFT_SIM_FAULT_BREAK))
    shutdown(c->s.fd, SHUT_RDWR); /* a simulated break (sim.h) */
  if (!weft__tcp_fdq(c))
    return recv(c->s.fd, c->rbuf, c->rlen, MSG_DONTWAIT);
  ssize_t n =
      recvmsg(c->s.fd, weft__fdq_msg(c), MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n > 0)
    weft__fdq_collect(c);
  return n;
}

/* Readiness: try the pending read if the socket may have data. */
static void recv_now(struct weft__conn *c) {
  while (c->reading && c->readable) {
    ssize_t n = recv_direct(c);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      c->readable = false;
      return;
    }
    /* A short read emptied the buffer: wait for the next edge. Not after
     * a hang-up: its edge came with the data, and no other will come. Not
     * where a short read can leave data behind (short_empty, tcp.h). */
    if (n > 0 && (size_t)n < c->rlen && !c->hup && c->short_empty)
      c->readable = false;
    weft__recv_done(c, n < 0 ? -errno : n);
  }
}

void weft__recv_run(struct weft__conn *c) {
  if (weft__io_completes(weft__sock_rt(&c->s)))
    pump(c);
  else
    recv_now(c);
}

void weft__recv_start(struct weft__conn *c) {
  c->read_made = true;
  if (!weft__io_completes(weft__sock_rt(&c->s))) {
    if (c->readable)
      weft__sock_kick(&c->s); /* read in the handler, not in this call */
  } else if (c->rq || c->rd_term_set || weft__load(&c->rin, WA_RLX)) {
    if (!c->in_pump)
      weft__sock_kick(&c->s); /* queued: delivered by the handler */
  } else if (!c->rd_multi && !c->rd_inflight) {
    arm(c);
  }
}

/* EV_RDONE of a one-shot receive. */
void weft__recv_completed(struct weft__conn *c) {
  c->rd_inflight = false;
  c->rd_nobufs = false;
  int res = c->rres;
  if (res > 0 && weft__tcp_fdq(c))
    weft__fdq_collect(c); /* closing or not: the queue owns them now */
  c->rd_short = res > 0 && (size_t)res < c->rlen;
  if (res == -EINVAL && c->rd_pollfirst)
    weft__store(&weft__sock_rt(&c->s)->net.no_poll_first, 1, WA_RLX);
  if (c->s.state == ST_CLOSING) {
    weft__recv_done(c, weft__tcp_close_status(c));
  } else if (res == -EINTR || res == -EAGAIN || res == -ECANCELED ||
             (res == -EINVAL && c->rd_pollfirst)) {
    arm(c); /* -ECANCELED: its submitter exited (io_uring.c) */
  } else {
    weft__recv_done(c, res);
  }
}

/* EV_RMEND: the multishot receive ended with c->mres. */
void weft__recv_ended(struct weft__conn *c) {
  c->rd_multi = false;
  int res = c->mres;
  if (c->s.state != ST_OPEN)
    return; /* closing: the read was cancelled already */
  switch (res) {
  case MRES_MORE:
  case -ECANCELED: /* ours, or its submitter exited (io_uring.c) */
  case -EINTR:
  case -EAGAIN:
    return; /* pump arms another when a read is pending */
  case -ENOBUFS:
    c->rd_nobufs = true;
    weft__fetch_add(&weft__sock_rt(&c->s)->net.recv_nobufs, 1, WA_RLX);
    return;
  case -EINVAL:
    /* Before 6.0: no multishot receive. From now on one-shots, which
     * report an -EINVAL of the socket's own. */
    weft__store(&weft__sock_rt(&c->s)->net.no_multishot, 1, WA_RLX);
    return;
  default:
    break;
  }
  /* end of file or an error, after the queued bytes: mres holds it */
  c->rd_term_set = true;
}

/* Closing, before shutdown(2) wakes the receive to end it. A multishot
 * receive can miss that wakeup (Linux 6.18, found by test_tcp_close_race):
 * if the wakeup and the peer's last bytes reach it in one pass, its receive
 * returns the bytes after the shutdown, the socket reports nothing more to
 * read (a local shutdown does not set SOCK_DONE, so the inq hint stays 0)
 * and it waits for a wakeup that never comes. Its completion for those
 * bytes then comes after the shutdown, and with them after this store:
 * store, shutdown (socket lock), receive (socket lock), CQE (the ring's
 * release), reap (acquire), load. So the reaper sees MS_CLOSING on that
 * completion and cancels the receive. */
void weft__recv_closing(struct weft__conn *c) {
  if (c->rd_multi)
    weft__fetch_or(&c->mstate, MS_CLOSING, WA_REL);
}

bool weft__recv_busy(const struct weft__conn *c) {
  return c->rd_inflight || c->rd_multi;
}

/* Closing: a pending read not in the kernel completes with -ECANCELED. */
void weft__recv_cancel(struct weft__conn *c) {
  if (c->reading && !c->rd_inflight)
    weft__recv_done(c, weft__tcp_close_status(c));
}

/* Closing, instead of shutdown(2): a cancel of the multishot receive in
 * the ring that holds it, if the calling thread holds that ring; the
 * entry leaves with the thread's next enter. false: it is elsewhere (a
 * handoff moved it), or the ring is full. */
bool weft__recv_cancel_local(struct weft__conn *c) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&c->s));
  bool ok = sh && weft__io_of(sh) == c->m_io &&
            weft__io_cancel(sh, &c->s.ioh, WEFT_OP_RECVM, false) == 0;
  if (ok) /* the reaper needs to ask for no other */
    weft__fetch_or(&c->mstate, MS_CANCEL, WA_RLX);
  weft__local_end(sh);
  return ok;
}

/* Closed, nothing in the kernel: the unread buffers go back. */
void weft__recv_release(struct weft__conn *c) {
  grab(c);
  for (struct weft__rbuf *b; (b = rq_first(c));) {
    rq_pop(c, b);
    put(c, b);
  }
  c->rd_term_set = false;
}
