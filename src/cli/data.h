/* `loom data`: tokenize (byte-level, or with a BPE tokenizer), train-tokenizer, synth (see data.c). */
#ifndef LOOM_CLI_DATA_H
#define LOOM_CLI_DATA_H

int loom_cli_data(int argc, char **argv);

#endif
