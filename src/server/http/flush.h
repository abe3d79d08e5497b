/*
 * flush: the server's replies go out once a loop turn, in one write a
 * connection, as redis writes its clients' replies before it sleeps.
 *
 * evhttp queues a reply in the connection's output and turns its write
 * event on; the write comes a loop turn later, after an epoll_wait, with
 * two epoll_ctl around it (issue 24: 14 epoll_ctl a zero-delay request).
 * Writing each piece at once instead would split a reply into its head, its
 * chunks and its end. gps_flush_conn marks a connection; after every other
 * callback of the turn, one callback writes each marked connection's
 * output (head, chunks and end of a short reply together), turns its write
 * event off and runs evhttp's write-done callback, as the write event would
 * have. What the socket does not take, and an error, are left to the write
 * event, as before.
 *
 * One flusher a gps_http (gps_http_new makes it); loop thread only. TLS
 * connections are left to their bufferevent.
 */
#ifndef GPS_FLUSH_H
#define GPS_FLUSH_H

#include <stdbool.h>

struct bufferevent;
struct event_base;
struct evhttp_connection;

typedef struct gps_flush gps_flush;

/* Whether the connection marked with bev on socket fd is still open: the
 * owner of the connections knows (http.c: its table of connections by
 * socket); the flusher keeps no reference to a connection past its end. A
 * new connection on the same socket and at the same address may pass: it
 * is then written early, which is harmless. */
typedef bool (*gps_flush_alive_fn)(void *arg, int fd, struct bufferevent *bev);

/* A flusher for base's connections (NULL: out of memory). Connections of
 * a base with none are written by evhttp's write event as before. */
gps_flush *gps_flush_new(struct event_base *base, gps_flush_alive_fn alive, void *arg);
/* Writes what is still marked (a last reply at shutdown; no callback
 * runs) and frees f. */
void gps_flush_free(gps_flush *f);

/* Write evcon's queued output at the end of this loop turn. Call it after
 * the evhttp call that queued it, with the connection taken before that
 * call (a send on a request whose peer is gone frees the request). The
 * connection may end before the turn does (alive). */
void gps_flush_conn(struct evhttp_connection *evcon);

#endif
