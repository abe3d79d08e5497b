#include "agent/curl_loop.h"

short curl_loop_kinds(int what)
{
    return (short)(((what & CURL_POLL_IN) ? EV_READ : 0) | ((what & CURL_POLL_OUT) ? EV_WRITE : 0));
}

struct event *curl_loop_event(struct event_base *evb, CURLM *multi, curl_socket_t s, int what,
                              struct event *ev, event_callback_fn cb, void *arg)
{
    short kind = (short)(curl_loop_kinds(what) | EV_PERSIST);
    if (ev) {
        /* Level-triggered and persistent: what libcurl left readable shows
         * again on the next pass. event_assign needs the event idle. */
        event_del(ev);
        event_assign(ev, evb, s, kind, cb, arg);
    } else {
        ev = event_new(evb, s, kind, cb, arg);
        if (!ev)
            return NULL;
        curl_multi_assign(multi, s, ev);
    }
    return ev;
}

struct event *curl_loop_watch(struct event_base *evb, CURLM *multi, curl_socket_t s, int what,
                              struct event *ev, int pri, event_callback_fn cb, void *arg)
{
    ev = curl_loop_event(evb, multi, s, what, ev, cb, arg);
    if (!ev)
        return NULL;
    event_priority_set(ev, pri);
    event_add(ev, NULL);
    return ev;
}

int curl_loop_timer(struct event *timer, long timeout_ms)
{
    if (timeout_ms < 0) {
        evtimer_del(timer);
        return 0;
    }
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    evtimer_add(timer, &tv);
    return 0;
}
