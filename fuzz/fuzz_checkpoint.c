/* libFuzzer target: the checkpoint loader (rl.load_checkpoint, lua/rnnlua/checkpoint.lua) on
 * an arbitrary file. Loading must never run code from the file nor hang (libFuzzer's -timeout
 * reports a hang). Seeds: fuzz/corpus/checkpoint (checkpoints rl.save_checkpoint made). */
#define FUZZ_AS_FILE 1
#define FUZZ_LUA "function(path) rl.load_checkpoint(path) end"
#include "fuzz.h"
