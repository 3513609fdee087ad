/*
 * unix_fds.c - receiving descriptors on a Unix connection (SCM_RIGHTS):
 * the limit, the queue of descriptors received and not yet taken (struct
 * weft__fdq, unix.h), and the control messages of the receives. Owns the
 * queue and the descriptors in it. Sending them is a write (tcp_send.c).
 *
 * The bound is the kernel's doing: each receive offers a control buffer
 * with room for just as many descriptors as the connection may still
 * hold, and the kernel closes those that do not fit and sets MSG_CTRUNC
 * (scm_detach_fds). A connection without a queue reads with recv(2) or
 * io_uring's receives, which offer no control buffer, so every descriptor
 * that comes is closed on arrival. A receive never returns the bytes of
 * two writes that carried descriptors: the kernel ends it after the first
 * segment that carries some (unix_stream_read_generic), and the
 * descriptors ride on the first segment of their write, so they come with
 * the read that returns that write's first byte.
 *
 * A multishot receive (tcp_recv.c) reads ahead into provided buffers with
 * no control buffer, so a connection with a queue never uses one; and the
 * queue must exist before the first read, when nothing has been read
 * ahead.
 */
#include "rt.h"
#include "tcp.h"
#include "unix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PER_MSG 253 /* SCM_MAX_FD: the most one control message carries */

_Static_assert(WEFT_FDS_PER_WRITE == PER_MSG, "weft.h's figure");

int weft__unix_conn_check(struct weft__conn *c) {
#ifdef WEFT_SIM
  if (c->sim_family)
    return -EAFNOSUPPORT; /* TCP, on a Unix socket underneath (sim.h) */
#endif
  int domain;
  socklen_t len = sizeof(domain);
  if (getsockopt(c->s.fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
    return -errno;
  return domain == AF_UNIX ? 0 : -EAFNOSUPPORT;
}

struct msghdr *weft__fdq_msg(struct weft__conn *c) {
  struct weft__fdq *q = weft__tcp_fdq(c);
  unsigned room = q->max - q->count;
  if (room > PER_MSG)
    room = PER_MSG;
  q->iov.iov_base = c->rbuf;
  q->iov.iov_len = c->rlen;
  memset(&q->msg, 0, sizeof(q->msg));
  q->msg.msg_iov = &q->iov;
  q->msg.msg_iovlen = 1;
  if (room) {
    /* CMSG_LEN, not CMSG_SPACE: the kernel fits (controllen - header) /
     * sizeof(int) descriptors, and CMSG_SPACE's padding would let one
     * more in when room is odd. */
    q->msg.msg_control = q->ctl.buf;
    q->msg.msg_controllen = CMSG_LEN(sizeof(int) * room);
  }
  return &q->msg;
}

static void push(struct weft__conn *c, struct weft__fdq *q, int fd) {
  if (q->count == q->max) { /* the room offered was less: weft's bug */
    weft__log(weft__sock_rt(&c->s), WEFT_LOG_ERROR,
              "internal: a descriptor beyond the limit of %u received", q->max);
    close(fd);
    q->dropped = true;
    return;
  }
  q->fds[(q->head + q->count++) % q->max] = fd;
}

void weft__fdq_collect(struct weft__conn *c) {
  struct weft__fdq *q = weft__tcp_fdq(c);
  if (q->msg.msg_flags & MSG_CTRUNC)
    q->dropped = true;
  if (!q->msg.msg_control)
    return;
  for (struct cmsghdr *m = CMSG_FIRSTHDR(&q->msg); m;
       m = CMSG_NXTHDR(&q->msg, m)) {
    if (m->cmsg_level != SOL_SOCKET || m->cmsg_type != SCM_RIGHTS)
      continue;
    size_t n = (m->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char *p = CMSG_DATA(m);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, p + i * sizeof(int), sizeof(int)); /* unaligned */
      push(c, q, fd);
    }
  }
}

void weft__fdq_free(struct weft__conn *c) {
  struct weft__fdq *q = weft__tcp_fdq(c);
  if (!q)
    return;
  for (unsigned i = 0; i < q->count; i++)
    close(q->fds[(q->head + i) % q->max]);
  free(q);
  c->more->fdq = NULL;
}

int weft_tcp_set_fd_limit(weft_tcp *tcp, unsigned max) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_set_fd_limit");
  if (r)
    return r;
  if (max > WEFT_FDS_HELD_MAX)
    return -EINVAL;
  if ((r = weft__unix_conn_check(c)))
    return r;
  if (c->read_made)
    return -EBUSY;
  struct weft__fdq *q = NULL;
  if (max && !weft__tcp_more(c))
    return -ENOMEM;
  if (max) {
    q = calloc(1, sizeof(*q) + sizeof(int) * max);
    if (!q)
      return -ENOMEM;
    q->max = max;
  }
  weft__fdq_free(c); /* holds none yet: nothing was read */
  if (c->more)
    c->more->fdq = q;
  return 0;
}

int weft_tcp_take_fd(weft_tcp *tcp) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_on_strand(c, "weft_tcp_take_fd");
  if (r)
    return r;
  struct weft__fdq *q = weft__tcp_fdq(c);
  if (!q || !q->count) {
    if (!q || !q->dropped)
      return -EAGAIN;
    q->dropped = false;
    return -EMFILE;
  }
  int fd = q->fds[q->head];
  q->head = (q->head + 1) % q->max;
  q->count--;
  return fd;
}
