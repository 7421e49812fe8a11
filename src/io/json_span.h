/*
 * Where a JSON value ends, found by its quotes and brackets alone: for
 * readers that walk a document's outer levels in place and hand single
 * values to cJSON (the safetensors header, a .jsonl line's text), so no
 * tree of the whole is built. Nothing is validated here: cJSON does that
 * for each value it is given.
 */
#ifndef LOOM_IO_JSON_SPAN_H
#define LOOM_IO_JSON_SPAN_H

/* The first byte at or after p, before e, that is not JSON whitespace. */
const char *loom_json_space(const char *p, const char *e);
/* p at an opening quote: the byte after the closing one, or NULL when the
 * string runs past e. */
const char *loom_json_string_end(const char *p, const char *e);
/* The byte after the JSON value starting at p (a string, an object or an
 * array by its brackets, else a number or literal: its run of [0-9a-z+-.E]), or NULL when
 * there is none before e. */
const char *loom_json_value_end(const char *p, const char *e);

#endif
