/*
 * What a planner knows of a machine: a cluster description. Built in for
 * this machine (measured by `loom plan --calibrate`, or measured on the spot
 * when no description is given) and for common GPU nodes; read from and
 * written to a JSON file (--cluster FILE) with the same keys as the struct.
 */
#ifndef LOOM_PLAN_CLUSTER_H
#define LOOM_PLAN_CLUSTER_H

struct loom_cluster {
    char name[64];
    int ranks_per_node; /* GPUs (or MPI ranks) per node */
    int shared_node; /* 1: the node's ranks share its peak and memory (CPU ranks); 0: each rank has its own */
    double peak_f32, peak_bf16;     /* FLOP/s of a rank (shared_node: of the node) */
    double matmul_efficiency;       /* the fraction of peak the model's products sustain */
    double mem_bytes;               /* memory of a rank (shared_node: of the node) */
    double mem_bw;                  /* memory bandwidth of a rank (shared_node: the node's), bytes/s */
    double intra_bw, intra_latency; /* a rank's bus bandwidth within a node (bytes/s), latency (s) */
    double inter_bw, inter_latency; /* a rank's bandwidth across nodes */
    double disk_bw;                 /* NVMe offload, bytes/s per node */
};

/* A built-in description by name ("a100-80gb", "h100-80gb"), or NULL. */
const struct loom_cluster *loom_cluster_builtin(const char *name);
/* "a100-80gb, h100-80gb, local" */
const char *loom_cluster_builtin_names(void);
/* A description from a JSON file: every key of the struct; LOOM_ERR_INPUT
 * naming the file and the key that is missing or wrong. */
int loom_cluster_read(const char *path, struct loom_cluster *out);
int loom_cluster_write(const char *path, const struct loom_cluster *c);
/* This machine, measured: what the products sustain at a GPT-2 layer's
 * shapes on all threads, memory bandwidth, memory; with world > 1 (under
 * mpirun) the all-reduce bus bandwidth and latency between ranks (intra
 * stands for inter: one node). links_only keeps *out's other figures (a
 * file measured in one process, where no other rank shares the cores) and
 * measures the links alone. */
int loom_cluster_calibrate(struct loom_cluster *out, int links_only);
/* This process's products and memory bandwidth on its threads, measured
 * with no communication (callers sum the ranks' figures for the node), for
 * world ranks sharing the node; the links take shared memory's defaults.
 * The bf16 units must be selected already. */
int loom_cluster_measure_node(struct loom_cluster *out, int world);

#endif
