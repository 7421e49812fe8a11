/* `loom convert`: weights between a model family's file formats (see
 * convert.c). */
#ifndef LOOM_CLI_CONVERT_H
#define LOOM_CLI_CONVERT_H

/* argv holds the arguments after `convert`; returns a loom status. */
int loom_convert(int argc, char **argv);

#endif
