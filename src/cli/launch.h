/* `loom launch`: builds and execs the mpirun command line (see launch.c). */
#ifndef LOOM_CLI_LAUNCH_H
#define LOOM_CLI_LAUNCH_H

int loom_launch(int argc, char **argv);

#endif
