/*
 * backtrace.h, backtrace.c - what a stall report says of the stuck thread:
 * its backtrace, taken by a signal (weft_config.stall_signal) that the
 * monitor sends only to a thread that computes, or the system call a
 * blocked one waits in (/proc). backtrace.c has the argument.
 */
#ifndef WEFT_BACKTRACE_H
#define WEFT_BACKTRACE_H

#include "core.h"

/* What the monitor learned of a stuck thread (weft__backtrace_take). */
struct weft__bt {
  /* the thread's frames, innermost (the interrupted function) first,
   * valid until the monitor's next request: NULL when none were taken */
  void *const *frames;
  unsigned nframes;
  /* for the stall line: "; blocked in poll", "; no backtrace (...)", or
   * "" (frames follow, or nothing is known) */
  char why[80];
};

/* weft_config.stall_signal, resolved: 0 becomes SIGRTMAX - 1; -1 (none),
 * SIGUSR1, SIGUSR2 and SIGRTMIN..SIGRTMAX are kept; others are -EINVAL. */
int weft__backtrace_resolve(int *sig);
/* weft_rt_create, before the runtime's first thread: installs the handler
 * for sig (resolved) unless the application has its own; sets
 * rt->mon.bt_sig to sig if the handler is weft's, else to 0. */
void weft__backtrace_install(weft_rt *rt, int sig);
/* A runtime thread, first thing: unblocks rt->mon.bt_sig, which
 * weft__spawn blocked with every other asynchronous signal. */
void weft__backtrace_thread_init(weft_rt *rt);
/* The monitor: what t, stuck in the handler of epoch hs >> 2, is doing.
 * state is its kernel state (monitor.c, thread_state): 'R' asks the
 * thread for its backtrace and waits for it (bounded), 'S' and 'D' read
 * its system call. */
void weft__backtrace_take(weft_rt *rt, struct weft__thread *t, uint64_t hs,
                          char state, struct weft__bt *bt);
/* One WEFT_LOG_WARN line per frame of bt: "  #0 fn+0x12 (obj+0x3456)". */
void weft__backtrace_log(weft_rt *rt, const struct weft__bt *bt);

#endif
