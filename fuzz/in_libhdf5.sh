#!/usr/bin/env bash
# Exit 0 when the first stack frame of a libFuzzer log's sanitizer report that is neither libc
# nor a sanitizer interceptor lies in libhdf5: a defect of Debian's HDF5 library on a corrupt
# file (its global-heap reader copies a length read from the file; see docs/robustness.md, Fuzzing), which
# rnnlua cannot fix. Usage: in_libhdf5.sh LOG
awk '/^ +#[0-9]+ /{ if ($0 ~ /__interceptor_|__asan|__sanitizer|libc\.so|sysdeps|libFuzzer|fuzzer::/) next; print; exit }' "$1" |
    grep -q libhdf5
