#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/slurm/slurm_test.sh GPUMEM SPANK_SO JOB_ALLOC — the cluster door end
# to end: a real munge, slurmctld and two slurmd (n1, n2) on this machine,
# each node with its own sim broker, the SPANK plugin in plugstack.conf, and
# jobs asking --gres=gpumem:N (MiB).  Checks, from the jobs' own output and
# the brokers' books (their stats files):
#   chain     a job's process leases from its job's tenant, quota = grant
#   over      an allocation past the grant fails naming the job (job_<id>)
#   place     two jobs of 800 MiB go to both nodes, a third waits
#             PENDING (Resources) and starts when one is cancelled
#   books     every tenant's peak <= its quota (0 bytes over)
#   scancel   the job's tenant and pages are gone within the deadline
#   kill -9   a task killed gives its pages back within the deadline
#   door      a process of another job of the same user is refused
#   restart   the broker restarted while a job runs: its tenant is back and
#             a new step of the job leases from it, what it kept still counts
#   no broker a step fails, the node log names the broker's socket
#   misconfig a bad plugstack.conf argument: the step fails, the log says which
#   slurmd restart  while a job runs: its tenant stays, its end removes it
#   lost epilog  the broker down when a job ends: its tenant, back from the
#             jobs file, is reaped once the job's step daemons are gone
#   steps     a step's own smaller request: a tenant of it carved out of the
#             job's (the job's quota less it while it runs), held to it; a
#             step asking more than the job has left refused; its end gives
#             the quota back; a step without a request uses the job's tenant
#   accounting  the job's peak, final, refusals and OOMs at its end in the
#             node log, the broker's log and the job's error output (a
#             cancelled job's too; a reaped job's in the broker's log); job=
#             labels in `gpumem metrics --broker`
#   churn     50 jobs of random sizes and lengths over a minute (every fifth
#             in a step of its own request): 0 bytes over any tenant's quota
#             or job's grant, each job its grant and past it an error naming
#             it, nothing left
#   policy    a job without --gres=gpumem is refused with the reason
# Exit 77 (skipped) when slurm-wlm or munge is not installed.  Every daemon
# it starts is stopped on exit.  Runs as root (slurmd must).
set -uo pipefail
GPUMEM=${1:?gpumem binary}
SPANK=${2:?spank_gpumem.so}
ALLOC=${3:?job_alloc binary}

for c in slurmctld slurmd munged mungekey sbatch srun squeue scancel scontrol sinfo python3; do
  command -v "$c" >/dev/null 2>&1 || { echo "SKIP: $c not installed (slurm-wlm, munge)"; exit 77; }
done
[[ -f $SPANK ]] || { echo "SKIP: the plugin was not built (<slurm/spank.h>: libslurm-dev)"; exit 77; }
[[ $(id -u) -eq 0 ]] || { echo "SKIP: slurmd needs root"; exit 77; }

T0=$(date +%s%N)
ms() { echo $(( ($(date +%s%N) - T0) / 1000000 )); }
D=$(mktemp -d /tmp/gmslurm.XXXXXX)
chmod 755 "$D"
PIDS=()
WATCHDOG=
pass=0 fail=0
# Processes of this cluster: everything started with its SLURM_CONF (the
# daemons, the step daemons, the jobs' processes), found by environment.
ours() {
  grep -lzx "SLURM_CONF=$D/slurm.conf" /proc/[0-9]*/environ 2>/dev/null |
    sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' | grep -vx "$$"
}
still_ours() { grep -qzx "SLURM_CONF=$D/slurm.conf" "/proc/$1/environ" 2>/dev/null; }
ok()  { pass=$((pass + 1)); echo "ok   [$(ms) ms] $*"; }
bad() { fail=$((fail + 1)); echo "FAIL [$(ms) ms] $*"; }
cleanup() {
  kill "$WATCHDOG" 2>/dev/null
  # Jobs first (their step daemons outlive slurmd), then the daemons.
  if [[ -n ${SLURM_CONF:-} ]]; then
    scancel --quiet -u root >/dev/null 2>&1 || true
    for _ in $(seq 100); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.1; done
  fi
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in $(ours); do still_ours "$p" && kill -KILL "$p" 2>/dev/null; done
  if [[ $fail -ne 0 ]]; then
    for f in "$D"/log/*; do echo "---- $f"; tail -n 25 "$f"; done
  fi
  if [[ -n ${GM_SLURM_KEEP:-} ]]; then echo "kept $D"; else rm -rf "$D"; fi
}
trap cleanup EXIT
trap 'exit 1' TERM INT HUP
# A watchdog ends the daemons if this script is killed outright (ctest's
# timeout): every pid it starts goes to $D/pids as well.
(
  while kill -0 $$ 2>/dev/null; do sleep 1; done
  [[ -f $D/pids ]] && while read -r p; do kill -KILL "$p" 2>/dev/null; done <"$D/pids"
  for p in $(ours); do still_ours "$p" && kill -KILL "$p" 2>/dev/null; done
  [[ -n ${GM_SLURM_KEEP:-} ]] || rm -rf "$D"
) </dev/null >/dev/null 2>&1 &
WATCHDOG=$!
track() { PIDS+=("$1"); echo "$1" >>"$D/pids"; }

# ---- munge ------------------------------------------------------------------
mkdir -p "$D/munge" "$D/log" "$D/state" "$D/run" "$D/spool" "$D/out"
chmod 755 "$D/munge"
mungekey -c -k "$D/munge/munge.key" >/dev/null 2>&1 || mungekey -c -f -k "$D/munge/munge.key"
chmod 400 "$D/munge/munge.key"
munged --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" \
  --pid-file="$D/munge/munged.pid" --log-file="$D/log/munged.log" \
  --seed-file="$D/munge/seed" -f || { echo "munged did not start"; exit 1; }
for _ in $(seq 100); do [[ -s $D/munge/munged.pid ]] && break; sleep 0.05; done
track "$(cat "$D/munge/munged.pid")"

# ---- one broker per node ------------------------------------------------------
# 1 GiB each (sim), pages of 2 MiB; processes that come in without a door
# get nothing (default_quota 0); doors under $D/bN/jobs.
start_broker() { # node
  local n=$1
  "$GPUMEM" broker --config "$D/$n/broker.conf" >>"$D/log/broker-$n.log" 2>&1 &
  BROKER_PID[$n]=$!
  track "$!"
  for _ in $(seq 200); do [[ -S $D/$n/broker.sock ]] && return 0; sleep 0.05; done
  echo "broker of $n did not start"; return 1
}
declare -A BROKER_PID
for n in n1 n2; do
  mkdir -p "$D/$n"
  chmod 755 "$D/$n"
  cat >"$D/$n/broker.conf" <<EOF
socket = $D/$n/broker.sock
backend = sim
capacity = 1GiB
default_quota = 0
keep_free = 0
job_dir = $D/$n/jobs
job_grace = 2
stats_file = $D/$n/stats.json
EOF
  start_broker "$n" || exit 1
done

# ---- slurm --------------------------------------------------------------------
# Ports below the kernel's ephemeral range (32768..), 100 of them free here.
free_ports() { # base: the controller, slurmd and srun ports are free
  python3 - "$1" <<'PYEOF2'
import socket, sys
b = int(sys.argv[1])
for p in [b, b + 1, b + 2, b + 3] + list(range(b + 10, b + 61)):
    s = socket.socket()
    try: s.bind(("0.0.0.0", p))
    except OSError: sys.exit(1)
    finally: s.close()
PYEOF2
}
for try in $(seq 20); do
  base=$(( 10000 + ( ($$ + try * 37) % 200) * 100 ))
  free_ports "$base" && break
done
GRES=$("$GPUMEM" gres-conf --backend sim --device 0 --node 'n[1-2]' 2>/dev/null | tail -n1)
# The sim device is bigger than the brokers' 1 GiB: the nodes offer what the
# brokers lease (1024 MiB), as a site sets capacity and gres.conf together.
[[ $GRES == "NodeName=n[1-2] Name=gpumem Count="* ]] && ok "gres-conf prints: $GRES" ||
  bad "gres-conf printed '$GRES'"
echo "NodeName=n[1-2] Name=gpumem Count=1024" >"$D/gres.conf"
echo "required $SPANK broker=$D/%n/broker.sock unit=MiB no_request=refuse" >"$D/plugstack.conf"
cat >"$D/slurm.conf" <<EOF
ClusterName=gmtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 10))-$((base + 60))
CommunicationParameters=NoInAddrAny
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpumem
PlugStackConfig=$D/plugstack.conf
MailProg=/bin/true
ReturnToService=2
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=2
InactiveLimit=0
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=8 RealMemory=4000 Gres=gpumem:1024 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 3)) CPUs=8 RealMemory=4000 Gres=gpumem:1024 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$D/slurm.conf
export GPUMEM_BACKEND=sim  # the jobs' processes, through srun and sbatch
slurmctld -D -i -f "$D/slurm.conf" >>"$D/log/slurmctld.out" 2>&1 &
CTLD=$!
track "$!"
declare -A SLURMD_PID
start_slurmd() { # node
  mkdir -p "$D/spool/$1"
  slurmd -D -N "$1" -f "$D/slurm.conf" >>"$D/log/slurmd-$1.out" 2>&1 &
  SLURMD_PID[$1]=$!
  track "$!"
}
start_slurmd n1
start_slurmd n2
for _ in $(seq 300); do
  kill -0 "$CTLD" 2>/dev/null || { bad "slurmctld exited: $(tail -n 2 "$D/log/slurmctld.log")"; exit 1; }
  [[ $(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle') -eq 2 ]] && break
  sleep 0.1
done
[[ $(sinfo -h -N -o '%N %t' | grep -c ' idle') -eq 2 ]] || { bad "nodes not idle: $(sinfo -N)"; exit 1; }
ok "munge, slurmctld, 2 slurmd and 2 brokers up"

# A figure of tenant NAME in node n's broker, asked now (gpumem metrics
# --broker): used_bytes, quota_bytes, peak_bytes ...; empty when absent.
# Job tenants carry job= (and step=) labels after their tenant label.
books() { # node tenant field
  "$GPUMEM" metrics --broker "$D/$1/broker.sock" 2>/dev/null |
    awk -v m="gpumem_broker_tenant_$3{tenant=\"$2\"" \
      'index($1, m) == 1 && substr($1, length(m) + 1, 1) ~ /[},]/ { print $2 }'
}
leased() { # node
  "$GPUMEM" metrics --broker "$D/$1/broker.sock" 2>/dev/null |
    awk '$1 == "gpumem_broker_leased_bytes" { print $2 }'
}
job_tenants() { # node: the job tenants it lists
  "$GPUMEM" metrics --broker "$D/$1/broker.sock" 2>/dev/null |
    grep -o 'used_bytes{tenant="job_[0-9.]*"' | sort -u
}
# Wait (at most $2 s) until command $1 succeeds; 0 if it did.
until_ok() { local i; for ((i = 0; i < $2 * 20; i++)); do eval "$1" && return 0; sleep 0.05; done; return 1; }
state_of() { squeue -h -j "$1" -o '%T %r' 2>/dev/null; }
node_of() { squeue -h -j "$1" -o '%N' 2>/dev/null; }

# ---- chain: a job's process leases from its job's tenant ---------------------
out=$(timeout 60 srun -w n1 --gres=gpumem:256 "$ALLOC" $((200 << 20)) 2>&1)
[[ $out == *"ok pid "*" bytes $((200 << 20))"* ]] && ok "chain: a job of 256 MiB allocated 200 MiB" ||
  bad "chain: $out"

# ---- over: past the grant, an error naming the job ----------------------------
out=$(timeout 60 srun -w n2 --gres=gpumem:128 "$ALLOC" $((300 << 20)) 2>&1)
tenant=$(sed -n 's/^job tenant //p' <<<"$out")
if [[ $tenant == job_* && $out == *"fail pid "*"tenant '$tenant' is over its quota"* ]]; then
  ok "over: $(grep -o "tenant 'job_[0-9]*' is over its quota: it holds [^)]*)" <<<"$out")"
else
  bad "over: $out"
fi

# ---- policy: no gpumem request --------------------------------------------------
out=$(timeout 60 srun -w n1 "$ALLOC" 1048576 2>&1)
[[ $out != *"ok "* && $out == *"launch failed"* ]] && ok "policy: a job without --gres=gpumem is refused" ||
  bad "policy: $out"
grep -q "asked for no GPU memory" "$D/log/slurmd-n1.log" && ok "policy: the node log says why" ||
  bad "policy: the node log does not say why"
# A batch job: its step must start (a failed batch launch drains the node),
# with a tenant of quota 0, so its first allocation fails naming the job.
P=$(sbatch --parsable -w n1 -o "$D/out/policy.out" --wrap "$ALLOC 1048576")
until_ok '[[ -z $(squeue -h -j $P 2>/dev/null) ]] && grep -qs "^job tenant" "$D/out/policy.out"' 30
[[ $(cat "$D/out/policy.out" 2>/dev/null) == *"fail pid"*"tenant 'job_$P' is over its quota: it holds 0 B of 0 B"* ]] &&
  [[ $(sinfo -h -n n1 -o %t) == idle* ]] &&
  ok "policy: a batch job without --gres=gpumem gets nothing, naming the job; n1 not drained" ||
  bad "policy (batch): $(cat "$D/out/policy.out" 2>/dev/null); n1 $(sinfo -h -n n1 -o %t)"

# ---- steps: a step's own smaller request, carved out of its job's grant ----------
# A job of 512 MiB on n1 whose batch process holds 288 MiB; its steps:
#   A  --gres=gpumem:128, 96 MiB held 2 s: its own tenant job_S.0 of 128 MiB,
#      the job's quota 384 MiB meanwhile, 512 again after it
#   B  --gres=gpumem:128, 200 MiB: fails naming the step's tenant
#   C  --gres=gpumem:256: more than the job has left (224 MiB): refused
#   D  --gres=gpumem:64 at the job's door: not a process of the job
#   E  no --gres: the job's tenant, as before (96 MiB more: 384 of 512)
# At the job's end its figures are in the node log, the broker's log and the
# job's error output.
cat >"$D/steps.sh" <<EOF
#!/bin/bash
$ALLOC $((288 << 20)) --hold 30000 &
until grep -qs "^job tenant" "$D/out/steps.out"; do sleep 0.05; done
echo "step A"; srun --gres=gpumem:128 $ALLOC $((96 << 20)) --hold 2000
echo "step B"; srun --gres=gpumem:128 $ALLOC $((200 << 20))
echo "step C"; srun --gres=gpumem:256 $ALLOC 1048576 2>&1
echo "step D"; srun --gres=gpumem:64 bash -c "GPUMEM_BROKER=$D/n1/jobs/job_\$SLURM_JOB_ID/sock $ALLOC 1048576"
echo "step E"; srun $ALLOC $((96 << 20))
echo "steps done"
kill %1; wait
EOF
chmod 755 "$D/steps.sh"
S=$(sbatch --parsable -w n1 --gres=gpumem:512 -o "$D/out/steps.out" "$D/steps.sh")
until_ok 'grep -qs "^step A" "$D/out/steps.out" && [[ -n $(books n1 job_$S.0 quota_bytes) ]]' 30
jq_=$(books n1 "job_$S" quota_bytes) sq_=$(books n1 "job_$S.0" quota_bytes)
[[ $jq_ -eq $((384 << 20)) && $sq_ -eq $((128 << 20)) ]] &&
  ok "steps: step $S.0 asked 128 MiB: its tenant has 128 MiB, the job's 384 MiB while it runs" ||
  bad "steps: job quota '$jq_', step quota '$sq_'"
m=$("$GPUMEM" metrics --broker "$D/n1/broker.sock" 2>/dev/null)
grep -q "^gpumem_broker_tenant_quota_bytes{tenant=\"job_$S.0\",job=\"$S\",step=\"0\"} $((128 << 20))$" <<<"$m" &&
  grep -q "^gpumem_broker_tenant_used_bytes{tenant=\"job_$S\",job=\"$S\"} " <<<"$m" &&
  ok "metrics: job tenants labelled job=\"$S\" (a step's also step=\"0\")" ||
  bad "metrics: no job label: $(grep "job_$S" <<<"$m" | head -n 3)"
until_ok 'grep -qs "^steps done" "$D/out/steps.out"' 30
out=$(cat "$D/out/steps.out")
stepout() { sed -n "/^step $1/,/^step [^$1]/p" <<<"$out"; }
[[ $(stepout A) == *"ok pid "*"job tenant job_$S.0"* ]] && ok "steps: step A leased 96 MiB from job_$S.0" ||
  bad "steps A: $(stepout A)"
[[ $(stepout B) == *"fail pid "*"tenant 'job_$S.1' is over its quota"* ]] &&
  ok "steps: step B held to its 128 MiB: $(grep -o "tenant 'job_$S.1' is over its quota: it holds [^)]*)" <<<"$out")" ||
  bad "steps B: $(stepout B)"
[[ $(stepout C) != *"ok pid"* ]] &&
  grep -q "job $S step 2 on n1: the step's 268435456 bytes of GPU memory are not given: .*tenant 'job_$S' has [0-9.]* MiB left of its quota 512.00 MiB ([0-9.]* MiB held by its processes): a step's tenant 'job_$S.2' of 256.00 MiB does not fit" "$D/log/slurmd-n1.log" &&
  ok "steps: step C (256 MiB, about 200 left) refused; the node log says why" ||
  bad "steps C: $(stepout C) / $(grep "step 2" "$D/log/slurmd-n1.log" | tail -n 2)"
[[ $(stepout D) == *"fail pid "*"not a process of the job"* ]] &&
  ok "steps: a step's process is refused at its job's door" || bad "steps D: $(stepout D)"
grep -A2 "^step E" <<<"$out" | grep -qx "job tenant job_$S" && grep -A2 "^step E" <<<"$out" | grep -q "^ok pid" &&
  ok "steps: a step without its own request leases from the job's tenant" || bad "steps E: $(stepout E)"
until_ok '[[ -z $(squeue -h -j $S 2>/dev/null) && -z $(books n1 job_$S quota_bytes) ]]' 30
grep -q "gpumem: job $S step 0 ended: tenant job_$S.0 removed, its quota back to job_$S; peak [0-9]* bytes of quota $((128 << 20))" "$D/log/slurmd-n1.log" &&
  ok "steps: step 0's end gave its quota back (node log)" ||
  bad "steps: no step end in the node log: $(grep "step 0" "$D/log/slurmd-n1.log" | tail -n 2)"
# ---- accounting: the job's figures at its end -----------------------------------------
line=$(grep "gpumem: job $S ended: tenant job_$S removed" "$D/log/slurmd-n1.log")
[[ $line == *"peak "*" bytes of quota $((512 << 20)), held at the end "*" refusals (0 out of device memory)"* ]] &&
  ok "accounting: the node log: ${line#*gpumem: }" || bad "accounting: node log: '$line'"
line=$(grep "tenant 'job_$S' (job $S) removed" "$D/log/broker-n1.log")
[[ $line == *"peak "*" of quota 512"*" held at the end, "*" refusals (0 out of device memory)"* ]] &&
  ok "accounting: the broker's log: ${line#*removed: }" || bad "accounting: broker log: '$line'"
line=$(grep "^gpumem: job $S on n1: peak" "$D/out/steps.out")
pk=$(sed -n 's/.* peak \([0-9]*\) bytes of GPU memory of its grant .*/\1/p' <<<"$line")
[[ ${pk:-0} -ge $((384 << 20)) && $pk -le $((512 << 20)) && $line == *"of its grant $((512 << 20))"*"allocations refused"* ]] &&
  ok "accounting: the job's error output: $line" || bad "accounting: job output: '$line' ($(tail -n 3 "$D/out/steps.out"))"

# ---- place: two jobs of 800 MiB on both nodes, a third pending ------------------
submit() { # i: a job of 800 MiB whose process holds 700 MiB (the script stays when it dies)
  J[$1]=$(sbatch --parsable --gres=gpumem:800 -o "$D/out/place$1.out" \
    --wrap "$ALLOC $((700 << 20)) --hold; sleep 300")
}
submit 1
submit 2
until_ok '[[ $(state_of ${J[1]}) == RUNNING* && $(state_of ${J[2]}) == RUNNING* ]]' 30 &&
  until_ok 'grep -qs "^ok" "$D/out/place1.out" && grep -qs "^ok" "$D/out/place2.out"' 30
N1=$(node_of "${J[1]}") N2=$(node_of "${J[2]}")
[[ $N1 != "$N2" && -n $N1 && -n $N2 ]] && ok "place: jobs ${J[1]} and ${J[2]} on $N1 and $N2" ||
  bad "place: jobs on '$N1' and '$N2' ($(squeue))"
# ---- books: each tenant held to its grant --------------------------------------
until_ok '[[ -n $(books $N1 job_${J[1]} used_bytes) ]]' 5
u=$(books "$N1" "job_${J[1]}" used_bytes) q=$(books "$N1" "job_${J[1]}" quota_bytes)
[[ $u -ge $((700 << 20)) && $u -le $q && $q -eq $((800 << 20)) ]] &&
  ok "books: job ${J[1]} holds $u of its quota $q on $N1" || bad "books: used '$u' quota '$q'"

# ---- door: a process of another job of the same user is refused ----------------
door="$D/$N1/jobs/job_${J[1]}/sock"
out=$(timeout 60 srun -w "$N1" --gres=gpumem:16 bash -c "GPUMEM_BROKER=$door $ALLOC 1048576" 2>&1)
[[ $out == *"fail pid "*"not a process of the job"* ]] &&
  ok "door: another job's process refused at job ${J[1]}'s door" || bad "door: $out"
out=$(GPUMEM_BACKEND=sim GPUMEM_BROKER=$door "$ALLOC" 1048576 2>&1)
[[ $out == *"fail pid "*"not a process of the job"* ]] &&
  ok "door: a process outside any job refused too" || bad "door (outside): $out"

submit 3
until_ok '[[ $(state_of ${J[3]}) == "PENDING Resources" ]]' 10 &&
  ok "place: job ${J[3]} PENDING (Resources) while both nodes' memory is granted" ||
  bad "place: job ${J[3]}: $(state_of "${J[3]}")"

# ---- restart: the broker of N2 restarted while job 2 runs -----------------------
n=$N2
kill -TERM "${BROKER_PID[$n]}"
until_ok '! kill -0 ${BROKER_PID[$n]} 2>/dev/null' 10
start_broker "$n"
until_ok '[[ -S $D/$n/jobs/job_${J[2]}/sock ]]' 5 && ok "restart: job ${J[2]}'s door is open again" ||
  bad "restart: no door after the restart"
out=$(timeout 60 srun --jobid="${J[2]}" --overlap "$ALLOC" $((64 << 20)) 2>&1)
[[ $out == *"ok pid "* ]] && ok "restart: a new step of job ${J[2]} leased 64 MiB after the restart" ||
  bad "restart: $out"
out=$(timeout 60 srun --jobid="${J[2]}" --overlap "$ALLOC" $((200 << 20)) 2>&1)
grep -q "over its quota" <<<"$out" && ok "restart: the 704 MiB the job's process kept still count (200 MiB more refused)" ||
  bad "restart quota: $out"

# ---- kill -9 of a task -------------------------------------------------------------
pid=$(sed -n 's/^ok pid \([0-9]*\).*/\1/p' "$D/out/place1.out")
t=$(date +%s%N)
kill -9 "$pid"
if until_ok '[[ $(books $N1 job_${J[1]} used_bytes) == 0 ]]' 5; then
  ok "kill -9: task $pid's pages back in $(( ($(date +%s%N) - t) / 1000000 )) ms; the job's tenant stays"
else
  bad "kill -9: job ${J[1]} still holds '$(books "$N1" "job_${J[1]}" used_bytes)'"
fi

# ---- scancel: the tenant and its pages gone; the pending job starts -------------
t=$(date +%s%N)
scancel "${J[2]}"
if until_ok '[[ -z $(books $N2 job_${J[2]} used_bytes) ]]' 10; then
  ok "scancel: job ${J[2]}'s tenant removed, pages back, in $(( ($(date +%s%N) - t) / 1000000 )) ms"
else
  bad "scancel: job ${J[2]} still in the books of $N2"
fi
left=$(leased "$N2")
# The job's figures at its end, in its error output (its batch step's end).
until_ok 'grep -qs "^gpumem: job ${J[2]} on $N2: peak [0-9]* bytes of GPU memory of its grant $((800 << 20)), held at the end [0-9]*, [0-9]* allocations refused" "$D/out/place2.out"' 5 &&
  ok "accounting: a cancelled job's figures in its output: $(grep "^gpumem: job" "$D/out/place2.out")" ||
  bad "accounting: job ${J[2]}'s output has no figures: $(tail -n 2 "$D/out/place2.out")"
until_ok '[[ $(state_of ${J[3]}) == RUNNING* ]]' 30 && ok "place: job ${J[3]} started once memory was free" ||
  bad "place: job ${J[3]}: $(state_of "${J[3]}")"
scancel "${J[1]}" "${J[3]}"
until_ok '[[ -z $(squeue -h) ]]' 30

# ---- a stopped broker: the step fails, the node log says why ---------------------
kill -TERM "${BROKER_PID[n2]}"
until_ok '! kill -0 ${BROKER_PID[n2]} 2>/dev/null' 10
out=$(timeout 60 srun -w n2 --gres=gpumem:16 "$ALLOC" 1048576 2>&1)
[[ $out != *"ok pid"* ]] && grep -q "the broker did not make its tenant: broker .*n2/broker.sock: .*is gpumem broker running" "$D/log/slurmd-n2.log" &&
  ok "no broker: the step fails and the node log names the broker's socket" || bad "no broker: $out"
start_broker n2

# ---- a lost epilog: the broker is down when the job ends ----------------------------
L=$(sbatch --parsable -w n1 --gres=gpumem:100 -o "$D/out/lost.out" --wrap "$ALLOC $((50 << 20)) --hold")
until_ok 'grep -qs "^ok" "$D/out/lost.out"' 30
kill -TERM "${BROKER_PID[n1]}"
until_ok '! kill -0 ${BROKER_PID[n1]} 2>/dev/null' 10
scancel "$L"
until_ok '[[ -z $(squeue -h -j $L 2>/dev/null) ]]' 30
start_broker n1
t=$(date +%s%N)
# The broker's log says it removed it (a query may come before the broker
# has read its jobs file back), then its books agree.
if until_ok 'grep -q "tenant '"'"'job_$L'"'"' (job $L) removed: its job.*; peak .* held at the end, [0-9]* refusals ([0-9]* out of device memory)" "$D/log/broker-n1.log"' 15 &&
   [[ -z $(books n1 "job_$L" quota_bytes) ]]; then
  ok "lost epilog: job $L's tenant, back from the jobs file, reaped $(( ($(date +%s%N) - t) / 1000000 )) ms after the restart (job_grace 2 s), its figures logged"
else
  bad "lost epilog: job $L's tenant is still there: $(books n1 "job_$L" quota_bytes)"
fi

# ---- a plugin misconfiguration: the step fails, the node log says which argument ----
cp "$D/plugstack.conf" "$D/plugstack.conf.good"
echo "required $SPANK broker=$D/%n/broker.sock unit=GiB" >"$D/plugstack.conf"
out=$(timeout 60 srun -w n1 --gres=gpumem:16 "$ALLOC" 1048576 2>&1)
[[ $out != *"ok pid"* ]] && grep -q "plugstack.conf argument 'unit=GiB' is not understood" "$D/log/slurmd-n1.log" &&
  [[ $(sinfo -h -n n1 -o %t) != drain* && $(sinfo -h -n n1 -o %t) != down* ]] &&
  ok "misconfigured plugin: the step fails, the node log names the argument, n1 stays up" ||
  bad "misconfigured plugin: $out; n1 $(sinfo -h -n n1 -o %t)"
cp "$D/plugstack.conf.good" "$D/plugstack.conf"

# ---- slurmd restarted while a job runs: the job's end still removes its tenant --------
R=$(sbatch --parsable -w n2 --gres=gpumem:100 -o "$D/out/slurmd.out" --wrap "$ALLOC $((50 << 20)) --hold")
until_ok 'grep -qs "^ok" "$D/out/slurmd.out"' 30
kill -TERM "${SLURMD_PID[n2]}"
until_ok '! kill -0 ${SLURMD_PID[n2]} 2>/dev/null' 10
start_slurmd n2
until_ok '[[ $(sinfo -h -n n2 -o %t) == mix* || $(sinfo -h -n n2 -o %t) == alloc* ]]' 20
u=$(books n2 "job_$R" used_bytes)
scancel "$R"
if [[ $u -ge $((50 << 20)) ]] && until_ok '[[ -z $(books n2 job_$R quota_bytes) ]]' 15; then
  ok "slurmd restart: job $R kept its tenant ($u bytes) across it, and its end removed it"
else
  bad "slurmd restart: job $R held '$u', tenant now '$(books n2 "job_$R" quota_bytes)'"
fi

# ---- churn: jobs of random sizes and lengths on both nodes, for a minute ------------
# 50 jobs, one every 1.2 s (GM_SLURM_CHURN jobs over GM_SLURM_CHURN_S s), each
# asks 64..512 MiB, allocates 50..125 % of its grant (those past it must fail
# naming their tenant) and holds it 0..4 s; every fifth runs its process in
# a step of its own smaller request (half the job's), carved out of the
# job's tenant.  While they run, no tenant of either broker holds more than
# its quota, and each job's tenants (its own and its steps') hold no more
# than its grant, their quotas adding up to it exactly.
CHURN=${GM_SLURM_CHURN:-50}
CHURN_S=${GM_SLURM_CHURN_S:-60}
RANDOM=4521
worst=0 polls=0 jworst=0 qwrong=0 jseen=0
: >"$D/grants"
churn_look() { # both brokers' books, once
  local n w jw qb
  for n in n1 n2; do
    w=$("$GPUMEM" metrics --broker "$D/$n/broker.sock" 2>/dev/null |
      awk -F'[{}" ]+' '/^gpumem_broker_tenant_used_bytes/ { u[$3] = $NF }
                      /^gpumem_broker_tenant_quota_bytes/ { q[$3] = $NF }
                      END { w = 0; for (t in u) if (t in q && u[t] - q[t] > w) w = u[t] - q[t]; print w }')
    (( ${w:-0} > worst )) && worst=$w
  done
  # A job's tenants together, from each broker's stats file (one snapshot:
  # the metrics above ask tenant by tenant, while steps come and go).
  read -r jw qb js < <(python3 - "$D/grants" "$D"/n1/stats.json "$D"/n2/stats.json <<'PYEOF3'
import json, re, sys
grants = dict(l.split() for l in open(sys.argv[1]) if l.strip())
over = bad = seen = 0
for path in sys.argv[2:]:
    try: tenants = json.load(open(path))["tenants"]
    except (OSError, ValueError): continue
    used, quota = {}, {}
    for t in tenants:
        m = re.fullmatch(r"job_(\d+)(\.\d+)?", t["name"])
        if m and m.group(1) in grants:
            used[m.group(1)] = used.get(m.group(1), 0) + t["used"]
            quota[m.group(1)] = quota.get(m.group(1), 0) + t["quota"]
    for j in used:
        seen += 1
        over = max(over, used[j] - int(grants[j]))
        bad += quota[j] != int(grants[j])
print(over, bad, seen)
PYEOF3
  )
  (( ${jw:-0} > jworst )) && jworst=$jw
  qwrong=$(( qwrong + ${qb:-0} )) jseen=$(( jseen + ${js:-0} ))
  polls=$((polls + 1))
}
t0=$(ms)
for ((i = 0; i < CHURN; i++)); do
  g=$(( 64 + RANDOM % 449 )) pct=$(( 50 + RANDOM % 76 )) hold=$(( RANDOM % 41 ))
  if (( i % 5 == 4 )); then
    sg=$(( g / 2 )) bytes=$(( ((g / 2) << 20) * pct / 100 ))
    run="srun --gres=gpumem:$sg $ALLOC $bytes --hold $((hold * 100)); true"
    CG[$i]=$sg
  else
    bytes=$(( (g << 20) * pct / 100 ))
    run="$ALLOC $bytes --hold $((hold * 100)); true"
    CG[$i]=$g
  fi
  C[$i]=$(sbatch --parsable --gres=gpumem:$g -o "$D/out/churn$i.out" --wrap "$run")
  echo "${C[$i]} $((g << 20))" >>"$D/grants"
  CB[$i]=$bytes
  next=$(( t0 + (i + 1) * CHURN_S * 1000 / CHURN ))
  while (( $(ms) < next )); do churn_look; sleep 0.05; done
done
while [[ -n $(squeue -h 2>/dev/null) ]] && (( $(ms) < t0 + CHURN_S * 1000 + 60000 )); do
  churn_look
done
[[ -z $(squeue -h) ]] && ok "churn: $CHURN jobs done in $(( ($(ms) - t0) / 1000 )) s" ||
  bad "churn: jobs still queued: $(squeue -h | wc -l)"
[[ $worst -eq 0 ]] && ok "churn: 0 bytes over any tenant's quota in $polls looks at both brokers" ||
  bad "churn: a tenant $worst bytes over its quota"
[[ $jworst -eq 0 && $qwrong -eq 0 && $jseen -gt 0 ]] &&
  ok "churn: 0 bytes over any job's grant (its tenant and its steps' together), their quotas adding up to it, in $jseen looks at a job" ||
  bad "churn: a job $jworst bytes over its grant; $qwrong of $jseen looks where a job's quotas did not add up to its grant"
right=0 wrong=0
for ((i = 0; i < CHURN; i++)); do
  f="$D/out/churn$i.out"
  t=$(sed -n 's/^job tenant //p' "$f" 2>/dev/null)
  want=job_${C[i]}
  (( i % 5 == 4 )) && want=$want.0  # the step's own tenant
  if (( CB[i] <= CG[i] << 20 )); then
    grep -q "^ok pid" "$f" 2>/dev/null && [[ $t == "$want" ]] && right=$((right + 1)) ||
      { wrong=$((wrong + 1)); echo "churn $i ($want): $(head -c 300 "$f" 2>/dev/null)"; }
  else
    grep -q "^fail pid.*tenant '$t' is over its quota" "$f" 2>/dev/null && [[ $t == "$want" ]] &&
      right=$((right + 1)) || { wrong=$((wrong + 1)); echo "churn $i ($want): $(head -c 300 "$f" 2>/dev/null)"; }
  fi
done
[[ $wrong -eq 0 ]] && ok "churn: every job (or its step) got its grant, and past it an error naming its tenant ($right jobs)" ||
  bad "churn: $wrong jobs got what they should not"

# ---- books: 0 bytes over, nothing left ---------------------------------------------
for n in n1 n2; do
  until_ok '[[ -z $(job_tenants $n) && $(leased $n) == 0 ]]' 10 &&
    ok "books: $n has no job tenant and nothing leased after the jobs" ||
    bad "books: $n: $(job_tenants "$n") leased $(leased "$n")"
done
# 0 bytes over: every job's peak (logged at its end) within its quota.
over=$(grep -ho "peak [0-9.]* [KMG]iB of quota [0-9.]* [KMG]iB" "$D"/log/broker-*.log |
  awk '{ p = $2 * ($3 == "GiB" ? 1024 : $3 == "KiB" ? 1 / 1024 : 1);
         q = $6 * ($7 == "GiB" ? 1024 : $7 == "KiB" ? 1 / 1024 : 1); if (p > q) n++ } END { print n + 0 }')
[[ $over -eq 0 ]] && ok "books: no job's peak above its quota" || bad "books: $over jobs over their quota"
ends=$(grep -h "removed" "$D"/log/broker-*.log | grep -c "peak" || true)
grep -h "tenant 'job_" "$D"/log/broker-*.log | grep "removed" | head -n 3
echo "leased on $N2 right after scancel: $left"
[[ $ends -gt 0 ]] && ok "books: the brokers logged each job's peak at its end" || bad "no job's figures logged"

echo "total $(ms) ms"
echo "$pass passed, $fail failed, 0 skipped"
[[ $fail -eq 0 ]]
