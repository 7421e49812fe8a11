/* `loom convert`: GPT-2 weights between llm.c checkpoints, safetensors files
 * and Hugging Face directories (see convert.c). */
#ifndef LOOM_CLI_CONVERT_H
#define LOOM_CLI_CONVERT_H

/* argv holds the arguments after `convert`; returns a loom status. */
int loom_convert(int argc, char **argv);

#endif
