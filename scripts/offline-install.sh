#!/usr/bin/env bash
# Install what scripts/wheelhouse.sh downloaded, on a machine with no network.
#
# usage: bash scripts/offline-install.sh [--into WHEELHOUSE] DIR...
#
# Copies the files of every DIR (a wheelhouse, or some of its bundles) into WHEELHOUSE (default
# ~/.cache/attnmatrix/wheelhouse, which outlives the DIRs), joins split files, and checks every file
# against SHA256SUMS. When all of them are there it installs the wheels into the running Python's
# environment (pip --no-index --no-deps: torch and everything else already installed stay as they are).
# A wheel whose version is already installed is left alone: reinstalling a package replaces its files
# under any process that is using it, such as a running sweep.
#
# Bundles may arrive one at a time: each run adds what it is given, and until every file is there it
# lists what is missing and exits 3 without installing anything. Exit 0: installed; 1: a file does not
# match its checksum; 2: bad usage.
set -euo pipefail
house=${ATTNMATRIX_WHEELHOUSE:-$HOME/.cache/attnmatrix/wheelhouse}
dirs=()
while (($#)); do
  case "$1" in
    --into) house=${2:?--into needs a folder}; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) [[ -d $1 ]] || { echo "not a folder: $1" >&2; exit 2; }; dirs+=("$1") ;;
  esac
  shift
done
((${#dirs[@]})) || { echo "usage: offline-install.sh [--into WHEELHOUSE] DIR..." >&2; exit 2; }
py=${PYTHON:-python3}
mkdir -p "$house"
for d in "${dirs[@]}"; do
  [[ $(cd "$d" && pwd -P) == $(cd "$house" && pwd -P) ]] || cp -p "$d"/* "$house"/
done
cd "$house"
[[ -f SHA256SUMS ]] || { echo "no SHA256SUMS in $house: give the folders scripts/wheelhouse.sh wrote" >&2; exit 2; }

missing=()
while read -r sum name; do
  if [[ ! -f $name ]] && compgen -G "$name.part-*" > /dev/null; then
    cat "$name".part-* > "$name.joining"
    if [[ $(sha256sum < "$name.joining" | cut -d' ' -f1) == "$sum" ]]; then
      mv "$name.joining" "$name" && rm -f "$name".part-*
    else
      rm -f "$name.joining"   # parts still missing (or damaged: the check below says which)
    fi
  fi
  [[ -f $name ]] || missing+=("$name")
done < SHA256SUMS
if ((${#missing[@]})); then
  echo "$(( $(wc -l < SHA256SUMS) - ${#missing[@]} )) of $(wc -l < SHA256SUMS) files in $house; waiting for the other bundles, with: ${missing[*]}"
  exit 3
fi
sha256sum --quiet -c SHA256SUMS || { echo "a file does not match SHA256SUMS: copy it again" >&2; exit 1; }

todo=()
for f in *.whl; do
  [[ -e $f ]] || continue
  dist=$(cut -d- -f1 <<< "$f"); version=$(cut -d- -f2 <<< "$f")
  have=$("$py" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$dist")
  if [[ $have == "$version" ]]; then echo "already installed: $dist $version"; else todo+=("$f"); fi
done
((${#todo[@]} == 0)) || "$py" -m pip install -q --no-index --no-deps --no-compile "${todo[@]}"
for f in *.tar.gz; do
  [[ -e $f ]] && echo "source distribution $f: build it here (site/gpu-probing.md, 'FlashAttention 2')"
done
echo "installed from $house: ${#todo[@]} wheel(s)"
