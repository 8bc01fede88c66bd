# shellcheck shell=bash disable=SC2154  # bin, FT_NAME: set by the sourcing script
# What slurm/finetune_1node.sbatch and slurm/finetune_multinode.sbatch share: sourced by them
# once they are in the repository (not a script of its own). They set, before sourcing:
#   FT_NAME  the script's name, for messages     bin  the finetune binary
# and use the arrays
#   args     finetune's flags as the user gave them (rewritten on a requeue)
#   extra    the defaults the script adds (--device, --dp_shard, --save_every, ...)
# Written for bash >= 4.2 under `set -u` (RHEL/CentOS 7): an empty array is expanded as
# ${a[@]+"${a[@]}"}, since "${a[@]}" of an empty array is an unbound variable before bash 4.4.

# ft_has FLAG: the user's flags give FLAG (as "FLAG VALUE", "FLAG=VALUE" or a lone boolean FLAG)
ft_has() {
    local a
    for a in ${args[@]+"${args[@]}"}; do
        case $a in "$1" | "$1="*) return 0 ;; esac
    done
    return 1
}

# ft_value FLAG: print the value of the user's last FLAG (finetune takes the last one); status 1
# when the flags do not give it
ft_value() {
    local i n=${#args[@]} v="" found=1
    for ((i = 0; i < n; i++)); do
        case ${args[i]} in
            "$1") [ $((i + 1)) -lt "$n" ] && v=${args[i + 1]} && found=0 ;;
            "$1="*) v=${args[i]#*=} found=0 ;;
        esac
    done
    [ $found = 0 ] && printf '%s\n' "$v"
    return $found
}

# A requeued job (node failure, preemption, scontrol requeue: SLURM_RESTART_COUNT > 0) runs
# this script again with the first submission's flags. Started over as given, it would lose
# the run: --overwrite_out_dir would delete the checkpoints the first run saved, and without
# --resume finetune refuses an --out_dir that holds checkpoints. So continue instead: drop
# --overwrite_out_dir and resume with `auto` (the latest checkpoint, or a fresh start when the
# first run saved none). `--resume DIR` (a fine-tune started from another run's checkpoint)
# becomes `latest` once --out_dir holds a checkpoint of this run, newer than DIR.
ft_requeue() {
    local n=${SLURM_RESTART_COUNT:-0} i resume="" out kept=() dropped=""
    [ "$n" -gt 0 ] 2>/dev/null || return 0
    for ((i = 0; i < ${#args[@]}; i++)); do
        case ${args[i]} in
            --overwrite_out_dir | --overwrite_out_dir=*) dropped=", without --overwrite_out_dir" ;;
            --resume)
                i=$((i + 1))
                resume=${args[i]:-} ;;
            --resume=*) resume=${args[i]#*=} ;;
            *) kept+=("${args[i]}") ;;
        esac
    done
    args=(${kept[@]+"${kept[@]}"})
    out=$(ft_value --out_dir) || out=out   # finetune's default --out_dir
    case $resume in
        "" | none | latest | auto) resume=auto ;;
        *) [ -e "$out/checkpoints/latest" ] && resume=latest ;;
    esac
    args+=(--resume "$resume")
    echo "$FT_NAME: requeued (SLURM_RESTART_COUNT=$n): continuing with --resume $resume$dropped"
}

# Periodic checkpoints unless the flags choose (--save_every; FT_SAVE_EVERY=N sets the default,
# 0 = only at the end). Only a SIGTERM that reaches the ranks and not srun saves (the --signal
# path); the time limit itself, plain scancel, scancel --full and preemption also SIGTERM srun,
# which SIGKILLs its tasks: what survives those is the last periodic checkpoint. With the default,
# keep the newest 2 (--save_total_limit, unless given): a 7B checkpoint is 81 GB.
ft_default_saves() {
    local every=${FT_SAVE_EVERY:-$1}
    ft_has --save_every && return 0
    [ "$every" != 0 ] || return 0
    extra+=(--save_every "$every")
    ft_has --save_total_limit || extra+=(--save_total_limit 2)
}

# NCCL over InfiniBand/RoCE and MPICH's UCX register (lock) memory; a login node's memlock limit
# (often 64 KB) reaches the job through sbatch/srun's default --propagate=ALL and makes them fail
# (ibv_reg_mr / ibv_create_cq "Cannot allocate memory"). Raise the soft limit to the hard one;
# srun hands the raised limit to the ranks. Sets ft_memlock_note for the script's header line.
ft_memlock() {
    local before now
    before=$(ulimit -S -l)
    ulimit -S -l unlimited 2>/dev/null || ulimit -S -l "$(ulimit -H -l)" 2>/dev/null
    now=$(ulimit -S -l)
    ft_memlock_note="memlock $now"
    [ "$now" = unlimited ] || ft_memlock_note="$ft_memlock_note KB"
    [ "$before" = "$now" ] || ft_memlock_note="$ft_memlock_note (raised from $before)"
    [ "$now" = unlimited ] || ft_memlock_note="$ft_memlock_note; not unlimited: NCCL over InfiniBand or UCX may fail to register memory"
}

# A build without MPI or PMI2 cannot join the tasks srun starts: each would train alone on its
# own (GPU 0, the whole model) and fail later with errors that blame something else. Refuse
# before srun, from the `launchers:` line of `finetune --version`, when there is more than one
# task. A PMI2-only build bootstraps GPU ranks only (CPU ranks move data over MPI).
# $1: the device the ranks use (cuda, cpu).
ft_check_launcher() {
    local tasks=${SLURM_NTASKS:-1} line device=$1 rebuild
    [ "$tasks" -gt 1 ] 2>/dev/null || return 0
    line=$("$bin" --version 2>/dev/null | sed -n 's/^launchers: //p')
    if [ -z "$line" ]; then
        echo "$FT_NAME: warning: '$bin --version' printed no launchers line; its MPI/PMI2 support is not checked" >&2
        return 0
    fi
    rebuild="install MPICH (libmpich-dev, found by pkg-config mpich) and run make clean && make"
    case $line in
        *", MPI ("*) return 0 ;;
        *"Slurm PMI2"*)
            [ "$device" = cpu ] || return 0
            echo "$FT_NAME: error: $bin has Slurm PMI2 but no MPI (launchers: $line): it runs GPU ranks only, not $tasks CPU ranks; $rebuild" >&2 ;;
        *)
            echo "$FT_NAME: error: $bin was built without MPI and PMI2 (launchers: $line), so its $tasks tasks could not join one job; $rebuild, or install Slurm's libpmi2 (libpmi2-0-dev: /usr/include/slurm/pmi2.h) for GPU ranks; or run 1 task" >&2 ;;
    esac
    return 1
}
