// options.h: the finetune command line. One flag table (options.c) drives parsing, range and
// choice validation, --help with defaults, and the resolved-configuration echo: adding a
// flag is one line there (and its field in train_options).
#pragma once
#include <stdio.h>

#include "train.h"

// What options_parse asks of main instead of a run: --help / -h, --version, --help=markdown,
// --help=env.
enum { OPTIONS_RUN, OPTIONS_HELP, OPTIONS_VERSION, OPTIONS_HELP_MARKDOWN, OPTIONS_HELP_ENV };

// Parse argv into *o, defaults first. Accepts "--flag value", "--flag=value" and bare
// boolean flags; --help / -h, --help=markdown, --help=env and --version set *want_help
// (OPTIONS_*, else OPTIONS_RUN) and stop. 0, or -1 with ft_error naming the flag (unknown,
// missing value, not a number, out of range, not one of the choices, contradicting another
// flag, --help= of an unknown kind).
int options_parse(train_options *o, int argc, char **argv, int *want_help);

// Print to stdout what `what` asks for: OPTIONS_HELP: --help (every flag with its help,
// choices and default); OPTIONS_HELP_MARKDOWN: the same as Markdown (docs/flags.md);
// OPTIONS_HELP_ENV: the environment variables read (docs/environment.md, common.h).
void options_print_help(int what);

// Print " name=value" for every flag of `o` to `out` (the resolved configuration).
void options_print(FILE *out, const train_options *o);

// The largest value flag `name` (e.g. "--batch_size_per_device") accepts, or 0 if unknown.
double options_flag_max(const char *name);

// 1 when flag `name` (e.g. "--dp_shard") was on the command line options_parse read into `o`
// (whatever its value, the default's too), else 0 (also for a name not in the table).
int options_given(const train_options *o, const char *name);
