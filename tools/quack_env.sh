# Source after quack is staged on the GPU machine (pip --target /root/peer-site, whose folder is not
# called site-packages):  . tools/quack_env.sh
#
# quack fingerprints an epilogue function (its compile-cache key) by source, recursing into what the
# function references, except for functions installed under a "site-packages" or "dist-packages"
# folder, which it keys by name (quack/gemm_runtime/identity.py, _is_extern_function). From
# /root/peer-site it recursed into the CUTLASS DSL's own helpers, met a ContextVar and refused:
# gemm_act(..., activation="swiglu") raised "epilogue fn depends on <ContextVar ...>, which has no
# fail-closed semantic key". Putting the same files on the path through a folder named site-packages
# (a symlink: nothing is copied) gives quack the layout a pip install into an environment has.
set -u
staged=${PEER_SITE:-/root/peer-site}
if [ ! -d "$staged/quack" ]; then
    echo "quack_env: no quack under $staged (stage it first: ../shared/tools/peer-wheels.sh)" >&2
    return 1 2>/dev/null || exit 1
fi
mkdir -p /root/peer-venv
ln -sfn "$staged" /root/peer-venv/site-packages
export PYTHONPATH=/root/peer-venv/site-packages:/root/peer-venv/site-packages/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
set +u
