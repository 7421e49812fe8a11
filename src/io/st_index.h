/*
 * A sharded safetensors checkpoint as transformers writes one
 * (`model.safetensors.index.json`: a "weight_map" from each tensor's name to
 * the file in the index's directory that holds it). Readers open one shard
 * at a time (never all of them mapped at once), so loading needs the
 * model's memory plus one shard.
 *
 * Not here: reading a shard (io/safetensors.h), whose tensors go where
 * (model/model_io.h).
 */
#ifndef LOOM_IO_ST_INDEX_H
#define LOOM_IO_ST_INDEX_H

struct loom_st_index {
    char *path;   /* the index file, for messages */
    int nfiles;   /* the shards, in the order the index first names them */
    char **files; /* their paths (the index's directory joined) */
    int ntensors;
    char **names; /* every tensor's name */
    int *file_of; /* (ntensors) its shard */
};

/* Whether path names an index (it ends in ".index.json"). */
int loom_st_is_index(const char *path);
/* Reads path; LOOM_ERR_INPUT with one line naming the file when it is not
 * JSON, has no weight_map of strings, or names a shard that is not there. */
int loom_st_index_read(const char *path, struct loom_st_index *x);
void loom_st_index_free(struct loom_st_index *x);
/* The shard holding name (or prefix + name, where prefix is not NULL), or -1. */
int loom_st_index_find(const struct loom_st_index *x, const char *prefix, const char *name);

#endif
