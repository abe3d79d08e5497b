/*
 * One to three random edits of buf[0..*n) (a byte replaced, inserted or
 * deleted, each from alphabet), for the agent's readers' mutation tests
 * (test_agent_json, test_oai_chunk): they compare a reader with jansson
 * on texts near the valid ones, where a reader's shortcuts go wrong.
 * cap: buf's size; *seed: rand_r's state.
 */
#ifndef TEST_AGENT_MUTATE_H
#define TEST_AGENT_MUTATE_H

#include <stdlib.h>
#include <string.h>

static inline void mutate(char *buf, size_t *n, size_t cap, unsigned *seed,
                          const char *alphabet, size_t alphabet_len)
{
    for (int k = 1 + rand_r(seed) % 3; k > 0 && *n > 0 && *n < cap - 1; k--) {
        size_t at = (unsigned)rand_r(seed) % *n;
        char ch = alphabet[(unsigned)rand_r(seed) % alphabet_len];
        switch (rand_r(seed) % 3) {
        case 0:
            buf[at] = ch;
            break;
        case 1:
            memmove(buf + at + 1, buf + at, *n - at);
            buf[at] = ch;
            (*n)++;
            break;
        default:
            memmove(buf + at, buf + at + 1, *n - at - 1);
            (*n)--;
        }
    }
}

#endif
