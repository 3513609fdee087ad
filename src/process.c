/*
 * process.c - child processes (weft_spawn): starting a program (spawnfd.c,
 * which returns its pidfd with it), its stdio as streams (socket pairs
 * adopted as connections, tcp.c), and its end, watched through the pidfd.
 * Owns struct weft_process (an object of sock.h's kind SK_PROC whose
 * descriptor is the pidfd) and its pool.
 *
 * A pidfd becomes readable when its process ends; that readiness comes as
 * any socket's does (epoll's edge, or a one-shot poll in the io_uring
 * ring), and the strand then reaps with waitid(P_PIDFD, WNOHANG). Nothing
 * waits on SIGCHLD, so the application keeps that signal to itself, and a
 * pid that another process reused is never waited for or signalled (the
 * pidfd names this process only; weft_process_kill uses
 * pidfd_send_signal). One caveat no pidfd removes: another reaper (an
 * application's waitpid(-1), or SIGCHLD ignored, when the kernel reaps)
 * may take the child's status first; waitid then fails with ECHILD, and
 * the exit callback reports exit code -ECHILD.
 *
 * At a shutdown a child still running is killed and reaped on its strand
 * (waitid without WNOHANG returns as soon as SIGKILL has ended it), so no
 * zombie outlives the runtime and every exit callback runs once; one that
 * cannot be killed is left running (unkillable).
 */
#include "process.h"

#include "rt.h"
#include "sock.h"
#include "spawnfd.h"
#include "tcp.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define EV_POLLED (EV_KIND << 0) /* uring: the poll of the pidfd completed */

extern char **environ;

struct weft_process {
  struct weft__sock s;
  weft_exit_fn fn;
  void *arg;
  pid_t pid;
  bool polling;
  struct weft__io *poll_io; /* the ring the poll went to, while polling */
};

static int pidfd_signal(int fd, int signo) {
  return syscall(SYS_pidfd_send_signal, fd, signo, NULL, 0) < 0 ? -errno : 0;
}

/* ---- the strand's handler --------------------------------------------------
 */

/* Frees p once its exit callback has run and no poll of its pidfd is in
 * the ring: the completion of one in flight names p's memory. Such a poll
 * completes without a cancel, since a pidfd polls readable once its
 * process has ended, and a reaped process has; only an unkillable child's
 * is cancelled. */
static void finish(struct weft_process *p) {
  if (p->polling)
    return; /* weft__proc_run finishes on the poll's completion */
  weft__sock_close_fd(&p->s);
  weft__sock_free(&p->s);
}

/* si: how it ended; NULL: unknown, err says why (exit_code err). */
static void ended(struct weft_process *p, const siginfo_t *si, int err) {
  int code = err, sig = 0;
  if (si && si->si_code == CLD_EXITED)
    code = si->si_status;
  else if (si)
    sig = si->si_status; /* CLD_KILLED, CLD_DUMPED */
  p->s.state = ST_CLOSED;
  weft__calling((void *)p->fn);
  p->fn(p->arg, p, code, sig);
  finish(p);
}

/* Reaps p if it has ended (wait: until it has); true if it had. */
static bool reap(struct weft_process *p, bool wait) {
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  int r;
  do
    r = waitid(P_PIDFD, (id_t)p->s.fd, &si, WEXITED | (wait ? 0 : WNOHANG));
  while (r < 0 && errno == EINTR);
  if (r < 0) { /* ECHILD: reaped by someone else (see the top) */
    ended(p, NULL, -errno);
    return true;
  }
  if (si.si_pid == 0)
    return false; /* still running */
  ended(p, &si, 0);
  return true;
}

static void poll_submit(struct weft_process *p) {
  struct weft__shard *sh = weft__local_begin(weft__sock_rt(&p->s));
  p->polling = weft__io_poll_fd(sh, p->s.fd, WEFT_IO_IN, &p->s.ioh) == 0;
  p->poll_io = p->polling ? weft__io_of(sh) : NULL;
  weft__local_end(sh);
  if (!p->polling)
    weft__sock_kick(&p->s);
}

/* At a shutdown, a child that SIGKILL cannot reach (err: -EPERM, it took
 * a user this process may not signal): waiting for it could take forever,
 * so its exit callback reports err and it is left running, unreaped. Its
 * poll, which would complete only at its end, is cancelled; -ENOENT means
 * it has completed, its EV_POLLED on the way (a poll prepared but not yet
 * entered would be missed, and hold the shutdown until the child ends). */
static void unkillable(struct weft_process *p, int err) {
  if (reap(p, false))
    return; /* it ended meanwhile */
  /* Read first: with no poll in the ring, ended() frees p. */
  struct weft__io *io = p->polling ? p->poll_io : NULL;
  ended(p, NULL, err);
  if (io)
    weft__io_cancel_sync(io, &p->s.ioh, WEFT_OP_POLL, 1000000);
}

void weft__proc_run(struct weft__sock *s, uint32_t bits) {
  struct weft_process *p = (struct weft_process *)s;
  if (bits & EV_POLLED)
    p->polling = false;
  if (s->state == ST_CLOSED)
    finish(p);
  if (s->state != ST_OPEN)
    return;
  if (bits & EV_SHUTDOWN) {
    int k = pidfd_signal(s->fd, SIGKILL);
    if (k && k != -ESRCH) {
      unkillable(p, k);
      return;
    }
    if (!p->polling) {
      reap(p, true);
      return;
    }
    /* uring: the poll ends once the child has; reaped then */
  }
  if (reap(p, false))
    return;
  if (weft__io_completes(weft__sock_rt(s)) && !p->polling)
    poll_submit(p);
}

static void proc_done(struct weft__ioh *h, struct weft__shard *local,
                      unsigned op, const struct weft__cqe *c) {
  (void)op;
  (void)c;
  weft__sock_signal(local, weft__sock_of(h), EV_POLLED, WEFT_GEN_ANY);
}

/* ---- spawning --------------------------------------------------------------
 */

struct stdio_fds {
  int parent[3], child[3];
};

static void fds_close(struct stdio_fds *f) {
  for (int i = 0; i < 3; i++) {
    if (f->parent[i] >= 0)
      close(f->parent[i]);
    if (f->child[i] >= 0)
      close(f->child[i]);
    f->parent[i] = f->child[i] = -1;
  }
}

/* Socket pairs for o->stdio's pipes; sp->fd for each descriptor. A child
 * end below 3 (the parent has closed its stdio) is moved up, so that
 * making one of the child's stdio descriptors cannot close another's
 * source (spawnfd.h). */
static int stdio_setup(weft_rt *rt, const weft_spawn_opts *o,
                       struct weft__spawn *sp, struct stdio_fds *f) {
  for (int i = 0; i < 3; i++) {
    int sv[2];
    switch (o->stdio[i]) {
    case WEFT_STDIO_INHERIT:
      sp->fd[i] = WEFT__SPAWN_INHERIT;
      break;
    case WEFT_STDIO_NULL:
      sp->fd[i] = WEFT__SPAWN_NULL;
      break;
    case WEFT_STDIO_PIPE:
      /* The child's end stays blocking, as programs expect of stdio. */
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
      f->parent[i] = sv[0];
      f->child[i] = sv[1];
      if (sv[1] < 3) {
        int up = fcntl(sv[1], F_DUPFD_CLOEXEC, 3);
        if (up < 0)
          return -errno;
        close(sv[1]);
        f->child[i] = up;
      }
      sp->fd[i] = f->child[i];
      if (weft__io_sock_flags(rt) & SOCK_NONBLOCK &&
          fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK) < 0)
        return -errno;
      break;
    default:
      return -EINVAL;
    }
  }
  return 0;
}

static int start(weft_rt *rt, const weft_spawn_opts *o, struct stdio_fds *f,
                 pid_t *pid, int *pidfd) {
  struct weft__spawn sp = {.argv = o->argv,
                           .envp =
                               o->envp ? o->envp : (const char *const *)environ,
                           .cwd = o->cwd,
                           .path = getenv("PATH")};
  int r = stdio_setup(rt, o, &sp, f);
  if (!r) {
    weft__waits_in("weft_spawn");
    r = weft__spawn_start(&sp, pid, pidfd);
    weft__waits_in(NULL);
  }
  for (int i = 0; i < 3; i++)
    if (f->child[i] >= 0) {
      close(f->child[i]);
      f->child[i] = -1;
    }
  return r;
}

static int check(weft_rt *rt, weft_strand *s, const weft_spawn_opts *o,
                 weft_exit_fn fn, weft_tcp *streams[3]) {
  if (!rt || !o || !o->argv || !o->argv[0] || !fn)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (weft__simulated(rt))
    return -ENOTSUP; /* a child runs on its own clock */
  int sr = weft__strand_usable(rt, s);
  if (sr)
    return sr;
  bool pipes = false;
  for (int i = 0; i < 3; i++) {
    if (o->stdio[i] < WEFT_STDIO_INHERIT || o->stdio[i] > WEFT_STDIO_PIPE)
      return -EINVAL;
    pipes |= o->stdio[i] == WEFT_STDIO_PIPE;
  }
  if (pipes && (!streams || !s))
    return -EINVAL;
  if (pipes && weft__current_strand() != s)
    return -EPERM;
  return weft__tcp_check_rt(rt);
}

/* A spawned child that weft will not watch: killed and reaped, through
 * its pidfd (never by pid: see spawnfd.c); the caller closes the pidfd. */
static void abandon(int pidfd) {
  pidfd_signal(pidfd, SIGKILL);
  weft__spawn_reap(pidfd);
}

int weft_spawn(weft_rt *rt, weft_strand *s, const weft_spawn_opts *o,
               weft_exit_fn fn, void *arg, weft_process **out,
               weft_tcp *streams[3]) {
  int r = check(rt, s, o, fn, streams);
  if (r)
    return r;
  struct stdio_fds f = {{-1, -1, -1}, {-1, -1, -1}};
  pid_t pid;
  int pfd;
  if ((r = start(rt, o, &f, &pid, &pfd))) {
    fds_close(&f);
    return r;
  }
  struct weft__sock *sk = NULL;
  if ((r = weft__sock_new(&sk, rt, SK_PROC, pfd, s, proc_done))) {
    abandon(pfd);
    close(pfd);
    fds_close(&f);
    return r;
  }
  struct weft_process *p = (struct weft_process *)sk;
  p->fn = fn;
  p->arg = arg;
  p->pid = pid;
  p->s.state = ST_OPEN;
  if (streams)
    streams[0] = streams[1] = streams[2] = NULL;
  for (int i = 0; i < 3 && !r; i++)
    if (f.parent[i] >= 0) {
      r = weft__tcp_adopt(rt, s, f.parent[i], &streams[i]);
      f.parent[i] = -1; /* the stream's now, even on error */
    }
  /* Before: once registered, p may end and be freed at once. */
  if (out)
    *out = p;
  if (!r)
    /* uring: its first poll; epoll: a first look */
    r = weft__sock_register(&p->s, weft__sock_home(rt), false, EV_KICK);
  if (r) {
    if (out)
      *out = NULL;
    for (int i = 0; streams && i < 3; i++)
      if (streams[i]) {
        weft_tcp_close(streams[i], 1);
        streams[i] = NULL;
      }
    abandon(pfd);
    fds_close(&f);
    weft__sock_discard(sk); /* closes the pidfd */
    return r;
  }
  return 0;
}

int weft_process_kill(weft_process *p, int signo) {
  if (!p || p->s.kind != SK_PROC || signo < 0 || signo >= NSIG)
    return -EINVAL;
  if (weft__forked(weft__sock_rt(&p->s)))
    return -ECHILD;
  return pidfd_signal(p->s.fd, signo);
}

int weft_process_pid(const weft_process *p) {
  return p && p->s.kind == SK_PROC ? (int)p->pid : -EINVAL;
}

/* ---- the runtime's side ----------------------------------------------------
 */

void weft__process_init(weft_rt *rt) {
  weft__pool_init(&rt->net.proc_pool, sizeof(struct weft_process));
}

void weft__process_destroy(weft_rt *rt) {
  weft__pool_destroy(&rt->net.proc_pool);
}
