/*
 * io_epoll.c - the epoll backend: one epoll set per shard, used only by the
 * thread holding the shard. Owns the set and the events waited for but not
 * yet dispatched.
 *
 * Sockets are registered once, edge-triggered for input, output and
 * hang-ups, with a word that names the socket and its generation (tcp.c):
 * an event that arrives for a socket closed and reused since is dropped by
 * the generation check, never delivered to the new one. The shard's
 * eventfd is registered with data 0.
 *
 * Waits use epoll_pwait2 (5.11, glibc 2.35) for a nanosecond timeout; the
 * events are kept in io->evdata/evbits and dispatched by the run loop after
 * the thread has left the sleepers (park.c: a parked thread queues nothing).
 */
#include "internal.h"

#include <errno.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

int weft__epoll_setup(struct weft__io *io) {
  io->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (io->epfd < 0)
    return -errno;
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
  if (epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->efd, &ev) < 0)
    return -errno; /* io_setup closes epfd */
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
    uint64_t rel = deadline > now ? deadline - now : 0;
    ts.tv_sec = (time_t)(rel / 1000000000u);
    ts.tv_nsec = (long)(rel % 1000000000u);
  }
  int n = epoll_pwait2(io->epfd, evs, WEFT_IO_EVBUF, tsp, NULL);
  if (!block)
    weft__stat_add(&io->sh->st_io_enters, 1);
  unsigned k = 0;
  for (int i = 0; i < n; i++) {
    if (evs[i].data.u64 == 0) {
      uint64_t v;
      /* Reset the counter; EAGAIN: another wake read it already. */
      while (read(io->efd, &v, sizeof(v)) < 0 && errno == EINTR) {
      }
      continue;
    }
    io->evdata[k] = evs[i].data.u64;
    io->evbits[k++] = evs[i].events;
  }
  io->nev = k;
  io->evpos = 0;
  return k > 0;
}

void weft__epoll_dispatch(struct weft__io *io) {
  if (!io->nev)
    return;
  /* evpos: a dispatch can post, posting can overflow the run queue, but
   * never re-enter here; the index still keeps a partial pass safe. */
  while (io->evpos < io->nev) {
    unsigned i = io->evpos++;
    weft__sock_event(io->sh, io->evdata[i], io->evbits[i]);
  }
  weft__stat_add(&io->sh->st_io_events, io->nev);
  io->nev = io->evpos = 0;
}
