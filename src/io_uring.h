/*
 * io_uring.h, io_uring.c - the io_uring backend: one ring per shard, used
 * only by the thread holding the shard. What io.c calls; nothing else in
 * src/ includes this header.
 */
#ifndef WEFT_IO_URING_H
#define WEFT_IO_URING_H

#include "io.h"

struct io_uring_sqe;

/* probe: a probe ring, which checks the opcodes and features and is torn
 * down at once; else a shard's ring with its provided buffers. */
int weft__uring_setup(struct weft__io *io, bool probe);
void weft__uring_teardown(struct weft__io *io);
/* Whether multishot accepts and synchronous cancels exist, on a kernel
 * whose cancels they can rely on (6.10), as the probe ring found. */
bool weft__uring_accept_multishot(void);
/* Whether the probe ring had every file opcode weft__uring_file uses. */
bool weft__uring_files_ok(void);
/* Enters the ring to submit what is prepared. Never reaps: what a full CQ
 * or a lack of memory leaves goes with a later enter. */
void weft__uring_submit(struct weft__io *io);
/* Dispatches every completion to its handle. */
void weft__uring_reap(struct weft__io *io);
/* Parks in the ring until an event, a wake or deadline; reaps nothing but
 * wake polls. */
bool weft__uring_wait(struct weft__io *io, uint64_t deadline);

/* An SQE of io's ring, counted as prepared: if the SQ is full it enters
 * the ring once to submit (never reaping), and is NULL if it stays full.
 * Every operation of the backend takes its entry here. */
struct io_uring_sqe *weft__uring_sqe(struct weft__io *io);

/* The verbs (io.h); io is the calling thread's shard's ring. */
int weft__uring_recv(struct weft__io *io, int fd, void *buf, size_t len,
                     bool poll_first, struct weft__ioh *h);
int weft__uring_recv_multishot(struct weft__io *io, int fd,
                               struct weft__ioh *h);
int weft__uring_recvmsg(struct weft__io *io, int fd, struct msghdr *msg,
                        int flags, bool poll_first, struct weft__ioh *h);
int weft__uring_send(struct weft__io *io, int fd, struct msghdr *msg,
                     struct weft__ioh *h);
int weft__uring_connect(struct weft__io *io, int fd,
                        const struct sockaddr *addr, unsigned addrlen,
                        struct weft__ioh *h);
int weft__uring_poll_fd(struct weft__io *io, int fd, unsigned events,
                        struct weft__ioh *h);
int weft__uring_file(struct weft__io *io, const struct weft__fileop *op,
                     struct weft__ioh *h);
int weft__uring_accept(struct weft__io *io, int fd, int flags,
                       struct weft__ioh *h);
int weft__uring_cancel(struct weft__io *io, uint64_t tag, bool now);
/* The one verb any thread may use on any ring (io.h). */
int weft__uring_cancel_sync(struct weft__io *io, uint64_t tag,
                            uint64_t timeout_ns);
/* false: the ring is full; close it yourself. */
bool weft__uring_close(struct weft__io *io, int fd);

#endif
