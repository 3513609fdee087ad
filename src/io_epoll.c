/*
 * io_epoll.c - the epoll backend: one epoll set per shard, used only by the
 * thread holding the shard (io_epoll.h). Owns the set and the events waited
 * for but not yet dispatched.
 *
 * Descriptors are registered once, edge-triggered for input, output and
 * hang-ups, with a word that names the handle and a 16-bit generation
 * (weft__io_watch). Only sockets register, and their readiness goes to
 * weft__sock_ready (sock.c), which drops an event whose generation is not
 * the socket's current one, so an event that arrives for a socket closed
 * and reused since is never delivered to the new one. The shard's eventfd
 * is registered with data 0.
 *
 * Waits use epoll_pwait2 (5.11, glibc 2.35) for a nanosecond timeout; the
 * events are kept in io->evdata/evbits and dispatched by the run loop after
 * the thread has left the sleepers (park.c: a parked thread queues nothing).
 * Where epoll_pwait2 is refused (an older kernel, or a seccomp filter that
 * does not know it: ENOSYS, or EPERM), which setup finds with one call,
 * waits use epoll_wait, their timeout rounded up to the millisecond so that
 * no timer fires early: timers are then up to a millisecond late.
 */
#include "io_epoll.h"

#include "clock.h"
#include "log.h"
#include "shard.h"
#include "sock.h"

#include <errno.h>
#include <limits.h>
#include <sys/epoll.h>

/* The handle's address fits 48 bits (x86-64 and arm64 user space). */
#define GEN_SHIFT 48
#define ADDR_MASK ((UINT64_C(1) << GEN_SHIFT) - 1)

int weft__epoll_setup(struct weft__io *io) {
  io->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (io->epfd < 0)
    return -errno;
  /* Edge-triggered, and never read: an eventfd wakes its waiters at every
   * write, whatever its count, and each wakeup puts an edge-triggered
   * entry back on the ready list, so every wake is seen without the read
   * that a level-triggered one would need to stop reporting it. The
   * count only grows (by one a wake: 2^64 would take centuries); the
   * io_uring backend's multishot poll of the same kind of eventfd works
   * the same way. */
  struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 0};
  if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->efd, &ev) < 0)
    return -errno; /* io_setup closes epfd */
  struct timespec zero = {0, 0};
  if (epoll_pwait2(io->epfd, &ev, 1, &zero, NULL) < 0 &&
      (errno == ENOSYS || errno == EPERM)) {
    io->ms_waits = true;
    if (io->sh->idx == 0)
      weft__log(io->sh->rt, WEFT_LOG_INFO,
                "epoll_pwait2 refused (%s): epoll waits use epoll_wait, "
                "timers to the millisecond",
                weft_strerror(-errno));
  }
  return 0;
}

/* epoll_wait's timeout: tsp rounded up to the millisecond (-1: none). */
static int wait_ms(const struct timespec *tsp) {
  if (!tsp)
    return -1;
  uint64_t ns = (uint64_t)tsp->tv_sec * 1000000000u + (uint64_t)tsp->tv_nsec;
  uint64_t ms = (ns + 999999u) / 1000000u;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

int weft__epoll_watch(struct weft__io *io, int fd, struct weft__ioh *h,
                      uint32_t gen, bool out) {
  struct epoll_event ev = {.events = EPOLLIN | EPOLLPRI | EPOLLET};
  if (out)
    ev.events |= EPOLLOUT | EPOLLRDHUP;
  ev.data.u64 = (uint64_t)(uintptr_t)h | ((uint64_t)(uint16_t)gen << GEN_SHIFT);
  if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
    return -errno;
  return 0;
}

bool weft__epoll_wait(struct weft__io *io, uint64_t deadline, bool block) {
  if (io->nev)
    return true;
  struct epoll_event evs[WEFT_IO_EVBUF];
  struct timespec ts = {0, 0}, *tsp = &ts;
  if (block && deadline == UINT64_MAX) {
    tsp = NULL;
  } else if (block) {
    uint64_t now = weft__now_ns();
    ts = weft__timespec(deadline > now ? deadline - now : 0);
  }
  int n = io->ms_waits ? epoll_wait(io->epfd, evs, WEFT_IO_EVBUF, wait_ms(tsp))
                       : epoll_pwait2(io->epfd, evs, WEFT_IO_EVBUF, tsp, NULL);
  if (!block)
    weft__stat_add(&io->sh->st.io_enters, 1);
  unsigned k = 0;
  for (int i = 0; i < n; i++) {
    if (evs[i].data.u64 == 0)
      continue; /* a wake (weft__io_wake_thread) */
    io->evdata[k] = evs[i].data.u64;
    io->evbits[k++] = evs[i].events;
  }
#ifdef WEFT_SIM
  if (io->sh->rt->sim) /* the order of one wait's events is a choice */
    weft__sim_shuffle(io->sh->rt, io->evdata, io->evbits, k);
#endif
  io->nev = k;
  io->evpos = 0;
  return k > 0;
}

static void dispatch_one(struct weft__io *io, uint64_t data, uint32_t events,
                         uint64_t t) {
  struct weft__ioh *h = (struct weft__ioh *)(uintptr_t)(data & ADDR_MASK);
  struct weft__cqe c = {.gen = (uint32_t)(data >> GEN_SHIFT)};
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
    c.events |= WEFT_IO_IN;
  if (events & EPOLLPRI)
    c.events |= WEFT_IO_IN | WEFT_IO_PRI;
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))
    c.events |= WEFT_IO_HUP;
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
    c.events |= WEFT_IO_OUT;
  /* Not h->done: the handle's memory may belong to a socket made since
   * (a stale event), which the generation check against its event word
   * must rule out before anything else of it is read. */
  if (t)
    weft__trace_at(t, WEFT_EV_COMPLETE, io->sh->idx, WEFT_TRACE_OP_READY,
                   c.events);
  weft__sock_ready(io->sh, weft__sock_of(h), &c);
}

void weft__epoll_dispatch(struct weft__io *io) {
  if (!io->nev)
    return;
  /* evpos: a dispatch can post, posting can overflow the run queue, but
   * never re-enter here; the index still keeps a partial pass safe. */
  uint64_t t = weft__tracing() ? weft__ticks() : 0; /* one for the batch */
  while (io->evpos < io->nev) {
    unsigned i = io->evpos++;
    dispatch_one(io, io->evdata[i], io->evbits[i], t);
  }
  weft__stat_add(&io->sh->st.io_events, io->nev);
  io->nev = io->evpos = 0;
}
