/* libFuzzer target: the HDF5 dataset reader (rl.dataset class "hdf": lua/rnnlua/datasets.lua
 * on core/h5io.c) on an arbitrary file: open it, read every sequence's index and its first
 * sequences. Seeds: fuzz/corpus/dataset (files rl.dataset_write made). */
#define FUZZ_AS_FILE 1
#define FUZZ_LUA                                                                                   \
    "function(path)\n"                                                                             \
    "  local ds = rl.dataset{class = 'hdf', files = {path}}\n"                                     \
    "  ds:init_epoch(1)\n"                                                                         \
    "  for i = 1, math.min(ds:num_seqs(), 16) do ds:get_seq(i) end\n"                              \
    "end"
#include "fuzz.h"
