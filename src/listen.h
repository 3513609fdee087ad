/*
 * listen.h, listen.c - listeners: a listening socket per shard (a socket
 * of kind SK_LISTEN, sock.h), accepting, running out of descriptors, and
 * handing each connection to the accept callback on its own strand.
 */
#ifndef WEFT_LISTEN_H
#define WEFT_LISTEN_H

#include "core.h"

/* An accepted connection not yet delivered counts as an item of its
 * listener (weft_listener_close's done waits for it): held by the
 * listening socket's strand before the connection is signalled. */
void weft__listener_hold(struct weft_listener *l);
/* On the connection's strand: calls the accept callback, then drops the
 * hold. */
void weft__listener_deliver(struct weft_listener *l, weft_tcp *conn);
/* The same, for a connection the user never sees (a shutdown). */
void weft__listener_delivered(struct weft_listener *l);
/* The family of l's socket (AF_UNIX under a simulated TCP port). */
int weft__listener_family(const struct weft_listener *l);
#ifdef WEFT_SIM
/* Whether l listens on a simulated TCP port (sim.h), and which. */
bool weft__listener_sim_port(const struct weft_listener *l, int *family,
                             uint16_t *port);
#endif

/* The runtime's side: the pool at create; every listener at destroy. */
void weft__listen_init(weft_rt *rt);
void weft__listen_destroy(weft_rt *rt);

#endif
