#!/bin/sh
# Renders users.acl.template into a Redis ACL file (Redis >= 7.0; docs/security.md).
#   deploy/redis/render-acl.sh < credentials > users.acl
# `credentials` has one line `planner <password>` and one line `router <id> <password>`
# per router. Passwords are stored as SHA-256 only; ids are letters, digits, . _ -, and
# may end in '*' for a group user (one credential for every pod of a Deployment).
# Redis refuses comments in an ACL file, so the template has none: its rules are
# explained in docs/security.md.
set -eu
template="$(dirname "$0")/users.acl.template"
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
planner_line=$(grep '^user cacheroute-planner ' "$template")
router_line=$(grep '^user cacheroute-router-' "$template")
planner="" routers=""
while read -r kind a b; do
  case "$kind" in
    planner) [ -n "$a" ] || { echo "render-acl: 'planner' needs a password" >&2; exit 2; }
             planner=$(sha "$a") ;;
    router)
      # A trailing '*' makes a group user (gateway-*: every pod of a Deployment).
      case "${a%\*}" in ""|*[!A-Za-z0-9._-]*)
        echo "render-acl: router id '$a' must be letters, digits, '.', '_' or '-' (and may end in '*')" >&2
        exit 2 ;;
      esac
      [ -n "$b" ] || { echo "render-acl: router $a needs a password" >&2; exit 2; }
      routers="$routers$(printf '%s\n' "$router_line" | sed -e "s/\${ROUTER_ID}/$a/g" \
        -e "s/\${ROUTER_PASSWORD_SHA256}/$(sha "$b")/g")
" ;;
    ""|\#*) ;;
    *) echo "render-acl: unknown line kind '$kind' (planner or router)" >&2; exit 2 ;;
  esac
done
[ -n "$planner" ] || { echo "render-acl: no 'planner <password>' line" >&2; exit 2; }
grep '^user default ' "$template"
printf '%s\n' "$planner_line" | sed -e "s/\${PLANNER_PASSWORD_SHA256}/$planner/g"
printf '%s' "$routers"
