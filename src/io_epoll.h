/*
 * io_epoll.h, io_epoll.c - the epoll backend: one epoll set per shard,
 * used only by the thread holding the shard. What io.c calls.
 */
#ifndef WEFT_IO_EPOLL_H
#define WEFT_IO_EPOLL_H

#include "io.h"

int weft__epoll_setup(struct weft__io *io);
/* Collects events (block: until deadline, UINT64_MAX none; else a look)
 * without dispatching them; true when some wait. */
bool weft__epoll_wait(struct weft__io *io, uint64_t deadline, bool block);
/* Hands the collected events to their handles. */
void weft__epoll_dispatch(struct weft__io *io);
/* Registers fd edge-triggered with h and gen (io.h, weft__io_watch). */
int weft__epoll_watch(struct weft__io *io, int fd, struct weft__ioh *h,
                      uint32_t gen, bool out);

#endif
