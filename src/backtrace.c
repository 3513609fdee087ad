/*
 * backtrace.c - the stuck thread's backtrace in a stall report
 * (backtrace.h). Owns the stall signal's handler, its process-wide
 * installation, the request words of struct weft__thread (bt_*), and the
 * table of system call names.
 *
 * Only a thread that computes is signalled. A signal interrupts a blocked
 * system call, and nanosleep, poll, epoll_wait, select and others return
 * EINTR then even under SA_RESTART (signal(7)): asking a blocked thread
 * would change the user's program. Its system call, read from
 * /proc/self/task/TID/syscall, says more anyway. The kernel's state 'R' is
 * read just before the signal is sent: a thread that blocks in between
 * gets the one signal, once per stall at most; SA_RESTART restarts what can
 * be restarted.
 *
 * The request. The monitor stores the stall's epoch in bt_epoch, then a
 * sequence number in bt_req (release), and sends the signal to the thread
 * alone (tgkill). The handler, on that thread, loads bt_req (acquire, so
 * it sees the epoch stored before it) and answers when it differs from
 * bt_done: still in that epoch (its own hstate, in program order), it
 * fills bt_frames, bt_first and bt_n; either way it then stores bt_done =
 * bt_req (release) and wakes the futex on it. The monitor waits for bt_done
 * == its number (acquire: the frames written before are visible), at most
 * BT_WAIT_NS. Only the thread writes bt_done and the frames, only the
 * monitor the request, and the monitor reads the frames only after its own
 * number's answer and before its next request. Numbers come from one
 * process-wide counter and only grow, so bt_done never equals a new
 * request before its answer. A late signal (one answered after the
 * monitor gave up, or a copy) finds bt_done == bt_req and does nothing, or
 * answers the newer request in full; handlers of one thread never overlap
 * (the signal is blocked while its handler runs), so a late one's frames
 * are written before the newer answer's release.
 *
 * The handler is async-signal-safe: the slot through the initial-exec TLS
 * pointer (weft__self: no allocation), lock-free atomics, backtrace(),
 * futex, and errno saved and restored. glibc's backtrace() loads libgcc_s
 * on its first call (malloc, dlopen): weft__backtrace_install calls it once
 * on the creating thread, so no handler ever makes that first call. After
 * it, the unwinder takes a lock only where the interrupted code was itself
 * unwinding (a C++ throw, another backtrace) with frames registered by
 * hand (__register_frame_info: JITs), a case we accept. A signal that
 * reaches a thread not asked (another runtime's, the application's, the
 * blocking pool's, a copy sent to the process) finds no request and
 * returns.
 *
 * The handler stays installed for the life of the process once a runtime
 * installed it: runtimes share it, and it ignores what it was not asked
 * for, so there is no count of users to keep. It is installed only over
 * SIG_DFL; an application's handler (or SIG_IGN) is left alone, and the
 * monitor checks before each request that the handler is still weft's
 * (weft_signal_watch, or the application, may have replaced it since).
 *
 * The default signal is SIGRTMAX - 1. glibc keeps the first realtime
 * signals for itself (SIGRTMIN is past them); applications take theirs
 * from SIGRTMIN upward, and libraries that count down from the top take
 * SIGRTMAX first.
 */
#include "backtrace.h"

#include "clock.h"
#include "futex.h"
#include "log.h"
#include "rt.h"
#include "thread.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

/* How long the monitor waits for an answer. A computing thread answers in
 * microseconds; one waiting for a CPU, or under ThreadSanitizer (which runs
 * handlers at its next intercepted call), takes longer. The monitor looks
 * at no other shard meanwhile, once a second at most. */
#define BT_WAIT_NS 20000000u

static _Atomic uint32_t seq; /* the last request's number, process-wide */

/* The interrupted instruction, from the handler's context; 0: unknown. */
static uintptr_t interrupted_pc(const void *ctx) {
  const ucontext_t *uc = ctx;
#if defined(__x86_64__)
  return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
  return (uintptr_t)uc->uc_mcontext.pc;
#else
  (void)uc;
  return 0;
#endif
}

/* The first frame of the interrupted code: backtrace() names the exact
 * instruction of the frame that the signal interrupted. Frames before it
 * are the handler's and the kernel's trampoline's. Not found (a sanitizer
 * runs the handler later, from its own code): all but the handler's. */
static unsigned first_frame(void *const *f, unsigned n, uintptr_t pc) {
  for (unsigned i = 0; pc && i < n; i++)
    if ((uintptr_t)f[i] == pc)
      return i;
  return n > 1 ? 1 : 0;
}

static void on_signal(int sig, siginfo_t *si, void *ctx) {
  (void)sig;
  (void)si;
  struct weft__thread *t = weft__self();
  if (!t)
    return;
  uint32_t req = weft__load(&t->bt_req, WA_ACQ);
  if (req == weft__load(&t->bt_done, WA_RLX))
    return; /* nothing asked of this thread */
  int saved = errno;
  uint64_t hs = weft__load(&t->hstate, WA_RLX); /* its own: in order */
  unsigned n = 0, first = 0;
  if ((hs >> 2) == weft__load(&t->bt_epoch, WA_RLX) &&
      (hs & 3) != WEFT_HS_OUT) {
    int got = backtrace(t->bt_frames, WEFT_BT_FRAMES);
    n = got > 0 ? (unsigned)got : 0;
    first = first_frame(t->bt_frames, n, interrupted_pc(ctx));
  }
  t->bt_first = first;
  t->bt_n = n;
  weft__store(&t->bt_done, req, WA_REL);
  weft__futex_wake(&t->bt_done, 1);
  errno = saved;
}

int weft__backtrace_resolve(int *sig) {
  if (*sig == 0)
    *sig = SIGRTMAX - 1;
  if (*sig == -1 || *sig == SIGUSR1 || *sig == SIGUSR2 ||
      (*sig >= SIGRTMIN && *sig <= SIGRTMAX))
    return 0;
  return -EINVAL;
}

/* backtrace()'s first call loads libgcc_s: here, never in the handler. */
static void prime(void) {
  void *f[2];
  (void)backtrace(f, 2);
}

static bool is_ours(const struct sigaction *sa) {
  return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == on_signal;
}

void weft__backtrace_install(weft_rt *rt, int sig) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  rt->mon.bt_sig = 0;
  if (sig <= 0)
    return;
  pthread_once(&once, prime);
  /* Runtimes created at once: one of them installs, the others see it. */
  pthread_mutex_lock(&lock);
  struct sigaction cur;
  bool ok = sigaction(sig, NULL, &cur) == 0;
  if (ok && !is_ours(&cur)) {
    ok = !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_DFL;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (ok)
      ok = sigaction(sig, &sa, NULL) == 0;
  }
  pthread_mutex_unlock(&lock);
  if (ok)
    rt->mon.bt_sig = sig;
  else
    weft__log(rt, WEFT_LOG_INFO,
              "stall reports come without backtraces: signal %d has the "
              "application's handler (weft_config.stall_signal)",
              sig);
}

void weft__backtrace_thread_init(weft_rt *rt) {
  if (!rt->mon.bt_sig)
    return;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, rt->mon.bt_sig);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* ---- the monitor's side ------------------------------------------------ */

/* Asks t for its backtrace and waits for the answer, at most BT_WAIT_NS.
 * NULL when it came; else why there is none: the signal is no longer
 * weft's, or the thread did not answer in time (it blocked the signal,
 * or had no CPU). */
static const char *ask(weft_rt *rt, struct weft__thread *t, int tid,
                       uint64_t hs) {
  struct sigaction cur;
  if (sigaction(rt->mon.bt_sig, NULL, &cur) != 0 || !is_ours(&cur))
    return "its signal has another handler";
  uint32_t n = weft__fetch_add(&seq, 1, WA_RLX) + 1;
  if (!n) /* 0 is "never asked" */
    n = weft__fetch_add(&seq, 1, WA_RLX) + 1;
  weft__store(&t->bt_epoch, hs >> 2, WA_RLX);
  weft__store(&t->bt_req, n, WA_REL);
  if (syscall(SYS_tgkill, getpid(), tid, rt->mon.bt_sig) != 0)
    return "the thread is gone";
  uint64_t deadline = weft__now_ns() + BT_WAIT_NS;
  for (;;) {
    uint32_t d = weft__load(&t->bt_done, WA_ACQ);
    if (d == n)
      return NULL;
    if (weft__now_ns() >= deadline)
      return "the thread did not answer";
    weft__futex_wait_until(&t->bt_done, d, deadline);
  }
}

/* The system calls a blocked handler is most often found in. Numbers differ
 * between architectures: each is named where <sys/syscall.h> has it. */
static const struct {
  long nr;
  const char *name;
} calls[] = {
#define CALL(x)                                                                \
  { SYS_##x, #x }
#ifdef SYS_read
    CALL(read),
#endif
#ifdef SYS_write
    CALL(write),
#endif
#ifdef SYS_readv
    CALL(readv),
#endif
#ifdef SYS_writev
    CALL(writev),
#endif
#ifdef SYS_pread64
    CALL(pread64),
#endif
#ifdef SYS_pwrite64
    CALL(pwrite64),
#endif
#ifdef SYS_openat
    CALL(openat),
#endif
#ifdef SYS_open
    CALL(open),
#endif
#ifdef SYS_fsync
    CALL(fsync),
#endif
#ifdef SYS_fdatasync
    CALL(fdatasync),
#endif
#ifdef SYS_flock
    CALL(flock),
#endif
#ifdef SYS_fcntl
    CALL(fcntl),
#endif
#ifdef SYS_nanosleep
    CALL(nanosleep),
#endif
#ifdef SYS_clock_nanosleep
    CALL(clock_nanosleep),
#endif
#ifdef SYS_poll
    CALL(poll),
#endif
#ifdef SYS_ppoll
    CALL(ppoll),
#endif
#ifdef SYS_select
    CALL(select),
#endif
#ifdef SYS_pselect6
    CALL(pselect6),
#endif
#ifdef SYS_epoll_wait
    CALL(epoll_wait),
#endif
#ifdef SYS_epoll_pwait
    CALL(epoll_pwait),
#endif
#ifdef SYS_epoll_pwait2
    CALL(epoll_pwait2),
#endif
#ifdef SYS_futex
    CALL(futex),
#endif
#ifdef SYS_accept
    CALL(accept),
#endif
#ifdef SYS_accept4
    CALL(accept4),
#endif
#ifdef SYS_connect
    CALL(connect),
#endif
#ifdef SYS_recvfrom
    CALL(recvfrom),
#endif
#ifdef SYS_recvmsg
    CALL(recvmsg),
#endif
#ifdef SYS_sendto
    CALL(sendto),
#endif
#ifdef SYS_sendmsg
    CALL(sendmsg),
#endif
#ifdef SYS_wait4
    CALL(wait4),
#endif
#ifdef SYS_waitid
    CALL(waitid),
#endif
#ifdef SYS_io_uring_enter
    CALL(io_uring_enter),
#endif
#ifdef SYS_clone
    CALL(clone), /* a vfork's parent waits there for the exec */
#endif
#ifdef SYS_clone3
    CALL(clone3),
#endif
#ifdef SYS_pause
    CALL(pause),
#endif
#ifdef SYS_rt_sigsuspend
    CALL(rt_sigsuspend),
#endif
#ifdef SYS_rt_sigtimedwait
    CALL(rt_sigtimedwait),
#endif
#undef CALL
};

/* "; blocked in NAME" (or the number) for a thread blocked in a system
 * call; "" when it is not in one (a page fault) or has woken meanwhile
 * (the kernel then writes "running"). */
static void blocked_in(int tid, char *why, size_t len) {
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  ssize_t got = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (got <= 0)
    return;
  buf[got] = 0;
  char *end;
  long nr = strtol(buf, &end, 10);
  if (end == buf || nr < 0)
    return;
  for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
    if (calls[i].nr == nr) {
      snprintf(why, len, "; blocked in %s", calls[i].name);
      return;
    }
  }
  snprintf(why, len, "; blocked in system call %ld", nr);
}

void weft__backtrace_take(weft_rt *rt, struct weft__thread *t, uint64_t hs,
                          char state, struct weft__bt *bt) {
  bt->frames = NULL;
  bt->nframes = 0;
  bt->why[0] = 0;
  int tid = weft__load(&t->kernel_tid, WA_ACQ);
  if (!tid)
    return;
  if (state == 'S' || state == 'D') {
    blocked_in(tid, bt->why, sizeof(bt->why));
    return;
  }
  if (state != 'R' || !rt->mon.bt_sig)
    return;
  const char *none = ask(rt, t, tid, hs);
  if (none) {
    snprintf(bt->why, sizeof(bt->why), "; no backtrace (%s)", none);
    return;
  }
  if (t->bt_n <= t->bt_first) {
    /* Its handler had returned when the signal came: nothing to show. */
    snprintf(bt->why, sizeof(bt->why), "; no backtrace (it returned)");
    return;
  }
  bt->frames = t->bt_frames + t->bt_first;
  bt->nframes = t->bt_n - t->bt_first;
  snprintf(bt->why, sizeof(bt->why), "; backtrace:");
}

void weft__backtrace_log(weft_rt *rt, const struct weft__bt *bt) {
  char name[256];
  for (unsigned i = 0; i < bt->nframes; i++)
    weft__log(rt, WEFT_LOG_WARN, "  #%u %s", i,
              weft__addr_name(bt->frames[i], name, sizeof(name)));
}
