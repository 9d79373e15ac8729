/* HDF5 files of tensors: the layer under rl.save/rl.load, checkpoints and RETURNN-layout
 * datasets.
 *
 * A file is either opened (an existing file, read-only or read-write) or created. A created
 * file is written to `<path>.tmp.<host>.<pid>` and only rl_h5_commit renames it over `path`, so a
 * crash or a failed write never leaves a broken file behind and an older file at `path` stays
 * as it was until the commit succeeds.
 *
 * Names are paths inside the file ("params/lstm1/W"; a leading "/" is optional); writing
 * creates the intermediate groups and replaces an existing dataset or attribute of that name.
 * Attribute functions take `obj`, the path of a group or dataset ("/" or "" for the root);
 * writing an attribute on a missing object creates it as a group.
 *
 * Stored types: float32 <-> H5T_NATIVE_FLOAT, float64 <-> H5T_NATIVE_DOUBLE, int32 <->
 * H5T_NATIVE_INT. Reading converts what other writers (h5py, RETURNN) store: integers of any
 * size and sign become int32 (an error names the dataset when a value does not fit), floats of
 * 8 bytes or more become float64, smaller floats float32. A 0-dim tensor is a scalar dataspace.
 * Tensors given to write may be any view but must live on the CPU (RL_EDEVICE otherwise).
 *
 * Every HDF5 failure comes back as RL_EIO with a message "<file>: <object>: <what>" (plus
 * HDF5's innermost reason where it has one); HDF5's own printing to stderr is switched off.
 * No function leaves an HDF5 handle open on any path.
 */
#ifndef RL_H5IO_H
#define RL_H5IO_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rl_h5file rl_h5file;

/* Opens an existing file. Errors: no such file, not an HDF5 file, truncated or corrupt. */
rl_status rl_h5_open(rl_h5file **out, const char *path, bool writable);
/* Creates `<path>.tmp.<host>.<pid>` (truncating a stale one); nothing at `path` changes yet.
 * Removes the temporary files of `path` that saves of processes no longer running on this host
 * left behind (`<path>.tmp.<pid>`, the name before the host was in it, counts as this host's).
 * The host name keeps saves into one shared folder from several machines (MPI ranks, cluster
 * jobs) apart: equal process ids there would share a file, and one host cannot tell whether
 * another's process still runs. */
rl_status rl_h5_create(rl_h5file **out, const char *path);
/* The temporary file name rl_h5_create uses for `path` in this process, into buf (n bytes;
 * truncated names are cut, as snprintf does). */
void rl_h5_temp_name(const char *path, char *buf, size_t n);
/* Closes `f` and frees it, whatever happens. For a created file: flushes it to disk and renames
 * it over `path`; on failure the temporary file is removed and `path` is left untouched. */
rl_status rl_h5_commit(rl_h5file *f);
/* Closes and frees `f` (NULL is fine). A created file that was not committed is removed. */
void rl_h5_close(rl_h5file *f);
/* The path given to open/create. */
const char *rl_h5_path(const rl_h5file *f);
/* HDF5 objects still open in `f` besides the file itself: 0 unless a handle leaked (tests). */
int64_t rl_h5_open_handles(const rl_h5file *f);

/* Datasets */
rl_status rl_h5_write_tensor(rl_h5file *f, const char *name, const rl_tensor *t);
/* out (unset) <- a new contiguous CPU tensor with the stored shape and dtype (see above). */
rl_status rl_h5_read_tensor(rl_h5file *f, const char *name, rl_tensor *out);
/* out (unset) <- rows [start, start + count) along dim 0, without reading the rest. */
rl_status rl_h5_read_rows(rl_h5file *f, const char *name, int64_t start, int64_t count,
                          rl_tensor *out);
/* Dtype read_tensor would give, and the shape, without reading the data. */
rl_status rl_h5_dataset_info(rl_h5file *f, const char *name, rl_dtype *dtype, int *ndim,
                             int64_t shape[RL_MAX_DIMS]);
/* *out = whether `name` exists (dataset or group); false when an intermediate group is missing. */
rl_status rl_h5_exists(rl_h5file *f, const char *name, bool *out);
/* Every dataset under `group` ("/", "" or NULL for the root), recursively, as paths relative
 * to `group` without a leading "/" ("a/b/c"), depth first in name order. *names is a malloc'd
 * array of malloc'd strings: free it with rl_h5_list_free. */
rl_status rl_h5_list(rl_h5file *f, const char *group, char ***names, int64_t *count);
void rl_h5_list_free(char **names, int64_t count);

/* Strings (datasets and attributes) are written as fixed-length UTF-8, NUL-padded to the
 * longest; h5py reads them as bytes, RETURNN as tags. Reading takes fixed- and variable-length
 * strings; variable-length ones (h5py's str, RETURNN's writers, rnnlua before checkpoint
 * version 2) live in the file's global heap, which libhdf5 reads without bounds checks, so they
 * are read in a child process: a crash or hang of libhdf5 on a corrupt heap becomes RL_EIO
 * naming the object. */
/* From now on a variable-length string in `f` is RL_EIO ("corrupt or crafted"): for files whose
 * writer never stores them (checkpoints of version 2 and later). */
void rl_h5_refuse_vlen(rl_h5file *f);

/* One-dimensional datasets of strings (RETURNN's /seqTags). *strs is malloc'd like
 * rl_h5_list's names: free with rl_h5_list_free. */
rl_status rl_h5_write_strings(rl_h5file *f, const char *name, const char *const *strs,
                              int64_t count);
rl_status rl_h5_read_strings(rl_h5file *f, const char *name, char ***strs, int64_t *count);

/* Attributes */
rl_status rl_h5_attr_write_string(rl_h5file *f, const char *obj, const char *name,
                                  const char *value);
/* *value is malloc'd (free it). */
rl_status rl_h5_attr_read_string(rl_h5file *f, const char *obj, const char *name, char **value);
/* A numeric attribute holding a tensor (0-dim: a scalar attribute), stored as for datasets. */
rl_status rl_h5_attr_write_tensor(rl_h5file *f, const char *obj, const char *name,
                                  const rl_tensor *t);
rl_status rl_h5_attr_read_tensor(rl_h5file *f, const char *obj, const char *name, rl_tensor *out);
/* Scalar attributes; int64 is stored as H5T_NATIVE_LLONG (h5py's type for a Python int). The
 * readers take any numeric attribute holding exactly one value. */
rl_status rl_h5_attr_write_int64(rl_h5file *f, const char *obj, const char *name, int64_t v);
rl_status rl_h5_attr_write_double(rl_h5file *f, const char *obj, const char *name, double v);
rl_status rl_h5_attr_read_int64(rl_h5file *f, const char *obj, const char *name, int64_t *v);
rl_status rl_h5_attr_read_double(rl_h5file *f, const char *obj, const char *name, double *v);

#ifdef __cplusplus
}
#endif

#endif
