#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# readme_examples.sh SOURCE_DIR BUILD_DIR [CC] — run the examples and commands
# of README.md and docs/*.md exactly as printed, so a document that does not
# build or run fails.
#
# Marked blocks (the marker alone on the line before the block):
#   <!-- test: NAME -->      a ```c block, then the next fenced block must be a
#                            ```sh block whose commands build and run it
#                            (NAME.c holds the C block); the C code must also
#                            compile cleanly with -std=c11 -Wall -Wextra -Werror;
#   <!-- test: sh NAME -->   a ```sh block, run as it is;
#   <!-- test: output CMD --> a plain ``` block showing what CMD prints: CMD is
#                            run and must print the same lines, except numbers
#                            with one decimal (timings), which may differ.
# The blocks of one document run in order, under `bash -e`, in one fresh
# directory holding `include`, `build` and `data` (links to SOURCE_DIR/include,
# BUILD_DIR and SOURCE_DIR/data), so a command line written for the top of a
# source tree after a build works unchanged and a later block may use what an
# earlier one built.  GPUMEM_* variables of the caller are cleared: the lines
# set what they need.  README.md must have examples.  The `make TARGET`s the
# README names must be targets of the Makefile, `make lib` must build the
# shared library its C examples link, and every relative link must resolve.
set -u
src=$1 build=$(cd "$2" && pwd) cc=${3:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_readme.XXXXXX")
cleanup() {
  # Background processes a block left (a broker): end them by their pid.
  for p in $(cat "$tmp"/*/.pids 2>/dev/null); do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/bin"
# `cc` as the documents write it: the build's compiler where there is no cc.
command -v cc >/dev/null 2>&1 || ln -s "$(command -v "$cc")" "$tmp/bin/cc"
export PATH=$tmp/bin:$PATH
for v in $(env | sed -n 's/^\(GPUMEM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

fail=0 n=0
# extract DOC OUTDIR: NNN-c-NAME.c + NNN-c-NAME.sh, NNN-sh-NAME.sh, NNN-out.cmd +
# NNN-out.txt, in document order; a malformed marker is an error.
extract() {
  awk -v out="$2" -v doc="$(basename "$1")" '
    function fail(msg) { print doc ":" NR ": " msg > "/dev/stderr"; bad = 1; exit 1 }
    function f(suffix) { return sprintf("%s/%03d-%s", out, seq, suffix) }
    state == "c"      { if ($0 == "```") { state = "wantsh"; next } print > f("c-" name ".c"); next }
    state == "csh"    { if ($0 == "```") { state = ""; next } print > f("c-" name ".sh"); next }
    state == "sh"     { if ($0 == "```") { state = ""; next } print > f("sh-" name ".sh"); next }
    state == "out"    { if ($0 == "```") { state = ""; next } print > f("out.txt"); next }
    state == "cmark"  { if ($0 != "```c") fail("<!-- test: " name " --> is not followed by a ```c block"); state = "c"; next }
    state == "shmark" { if ($0 != "```sh") fail("<!-- test: sh " name " --> is not followed by a ```sh block"); state = "sh"; next }
    state == "outmark" { if ($0 != "```") fail("<!-- test: output --> is not followed by a plain ``` block"); state = "out"; next }
    state == "wantsh" && /^```/ { if ($0 != "```sh") fail("example " name ": the block after its C code is not ```sh"); state = "csh"; next }
    state == "wantsh" && match($0, /after `make( [a-z]+)?`/) {
      t = substr($0, RSTART + 7, RLENGTH - 8); sub(/^make ?/, "", t); print (t == "" ? "all" : t) > f("c-" name ".after"); next
    }
    /^<!-- test: output .+ -->$/ {
      if (state == "wantsh") fail("example " name " has no ```sh block")
      seq++; cmd = $0; sub(/^<!-- test: output /, "", cmd); sub(/ -->$/, "", cmd)
      print cmd > f("out.cmd"); state = "outmark"; next
    }
    /^<!-- test: sh [A-Za-z0-9_-]+ -->$/ {
      if (state == "wantsh") fail("example " name " has no ```sh block")
      seq++; name = $4; if (seen[name]++) fail("two examples named " name); state = "shmark"; next
    }
    /^<!-- test: [A-Za-z0-9_-]+ -->$/ {
      if (state == "wantsh") fail("example " name " has no ```sh block")
      seq++; name = $3; if (seen[name]++) fail("two examples named " name); state = "cmark"; next
    }
    /^<!-- test:/ { fail("a test marker this script does not know: " $0) }
    END { if (!bad && state != "") { print doc ": block " name " is not complete" > "/dev/stderr"; exit 1 } }
  ' "$1"
}

# recipe TARGET: the Makefile's recipe lines of TARGET (read, not run).
recipe() { awk -v t="$1" '$0 ~ "^" t ":" { on = 1; next } on && /^\t/ { print; next } on { exit }' "$src/Makefile"; }

# view TARGET DIR: DIR holds only what `make TARGET` builds (its --target
# names; none named: everything), so an example is linked against what the
# document says to build before it, not against this whole build.
view() {
  local targets; targets=$(recipe "$1" | grep -o -- '--target [a-z_ ]*' | sed 's/--target//')
  if [[ -z $targets ]] && recipe "$1" | grep -q -- '--build'; then ln -s "$build" "$2"; return; fi
  mkdir -p "$2"
  for t in $targets; do
    case $t in
    gpumem_shared) ln -s "$build"/libgpumem.so* "$2"/ ;;
    gpumem_static) ln -s "$build/libgpumem.a" "$2"/ ;;
    gpumem_cli) ln -s "$build/gpumem" "$2"/ ;;
    esac
  done
}

# Numbers with one decimal (ns/op columns) vary from run to run.
mask() { sed -E 's/(^|[[:space:]])[0-9]+\.[0-9]($|[[:space:]])/\1#\2/g; s/(^|[[:space:]])[0-9]+\.[0-9]($|[[:space:]])/\1#\2/g; s/[[:space:]]+/ /g; s/ $//'; }

run_doc() { # DOC
  local doc=$1 rel=${1#"$src"/} dir ex f base name
  rel=${rel//\//_}; ex=$tmp/extract-$rel dir=$tmp/$rel
  mkdir -p "$ex" "$dir"
  if ! extract "$doc" "$ex"; then echo "FAIL: $rel: its examples cannot be extracted"; fail=1; return; fi
  ln -s "$src/include" "$dir/include"; ln -s "$build" "$dir/build"; ln -s "$src/data" "$dir/data"
  for f in "$ex"/*; do
    [[ -e $f ]] || continue
    base=$(basename "$f")
    case $base in
    *-c-*.c)
      name=${base#*-c-}; name=${name%.c}; n=$((n + 1))
      cp "$f" "$dir/$name.c"
      echo "---- $rel: $name: $(tr '\n' ';' <"${f%.c}.sh")"
      if ! "$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$src/include" "$dir/$name.c"; then
        echo "FAIL: $rel example $name has warnings"; fail=1
      fi
      if [[ -f ${f%.c}.after ]]; then
        local after; after=$(cat "${f%.c}.after")
        if ! grep -qE "^$after:" "$src/Makefile"; then
          echo "FAIL: $rel example $name is to be built after \`make $after\`, not a Makefile target"; fail=1
        fi
        rm "$dir/build"; view "$after" "$dir/build"
        run_block "$rel" "$name" "${f%.c}.sh" "$dir"
        rm -rf "$dir/build"; ln -s "$build" "$dir/build"
      else
        run_block "$rel" "$name" "${f%.c}.sh" "$dir"
      fi ;;
    *-c-*.after) ;;
    *-c-*.sh) ;;
    *-sh-*.sh)
      name=${base#*-sh-}; name=${name%.sh}; n=$((n + 1))
      echo "---- $rel: $name (commands)"
      run_block "$rel" "$name" "$f" "$dir" ;;
    *-out.cmd)
      n=$((n + 1))
      local cmd; cmd=$(cat "$f")
      echo "---- $rel: output of $cmd"
      if [[ $cmd == *.gz* ]] && ! grep -q '^GM_HAVE_ZLIB:INTERNAL=1$' "$build/CMakeCache.txt" 2>/dev/null; then
        echo "skipped: this build has no zlib to read $cmd's trace"
      elif (cd "$dir" && bash -c "$cmd") >"$dir/.out" 2>&1 && diff <(mask <"${f%.cmd}.txt") <(mask <"$dir/.out"); then
        echo "ok: $rel prints what $cmd prints"
      else
        sed 's/^/  /' "$dir/.out"; echo "FAIL: $rel: $cmd does not print what the document shows"; fail=1
      fi ;;
    *-out.txt) ;;
    esac
  done
}

run_block() { # DOC NAME SCRIPT DIR: run under bash -e; record background pids
  local log=$tmp/$1-$2.log
  if (cd "$4" && bash -e -c "trap 'jobs -p >>.pids' EXIT
$(cat "$3")") >"$log" 2>&1; then
    sed 's/^/  /' "$log"; echo "ok: $2"
  else
    sed 's/^/  /' "$log"; echo "FAIL: $1 example $2"; fail=1
  fi
}

before=$n
run_doc "$src/README.md"
[[ $n -gt $before ]] || { echo "FAIL: no <!-- test: NAME --> example in README.md"; fail=1; }
for d in "$src"/docs/*.md; do run_doc "$d"; done

# The make targets README.md names exist; `make lib` builds the shared library.
for t in $(grep -oE '(^|`)make [a-z]+' "$src/README.md" | awk '{print $2}' | sort -u); do
  n=$((n + 1))
  if grep -qE "^$t:" "$src/Makefile"; then echo "ok: make $t is a target"
  else echo "FAIL: README.md names \`make $t\`, which the Makefile does not have"; fail=1; fi
done
if recipe lib | grep -q 'gpumem_shared'; then echo "ok: make lib builds gpumem_shared"
else echo "FAIL: make lib does not build gpumem_shared (libgpumem.so), which the C examples link"; fail=1; fi
# Every relative link of README.md and docs/*.md names a file of the tree (the
# results files the figures cite, above all).
for f in "$src/README.md" "$src"/docs/*.md; do
  d=$(dirname "$f")
  while read -r l; do
    [[ -z $l ]] && continue
    n=$((n + 1))
    [[ -e $d/$l ]] || { echo "FAIL: ${f#"$src"/} links to $l, which does not exist"; fail=1; }
  done < <(grep -oE '\]\([^)#[:space:]]+(#[^)]*)?\)' "$f" | sed -E 's/^\]\(//; s/\)$//; s/#.*//' |
           grep -vE '^(https?|mailto):' | sort -u)
done
[[ $fail == 0 ]] && echo "PASS: $n examples, commands, outputs and links of README.md and docs/"
exit $fail
