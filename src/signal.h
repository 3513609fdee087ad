/*
 * signal.h, signal.c - watching signals (weft_signal_watch): one process-
 * wide table of watchers per signal number, a handler installed with
 * sigaction that only counts and writes a byte to a pipe, and one
 * dispatcher thread per process that reads the pipe and posts each
 * watcher's callback to its strand.
 */
#ifndef WEFT_SIGNAL_H
#define WEFT_SIGNAL_H

#include "core.h"

/* weft_rt_destroy: the runtime's watchers are dropped (no more posts to
 * it); called once its shutdown has finished. */
void weft__signals_forget(weft_rt *rt);

#endif
