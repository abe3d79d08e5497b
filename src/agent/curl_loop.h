/*
 * curl_loop: a libcurl multi handle driven from a libevent loop
 * (curl_multi_socket_action), the glue its socket and timer callbacks
 * share. The agent's requests to the server and the openai backend's
 * upstream transfers both run this way on the agent's one loop (issue 24).
 * Loop thread only, like every libevent object here.
 */
#ifndef AGENT_CURL_LOOP_H
#define AGENT_CURL_LOOP_H

#include <curl/curl.h>
#include <event2/event.h>

/* For a CURLMOPT_SOCKETFUNCTION: watch socket s as libcurl's `what`
 * (CURL_POLL_IN / OUT / INOUT) asks, at priority pri, calling cb(s, ...,
 * arg). ev is the event libcurl holds for s (its socketp), or NULL for a
 * socket it has not assigned one yet: a new event is made and assigned
 * (curl_multi_assign). Returns the event watching s, or NULL (out of
 * memory: the callback should return -1). CURL_POLL_REMOVE is the
 * caller's (event_free of socketp). */
struct event *curl_loop_watch(struct event_base *evb, CURLM *multi, curl_socket_t s, int what,
                              struct event *ev, int pri, event_callback_fn cb, void *arg);

/* curl_loop_watch without the watching: the event libcurl holds for s
 * (made and assigned when ev is NULL, taken off the base otherwise) with
 * what's kinds, for a socket watched elsewhere (relay_set). NULL when out
 * of memory. */
struct event *curl_loop_event(struct event_base *evb, CURLM *multi, curl_socket_t s, int what,
                              struct event *ev, event_callback_fn cb, void *arg);
/* libcurl's CURL_POLL_* as libevent's EV_READ / EV_WRITE. */
short curl_loop_kinds(int what);

/* For a CURLMOPT_TIMERFUNCTION: (re)arm timer for timeout_ms, or disarm
 * it for -1. Always 0 (what the callback returns). */
int curl_loop_timer(struct event *timer, long timeout_ms);

#endif
