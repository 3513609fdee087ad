/*
 * io.c - the I/O backend of each shard: choosing it, setting it up, polling
 * it from the run loop, sleeping in it and waking a thread out of it. Owns
 * rt->ios (one struct weft__io per shard). The two backends live in
 * io_uring.c and io_epoll.c.
 *
 * Choice: WEFT_BACKEND_AUTO tries io_uring on every shard and falls back to
 * epoll for the whole runtime if any setup fails (io_uring_disabled,
 * seccomp's EPERM, ENOSYS, a kernel without the opcodes we use), so one
 * runtime never mixes backends. WEFT_BACKEND=uring|epoll|none in the
 * environment overrides AUTO only.
 *
 * Sleeping (no lost wakeup): the sleeper stores t->io_sleep = io, then
 * loads t->wake, and sleeps in the backend only if it is 0; a waker stores
 * t->wake, then loads t->io_sleep and writes the eventfd if it is set.
 * All four accesses are seq_cst, so at least one side sees the other's
 * store: the sleeper does not sleep, or the waker writes the eventfd, whose
 * counter stays set until read, so a wait that starts after the write
 * returns at once.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

const char *weft__backend_name(int kind) {
  switch (kind) {
  case WEFT_BACKEND_URING:
    return "uring";
  case WEFT_BACKEND_EPOLL:
    return "epoll";
  default:
    return "none";
  }
}

static int env_backend(void) {
  const char *e = getenv("WEFT_BACKEND");
  if (!e || !*e)
    return WEFT_BACKEND_AUTO;
  if (!strcmp(e, "uring") || !strcmp(e, "io_uring"))
    return WEFT_BACKEND_URING;
  if (!strcmp(e, "epoll"))
    return WEFT_BACKEND_EPOLL;
  if (!strcmp(e, "none"))
    return WEFT_BACKEND_NONE;
  return -EINVAL;
}

static void io_teardown(struct weft__io *io) {
  if (!io->sh)
    return; /* never set up */
  if (io->kind == WEFT_BACKEND_URING)
    weft__uring_teardown(io);
  else if (io->kind == WEFT_BACKEND_EPOLL && io->epfd >= 0)
    close(io->epfd);
  if (io->efd >= 0)
    close(io->efd);
  memset(io, 0, sizeof(*io));
}

static int io_setup(struct weft__io *io, struct weft__shard *sh, int kind,
                    bool probe) {
  memset(io, 0, sizeof(*io));
  io->sh = sh;
  io->epfd = -1;
  io->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (io->efd < 0) {
    int r = -errno;
    io->sh = NULL;
    return r;
  }
  io->kind = kind;
  int r = kind == WEFT_BACKEND_URING ? weft__uring_setup(io, probe)
                                     : weft__epoll_setup(io);
  if (r) {
    if (kind == WEFT_BACKEND_URING)
      io->kind = WEFT_BACKEND_NONE; /* setup cleaned up after itself */
    io_teardown(io);
  }
  return r;
}

/* seq_cst: against the sleeper's load in park.c (weft__io_ensure). */
static void publish(weft_rt *rt, unsigned i) {
  weft__store(&rt->shards[i].io, &rt->ios[i], WA_SC);
}

int weft__io_init(weft_rt *rt, int backend) {
  rt->backend = WEFT_BACKEND_NONE;
  if (backend == WEFT_BACKEND_AUTO)
    backend = env_backend();
  if (backend < 0)
    return backend;
  if (backend == WEFT_BACKEND_NONE)
    return 0;
  rt->ios = calloc(rt->nshards, sizeof(*rt->ios));
  if (!rt->ios)
    return -ENOMEM;
  /* Shard 0 decides the backend now; the others are set up by the first
   * socket (weft__io_ensure). */
  int r;
  if (backend == WEFT_BACKEND_AUTO) {
    backend = WEFT_BACKEND_URING;
    r = io_setup(&rt->ios[0], &rt->shards[0], backend, true);
    if (r && r != -ENOMEM && r != -EMFILE && r != -ENFILE) {
      backend = WEFT_BACKEND_EPOLL;
      r = io_setup(&rt->ios[0], &rt->shards[0], backend, true);
    }
  } else {
    r = io_setup(&rt->ios[0], &rt->shards[0], backend, true);
  }
  if (r) {
    free(rt->ios);
    rt->ios = NULL;
    return r;
  }
  rt->backend = backend;
  publish(rt, 0);
  weft__store(&rt->io_all, rt->nshards == 1, WA_REL);
  return 0;
}

int weft__io_ensure(weft_rt *rt) {
  if (rt->backend == WEFT_BACKEND_NONE)
    return -ENOTSUP;
  if (weft__load(&rt->io_all, WA_ACQ))
    return 0;
  int r = 0;
  pthread_mutex_lock(&rt->io_lock);
  if (!weft__load(&rt->io_all, WA_RLX)) {
    unsigned i = 1;
    for (; i < rt->nshards && !r; i++)
      r = io_setup(&rt->ios[i], &rt->shards[i], rt->backend, false);
    if (r) {
      while (--i > 1)
        io_teardown(&rt->ios[i - 1]);
    } else {
      for (i = 1; i < rt->nshards; i++)
        publish(rt, i);
      weft__store(&rt->io_all, 1, WA_REL);
    }
  }
  pthread_mutex_unlock(&rt->io_lock);
  if (r)
    return r;
  /* Threads asleep on their futex move to their backend: a kick makes
   * each leave its sleep and sleep again, now there. */
  for (unsigned i = 1; i < rt->nshards; i++)
    weft__kick(&rt->shards[i], 0);
  return 0;
}

void weft__io_destroy(weft_rt *rt) {
  if (!rt->ios)
    return;
  for (unsigned i = 0; i < rt->nshards; i++)
    io_teardown(&rt->ios[i]);
  free(rt->ios);
  rt->ios = NULL;
}

void weft__io_poll(struct weft__shard *sh, struct weft__io *io, bool idle) {
  if (io->kind == WEFT_BACKEND_URING) {
    /* Prepared SQEs go in groups while the shard is busy, so one enter
     * carries many; out of work, the wait that parks the thread submits
     * them, or weft__io_flush before it runs stolen work. */
    if (io->unsubmitted && !idle &&
        (io->unsubmitted >= 16 || (sh->tick & 7) == 0))
      weft__uring_submit(io);
    weft__uring_reap(io);
    return;
  }
  if (io->nev == 0 && (idle || (sh->tick & 15) == 0))
    weft__epoll_wait(io, 0, false);
  weft__epoll_dispatch(io);
}

void weft__io_flush(struct weft__shard *sh) {
  /* acquire: pairs with the publication in weft__io_ensure */
  struct weft__io *io = weft__load(&sh->io, WA_ACQ);
  if (io && io->unsubmitted)
    weft__uring_submit(io);
}

bool weft__io_wait(struct weft__thread *t, struct weft__io *io,
                   uint64_t deadline) {
  weft__store(&t->io_sleep, io, WA_SC);
  bool events;
  if (weft__load(&t->wake, WA_SC) != 0)
    events = false;
  else if (io->kind == WEFT_BACKEND_URING)
    events = weft__uring_wait(io, deadline);
  else
    events = weft__epoll_wait(io, deadline, true);
  weft__store(&t->io_sleep, NULL, WA_SC);
  weft__stat_add(&io->sh->st_io_enters, 1);
  return events;
}

bool weft__io_wake_thread(struct weft__thread *t) {
  struct weft__io *io = weft__load(&t->io_sleep, WA_SC);
  if (!io)
    return false;
  uint64_t one = 1;
  /* EAGAIN: the counter is saturated, so the sleeper wakes anyway. */
  while (write(io->efd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  return true;
}
