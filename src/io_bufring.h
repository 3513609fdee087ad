/*
 * io_bufring.h, io_bufring.c - each io_uring shard's ring of provided
 * receive buffers, which multishot receives fill.
 */
#ifndef WEFT_IO_BUFRING_H
#define WEFT_IO_BUFRING_H

#include "io.h"

/* The buffer group id of every shard's ring (one group per ring). */
#define WEFT_BUFRING_GROUP 0

/* Sets up io's buffers: 0, or the kernel's refusal (io->br stays NULL). */
int weft__bufring_setup(struct weft__io *io);
/* After the ring is gone (the kernel drops the registration with it). */
void weft__bufring_free(struct weft__io *io);
/* The buffer of an id, NULL if out of range. */
struct weft__rbuf *weft__bufring_get(struct weft__io *io, unsigned bid);
/* Holder: moves buffers handed back by other threads to the ring. */
void weft__bufring_drain(struct weft__io *io);
/* Holder: gives one buffer back to the ring. */
void weft__bufring_give(struct weft__io *io, struct weft__rbuf *b);
/* Any thread: hands a read buffer back (io.h, weft__io_buf_put). */
void weft__bufring_put(weft_rt *rt, struct weft__rbuf *b);

#endif
