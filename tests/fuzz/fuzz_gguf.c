/*
 * libFuzzer target: the GGUF reader over arbitrary bytes. Whatever opens is
 * walked completely (metadata rendered, arrays read, tensor bytes touched,
 * supported tensors dequantized) so that a table the reader accepted but got
 * wrong shows up as an out-of-bounds access under ASan.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    gpe_gguf *g = NULL;
    if (gpe_gguf_open_buffer(data, size, &g, err, sizeof err) != GPE_OK) {
        if (err[0] == '\0')
            abort();   /* every error must say what is wrong */
        return 0;
    }
    for (int64_t i = 0; i < gpe_gguf_n_kv(g); i++) {
        char buf[256];
        gpe_gguf_kv_render(g, i, buf, sizeof buf, 16);
        gpe_gguf_vtype et;
        uint64_t n;
        if (gpe_gguf_arr_info(g, i, &et, &n)) {
            for (uint64_t j = 0; j < n && j < 64; j++) {
                size_t len;
                int64_t v;
                float f;
                const char *s = gpe_gguf_arr_str(g, i, j, &len);
                if (s && strlen(s) > len)
                    abort();
                (void)gpe_gguf_arr_i64(g, i, j, &v);
                (void)gpe_gguf_arr_f32(g, i, j, &f);
            }
        }
        if (gpe_gguf_find_key(g, gpe_gguf_key(g, i)) != i)
            abort();
    }
    float tmp[1024];
    for (int64_t i = 0; i < gpe_gguf_n_tensors(g); i++) {
        const gpe_gguf_tensor *t = gpe_gguf_tensor_at(g, i);
        if (gpe_gguf_find_tensor(g, t->name) != i)
            abort();
        const uint8_t *p = t->data;
        volatile uint8_t x = 0;
        for (uint64_t k = 0; k < t->nbytes; k++)
            x ^= p[k];
        (void)x;
        if (gpe_type_supported(t->type) && t->n_elements > 0) {
            const int64_t bs = gpe_type_block_size(t->type);
            int64_t n = t->n_elements < 1024 ? t->n_elements : 1024;
            n -= n % bs;
            if (n > 0)
                gpe_dequantize_row(t->type, t->data, tmp, n);
        }
    }
    gpe_gguf_close(g);
    return 0;
}
