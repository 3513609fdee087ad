/*
 * floor_http_hello - bench/net's floor: the HTTP server of the benchmark
 * with no runtime at all, written for the least work per request that
 * this kernel allows, so that bench/net can say how much of each
 * server's CPU the kernel alone needs.
 *
 *   floor_http_hello --port P --threads N
 *
 * Answers like examples/http_hello (the same bytes; "Connection: close"
 * gets that header, then the connection is closed). Each thread is alone
 * with its connections: its own SO_REUSEPORT listener and its own ring
 * (IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN where the kernel has them,
 * 6.1; else COOP_TASKRUN), a multishot accept, a multishot receive per
 * connection into a provided-buffer ring, and replies sent as ring
 * entries from static bytes. Each turn of its loop is one io_uring_enter
 * that submits every reply of the turn and waits for the next
 * completion: no send(2), no thread ever wakes another, no timer, no
 * monitor, no lock, nothing shared. That is what a runtime cannot have
 * (weft serves strands, timers and stuck handlers): the floor measures
 * the kernel's part, the same way bench/timer_lateness's floor does.
 *
 * With FLOOR_TASKRUN=coop in its environment the rings take
 * COOP_TASKRUN (with TASKRUN_FLAG), as weft's do, instead of
 * DEFER_TASKRUN: a weft ring goes from thread to thread with its shard,
 * and DEFER_TASKRUN needs a single issuer. That floor tells what the
 * task-work mode costs by itself.
 *
 * A request is a head (bodies are not supported), answered when its
 * empty line has come; a head longer than 8 KiB gets 400 and a close.
 * SIGINT or SIGTERM stops it (exit 0). Prints "listening on PORT".
 */
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "floor_http.h"

#define ENTRIES 256
#define NBUF 1024 /* provided buffers per thread (a power of two) */
#define BUF_SIZE 2048
#define BGID 1

/* user_data: the connection's address, tagged in its low bits. */
enum { OP_ACCEPT = 0, OP_RECV = 1, OP_SEND = 2, OP_QUIET = 3, OP_MASK = 3 };

struct conn {
  int fd;
  struct floor_heads h;
  struct worker *w;
  bool recv_on;   /* the multishot receive is armed */
  unsigned sends; /* sends in the ring */
};

struct worker {
  struct io_uring ring;
  struct io_uring_buf_ring *br;
  char *bufs;
  int lfd;
};

static struct io_uring_sqe *sqe_of(struct io_uring *ring) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
  if (!sqe) { /* full: submit what is there (no wait) */
    io_uring_submit(ring);
    sqe = io_uring_get_sqe(ring);
  }
  if (!sqe)
    die("io_uring_get_sqe", EBUSY);
  return sqe;
}

static void arm_recv(struct worker *w, struct conn *c) {
  struct io_uring_sqe *sqe = sqe_of(&w->ring);
  io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
  sqe->flags |= IOSQE_BUFFER_SELECT;
  sqe->buf_group = BGID;
  io_uring_sqe_set_data64(sqe, (uintptr_t)c | OP_RECV);
  c->recv_on = true;
}

static void send_static(struct worker *w, struct conn *c, const char *p,
                        size_t n) {
  struct io_uring_sqe *sqe = sqe_of(&w->ring);
  io_uring_prep_send(sqe, c->fd, p, n, MSG_NOSIGNAL | MSG_WAITALL);
  io_uring_sqe_set_data64(sqe, (uintptr_t)c | OP_SEND);
  c->sends++;
}

/* Ends the connection once its replies are sent and nothing of it is in
 * the ring: a cancel makes the multishot receive complete for the last
 * time, then the descriptor is closed. */
static void finish(struct worker *w, struct conn *c) {
  if (c->sends)
    return; /* its completion calls again */
  if (c->recv_on) {
    struct io_uring_sqe *sqe = sqe_of(&w->ring);
    io_uring_prep_cancel64(sqe, (uintptr_t)c | OP_RECV, 0);
    io_uring_sqe_set_data64(sqe, OP_QUIET);
    return;
  }
  struct io_uring_sqe *sqe = sqe_of(&w->ring);
  io_uring_prep_close(sqe, c->fd);
  io_uring_sqe_set_data64(sqe, OP_QUIET);
  free(c->h.part);
  free(c);
}

/* floor_on_data's reply: a send from static bytes. */
static void reply(void *ctx, const char *p, size_t n) {
  struct conn *c = ctx;
  send_static(c->w, c, p, n);
}

static void on_recv(struct worker *w, struct conn *c, int res, unsigned flags) {
  if (!(flags & IORING_CQE_F_MORE))
    c->recv_on = false;
  if (flags & IORING_CQE_F_BUFFER) {
    unsigned bid = flags >> IORING_CQE_BUFFER_SHIFT;
    char *buf = w->bufs + (size_t)bid * BUF_SIZE;
    if (res > 0)
      floor_on_data(&c->h, reply, c, buf, (size_t)res);
    io_uring_buf_ring_add(w->br, buf, BUF_SIZE, (unsigned short)bid,
                          io_uring_buf_ring_mask(NBUF), 0);
    io_uring_buf_ring_advance(w->br, 1);
  }
  if (res <= 0 && res != -ENOBUFS)
    c->h.closing = true; /* end of stream, or an error */
  if (c->h.closing)
    finish(w, c);
  else if (!c->recv_on)
    arm_recv(w, c); /* out of buffers for a moment: again */
}

static void on_cqe(struct worker *w, uint64_t ud, int res, unsigned flags) {
  struct conn *c = (struct conn *)(uintptr_t)(ud & ~(uint64_t)OP_MASK);
  switch (ud & OP_MASK) {
  case OP_ACCEPT:
    if (res >= 0) {
      struct conn *n = calloc(1, sizeof(*n));
      if (!n) {
        close(res);
      } else {
        n->fd = res;
        n->w = w;
        arm_recv(w, n);
      }
    }
    if (!(flags & IORING_CQE_F_MORE) && !floor_stopping) {
      struct io_uring_sqe *sqe = sqe_of(&w->ring);
      io_uring_prep_multishot_accept(sqe, w->lfd, NULL, NULL, 0);
      io_uring_sqe_set_data64(sqe, OP_ACCEPT);
    }
    break;
  case OP_RECV:
    on_recv(w, c, res, flags);
    break;
  case OP_SEND:
    c->sends--;
    if (res < 0)
      c->h.closing = true;
    if (c->h.closing)
      finish(w, c);
    break;
  default: /* a shutdown's or a close's result: nothing waits for it */
    break;
  }
}

static int ring_init(struct io_uring *ring) {
  const char *taskrun = getenv("FLOOR_TASKRUN");
  bool coop = taskrun && !strcmp(taskrun, "coop");
  if (taskrun && !coop) {
    fprintf(stderr, "%s: FLOOR_TASKRUN is '%s': only 'coop' is known\n",
            floor_name, taskrun);
    exit(2);
  }
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
  if (!coop && !io_uring_queue_init_params(ENTRIES, ring, &p))
    return 0;
  memset(&p, 0, sizeof(p));
  p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
  if (!io_uring_queue_init_params(ENTRIES, ring, &p))
    return 0;
  memset(&p, 0, sizeof(p));
  p.flags = IORING_SETUP_COOP_TASKRUN;
  if (!io_uring_queue_init_params(ENTRIES, ring, &p))
    return 0;
  return io_uring_queue_init(ENTRIES, ring, 0);
}

static void worker_setup(struct worker *w) {
  int r = ring_init(&w->ring);
  if (r)
    die("io_uring_queue_init", -r);
  size_t ringsz = NBUF * sizeof(struct io_uring_buf);
  if (posix_memalign((void **)&w->br, 4096, ringsz) ||
      !(w->bufs = malloc((size_t)NBUF * BUF_SIZE)))
    die("malloc", ENOMEM);
  struct io_uring_buf_reg reg = {
      .ring_addr = (uintptr_t)w->br, .ring_entries = NBUF, .bgid = BGID};
  if ((r = io_uring_register_buf_ring(&w->ring, &reg, 0)))
    die("io_uring_register_buf_ring", -r);
  io_uring_buf_ring_init(w->br);
  for (unsigned i = 0; i < NBUF; i++)
    io_uring_buf_ring_add(w->br, w->bufs + (size_t)i * BUF_SIZE, BUF_SIZE,
                          (unsigned short)i, io_uring_buf_ring_mask(NBUF),
                          (int)i);
  io_uring_buf_ring_advance(w->br, NBUF);
}

static void *worker_main(void *arg) {
  struct floor_thread *t = arg;
  struct worker *w = calloc(1, sizeof(*w));
  if (!w)
    die("calloc", ENOMEM);
  w->lfd = t->lfd;
  /* The ring is made here: SINGLE_ISSUER binds it to its first user. */
  worker_setup(w);
  struct io_uring_sqe *sqe = sqe_of(&w->ring);
  io_uring_prep_multishot_accept(sqe, w->lfd, NULL, NULL, 0);
  io_uring_sqe_set_data64(sqe, OP_ACCEPT);
  struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 100000000};
  while (!floor_stopping) {
    struct io_uring_cqe *cqe;
    int r = io_uring_submit_and_wait_timeout(&w->ring, &cqe, 1, &ts, NULL);
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EBUSY)
      die("io_uring_submit_and_wait_timeout", -r);
    unsigned head, n = 0;
    io_uring_for_each_cqe(&w->ring, head, cqe) {
      on_cqe(w, io_uring_cqe_get_data64(cqe), cqe->res, cqe->flags);
      n++;
    }
    io_uring_cq_advance(&w->ring, n);
  }
  return NULL; /* the process exits: the kernel closes everything */
}

int main(int argc, char **argv) {
  return floor_main(argc, argv, "floor_http_hello", 0, worker_main);
}
