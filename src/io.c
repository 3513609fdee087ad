/*
 * io.c - the I/O backend of each shard: choosing it, setting it up, polling
 * it from the run loop, sleeping in it and waking a thread out of it, and
 * the verbs (io.h), which it hands to the backend in use. Owns
 * rt->io.ios (one struct weft__io per shard). The two backends live in
 * io_uring.c and io_epoll.c.
 *
 * Choice: weft_rt_create decides the kind. WEFT_BACKEND_AUTO takes io_uring
 * if a probe ring can be set up with the features and opcodes we use, and
 * epoll for the whole runtime otherwise (io_uring_disabled, seccomp's
 * EPERM, ENOSYS, an older kernel), so one runtime never mixes backends.
 * WEFT_BACKEND=uring|epoll|none in the environment overrides AUTO only.
 * A probe that succeeds is remembered for the process: setting a ring up
 * and tearing it down costs about a millisecond, and a program that
 * creates runtimes often (tests, tools) should pay it once.
 *
 * Setup: every shard's backend is set up by the first socket
 * (weft__io_ensure), not by weft_rt_create: a runtime that never opens a
 * socket holds no ring and no epoll set, and its threads sleep on their
 * futexes. The first socket also starts every dormant thread (park.c):
 * each shard serves its own sockets, a listener's among them, so each
 * needs its thread; a socket call fails with -EAGAIN while one cannot be
 * started. If io_uring is refused after a probe succeeded (a seccomp filter
 * installed later), that first socket fails with the error.
 *
 * Sleeping (no lost wakeup): the sleeper stores t->io_sleep = io, then
 * loads t->wake, and sleeps in the backend only if it is 0; a waker stores
 * t->wake, then loads t->io_sleep and writes the eventfd if it is set.
 * All four accesses are seq_cst, so at least one side sees the other's
 * store: the sleeper does not sleep, or the waker writes the eventfd, whose
 * counter stays set until read, so a wait that starts after the write
 * returns at once.
 */
#include "io.h"

#include "io_bufring.h"
#include "io_epoll.h"
#include "io_uring.h"
#include "park.h"
#include "thread.h"
#include "trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *backend_name(int kind) {
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
  weft__store(&rt->shards[i].io, &rt->io.ios[i], WA_SC);
}

/* Rings are set up by a short-lived thread of ours, never by the caller.
 * io_uring puts the thread that creates a ring on the ring's task list,
 * and the ring's exit work, when it is torn down, queues task_work with
 * TWA_SIGNAL on every task still on that list (io_ring_exit_work; Linux
 * 6.18): a blocking call with a timeout in the application's thread,
 * such as connect(2) with SO_SNDTIMEO, then fails with EINTR. A probe
 * ring torn down right after weft_rt_create did exactly that to
 * test_tcp_shutdown's client under TSan. An exited thread has been taken
 * off every list (io_uring cancels its context at exit), so nobody of
 * the application's is signalled. */
struct setup_job {
  weft_rt *rt;
  struct weft__shard *sh;
  bool probe; /* a probe ring, torn down at once; else every shard's */
  int r;
};

static void *setup_main(void *arg) {
  struct setup_job *j = arg;
  if (j->probe) {
    struct weft__io io;
    j->r = io_setup(&io, j->sh, WEFT_BACKEND_URING, true);
    if (!j->r)
      io_teardown(&io);
    return NULL;
  }
  weft_rt *rt = j->rt;
  unsigned i = 0;
  int r = 0;
  for (; i < rt->nshards && !r; i++)
    r = io_setup(&rt->io.ios[i], &rt->shards[i], rt->io.backend, false);
  if (r)
    while (--i > 0)
      io_teardown(&rt->io.ios[i - 1]);
  j->r = r;
  return NULL;
}

static int run_setup(struct setup_job *j) {
  /* Like the runtime's threads, it takes none of the application's
   * asynchronous signals. */
  pthread_t t;
  int e = weft__spawn(&t, NULL, setup_main, j);
  if (e)
    return -e;
  pthread_join(t, NULL);
  return j->r;
}

/* Set once a probe ring worked in this process; never cleared. */
static _Atomic int uring_works;

/* Whether io_uring can serve sockets here: a ring with our setup flags,
 * the opcodes probed, then torn down. 0 or the setup's error. */
static int probe_uring(struct weft__shard *sh) {
  if (weft__load(&uring_works, WA_ACQ))
    return 0;
  struct setup_job j = {.sh = sh, .probe = true};
  int r = run_setup(&j);
  if (r)
    return r;
  weft__store(&uring_works, 1, WA_REL);
  return 0;
}

int weft__io_init(weft_rt *rt, int backend) {
  rt->io.backend = WEFT_BACKEND_NONE;
  if (backend == WEFT_BACKEND_AUTO)
    backend = env_backend();
  if (backend < 0)
    return backend;
  if (backend == WEFT_BACKEND_NONE)
    return 0;
  int r = 0;
  if (backend == WEFT_BACKEND_AUTO) {
    backend = WEFT_BACKEND_URING;
    r = probe_uring(&rt->shards[0]);
    if (r && r != -ENOMEM && r != -EMFILE && r != -ENFILE) {
      weft__log(rt, WEFT_LOG_INFO, "io_uring refused (%s): sockets use epoll",
                weft_strerror(r));
      backend = WEFT_BACKEND_EPOLL;
      r = 0;
    }
  } else if (backend == WEFT_BACKEND_URING) {
    r = probe_uring(&rt->shards[0]);
  }
  if (r)
    return r;
  rt->io.ios = calloc(rt->nshards, sizeof(*rt->io.ios));
  if (!rt->io.ios)
    return -ENOMEM;
  rt->io.backend = backend;
  /* WEFT_URING_ACCEPT=poll keeps listeners on poll and accept4(2) where
   * the kernel has multishot accepts and synchronous cancels (listen.c):
   * the older kernels' path, for tests. */
  const char *e = getenv("WEFT_URING_ACCEPT");
  rt->io.ring_accept = backend == WEFT_BACKEND_URING &&
                       weft__uring_accept_multishot() &&
                       !(e && !strcmp(e, "poll"));
  /* WEFT_URING_FILES=pool sends file operations to the blocking pool as
   * on epoll: that path, for tests. */
  e = getenv("WEFT_URING_FILES");
  rt->io.ring_files = backend == WEFT_BACKEND_URING && weft__uring_files_ok() &&
                      !(e && !strcmp(e, "pool"));
  return 0;
}

int weft__io_ensure(weft_rt *rt) {
  if (rt->io.backend == WEFT_BACKEND_NONE)
    return -ENOTSUP;
  if (weft__load(&rt->io.all, WA_ACQ))
    return weft__start_dormant_all(rt);
  int r = 0;
  pthread_mutex_lock(&rt->io.lock);
  if (!weft__load(&rt->io.all, WA_RLX)) {
    struct setup_job j = {.rt = rt};
    r = rt->io.backend == WEFT_BACKEND_URING ? run_setup(&j)
                                             : (setup_main(&j), j.r);
    if (!r) {
      for (unsigned i = 0; i < rt->nshards; i++)
        publish(rt, i);
      weft__store(&rt->io.all, 1, WA_REL);
    }
  }
  pthread_mutex_unlock(&rt->io.lock);
  if (r)
    return r;
  /* Dormant threads start now (they will sleep in their backend), and
   * threads asleep on their futex move to it: a kick makes each leave
   * its sleep and sleep again, now there. */
  r = weft__start_dormant_all(rt);
  for (unsigned i = 0; i < rt->nshards; i++)
    weft__kick(&rt->shards[i], 0);
  return r;
}

void weft__io_destroy(weft_rt *rt) {
  if (!rt->io.ios)
    return;
  for (unsigned i = 0; i < rt->nshards; i++)
    io_teardown(&rt->io.ios[i]);
  free(rt->io.ios);
  rt->io.ios = NULL;
}

/* Runnable items above which a poll wakes a parked thread to share them.
 * Fewer are run by this thread in turn, sooner than a woken one would get
 * to them (a wakeup takes 5-20 us on a VM, a request's handlers a few),
 * and the replies they write leave together: the peers then get them in
 * one burst and answer in one, where a thread woken for one or two
 * requests split every burst in two (bench/net's keep-alive run: half the
 * context switches a request, on either backend). The price: those items
 * wait behind this thread's handlers, as every item of a shard does; a
 * handler that runs long is handed on by the monitor (1 to 1.5
 * thresholds) and a thread that wakes for its own reasons steals them
 * sooner. */
#define POLL_SHARE_MIN 4

static void poll_backend(struct weft__shard *sh, struct weft__io *io,
                         bool look) {
  if (io->kind == WEFT_BACKEND_URING) {
    /* Prepared SQEs go in groups while the shard is busy, so one enter
     * carries many; out of work, the wait that parks the thread submits
     * them, or weft__io_flush before it runs stolen or injected work. */
    if (io->unsubmitted &&
        (weft__runq_len(&sh->rq) || weft__runq_len(&sh->prq)) &&
        (io->unsubmitted >= 16 || (sh->tick & 7) == 0)) {
      weft__trace_flush(); /* a held item end: not after a system call */
      weft__uring_submit(io);
    }
    weft__uring_reap(io);
    return;
  }
  /* One turn in 16, idle or busy, and whenever the run loop asks (look).
   * Not at every idle turn: one that finds nothing to run is followed by
   * the park's wait in this backend, which sees the same events, and a
   * poll before it would make two system calls where a plain epoll loop
   * makes one. The count still bounds how long a thread that never parks
   * (it steals, or takes posts from outside one by one) leaves its own
   * sockets unread (test_io_busy_poll). */
  if (io->nev == 0 && (look || (sh->tick & 15) == 0)) {
    weft__trace_flush();
    weft__epoll_wait(io, 0, false);
  }
  weft__epoll_dispatch(io);
}

/* The pushes of what the poll delivers are quiet (shard.c, weft__schedule):
 * one notify at the end, and only for more than POLL_SHARE_MIN items. */
void weft__io_poll(struct weft__shard *sh, struct weft__io *io, bool look) {
  if (sh->quiet) { /* inside a firing batch, which notifies once at its end */
    poll_backend(sh, io, look);
    return;
  }
  sh->quiet = true;
  poll_backend(sh, io, look);
  sh->quiet = false;
  if (weft__runq_len(&sh->prq) + weft__runq_len(&sh->rq) > POLL_SHARE_MIN)
    weft__notify_parked(sh->rt);
}

void weft__io_flush(struct weft__shard *sh) {
  /* acquire: pairs with the publication in weft__io_ensure */
  struct weft__io *io = weft__load(&sh->io, WA_ACQ);
  if (io && io->unsubmitted) {
    weft__trace_flush(); /* a held item end: not after a system call */
    weft__uring_submit(io);
  }
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
  weft__stat_add(&io->sh->st.io_enters, 1);
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

void weft__io_stats(weft_rt *rt, weft_stats *out) {
  if (!rt->io.ios || !weft__load(&rt->io.all, WA_ACQ))
    return;
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__io *io = &rt->io.ios[i];
    uint64_t o = weft__load(&io->st_rbuf_out, WA_RLX);
    uint64_t in = weft__load(&io->st_rbuf_in, WA_RLX) +
                  weft__load(&io->st_rbuf_ret, WA_RLX);
    out->recv_bufs_held += o > in ? o - in : 0;
  }
}

int weft_rt_backend(const weft_rt *rt) { return rt ? rt->io.backend : -EINVAL; }

const char *weft_rt_backend_name(const weft_rt *rt) {
  return rt ? backend_name(rt->io.backend) : "none";
}

/* ---- the verbs ------------------------------------------------------------
 * Each hands the operation to the backend of the caller's shard; the
 * completion verbs exist only on io_uring. */

int weft__io_sock_flags(weft_rt *rt) {
  return weft__io_completes(rt) ? 0 : SOCK_NONBLOCK;
}

int weft__io_watch(weft_rt *rt, struct weft__shard *home, int fd,
                   struct weft__ioh *h, uint32_t gen, bool out) {
  if (rt->io.backend != WEFT_BACKEND_EPOLL)
    return 0;
  return weft__epoll_watch(weft__load(&home->io, WA_ACQ), fd, h, gen, out);
}

void weft__io_close(weft_rt *rt, struct weft__shard *sh, int fd) {
  struct weft__io *io = weft__io_of(sh);
  if (io && io->kind == WEFT_BACKEND_URING && weft__uring_close(io, fd))
    return;
  close(fd); /* EINTR: the descriptor is gone anyway on Linux */
  weft__busy_drop(rt, 1);
}

/* A verb's result, recorded (trace.h) when the operation was queued. */
static inline int queued(struct weft__shard *sh, int r, unsigned op, int fd) {
  if (!r)
    weft__trace(WEFT_EV_SUBMIT, sh->idx, op, (uint64_t)(int64_t)fd);
  return r;
}

/* The caller's ring: NULL without a shard, or on a readiness backend. */
static struct weft__io *ring_io(struct weft__shard *sh) {
  struct weft__io *io = weft__io_of(sh);
  return io && io->kind == WEFT_BACKEND_URING ? io : NULL;
}

int weft__io_recv(struct weft__shard *sh, int fd, void *buf, size_t len,
                  bool poll_first, struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_recv(io, fd, buf, len, poll_first, h),
                     WEFT_OP_RECV, fd)
            : -EAGAIN;
}

int weft__io_recvmsg(struct weft__shard *sh, int fd, struct msghdr *msg,
                     int flags, bool poll_first, struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_recvmsg(io, fd, msg, flags, poll_first, h),
                     WEFT_OP_RECV, fd)
            : -EAGAIN;
}

int weft__io_recv_multishot(struct weft__shard *sh, int fd,
                            struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_recv_multishot(io, fd, h), WEFT_OP_RECVM,
                     fd)
            : -EAGAIN;
}

int weft__io_file(struct weft__shard *sh, const struct weft__fileop *op,
                  struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_file(io, op, h), WEFT_OP_FILE, op->fd)
            : -EAGAIN;
}

int weft__io_send(struct weft__shard *sh, int fd, struct msghdr *msg,
                  struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_send(io, fd, msg, h), WEFT_OP_SEND, fd)
            : -EAGAIN;
}

int weft__io_connect(struct weft__shard *sh, int fd,
                     const struct sockaddr *addr, unsigned addrlen,
                     struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_connect(io, fd, addr, addrlen, h),
                     WEFT_OP_CONNECT, fd)
            : -EAGAIN;
}

int weft__io_poll_fd(struct weft__shard *sh, int fd, unsigned events,
                     struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_poll_fd(io, fd, events, h), WEFT_OP_POLL,
                     fd)
            : -EAGAIN;
}

int weft__io_accept(struct weft__shard *sh, int fd, int flags,
                    struct weft__ioh *h) {
  struct weft__io *io = ring_io(sh);
  return io ? queued(sh, weft__uring_accept(io, fd, flags, h), WEFT_OP_ACCEPT,
                     fd)
            : -EAGAIN;
}

int weft__io_cancel_sync(struct weft__io *io, struct weft__ioh *h, unsigned op,
                         uint64_t timeout_ns) {
  if (!io || io->kind != WEFT_BACKEND_URING)
    return -ENOTSUP;
  return weft__uring_cancel_sync(io, (uint64_t)(uintptr_t)h | op, timeout_ns);
}

int weft__io_cancel(struct weft__shard *sh, struct weft__ioh *h, unsigned op,
                    bool now) {
  struct weft__io *io = ring_io(sh);
  return io ? weft__uring_cancel(io, (uint64_t)(uintptr_t)h | op, now)
            : -EAGAIN;
}

void weft__io_buf_put(weft_rt *rt, struct weft__rbuf *b) {
  weft__bufring_put(rt, b);
}
