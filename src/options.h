// options.h: the finetune command line. One flag table (options.c) drives parsing, range and
// choice validation, --help with defaults, and the resolved-configuration echo: adding a
// flag is one line there (and its field in train_options).
#pragma once
#include <stdio.h>

#include "train.h"

// Parse argv into *o, defaults first. Accepts "--flag value", "--flag=value" and bare
// boolean flags; --help / -h sets *want_help to 1, --version to 2, and stops. 0, or -1 with ft_error naming the
// flag (unknown, missing value, not a number, out of range, not one of the choices,
// contradicting another flag).
int options_parse(train_options *o, int argc, char **argv, int *want_help);

// Print --help to stdout: every flag with its help, choices and default.
void options_print_help(void);

// Print " name=value" for every flag of `o` to `out` (the resolved configuration).
void options_print(FILE *out, const train_options *o);

// The largest value flag `name` (e.g. "--batch_size_per_device") accepts, or 0 if unknown.
double options_flag_max(const char *name);
