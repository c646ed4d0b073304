/* libFuzzer: model.safetensors.index.json. The input is written as the index of a checkpoint directory that holds
 * the tiny shape's config.json and its weights in two shards (made once, by tests/checkpoint/checkpoint_writer.c),
 * then the directory is opened. Whatever the index says: no crash or leak, no file outside the directory is read
 * (shard names are plain file names), and an index that opens maps every weight. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint_writer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *fuzz_dir, *fuzz_index_path;

static void remove_fuzz_dir(void) {
    if (fuzz_dir && !checkpoint_writer_remove_dir(fuzz_dir)) fprintf(stderr, "fuzz_shard_index: cannot remove %s\n", fuzz_dir);
    free(fuzz_dir);
    free(fuzz_index_path);
}

/* The directory: config.json and two shards; each input replaces the index the writer made. */
static void make_fuzz_dir(void) {
    checkpoint_writer_shape shape;
    checkpoint_writer_shape_tiny(&shape);
    shape.n_shards = 2;
    fuzz_dir = checkpoint_writer_make_temp_dir();
    if (!fuzz_dir || !checkpoint_writer_write(fuzz_dir, &shape)) {
        fprintf(stderr, "fuzz_shard_index: cannot write the checkpoint\n");
        abort();
    }
    fuzz_index_path = checkpoint_writer_path(fuzz_dir, "model.safetensors.index.json");
    if (!fuzz_index_path) abort();
    if (atexit(remove_fuzz_dir) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_dir) make_fuzz_dir();
    if (!checkpoint_writer_write_file(fuzz_index_path, data, size)) abort();
    checkpoint *c = NULL;
    if (checkpoint_open(fuzz_dir, &c) != KITE_OK) {
        if (c) __builtin_trap(); /* a failed open hands nothing out */
        return 0;
    }
    const qwen3_weights *w = checkpoint_weights(c);
    if (!w->embed_tokens.data || !w->final_norm.data || !w->lm_head.data || checkpoint_weight_bytes(c) == 0) __builtin_trap();
    checkpoint_close(c);
    return 0;
}
