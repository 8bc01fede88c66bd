#!/usr/bin/env bash
# scripts/gpu_bundle.sh [--without-mpi] [--without-liger] [DIR]: gather, on a Debian 12 machine with apt, what the
# build needs that a GPU machine's CUDA toolkit lacks, for a machine with no package manager
# (tests/gpu/first_light.sh). Everything goes under DIR (default .deps, git-ignored):
#
#   DIR/debs/          the .deb files (apt-get download; kept as a cache)
#   DIR/root/          them extracted (dpkg -x) and pruned of static libraries and docs:
#                      build with `make DEPS_PREFIX=DIR/root` (headers, libraries and run
#                      paths from there; see the Makefile)
#   DIR/bundle.tar.xz  DIR/root as one compressed file: what travels to the GPU machine
#                      (first_light.sh unpacks it into DIR/root when that is absent)
#
# Packages: jansson and OpenBLAS (OpenMP build) with their runtime dependencies libgfortran5
# and libquadmath0 (libgomp comes with the GPU machine's compiler), and MPICH (mpiexec,
# headers, libmpich and its hwloc/UCX/verbs dependencies; Debian's mpiexec.hydra and
# hydra_pmi_proxy also need libslurm38 and libudev1) for the multi-rank checks there
# (first_light.sh's multi_rank: several ranks on the one GPU through the NCCL stand-in);
# --without-mpi leaves MPICH out (--with-mpi, the old way to ask for it, is the default now).
# Python: the liger-kernel wheel (pure Python, ~0.9 MB; DIR/root/wheels/, pip download from
# PyPI, no dependencies: torch and triton come with the GPU machine's image) for
# scripts/bench_gpu.py's liger baseline, which installs it there when the image lacks it;
# --without-liger leaves it out (the benchmark then says "not run" for liger). torch with CUDA
# and transformers do not travel (gigabytes; a device call carries 64 MiB): the GPU machine
# must have them, and bench_gpu.py says "not run: <reason>" for each PyTorch baseline if not.
# Sizes as built on 2026-11-23 (Debian 12): without MPICH root/ 41 MB, bundle.tar.xz ~6 MB;
# with it root/ ~90 MB, bundle.tar.xz ~15 MB (libslurm38 and libudev1 unmeasured). Run as
# any user with network access to the Debian mirrors (apt-get download needs no root). Exit 0
# and one summary line, or 1 with one line naming what failed; DIR is left as it was on failure.
set -euo pipefail
mpi=1
liger=1
liger_version=0.8.5   # scripts/bench_gpu.py's LIGER_VERSION
dir=.deps
for a in "$@"; do
  case $a in
    --with-mpi) mpi=1 ;;
    --without-mpi) mpi=0 ;;
    --without-liger) liger=0 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "gpu_bundle: unknown option '$a' (--without-mpi, --without-liger, DIR)" >&2; exit 2 ;;
    *) dir=$a ;;
  esac
done
fail() { echo "gpu_bundle: $*" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null || fail "needs apt-get and dpkg (a Debian 12 machine)"
[ "$(dpkg --print-architecture)" = amd64 ] || fail "needs an amd64 Debian (the GPU machines are x86-64)"

pkgs=(libjansson4 libjansson-dev libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0)
[ $mpi = 1 ] && pkgs+=(mpich libmpich12 libmpich-dev libhwloc15 libucx0 libibverbs1 librdmacm1 libnuma1
                       libnl-3-200 libnl-route-3-200 libslurm38 libudev1)

mkdir -p "$dir/debs"
dir=$(cd "$dir" && pwd)
new=$(mktemp -d "$dir/.new.XXXXXX")
trap 'rm -rf "$new"' EXIT
(cd "$dir/debs" && apt-get download "${pkgs[@]}" >"$new/apt.log" 2>&1) ||
  fail "apt-get download failed: $(grep -m1 -E '^E:' "$new/apt.log" || tail -1 "$new/apt.log")"

# the newest downloaded .deb of each package, extracted into one tree
: >"$new/MANIFEST"
for p in "${pkgs[@]}"; do
  deb=$(ls -t "$dir/debs/${p}_"*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || fail "no .deb for $p in $dir/debs"
  dpkg -x "$deb" "$new/root" || fail "dpkg -x $deb failed"
  echo "$(basename "$deb")" >>"$new/MANIFEST"
done

if [ $liger = 1 ]; then   # kept in DIR/debs beside the .debs as a cache, copied into the tree
  whl=liger_kernel-$liger_version-py3-none-any.whl
  [ -s "$dir/debs/$whl" ] || python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/debs" \
      "liger-kernel==$liger_version" >"$new/pip.log" 2>&1 ||
    fail "pip download liger-kernel==$liger_version failed: $(tail -1 "$new/pip.log") (--without-liger leaves it out)"
  mkdir -p "$new/root/wheels" && cp "$dir/debs/$whl" "$new/root/wheels/" && echo "$whl" >>"$new/MANIFEST"
fi

# prune: static libraries, docs, manuals, LAPACK (only CBLAS is used), and the links that
# point at them; mpiexec under its plain name (Debian makes it with update-alternatives)
r=$new/root
rm -rf "$r/usr/share/doc" "$r/usr/share/man" "$r/usr/share/lintian" "$r/usr/lib/x86_64-linux-gnu/rsocket"
find "$r" \( -name '*.a' -o -name 'liblapack.so*' -o -name 'libblas.so*' \) \( -type f -o -type l \) -delete
find "$r" -xtype l -delete                                   # links left dangling
if [ -e "$r/usr/bin/mpiexec.hydra" ]; then ln -sf mpiexec.hydra "$r/usr/bin/mpiexec"; fi
[ -e "$r/usr/include/jansson.h" ] && [ -e "$r/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h" ] &&
  [ -e "$r/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so" ] ||
  fail "the extracted packages lack jansson.h, cblas.h or libopenblas.so"
# no link may point outside the tree: it travels as a link
bad=$(find "$r" -type l -lname '/*' | head -1)
[ -z "$bad" ] || fail "absolute link in the bundle: $bad -> $(readlink "$bad")"
{ echo "# scripts/gpu_bundle.sh on $(date -u +%Y-%m-%d), $(. /etc/os-release; echo "$PRETTY_NAME")"
  cat "$new/MANIFEST"; } >"$r/MANIFEST"
tar -C "$new" -cJf "$new/bundle.tar.xz" root

rm -rf "$dir/root" "$dir/bundle.tar.xz"
mv "$new/root" "$dir/root"
mv "$new/bundle.tar.xz" "$dir/bundle.tar.xz"
echo "gpu_bundle: ${#pkgs[@]} packages into $dir/root ($(du -sh "$dir/root" | cut -f1)); to carry:" \
     "$dir/bundle.tar.xz ($(du -h "$dir/bundle.tar.xz" | cut -f1)); build with make DEPS_PREFIX=$dir/root"
