#!/usr/bin/env bash
# The collectors' recorded session on a GPU machine (the device tool runs it from the repo
# root, with .gpu/ carried: src.tar = `git archive HEAD`, store/ = an initialized chdb
# store, whl/ = the py-spy wheel). See bench/gpu_session.py for what it does, and
# bench/gpu_faults.py for the fault scenarios it runs with SESSION set.
set -u
OUTDIR=${OUT:-/tmp/out}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BASE:-/tmp}
SRC=$B/src PKG=$B/rs/ranksight W=$B/work
mkdir -p $SRC $PKG $W $B/stub/chdb
tar xf .gpu/src.tar -C $SRC
# the installed package layout (pyproject package-dir) as links: ranksight.<sub> -> <sub>/
for f in $SRC/ranksight/*; do ln -sf "$f" $PKG/; done
for d in store trainer_hooks collectors agent analyzer ui reference_trainer; do ln -sfn $SRC/$d $PKG/$d; done
# chdb is too large to carry and clickhouse-driver is not there: the store here is only
# written (Parquet segments), never queried
echo 'def connect(*a, **k): raise RuntimeError("chdb is not installed on this machine")' > $B/stub/chdb/__init__.py
mkdir -p $B/stub/clickhouse_driver/util && touch $B/stub/clickhouse_driver/__init__.py $B/stub/clickhouse_driver/util/__init__.py
echo 'def escape_param(*a, **k): raise RuntimeError("clickhouse-driver is not installed on this machine")' > $B/stub/clickhouse_driver/util/escape.py
python3 -m pip install -q --no-index --no-deps --no-compile --target $B/site .gpu/whl/*.whl
export PYTHONPATH=$B/rs:$B/stub:$B/site PATH=$B/site/bin:$PATH
cp -r .gpu/store $B/store
{
  nvidia-smi; nvidia-smi -q; nvidia-smi topo -m
  ls -la /sys/class/infiniband /sys/class/net
  for d in /sys/class/net/*; do echo "$d -> $(readlink -f $d/device)"; done
  for d in /sys/bus/pci/devices/*; do echo "$d $(cat $d/vendor $d/class | tr '\n' ' ') $(readlink -f $d) numa=$(cat $d/numa_node)"; done
  python3 -c "import torch, pynvml; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), pynvml.__file__)"
  py-spy --version
} > $W/machine.txt 2>&1
# SESSION: the script (and subcommand) to run, bench/gpu_session.py unless set (e.g.
# SESSION="bench/gpu_faults.py record" SESSION_ARGS=""); SESSION_ARGS: its own options
cd $SRC && PYTHONUNBUFFERED=1 python3 ${SESSION:-bench/gpu_session.py} --work $W --store $B/store \
  ${SESSION_ARGS---seconds ${SECONDS_TRAIN:-40}} 2>&1 | tee $W/session.log
cd $B && tar czf $OUTDIR/store.tgz store && tar czf $OUTDIR/work.tgz work
ls -la $OUTDIR
