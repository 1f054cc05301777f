/* The command's traces: a Mooncake file (kvtier/trace.h, the library's) or
 * the built-in synthetic workload (workload.c). */
#ifndef KVTIER_TOOLS_TRACE_H
#define KVTIER_TOOLS_TRACE_H

#include <stdint.h>

#include "kvtier/trace.h"

typedef struct workload_params {
    uint64_t requests;
    uint64_t seed;
    uint32_t system_prompts;  /* shared system prompts, Zipf popularity */
    double zipf_s;
} workload_params_t;

void workload_default(workload_params_t *p);
/* The built-in workload: shared system prompts chosen by Zipf popularity,
 * multi-turn sessions whose turns extend their own history, seeded. */
int workload_generate(const workload_params_t *p, kvt_trace_t *t);

#endif
