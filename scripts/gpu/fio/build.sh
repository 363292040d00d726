#!/usr/bin/env bash
# Builds fio for the GPU machine, which has none and no network to fetch it: a static binary
# (glibc linked in; its io_uring engine needs no liburing, psync/pvsync2 need nothing), stripped.
# Usage: scripts/gpu/fio/build.sh DEST_DIR        → DEST_DIR/fio
# The source is FIO_SRC (an unpacked fio tree) if set, else tag FIO_TAG (default fio-3.42) of the
# git directory FIO_GIT (default: the mirror /work/.mirror/axboe+fio/repo made by the `fetch` tool
# from github:axboe/fio). The binary is cached in ${XDG_CACHE_HOME:-~/.cache}/tiermem-fio/TAG,
# so later builds only copy it. Nothing of it goes into the repository.
set -euo pipefail
dest=${1:?usage: $0 DEST_DIR}
tag=${FIO_TAG:-fio-3.42}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/tiermem-fio/$tag
if [ ! -x "$cache/fio" ]; then
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  if [ -n "${FIO_SRC:-}" ]; then
    cp -r "$FIO_SRC" "$work/fio"
  else
    git --git-dir="${FIO_GIT:-/work/.mirror/axboe+fio/repo}" archive --prefix=fio/ "$tag" | tar -x -C "$work"
  fi
  (
    cd "$work/fio"
    # Static, for any x86-64 CPU, without the optional engines and libraries the GPU machine lacks.
    ./configure --build-static --disable-native --disable-numa --disable-rdma --disable-rados \
      --disable-rbd --disable-http --disable-gfapi --disable-libnfs --disable-pmem --disable-xnvme \
      --disable-isal --disable-libblkio --disable-libzbc --disable-tcmalloc --disable-dfs >configure.log
    make -j"$(nproc)" fio >make.log 2>&1 || { tail -30 make.log; exit 1; }
    strip -o "$cache/fio.new" fio
  )
  mv "$cache/fio.new" "$cache/fio"
fi
mkdir -p "$dest"
cp "$cache/fio" "$dest/fio"
"$dest/fio" --version
