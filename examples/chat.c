/*
 * chat - a line-based chat server on weft, with rooms.
 *
 *   chat [--port P] [--threads N] [--host ADDR] [--unix PATH]
 *
 * A client's first line is "JOIN <room> [<nick>]" (without a nick it is
 * called user<N>). Every member of the room, the newcomer included, then
 * gets "* <id> joined"; every later line it sends goes to the room's other
 * members as "<id>: <line>"; when it leaves (EOF or error) the others get
 * "* <id> left". A client that does not read is not allowed to grow the
 * server's memory: above its high watermark (64 KiB queued) messages for
 * it are dropped and counted.
 *
 * Threads: a client's callbacks run on its connection's strand (accept
 * gives each connection its own); a room's members list lives on the
 * room's strand and nowhere else. Lines cross as weft_post: client -> room
 * (join, line, leave), room -> each member's strand (a delivery, since
 * weft_tcp_write must run on the connection's strand), room -> client
 * (the leave acknowledgement).
 *
 * Lifetimes: a message is immutable and refcounted (one ref per pending
 * delivery or write). A client is refcounted: its connection holds one
 * ref, dropped in the close callback, the room's membership one, each
 * delivery one. The room posts to a member's strand only while it is a
 * member, and a leaving client closes its connection (after which weft
 * may reclaim the strand) only when the room acknowledges the leave: the
 * room's posts to it are ordered, so every delivery ran before. At exit,
 * rooms stop posting before weft_rt_shutdown (weft then closes the
 * connections itself), and the rooms, with the members they still hold,
 * are freed after weft_rt_destroy.
 * Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit 0).
 */
#include <weft.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "netutil.h"

#define RBUF_SIZE 2048 /* longer lines are split */
#define NAME_MAX_LEN 31
#define WATER_LOW (16 * 1024)
#define WATER_HIGH (64 * 1024)

struct room;

struct client {
  atomic_uint refs;
  weft_tcp *c;       /* on its strand; NULL after the close callback */
  weft_strand *s;    /* the connection's strand */
  struct room *room; /* set at JOIN, before the join is posted */
  char id[NAME_MAX_LEN + 1];
  /* The client's strand only: */
  bool joined, leaving;
  uint64_t dropped;
  size_t rlen;
  char rbuf[RBUF_SIZE + 1]; /* + 1: a line's NUL */
};

struct room {
  weft_strand *s;
  char name[NAME_MAX_LEN + 1];
  /* mu guards stopping; held while posting to members' strands, so that
   * once main has set stopping no room touches a client's strand. */
  pthread_mutex_t mu;
  bool stopping;
  /* The room's strand only: */
  struct client **members;
  size_t n, cap;
  struct room *next; /* the table, under g_rooms_mu */
};

struct msg {
  atomic_uint refs;
  struct room *room;
  const struct client *from; /* not a ref: compared only */
  size_t len;
  char data[];
};

/* A message on its way to one member, then the write's arg. */
struct delivery {
  struct client *to;
  struct msg *m;
};

static weft_rt *g_rt;
static atomic_uint g_next_id;
static atomic_ulong g_dropped;
static pthread_mutex_t g_rooms_mu = PTHREAD_MUTEX_INITIALIZER;
static struct room *g_rooms;
static bool g_stopping; /* under g_rooms_mu */

/* ------------------------------------------------------------- objects */

static void client_unref(struct client *cl) {
  if (atomic_fetch_sub(&cl->refs, 1) == 1)
    free(cl);
}

/* A message of the concatenation of four strings. */
static struct msg *msg_new(struct room *r, const struct client *from,
                           const char *a, const char *b, const char *c,
                           const char *d) {
  const char *part[4] = {a, b, c, d};
  size_t len[4], total = 0;
  for (int i = 0; i < 4; i++)
    total += len[i] = strlen(part[i]);
  struct msg *m = malloc(sizeof(*m) + total);
  if (!m)
    return NULL;
  atomic_init(&m->refs, 1);
  m->room = r;
  m->from = from;
  m->len = 0;
  for (int i = 0; i < 4; i++) {
    memcpy(m->data + m->len, part[i], len[i]);
    m->len += len[i];
  }
  return m;
}

static void msg_unref(struct msg *m) {
  if (atomic_fetch_sub(&m->refs, 1) == 1)
    free(m);
}

static void delivery_free(struct delivery *d) {
  msg_unref(d->m);
  client_unref(d->to);
  free(d);
}

/* The room of that name, created on first use; NULL when out of memory or
 * stopping. */
static struct room *room_get(const char *name) {
  pthread_mutex_lock(&g_rooms_mu);
  struct room *r = g_rooms;
  while (r && strcmp(r->name, name))
    r = r->next;
  if (!r && !g_stopping && (r = calloc(1, sizeof(*r)))) {
    if (weft_strand_create(g_rt, &r->s) < 0) {
      free(r);
      r = NULL;
    } else {
      strcpy(r->name, name);
      pthread_mutex_init(&r->mu, NULL);
      r->next = g_rooms;
      g_rooms = r;
    }
  }
  pthread_mutex_unlock(&g_rooms_mu);
  return r;
}

/* ----------------------------------------------------- the client strand */

/* The close callback. Handlers the room posts to the strand after it
 * (deliveries, the leave acknowledgement, at a shutdown) see c NULL. */
static void on_closed(void *data, weft_tcp *c) {
  (void)c;
  struct client *cl = data;
  cl->c = NULL;
  client_unref(cl); /* the connection's ref */
}

static void room_leave(void *arg);
static void room_join(void *arg);
static void room_line(void *arg);

/* Leaves the room (the connection is closed when the room acknowledges),
 * or closes at once when not in one. */
static void client_leave(struct client *cl) {
  if (cl->leaving)
    return;
  cl->leaving = true;
  if (!cl->joined || weft_post(cl->room->s, room_leave, cl) < 0)
    weft_tcp_close(cl->c, 0);
}

static void on_written(void *arg, weft_tcp *c, int status) {
  (void)c;
  (void)status; /* a failed connection shows up on the read side */
  delivery_free(arg);
}

static void deliver_run(void *arg) {
  struct delivery *d = arg;
  struct client *cl = d->to;
  if (cl->c && !cl->leaving) {
    int r = weft_tcp_write(cl->c, d->m->data, d->m->len, on_written, d);
    if (r == 0)
      return;
    if (r == -ENOBUFS) {
      cl->dropped++;
      atomic_fetch_add(&g_dropped, 1);
    }
  }
  delivery_free(d);
}

static void leave_ack(void *arg) {
  struct client *cl = arg;
  if (cl->c)
    weft_tcp_close(cl->c, 0);
  client_unref(cl); /* the membership's ref, passed on by the room */
}

/* ------------------------------------------------------- the room strand */

/* Posts m to every member but except. Called with r->mu held. */
static void room_send(struct room *r, struct msg *m,
                      const struct client *except) {
  if (r->stopping)
    return;
  for (size_t i = 0; i < r->n; i++) {
    struct client *to = r->members[i];
    if (to == except)
      continue;
    struct delivery *d = malloc(sizeof(*d));
    if (!d)
      continue;
    atomic_fetch_add(&to->refs, 1);
    atomic_fetch_add(&m->refs, 1);
    d->to = to;
    d->m = m;
    if (weft_post(to->s, deliver_run, d) < 0)
      delivery_free(d);
  }
}

static void room_announce(struct room *r, struct client *cl, const char *what,
                          const struct client *except) {
  struct msg *m = msg_new(r, cl, "* ", cl->id, what, "");
  if (!m)
    return;
  pthread_mutex_lock(&r->mu);
  room_send(r, m, except);
  pthread_mutex_unlock(&r->mu);
  msg_unref(m);
}

static void room_join(void *arg) {
  struct client *cl = arg; /* its ref becomes the membership's */
  struct room *r = cl->room;
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 8;
    struct client **m = realloc(r->members, cap * sizeof(*m));
    if (!m) {
      client_unref(cl); /* it stays out; its leave will find nothing */
      return;
    }
    r->members = m;
    r->cap = cap;
  }
  r->members[r->n++] = cl;
  room_announce(r, cl, " joined\n", NULL);
}

static void room_line(void *arg) {
  struct msg *m = arg;
  pthread_mutex_lock(&m->room->mu);
  room_send(m->room, m, m->from);
  pthread_mutex_unlock(&m->room->mu);
  msg_unref(m);
}

static void room_leave(void *arg) {
  struct client *cl = arg;
  struct room *r = cl->room;
  size_t i = 0;
  while (i < r->n && r->members[i] != cl)
    i++;
  /* The acknowledgement takes over the membership's ref. Without one (the
   * join failed) it takes a new one: the connection's keeps cl alive. */
  if (i < r->n)
    r->members[i] = r->members[--r->n];
  else
    atomic_fetch_add(&cl->refs, 1);
  room_announce(r, cl, " left\n", cl);
  pthread_mutex_lock(&r->mu);
  bool posted = !r->stopping && weft_post(cl->s, leave_ack, cl) == 0;
  pthread_mutex_unlock(&r->mu);
  if (!posted)
    client_unref(cl);
}

/* ----------------------------------------------------- client input */

/* Parses "JOIN <room> [<nick>]" (line is NUL-terminated and may be
 * modified); false if it is not one. */
static bool parse_join(char *line, char **room, char **nick) {
  char *save, *w = strtok_r(line, " \t", &save);
  if (!w || strcmp(w, "JOIN"))
    return false;
  *room = strtok_r(NULL, " \t", &save);
  *nick = strtok_r(NULL, " \t", &save);
  if (!*room || strlen(*room) > NAME_MAX_LEN || strtok_r(NULL, " \t", &save))
    return false;
  return !*nick || strlen(*nick) <= NAME_MAX_LEN;
}

static void client_join(struct client *cl, char *line) {
  static const char usage_line[] = "* say JOIN <room> [<nick>] first\n";
  char *name, *nick;
  if (!parse_join(line, &name, &nick)) {
    weft_tcp_write(cl->c, usage_line, sizeof(usage_line) - 1, NULL, NULL);
    return;
  }
  if (nick)
    strcpy(cl->id, nick);
  cl->room = room_get(name);
  if (!cl->room) {
    client_leave(cl);
    return;
  }
  cl->joined = true;
  atomic_fetch_add(&cl->refs, 1); /* the membership's */
  if (weft_post(cl->room->s, room_join, cl) < 0) {
    cl->joined = false;
    client_unref(cl);
    client_leave(cl);
  }
}

/* One line from the client (without its end of line, NUL-terminated). */
static void client_line(struct client *cl, char *line) {
  if (!*line)
    return;
  if (!cl->joined) {
    client_join(cl, line);
    return;
  }
  struct msg *m = msg_new(cl->room, cl, cl->id, ": ", line, "\n");
  if (!m)
    return;
  if (weft_post(cl->room->s, room_line, m) < 0)
    msg_unref(m);
}

static void on_line(void *arg, weft_tcp *c, long n, size_t have);

/* Reads the next line; rbuf already holds rlen bytes of it. */
static void client_read(struct client *cl) {
  if (weft_tcp_read_until(cl->c, cl->rbuf, RBUF_SIZE, cl->rlen, "\n", 1,
                          on_line, cl) < 0)
    client_leave(cl);
}

/* One line in rbuf[0, n), or a full buffer without an end of line, which
 * counts as a line; what follows it is kept for the next one. */
static void on_line(void *arg, weft_tcp *c, long n, size_t have) {
  (void)c;
  struct client *cl = arg;
  if (n == -EMSGSIZE)
    n = (long)have;
  if (n <= 0) {
    client_leave(cl);
    return;
  }
  size_t end = (size_t)n;
  if (cl->rbuf[end - 1] == '\n')
    end--;
  if (end && cl->rbuf[end - 1] == '\r')
    end--;
  cl->rbuf[end] = '\0'; /* within the line, or the + 1 of rbuf */
  client_line(cl, cl->rbuf);
  memmove(cl->rbuf, cl->rbuf + n, have - (size_t)n);
  cl->rlen = have - (size_t)n;
  if (!cl->leaving)
    client_read(cl);
}

static void on_drain(void *arg, weft_tcp *c) {
  (void)arg;
  (void)c;
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct client *cl = calloc(1, sizeof(*cl));
  if (!cl) {
    weft_tcp_close(c, 1);
    return;
  }
  atomic_init(&cl->refs, 1); /* the connection's */
  cl->c = c;
  cl->s = weft_tcp_strand(c);
  snprintf(cl->id, sizeof(cl->id), "user%u",
           atomic_fetch_add(&g_next_id, 1) + 1);
  weft_tcp_set_data(c, cl, on_closed);
  weft_tcp_nodelay(c, 1);
  if (weft_tcp_set_watermarks(c, WATER_LOW, WATER_HIGH, on_drain, NULL) < 0)
    weft_tcp_close(c, 0);
  else
    client_read(cl);
}

/* ------------------------------------------------------------------ main */

/* After this no room posts to a client's strand (see struct room). */
/* The first step of stopping (ex_serve runs it on a signal): rooms stop
 * posting to their members before the shutdown closes them. */
static void rooms_stop(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_rooms_mu);
  g_stopping = true;
  for (struct room *r = g_rooms; r; r = r->next) {
    pthread_mutex_lock(&r->mu);
    r->stopping = true;
    pthread_mutex_unlock(&r->mu);
  }
  pthread_mutex_unlock(&g_rooms_mu);
}

/* Frees what weft_rt_shutdown left: the rooms, and the refs of the
 * members they still hold (the other refs went with the connections'
 * close callbacks and the handlers the shutdown ran). No thread is left. */
static void free_all(void) {
  while (g_rooms) {
    struct room *r = g_rooms;
    g_rooms = r->next;
    for (size_t i = 0; i < r->n; i++)
      client_unref(r->members[i]);
    pthread_mutex_destroy(&r->mu);
    free(r->members);
    free(r);
  }
}

static void usage(void) {
  fprintf(stderr, "usage: chat [--port P] [--threads N] [--host ADDR] "
                  "[--unix PATH]\n");
  exit(1);
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || ex_common_opt(&o, argv[i], argv[i + 1]) != 1)
      usage();
  }
  g_rt = ex_rt_create("chat", &o);
  weft_listener *l = ex_listen("chat", g_rt, &o, on_accept, NULL);
  int rc = ex_serve("chat", g_rt, l, rooms_stop, NULL);
  free_all();
  unsigned long dropped = atomic_load(&g_dropped);
  if (dropped)
    fprintf(stderr, "chat: %lu messages dropped for slow clients\n", dropped);
  return rc;
}
