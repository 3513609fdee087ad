/*
 * spawnfd.c - starting a program with its pidfd (spawnfd.h). Owns the child's
 * side of a start: what runs between the clone and the exec.
 *
 * Why not posix_spawn: it returns a pid, and a pidfd opened from that pid
 * afterwards races every other reaper in the process. With SIGCHLD
 * ignored the kernel reaps a child that exits before the pidfd_open, and
 * an application's waitpid(-1) may reap it too; the open then fails
 * (ESRCH), or, once the pid is reused, names another process, which a
 * shutdown would then kill. glibc 2.39's pidfd_spawnp closes the race,
 * but Debian 12 has 2.36; clone with CLONE_PIDFD (Linux 5.2) returns the
 * pidfd with the child.
 *
 * The child starts as glibc's posix_spawn starts one: CLONE_VM |
 * CLONE_VFORK on a stack of its own, so nothing is copied, and the calling
 * thread waits until the child has exec'd or exited. Sharing the parent's
 * memory, the child makes only system calls, and makes them raw
 * (syscall(2)), never through a function a sanitizer intercepts: an
 * interceptor would update the parent's bookkeeping from the child (TSan
 * keeps the handlers sigaction installs). Before the clone the calling
 * thread blocks every signal, raw too so that glibc's internal ones are
 * included: none of the parent's handlers may run on the child's stack in
 * the parent's memory. The child sets each caught signal back to its
 * default (an ignored one stays ignored across the exec, as POSIX says),
 * then unblocks them all. A step that fails before the exec writes its
 * errno to the shared plan and the child exits 127; the parent reaps it.
 */
#include "spawnfd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* The child's stack: a path buffer and a few frames (sanitizers' larger);
 * mapped per start, its pages touched only as used. */
#define STACK_BYTES (256 * 1024)

#if defined(__clang__) || __GNUC__ >= 8
#define CHILD_SIDE                                                             \
  __attribute__((no_sanitize("address", "thread", "undefined"), noinline))
#else
#define CHILD_SIDE __attribute__((noinline))
#endif

/* The kernel's struct sigaction. It begins with the handler on every
 * architecture weft builds for; where one has no restorer field, the mask
 * lies in its place, and is only ever zeroed here. */
struct kact {
  void *handler;
  unsigned long flags;
  void *restorer;
  uint64_t mask;
};

/* The string steps the child needs, by hand: the library's versions may be
 * a sanitizer's interceptors. volatile keeps the compiler from turning
 * the loops back into those calls. */
CHILD_SIDE static size_t c_len(const char *s) {
  size_t n = 0;
  while (((const volatile char *)s)[n])
    n++;
  return n;
}

CHILD_SIDE static const char *c_colon(const char *s) {
  while (*(const volatile char *)s && *s != ':')
    s++;
  return s;
}

CHILD_SIDE static void c_copy(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    ((volatile char *)d)[i] = s[i];
}

/* glibc's clone under the name it also exports: ThreadSanitizer intercepts
 * clone as a fork, and its child-side step resets the runtime's view of
 * threads and descriptors, which with CLONE_VM is the parent's own (false
 * races after every start). The interceptor does not see __clone. */
#ifdef __GLIBC__
extern int __clone(int (*fn)(void *), void *stack, int flags, void *arg, ...);
#define CLONE __clone
#else
#define CLONE clone
#endif

struct plan {
  const struct weft__spawn *sp;
  volatile int err; /* written by the child before it exits */
};

CHILD_SIDE static int child_stdio(const struct weft__spawn *sp) {
  for (int i = 0; i < 3; i++) {
    int fd = sp->fd[i];
    if (fd == WEFT__SPAWN_INHERIT)
      continue;
    bool opened = fd == WEFT__SPAWN_NULL;
    if (opened) {
      fd = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null",
                        i ? O_WRONLY : O_RDONLY, 0);
      if (fd < 0)
        return errno;
    }
    /* fd is 3 or above, or, opened, the lowest free: never a source
     * that a later i still needs (those are 3 or above). */
    if (fd != i && syscall(SYS_dup3, fd, i, 0) < 0)
      return errno;
    if (opened && fd != i)
      syscall(SYS_close, fd);
  }
  return 0;
}

/* execvp's search, as glibc's: an entry that lacks the file or cannot be
 * searched is skipped; EACCES is reported if any entry gave it; any other
 * error ends the search. An empty entry is the working directory. */
CHILD_SIDE static int child_exec(const struct weft__spawn *sp) {
  const char *file = sp->argv[0];
  char *const *argv = (char *const *)sp->argv;
  char *const *envp = (char *const *)sp->envp;
  size_t flen = c_len(file);
  for (size_t i = 0; i < flen; i++)
    if (file[i] == '/') {
      syscall(SYS_execve, file, argv, envp);
      return errno;
    }
  if (!flen)
    return ENOENT;
  if (flen > NAME_MAX)
    return ENAMETOOLONG;
  char buf[PATH_MAX];
  const char *p = sp->path ? sp->path : "/bin:/usr/bin";
  int err = ENOENT;
  bool eacces = false;
  for (;;) {
    const char *end = c_colon(p);
    size_t dlen = (size_t)(end - p), k = 0;
    if (dlen + flen + 2 > sizeof(buf)) {
      err = ENAMETOOLONG;
    } else {
      if (dlen) {
        c_copy(buf, p, dlen);
        k = dlen;
        buf[k++] = '/';
      }
      c_copy(buf + k, file, flen + 1);
      syscall(SYS_execve, buf, argv, envp);
      switch (errno) {
      case EACCES:
        eacces = true;
        break;
      case ENOENT:
      case ENOTDIR:
      case ESTALE:
      case ENODEV:
      case ETIMEDOUT:
        break;
      default:
        return errno;
      }
    }
    if (!*end)
      break;
    p = end + 1;
  }
  return eacces ? EACCES : err;
}

CHILD_SIDE static int child(void *arg) {
  struct plan *pl = arg;
  const struct weft__spawn *sp = pl->sp;
  for (int sig = 1; sig < 65; sig++) {
    struct kact a = {0}, dfl = {0};
    if (syscall(SYS_rt_sigaction, sig, NULL, &a, sizeof(uint64_t)) == 0 &&
        a.handler != (void *)SIG_DFL && a.handler != (void *)SIG_IGN)
      syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof(uint64_t));
  }
  uint64_t none = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof(none));
  int err = child_stdio(sp);
  if (!err && sp->cwd && syscall(SYS_chdir, sp->cwd) < 0)
    err = errno;
  if (!err)
    err = child_exec(sp);
  pl->err = err ? err : EIO;
  syscall(SYS_exit_group, 127);
  return 127;
}

void weft__spawn_reap(int pidfd) {
  siginfo_t si;
  while (waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED) < 0 && errno == EINTR)
    ;
}

int weft__spawn_start(const struct weft__spawn *sp, pid_t *pid, int *pidfd) {
  void *stack = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED)
    return -errno;
  struct plan pl = {.sp = sp, .err = 0};
  uint64_t all = ~(uint64_t)0, old;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof(all));
  int fd = -1;
  pid_t p = CLONE(child, (char *)stack + STACK_BYTES,
                  CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD, &pl, &fd);
  int e = errno;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof(old));
  munmap(stack, STACK_BYTES);
  if (p < 0)
    return e == EINVAL ? -ENOSYS : -e; /* EINVAL: no CLONE_PIDFD (< 5.2) */
  if (pl.err) {
    /* Exited, or exiting (the vfork ends at its exit): reaped here, unless
     * SIGCHLD is ignored or another reaper was first (ECHILD). */
    weft__spawn_reap(fd);
    close(fd);
    return -pl.err;
  }
  *pid = p;
  *pidfd = fd;
  return 0;
}
