// profile.h: --profile, milliseconds per op per optimizer step.
//
// A wrapping backend table with the same signatures times every op of the backend it wraps
// (synchronising before and after, so GPU ops are charged their real time), and a wrapping
// unit provider charges the time spent in gathers and reduce-scatters to "comm". Each op's
// time goes to the phase current when it ran:
//   forward   ops of the forward pass (from the first parameter acquire of a micro-batch)
//   backward  from the first gradient buffer request (the fused lm_head + loss, then the
//             layers, recomputed forwards under --gradient_checkpointing included)
//   optimizer gradient norm, AdamW, casts
//   comm      time inside the provider and in profile_comm_begin/end regions, minus the
//             backend ops that ran inside them (those keep their own phase)
// The report of a step prints each phase's total and its ops (ms, calls) and "other" = the
// step's wall time not covered (data loading, host work). Timing adds a synchronise per op:
// on a GPU the profiled run is slower than an unprofiled one; on the CPU it costs ~nothing.
// Single-threaded host use only (one rank = one process).
#pragma once
#include <stdio.h>

#include "backend.h"
#include "model.h"

typedef enum { PROF_FORWARD, PROF_BACKWARD, PROF_OPTIMIZER, PROF_COMM, PROF_PHASE_COUNT } prof_phase;

// A backend table that forwards every call to `inner` and times the ops. The table is
// static (one profiled backend per process); name and dtype are inner's.
const backend *profile_backend(const backend *inner);

// A provider forwarding to `inner` (copied; it must outlive the result's use) whose calls
// count as comm and move the phase: acquire for the forward -> forward, acquire for the
// backward or grad_begin -> backward.
unit_provider profile_provider(const unit_provider *inner);

// Set the phase that following ops are charged to.
void profile_set_phase(prof_phase phase);

// Time between begin and end, less the backend ops inside, counts as comm (not nested).
void profile_comm_begin(void);
void profile_comm_end(void);

// Mark the start of an optimizer step (resets the counters and the step clock).
void profile_step_begin(void);

// Print the step's table to `out` (call after the step), labelled with `step` (1-based).
void profile_step_report(FILE *out, int step);
