/*
 * spawnfd.h, spawnfd.c - starting a program with its pidfd made by the same
 * system call (clone with CLONE_PIDFD), so no other reaper in the process
 * can take the child between its start and weft's hold on it. Used by
 * process.c (weft_spawn).
 */
#ifndef WEFT_SPAWNFD_H
#define WEFT_SPAWNFD_H

#include <sys/types.h>

#define WEFT__SPAWN_INHERIT (-1) /* the parent's own descriptor i */
#define WEFT__SPAWN_NULL (-2)    /* /dev/null */

struct weft__spawn {
  const char *const *argv; /* argv[0] searched in path when it has no '/' */
  const char *const *envp;
  const char *cwd;  /* NULL: the parent's */
  const char *path; /* the parent's PATH, read before the start */
  /* Per stdio descriptor i: WEFT__SPAWN_INHERIT, WEFT__SPAWN_NULL, or a
   * descriptor of 3 or above that becomes i (so that no stdio step can
   * overwrite another's source). */
  int fd[3];
};

/* Starts sp->argv with no signal blocked. 0 with *pid and *pidfd (close on
 * exec) set; or a negative errno with nothing left running: the error of
 * the clone, or of the child's step that failed before its exec (chdir,
 * the stdio, the exec: -ENOENT, -EACCES, ...), that child reaped. */
int weft__spawn_start(const struct weft__spawn *sp, pid_t *pid, int *pidfd);

/* Waits until the child of pidfd has ended and reaps it (a child another
 * reaper took, ECHILD, counts as reaped). The pidfd stays open. */
void weft__spawn_reap(int pidfd);

#endif
