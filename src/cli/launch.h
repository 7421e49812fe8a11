/* `loom launch`: builds the mpirun command line and runs the job under it,
 * stopping it gracefully on a signal (see launch.c). */
#ifndef LOOM_CLI_LAUNCH_H
#define LOOM_CLI_LAUNCH_H

int loom_launch(int argc, char **argv);

#endif
