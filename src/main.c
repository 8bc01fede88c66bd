// main.c: the finetune command line: parse the flags (options.c), plan (--dry_run) or bring
// up the process grid (launch.c) and run the job (train.c). The only place that prints
// errors and decides the exit code.
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "launch.h"
#include "options.h"
#include "plan.h"
#include "plan_auto.h"
#include "preflight.h"
#include "train.h"
#include "build_config.h"   // FT_BUILD_CONFIG, written by the Makefile (scripts/build_config.sh)
#include "version.h"        // FT_VERSION, written by the Makefile
#include "watchdog.h"

// --dry_run: plan the job from config.json alone and print the report (rank 0). 0 / -1.
// With --auto the report is of the plan it chose, after what it chose and why.
static int dry_run(const train_options *given) {
    train_options opts = *given, *o = &opts;
    llama_config cfg;
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/config.json", o->model_dir));
    TRY(llama_config_load(&cfg, path));
    const int W = o->world_size > 0 ? o->world_size : launch_env_world_size();
    const size_t elem_bytes = strcmp(o->device, "cuda") == 0 ? 2 : 4;
    plan_auto_result choice;
    if (o->auto_plan) TRY(plan_auto_apply(o, W, elem_bytes, NULL, &choice));
    const plan_request req = train_plan_request(o, W, elem_bytes);
    plan p;
    TRY(plan_compute(&p, &cfg, &req));
    if (launch_env_rank() != 0) return 0;
    if (o->auto_plan) {
        plan_auto_print(stdout, &choice);
        printf("\n");
    }
    plan_print_report(stdout, &p, &cfg, o->model_dir, o->device, (int)options_flag_max("--batch_size_per_device"));
    return 0;
}

// The watchdog's way out (src/watchdog.h) needs the launch; report() names the rank from it.
static const launch *g_launch;

// The error of this rank, once (flag errors: rank 0 of the launcher's environment). In a job of
// several ranks the line names this rank and its host (which node lacks a file, fails its
// GPU, ...), unless the message names a rank itself (the watchdog's "rank 0: step 7: ...").
static int report(int exit_code, int print) {
    if (!print) return exit_code;
    const char *msg = ft_error_message();
    if (g_launch && g_launch->W > 1 && strncmp(msg, "rank ", 5) != 0) {
        char host[128];
        ft_hostname(host, sizeof host);
        fprintf(stderr, "finetune: error: rank %d (host %s): %s\n", g_launch->rank, host, msg);
    } else {
        fprintf(stderr, "finetune: error: %s\n", msg);
    }
    return exit_code;
}
static void watchdog_report(void) {
    fflush(stdout);
    report(1, 1);
    fflush(stderr);
}
static void watchdog_end(void) { launch_abort(g_launch); }

int main(int argc, char **argv) {
    // stdout line by line also into a file (a Slurm job's log, `| tee`): each step's line
    // shows when it is printed, not a buffer later (one write per line: a line per step)
    setvbuf(stdout, NULL, _IOLBF, 0);
    train_options o;
    int want_help;
    if (options_parse(&o, argc, argv, &want_help) != 0) return report(2, launch_env_rank() == 0);
    if (want_help == 2) {
        printf("finetune %s\nbackends: %s\nlaunchers: %s\nbuilt with:\n%s", FT_VERSION, backend_build_description(),
               launch_build_description(), FT_BUILD_CONFIG);
        return 0;
    }
    if (want_help) {
        options_print_help(want_help);
        return 0;
    }
    if (o.dry_run) return dry_run(&o) == 0 ? 0 : report(1, launch_env_rank() == 0);

    // control plane: MPI (or PMI2, or one process); data plane: the same MPI groups for CPU
    // ranks, NCCL groups for GPU ranks
    launch L;
    g_launch = &L;
    watchdog_set_fatal(watchdog_report, watchdog_end);
    int failure_agreed = 0, rc = launch_open(&L, &o, &argc, &argv);
    if (rc == 0) {
        launch_print(&L);
        if (L.rank == 0 && L.auto_done) {
            plan_auto_print(stdout, &L.auto_choice);
            plan_auto_print_estimate_flags(stdout, &o);
        }
        if (L.rank == 0) {
            printf("finetune: config:");
            options_print(stdout, &o);
            printf("\n");
            fflush(stdout);
        }
        // before step 1 of a multi-rank GPU job, or alone (--preflight): exit 3 when a rank stands out
        int stood_out = 0;
        if (preflight_wanted(&o, L.W, L.be != L.cpu)) rc = preflight_run(&o, &L.cc, L.be, FT_VERSION, &stood_out, &failure_agreed);
        if (rc == 0 && o.preflight) {
            launch_close(&L, 0, 0);
            return stood_out ? 3 : 0;
        }
        if (rc == 0) rc = train_run(&o, &L.cc, &failure_agreed);
    }
    // a failing rank prints its own error (agreed failures: only the lowest failing rank);
    // past setup, a failure on one rank that the others do not know takes the job down
    if (rc == -1) report(1, 1);
    launch_close(&L, rc, failure_agreed);
    return rc == 0 ? 0 : 1;
}
