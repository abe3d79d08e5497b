/* timer: see timer.h. */
#include "server/timer.h"

struct event *gps_timer_every(struct event_base *base, int ms, event_callback_fn fn, void *arg)
{
    struct event *ev = event_new(base, -1, EV_PERSIST, fn, arg);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (ev && event_add(ev, &tv) != 0) {
        event_free(ev);
        ev = NULL;
    }
    return ev;
}
