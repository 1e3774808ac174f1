#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# readme_examples.sh SOURCE_DIR BUILD_DIR [CC] — compile and run the C
# examples of README.md exactly as printed.
#
# An example is a ```c block right after a line `<!-- test: NAME -->`; the
# next fenced block after it must be a ```sh block: its commands build and
# run the example.  Each example runs in a fresh temporary directory holding
# NAME.c (the C block), `include` (a link to SOURCE_DIR/include) and `build`
# (a link to BUILD_DIR), so a command line written for the top of a source
# tree after `make` works unchanged; the sh block runs under `bash -e` and must
# exit 0.  Each example must also compile cleanly with -std=c11 -Wall -Wextra
# -Werror.  GPUMEM_* variables of the caller are cleared: the README's lines
# set what they need.  No example at all is a failure.
set -u
src=$1 build=$(cd "$2" && pwd) cc=${3:-cc}
readme=$src/README.md
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_readme.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/extract" "$tmp/bin"
# `cc` as the README writes it: the build's compiler where there is no cc.
command -v cc >/dev/null 2>&1 || ln -s "$(command -v "$cc")" "$tmp/bin/cc"
export PATH=$tmp/bin:$PATH
for v in $(env | sed -n 's/^\(GPUMEM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done

# Extract NAME.c and NAME.sh for every marked example; error out on a marker
# not followed by a ```c block, or a C block not followed by a ```sh block.
awk -v out="$tmp/extract" '
  function fail(msg) { print "README.md:" NR ": " msg > "/dev/stderr"; bad = 1; exit 1 }
  state == "code" { if ($0 == "```") { state = "wantsh"; next } print > (out "/" name ".c"); next }
  state == "sh"   { if ($0 == "```") { state = ""; print name >> (out "/names"); next } print > (out "/" name ".sh"); next }
  state == "marker" { if ($0 != "```c") fail("<!-- test: " name " --> is not followed by a ```c block"); state = "code"; next }
  state == "wantsh" && /^```/ { if ($0 != "```sh") fail("example " name ": the block after its C code is not ```sh"); state = "sh"; next }
  /^<!-- test: [A-Za-z0-9_-]+ -->$/ {
    if (state == "wantsh") fail("example " name " has no ```sh block")
    name = $3; if (seen[name]++) fail("two examples named " name); state = "marker"; next
  }
  END { if (!bad && state != "") { print "README.md: example " name " is not complete" > "/dev/stderr"; exit 1 } }
' "$readme" || { echo "FAIL: README.md's examples cannot be extracted"; exit 1; }
[[ -s $tmp/extract/names ]] || { echo "FAIL: no <!-- test: NAME --> example in README.md"; exit 1; }

fail=0 n=0
while read -r name; do
  n=$((n + 1))
  dir=$tmp/$name
  mkdir -p "$dir"
  cp "$tmp/extract/$name.c" "$dir/$name.c"
  ln -s "$src/include" "$dir/include"
  ln -s "$build" "$dir/build"
  echo "---- $name: $(tr '\n' ';' <"$tmp/extract/$name.sh")"
  # Also clean C11 with warnings on, so the example teaches no bad habit.
  if ! "$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only -I"$src/include" "$dir/$name.c"; then
    echo "FAIL: README example $name has warnings"; fail=1
  fi
  if (cd "$dir" && bash -e "$tmp/extract/$name.sh") >"$tmp/$name.log" 2>&1; then
    sed 's/^/  /' "$tmp/$name.log"; echo "ok: $name"
  else
    sed 's/^/  /' "$tmp/$name.log"; echo "FAIL: README example $name"; fail=1
  fi
done <"$tmp/extract/names"
[[ $fail == 0 ]] && echo "PASS: $n README examples"
exit $fail
