/*
 * tcp_until.h, tcp_until.c - reading until a delimiter
 * (weft_tcp_read_until), on top of weft_tcp_read.
 */
#ifndef WEFT_TCP_UNTIL_H
#define WEFT_TCP_UNTIL_H

#include <stdbool.h>

struct weft__conn;

/* An answer is posted and not yet delivered: the connection is reading. */
bool weft__until_pending(const struct weft__conn *c);
/* Closing: a posted answer is replaced by status, delivered now. */
void weft__until_cancel(struct weft__conn *c, int status);
/* Closed: its state goes. */
void weft__until_free(struct weft__conn *c);

#endif
