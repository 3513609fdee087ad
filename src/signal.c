/*
 * signal.c - watching signals (signal.h). Owns the process-wide table of
 * watchers, the handler installed for each watched signal, the pipe from
 * that handler to the dispatcher thread, and that thread.
 *
 * A signal goes to a thread that does not block it, or, when every
 * thread blocks it (a program that blocked SIGTERM in main before
 * creating its threads, as sigwait needs), stays pending on the process.
 * Both are caught: the handler, on whatever thread it runs, only counts
 * the arrival (g_pending) and writes one byte to the pipe, both
 * async-signal-safe; the dispatcher, one thread per process started by
 * the first watch, blocks every signal and reads the pending ones from a
 * signalfd of the watched set (no handler ever runs on it, so none is
 * left for later, as ThreadSanitizer's runtime does with handlers of a
 * thread inside a restarted call). It waits for either, takes each
 * signal's count, and hands it to every watcher of that signal: added to the
 * watcher's count, and if that was 0, a delivery posted to the watcher's
 * strand, which takes the whole count. So arrivals coalesce while a delivery is
 * queued, and a watcher's calls never overlap (a strand of its own when the
 * user gives none).
 *
 * Lock: g.lock guards the lists, the saved actions and the dispatcher's
 * start; the dispatcher posts with it held, so a watcher unlinked under
 * it (unwatch, weft_rt_destroy) gets no post afterwards. A watcher's
 * memory: one reference for the list, one per queued delivery.
 *
 * Memory orders. g_pending is only a count: the handler's increment
 * reaches the dispatcher through the pipe (the write and the read that
 * poll woke for order it in the kernel), or is taken at a later wake, so
 * relaxed suffices. A watcher's count: the dispatcher adds under g.lock,
 * a delivery takes it all by exchange on the strand. Whoever moves it
 * from 0 posts the one delivery; the exchange (acq_rel) and the add
 * (acq_rel) are RMWs on one word, so an add after the exchange sees 0 and
 * posts anew, and no arrival is counted twice or lost. stopped is set under
 * g.lock before the list reference is dropped (release) and read by the
 * delivery (acquire); on the watcher's strand the unwatch happens before any
 * later delivery, so none calls fn after it. refs: the last decrement (acq_rel)
 * frees, after every other user's accesses. test_signal's burst runs this under
 * ThreadSanitizer.
 */
#include "signal.h"

#include "rt.h"
#include "strand.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

struct weft_signal {
  struct weft_signal *next; /* its signal's list, under g.lock */
  weft_rt *rt;
  weft_strand *strand;
  bool own_strand; /* made for it: released with it */
  int signo;
  weft_signal_fn fn;
  void *arg;
  _Atomic uint64_t count;   /* arrivals not yet handed to fn */
  _Atomic uint32_t refs;    /* the list's, and the queued delivery's */
  _Atomic uint32_t stopped; /* unwatched: no call starts */
};

static struct {
  pthread_mutex_t lock;
  struct weft_signal *list[NSIG];
  struct sigaction old[NSIG]; /* the action before the first watch */
  sigset_t watched;
  int rfd;
  int sfd; /* the dispatcher's signalfd, for a forked child to close */
  bool thread_up;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .rfd = -1, .sfd = -1};

static _Atomic uint64_t g_pending[NSIG];
static _Atomic int g_wfd = -1; /* read by the handler */

static void on_signal(int signo) {
  int saved = errno;
  weft__fetch_add(&g_pending[signo], 1, WA_RLX);
  unsigned char b = (unsigned char)signo;
  int fd = weft__load(&g_wfd, WA_RLX);
  if (fd >= 0 && write(fd, &b, 1) < 0) {
    /* full: a byte already waits, and the count is kept */
  }
  errno = saved;
}

static void unref(struct weft_signal *w) {
  if (weft__fetch_sub(&w->refs, 1, WA_AR) != 1)
    return;
  if (w->own_strand)
    weft_strand_release(w->strand);
  free(w);
}

static void deliver(void *arg) {
  struct weft_signal *w = arg;
  uint64_t k = weft__xchg(&w->count, 0, WA_AR);
  if (k && !weft__load(&w->stopped, WA_ACQ)) {
    weft__calling((void *)w->fn);
    w->fn(w->arg, w->signo, k);
  }
  unref(w);
}

static void deliver_cancel(void *arg) { unref(arg); }

/* g.lock held. */
static void hand(struct weft_signal *w, uint64_t k) {
  if (weft__fetch_add(&w->count, k, WA_AR) != 0)
    return; /* a delivery is queued: it takes this too */
  weft__fetch_add(&w->refs, 1, WA_RLX);
  if (weft_post_ex(w->strand, deliver, deliver_cancel, w) != 0) {
    weft__store(&w->count, 0, WA_RLX); /* shutting down: dropped */
    unref(w);
  }
}

/* Counts the watched signals pending on the process (every thread blocks
 * them): they are read from a signalfd. g.lock held. */
static void take_pending(int sfd) {
  struct signalfd_siginfo si[16];
  ssize_t n;
  while ((n = read(sfd, si, sizeof(si))) > 0)
    for (size_t i = 0; i < (size_t)n / sizeof(si[0]); i++)
      if (si[i].ssi_signo < NSIG)
        weft__fetch_add(&g_pending[si[i].ssi_signo], 1, WA_RLX);
}

static void *dispatcher(void *arg) {
  (void)arg;
  unsigned char buf[64];
  int sfd = -1;
  for (;;) {
    struct pollfd p[2] = {{.fd = g.rfd, .events = POLLIN},
                          {.fd = sfd, .events = POLLIN}};
    /* poll fails only for want of kernel memory (ENOMEM) or EINTR: the
     * thread stays, as the watchers depend on it, and looks again. */
    if (poll(p, sfd >= 0 ? 2 : 1, -1) < 0 && errno != EINTR)
      poll(NULL, 0, 10);
    while (read(g.rfd, buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&g.lock);
    /* A watch or unwatch writes a byte, so the set is current here. */
    int fd = signalfd(sfd, &g.watched, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd >= 0) {
      g.sfd = sfd = fd;
      take_pending(sfd);
    }
    for (int s = 1; s < NSIG; s++) {
      uint64_t k = weft__load(&g_pending[s], WA_RLX)
                       ? weft__xchg(&g_pending[s], 0, WA_RLX)
                       : 0;
      for (struct weft_signal *w = g.list[s]; k && w; w = w->next)
        hand(w, k);
    }
    pthread_mutex_unlock(&g.lock);
  }
  return NULL;
}

static void wake_dispatcher(void) {
  unsigned char b = 0;
  int fd = weft__load(&g_wfd, WA_RLX);
  if (fd >= 0 && write(fd, &b, 1) < 0) {
    /* full: it will run anyway */
  }
}

/* A fork copies the lists whole: g.lock is held across it. */
static void forking(void) { pthread_mutex_lock(&g.lock); }

static void forked_parent(void) { pthread_mutex_unlock(&g.lock); }

/* In a forked child the dispatcher is gone, and the parent's watchers
 * belong to runtimes the child cannot use (their posts fail with -ECHILD):
 * every watched signal gets back the action it had before weft's, so that
 * the child's SIGTERM, say, ends it again instead of being counted for
 * nobody, and the child starts afresh (the watchers' copies are left
 * alone: an unwatch in the child returns -ECHILD). The pipe is the
 * parent's too, whose dispatcher would take the child's wake-ups: the next
 * watch makes a new one. */
static void forked_child(void) {
  for (int signo = 1; signo < NSIG; signo++)
    weft__store(&g_pending[signo], 0, WA_RLX);
  for (int signo = 1; signo < NSIG; signo++)
    if (g.list[signo]) {
      sigaction(signo, &g.old[signo], NULL);
      g.list[signo] = NULL;
    }
  sigemptyset(&g.watched);
  g.thread_up = false;
  int wfd = weft__xchg(&g_wfd, -1, WA_RLX);
  if (wfd >= 0) {
    close(wfd);
    close(g.rfd);
  }
  if (g.sfd >= 0)
    close(g.sfd);
  g.rfd = g.sfd = -1;
  pthread_mutex_init(&g.lock, NULL);
}

static void atfork_register(void) {
  pthread_atfork(forking, forked_parent, forked_child);
}

/* The pipe and the dispatcher; g.lock held. */
static int start_dispatcher(void) {
  if (g.thread_up)
    return 0;
  if (g.rfd < 0) {
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
      return -errno;
    g.rfd = p[0];
    weft__store(&g_wfd, p[1], WA_RLX);
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited by the thread */
  pthread_t t;
  int r = pthread_create(&t, NULL, dispatcher, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r)
    return -r;
  pthread_detach(t);
  g.thread_up = true;
  return 0;
}

static bool watchable(int signo) {
  switch (signo) {
  case SIGKILL:
  case SIGSTOP:
  case SIGSEGV: /* faults of the thread that made them: not deliverable */
  case SIGBUS:
  case SIGFPE:
  case SIGILL:
  case SIGTRAP:
  case SIGSYS:
    return false;
  default:
    return signo > 0 && signo < NSIG;
  }
}

/* Unlinks w and restores the old action after the last watcher of its
 * signal; g.lock held. */
static void unlink_locked(struct weft_signal *w) {
  struct weft_signal **pp = &g.list[w->signo];
  while (*pp && *pp != w)
    pp = &(*pp)->next;
  if (*pp)
    *pp = w->next;
  if (!g.list[w->signo]) {
    sigaction(w->signo, &g.old[w->signo], NULL);
    sigdelset(&g.watched, w->signo);
  }
  weft__store(&w->stopped, 1, WA_REL);
}

int weft_signal_watch(weft_rt *rt, weft_strand *s, int signo, weft_signal_fn fn,
                      void *arg, weft_signal **out) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (!rt || !fn || !watchable(signo))
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (weft__simulated(rt))
    return -ENOTSUP; /* a dispatcher thread would post out of turn */
  if (s && s->rt != rt)
    return -EXDEV;
  if (s && !weft__strand_live(s))
    return -EBADF;
  if (weft__load(&rt->life.closing, WA_ACQ))
    return -ESHUTDOWN;
  pthread_once(&once, atfork_register);
  struct weft_signal *w = calloc(1, sizeof(*w));
  if (!w)
    return -ENOMEM;
  w->rt = rt;
  w->signo = signo;
  w->fn = fn;
  w->arg = arg;
  w->strand = s;
  weft__store(&w->refs, 1, WA_RLX);
  if (!s) {
    int r = weft_strand_create(rt, &w->strand);
    if (r) {
      free(w);
      return r;
    }
    w->own_strand = true;
  }
  pthread_mutex_lock(&g.lock);
  int r = start_dispatcher();
  if (!r && !g.list[signo]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    if (sigaction(signo, &sa, &g.old[signo]) < 0)
      r = -errno;
    else
      sigaddset(&g.watched, signo);
  }
  if (!r) {
    w->next = g.list[signo];
    g.list[signo] = w;
    wake_dispatcher(); /* to unblock signo there */
  }
  pthread_mutex_unlock(&g.lock);
  if (r) {
    unref(w);
    return r;
  }
  if (out)
    *out = w;
  return 0;
}

int weft_signal_unwatch(weft_signal *w) {
  if (!w)
    return -EINVAL;
  if (weft__forked(w->rt))
    return -ECHILD;
  pthread_mutex_lock(&g.lock);
  unlink_locked(w);
  wake_dispatcher();
  pthread_mutex_unlock(&g.lock);
  unref(w);
  return 0;
}

void weft__signals_forget(weft_rt *rt) {
  struct weft_signal *dead = NULL;
  pthread_mutex_lock(&g.lock);
  for (int s = 1; s < NSIG; s++) {
    for (struct weft_signal *w = g.list[s], *next; w; w = next) {
      next = w->next;
      if (w->rt != rt)
        continue;
      unlink_locked(w);
      w->next = dead;
      dead = w;
    }
  }
  pthread_mutex_unlock(&g.lock);
  while (dead) {
    struct weft_signal *w = dead;
    dead = w->next;
    unref(w);
  }
}
