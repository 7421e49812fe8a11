/*
 * TensorBoard event files, written without TensorFlow (Megatron's
 * --tensorboard-dir): one file DIR/events.out.tfevents.<seconds>.<host>.<pid>
 * per run, of TFRecord records (length, masked CRC-32C of the length, the
 * record, its masked CRC-32C), each record an Event protocol buffer: first
 * the file version ("brain.Event:2"), then one scalar per event (wall time,
 * step, Summary.Value{tag, simple_value}). TensorBoard's reader and
 * tf.summary's files agree on this layout; the protocol buffer fields are
 * encoded by hand (a handful of fixed fields). Not here: images,
 * histograms, text, or reading the files back.
 */
#ifndef LOOM_IO_TENSORBOARD_H
#define LOOM_IO_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct loom_tb {
    FILE *f; /* NULL: closed, or never opened */
    char path[1024];
    int err; /* errno of the first failed write, flush or close (0: none) */
};

/* Creates DIR (mkdir -p) and a new event file in it; LOOM_ERR_INPUT naming
 * --tensorboard-dir when either cannot be made. */
int loom_tb_open(struct loom_tb *tb, const char *dir);
/* One scalar at a step; a no-op on a closed writer. Buffered: flushed by
 * loom_tb_flush and loom_tb_close. */
void loom_tb_scalar(struct loom_tb *tb, int64_t step, const char *tag, double value);
void loom_tb_flush(struct loom_tb *tb);
void loom_tb_close(struct loom_tb *tb);
/* LOOM_ERR_RUNTIME naming --tensorboard-dir's file and the cause when a
 * write, flush or close of it failed (a full disk), else LOOM_OK. */
int loom_tb_status(const struct loom_tb *tb);

/* CRC-32C (Castagnoli) of n bytes, as TFRecord checks them (unmasked). */
uint32_t loom_crc32c(const void *data, size_t n);

#endif
