/*
 * io_bufring.c - each io_uring shard's ring of provided receive buffers
 * (Linux 5.19), which the sockets' multishot receives (tcp_recv.c) fill
 * (io_bufring.h).
 * Owns the buffers' memory, their descriptors (struct weft__rbuf) and the
 * stack on which threads that do not hold the shard hand buffers back.
 *
 * A buffer is in exactly one place at a time: in the kernel's ring (free),
 * in a socket's queue (data not yet read; the socket's strand owns it), or
 * on the shard's return stack. Only the thread holding the shard writes the
 * ring's tail (io_uring_buf_ring_add/advance: one producer, as the kernel
 * requires); a strand that runs on another thread pushes what it is done
 * with on io->rbuf_ret, and the holder moves those to the ring when it
 * next reaps. A thread holds at most one shard, and a shard passes from
 * holder to holder through the monitor's handoff, which orders the ring's
 * writes of one holder before the next's.
 *
 * The return stack: pushers CAS the head (release, after writing next),
 * the holder takes the whole stack with one exchange (acquire). Nothing
 * pops single nodes, so there is no ABA: a node pushed again after being
 * taken is a new push onto whatever head is current.
 *
 * The ring is small and shared by the shard's sockets; a socket's receive
 * stops itself when it holds too many unread buffers (tcp_recv.c), and a
 * receive that finds the ring empty ends with -ENOBUFS and falls back to a
 * receive into the reader's own buffer, so one socket that is not read
 * never stops the others.
 */
#include "io_bufring.h"

#include "thread.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void give(struct weft__io *io, struct weft__rbuf *b, int pos) {
  io_uring_buf_ring_add(io->br, b->data, WEFT_RBUF_SIZE, b->bid,
                        io_uring_buf_ring_mask(WEFT_RBUF_COUNT), pos);
}

int weft__bufring_setup(struct weft__io *io) {
  size_t ringsz = sizeof(struct io_uring_buf) * WEFT_RBUF_COUNT;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *br = NULL;
  if (posix_memalign(&br, page, (ringsz + page - 1) / page * page))
    return -ENOMEM;
  io->rbufs = calloc(WEFT_RBUF_COUNT, sizeof(*io->rbufs));
  io->rbuf_mem = malloc((size_t)WEFT_RBUF_COUNT * WEFT_RBUF_SIZE);
  if (!io->rbufs || !io->rbuf_mem) {
    free(br);
    free(io->rbufs);
    free(io->rbuf_mem);
    io->rbufs = NULL;
    io->rbuf_mem = NULL;
    return -ENOMEM;
  }
  memset(br, 0, ringsz);
  struct io_uring_buf_reg reg;
  memset(&reg, 0, sizeof(reg));
  reg.ring_addr = (uintptr_t)br;
  reg.ring_entries = WEFT_RBUF_COUNT;
  reg.bgid = WEFT_BUFRING_GROUP;
  int r = io_uring_register_buf_ring(io->ring, &reg, 0);
  if (r) {
    free(br);
    free(io->rbufs);
    free(io->rbuf_mem);
    io->rbufs = NULL;
    io->rbuf_mem = NULL;
    return r;
  }
  io->br = br;
  io_uring_buf_ring_init(io->br);
  for (unsigned i = 0; i < WEFT_RBUF_COUNT; i++) {
    struct weft__rbuf *b = &io->rbufs[i];
    b->io = io;
    b->bid = (uint16_t)i;
    b->data = io->rbuf_mem + (size_t)i * WEFT_RBUF_SIZE;
    give(io, b, (int)i);
  }
  io_uring_buf_ring_advance(io->br, WEFT_RBUF_COUNT);
  return 0;
}

/* After the ring is gone (the kernel drops the registration with it). */
void weft__bufring_free(struct weft__io *io) {
  free(io->br);
  free(io->rbufs);
  free(io->rbuf_mem);
  io->br = NULL;
  io->rbufs = NULL;
  io->rbuf_mem = NULL;
}

struct weft__rbuf *weft__bufring_get(struct weft__io *io, unsigned bid) {
  return bid < WEFT_RBUF_COUNT ? &io->rbufs[bid] : NULL;
}

void weft__bufring_drain(struct weft__io *io) {
  if (!weft__load(&io->rbuf_ret, WA_RLX))
    return;
  struct weft__rbuf *b = weft__xchg(&io->rbuf_ret, NULL, WA_ACQ);
  int n = 0;
  for (; b; b = b->next)
    give(io, b, n++);
  io_uring_buf_ring_advance(io->br, n);
}

void weft__bufring_give(struct weft__io *io, struct weft__rbuf *b) {
  give(io, b, 0);
  io_uring_buf_ring_advance(io->br, 1);
}

void weft__bufring_put(weft_rt *rt, struct weft__rbuf *b) {
  struct weft__io *io = b->io;
  struct weft__shard *sh = weft__local_begin(rt);
  if (sh && weft__load(&sh->io, WA_RLX) == io) {
    weft__bufring_give(io, b);
    weft__stat_add(&io->st_rbuf_in, 1);
  } else {
    weft__fetch_add(&io->st_rbuf_ret, 1, WA_RLX);
    weft__rbuf_push(&io->rbuf_ret, b);
  }
  weft__local_end(sh);
}
