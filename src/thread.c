/*
 * thread.c - the thread-local identity of the runtime's threads and of the
 * handler they run, and the one way the runtime starts a thread (thread.h).
 * Owns nothing: thread slots live in the runtime's arena (rt.c).
 */
#include "thread.h"

#include <signal.h>

_Thread_local struct weft__thread *weft__tls_self
    __attribute__((tls_model("initial-exec")));
_Thread_local weft_strand *weft__tls_strand
    __attribute__((tls_model("initial-exec")));

void weft__set_self(struct weft__thread *t) { weft__tls_self = t; }

weft_strand *weft_strand_current(void) { return weft__tls_strand; }

weft_rt *weft_rt_current(void) {
  return weft__tls_self ? weft__tls_self->rt : NULL;
}

/* The synchronous signals stay deliverable: they report the thread's own
 * fault and must not be left pending. */
int weft__spawn(pthread_t *tid, const pthread_attr_t *attr, void *(*fn)(void *),
                void *arg) {
  sigset_t all, old;
  sigfillset(&all);
  const int sync_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL,
                           SIGTRAP, SIGSYS, SIGABRT};
  for (size_t i = 0; i < sizeof(sync_sigs) / sizeof(sync_sigs[0]); i++)
    sigdelset(&all, sync_sigs[i]);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int err = pthread_create(tid, attr, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return err;
}
