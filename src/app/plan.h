/* `loom plan`: the layouts of a model on N ranks, ranked by predicted step
 * time, with memory by category and the reason each rejected one fails
 * (plan/search.h); `loom plan --calibrate` measures this machine. */
#ifndef LOOM_APP_PLAN_H
#define LOOM_APP_PLAN_H

/* argv: the arguments after `plan`. Returns a LOOM_* status. */
int loom_plan_main(int argc, char **argv);

#endif
