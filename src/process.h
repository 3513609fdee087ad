/*
 * process.h, process.c - child processes (weft_spawn): a program started
 * with its pidfd (spawnfd.c), its stdio as streams, its end watched through
 * that pidfd (an object of sock.h's kind SK_PROC).
 */
#ifndef WEFT_PROCESS_H
#define WEFT_PROCESS_H

#include "core.h"

/* The runtime's side: the pool at create, freed at destroy. */
void weft__process_init(weft_rt *rt);
void weft__process_destroy(weft_rt *rt);

#endif
