# SPDX-License-Identifier: Apache-2.0
# bench/commit_id.sh — sourced by the bench scripts (from the repository root):
# gm_commit_id prints the commit a result is measured at, for its files.
#   $GM_COMMIT when set; else HEAD's short hash, followed by "+changes" when a
#   tracked file (results aside) differs from HEAD's: the measured code is
#   then not that commit's (say which it is by hand, or set GM_COMMIT);
#   "none" outside a git checkout.
gm_commit_id() {
    if [ -n "${GM_COMMIT:-}" ]; then
        printf '%s\n' "$GM_COMMIT"
        return
    fi
    local c
    c="$(git rev-parse --short --verify -q HEAD 2>/dev/null)" || { echo none; return; }
    [ -z "$(git status --porcelain --untracked-files=no -- . ':!bench/results' 2>/dev/null)" ] ||
        c="$c+changes"
    printf '%s\n' "$c"
}
